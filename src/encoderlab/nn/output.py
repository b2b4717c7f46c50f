"""The one output type of a forward pass, from the bare encoder to every head, engines and the ONNX runner included;
given labels, each loss term as a (sum, count) the training loop can divide by a whole step's counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

IGNORE_INDEX = -100  # label value of positions that carry no loss (as in torch's cross_entropy)

Sum = tuple[torch.Tensor, torch.Tensor]
"""A loss term summed over its units (labelled tokens, sequences), and their count: the training loop divides the
sums by a whole step's counts (gradient accumulation and DDP equal one big batch); sum / count is transformers' loss."""


@dataclass(eq=False)
class ModelOutput:
    """The head's logits, the encoder's states, and given labels each loss term as a Sum, computed when first read
    (fill-mask and a distillation teacher pass labels for the labelled positions' logits alone)."""

    logits: torch.Tensor | None = None
    """The head's output: (B, T, V) MLM, or (N, V) over the N labelled positions given labels; (B, L) classes;
    (B, T, L) tags; (B, T, 2) start and end; (B, T) replaced-token; None for the bare encoder and the embedder."""
    last_hidden_state: torch.Tensor | None = None  # (B, T, H)
    terms: dict[str, Callable[[], Sum]] = field(default_factory=dict, repr=False)
    pooled: torch.Tensor | None = None  # (B, H) from the [CLS] pooler, when the model has one
    hidden_states: list[torch.Tensor] | None = None  # num_layers + 1 of (B, T, H), if asked: embeddings first
    attentions: list[torch.Tensor] | None = None  # num_layers of (B, heads, T, T), if asked
    nsp_logits: torch.Tensor | None = None  # (B, 2), PreTrainingModel's next-sentence (sentence-order) head
    embedding: torch.Tensor | None = None  # (B, H) float32 sentence vectors, SentenceEmbedder
    targets: torch.Tensor | None = None  # (N,) the labels of a masked LM's N labelled positions, given labels

    # A plain field, not functools.cached_property: Python 3.11's takes a lock, which torch.compile cannot trace
    # (a graph break in every training step).
    _sums: dict[str, Sum] | None = field(default=None, repr=False, init=False)

    @property
    def sums(self) -> dict[str, Sum]:
        """Each loss term by name ("mlm", "nsp", ...) as (summed loss, count), computed when first read; empty
        without labels."""
        if self._sums is None:
            self._sums = {name: term() for name, term in self.terms.items()}
        return self._sums

    @property
    def losses(self) -> dict[str, torch.Tensor]:
        """Each loss term's mean, its sum / count."""
        return {name: total / count for name, (total, count) in self.sums.items()}

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
