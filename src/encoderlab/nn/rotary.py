"""Rotary position embeddings (RoPE, Su et al. 2021, arXiv:2104.09864): each query and key is rotated by an angle
proportional to its position, so their dot product depends on the distance alone. Laid out as in GPT-NeoX and
transformers: the head's two halves are the pairs' two coordinates (rotate_half), not interleaved."""

from __future__ import annotations

import torch


def rotary_tables(length: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, hd) of position t times the frequency theta^(-2i/hd) (eq. 15), in float32."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inverse  # (T, hd / 2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hd)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Queries or keys (B, nh, T, hd) rotated by the tables (T, hd), computed in float32 (eq. 34)."""
    first, second = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat([-second, first], dim=-1) * sin).to(x.dtype)
