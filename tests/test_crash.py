"""Crash safety of `encoderlab pretrain` and `encoderlab finetune`.

SIGKILL at random points (seeded, a few per run): the latest checkpoint always loads, no half-written file
sits under a final name, and --resume ends exactly where an uninterrupted run ends. SIGINT saves a checkpoint
at the step it stopped and exits 130 without a traceback; SIGTERM does the same and exits 143. A full disk
while a checkpoint is written leaves the previous checkpoint and `latest` intact, removes every temporary
file, and is reported in one line (exit 1).
"""

from __future__ import annotations

import csv
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from encoderlab import EncoderConfig, EncoderModel, save_pretrained
from encoderlab.cli import main
from encoderlab.data.prepare import prepare
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.config import load_recipe
from encoderlab.train.pretrain import pretrain
from encoderlab.train.state import STATE_FILE

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "house", "river", "city", "paris",
         "france", "capital", "king", "queen"]
# A tiny model with no dropout: 40 steps of ~30 ms, a checkpoint after every one.
RECIPE = {"preset": "bert-tiny", "max_length": 32, "batch_size": 8, "warmup_steps": 2, "lr": 0.003,
          "precision": "fp32", "log_every": 1, "eval_every": 0, "eval_batches": 1, "save_every": 1,
          "keep_checkpoints": 2, "max_steps": 40,
          "model": {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "num_layers": 2,
                    "max_position_embeddings": 64, "hidden_dropout": 0.0, "attention_dropout": 0.0}}
