"""What every task gives the one training loop, and the helpers they share: examples -> features (unpadded token
ids and targets) -> padded batches -> loss terms, each a sum in its unit; examples -> predictions and metrics."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.engine import Engine, eval_mode, pad_batch
from encoderlab.nn.output import LossTerm
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def length_grouped_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator,
                           group: int = 50) -> list[list[int]]:
    """Random batches of similar length (little padding, a new order every epoch): shuffle, sort within groups of
    `group` batches (1: plain random batches), shuffle the batches."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    batches = []
    span = batch_size * max(group, 1)
    for start in range(0, len(order), span):
        chunk = sorted(order[start:start + span], key=lambda i: -lengths[i])
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    shuffle = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffle]


def pad_features(features: Sequence[dict[str, Any]], pad_id: int, prefix: str = "") -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids (B, T) from features holding the first and last lists."""
    return pad_batch([f[prefix + "input_ids"] for f in features], [f[prefix + "token_type_ids"] for f in features],
                     pad_id)


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's first parameter."""
    return next(model.parameters()).device


class Task(ABC):
    """One fine-tuning task: features, batches, loss, predictions and metrics."""

    name: ClassVar[str]
    metrics: tuple[str, ...]  # what evaluate() reports; the first selects the best checkpoint by default
    other_metrics: ClassVar[tuple[str, ...]] = ()  # what evaluate() may report instead (e.g. without scores)
    group_by_length: ClassVar[bool] = True  # batches of similar length (less padding); False: uniformly random

    def __init__(self, tokenizer: Tokenizer, max_length: int, batch_size: int = 32, precision: str = "fp32") -> None:
        self.tokenizer, self.max_length = tokenizer, max_length
        self.batch_size, self.precision = batch_size, precision
        self.step: int | None = None  # the training step under way (1-based; set by the loop's batches, a resumed
        # run's too), for a loss that changes over training; None outside training

    def engine(self, model: nn.Module) -> Engine:
        """The inference engine for predictions with `model`: this task's window, batch size and precision."""
        return Engine(self.tokenizer, self.max_length, self.batch_size, model_device(model), self.precision)

    @abstractmethod
    def features(self, examples: list) -> list[dict[str, Any]]:
        """Training features (token ids and targets, unpadded); one example may give several."""

    def feature_length(self, feature: dict[str, Any]) -> int:
        """Tokens in a feature, for grouping batches by length."""
        return len(feature["input_ids"])

    @abstractmethod
    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """A padded batch of tensors."""

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, LossTerm]:
        """The batch's loss terms, each summed in its unit (the loop divides by the step's count of that unit): by
        default the model's own, given the batch's labels."""
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels=batch["labels"])
        return out.sums

    @abstractmethod
    def predict(self, model: nn.Module, examples: list) -> list:
        """One prediction per example, in order."""

    @abstractmethod
    def score(self, examples: list, predictions: list) -> dict[str, float]:
        """Metrics of predictions against the examples' gold labels."""

    def validate(self, examples: list) -> None:
        """Raise InputError for an example this task cannot score (checked before training starts)."""

    def check_config(self, config: EncoderConfig) -> None:
        """Raise ConfigError where the model's config.json does not fit the task's options (before it loads)."""

    def evaluate(self, model: nn.Module, examples: list) -> dict[str, float]:
        """Predict, then score; the model is left in the mode it was in."""
        with eval_mode(model):
            return self.score(examples, self.predict(model, examples))

    def assess(self, model: nn.Module, examples: list) -> tuple[list | None, dict[str, float]]:
        """What `evaluate` reports: the predictions (None where the metrics are not per example) and the metrics."""
        predictions = self.predict(model, examples)
        return predictions, self.score(examples, predictions)

    def prediction_file(self, examples: list, predictions: list) -> str:
        """The text of evaluate's --predictions file: one JSON value per line (a label, score or tag list)."""
        return "".join(json.dumps(p) + "\n" for p in predictions)

    def notes(self) -> dict[str, str]:
        """What a result adds to its metrics so that they read right (which class a binary F1 is of)."""
        return {}

    def info(self) -> dict[str, Any]:
        """What task.json records so `encoderlab evaluate` can read data as the model was trained."""
        return {"task": self.name, "max_length": self.max_length}
