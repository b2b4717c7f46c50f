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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
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
