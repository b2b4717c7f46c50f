"""encoderlab.train.prefetch: steps built ahead in DataLoader workers are the steps built in the main process, in
order, whatever the worker count; a position loaded back drops what was built ahead; runs resume exactly across
worker counts."""

from __future__ import annotations

import csv
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from encoderlab.errors import ConfigError
from encoderlab.tokenizer import Tokenizer
from encoderlab.train import distributed
from encoderlab.train.config import load_recipe
from encoderlab.train.prefetch import PrefetchedSteps, default_workers
from encoderlab.train.pretrain import pretrain, training_data
from test_pretrain import TINY, prepared  # noqa: F401  (the prepared corpus fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
CHILD = "ENCODERLAB_TEST_IN_FRESH_PROCESS"


def in_fresh_process(test):
    """Run the test in a pytest process of its own. Its DataLoader workers are forks, and forking the suite's own
    process, which by then holds the threads of every native library earlier tests loaded, crashed the whole suite
    with a segmentation fault once in two full runs; a fresh process forks cleanly, as a training run does."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        if os.environ.get(CHILD):
            return test(*args, **kwargs)
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{__file__}::{test.__name__}"], env=os.environ | {CHILD: "1"}, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return run


def _data(prepared: Path, workers: int, micro: int = 4):
    """The training steps of TINY's recipe (8 sequences a step) in micro-batches of `micro`."""
    cfg = load_recipe(None, [f"data={prepared}", *TINY, f"data_workers={workers}"])
    return training_data(cfg, Tokenizer.from_pretrained(prepared / "tokenizer"), micro, distributed.Dist())


def _steps(data, count: int, rank: int = 0, world_size: int = 1, grad_accum: int = 1) -> list:
    out = []
    for _ in range(count):
        out.append((data.next_step(rank, world_size, grad_accum), data.state_dict()))
    return out


def _assert_same_steps(a: list, b: list) -> None:
    assert len(a) == len(b)
    for step, ((batches_a, state_a), (batches_b, state_b)) in enumerate(zip(a, b), start=1):
        assert state_a == state_b, step
        assert len(batches_a) == len(batches_b), step
        for x, y in zip(batches_a, batches_b):
            assert x.keys() == y.keys(), step
            for key in x:
                assert torch.equal(x[key], y[key]), (step, key)


@in_fresh_process
@pytest.mark.slow
def test_a_steps_batches_do_not_depend_on_the_worker_count(prepared):
    """Enough steps to cross into the second epoch (the corpus packs into 179 sequences, 23 steps of 8)."""
    reference = _data(prepared, 0)
    assert not isinstance(reference, PrefetchedSteps)
    expected = _steps(reference, 26)
    assert expected[-1][1]["epoch"] >= 1  # an epoch boundary was crossed
    for workers in (1, 3):
        data = _data(prepared, workers)
        assert isinstance(data, PrefetchedSteps) and data.workers == workers
        try:
            _assert_same_steps(_steps(data, 26), expected)
        finally:
            data.close()


@in_fresh_process
@pytest.mark.slow
def test_each_ranks_share_and_micro_batches_match_the_main_process(prepared):
    reference, data = _data(prepared, 0, micro=2), _data(prepared, 2, micro=2)  # 2 ranks x 2 micro-batches of 2
    try:
        for rank in (0, 1):
            reference.load_state_dict({"epoch": 0, "index": 0})
            data.load_state_dict({"epoch": 0, "index": 0})
            _assert_same_steps(_steps(data, 3, rank, 2, 2), _steps(reference, 3, rank, 2, 2))
    finally:
        data.close()


@in_fresh_process
@pytest.mark.slow
def test_loading_a_position_drops_the_steps_built_ahead(prepared):
    data = _data(prepared, 2)
    try:
        _steps(data, 4)  # the workers have built several steps beyond these
        saved = data.state_dict()
        later = _steps(data, 3)
        data.load_state_dict(saved)
        _assert_same_steps(_steps(data, 3), later)
    finally:
        data.close()


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
    return [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]


@in_fresh_process
@pytest.mark.slow
def test_a_run_resumed_with_other_worker_counts_equals_an_uninterrupted_one(prepared, tmp_path):
    extra = ("max_steps=8", "save_every=0", "eval_every=0", "grad_accum=2")
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    pretrain(load_recipe(None, [f"data={prepared}", *TINY, *extra, "data_workers=0"]), straight, progress=False)
    pretrain(load_recipe(None, [f"data={prepared}", *TINY, *extra, "data_workers=2"]), broken, stop_after=3,
             progress=False)
    pretrain(load_recipe(None, [f"data={prepared}", *TINY, *extra, "data_workers=1"]), broken, resume=True,
             progress=False)
    assert _losses(broken) == _losses(straight)
    final, expected = (load_file(r / "model" / "model.safetensors") for r in (broken, straight))
    for name in expected:
        assert torch.equal(final[name], expected[name]), name


def test_data_workers_auto_is_none_on_cpu_and_bad_counts_are_refused(prepared):
    assert default_workers(torch.device("cpu")) == 0
    assert 1 <= default_workers(torch.device("cuda")) <= 4
    with pytest.raises(ConfigError, match="data_workers"):
        load_recipe(None, [f"data={prepared}", "data_workers=-2"])
