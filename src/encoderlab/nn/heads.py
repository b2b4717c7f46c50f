"""Heads on the encoder: [CLS] pooler, masked LM, next-sentence (sentence-order), ELECTRA's replaced-token detection,
and each family's sequence-classification head as the config's head layout (classifier_*) lays it out; the weight
maps' task-head rows name its tensors:

| family          | input                 | layers (transformers' names)                          | source in transformers        |
|-----------------|-----------------------|-------------------------------------------------------|-------------------------------|
| BERT, ALBERT    | pooled [CLS] (tanh)   | dropout, classifier                                   | BertForSequenceClassification |
| RoBERTa         | first token           | dropout, classifier.dense, tanh, dropout, classifier.out_proj | RobertaClassificationHead |
| ELECTRA         | first token           | the same with gelu                                    | ElectraClassificationHead     |
| DistilBERT      | first token           | pre_classifier, ReLU, dropout, classifier             | DistilBertForSequenceClassification |
| DeBERTa-v2      | first token           | dropout, pooler.dense, activation, dropout, classifier | ContextPooler                |
| ModernBERT      | first token or mean   | head.dense, activation, head.norm, dropout, classifier | ModernBertPredictionHead |

ModernBERT's token-classification and QA heads pass each token through the same dense, activation and norm
(`Transform`, config.task_transform) before their output layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.block import layer_norm
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.mlp import ACTIVATIONS
from encoderlab.nn.pooling import pool

HEAD_ACTIVATIONS = {"tanh": torch.tanh, **ACTIVATIONS}


def init_linear(layer: nn.Module, std: float) -> nn.Module:
    """BERT's init for a fresh head layer: N(0, std) weights, zero bias."""
    if isinstance(layer, nn.Linear):
        nn.init.normal_(layer.weight, std=std)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    return layer


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): (B, T, H) -> (B, H) (BERT paper, section 3)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class MLMHead(nn.Module):
    """Dense to the embedding width, activation, LayerNorm, then the decoder: the word embeddings the caller passes
    (not a parameter here, so the tie cannot drift and checkpoints hold the matrix once), plus a bias."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.embedding_width, bias=config.bias)
        self.act = ACTIVATIONS[config.head_activation or config.hidden_act]
        self.norm = layer_norm(config, config.embedding_width)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H) -> logits (..., V); given rows (R,), vocabulary ids, and word_embeddings (R, E) their rows: the
        logits of those ids alone (..., R), the decoder's cost cut by as much."""
        bias = self.bias if rows is None else self.bias[rows]
        return F.linear(self.norm(self.act(self.transform(hidden))), word_embeddings, bias)


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


class Transform(nn.Module):
    """Dense, activation, LayerNorm: (..., H) -> (..., H) (ModernBertPredictionHead, before every task's output)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = init_linear(nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias),
                                 config.initializer_range)
        self.act = HEAD_ACTIVATIONS[config.head_activation or config.hidden_act]
        self.norm = layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class SequenceHead(nn.Module):
    """Encoder outputs -> logits (B, L): the pooled vector (B, H), or the first token (or the mean, by
    config.classifier_pooling) of (B, T, H) through a dense layer (config.classifier_dense), then dropout and the
    output layer. `out` replaces the output layer with any (B, H) -> (B, L) module."""

    def __init__(self, config: EncoderConfig, num_labels: int | None = None, out: nn.Module | None = None) -> None:
        super().__init__()
        if out is None and num_labels is None:
            raise ValueError("SequenceHead needs num_labels or an output module")
        H, std = config.hidden_size, config.initializer_range
        self.dropout_first, self.pooling = config.classifier_dropout_first, config.classifier_pooling
        self.dropout = Dropout(config.hidden_dropout)
        self.dense = init_linear(nn.Linear(H, H, bias=config.bias), std) if config.classifier_dense else None
        self.act = HEAD_ACTIVATIONS[config.classifier_activation or config.head_activation or config.hidden_act]
        self.norm = layer_norm(config) if config.classifier_norm else None
        self.out = out if out is not None else init_linear(nn.Linear(H, num_labels), std)

    def forward(self, hidden: torch.Tensor, pooled: torch.Tensor | None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, T, H), pooled (B, H) or None, attention_mask (B, T) or None -> logits (B, L)."""
        if self.dense is None:
            x = pooled  # (B, H), tanh(W h_[CLS] + b) of the backbone's pooler
        else:
            x = hidden[:, 0] if self.pooling == "cls" else pool(hidden, attention_mask, "mean")  # (B, H)
            x = self.act(self.dense(self.dropout(x) if self.dropout_first else x))
            x = x if self.norm is None else self.norm(x)
        return self.out(self.dropout(x))
