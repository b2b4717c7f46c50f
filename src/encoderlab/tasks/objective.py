"""Fine-tuning as an objective of the one training loop (encoderlab.train.loop).

The standard recipe (Devlin et al. 2019, section 4 and appendix A.3; transformers' Trainer defaults): AdamW (betas
0.9/0.999, eps 1e-8), weight decay 0.01 except on biases and LayerNorm weights, linear warmup over 10% of steps then
linear decay to 0, gradients clipped to norm 1. After each epoch (or every `eval_every` steps) the model is scored
on the eval set and saved when its metric is the best so far, so the folder always holds the best checkpoint.
A task's loss terms are sums over the micro-batch, each divided by the whole step's count of its unit (sequences;
tagged tokens for NER; (row, class) cells for multilabel), so micro-batches and ranks give the gradient of one batch.
The contrastive embedding losses (mnrl, cosent) compare the texts of one micro-batch: its loss is weighted by its
share of the step's pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from encoderlab.checkpoint import load_model
from encoderlab.errors import ConfigError
from encoderlab.nn.model import SentenceEmbedder
from encoderlab.nn.output import Counts, step_means
from encoderlab.objectives import Objective
from encoderlab.tasks.base import Task, length_grouped_batches, model_device
from encoderlab.train import distributed
from encoderlab.train.loop import DUMMY, PRECISIONS, Evaluation, LoopOptions, RunSetup, run_loop
from encoderlab.train.optim import OptimOptions

COLUMNS = ("step", "elapsed_s", "epoch", "loss", "train_loss", "lr", "grad_norm", "tokens_per_s")


@dataclass
class TrainOptions:
    """Hyperparameters of one fine-tuning run, under the names of its CLI flags; loop() and optim() hand the loop the
    options types pretraining hands it."""

    lr: float = 2e-5
    """Peak learning rate."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay on matrices and embeddings."""
    warmup_ratio: float = 0.1
    """Fraction of all steps spent warming the learning rate up from 0."""
    epochs: float = 3.0
    """Passes over the training features; a fraction stops part way through the last one."""
    batch_size: int = 32
    """Features per optimizer step, over all ranks and micro-batches."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (per rank): the same step in less memory."""
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
        positive, at_least_0 = "a positive number", "0 or more"
        checks = [("lr", self.lr > 0, positive), ("weight_decay", self.weight_decay >= 0, at_least_0),
                  ("warmup_ratio", 0 <= self.warmup_ratio < 1, "at least 0 and below 1"),
                  ("epochs", self.epochs > 0, positive), ("batch_size", self.batch_size > 0, positive),
                  ("grad_accum", self.grad_accum > 0, positive), ("max_grad_norm", self.max_grad_norm >= 0, at_least_0),
                  ("eval_every", self.eval_every >= 0, at_least_0), ("save_every", self.save_every >= 0, at_least_0)]
        for name, ok, expected in checks:  # the wording of the command line's own checks (cli.options.check_counts)
            if not ok:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)!r}: expected {expected}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")

    def loop(self, max_steps: int) -> LoopOptions:
        """The loop's options: max_grad_norm is its clip_norm; a metrics row every step, one step checkpoint kept."""
        return LoopOptions(max_steps=max_steps, grad_accum=self.grad_accum, precision=self.precision,
                           clip_norm=self.max_grad_norm, log_every=1, eval_every=self.eval_every,
                           save_every=self.save_every, keep_checkpoints=1)

    def optim(self, max_steps: int) -> OptimOptions:
        """AdamW as transformers' Trainer sets it (betas 0.9/0.999, eps 1e-8); warmup_ratio of max_steps, linear."""
        return OptimOptions(lr=self.lr, warmup_steps=int(self.warmup_ratio * max_steps), schedule="linear",
                            weight_decay=self.weight_decay, beta1=0.9, beta2=0.999, eps=1e-8)


