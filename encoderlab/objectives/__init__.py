"""Objectives: what the one loop (encoderlab.train.loop) trains. Each is one nn.Module holding every model it trains
(so the optimizer, DDP and gradient clipping see one module), its loss normalised by the whole step's `Counts`
(so gradient accumulation and DDP equal one big batch):
- mlm, mlm+nsp, mlm+sop (mlm.py): BERT, RoBERTa and ALBERT;
- rtd (rtd.py): ELECTRA's generator + replaced-token detector, DeBERTa-v3's gradient-disentangled sharing;
- distill (distill.py): DistilBERT's student taught by a frozen teacher;
- fine-tuning tasks (encoderlab.tasks.objective): classification, NER, QA and sentence embeddings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from encoderlab.objectives import distill, mlm, rtd
from encoderlab.objectives.base import Counts, Objective, check_vocabulary
from encoderlab.tokenizer import Tokenizer

if TYPE_CHECKING:  # the recipe type only: train/ builds objectives, so it sits above them
    from encoderlab.train.config import PretrainConfig


def build_objective(cfg: PretrainConfig, tokenizer: Tokenizer) -> Objective:
    """The recipe's objective with freshly initialised models (a distillation student starts from its teacher),
    or, with init_from, the checkpoint's weights; `new_tensors` names those the checkpoint did not hold."""
    if cfg.init_from:
        check_vocabulary(tokenizer, cfg.data, cfg.init_from, "init_from")
    builder = {"rtd": rtd.build, "distill": distill.build}.get(cfg.objective, mlm.build)
    objective = builder(cfg, tokenizer)
    if cfg.init_from:
        objective.new_tensors = objective.start_from(cfg.init_from)
    return objective


__all__ = ["Counts", "Objective", "build_objective"]
