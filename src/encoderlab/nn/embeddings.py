"""Token + position + segment embeddings, then LayerNorm and dropout (BERT paper, fig. 2). The tables have width
`config.embedding_width`: a factorized model (ALBERT, ELECTRA-small) projects them up in the encoder, so that a
generator and a discriminator can share this module (ELECTRA)."""

from __future__ import annotations

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.dropout import Dropout


class Embeddings(nn.Module):
    """Map token ids (B, T) to input vectors (B, T, E)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        width = config.embedding_width
        self.word = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, width) if config.absolute_positions else None
        self.segment = nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.bias)
        self.dropout = Dropout(config.hidden_dropout)
        self.max_positions = config.max_position_embeddings
        self.pad_id = config.pad_token_id if config.positions_after_pad else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.word(input_ids)  # (B, T, E)
        if self.position is not None:
            x = x + self.positions(input_ids)
        if self.segment is not None:
            if token_type_ids is None or self.segment.num_embeddings == 1:  # one segment: every token is in it
                x = x + self.segment.weight[0]
            else:
                x = x + self.segment(token_type_ids)
        return self.dropout(self.norm(x))

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Position vectors (T, E), or (B, T, E) with RoBERTa's positions that skip padding."""
        T = input_ids.shape[1]
        first = 0 if self.pad_id is None else self.pad_id + 1
        if T + first > self.max_positions:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.max_positions - first} "
                             f"positions (max_position_embeddings {self.max_positions}); truncate it")
        if self.pad_id is None:
            return self.position.weight[:T]
        # fairseq's make_positions: real tokens count up from pad_id + 1, padding sits at pad_id.
        real = input_ids.ne(self.pad_id).long()  # an integer cumsum: onnxruntime has no bool CumSum
        return self.position(torch.cumsum(real, dim=1) * real + self.pad_id)
