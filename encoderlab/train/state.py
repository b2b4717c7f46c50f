"""Training checkpoints: written atomically, loaded with weights_only=True, enough to resume exactly.

Layout of RUN/checkpoints/step-000200/:
  config.json, model.safetensors   the model, loadable by encoderlab and transformers
  trainer_state.pt                 optimizer, scheduler, RNG states, step and data position
RUN/checkpoints/latest names the newest complete one. A step folder is built under a temporary
name and renamed into place, so a crash never leaves a half-written checkpoint under a final name.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from encoderlab.checkpoint import load_weights
from encoderlab.errors import CheckpointError
from encoderlab.io import atomic_write, atomic_write_text
from encoderlab.nn.model import Model

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


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    random.setstate(_as_python_random_state(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_random_state(state: Any) -> tuple:
    """weights_only unpickling turns the inner tuple of random.getstate() into a list; undo that."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def save_checkpoint(run_dir: Path, step: int, model: Model, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write checkpoints/step-NNNNNN atomically, point `latest` at it, prune to the newest `keep`."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    staging = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=root))
    try:
        model.save_pretrained(staging)
        atomic_write(staging / STATE_FILE, lambda tmp: torch.save(trainer_state, tmp))
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    atomic_write_text(root / "latest", final.name + "\n")
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder `latest` points at, or None when the run has no checkpoint yet."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    folder = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    if not (folder / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {folder.name}, which is missing or incomplete")
    return folder


def load_checkpoint(folder: Path, model: Model) -> dict[str, Any]:
    """Load model weights in place and return the trainer state (unpickled with weights_only=True)."""
    load_weights(model, folder)
    try:
        return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{folder / STATE_FILE}: unreadable trainer state ({err})") from None
