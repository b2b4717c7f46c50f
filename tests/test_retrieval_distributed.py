"""`encoderlab index` under torchrun (encoderlab.retrieval.distributed): two CPU ranks (gloo) give the index one
process gives, file for file; a build cut off under two ranks resumes to it; bad input fails every rank before a
file is written; each rank's device and share of the shards."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from encoderlab import Index
from encoderlab.errors import InputError
from encoderlab.retrieval.distributed import own_documents, owns, rank_device
from encoderlab.train.distributed import Dist
from test_retrieval import hashes, tiny, write_corpus  # noqa: F401  (the tiny model fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
ROOT = Path(__file__).resolve().parents[1]
SHARD_SIZE = 4  # 25 documents: 7 shards, 4 for rank 0 and 3 for rank 1


def torchrun(*argv: str, ranks: int = 2) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node RANKS -m encoderlab ARGV`, one thread a rank."""
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                           "-m", "encoderlab", *map(str, argv)], env=env, capture_output=True, text=True, timeout=300)


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (Linux's /proc/PID/task/*/children)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *descendants(child)]
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def alone(tiny, corpus, tmp_path_factory) -> Index:
    """The corpus indexed by one process, with BM25."""
    return Index.build(tiny, corpus, tmp_path_factory.mktemp("alone") / "idx", bm25=True, shard_size=SHARD_SIZE,
                       progress=False)


def index_args(tiny: Path, corpus: Path, out: Path, *more: str) -> list[str]:
    return ["index", "--model", str(tiny), "--corpus", str(corpus), "--out", str(out), "--bm25", "--shard-size",
            str(SHARD_SIZE), "--json", *more]


# ---- each rank's device and shards ---------------------------------------------------------------------------------
@pytest.mark.parametrize("asked, local_rank, cuda, expected", [
    (None, 1, True, "cuda:1"), ("cuda", 3, True, "cuda:3"), (None, 1, False, "cpu"), ("cpu", 1, True, "cpu")])
def test_each_rank_encodes_on_its_local_gpu_or_the_cpu(asked, local_rank, cuda, expected):
    assert rank_device(asked, local_rank, cuda) == expected


@pytest.mark.parametrize("asked, cuda, message", [("cuda:1", True, "cuda:LOCAL_RANK"),
                                                  ("cuda", False, "not available")])
def test_a_device_no_rank_can_use_is_refused(asked, cuda, message):
    with pytest.raises(InputError, match=message):
        rank_device(asked, 0, cuda)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_shard_is_exactly_one_ranks_and_the_bars_add_up(world):
    meta = {"shard_size": 4, "sources": [{"documents": 25, "first_shard": 0}, {"documents": 9, "first_shard": 7}]}
    ranks = [Dist(rank, world) for rank in range(world)]
    for shard in range(10):
        assert sum(owns(r, shard) for r in ranks) == 1
    assert sum(own_documents(meta, r) for r in ranks) == 34
    assert own_documents(meta, Dist(0, 2)) == 4 + 4 + 4 + 1 + 4  # shards 0, 2, 4, 6 (the last, 1) and 8


# ---- torchrun --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_build_the_index_one_process_builds_file_for_file(alone, tiny, corpus, tmp_path):
    out = tmp_path / "idx"
    done = torchrun(*index_args(tiny, corpus, out))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # rank 0's summary, and no other rank's
    assert summary["ranks"] == 2 and summary["documents"] == 25 and summary["shards"] == 7
    assert "13/13" in done.stderr and "25/25" not in done.stderr  # rank 0's bar: its shards 0, 2, 4, 6 (of 1) alone
    assert hashes(out) == hashes(alone.folder)  # vectors, ids, documents, BM25 and index.json
    assert Index(out).search("river", top_k=3) == alone.search("river", top_k=3)


@pytest.mark.slow
def test_a_build_cut_off_under_two_ranks_resumes_to_the_unbroken_index(alone, tiny, corpus, tmp_path):
    out = tmp_path / "idx"
    shutil.copytree(alone.folder, out)
    meta = json.loads((out / "index.json").read_text())
    (out / "index.json").write_text(json.dumps(meta | {"complete": False}))  # killed mid-build
    for shard in ("00002", "00005"):  # one unfinished shard of each rank
        (out / "shards" / f"{shard}.npy").unlink()
    kept = (out / "shards" / "00001.npy").stat().st_mtime_ns
    done = torchrun(*index_args(tiny, corpus, out, "--resume", "--no-progress"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert hashes(out) == hashes(alone.folder)
    assert (out / "shards" / "00001.npy").stat().st_mtime_ns == kept  # finished shards are not redone


@pytest.mark.slow
def test_bad_input_fails_every_rank_before_a_file_is_written(tiny, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n')
    done = torchrun(*index_args(tiny, bad, tmp_path / "idx", "--no-progress"))
    assert done.returncode != 0
    # each rank checks and refuses on its own; torchrun stops a rank still running once another has failed, so
    # the second line is there only when both finished their checks first (a race the machine's load decides)
    assert done.stderr.count("bad.jsonl:2: duplicate id 'a'") >= 1
    assert not (tmp_path / "idx").exists()


@pytest.mark.slow
def test_a_two_rank_build_killed_mid_shard_resumes_to_the_vectors_of_an_unbroken_one(tiny, tmp_path):
    """SIGKILL to both ranks and torchrun once the first shards are on disk; --resume under two ranks finishes it,
    equal to one process's unbroken build (the temp files the kill left aside)."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", count=3000)
    unbroken = Index.build(tiny, corpus, tmp_path / "unbroken", bm25=True, shard_size=10, progress=False)
    out = tmp_path / "idx"
    argv = index_args(tiny, corpus, out, "--no-progress")
    argv[argv.index("--shard-size") + 1] = "10"
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    launched = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                 "-m", "encoderlab", *argv], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list((out / "shards").glob("*.npy"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for pid in [*descendants(launched.pid), launched.pid]:  # the ranks (torchrun gives them their own sessions)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launched.wait()
    finished = len(list((out / "shards").glob("*.npy")))
    if json.loads((out / "index.json").read_text())["complete"]:
        pytest.skip("the build finished before the kill: nothing to resume")
    assert 4 <= finished < 300
    done = torchrun(*index_args(tiny, corpus, out, "--resume", "--no-progress", "--shard-size", "10"))
    assert done.returncode == 0, done.stderr[-3000:]
    own = {name: digest for name, digest in hashes(out).items() if not Path(name).name.startswith(".")}
    assert own == hashes(unbroken.folder)
