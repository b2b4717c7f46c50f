"""Every bench/*.py runs with --smoke (tiny random model, synthetic data, seconds) and writes a well-formed results
file outside bench/results: a refactor that breaks a benchmark fails here, not months later.

Each runs as `python bench/NAME.py --smoke` would, but in the test's own process (runpy, as `__main__`): a fresh
interpreter per bench cost 2-4 CPU s of imports (torch, transformers) on top of the bench's seconds, about a minute of
`make test` in all. What a bench changes in the process (argv, sys.path, the environment, the working folder, torch's
threads, the random generators, the root logger, its own modules) is put back after it. A bench that forks worker
processes runs in an interpreter of its own (FRESH), for tests/test_prefetch.py's reason."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import random
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HELPERS = {"common.py", "engines.py"}  # modules the benches import, not benches (the Makefile's bench target skips them)
BENCHES = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name not in HELPERS)
GOAL_KEYS = {"what", "value", "target", "met"}
# Benches whose smoke run covers parts that are skipped where their data is absent: each must be there.
SMOKE_COVERS = {"fill_mask_model.py": {"figures": {"heldout", "curve", "sst2", "probes", "transformers", "weights"},
                                       "files": {"fill_mask_model_smoke-curve.png"}},
               "late_sparse.py": {"figures": {"bm25", "dense", "colbert", "splade", "splade-free", "dense+splade",
                                              "dense+splade-free", "dense+bm25", "colbert+bm25"}}}
# Options of a bench's smoke run beyond --smoke: fill_mask_model.py's takes two seeds, so the one run also shows the
# mean over seeds (check_fill_mask_goal_is_the_mean_over_seeds) rather than a second run for it.
SMOKE_OPTIONS = {"fill_mask_model.py": ("--seed", "3", "4")}
# Benches whose smoke run forks (DataLoader workers): forking the suite's process, which holds the threads of every
# native library earlier tests loaded, once crashed it (tests/test_prefetch.py); these start an interpreter.
FRESH = {"data_pipeline.py"}


def _snapshot(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under `folder`, by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@dataclass
class Ran:
    """What a bench run gave: its exit code (0, or SystemExit's) and what it printed."""
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _restored():
    """Put back what a script run in this process may change of it (module docstring)."""
    argv, path, environ, cwd = sys.argv[:], sys.path[:], dict(os.environ), os.getcwd()
    threads, states = torch.get_num_threads(), (torch.random.get_rng_state(), np.random.get_state(), random.getstate())
    root, handlers, modules = logging.root.level, logging.root.handlers[:], set(sys.modules)
    try:
        yield
    finally:
        sys.argv[:], sys.path[:] = argv, path
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        torch.set_num_threads(threads)
        torch.random.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        logging.root.setLevel(root)
        logging.root.handlers[:] = handlers
        for name in set(sys.modules) - modules:  # bench/ and scripts/ modules: the next bench imports its own
            where = getattr(sys.modules[name], "__file__", None) or ""
            if where.startswith((str(ROOT / "bench"), str(ROOT / "scripts"))):
                del sys.modules[name]


def _smoke(script: str, results: Path, *options: str) -> Ran:
    """bench/`script` --smoke, its results under `results`, run in this process as `__main__` (FRESH: in its own)."""
    argv = [f"bench/{script}", "--smoke", *options, "--results-dir", str(results)]
    if script in FRESH:
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                         os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        return Ran(done.returncode, done.stdout, done.stderr)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.argv = argv
        os.chdir(ROOT)
        try:
            runpy.run_path(str(ROOT / "bench" / script), run_name="__main__")
        except SystemExit as stop:  # as the interpreter exits: None is 0; a message is printed, and is 1
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                code = 1
                print(stop.code, file=sys.stderr)
    return Ran(code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("script", BENCHES)
@pytest.mark.slow
def test_bench_runs_with_smoke(script: str, tmp_path: Path) -> None:
    committed = _snapshot(ROOT / "bench" / "results")
    done = _smoke(script, tmp_path, *SMOKE_OPTIONS.get(script, ()))
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stderr[-4000:]}"
    written = sorted(tmp_path.glob("*.json"))
    assert [p.name for p in written] == [script.replace(".py", "_smoke.json")], done.stderr[-2000:]
    payload = json.loads(written[0].read_text(encoding="utf-8"))
    assert set(payload) == {"machine", "versions", "command", "figures", "goals"}
    assert "--smoke" in payload["command"] and payload["figures"]
    assert {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile"} <= set(payload["machine"]["cpu_flags"])
    assert payload["goals"], f"{script}: no goals"
    for goal in payload["goals"]:
        assert set(goal) >= GOAL_KEYS and isinstance(goal["met"], bool), goal
    assert _snapshot(ROOT / "bench" / "results") == committed, f"{script} --smoke changed bench/results"
    covers = SMOKE_COVERS.get(script, {})
    assert covers.get("figures", set()) <= set(payload["figures"]), f"{script} --smoke skipped a part"
    assert covers.get("files", set()) <= {p.name for p in tmp_path.iterdir()}, f"{script} --smoke wrote no plot"
    if script == "fill_mask_model.py":
        check_fill_mask_goal_is_the_mean_over_seeds(payload)
    if script == "late_sparse.py":  # the synthetic queries are words of their document
        assert payload["figures"]["bm25"]["metrics"]["ndcg_at_10"] > 0.5


def check_fill_mask_goal_is_the_mean_over_seeds(payload: dict) -> None:
    """With several seeds each seed fine-tunes both models, and the goal is on the mean of the per-seed
    differences: the pairs are kept and the mean is theirs, not one seed's (the smoke run's --seed 3 4)."""
    sst2 = payload["figures"]["sst2"]
    assert [run["seed"] for run in sst2["runs"]] == [3, 4]
    for run in sst2["runs"]:
        for role in ("model", "baseline"):
            assert f"--seed {run['seed']} " in run[role]["command"], run[role]["command"]
        assert run["difference_points"] == round(100 * (run["model"]["accuracy"] - run["baseline"]["accuracy"]), 2)
    mean = sum(run["difference_points"] for run in sst2["runs"]) / 2
    assert abs(sst2["difference_points"] - mean) <= 0.005
    [goal] = [g for g in payload["goals"] if g["what"].startswith("SST-2")]
    assert "mean of 2 seeds" in goal["what"] and goal["value"] == sst2["difference_points"]


def test_late_sparse_bench_writes_another_settings_run_to_a_file_of_its_own() -> None:
    """--index-window, --max-train and --only runs are named by their settings, so that they never overwrite the
    default run's late_sparse.json (a 128-token run at the same time as the default one did, before)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import late_sparse

    assert late_sparse.results_name(None, None) == "late_sparse"
    assert late_sparse.results_name(None, 128) == "late_sparse_w128"
    assert late_sparse.results_name(1000, None) == "late_sparse_1000"
    assert late_sparse.results_name(5190, 128) == "late_sparse_5190_w128"
    assert late_sparse.results_name(None, None, list(late_sparse.ORDER)) == "late_sparse"  # every contender
    assert late_sparse.results_name(None, None, late_sparse.contenders("bm25")) == "late_sparse_only_dense_bm25"
    assert late_sparse.results_name(None, 128, ["splade"]) == "late_sparse_w128_only_splade"


def test_late_sparse_bench_runs_the_contenders_asked_for() -> None:
    """--only bm25: BM25 and the bi-encoder whose index holds it, neither ColBERT nor SPLADE (nor their commands);
    --only colbert-2bit: ColBERT's model too; the smoke run above runs every contender through the same list."""
    sys.path.insert(0, str(ROOT / "bench"))
    import late_sparse

    assert late_sparse.contenders("bm25") == ["dense", "bm25"]
    assert late_sparse.contenders(" splade,colbert ") == ["colbert", "splade"]
    assert late_sparse.contenders("colbert-2bit") == ["colbert", "colbert-2bit"]
    assert late_sparse.contenders("bm25,dense,colbert,colbert-2bit,splade,splade-free") == list(late_sparse.ORDER)
    assert late_sparse.contenders("splade-free,bm25") == ["dense", "bm25", "splade-free"]
    for bad in ("", "bm25,sparse"):
        with pytest.raises(SystemExit, match="expected names among bm25, dense, colbert, colbert-2bit, splade, "
                                             "splade-free"):
            late_sparse.contenders(bad)


@pytest.mark.slow  # a real server's start: ~8 CPU s
def test_serve_load_tries_another_port_when_its_port_is_taken(monkeypatch) -> None:
    """A port taken between free_port() and serve binding it (another process on a busy machine: `make test` failed
    so once) is tried again with another: the server answers on the second port."""
    import socket

    sys.path.insert(0, str(ROOT / "bench"))
    import serve_load

    import httpx

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = iter([busy, serve_load.free_port()])
    monkeypatch.setattr(serve_load, "free_port", lambda: next(ports))
    with taken:
        process, port = serve_load.start_server(threads=1, max_batch=8)
    try:
        assert port != busy and httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        process.terminate()
        process.wait(30)
