"""The one output type of a forward pass, from the bare encoder to every head, engines and the ONNX runner included;
given labels, each loss term as a LossTerm (its sum, count and unit); the units a term may be counted in, and the one
function that divides each term's sum by its unit's count over a whole training step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

IGNORE_INDEX = -100  # label value of positions that carry no loss (as in torch's cross_entropy)

Counts = dict[str, torch.Tensor]
"""A batch's (or a whole step's, all micro-batches and ranks) count of each unit, by the unit's name."""

UNITS = {
    "sequences": "rows of the batch: texts, pairs or triplets (of its first text column)",
    "tokens": "real (not padding) tokens, of every text column",
    "masked": "positions whose label is not IGNORE_INDEX: an MLM's masked tokens, a tagger's tagged words",
    "pairs": "sentence pairs with a next-sentence (sentence-order) label",
    "label_cells": "every cell of the labels: (row, class) pairs of a multi-label classifier's 0/1 targets",
    "groups": "the groups of a listwise loss, each a query with its candidates (rows of the batch's `groups` mask)",
}
"""The units a LossTerm may be counted in, each counted on a batch by batch_counts alone."""


class LossTerm(NamedTuple):
    """A loss term summed over its units, their count in this batch, and the unit's name (a key of UNITS): the
    training loop divides the sum by the unit's count over the whole step (step_means), so gradient accumulation and
    DDP equal one big batch; total / count is transformers' loss of the batch."""

    total: torch.Tensor  # ()
    count: torch.Tensor  # ()
    unit: str


def batch_counts(batch: Mapping[str, Any]) -> Counts:
    """This micro-batch's count of every unit of UNITS that its tensors define (the loop sums them over a step)."""
    inputs = [b for b in batch.values() if isinstance(b, Mapping)] or [batch]  # embed: one dict per text column
    mask = inputs[0]["attention_mask"]
    # torch.full, not torch.tensor: a copy from the host would wait for the GPU's queue every step
    counts = {"sequences": torch.full((), mask.shape[0], device=mask.device),
              "tokens": sum(b["attention_mask"].sum() for b in inputs)}
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor):
        counts["masked"] = (labels != IGNORE_INDEX).sum()
        counts["label_cells"] = torch.full((), labels.numel(), device=labels.device)
    pair_labels = batch.get("next_sentence_label")
    if isinstance(pair_labels, torch.Tensor):
        counts["pairs"] = (pair_labels != IGNORE_INDEX).sum()
    if "groups" in batch:
        counts["groups"] = torch.full((), batch["groups"].shape[0], device=batch["groups"].device)
    return counts


def step_means(terms: Mapping[str, LossTerm], counts: Mapping[str, torch.Tensor | float]) -> dict[str, torch.Tensor]:
    """Each term's sum divided by the whole step's count of its unit: the one place a loss is normalised."""
    return {name: term.total / counts[term.unit] for name, term in terms.items()}


@dataclass(eq=False)
class ModelOutput:
    """The head's logits, the encoder's states, and given labels each loss term as a Sum, computed when first read
    (fill-mask and a distillation teacher pass labels for the labelled positions' logits alone)."""

    logits: torch.Tensor | None = None
    """The head's output: (B, T, V) MLM, or (N, V) over the N labelled positions given labels; (B, L) classes;
    (B, T, L) tags; (B, T, 2) start and end; (B, T) replaced-token; None for the bare encoder and the embedder."""
    last_hidden_state: torch.Tensor | None = None  # (B, T, H)
    terms: dict[str, Callable[[], LossTerm]] = field(default_factory=dict, repr=False)
    pooled: torch.Tensor | None = None  # (B, H) from the [CLS] pooler, when the model has one
    hidden_states: list[torch.Tensor] | None = None  # num_layers + 1 of (B, T, H), if asked: embeddings first
    attentions: list[torch.Tensor] | None = None  # num_layers of (B, heads, T, T), if asked
    nsp_logits: torch.Tensor | None = None  # (B, 2), PreTrainingModel's next-sentence (sentence-order) head
    embedding: torch.Tensor | None = None  # (B, H) float32 sentence vectors, SentenceEmbedder
    targets: torch.Tensor | None = None  # (N,) the labels of a masked LM's N labelled positions, given labels

    # A plain field, not functools.cached_property: Python 3.11's takes a lock, which torch.compile cannot trace
    # (a graph break in every training step).
    _sums: dict[str, LossTerm] | None = field(default=None, repr=False, init=False)

    @property
    def sums(self) -> dict[str, LossTerm]:
        """Each loss term by name ("mlm", "nsp", ...) as a LossTerm, computed when first read; empty without
        labels."""
        if self._sums is None:
            self._sums = {name: term() for name, term in self.terms.items()}
        return self._sums

    @property
    def losses(self) -> dict[str, torch.Tensor]:
        """Each loss term's mean over this batch, its sum / count."""
        return {name: term.total / term.count for name, term in self.sums.items()}

    @property
    def loss(self) -> torch.Tensor | None:
        """The sum of the terms' means (transformers' loss), or None when no labels were given."""
        return sum(self.losses.values()) if self.sums else None

    @property
    def start_logits(self) -> torch.Tensor:
        """(B, T) answer-start logits of a SpanExtractor."""
        return self.logits[..., 0]

    @property
    def end_logits(self) -> torch.Tensor:
        """(B, T) answer-end logits of a SpanExtractor."""
        return self.logits[..., 1]