@dataclass
class RunResult:
    """What one run measured: per-evaluation history and the best evaluation."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    metric: str | None = None  # the eval metric that chose `best`
    seconds: float = 0.0
    steps: int = 0


class TaskObjective(Objective):
    """A task model trained on its task's loss terms, each summed over the micro-batch and divided by the step's
    count of its unit; the logged sums are by unit ("loss/masked")."""

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model, self.task = model, task
        self.unused_parameters = isinstance(model, SentenceEmbedder)  # keeps its checkpoint's pooler, never runs it

    def forward(self, batch: dict[str, Any], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        terms = self.task.loss(self.model, batch)
        by_unit: dict[str, torch.Tensor] = {}  # "loss/UNIT": not a count's name, which the loop keeps beside
        for term in terms.values():
            by_unit[f"loss/{term.unit}"] = by_unit.get(f"loss/{term.unit}", 0) + term.total.detach()
        return sum(step_means(terms, counts).values()), by_unit

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        return {"loss": sum(total / counts[key.removeprefix("loss/")] for key, total in sums.items())}

    def load(self, folder: Path) -> None:  # load_model: a BiLSTM baseline has no family weight map
        self.model.load_state_dict(load_model(folder).state_dict())


class FeatureBatches:
    """The loop's StepData: each epoch the features in a new order of batches (of similar length unless the task says
    otherwise) from one generator seeded once, a step's batch split into grad_accum pieces per rank. A resumed run
    replays the orders of the epochs before its step (cheap), so it sees the batches an uninterrupted run sees."""

    def __init__(self, task: Task, features: list[dict[str, Any]], batch_size: int, seed: int) -> None:
        self.task, self.features, self.batch_size, self.seed = task, features, batch_size, seed
        self.lengths = [task.feature_length(f) for f in features]
        self.steps_per_epoch = math.ceil(len(features) / batch_size)
        self.step, self._epoch, self._order = 0, -1, []
        self.generator = torch.Generator().manual_seed(seed)

    def batch(self, step: int) -> list[int]:
        """The feature indices of a step's whole batch."""
        epoch = step // self.steps_per_epoch
        if epoch < self._epoch:  # only on a step back: start the epochs over
            self._epoch, self.generator = -1, torch.Generator().manual_seed(self.seed)
        while self._epoch < epoch:
            self._order = length_grouped_batches(self.lengths, self.batch_size, self.generator,
                                                 50 if self.task.group_by_length else 1)
            self._epoch += 1
        return self._order[step % self.steps_per_epoch]

    def next_step(self, rank: int, world_size: int, grad_accum: int) -> list[dict[str, Any]]:
        indices = self.batch(self.step)
        self.step += 1
        self.task.step = self.step  # a warm-up inside the loss (splade's FLOPS) follows the run's steps, resumed or not
        pieces = world_size * grad_accum  # as even as can be: a short last batch still reaches every rank
        bounds = [len(indices) * i // pieces for i in range(pieces + 1)]
        mine = [indices[bounds[i]:bounds[i + 1]] for i in range(rank * grad_accum, (rank + 1) * grad_accum)]
        out = [self.task.collate([self.features[i] for i in piece]) for piece in mine if piece]
        return out or [self.task.collate([self.features[indices[0]]]) | {DUMMY: True}]

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def train(model: nn.Module, task: Task, features: list[dict[str, Any]], options: TrainOptions,
          evaluate: Callable[[nn.Module], dict[str, float]] | None = None, metric: str | None = None,
          save: Callable[[nn.Module], None] | None = None, on_eval: Callable[[RunResult], None] | None = None,
          run_dir: Path | None = None, resume: bool = False) -> RunResult:
    """Fine-tune `model` on `features` by the one loop (run_loop: checkpoints in `run_dir`, `resume`, DDP); evaluate
    and keep the best by `metric` (higher is better). Without `evaluate`, the model is saved once, at the end."""
    options.validate()
    if not features:
        raise ConfigError("no training features")
    device = model_device(model)
    dist = distributed.setup(device.type) if distributed.world_size() > 1 else distributed.Dist(device=device)
    data = FeatureBatches(task, features, options.batch_size, options.seed)
    total = max(1, math.ceil(options.epochs * data.steps_per_epoch))
    optim = options.optim(total)
    optimizer = optim.optimizer(model)
    evaluation = _evaluation(model, task, evaluate, metric, save, on_eval)
    setup = RunSetup(steps_per_epoch=data.steps_per_epoch, discard_old=True, progress=options.progress,
                     name=f"finetune {task.name}", visuals=False,
                     columns=COLUMNS + tuple(f"eval_{m}" for m in task.metrics + task.other_metrics))
    ended = run_loop(TaskObjective(model, task), data, optimizer, optim.scheduler(optimizer, total),
                     options.loop(total), run_dir, dist, resume, evaluation=evaluation, setup=setup)
    if evaluate is None and save is not None and dist.is_main:
        save(model)
    return RunResult(evaluation.history, evaluation.best, evaluation.metric if evaluate else None, ended.seconds,
                     ended.step)


def _evaluation(model: nn.Module, task: Task, evaluate: Callable | None, metric: str | None, save: Callable | None,
                on_eval: Callable[[RunResult], None] | None) -> Evaluation:
    """The loop's evaluation hook: task metrics as eval_*, the best model saved, each record reported."""
    def report(hook: Evaluation) -> None:
        if on_eval is not None:
            steps = hook.history[-1]["step"]
            on_eval(RunResult(hook.history, hook.best, hook.metric if evaluate else None, steps=steps))

    return Evaluation(evaluate=(lambda: {f"eval_{k}": v for k, v in evaluate(model).items()}) if evaluate else None,
                      metric=metric or task.metrics[0], save_best=(lambda: save(model)) if save else None,
                      on_record=report)
