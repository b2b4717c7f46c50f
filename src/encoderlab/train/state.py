"""Training checkpoints: written atomically, loaded with weights_only=True, enough to resume exactly.

RUN/checkpoints/step-000200/ holds config.json and model.safetensors (loadable by encoderlab and transformers) and
trainer_state.pt (optimizer, scheduler, RNG states, step and data position); RUN/checkpoints/latest names the newest.
A step folder is built under a temporary name and renamed into place, and an old one renamed away before it is
deleted, so a kill or a full disk never leaves a partial checkpoint under a final name; a run starts by removing
the temporaries a killed one left (remove_leftovers). Ctrl-C and SIGTERM become a checkpoint (DeferredInterrupt).
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch

from encoderlab.errors import CheckpointError, Terminated
from encoderlab.io import TEMP_SUFFIX, atomic_write, atomic_write_text, fsync_folder, remove_folder

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    """Every RNG a step draws from: Python, NumPy, torch CPU and (if present) CUDA."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "gauss": float(gauss)}  # plain types: loadable with weights_only
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch RNGs."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    version, internal, gauss = state["python"]  # weights_only unpickling made the inner tuple a list
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, save_model: Callable[[Path], None], trainer_state: dict[str, Any],
                    keep: int) -> Path:
    """Write checkpoints/step-NNNNNN atomically (weights by save_model(folder)), point `latest` at it, keep the newest
    `keep`. On a failure (a full disk) OSError names the checkpoint; `latest` and its checkpoint stay as they were."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=TEMP_SUFFIX, dir=root))
    try:
        save_model(staging)
        atomic_write(staging / STATE_FILE, lambda tmp: torch.save(trainer_state, tmp))
        if final.exists():  # e.g. saved by a run killed before it could update `latest`
            remove_folder(final)
        staging.rename(final)
        fsync_folder(root)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise OSError(err.errno, f"checkpoint not written ({err.strerror}); the previous one is kept",
                      str(final)) from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    atomic_write_text(root / "latest", final.name + "\n")
    older = sorted(p for p in root.glob("step-*") if p.is_dir() and p != final)
    for old in older[:max(len(older) - max(keep - 1, 0), 0)]:  # `final` is always kept: `latest` names it
        remove_folder(old)
    return final


def remove_leftovers(run_dir: Path, *folders: Path) -> None:
    """Remove the temporaries (.NAME.RANDOM.tmp) a killed run left in run_dir, its checkpoints/ and `folders`."""
    for folder in (Path(run_dir), Path(run_dir) / "checkpoints", *folders):
        for path in Path(folder).glob(f".*{TEMP_SUFFIX}"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def clear_checkpoints(run_dir: Path) -> None:
    """Remove run_dir/checkpoints (a fresh run's old resume state), renaming it away first."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        remove_folder(root)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder `latest` points at, or None when the run has no checkpoint yet."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    folder = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    if not (folder / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {folder.name}, which is missing or incomplete")
    return folder


def load_trainer_state(folder: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint folder, unpickled with weights_only=True (a file holding code is refused)."""
    try:
        return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{folder / STATE_FILE}: unreadable trainer state ({err})") from None


class DeferredInterrupt:
    """Within `with`, Ctrl-C and SIGTERM (what Slurm, Kubernetes, `docker stop` and torchrun send before a kill) set
    `requested` instead of raising, so a loop stops between steps and raises `stop()`: mid-step, the model, optimizer
    and data position would be out of step and the checkpoint would not resume exactly.

    Signals arrive in groups: GNU timeout signals the process and then its whole process group, Slurm every process
    of a step, a terminal's Ctrl-C the foreground group, torchrun forwards what it gets. So a second signal within
    GRACE_SECONDS of the first is a copy of the same stop and is ignored; a later one raises at once (the save is
    stuck), and so does a second Ctrl-C typed at a terminal (someone wants out now). Nothing happens outside the main
    thread (signals cannot be caught there); an ignored signal stays ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    GRACE_SECONDS = 10.0

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.first_at = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) != signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            fallback = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, fallback if previous is None else previous)
        self._previous.clear()

    def stop(self) -> KeyboardInterrupt:
        """The exception that ends the run once the state is saved."""
        return Terminated() if self.signum == signal.SIGTERM else KeyboardInterrupt()

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if not self.requested:
            self.requested, self.signum, self.first_at = True, signum, now
            return
        typed = signum == signal.SIGINT and _at_a_terminal()
        if typed or now - self.first_at > self.GRACE_SECONDS:
            raise self.stop()


def _at_a_terminal() -> bool:
    """Whether this process reads from a terminal (where a second Ctrl-C is a person asking to stop now)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # a closed stdin
        return False
