"""The lessons in examples/: each notebook runs to the end at reduced size, is committed without outputs, and equals
what scripts/build_notebooks.py builds from its source in examples/src/.

Every notebook runs in an ipykernel started with this test's Python (the venv's), in examples/, with the checkout
first on PYTHONPATH and ENCODERLAB_NOTEBOOK_SMALL=1; a cell that raises fails the test with nbclient's report of it.
A lesson whose metadata names data under ../shared/data (`encoderlab.needs_data`) is skipped with the reason where
that data is absent."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHARED_DATA

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[lessons]')")

NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
SOURCES = sorted((ROOT / "examples" / "src").glob("*.py"))
# First cell of every executed copy: which Python the kernel runs, and which encoderlab it imports.
PROBE = "import sys, encoderlab, json; print(json.dumps([sys.executable, encoderlab.__file__]))"


def _script(name: str):
    """A module of scripts/ (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_lesson_has_a_notebook_and_a_source():
    assert len(NOTEBOOKS) >= 5, f"expected the five lessons in examples/, found {[p.name for p in NOTEBOOKS]}"
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in SOURCES]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs: clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_equals_its_source(source: Path):
    build = _script("build_notebooks")
    target = build.notebook_path(source)
    assert target.read_text(encoding="utf-8") == build.render(build.build(source)), (
        f"{target.name} differs from {source.relative_to(ROOT)}: run python scripts/build_notebooks.py")


def test_source_format_round_trips():
    build = _script("build_notebooks")
    needs, cells = build.parse("# header\n# needs-data: sst2 imdb\n\n# %% [markdown]\n# # Title\n#\n# text\n\n"
                               "# %%\nx = 1\n\n\ny = 2\n")
    assert needs == ["sst2", "imdb"]
    assert cells == [("markdown", "# Title\n\ntext"), ("code", "x = 1\n\n\ny = 2")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_notebook_runs(path: Path, tmp_path: Path):
    pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[lessons]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[lessons]')")
    lesson = nbformat.read(path, as_version=4)
    for name in lesson.metadata.get("encoderlab", {}).get("needs_data", []):
        if not (SHARED_DATA / name).is_dir():
            pytest.skip(f"real data not available: {path.name} needs {SHARED_DATA / name}")
    lesson.cells.insert(0, nbformat.v4.new_code_cell(PROBE, id="probe"))
    runner = _script("run_notebook")
    env = runner.kernel_environment(small=True, out=tmp_path) | {"OMP_NUM_THREADS": "1"}
    executed = runner.execute(lesson, path.parent, env)  # raises CellExecutionError naming the cell that failed
    python, package = json.loads(executed.cells[0].outputs[0]["text"])
    assert Path(python).resolve() == Path(sys.executable).resolve(), "the kernel runs another Python than the tests"
    assert Path(package).resolve() == (ROOT / "src" / "encoderlab" / "__init__.py").resolve(), (
        f"the kernel imported encoderlab from {package}, not from this checkout")
    errors = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "error"]
    assert not errors
    # Every plt.show() draws a picture into the notebook (a lesson whose figures come out blank raises no error).
    shows = sum(cell.source.count("plt.show()") for cell in executed.cells if cell.cell_type == "code")
    pictures = sum("image/png" in o.get("data", {}) for cell in executed.cells for o in cell.get("outputs", []))
    assert pictures >= shows, f"{path.name}: {shows} plt.show() calls drew {pictures} pictures"
