"""The lessons run right after `make demo` (issue 46, item 2): every module that the lessons (examples/src/*.py, the
sources of the notebooks) and scripts/run_notebook.py import is provided by encoderlab's runtime dependencies plus
the extras `make demo` installs, or by their dependencies. Nothing is installed here: the requirement graph is read
from pyproject.toml, the Makefile and the metadata of the packages installed in this venv."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

LESSON_FILES = sorted((ROOT / "examples" / "src").glob("*.py")) + [ROOT / "scripts" / "run_notebook.py"]
# Started by nbclient rather than imported: the kernel (`python -m ipykernel_launcher`).
KERNEL_MODULES = {"ipykernel_launcher"}


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, at any depth (relative imports aside)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def demo_extras() -> list[str]:
    """The extras of encoderlab that the Makefile's `make demo` set-up ($(VENV)/.deps-run) installs."""
    recipe = re.search(r"^\$\(VENV\)/\.deps-run:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "Makefile: no $(VENV)/.deps-run recipe (make demo's install)"
    extras = re.search(r"-e '\.\[([^\]]*)\]'", recipe.group(1))
    return [e.strip() for e in extras.group(1).split(",")] if extras else []


def requirements(extras: list[str]) -> list[Requirement]:
    """encoderlab's runtime dependencies and those of `extras`, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    return [Requirement(r) for r in listed]


def closure(roots: list[Requirement]) -> set[str]:
    """The distributions `roots` bring in, with their dependencies, as installed here (markers evaluated for this
    machine; a dependency's own extras are not followed unless asked for)."""
    seen, todo = set(), [(r, "") for r in roots]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate(default_environment() | {"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: its own dependencies cannot be followed
        wanted = requirement.extras or {""}
        todo += [(Requirement(r), e) for r in needs for e in wanted]
    return seen


def missing(extras: list[str]) -> dict[str, list[str]]:
    """{file: modules it imports that neither the standard library, encoderlab, nor the distributions of the runtime
    dependencies and `extras` provide}."""
    provided = closure(requirements(extras))
    providers = metadata.packages_distributions()
    faults = {}
    for path in LESSON_FILES:
        modules = imported_modules(path) | (KERNEL_MODULES if path.name == "run_notebook.py" else set())
        lacking = sorted(m for m in modules - set(sys.stdlib_module_names) - {"encoderlab", "__future__"}
                         if not {canonicalize_name(d) for d in providers.get(m, [])} & provided)
        if lacking:
            faults[str(path.relative_to(ROOT))] = lacking
    return faults


def test_make_demo_installs_the_lessons_extra():
    assert "lessons" in demo_extras(), "make demo must install the lessons extra (nbformat, nbclient, ipykernel)"


def test_the_demo_install_provides_every_module_the_lessons_import():
    assert len(LESSON_FILES) >= 6
    assert missing(demo_extras()) == {}


def test_the_check_finds_what_the_runtime_dependencies_alone_lack():
    """Without the lessons extra, run_notebook.py lacks nbformat and nbclient, and its kernel ipykernel: the check
    above can fail."""
    pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[lessons]')")
    faults = missing([e for e in demo_extras() if e != "lessons"])
    assert faults.get("scripts/run_notebook.py") == ["ipykernel_launcher", "nbclient", "nbformat"]
