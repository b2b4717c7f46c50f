"""Sentence pooling: token vectors -> one vector per text, the [CLS] vector or the mean over real tokens (what
sentence-transformers does for all-MiniLM-L6-v2: its 1_Pooling/config.json has pooling_mode_mean_tokens)."""

from __future__ import annotations

import torch

from encoderlab.errors import InputError

POOLINGS = ("mean", "cls")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """(B, T, H) token vectors -> (B, H) sentence vectors; no mask means no padding."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        if attention_mask is None:
            return hidden.mean(1)
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    raise InputError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
