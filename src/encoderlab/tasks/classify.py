"""Sequence classification and regression: one text or a pair -> a class (cross-entropy) or a score (MSE).

Metrics: accuracy, F1, Matthews correlation for classes; Pearson and Spearman for scores (GLUE's choice per task is made
with --metric: e.g. mcc for CoLA, f1 for MRPC and QQP, spearman for STS-B)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

import torch
from pydantic import Field, create_model
from torch import nn

from encoderlab.cards import ClassifyOptions
from encoderlab.choices import split_names
from encoderlab.errors import InputError
from encoderlab.engine import COMBINE, Encoded, as_list, check_texts, Engine, encode, forward, mean_by_owner
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.nn.model import SequenceClassifier
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.metrics import classification_metrics, correlation_metrics
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.spec import Reading, TaskSpec, numbered_labels
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
                 combine: str | None = None) -> None:
        """stride: read a single text longer than max_length whole, in windows sharing `stride` tokens (None: truncate
        it); each window trains with the text's label, and predictions average the windows' logits (or, combine
        "probs", their probabilities; None: logits)."""
        super().__init__(tokenizer, max_length, batch_size, precision)
        combine = combine or COMBINE[0]
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


def read_classes(path: str, reading: Reading, info: dict, head: ClassifyOptions) -> list[TextExample]:
    """A table (or JSONL) of texts and labels or scores; task.json's labels name the classes of a folder of texts."""
    header = reading.header and info.get("header", True)
    return read_texts(path, split_names(reading.option("text_cols", info)), reading.option("label_col", info),
                      head.regression, header, classes=info.get("labels"))


SPEC = TaskSpec(
    "classify", read_classes,
    build=lambda head, tokenizer, train, max_length, common: ClassifyTask(
        tokenizer, max_length, None if head.regression else (head.labels or label_set(train)), head.regression,
        stride=head.stride, combine=head.combine, **common),
    restore=lambda model, given, info, tokenizer, max_length, common: ClassifyTask(
        tokenizer, max_length, None if model.regression else model.labels or numbered_labels(model),
        model.regression, stride=given.stride, combine=given.combine, **common),
    models=(SequenceClassifier, BiLSTMClassifier), model_kind="classify", keeps_labels=True,
    model_options=lambda task, head: {"num_labels": task.num_outputs, "problem_type": "regression" if task.regression
                                      else "single_label_classification"})


# ---- the `classify` pipeline -------------------------------------------------------------------------------------
class Classify(Pipeline):
    """Texts (or [text, pair] items) -> label and class probabilities; a regression model gives a score, a
    multilabel one every class whose probability passes 0.5."""

    task = "classify"
    model_class, needs = SequenceClassifier, "a sequence-classification checkpoint (encoderlab finetune classify)"
    result = create_model(
        "ClassifyResult", label=(str | None, Field(None, description="the most probable class (absent for regression "
                                                                     "and multilabel)")),
        labels=(list[str] | None, Field(None, description="multilabel: every class whose probability passes 0.5")),
        score=(float | None, Field(None, description="its probability, or the regression value")),
        scores=(dict[str, float] | None, Field(None, description="every class's probability")))

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        pair = Annotated[list[text], Field(min_length=2, max_length=2)]
        return {"texts": (list[text | pair], many("texts, or [text, pair] items (all of one kind)"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        if "labels" in result:  # multilabel: every class that passes a half, else the closest ones
            top = sorted(result["scores"].items(), key=lambda item: -item[1])[:3]
            return ",".join(result["labels"]) or "no class above 0.5; top: " + ", ".join(
                f"{name} {score:.4f}" for name, score in top)
        return f"{result['score']:.4f}" if "label" not in result else f"{result['label']}\t{result['score']:.4f}"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, stride: int | None = None, combine: str | None = None,
                 **options: Any) -> None:
        """stride, combine: how a text longer than the window is read (None follows the folder): in windows sharing
        `stride` tokens whose logits (or probabilities, combine="probs") are averaged. Pairs are truncated."""
        super().__init__(model, tokenizer, **options)
        self.regression, self.multilabel = model.regression, getattr(model, "multilabel", False)
        self._windowing(stride, combine)

    def __call__(self, inputs: Sequence[str | Sequence[str]]) -> list[dict[str, Any]]:
        texts, pairs = split_pairs(inputs)
        if self.stride is not None and pairs is None:
            logits = self._window_rows(texts, lambda batch: self.logits(batch).float(),
                                       probs=self.combine == "probs" and not self.regression)
        else:
            logits = self.engine.rows(self.engine.encode(texts, pairs), lambda batch: self.logits(batch).float())
        return [self._result(row) for row in logits]

    def info(self) -> dict[str, Any]:
        return super().info() | {"stride": self.stride, "combine": self.combine}

    def _result(self, logits: torch.Tensor) -> dict[str, Any]:
        """{"score": value} for regression; else the top label, its probability and every class's."""
        if self.regression:
            return {"score": round(float(logits[0]), 6)}
        probs = (logits.sigmoid() if self.multilabel else logits.softmax(-1)).tolist()
        names = self.labels if len(self.labels) == len(probs) else [str(i) for i in range(len(probs))]
        scores = {name: round(p, 6) for name, p in zip(names, probs)}
        if self.multilabel:  # each class on its own: every one whose probability passes a half
            return {"labels": [name for name, p in zip(names, probs) if p >= 0.5], "scores": scores}
        best = max(range(len(probs)), key=probs.__getitem__)
        return {"label": names[best], "score": round(probs[best], 6), "scores": scores}


def split_pairs(inputs: Sequence[str | Sequence[str]]) -> tuple[list[str], list[str] | None]:
    """Single texts, or [text, pair] items (all one kind): (texts, pairs or None)."""
    inputs = as_list(inputs, "text")
    if all(isinstance(item, str) for item in inputs):
        return check_texts(inputs), None
    for i, item in enumerate(inputs):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise InputError(f"input {i}: expected every input to be a text, or every input a [text, pair] "
                             f"of two texts")
    return check_texts([a for a, _ in inputs]), check_texts([b for _, b in inputs], "pair text")
