"""Pretraining objectives: what the one loop trains, the loss of a micro-batch, metrics, checkpoints, export.

Each objective is one nn.Module holding every model it trains (so the optimizer, DDP and gradient clipping see
one module) and a loss normalised by the whole optimizer step's counts (`Counts`), which keeps gradient
accumulation and DDP equal to one big batch:
- mlm, mlm+nsp, mlm+sop (mlm.py): BERT, RoBERTa and ALBERT;
- rtd (rtd.py): ELECTRA's generator + replaced-token detector, DeBERTa-v3's gradient-disentangled sharing;
- distill (distill.py): DistilBERT's student taught by a frozen teacher.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from encoderlab.tokenizer import Tokenizer
    from encoderlab.train.config import PretrainConfig

Counts = dict[str, torch.Tensor]
"""Whole-step totals over all ranks and micro-batches: "masked" tokens, "tokens" (real ones), "sequences"."""


class Objective(nn.Module):
    """Base of the objectives: forward(batch, counts) -> (loss, sums); metrics from summed sums; save/load/export."""

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

    def export(self, folder: Path, tokenizer: "Tokenizer") -> None:
        """The final model(s) as Hugging Face folders with the tokenizer."""
        raise NotImplementedError


def build_objective(cfg: "PretrainConfig", tokenizer: "Tokenizer") -> Objective:
    """The recipe's objective with freshly initialised models (a distillation student starts from its teacher)."""
    from encoderlab.objectives import distill, mlm, rtd

    if cfg.objective == "rtd":
        return rtd.build(cfg, tokenizer)
    if cfg.objective == "distill":
        return distill.build(cfg, tokenizer)
    return mlm.build(cfg, tokenizer)
