"""AdamW with BERT's decay rule, and the linear warmup / linear decay schedule."""

from __future__ import annotations

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and embeddings decay; biases and LayerNorm weights do not (BERT's optimization.py)."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if isinstance(module, nn.LayerNorm) or name == "bias" or param.ndim < 2:
                no_decay.append(param)
            else:
                decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                   eps: float) -> torch.optim.AdamW:
    """AdamW over the model's parameter groups, with torch's fused kernel (CPU and CUDA): one pass per tensor."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, fused=True)


def linear_schedule(warmup_steps: int, total_steps: int):
    """Multiplier of the peak lr at a step: 0 -> 1 over warmup, then 1 -> 0 at total_steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor
