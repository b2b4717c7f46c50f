"""The import-linter contracts of pyproject.toml ([tool.importlinter]): layers, and no import cycles."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    """Run lint-imports on this checkout's encoderlab (not an installed copy), without writing a cache."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept() -> None:
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS}: import-linter is not installed (pip install -e '.[test]')"
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_nn_reaches_the_family_registry_by_no_path() -> None:
    """nn/ reads the config alone: its contract allows no indirect import either (not through checkpoint)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    nn = next(c for c in contracts["contracts"] if c["id"] == "nn-reads-the-config")
    assert nn["allow_indirect_imports"] is False


def test_the_checkout_root_never_shadows_the_package(tmp_path: Path) -> None:
    """From the folder that holds a clone named encoderlab, `encoderlab` is still the package, not the repository
    root as a namespace package (whose models/ folder once hid encoderlab.models): the src layout."""
    (tmp_path / "encoderlab").symlink_to(ROOT, target_is_directory=True)
    code = "import encoderlab; from encoderlab.models import FAMILIES; print(encoderlab.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == "__init__.py"
    assert not (ROOT / "encoderlab").exists(), "the package lives under src/ (PyPA's src layout)"
