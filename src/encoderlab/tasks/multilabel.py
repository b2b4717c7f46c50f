"""Multi-label classification: a set of classes per text (topics, tags, toxicity kinds), `finetune classify
--task-type multilabel`. One logit per class, each a yes/no of its own: sigmoid and binary cross-entropy, as
transformers' problem_type="multi_label_classification" (BCEWithLogitsLoss over every class of every row).

In a table a row's classes are one cell, separated by "|" ("sports|politics"); a row with no class names one the
file chooses for it (say "none"). Predictions are the classes whose probability passes `threshold` (0.5)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from encoderlab.errors import InputError
from encoderlab.nn.model import SequenceClassifier
from encoderlab.tasks.classify import ClassifyTask, read_classes
from encoderlab.tasks.metrics import f1_from_counts
from encoderlab.tasks.readers import TextExample
from encoderlab.tasks.spec import TaskSpec, numbered_labels

SEPARATOR = "|"


def names_of(example: TextExample) -> list[str]:
    """The class names of one example's label cell, in the order given, each once."""
    if example.label is None:
        raise InputError(f"{example.where}: no label")
    names = [name.strip() for name in str(example.label).split(SEPARATOR)]
    if not all(names):
        raise InputError(f"{example.where}: empty class name in {example.label!r} (classes are separated by "
                         f"{SEPARATOR!r})")
    return list(dict.fromkeys(names))


def label_sets(examples: list[TextExample]) -> list[str]:
    """Every class named in the examples, sorted."""
    names = {name for example in examples for name in names_of(example)}
    if not names:
        raise InputError("no labelled examples to learn classes from")
    return sorted(names)


def multilabel_metrics(gold: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Micro and macro F1 over the classes of 0/1 matrices (N, L), and exact-match (subset) accuracy."""
    gold, predicted = gold.astype(bool), predicted.astype(bool)
    tp, fp, fn = (gold & predicted).sum(0), (~gold & predicted).sum(0), (gold & ~predicted).sum(0)  # (L,) each
    return {"micro_f1": float(f1_from_counts(tp.sum(), fp.sum(), fn.sum())),  # scikit-learn's average="micro"
            "macro_f1": float(f1_from_counts(tp, fp, fn).mean()),  # average="macro": every class counts once
            "subset_accuracy": float((gold == predicted).all(axis=1).mean())}


class MultiLabelTask(ClassifyTask):
    """Classify each text (or pair) into any number of the classes."""

    metrics = ("micro_f1", "macro_f1", "subset_accuracy")

    def __init__(self, tokenizer, max_length: int, labels: list[str], threshold: float = 0.5, **options: Any) -> None:
        super().__init__(tokenizer, max_length, labels, **options)
        self.threshold = threshold

    def target(self, example: TextExample) -> list[float]:
        """0/1 per class (InputError naming the line for a class the model does not have)."""
        row = [0.0] * len(self.labels)
        for name in names_of(example):
            if name not in self.index:
                raise InputError(f"{example.where}: label {name!r} is not one of the model's labels "
                                 f"({', '.join(self.labels)})")
            row[self.index[name]] = 1.0
        return row

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().collate([{k: v for k, v in f.items() if k != "label"} for f in features])
        if "label" in features[0]:
            batch["labels"] = torch.tensor([f["label"] for f in features], dtype=torch.float32)  # (B, L)
        return batch

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[list[str]]:
        """The classes whose probability (the sigmoid of their logit) passes the threshold, per example."""
        chosen = self.logits(model, examples).sigmoid() >= self.threshold  # (N, L)
        return [[name for name, yes in zip(self.labels, row) if yes] for row in chosen.tolist()]

    def score(self, examples: list[TextExample], predictions: list[list[str]]) -> dict[str, float]:
        gold = np.array([self.target(e) for e in examples], dtype=np.int64)
        predicted = np.zeros_like(gold)
        for i, names in enumerate(predictions):
            predicted[i, [self.index[name] for name in names]] = 1
        return multilabel_metrics(gold, predicted)

    def notes(self) -> dict[str, str]:
        return {"f1_of": f"{len(self.labels)} classes, each a yes/no at probability {self.threshold:g}"}

    def info(self) -> dict[str, Any]:
        return super().info() | {"task_type": "multilabel", "threshold": self.threshold}


SPEC = TaskSpec(
    "classify", read_classes, variant="multilabel",
    build=lambda head, tokenizer, train, max_length, common: MultiLabelTask(
        tokenizer, max_length, head.labels or label_sets(train), stride=head.stride, combine=head.combine, **common),
    restore=lambda model, given, info, tokenizer, max_length, common: MultiLabelTask(
        tokenizer, max_length, model.labels or numbered_labels(model), info.get("threshold", 0.5),
        stride=given.stride, combine=given.combine, **common),
    models=(SequenceClassifier,), model_kind="classify", keeps_labels=True,
    model_options=lambda task, head: {"num_labels": len(task.labels), "multilabel": True})
