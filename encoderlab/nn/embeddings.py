"""Token + learned position + segment embeddings, followed by LayerNorm and dropout (BERT paper, fig. 2)."""

from __future__ import annotations

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.dropout import Dropout


class Embeddings(nn.Module):
    """Map token ids (B, T) to input vectors (B, T, H)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.segment = nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)
        self.max_positions = config.max_position_embeddings

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        if T > self.max_positions:
            raise ValueError(f"sequence of {T} tokens is longer than the model's "
                             f"max_position_embeddings ({self.max_positions}); truncate it")
        x = self.word(input_ids) + self.position.weight[:T]  # (B, T, H)
        if self.segment is not None:
            if token_type_ids is None:
                x = x + self.segment.weight[0]
            else:
                x = x + self.segment(token_type_ids)
        return self.dropout(self.norm(x))
