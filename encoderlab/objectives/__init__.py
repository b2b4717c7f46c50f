"""Objectives: what the one loop (encoderlab.train.loop) trains, the loss of a micro-batch, metrics, checkpoints.

Each objective is one nn.Module holding every model it trains (so the optimizer, DDP and gradient clipping see
one module) and a loss normalised by the whole optimizer step's counts (`Counts`), which keeps gradient
accumulation and DDP equal to one big batch:
- mlm, mlm+nsp, mlm+sop (mlm.py): BERT, RoBERTa and ALBERT;
- rtd (rtd.py): ELECTRA's generator + replaced-token detector, DeBERTa-v3's gradient-disentangled sharing;
- distill (distill.py): DistilBERT's student taught by a frozen teacher;
- fine-tuning tasks (encoderlab.tasks.objective): classification, NER, QA and sentence embeddings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from encoderlab.objectives import distill, mlm, rtd
from encoderlab.objectives.base import Counts, Objective
from encoderlab.tokenizer import Tokenizer

if TYPE_CHECKING:  # the recipe type only: train/ builds objectives, so it sits above them
    from encoderlab.train.config import PretrainConfig


def build_objective(cfg: PretrainConfig, tokenizer: Tokenizer) -> Objective:
    """The recipe's objective with freshly initialised models (a distillation student starts from its teacher)."""
    if cfg.objective == "rtd":
        return rtd.build(cfg, tokenizer)
    if cfg.objective == "distill":
        return distill.build(cfg, tokenizer)
    return mlm.build(cfg, tokenizer)


__all__ = ["Counts", "Objective", "build_objective"]
