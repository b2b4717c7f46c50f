"""Heads on top of the encoder: the [CLS] pooler, masked-LM prediction, next-sentence (or sentence-order)
prediction, and ELECTRA's replaced-token detection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.mlp import ACTIVATIONS


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): (B, T, H) -> (B, H) (BERT paper, section 3)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class MLMHead(nn.Module):
    """Transform (dense to the embedding width, activation, LayerNorm), then a decoder tied to the word
    embeddings, plus a bias.

    The decoder weight is not a parameter of this module: the caller passes the embedding matrix,
    so the tie can never drift and checkpoints hold the matrix once.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.embedding_width)
        self.act = ACTIVATIONS[config.head_activation or config.hidden_act]
        self.norm = nn.LayerNorm(config.embedding_width, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """(..., H) -> logits (..., V)."""
        return F.linear(self.norm(self.act(self.transform(hidden))), word_embeddings, self.bias)


class RTDHead(nn.Module):
    """ELECTRA's discriminator: each token (..., H) -> a logit (...) that it was replaced (Clark et al. 2020)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.prediction(self.act(self.dense(hidden))).squeeze(-1)


class NSPHead(nn.Module):
    """Next-sentence prediction: pooled (B, H) -> logits (B, 2); class 0 means "B follows A"."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)
