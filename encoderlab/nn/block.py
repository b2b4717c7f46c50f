"""One post-LayerNorm transformer block, as in BERT: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

from __future__ import annotations

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.attention import SelfAttention
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.mlp import FeedForward


class Block(nn.Module):
    """(B, T, H) -> (B, T, H), and the attention probabilities when asked for."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config.hidden_size, config.num_heads, config.attention_dropout)
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attn(x, mask, return_probs)
        x = self.attn_norm(x + self.dropout(attended))
        x = self.mlp_norm(x + self.dropout(self.mlp(x)))
        return x, probs
