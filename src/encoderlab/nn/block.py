"""One transformer block. Post-LayerNorm, as in BERT: x = LN(x + Attn(x)); x = LN(x + FFN(x)). Pre-LayerNorm where the
config asks for `pre_norm` (ModernBERT): x = x + Attn(LN(x)); x = x + FFN(LN(x)). The attention is BERT's (with
rotary positions and a local window where the encoder passes them), or DeBERTa's disentangled attention where the
config asks for `relative_attention`."""

from __future__ import annotations

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.attention import SelfAttention
from encoderlab.nn.disentangled import DisentangledAttention, RelativePositions
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.mlp import FeedForward
from encoderlab.nn.packing import Packing


def layer_norm(config: EncoderConfig, width: int | None = None) -> nn.LayerNorm:
    """A LayerNorm of the config's epsilon and `bias` switch, over width (default hidden_size)."""
    return nn.LayerNorm(width or config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)


class Block(nn.Module):
    """(B, T, H) -> (B, T, H), and the attention probabilities when asked for."""

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        """index: the layer's place in the stack, from 0."""
        super().__init__()
        if config.relative_attention:
            self.attn = DisentangledAttention(config.hidden_size, config.num_heads, config.attention_dropout,
                                              config.hidden_dropout)
        else:
            self.attn = SelfAttention(config.hidden_size, config.num_heads, config.attention_dropout, config.bias)
        self.pre_norm = config.pre_norm
        # Pre-LN's first block reads the embeddings, normalized already: ModernBERT has no norm there.
        self.attn_norm = nn.Identity() if config.pre_norm and index == 0 else layer_norm(config)
        self.mlp = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act, config.gated_ffn,
                               config.bias)
        self.mlp_norm = layer_norm(config)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, return_probs: bool = False,
                positions: RelativePositions | tuple[torch.Tensor, torch.Tensor] | None = None,
                packing: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H), or the packed real tokens (N, H) with their `packing`; positions: DeBERTa's relative
        positions, or the rotary cos and sin tables, or None."""
        if self.pre_norm:
            attended, probs = self.attn(self.attn_norm(x), mask, return_probs, positions, packing)
            x = x + self.dropout(attended)
            return x + self.dropout(self.mlp(self.mlp_norm(x))), probs
        attended, probs = self.attn(x, mask, return_probs, positions, packing)
        x = self.attn_norm(x + self.dropout(attended))
        x = self.mlp_norm(x + self.dropout(self.mlp(x)))
        return x, probs
