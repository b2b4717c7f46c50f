"""The one fine-tuning loop, shared by every task.

The standard recipe (Devlin et al. 2019, section 4 and appendix A.3; the defaults of transformers' Trainer):
AdamW (betas 0.9/0.999, eps 1e-8) with weight decay 0.01 except on biases and LayerNorm weights, the peak
learning rate reached linearly over the first 10% of steps and then decayed linearly to 0, gradients clipped
to norm 1. After each epoch (or every `eval_every` steps) the model is scored on the eval set and saved
when its metric is the best so far, so the folder always holds the best checkpoint.
"""

from __future__ import annotations

import logging
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from encoderlab.errors import ConfigError
from encoderlab.tasks.base import Task, autocast, length_grouped_batches, model_device, to_device
from encoderlab.train.optim import linear_schedule, make_optimizer

log = logging.getLogger(__name__)
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainOptions:
    """Hyperparameters of one fine-tuning run."""

    lr: float = 2e-5
    """Peak learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay on matrices and embeddings."""
    warmup_ratio: float = 0.1
    """Fraction of all steps spent warming the learning rate up from 0."""
    epochs: float = 3.0
    """Passes over the training features; a fraction stops part way through the last one."""
    batch_size: int = 32
    """Features per optimizer step."""
    seed: int = 42
    """Seeds the head's init, dropout and the data order."""
    precision: str = "fp32"
    """fp32, or bf16 autocast (weights and optimizer stay fp32)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 turns it off)."""
    eval_every: int = 0
    """Evaluate every N steps as well as at the end of each epoch (0: only per epoch)."""
    progress: bool = True
    """Show a tqdm bar on stderr."""

    def validate(self) -> None:
        """Raise ConfigError naming the first option out of range."""
        checks = [("lr", self.lr > 0), ("weight_decay", self.weight_decay >= 0),
                  ("warmup_ratio", 0 <= self.warmup_ratio < 1), ("epochs", self.epochs > 0),
                  ("batch_size", self.batch_size > 0), ("max_grad_norm", self.max_grad_norm >= 0),
                  ("eval_every", self.eval_every >= 0)]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is out of range")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")


@dataclass
class RunResult:
    """What one run measured: per-evaluation history and the best evaluation."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    metric: str | None = None  # the eval metric that chose `best`
    seconds: float = 0.0
    steps: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch RNGs."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(model: nn.Module, task: Task, features: list[dict[str, Any]], options: TrainOptions,
          evaluate: Callable[[nn.Module], dict[str, float]] | None = None, metric: str | None = None,
          save: Callable[[nn.Module], None] | None = None,
          on_eval: Callable[[RunResult], None] | None = None) -> RunResult:
    """Fine-tune `model` on `features`; evaluate and keep the best by `metric` (higher is better).

    Without `evaluate`, the model is saved once, at the end.
    """
    options.validate()
    if not features:
        raise ConfigError("no training features")
    generator = torch.Generator().manual_seed(options.seed)
    device = model_device(model)
    steps_per_epoch = math.ceil(len(features) / options.batch_size)
    total = max(1, math.ceil(options.epochs * steps_per_epoch))
    optimizer = make_optimizer(model, options.lr, options.weight_decay, (0.9, 0.999), 1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(int(options.warmup_ratio * total), total))
    lengths = [task.feature_length(f) for f in features]
    result, started = RunResult(), time.time()
    metric = metric or task.default_metric
    bar = tqdm(total=total, desc=f"finetune {task.name}", unit="step", disable=not options.progress,
               file=sys.stderr, dynamic_ncols=True)
    model.train()
    losses: list[float] = []
    while result.steps < total:
        group = 50 if task.group_by_length else 1
        for indices in length_grouped_batches(lengths, options.batch_size, generator, group):
            batch = to_device(task.collate([features[i] for i in indices]), device)
            losses.append(_step(model, task, batch, optimizer, scheduler, options))
            result.steps += 1
            bar.update()
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
            end_of_epoch = result.steps % steps_per_epoch == 0 or result.steps == total
            if end_of_epoch or (options.eval_every and result.steps % options.eval_every == 0):
                _checkpoint(model, result, result.steps / steps_per_epoch, losses, evaluate, metric, save, on_eval, bar)
                losses = []
            if result.steps >= total:
                break
    bar.close()
    if evaluate is None and save is not None:
        save(model)
    result.seconds = time.time() - started
    return result


def _step(model: nn.Module, task: Task, batch: dict[str, Any], optimizer: torch.optim.Optimizer,
          scheduler: torch.optim.lr_scheduler.LRScheduler, options: TrainOptions) -> float:
    """One optimizer step; returns the batch loss."""
    with autocast(options.precision, model_device(model)):
        loss = task.loss(model, batch)
    loss.backward()
    if options.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), options.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _checkpoint(model: nn.Module, result: RunResult, epoch: float, losses: list[float],
                evaluate: Callable | None, metric: str, save: Callable | None, on_eval: Callable | None,
                bar: tqdm) -> None:
    """Record the training loss since the last record, evaluate, and save when the metric is the best yet."""
    entry: dict[str, Any] = {"epoch": round(epoch, 3), "step": result.steps,
                             "train_loss": float(np.mean(losses)) if losses else None}
    if evaluate is not None:
        metrics = evaluate(model)
        if metric not in metrics:  # e.g. an embedding eval set without scores reports retrieval metrics
            metric = next(iter(metrics))
        result.metric = metric
        entry.update({f"eval_{k}": v for k, v in metrics.items()})
        if result.best is None or metrics[metric] > result.best[f"eval_{metric}"]:
            result.best = dict(entry)
            if save is not None:
                save(model)
    result.history.append(entry)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in entry.items() if k.startswith("eval_") and isinstance(v, float))
    line = f"epoch {entry['epoch']:g} step {entry['step']}: train loss {entry['train_loss']:.4f}"
    line += f", {shown}" if shown else ""
    if bar.disable:
        log.info(line)
    else:
        bar.write(line, file=sys.stderr)
    if on_eval is not None:
        on_eval(result)
