"""Objectives: what the one loop (encoderlab.train.loop) trains. Each is one nn.Module holding every model it trains
(so the optimizer, DDP and gradient clipping see one module), its loss normalised by the whole step's `Counts`
(so gradient accumulation and DDP equal one big batch):
- mlm, mlm+nsp, mlm+sop (mlm.py): BERT, RoBERTa and ALBERT;
- rtd (rtd.py): ELECTRA's generator + replaced-token detector, DeBERTa-v3's gradient-disentangled sharing;
- distill (distill.py): DistilBERT's student taught by a frozen teacher;
- fine-tuning tasks (encoderlab.tasks.objective): classification, NER, QA and sentence embeddings.
Each pretraining objective registers an ObjectiveSpec (its typed options, validation and builder; base.py) in
OBJECTIVES: a recipe names one and sets its options, and build_objective needs nothing else of the recipe.
"""

from __future__ import annotations

from typing import Any

from encoderlab.objectives import distill, mlm, rtd
from encoderlab.objectives.base import (OBJECTIVES, Counts, ModelChoice, Objective, ObjectiveSpec, check_vocabulary,
                                        register_objective)
from encoderlab.tokenizer import Tokenizer

for _spec in (*mlm.SPECS, rtd.SPEC, distill.SPEC):
    register_objective(_spec)


def build_objective(name: str, options: Any, model: ModelChoice, tokenizer: Tokenizer, data: str,
                    max_length: int) -> Objective:
    """Objective `name` with its typed options, its models freshly initialised (a distillation student starts from
    its teacher) or, with init_from, the checkpoint's weights; `new_tensors` names those the checkpoint lacked."""
    if model.init_from:
        check_vocabulary(tokenizer, data, model.init_from, "init_from")
    objective = OBJECTIVES[name].build(options, model, tokenizer, data, max_length)
    if model.init_from:
        objective.new_tensors = objective.start_from(model.init_from)
    return objective


__all__ = ["OBJECTIVES", "Counts", "ModelChoice", "Objective", "ObjectiveSpec", "build_objective",
           "register_objective"]
