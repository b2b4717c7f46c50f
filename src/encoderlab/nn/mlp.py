"""The position-wise feed-forward network of a transformer block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (Hendrycks & Gimpel 2016, eq. after 2), HF's `gelu_new`."""
    return F.gelu(x, approximate="tanh")


# Names as in Hugging Face config.json `hidden_act`; `gelu` is the exact erf form BERT uses.
ACTIVATIONS = {"gelu": F.gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "relu": F.relu, "silu": F.silu,
               "swish": F.silu}


class FeedForward(nn.Module):
    """Linear up-projection, activation, linear down-projection: (B, T, H) -> (B, T, H). Gated (GLU, Shazeer 2020):
    `up` also projects the gate, its second half, and the activation's output is multiplied by it."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str, gated: bool = False,
                 bias: bool = True) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size * (2 if gated else 1), bias=bias)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.gated = gated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            value, gate = self.up(x).chunk(2, dim=-1)  # (B, T, I) each
            return self.down(self.act(value) * gate)
        return self.down(self.act(self.up(x)))

