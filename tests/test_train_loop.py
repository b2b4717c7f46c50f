"""Fine-tuning on the one training loop: gradient accumulation and DDP equal one big batch, bf16 runs.

Pretraining's side of the same loop is pinned in test_pretrain.py (resume, DDP) and test_crash.py (kills,
signals, full disks); here the fine-tuning objectives get the same guarantees. The model has no dropout, so
runs that split a batch differently compute the same function and may differ only by rounding.
"""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from encoderlab import EncoderConfig, EncoderModel, save_pretrained
from encoderlab.cli import main
from encoderlab.tasks.objective import TrainOptions
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.config import load_recipe
from encoderlab.train.loop import LoopOptions
from encoderlab.train.optim import OptimOptions

ROOT = Path(__file__).resolve().parents[1]
POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "dire"]
FILLER = ["the", "movie", "was", "a", "film", "plot", "very", "quite", "and", "it"]
NAMES, CITIES = ["anna", "peter", "maria"], ["paris", "rome", "oslo"]

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A tiny dropout-free encoder with its tokenizer, a sentiment TSV and a CoNLL file of names and cities."""
    root = tmp_path_factory.mktemp("loop")
    words = POSITIVE + NEGATIVE + FILLER + NAMES + CITIES
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(words)] * 3, vocab_size=80, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64,
                                       hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    save_pretrained(EncoderModel(config), root / "model")
    tokenizer.save(root / "model")
    rng = random.Random(0)
    rows = []
    for i in range(49):  # 49 = 3 x 16 + 1: the last batch holds one example, fewer than the 2 ranks
        words = rng.choices(FILLER, k=rng.randint(2, 9)) + [rng.choice(POSITIVE if i % 2 else NEGATIVE)]
        rows.append(f"{' '.join(rng.sample(words, len(words)))}\t{'pos' if i % 2 else 'neg'}\n")
    (root / "train.tsv").write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    sentences = []
    for _ in range(49):
        pairs = [(rng.choice(NAMES), "B-PER") if r < 0.2 else (rng.choice(CITIES), "B-LOC") if r < 0.4 else
                 (rng.choice(FILLER), "O") for r in (rng.random() for _ in range(rng.randint(2, 9)))]
        sentences.append("".join(f"{w} {t}\n" for w, t in pairs))
    (root / "train.txt").write_text("\n".join(sentences), encoding="utf-8")
    return root


def argv(data: Path, task: str, out: Path, *extra: str) -> list[str]:
    train = data / ("train.tsv" if task == "classify" else "train.txt")
    return ["finetune", task, "--model", str(data / "model"), "--train", str(train), "--out", str(out),
            "--lr", "3e-3", "--epochs", "2", "--batch-size", "16", "--no-progress", *extra]


def losses(run: Path) -> list[tuple[int, float]]:
    rows = csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
    return [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]


def assert_same_run(run: Path, reference: Path) -> None:
    """The same loss at every step and the same final weights, up to rounding."""
    steps = losses(reference)
    assert len(steps) == 8  # 4 steps per epoch (the last of one example), 2 epochs
    for (step_a, loss_a), (step_b, loss_b) in zip(losses(run), steps, strict=True):
        assert step_a == step_b and loss_a == pytest.approx(loss_b, rel=1e-4, abs=1e-5), step_a
    final, expected = (load_file(r / "checkpoints" / "step-000008" / "model.safetensors") for r in (run, reference))
    assert final.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("task", ["classify", "ner"])
def test_gradient_accumulation_equals_one_big_batch(data, tmp_path, task):
    """NER divides by the step's tagged tokens: a mean per micro-batch would weight short sentences more."""
    assert main(argv(data, task, tmp_path / "one")) == 0
    assert main(argv(data, task, tmp_path / "four", "--grad-accum", "4")) == 0
    assert_same_run(tmp_path / "four", tmp_path / "one")


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(data, tmp_path):
    """torchrun with 2 CPU ranks (gloo): each takes half of every batch (the last, of one example, goes to
    rank 1 while rank 0 runs a zero-weight dummy), and the run ends where one process ends."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    assert main(argv(data, "classify", tmp_path / "single")) == 0
    launched = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               "-m", "encoderlab", *argv(data, "classify", tmp_path / "double")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert_same_run(tmp_path / "double", tmp_path / "single")


def test_bf16_fine_tuning_runs_close_to_fp32(data, tmp_path):
    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    assert main(argv(data, "classify", fp32, "--grad-accum", "2")) == 0
    assert main(argv(data, "classify", bf16, "--grad-accum", "2", "--precision", "bf16")) == 0
    reference, steps = [loss for _, loss in losses(fp32)], [loss for _, loss in losses(bf16)]
    assert len(steps) == 8 and steps != reference  # rounded to bf16: not the fp32 run
    assert steps == pytest.approx(reference, rel=0.05)
    assert (bf16 / "model.safetensors").is_file()


def test_grad_accum_must_be_positive(data, tmp_path, capsys):
    assert main(argv(data, "classify", tmp_path / "x", "--grad-accum", "0")) == 2
    assert "--grad-accum 0" in capsys.readouterr().err


# A heap left fragmented, as varying tensor sizes leave it: many chunks below glibc's mmap threshold, freed while a
# later allocation keeps the top of the heap in use, so that free() alone returns nothing to the OS.
_FRAGMENTED_HEAP = """
import os
from encoderlab.train.loop import release_freed_memory
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
blocks = [b"x" * 60_000 for _ in range(4_000)]
pin = b"y" * 60_000
del blocks
before = rss()
released = release_freed_memory()
print(released, before, rss())
"""


@pytest.mark.slow
def test_the_loop_hands_freed_heap_memory_back_to_the_os():
    from encoderlab.train.loop import _malloc_trim
    if not Path("/proc/self/statm").is_file() or _malloc_trim() is None:
        pytest.skip("needs Linux with glibc (malloc_trim and /proc/self/statm)")
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.split()
    released, before, after = out[0] == "True", int(out[1]), int(out[2])
    assert released
    assert before - after > 150e6, f"resident {before / 1e6:.0f} MB before the trim, {after / 1e6:.0f} MB after"


def test_finetuning_and_pretraining_hand_the_loop_the_same_options():
    """TrainOptions keeps its flags' names (max_grad_norm, warmup_ratio) and maps them by name onto the LoopOptions
    and OptimOptions a pretraining recipe holds."""
    options = TrainOptions(lr=3e-5, max_grad_norm=0.5, warmup_ratio=0.2, grad_accum=2, precision="bf16",
                           eval_every=7, save_every=9, weight_decay=0.1)
    loop, optim = options.loop(100), options.optim(100)
    assert loop == LoopOptions(max_steps=100, grad_accum=2, precision="bf16", clip_norm=0.5, log_every=1,
                               eval_every=7, save_every=9, keep_checkpoints=1)
    assert optim == OptimOptions(lr=3e-5, warmup_steps=20, schedule="linear", weight_decay=0.1, beta1=0.9,
                                 beta2=0.999, eps=1e-8)
    recipe = load_recipe(None, ["data=x", "clip_norm=0.5", "warmup_steps=20"])
    assert type(recipe.loop) is LoopOptions and type(recipe.optim) is OptimOptions
    assert recipe.loop.clip_norm == loop.clip_norm and recipe.optim.warmup_steps == optim.warmup_steps
