"""Run lessons from examples/ headless, without Jupyter: nbclient executes each notebook in an ipykernel started
with this Python, in examples/ with the checkout first on PYTHONPATH, and writes the executed copy to --out (the
notebooks in examples/ stay without outputs).

    python scripts/run_notebook.py examples/03_fill_mask_and_masking.ipynb
    python scripts/run_notebook.py --small examples/*.ipynb      # reduced sizes, as the tests run them
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SMALL_VARIABLE = "ENCODERLAB_NOTEBOOK_SMALL"  # read by the first code cell of every lesson
CELL_TIMEOUT_S = 600


def kernel_environment(small: bool, out: Path | None = None) -> dict[str, str]:
    """Variables for the kernel: the checkout importable first, the lesson's size, and where its files go."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    env[SMALL_VARIABLE] = "1" if small else "0"
    if out is not None:
        env["ENCODERLAB_NOTEBOOK_OUT"] = str(out)
    return env


def execute(nb: nbformat.NotebookNode, cwd: Path, env: dict[str, str]) -> nbformat.NotebookNode:
    """Execute `nb` in place, in folder `cwd`, with `env` added to this process's environment; a failing cell raises
    nbclient's CellExecutionError naming it."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        # kernel "python3" runs `python -m ipykernel_launcher`, which jupyter_client starts with sys.executable
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    return nb


def main(argv: list[str] | None = None) -> int:
    """Execute each notebook named, writing NAME.ipynb with its outputs under --out."""
    parser = argparse.ArgumentParser(description="Run encoderlab's lesson notebooks headless (nbclient).")
    parser.add_argument("notebooks", nargs="+", type=Path, help="the .ipynb files to run")
    parser.add_argument("--small", action="store_true", help=f"reduced sizes ({SMALL_VARIABLE}=1), as in the tests")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "notebooks",
                        help="folder for the executed copies and the lessons' files (default: out/notebooks)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.notebooks:
        started = time.perf_counter()
        nb = execute(nbformat.read(path, as_version=4), path.resolve().parent,
                     kernel_environment(args.small, args.out.resolve()))
        nbformat.write(nb, args.out / path.name)
        print(f"ran {path} in {time.perf_counter() - started:.0f} s: {args.out / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