SPAWNED: list[subprocess.Popen] = []
POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "dire"]
FILLER = ["the", "movie", "was", "a", "film", "plot", "very", "quite", "and", "it"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread, as the subprocesses have (set up before the module's reference runs, autouse first):
    the in-process reference runs must compute the same bits, and two threads sum in another order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- checks shared by both commands ---------------------------------------------------------------------------
def step_of(folder: Path) -> int:
    return int(folder.name.removeprefix("step-"))


def latest_step(run: Path) -> int:
    """The step `latest` names (0 when there is no checkpoint yet)."""
    pointer = run / "checkpoints" / "latest"
    return step_of(Path(pointer.read_text().strip())) if pointer.is_file() else 0


def assert_checkpoints_whole(run: Path) -> None:
    """`latest` names a complete checkpoint, and every file under a final name parses in full."""
    root = run / "checkpoints"
    if (root / "latest").is_file():
        folder = root / (root / "latest").read_text().strip()
        assert load_file(folder / "model.safetensors")
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        assert state["step"] == step_of(folder)
    for path in run.rglob("*"):
        parts = path.relative_to(run).parts
        if not path.is_file() or any(p.startswith(".") for p in parts) or parts[0] == "tensorboard":
            continue  # temporaries (dot names) are not final names; TensorBoard event files are append logs
        if path.suffix == ".safetensors":
            assert load_file(path), path
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".pt":
            torch.load(path, map_location="cpu", weights_only=True)
        elif path.suffix == ".csv":
            assert all(int(row["step"]) > 0 for row in csv.DictReader(path.open(encoding="utf-8")))
    for folder in root.glob("step-*"):
        assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors", STATE_FILE}, folder


def assert_no_leftovers(run: Path) -> None:
    """No temporary file or folder of a killed or failed write is left in the run or its checkpoints."""
    assert not [p for p in run.rglob(".*") if p.relative_to(run).parts[0] != "tensorboard"]


@pytest.fixture(autouse=True)
def no_stray_processes():
    """Kill whatever a failing test left running."""
    yield
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def spawn(argv: list[str]) -> subprocess.Popen:
    """`python -m encoderlab ARGV` in the background, one torch thread."""
    proc = subprocess.Popen([sys.executable, "-m", "encoderlab", *argv], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    SPAWNED.append(proc)
    return proc


def wait_for_new_checkpoint(proc: subprocess.Popen, run: Path, timeout: float = 60.0) -> None:
    """Block until the process has saved a checkpoint beyond the one it started from (or has exited)."""
    start, deadline = latest_step(run), time.monotonic() + timeout
    while proc.poll() is None and latest_step(run) <= start:
        assert time.monotonic() < deadline, "no checkpoint was written in time"
        time.sleep(0.01)


def kill_and_resume(argv: list[str], run: Path, kills: int, rng: random.Random, window: float) -> None:
    """Start the command, SIGKILL it at a random moment after it saves, check the run, resume; `kills` times."""
    proc = spawn(argv)
    for _ in range(kills):
        wait_for_new_checkpoint(proc, run)
        time.sleep(rng.uniform(0.0, window))
        proc.kill()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (-signal.SIGKILL, 0), err[-3000:]  # killed, or it had already finished
        assert_checkpoints_whole(run)
        proc = spawn([*argv, "--resume"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]


def interrupt(argv: list[str], run: Path, signum: int = signal.SIGINT) -> int:
    """Send SIGINT (or SIGTERM) once a checkpoint is written; check the clean exit; return the step it saved."""
    proc = spawn(argv)
    wait_for_new_checkpoint(proc, run)
    time.sleep(0.1)  # into the next steps
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    code, last = (130, "interrupted") if signum == signal.SIGINT else (143, "terminated")
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and err.rstrip().endswith(last), err[-3000:]
    step = int(re.search(r"interrupted at step (\d+)", err).group(1))
    assert latest_step(run) == step
    assert_checkpoints_whole(run)
    return step


# ---- pretrain --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    """A YAML recipe over a tiny prepared corpus with its own WordPiece vocabulary."""
    root = tmp_path_factory.mktemp("pretrain")
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choices(WORDS, k=rng.randint(4, 12))).capitalize() + "."
                      for _ in range(rng.randint(3, 8))) for _ in range(30)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    Tokenizer.train("wordpiece", [root / "corpus.txt"], vocab_size=100).save(root / "tokenizer")
    prepare([str(root / "corpus.txt")], root / "tokenizer", root / "data", holdout=0.1, workers=1)
    path = root / "tiny.yaml"
    path.write_text(json.dumps({"data": str(root / "data"), **RECIPE}), encoding="utf-8")  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def pretrained(recipe, tmp_path_factory) -> Path:
    """The uninterrupted run every interrupted one must end up equal to."""
    run = tmp_path_factory.mktemp("reference") / "run"
    pretrain(load_recipe(recipe), run, progress=False)
    return run


def losses(run: Path) -> list[tuple[int, float]]:
    rows = csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
    return [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]


def assert_same_pretraining(run: Path, reference: Path) -> None:
    assert losses(run) == losses(reference)
    final, expected = (load_file(r / "model" / "model.safetensors") for r in (run, reference))
    assert final.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_pretrain_survives_sigkill_and_resumes_exactly(recipe, pretrained, tmp_path):
    run = tmp_path / "run"
    kill_and_resume(["pretrain", "--config", str(recipe), "--out", str(run)], run, kills=3,
                    rng=random.Random(0), window=0.8)
    assert_checkpoints_whole(run)
    assert_no_leftovers(run)
    assert latest_step(run) == RECIPE["max_steps"]
    assert_same_pretraining(run, pretrained)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.slow
def test_pretrain_sigint_saves_the_step_and_exits_cleanly(recipe, pretrained, tmp_path, signum):
    run = tmp_path / "run"
    argv = ["pretrain", "--config", str(recipe), "--out", str(run), "--set", "save_every=10"]
    step = interrupt(argv, run, signum)
    assert 10 <= step < RECIPE["max_steps"]
    assert max(s for s, _ in losses(run)) == step  # the steps logged are the steps saved
    # The resume in this process (one torch thread, as the reference): another interpreter would only add imports.
    assert main([*argv, "--resume"]) == 0
    assert_same_pretraining(run, pretrained)


def _group_is_gone(pgid: int, timeout: float = 15.0) -> bool:
    """Whether every process of the group has exited (workers, compile's helpers), waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_pretrain_saves_when_the_process_and_its_group_are_signalled_at_once(recipe, tmp_path):
    """As GNU timeout stops a command (the process, then its whole group) and Slurm a step (every process): two
    SIGTERMs at once, with data workers running and the objective compiled. The run finishes its step, saves,
    exits 143 with no traceback, leaves no process of its group behind, and --resume completes it."""
    run = tmp_path / "run"
    argv = ["pretrain", "--config", str(recipe), "--out", str(run), "--set", "save_every=10", "--set",
            "data_workers=2", "--set", "compile=true"]
    proc = subprocess.Popen([sys.executable, "-m", "encoderlab", *argv], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    SPAWNED.append(proc)
    wait_for_new_checkpoint(proc, run, timeout=300)  # compiling comes first
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    os.killpg(proc.pid, signal.SIGTERM)  # the group: the main process gets its second copy, the workers theirs
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and err.rstrip().endswith("terminated"), err[-3000:]
    step = int(re.search(r"interrupted at step (\d+)", err).group(1))
    assert 10 <= step < RECIPE["max_steps"] and latest_step(run) == step
    assert_checkpoints_whole(run)
    assert _group_is_gone(proc.pid), "a worker or helper process outlived the run"
    resume = [*argv[:-2], "--resume"]  # eager this time: compiling again would double the test's time
    done = subprocess.run([sys.executable, "-m", "encoderlab", *resume], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert latest_step(run) == RECIPE["max_steps"] and (run / "model" / "model.safetensors").is_file()


_GRACE = """
import os, signal, time
from encoderlab.errors import Terminated
from encoderlab.train.state import DeferredInterrupt
with DeferredInterrupt() as interrupt:
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the handlers run between bytecodes of the main thread
    print(interrupt.requested, interrupt.signum == signal.SIGTERM)
    interrupt.first_at -= DeferredInterrupt.GRACE_SECONDS + 1
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        print("not raised")
    except Terminated:
        print("raised")
"""


@pytest.mark.slow
def test_a_second_signal_within_the_grace_period_is_the_same_stop():
    """Copies of SIGTERM arriving together set the request once; one arriving after the grace period means the save
    is stuck, and raises. In a process of its own: pytest's holds native libraries' threads from earlier tests, and
    signalling it ended the whole suite with a segmentation fault."""
    done = subprocess.run([sys.executable, "-c", _GRACE], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "raised"], done.stdout


def test_pretrain_refuses_a_fresh_run_over_checkpoints(recipe, pretrained, capsys):
    assert main(["pretrain", "--config", str(recipe), "--out", str(pretrained)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert latest_step(pretrained) == RECIPE["max_steps"]


# A full disk as each writer meets it, after part of the file reached the disk: safetensors raises a
# SafetensorError, torch.save a RuntimeError that does not say why, Python's own writes OSError(ENOSPC).
def _fail_after(real, real_calls: int, fail):
    """A stand-in for `real` that calls it real_calls times, then calls `fail` instead."""
    calls = iter(range(10**6))
    return lambda *args, **kwargs: (real if next(calls) < real_calls else fail)(*args, **kwargs)


def _write_part_then(error: Exception):
    """A writer (obj, path, ...) that puts some bytes in the file, then raises `error`."""
    def write(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"\0" * 100)
        raise error
    return write


def _full_disk_safetensors(monkeypatch, real_calls: int) -> None:
    from safetensors import SafetensorError

    import encoderlab.checkpoint

    error = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(encoderlab.checkpoint, "save_file",
                        _fail_after(encoderlab.checkpoint.save_file, real_calls, _write_part_then(error)))


def _full_disk_torch_save(monkeypatch, real_calls: int) -> None:
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(torch, "save", _fail_after(torch.save, real_calls, _write_part_then(error)))


def _full_disk_latest(monkeypatch, real_calls: int) -> None:
    import encoderlab.train.state
    from encoderlab.io import atomic_write

    def write_latest(path: Path, text: str) -> None:
        error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        atomic_write(path, lambda tmp: _write_part_then(error)(text, tmp))

    monkeypatch.setattr(encoderlab.train.state, "atomic_write_text",
                        _fail_after(encoderlab.train.state.atomic_write_text, real_calls, write_latest))


@pytest.mark.parametrize("fill", [_full_disk_safetensors, _full_disk_torch_save, _full_disk_latest],
                         ids=["safetensors", "torch.save", "latest"])
def test_full_disk_keeps_the_previous_checkpoint(recipe, pretrained, tmp_path, monkeypatch, capsys, fill):
    import shutil

    import encoderlab.io

    run = tmp_path / "run"
    argv = ["pretrain", "--config", str(recipe), "--out", str(run), "--set", "save_every=5"]
    fill(monkeypatch, real_calls=1)  # the checkpoint at step 5 is written, the one at step 10 meets a full disk
    disk_usage = shutil.disk_usage
    monkeypatch.setattr(encoderlab.io.shutil, "disk_usage", lambda p: disk_usage(p)._replace(free=0))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = err.strip().splitlines()[-1]
    assert message.startswith("error: [Errno 28]") and "No space left on device" in message, message
    assert str(run / "checkpoints") in message
    assert latest_step(run) == 5
    assert_checkpoints_whole(run)
    assert_no_leftovers(run)
    monkeypatch.undo()  # space is freed: the run resumes to the uninterrupted result
    assert main([*argv, "--resume"]) == 0
    assert_same_pretraining(run, pretrained)


# ---- finetune --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def classify(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny random encoder folder and the finetune arguments for a synthetic sentiment task (60 steps)."""
    root = tmp_path_factory.mktemp("classify")
    words = POSITIVE + NEGATIVE + FILLER
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(words)] * 3, vocab_size=80, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(0)
    save_pretrained(EncoderModel(config), root / "model")
    tokenizer.save(root / "model")
    rng = random.Random(0)
    for name, count in (("train", 160), ("dev", 32)):
        rows = []
        for i in range(count):
            words = rng.choices(FILLER, k=rng.randint(3, 6)) + [rng.choice(POSITIVE if i % 2 else NEGATIVE)]
            rows.append(f"{' '.join(rng.sample(words, len(words)))}\t{'pos' if i % 2 else 'neg'}\n")
        (root / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    argv = ["finetune", "classify", "--model", str(root / "model"), "--train", str(root / "train.tsv"),
            "--eval", str(root / "dev.tsv"), "--lr", "3e-3", "--epochs", "3", "--batch-size", "8",
            "--threads", "1", "--no-progress"]
    return root, argv


@pytest.fixture(scope="module")
def finetuned(classify) -> Path:
    """The uninterrupted fine-tuning run."""
    root, argv = classify
    assert main([*argv, "--out", str(root / "reference")]) == 0
    return root / "reference"


def assert_same_finetuning(run: Path, reference: Path) -> None:
    """The same history and best metrics, the same best model, the same final weights."""
    record, expected = (json.loads((r / "training.json").read_text()) for r in (run, reference))
    assert record["history"] == expected["history"] and record["best"] == expected["best"]
    for name in ("model.safetensors", "checkpoints/latest"):
        path = run / name
        if name.endswith("latest"):  # the final training state's weights
            path = path.parent / path.read_text().strip() / "model.safetensors"
            assert path.parent.name == (reference / name).read_text().strip()
        other = reference / path.relative_to(run)
        a, b = load_file(path), load_file(other)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{name} {key}")


@pytest.mark.slow
def test_finetune_survives_sigkill_and_resumes_exactly(classify, finetuned, tmp_path):
    _, argv = classify
    run = tmp_path / "run"
    kill_and_resume([*argv, "--out", str(run), "--save-every", "2"], run, kills=2, rng=random.Random(1), window=0.5)
    assert_checkpoints_whole(run)
    assert_no_leftovers(run)
    assert_same_finetuning(run, finetuned)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.slow
def test_finetune_sigint_saves_the_step_and_exits_cleanly(classify, finetuned, tmp_path, signum):
    _, argv = classify
    run = tmp_path / "run"
    step = interrupt([*argv, "--out", str(run)], run, signum)  # the state is saved after each epoch (20 steps) and now
    assert 20 < step < 60
    assert main([*argv, "--out", str(run), "--resume"]) == 0
    assert_same_finetuning(run, finetuned)


def test_finetune_fresh_run_discards_an_old_training_state(classify, finetuned, tmp_path):
    _, argv = classify
    run = tmp_path / "run"
    assert main([*argv, "--out", str(run), "--epochs", "1"]) == 0
    assert latest_step(run) == 20
    assert main([*argv, "--out", str(run)]) == 2  # a finished run is not replaced unasked (issue 42)
    assert main([*argv, "--out", str(run), "--overwrite"]) == 0  # starts again, not from step 20
    assert_same_finetuning(run, finetuned)
