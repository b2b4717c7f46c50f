"""Build the lessons examples/NN_name.ipynb from their plain-text sources examples/src/NN_name.py, outputs empty.

A source is in jupytext's "percent" format, so it reads (and runs) as a Python script and diffs as text:
`# %%` starts a code cell, `# %% [markdown]` a Markdown cell whose lines are comments (`# ` is stripped). Comment
lines before the first cell are the notebook's header; a header line `# needs-data: sst2 imdb` names the folders of
../shared/data a lesson reads, recorded as the notebook's metadata `encoderlab.needs_data` (tests skip the notebook
with the reason when one is absent).

    python scripts/build_notebooks.py           # write every examples/*.ipynb from its source
    python scripts/build_notebooks.py --check   # exit 1 naming each notebook that differs from its source
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "examples" / "src"
CELL = "# %%"
MARKDOWN = "# %% [markdown]"
NEEDS = "# needs-data:"
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def parse(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A percent-format source -> (the folders of ../shared/data it needs, [(cell type, source), ...])."""
    needs: list[str] = []
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(MARKDOWN):
            cells.append(("markdown", []))
        elif line.startswith(CELL):
            cells.append(("code", []))
        elif not cells:
            needs += line.removeprefix(NEEDS).split() if line.startswith(NEEDS) else []
        elif cells[-1][0] == "markdown":
            cells[-1][1].append(line.removeprefix("#").removeprefix(" "))
        else:
            cells[-1][1].append(line)
    return needs, [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells]


def build(source: Path) -> nbformat.NotebookNode:
    """The notebook of one source: deterministic cell ids (stem-index), no outputs, the ipykernel Python kernel."""
    needs, cells = parse(source.read_text(encoding="utf-8"))
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}, "encoderlab": {"needs_data": needs}}
    for index, (kind, text) in enumerate(cells):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(text, id=f"{source.stem.replace('_', '-')}-{index}"))
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook's JSON as written to disk."""
    return nbformat.writes(nb) + "\n"


def notebook_path(source: Path) -> Path:
    """examples/src/NAME.py -> examples/NAME.ipynb."""
    return source.parents[1] / f"{source.stem}.ipynb"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) every notebook; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for source in sorted(SOURCES.glob("*.py")):
        target, text = notebook_path(source), render(build(source))
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    for target in stale:
        print(f"{target.relative_to(ROOT)} differs from its source: run python scripts/build_notebooks.py",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
