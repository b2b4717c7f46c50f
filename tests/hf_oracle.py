"""Tiny random Hugging Face models for parity tests (transformers is a test oracle only)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig

TOL = {"atol": 1e-5, "rtol": 1e-5}
VOCAB = 99


def tiny_hf_config(**changes) -> BertConfig:
    """Two layers, hidden 32, four heads; the feed-forward width is odd so it cannot be confused with 4H."""
    fields = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 37, "max_position_embeddings": 64, "layer_norm_eps": 1e-12}
    return BertConfig(**(fields | changes))


def randomize(model: nn.Module, seed: int = 0) -> None:
    """Redraw every parameter: N(0, 1/fan_in) for matrices, N(0, 0.1) for biases, 1 + N(0, 0.1) for LayerNorm scales.

    Unlike the BERT init (zero biases, unit LayerNorm) nothing is left at a value a mis-mapped tensor shares.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                std = param.shape[-1] ** -0.5 if param.dim() > 1 else 0.1  # keeps activations near unit scale
                noise = std * torch.randn(param.shape, generator=gen)
                param.copy_(noise + 1.0 if isinstance(module, nn.LayerNorm) and name == "weight" else noise)
