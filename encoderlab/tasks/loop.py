"""The one fine-tuning loop, shared by every task.

The standard recipe (Devlin et al. 2019, section 4 and appendix A.3; the defaults of transformers' Trainer):
AdamW (betas 0.9/0.999, eps 1e-8) with weight decay 0.01 except on biases and LayerNorm weights, the peak
learning rate reached linearly over the first 10% of steps and then decayed linearly to 0, gradients clipped
to norm 1. After each epoch (or every `eval_every` steps) the model is scored on the eval set and saved
when its metric is the best so far, so the folder always holds the best checkpoint.

Given a run folder, the loop also keeps a resumable training state (encoderlab.train.state, as pretraining
does): weights, optimizer, schedule, RNGs and the history so far. A resumed run replays the data orders of
the steps it skips, so it sees the same batches, and ends where an uninterrupted one does.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from encoderlab.errors import ConfigError
from encoderlab.tasks.base import Task, autocast, length_grouped_batches, model_device, to_device
from encoderlab.tasks.models import load_task_model, save_task_model
from encoderlab.train.optim import linear_schedule, make_optimizer
from encoderlab.train.state import (DeferredInterrupt, clear_checkpoints, latest_checkpoint, load_trainer_state,
                                    remove_leftovers, rng_state, save_checkpoint, set_rng_state)

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
    save_every: int = 0
    """Save the resumable training state every N steps as well as after each epoch (0: only per epoch)."""
    progress: bool = True
    """Show a tqdm bar on stderr."""

    def validate(self) -> None:
        """Raise ConfigError naming the first option out of range."""
        checks = [("lr", self.lr > 0), ("weight_decay", self.weight_decay >= 0),
                  ("warmup_ratio", 0 <= self.warmup_ratio < 1), ("epochs", self.epochs > 0),
                  ("batch_size", self.batch_size > 0), ("max_grad_norm", self.max_grad_norm >= 0),
                  ("eval_every", self.eval_every >= 0), ("save_every", self.save_every >= 0)]
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
          on_eval: Callable[[RunResult], None] | None = None,
          run_dir: Path | None = None, resume: bool = False) -> RunResult:
    """Fine-tune `model` on `features`; evaluate and keep the best by `metric` (higher is better).

    Without `evaluate`, the model is saved once, at the end. With `run_dir`, a resumable training state is
    kept in run_dir/checkpoints (after each epoch, every options.save_every steps, and on Ctrl-C, which then
    raises KeyboardInterrupt); `resume` continues from it to the result an uninterrupted run gives.
    """
    options.validate()
    if not features:
        raise ConfigError("no training features")
    device = model_device(model)
    steps_per_epoch = math.ceil(len(features) / options.batch_size)
    total = max(1, math.ceil(options.epochs * steps_per_epoch))
    optimizer = make_optimizer(model, options.lr, options.weight_decay, (0.9, 0.999), 1e-8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(int(options.warmup_ratio * total), total))
    lengths = [task.feature_length(f) for f in features]
    metric = metric or task.default_metric
    result, losses = _open_run_dir(run_dir, resume, model, optimizer, scheduler) if run_dir else (RunResult(), [])
    started = time.time() - result.seconds
    bar = tqdm(total=total, initial=result.steps, desc=f"finetune {task.name}", unit="step",
               disable=not options.progress, file=sys.stderr, dynamic_ncols=True)
    model.train()
    with bar, DeferredInterrupt() as interrupt:
        for indices in _batches(task, lengths, options, result.steps, total):
            batch = to_device(task.collate([features[i] for i in indices]), device)
            losses.append(_step(model, task, batch, optimizer, scheduler, options))
            result.steps += 1
            bar.update()
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
            end_of_epoch = result.steps % steps_per_epoch == 0 or result.steps == total
            if end_of_epoch or (options.eval_every and result.steps % options.eval_every == 0):
                _checkpoint(model, result, result.steps / steps_per_epoch, losses, evaluate, metric, save, on_eval, bar)
                losses = []
            stopping = interrupt.requested and result.steps < total
            if run_dir is not None and (end_of_epoch or stopping or
                                        (options.save_every and result.steps % options.save_every == 0)):
                _save_state(run_dir, model, optimizer, scheduler, result, losses, time.time() - started)
            if stopping:
                log.warning("interrupted at step %d%s", result.steps, "" if run_dir is None else
                            f": training state saved in {Path(run_dir) / 'checkpoints'}, continue with --resume")
                raise interrupt.stop()
    if evaluate is None and save is not None:
        save(model)
    result.seconds = time.time() - started
    return result


def _batches(task: Task, lengths: list[int], options: TrainOptions, start: int, total: int) -> Iterator[list[int]]:
    """The batches of steps start .. total-1, each epoch in a new random order from one generator seeded once.

    A resumed run replays the orders of the steps before `start` (cheap: a permutation per epoch), so it sees
    the batches an uninterrupted run sees.
    """
    generator = torch.Generator().manual_seed(options.seed)
    group = 50 if task.group_by_length else 1
    step = 0
    while step < total:
        for indices in length_grouped_batches(lengths, options.batch_size, generator, group):
            if step >= total:
                return
            if step >= start:
                yield indices
            step += 1


def _save_state(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                result: RunResult, losses: list[float], seconds: float) -> None:
    """A resumable checkpoint: weights, optimizer, schedule, RNGs, and what the run has recorded so far."""
    progress = {"result": result.as_dict() | {"seconds": seconds}, "losses": losses}
    state = {"step": result.steps, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": rng_state(), "progress": json.dumps(progress)}  # JSON: plain data for weights_only loading
    save_checkpoint(run_dir, result.steps, lambda folder: save_task_model(model, folder), state, keep=1)


def _open_run_dir(run_dir: Path, resume: bool, model: nn.Module, optimizer: torch.optim.Optimizer,
                  scheduler: Any) -> tuple[RunResult, list[float]]:
    """Clear what a killed run left; on resume load the latest training state (if any) into model, optimizer,
    schedule and RNGs and return what the run had recorded, else discard an earlier run's training state."""
    remove_leftovers(run_dir)
    if not resume:
        clear_checkpoints(run_dir)  # it must not be resumed into this run
    folder = latest_checkpoint(Path(run_dir)) if resume else None
    if folder is None:  # a fresh run, or one killed before its first save
        return RunResult(), []
    model.load_state_dict(load_task_model(folder).state_dict())
    state = load_trainer_state(folder)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    progress = json.loads(state["progress"])
    return RunResult(**progress["result"]), progress["losses"]


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
