"""Sequence classification and regression: one text or a pair -> a class (cross-entropy) or a score (MSE).

Metrics: accuracy, F1, Matthews correlation for classes; Pearson and Spearman for scores (GLUE's choice per task is made
with --metric: e.g. mcc for CoLA, f1 for MRPC and QQP, spearman for STS-B)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from encoderlab.choices import split_names
from encoderlab.errors import InputError
from encoderlab.engine import COMBINE, Encoded, Engine, encode, forward, mean_by_owner
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.nn.model import SequenceClassifier
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.metrics import classification_metrics, correlation_metrics
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.spec import Head, Reading, TaskSpec, numbered_labels, register_task
from encoderlab.tokenizer import Tokenizer


def label_set(examples: list[TextExample]) -> list[str]:
    """The distinct class names, in numeric order when all are integers ("0" < "1" < "10"), else sorted."""
    names = {str(e.label) for e in examples if e.label is not None}
    if not names:
        raise InputError("no labelled examples to learn classes from")
    return sorted(names, key=int) if all(name.lstrip("-").isdigit() for name in names) else sorted(names)


class ClassifyTask(Task):
    """Sequence classification (or regression with regression=True) over single texts or pairs."""

    name = "classify"

    def __init__(self, tokenizer: Tokenizer, max_length: int, labels: list[str] | None, regression: bool = False,
                 batch_size: int = 32, precision: str = "fp32", stride: int | None = None,
                 combine: str = "logits") -> None:
        """stride: read a single text longer than max_length whole, in windows sharing `stride` tokens (None: truncate
        it); each window trains with the text's label, and predictions average the windows' logits (or, combine
        "probs", their probabilities)."""
        super().__init__(tokenizer, max_length, batch_size, precision)
        if not regression and not labels:
            raise InputError("classification needs the list of labels")
        if combine not in COMBINE:
            raise InputError(f"combine {combine!r}: expected one of {', '.join(COMBINE)}")
        self.labels, self.regression, self.stride, self.combine = labels, regression, stride, combine
        self.index = {label: i for i, label in enumerate(labels or [])}

    def notes(self) -> dict[str, str]:
        """{"f1_of": ...}: the class a binary F1 is computed for, or that it is a macro average."""
        if self.regression:
            return {}
        n = len(self.labels)
        return {"f1_of": f"class {self.labels[1]!r}" if n == 2 else f"macro average over {n} classes"}

    @property
    def metrics(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("spearman", "pearson") if self.regression else ("accuracy", "f1", "mcc")

    @property
    def num_outputs(self) -> int:
        """Logits per example: one score, or one per class."""
        return 1 if self.regression else len(self.labels)

    def target(self, example: TextExample) -> float | int:
        """The regression score, or the class index (InputError naming the line for an unknown class)."""
        if example.label is None:
            raise InputError(f"{example.where}: no label")
        if self.regression:
            return float(example.label)
        if str(example.label) not in self.index:
            raise InputError(f"{example.where}: label {example.label!r} is not one of the model's labels "
                             f"({', '.join(self.labels)})")
        return self.index[str(example.label)]

    def validate(self, examples: list[TextExample]) -> None:
        for example in examples:
            self.target(example)

    def encode(self, examples: list[TextExample]) -> tuple[list[Encoded], list[int]]:
        """Token ids of each example, single texts or pairs (all examples must have the same number of texts), and
        the example each belongs to: several windows of one long single text when there is a stride."""
        widths = {len(e.texts) for e in examples}
        if len(widths) != 1 or widths.pop() not in (1, 2):
            raise InputError(f"{examples[0].where}: classification takes one text or a pair per example")
        firsts = [e.texts[0] for e in examples]
        if self.stride is not None and len(examples[0].texts) == 1:
            return Engine(self.tokenizer, self.max_length).windows(firsts, self.stride)
        seconds = [e.texts[1] for e in examples] if len(examples[0].texts) == 2 else None
        return encode(self.tokenizer, firsts, seconds, self.max_length, "examples"), list(range(len(examples)))

    def features(self, examples: list[TextExample]) -> list[dict[str, Any]]:
        targets = [self.target(e) for e in examples]
        items, owners = self.encode(examples)
        return [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "label": targets[i]}
                for e, i in zip(items, owners)]

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pad_features(features, self.tokenizer.pad_id)
        if "label" in features[0]:
            dtype = torch.float32 if self.regression else torch.long
            batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
        return batch

    def logits(self, model: nn.Module, examples: list[TextExample]) -> torch.Tensor:
        """(N, L) float logits in example order (a long text's: its windows', combined)."""
        items, owners = self.encode(examples)
        rows = self.engine(model).rows(items, lambda batch: forward(model, batch).logits.float())
        if len(items) == len(examples):
            return rows
        if self.combine == "probs" and not self.regression:
            return mean_by_owner(rows.softmax(-1), owners, len(examples)).log()
        return mean_by_owner(rows, owners, len(examples))

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[str | float]:
        """A class name, or a score, per example."""
        logits = self.logits(model, examples)
        return logits[:, 0].tolist() if self.regression else [self.labels[i] for i in logits.argmax(-1).tolist()]

    def score(self, examples: list[TextExample], predictions: list[str | float]) -> dict[str, float]:
        gold = [self.target(e) for e in examples]
        if self.regression:
            return correlation_metrics(gold, predictions)
        return classification_metrics(gold, [self.index[p] for p in predictions], len(self.labels))

    def info(self) -> dict[str, Any]:
        return super().info() | {"task_type": "regression" if self.regression else "classification",
                                 "labels": self.labels, "stride": self.stride, "combine": self.combine}


def read_classes(path: str, reading: Reading, info: dict, head: Head) -> list[TextExample]:
    """A table (or JSONL) of texts and labels or scores; task.json's labels name the classes of a folder of texts."""
    header = reading.header and info.get("header", True)
    return read_texts(path, split_names(reading.option("text_cols", info)), reading.option("label_col", info),
                      head.regression, header, classes=info.get("labels"))


register_task(TaskSpec(
    "classify", read_classes,
    build=lambda head, tokenizer, train, max_length, common: ClassifyTask(
        tokenizer, max_length, None if head.regression else (head.labels or label_set(train)), head.regression,
        stride=head.stride, combine=head.combine, **common),
    restore=lambda model, given, info, tokenizer, max_length, common: ClassifyTask(
        tokenizer, max_length, None if model.regression else model.labels or numbered_labels(model),
        model.regression, stride=given.stride, combine=given.combine, **common),
    models=(SequenceClassifier, BiLSTMClassifier), model_kind="classify", keeps_labels=True,
    model_options=lambda task, head: {"num_labels": task.num_outputs, "problem_type": "regression" if task.regression
                                      else "single_label_classification"}))
