"""The sequence-classification head of each family, laid out as its FamilySpec.classifier_head says.

| family          | input                 | layers (transformers' names)                          | source in transformers        |
|-----------------|-----------------------|-------------------------------------------------------|-------------------------------|
| BERT, ALBERT    | pooled [CLS] (tanh)   | dropout, classifier                                   | BertForSequenceClassification |
| RoBERTa         | first token           | dropout, classifier.dense, tanh, dropout, classifier.out_proj | RobertaClassificationHead |
| ELECTRA         | first token           | the same with gelu                                    | ElectraClassificationHead     |
| DistilBERT      | first token           | pre_classifier, ReLU, dropout, classifier             | DistilBertForSequenceClassification |
| DeBERTa-v2      | first token           | dropout, pooler.dense, activation, dropout, classifier | ContextPooler                |

One module covers them all: an optional dense layer and activation on the first token, then the output layer.
"""

from __future__ import annotations

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.models import ClassifierHead
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.mlp import ACTIVATIONS

HEAD_ACTIVATIONS = {"tanh": torch.tanh, **ACTIVATIONS}


def init_linear(layer: nn.Module, std: float) -> nn.Module:
    """BERT's init for a fresh head layer: N(0, std) weights, zero bias."""
    if isinstance(layer, nn.Linear):
        nn.init.normal_(layer.weight, std=std)
        nn.init.zeros_(layer.bias)
    return layer


class SequenceHead(nn.Module):
    """Encoder outputs -> logits (B, L): the pooled vector (B, H), or the first token of (B, T, H) through a dense
    layer, then dropout and the output layer. `out` replaces the output layer with any (B, H) -> (B, L) module."""

    def __init__(self, layout: ClassifierHead, config: EncoderConfig, num_labels: int | None = None,
                 out: nn.Module | None = None) -> None:
        super().__init__()
        if out is None and num_labels is None:
            raise ValueError("SequenceHead needs num_labels or an output module")
        H, std = config.hidden_size, config.initializer_range
        self.layout = layout
        self.dropout = Dropout(config.hidden_dropout)
        self.dense = init_linear(nn.Linear(H, H), std) if layout.dense else None
        self.act = HEAD_ACTIVATIONS[layout.activation or config.hidden_act]
        self.out = out if out is not None else init_linear(nn.Linear(H, num_labels), std)

    def forward(self, hidden: torch.Tensor, pooled: torch.Tensor | None) -> torch.Tensor:
        """hidden (B, T, H), pooled (B, H) or None -> logits (B, L)."""
        if self.dense is None:
            x = pooled  # (B, H), tanh(W h_[CLS] + b) of the backbone's pooler
        else:
            x = hidden[:, 0]  # (B, H): [CLS] or <s>
            x = self.act(self.dense(self.dropout(x) if self.layout.dropout_first else x))
        return self.out(self.dropout(x))
