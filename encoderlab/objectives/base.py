"""The Objective interface every objective implements, and the whole-step counts its loss is normalised by."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from encoderlab.checkpoint import init_from, load_weights, save_pretrained
from encoderlab.errors import ConfigError, InputError
from encoderlab.nn.model import IGNORE_INDEX
from encoderlab.paths import resolve_model_path
from encoderlab.tokenizer import Tokenizer

Counts = dict[str, torch.Tensor]
"""Whole-step totals over all ranks and micro-batches: "masked" tokens, "tokens" (real ones), "sequences"."""


class Objective(nn.Module):
    """Base of the objectives: forward(batch, counts) -> (loss, sums); metrics from summed sums; save/load/export,
    by default of the one model kept, `self.model`."""

    unused_parameters = False  # whether forward may leave some parameters without a gradient (DDP must know)
    new_tensors: list[str] = []  # with init_from: the tensors the checkpoint did not hold (start_from's answer)

    def counts(self, batch: dict[str, torch.Tensor]) -> Counts:
        """This micro-batch's share of the step's counts (the loop sums them over micro-batches and ranks)."""
        return {"masked": (batch["labels"] != IGNORE_INDEX).sum(), "tokens": batch["attention_mask"].sum(),
                # torch.full, not torch.tensor: a copy from the host would wait for the GPU's queue every step
                "sequences": torch.full((), batch["input_ids"].shape[0], device=batch["input_ids"].device)}

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the step's loss, and detached sums (losses, correct counts) for the logs."""
        raise NotImplementedError

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        """Per-token (or per-sequence) figures from sums over a step or an evaluation; "loss" is the total."""
        raise NotImplementedError

    def start_from(self, name: str) -> list[str]:
        """Continued pretraining: load a checkpoint's weights into the trained model in place; return the
        names of the tensors it did not hold (fresh heads, a generator), which keep their initialisation."""
        return init_from(self.model, name)

    def save(self, folder: Path) -> None:
        """Write the trained weights into a checkpoint folder (exactly enough to resume)."""
        save_pretrained(self.model, folder)

    def load(self, folder: Path) -> None:
        """Load what save() wrote, in place."""
        load_weights(self.model, folder)

    def export(self, folder: Path, tokenizer: Tokenizer) -> None:
        """The final model(s) as Hugging Face folders with the tokenizer."""
        save_pretrained(self.model, folder, tokenizer)


def check_vocabulary(tokenizer: Tokenizer, data: str, name: str, role: str) -> None:
    """Refuse a checkpoint (init_from, a teacher) whose tokenizer is not the one `data` was prepared with: another
    kind, size or any token id. A checkpoint with no tokenizer files passes: its config's vocabulary size is
    all that can be checked, and the model config does that."""
    try:
        theirs = Tokenizer.from_pretrained(resolve_model_path(name))
    except (InputError, ConfigError, OSError):
        return
    difference = tokenizer.difference(theirs)
    if difference is not None:
        raise ConfigError(f"{role}: {name}'s tokenizer differs from the one {data} was prepared with ({difference}): "
                          f"prepare the data with `encoderlab prepare --tokenizer {name}`")
