"""One post-LayerNorm transformer block, as in BERT: x = LN(x + Attn(x)); x = LN(x + FFN(x)); the attention is
BERT's, or DeBERTa's disentangled attention where the config asks for `relative_attention`."""

from __future__ import annotations

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.attention import SelfAttention
from encoderlab.nn.disentangled import DisentangledAttention, RelativePositions
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.mlp import FeedForward


class Block(nn.Module):
    """(B, T, H) -> (B, T, H), and the attention probabilities when asked for."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if config.relative_attention:
            self.attn = DisentangledAttention(config.hidden_size, config.num_heads, config.attention_dropout,
                                              config.hidden_dropout)
        else:
            self.attn = SelfAttention(config.hidden_size, config.num_heads, config.attention_dropout)
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, return_probs: bool = False,
                positions: RelativePositions | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """positions: the relative positions of a disentangled attention (DeBERTa), else None."""
        attended, probs = self.attn(x, mask, return_probs, *([] if positions is None else [positions]))
        x = self.attn_norm(x + self.dropout(attended))
        x = self.mlp_norm(x + self.dropout(self.mlp(x)))
        return x, probs
