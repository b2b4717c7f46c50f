"""AdamW with BERT's decay rule; the linear warmup / linear decay schedule and warmup-stable-decay; OptimOptions, the
one options type for both, shared by pretraining recipes and fine-tuning."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from encoderlab.errors import ConfigError

SCHEDULES = ("linear", "wsd", "wsd-sqrt")


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


def wsd_schedule(warmup_steps: int, total_steps: int, decay_fraction: float, sqrt: bool = False):
    """Multiplier of the peak lr at a step, warmup-stable-decay (trapezoidal): 0 -> 1 over warmup, 1 until the last
    decay_fraction of total_steps, then down to 0 at total_steps, linearly or as 1 - sqrt (Hägele et al. 2024,
    arXiv:2405.18392, sections 3-4: the cooldown matches cosine, and 1 - sqrt does best; ModernBERT, Warner et
    al. 2024, arXiv:2412.13663, section 2.2.3, trains with it and a 1 - sqrt decay)."""
    decay_start = max(warmup_steps, total_steps - round(decay_fraction * total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        done = min(1.0, max(0.0, (step - decay_start) / max(1, total_steps - decay_start)))  # of the decay
        return 1 - math.sqrt(done) if sqrt else 1 - done

    return factor


def lr_schedule(kind: str, warmup_steps: int, total_steps: int, decay_fraction: float) -> Callable[[int], float]:
    """The multiplier function of schedule `kind` (one of SCHEDULES)."""
    if kind == "linear":
        return linear_schedule(warmup_steps, total_steps)
    if kind in ("wsd", "wsd-sqrt"):
        return wsd_schedule(warmup_steps, total_steps, decay_fraction, sqrt=kind == "wsd-sqrt")
    raise ConfigError(f"schedule must be one of {SCHEDULES}, got {kind!r}")


@dataclass
class OptimOptions:
    """The optimizer and its schedule, as a user sets them: the same type for pretraining recipes and fine-tuning."""

    lr: float = 5e-4
    """Peak learning rate."""
    warmup_steps: int = 100
    """Linear warmup from 0 to lr, then the schedule's decay to 0 at max_steps."""
    schedule: str = "linear"
    """linear: decay from the end of warmup (BERT paper, appendix A.2); wsd: warmup-stable-decay, the peak held
    until the last decay_fraction of max_steps, then linear to 0; wsd-sqrt: the same with a 1 - sqrt decay
    (ModernBERT, section 2.2.3; Hägele et al. 2024, arXiv:2405.18392)."""
    decay_fraction: float = 0.1
    """wsd, wsd-sqrt: the fraction of max_steps spent decaying (Hägele et al.: 10-20% matches cosine)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay; never applied to biases or LayerNorm weights."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.98
    """AdamW second-moment decay (0.98 as in RoBERTa, sec. 3.1, for stability with large batches)."""
    eps: float = 1e-6
    """AdamW epsilon (1e-6 as in BERT and RoBERTa)."""

    def validate(self) -> None:
        """Raise ConfigError naming the first bad option."""
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")

    def optimizer(self, model: nn.Module) -> torch.optim.AdamW:
        """AdamW over the model's parameter groups (make_optimizer)."""
        return make_optimizer(model, self.lr, self.weight_decay, (self.beta1, self.beta2), self.eps)

    def scheduler(self, optimizer: torch.optim.Optimizer, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        """The schedule's multiplier of the peak lr over max_steps."""
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(self.schedule, self.warmup_steps, max_steps,
                                                                         self.decay_fraction))
