"""The Objective interface every objective implements, and the whole-step counts its loss is normalised by."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from encoderlab.nn.model import IGNORE_INDEX
from encoderlab.tokenizer import Tokenizer

Counts = dict[str, torch.Tensor]
"""Whole-step totals over all ranks and micro-batches: "masked" tokens, "tokens" (real ones), "sequences"."""


class Objective(nn.Module):
    """Base of the objectives: forward(batch, counts) -> (loss, sums); metrics from summed sums; save/load/export."""

    unused_parameters = False  # whether forward may leave some parameters without a gradient (DDP must know)

    def counts(self, batch: dict[str, torch.Tensor]) -> Counts:
        """This micro-batch's share of the step's counts (the loop sums them over micro-batches and ranks)."""
        return {"masked": (batch["labels"] != IGNORE_INDEX).sum(), "tokens": batch["attention_mask"].sum(),
                "sequences": torch.tensor(batch["input_ids"].shape[0], device=batch["input_ids"].device)}

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the step's loss, and detached sums (losses, correct counts) for the logs."""
        raise NotImplementedError

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        """Per-token (or per-sequence) figures from sums over a step or an evaluation; "loss" is the total."""
        raise NotImplementedError

    def save(self, folder: Path) -> None:
        """Write the trained weights into a checkpoint folder (exactly enough to resume)."""
        raise NotImplementedError

    def load(self, folder: Path) -> None:
        """Load what save() wrote, in place."""
        raise NotImplementedError

    def export(self, folder: Path, tokenizer: Tokenizer) -> None:
        """The final model(s) as Hugging Face folders with the tokenizer."""
        raise NotImplementedError
