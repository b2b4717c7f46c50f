"""The one training loop of every objective, pretraining (encoderlab.objectives) and fine-tuning
(encoderlab.tasks.objective): bf16 autocast, gradient accumulation, DDP under torchrun (gloo on CPU, NCCL on
CUDA), clipping, optimizer and schedule, metrics.csv, an evaluation hook that keeps the best model, resumable
checkpoints in RUN/checkpoints, and Ctrl-C or SIGTERM turned into a checkpoint at the next step boundary.

Exactness rests on three rules:
- a step's data is a function of the step alone (`StepData`: a cursor or a step count in its state_dict), the
  same whichever rank, micro-batch or restart asks for it;
- the loss is a sum divided by the count of the whole optimizer step (all ranks, all micro-batches; see
  `Objective.counts`), so accumulation and DDP give the gradient of one big batch;
- a checkpoint holds the weights, optimizer, schedule, every RNG, the data position and the hook's record.

The host never waits for the device inside a step: a step's loss sums, counts and gradient norm stay on the device
(`StepStats`) and are read at log, evaluation and checkpoint steps (`Watch`), tokens/s over the interval since the
last read. The same reads catch the first step whose loss or gradient norm is not finite: the run stops there with
one line naming it, and nothing is saved from weights that step made.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from encoderlab.choices import TRAINING_PRECISIONS
from encoderlab.engine import autocast
from encoderlab.errors import ConfigError, TrainingDiverged
from encoderlab.io import number_text
from encoderlab.nn.output import batch_counts
from encoderlab.objectives import Objective
from encoderlab.train import distributed
from encoderlab.train.logger import COLUMNS, RunLogger
from encoderlab.train.state import (DeferredInterrupt, clear_checkpoints, latest_checkpoint, load_trainer_state,
                                    remove_leftovers, rng_state, save_checkpoint, set_rng_state)

log = logging.getLogger(__name__)
DUMMY = "dummy"  # key of a micro-batch a rank runs at weight 0 when its share of a step is empty
PRECISIONS = TRAINING_PRECISIONS  # fp32, or bf16 autocast
TRIM_EVERY = 10  # steps between returns of the heap memory the C allocator holds free (release_freed_memory)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the process's C library has none (musl, macOS, Windows)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):
        return None


def release_freed_memory() -> bool:
    """Hand the heap memory that the C allocator holds free back to the OS; False where that cannot be done.

    Each step allocates tensors whose sizes change with the batch (the logits of however many tokens were masked,
    packed lengths), and glibc keeps what they freed in its arenas. Continuing minilm by MLM (batch 32 x 128, two
    cores) grew from 3.0 to 5.2 GB resident in 60 steps, and an anchored 1,000-step run held 10-11 GB, while
    the weights, optimizer and activations need about 2. malloc_trim(0) releases the free pages of every arena
    (man 3 malloc_trim: since glibc 2.8 it "frees memory in all arenas and in all chunks with whole free pages");
    every TRIM_EVERY steps it kept those 60 steps under 3.4 GB at the same speed.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch with every tensor (also inside nested dicts) moved to `device`, int32 ones widened to int64 there
    (data workers send ids and labels as int32: half the bytes to copy; encoderlab.train.prefetch)."""
    return {k: to_device(v, device) if isinstance(v, dict) else _moved(v, device) if isinstance(v, torch.Tensor)
            else v for k, v in batch.items()}


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    moved = tensor.to(device, non_blocking=True)
    return moved.long() if moved.dtype == torch.int32 else moved


class StepData(Protocol):
    """Where an objective's batches come from: step by step, resumable."""

    def next_step(self, rank: int, world_size: int, grad_accum: int) -> list[dict[str, Any]]:
        """This rank's micro-batches of the next step (at least one; a DUMMY one when its share is empty)."""

    def state_dict(self) -> dict[str, Any]:
        """Plain data (loadable with weights_only) that puts the stream back where it is."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what state_dict() returned."""


@dataclass
class LoopOptions:
    """How the loop trains, as a user sets it: the same type for pretraining recipes and fine-tuning."""

    max_steps: int = 1000
    """Optimizer steps of the whole run."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (per rank): the same step in less memory."""
    precision: str = "bf16"
    """fp32, or bf16 autocast (CPU and CUDA; weights and optimizer stay fp32)."""
    clip_norm: float = 1.0
    """Gradient clipping by global L2 norm; 0 disables it."""
    log_every: int = 10
    """Steps between metrics.csv / TensorBoard rows."""
    eval_every: int = 200
    """Steps between evaluations, beside each epoch's end and the last step (0: only those)."""
    save_every: int = 200
    """Steps between checkpoints, beside each epoch's end, the last step and an interruption (0: only those)."""
    keep_checkpoints: int = 2
    """How many step checkpoints to keep."""
    compile: bool = False
    """torch.compile the whole objective (encoder, heads and loss; pretraining then pads every batch to max_length,
    so that one graph serves every step); the run notes how many graphs were compiled, and how many after its first
    step (recompilations, each a stall of seconds to minutes)."""

    def validate(self) -> None:
        """Raise ConfigError naming the first bad option."""
        for name in ("max_steps", "grad_accum"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")


@dataclass
class RunSetup:
    """How a caller runs the loop, beside the user's LoopOptions: epochs, reporting, what a fresh run may discard."""

    steps_per_epoch: int = 0
    """Steps of one pass over the data, where the data has epochs (fine-tuning); 0: no epoch boundaries."""
    discard_old: bool = False
    """A fresh run over an earlier run's checkpoints discards them (True) or is refused (False)."""
    progress: bool = True
    """Show a tqdm bar on stderr (rank 0)."""
    name: str = "train"
    """The bar's label."""
    recipe: dict | None = None
    """Written to RUN/recipe.yaml when given."""
    columns: tuple[str, ...] = COLUMNS
    """metrics.csv's columns."""
    visuals: bool = True
    """TensorBoard logs and the curves PNG beside metrics.csv."""

    def due(self, step: int, every: int, max_steps: int) -> bool:
        """Whether `step` ends an `every`-step period, an epoch, or the run."""
        return (bool(every) and step % every == 0) or step == max_steps or (
            self.steps_per_epoch > 0 and step % self.steps_per_epoch == 0)


@dataclass
class Evaluation:
    """The evaluation hook: at due steps, record the train loss since the last record and evaluate()'s eval_* metrics,
    calling save_best() when `metric` (unprefixed; None: the first reported) is the highest yet, then on_record(self)."""

    evaluate: Callable[[], dict[str, float]] | None = None
    metric: str | None = None
    save_best: Callable[[], None] | None = None
    on_record: Callable[[Evaluation], None] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    losses: list = field(default_factory=list)  # train losses since the last record (floats, or StepLoss)

    def record(self, step: int, steps_per_epoch: int) -> dict[str, Any]:
        """Evaluate and keep the best; returns the new history entry."""
        entry: dict[str, Any] = {"epoch": round(step / steps_per_epoch, 3)} if steps_per_epoch else {}
        losses = [float(loss) for loss in self.losses]
        entry |= {"step": step, "train_loss": sum(losses) / len(losses) if losses else None}
        self.losses = []
        if self.evaluate is not None:
            metrics = self.evaluate()
            if f"eval_{self.metric}" not in metrics:  # e.g. unscored embedding pairs report retrieval metrics
                self.metric = next(iter(metrics)).removeprefix("eval_")
            entry |= metrics
            if self.best is None or metrics[f"eval_{self.metric}"] > self.best[f"eval_{self.metric}"]:
                self.best = dict(entry)
                if self.save_best is not None:
                    self.save_best()
        self.history.append(entry)
        if self.on_record is not None:
            self.on_record(self)
        return entry

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "best": self.best, "metric": self.metric,
                "losses": [float(loss) for loss in self.losses]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history, self.best, self.metric, self.losses = (state[k] for k in ("history", "best", "metric", "losses"))


@dataclass
class LoopResult:
    """Where a run ended: its step and seconds (over all restarts)."""

    step: int
    seconds: float


def run_loop(objective: Objective, data: StepData, optimizer: torch.optim.Optimizer, scheduler: Any,
             options: LoopOptions, run_dir: Path | None, dist: distributed.Dist, resume: bool = False,
             stop_after: int | None = None, evaluation: Evaluation | None = None,
             setup: RunSetup | None = None) -> LoopResult:
    """Train `objective` to options.max_steps, or stop_after steps, logging and checkpointing in run_dir if given;
    Ctrl-C and SIGTERM finish the step, save a checkpoint and raise KeyboardInterrupt (Terminated); a non-finite
    loss or gradient norm raises TrainingDiverged, saving nothing."""
    setup = setup or RunSetup()
    if run_dir is not None:
        _open_run_dir(Path(run_dir), resume, setup.discard_old, dist)
    step, seconds = _restore(run_dir, objective, optimizer, scheduler, data, evaluation) if resume else (0, 0.0)
    logger = RunLogger(run_dir, setup.recipe, enabled=dist.is_main, resume=resume and step > 0, resume_step=step,
                       columns=setup.columns, visuals=setup.visuals)
    if options.compile:
        objective.compile()  # the whole objective: encoder, heads and loss (the loop counts the graphs it makes)
    trainable = DistributedDataParallel(objective, find_unused_parameters=objective.unused_parameters) \
        if dist.world_size > 1 else objective
    objective.train()
    stop_at = options.max_steps if stop_after is None else min(options.max_steps, stop_after)
    started = time.time() - seconds
    watch = Watch(objective, dist.device, run_dir, step)
    bar = logger.progress(step, options.max_steps, setup.progress, setup.name)
    due = functools.partial(setup.due, max_steps=options.max_steps)
    with bar, DeferredInterrupt() as interrupt:
        while step < stop_at:
            micro_batches = data.next_step(dist.rank, dist.world_size, options.grad_accum)
            stats = device_step(trainable, micro_batches, optimizer, scheduler, options.clip_norm, options.precision,
                                dist)
            step += 1
            watch.add(step, stats)
            if step % TRIM_EVERY == 0:
                release_freed_memory()
            bar.update(1)
            if evaluation is not None and dist.is_main:
                evaluation.losses.append(StepLoss(stats, objective))  # read when the hook records
            stopping = step < stop_at and _any_rank(interrupt.requested, dist)
            saving = run_dir is not None and dist.is_main and (step == stop_at or stopping or
                                                               due(step, options.save_every))
            evaluating = evaluation is not None and dist.is_main and due(step, options.eval_every)
            if step % options.log_every == 0 or step == stop_at or saving or evaluating or stopping:
                metrics = watch.read(step)  # the one wait for the device; raises on a non-finite step
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['lr']:.2e}",
                                tok_s=f"{metrics['tokens_per_s']:.0f}", refresh=False)
                if step % options.log_every == 0 or step == stop_at:
                    logger.log(step, metrics)
            if evaluating:
                _record(evaluation, step, setup, logger, bar)
            if saving:
                _save(Path(run_dir), step, time.time() - started, objective, optimizer, scheduler, data, evaluation,
                      options.keep_checkpoints)
                watch.checkpoint = step
            dist.barrier()
            if stopping:
                logger.note(f"interrupted at step {step}" + ("" if run_dir is None else
                                                              ": checkpoint saved, continue with --resume"))
                raise interrupt.stop()
    if options.compile:
        logger.note(watch.compiled_graphs())
    if step == options.max_steps:
        logger.finish()
    return LoopResult(step, time.time() - started)


def _record(evaluation: Evaluation, step: int, setup: RunSetup, logger: RunLogger, bar: Any) -> None:
    """Run the evaluation hook, log its entry and show it."""
    entry = evaluation.record(step, setup.steps_per_epoch)
    logger.log(step, {k: v for k, v in entry.items() if v is not None and k != "step"})
    shown = ", ".join(f"{k} {number_text(v)}" for k, v in entry.items()
                      if k not in ("step", "epoch") and isinstance(v, (int, float)))  # a count whole, as `evaluate`
    line = f"{'epoch ' + format(entry['epoch'], 'g') + ' ' if 'epoch' in entry else ''}step {step}: {shown}"
    if bar.disable:
        log.info(line)
    else:
        bar.write(line, file=sys.stderr)


def _open_run_dir(run_dir: Path, resume: bool, discard_old: bool, dist: distributed.Dist) -> None:
    """Clear what a killed run left; a fresh run over an earlier run's checkpoints discards them or is refused."""
    if not resume and (run_dir / "checkpoints" / "latest").exists():
        if not discard_old:
            raise ConfigError(f"{run_dir}: holds checkpoints of an earlier run; pass --resume to continue it, "
                              f"or choose another --out")
        if dist.is_main:
            clear_checkpoints(run_dir)  # they must not be resumed into this run
    if dist.is_main:
        remove_leftovers(run_dir, run_dir / "model")
    dist.barrier()


def _any_rank(flag: bool, dist: distributed.Dist) -> bool:
    """True when `flag` is set on any rank, so that all ranks stop at the same step."""
    return bool(dist.sum(torch.tensor(int(flag), device=dist.device))) if dist.world_size > 1 else flag


@dataclass
class StepStats:
    """One optimizer step's figures, left on the device until read: the objective's sums and the step's counts
    (all ranks), this rank's loss (the sum of its micro-batches' shares), the gradient norm, the learning rate."""

    sums: dict[str, torch.Tensor]
    counts: dict[str, torch.Tensor]
    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float

    def read(self, objective: Objective) -> dict[str, float]:
        """The step's metrics as numbers (waits for the device)."""
        keys = [*self.sums, *self.counts]
        values = torch.stack([*self.sums.values(), *self.counts.values(), self.grad_norm]).tolist()  # one copy
        numbers = dict(zip(keys + ["grad_norm"], values))
        metrics = objective.metrics({k: numbers[k] for k in self.sums}, {k: numbers[k] for k in self.counts})
        return metrics | {"lr": self.lr, "grad_norm": numbers["grad_norm"], "tokens": numbers["tokens"]}


@dataclass
class StepLoss:
    """A step's total loss (all ranks), read from the device only when float() asks for it."""

    stats: StepStats
    objective: Objective

    def __float__(self) -> float:
        return self.stats.read(self.objective)["loss"]


class Watch:
    """What the loop reads from the device at log, evaluation and checkpoint steps: the latest step's metrics,
    tokens/s since the previous read, and the first step whose loss or gradient norm was not finite (tracked on the
    device every step, so no step waits for it)."""

    def __init__(self, objective: Objective, device: torch.device, run_dir: Path | None, step: int) -> None:
        self.objective, self.run_dir = objective, run_dir
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)  # 0: every step finite so far
        self.tokens = torch.zeros((), device=device)  # since the last read
        self.latest: StepStats | None = None
        self.read_at = time.perf_counter()
        self.last_finite: tuple[int, float] | None = None  # (step, loss) of the last finite step read
        self.checkpoint: int | None = step or None
        self.graphs = [_graphs_compiled()]  # before the run; then after its first step

    def add(self, step: int, stats: StepStats) -> None:
        """Take a step's stats (device operations only)."""
        if len(self.graphs) == 1:
            self.graphs.append(_graphs_compiled())
        finite = torch.isfinite(stats.loss) & torch.isfinite(stats.grad_norm)
        self.first_bad = torch.where((self.first_bad == 0) & ~finite, step, self.first_bad)
        self.tokens += stats.counts["tokens"].float()
        self.latest = stats

    def read(self, step: int) -> dict[str, float]:
        """The latest step's metrics with tokens_per_s since the last read; TrainingDiverged if a step since the
        start was not finite."""
        metrics = self.latest.read(self.objective)
        first_bad = int(self.first_bad)
        if first_bad:
            raise TrainingDiverged(self._diverged(first_bad, metrics))
        now = time.perf_counter()
        metrics["tokens_per_s"] = float(self.tokens) / max(now - self.read_at, 1e-9)
        self.tokens.zero_()
        self.read_at, self.last_finite = now, (step, metrics["loss"])
        return metrics

    def compiled_graphs(self) -> str:
        """How many graphs torch.compile made in this run, and how many of them after its first step."""
        total, later = _graphs_compiled() - self.graphs[0], _graphs_compiled() - self.graphs[-1]
        return (f"torch.compile: {total} graphs compiled, {later} of them after the first step (recompilations: new "
                f"shapes, evaluation's mode)")

    def _diverged(self, first_bad: int, metrics: dict[str, float]) -> str:
        """The one line that says where a run stopped being finite."""
        last = ("no finite step was read" if self.last_finite is None else
                f"the last finite loss read was {self.last_finite[1]:.4f} at step {self.last_finite[0]}")
        where = ("no checkpoint was written" if self.checkpoint is None or self.run_dir is None else
                 f"the last checkpoint is {Path(self.run_dir) / 'checkpoints' / f'step-{self.checkpoint:06d}'}")
        return (f"step {first_bad}: the loss or gradient norm is not finite (at the latest step: loss "
                f"{metrics['loss']}, grad norm {metrics['grad_norm']}); the run stops without saving; {last}; {where} "
                f"(--resume continues from it: lower lr, raise warmup_steps, or use precision fp32)")


def step_counts(batches: list[dict[str, Any]], dist: distributed.Dist) -> dict[str, torch.Tensor]:
    """The count of each unit over a whole step, all micro-batches (DUMMY ones count nothing) and ranks; each >= 1."""
    counts = [batch_counts(b) for b in batches]
    keys = sorted(counts[0])
    local = torch.stack([sum(c[k] * (0 if b.get(DUMMY) else 1) for b, c in zip(batches, counts)) for k in keys])
    return dict(zip(keys, dist.sum(local.float()).clamp(min=1).unbind()))


def _graphs_compiled() -> int:
    """Graphs torch.compile has made in this process so far (dynamo's own counter)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def optimizer_step(model: torch.nn.Module, micro_batches: list[dict[str, Any]], optimizer: torch.optim.Optimizer,
                   scheduler: Any, clip_norm: float, precision: str, dist: distributed.Dist) -> dict[str, float]:
    """device_step, its metrics read at once (a bench's or a test's step; the loop reads only at its log steps)."""
    objective = model.module if isinstance(model, DistributedDataParallel) else model
    return device_step(model, micro_batches, optimizer, scheduler, clip_norm, precision, dist).read(objective)


def device_step(model: torch.nn.Module, micro_batches: list[dict[str, Any]], optimizer: torch.optim.Optimizer,
                scheduler: Any, clip_norm: float, precision: str, dist: distributed.Dist) -> StepStats:
    """Forward and backward over the micro-batches, clip, step; the loss is normalised over the whole step. `model` is
    an Objective (or a DDP wrapper of one): it returns the micro-batch's share of the loss. A DUMMY micro-batch runs at
    weight 0: it lets a rank without examples meet the others in DDP's all-reduce. Nothing here waits for the device."""
    objective = model.module if isinstance(model, DistributedDataParallel) else model
    micro_batches = [to_device(b, dist.device) for b in micro_batches]
    counts = step_counts(micro_batches, dist)
    sums: dict[str, torch.Tensor] = {}
    total = torch.zeros((), device=dist.device)
    for i, batch in enumerate(micro_batches):
        sync = i == len(micro_batches) - 1 or not isinstance(model, DistributedDataParallel)
        weight = 0.0 if batch.get(DUMMY) else float(dist.world_size)  # DDP averages gradients over ranks; we sum
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast(precision, dist.device):
            loss, parts = model({k: v for k, v in batch.items() if k != DUMMY}, counts)
            (loss * weight).backward()
        total = total + loss.detach().float() * (1.0 if weight else 0.0)
        for key, value in parts.items():  # a dummy's zeros too: every rank then sums the same keys below
            sums[key] = sums.get(key, 0) + (value if weight else value * 0)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm else float("inf"))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    keys = sorted(sums)
    summed = dist.sum(torch.stack([torch.as_tensor(sums[k], device=dist.device).float() for k in keys]))
    return StepStats(dict(zip(keys, summed.unbind())), counts, total, grad_norm.float(), scheduler.get_last_lr()[0])


def _restore(run_dir: Path | None, objective: Objective, optimizer: torch.optim.Optimizer, scheduler: Any,
             data: StepData, evaluation: Evaluation | None) -> tuple[int, float]:
    """Load the latest checkpoint into the training state, data stream and hook; its step and seconds (or 0, 0.0)."""
    folder = latest_checkpoint(Path(run_dir)) if run_dir is not None else None
    if folder is None:
        return 0, 0.0
    objective.load(folder)
    state = load_trainer_state(folder)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    record = json.loads(state["record"])  # JSON: plain data for weights_only loading
    data.load_state_dict(record["data"])
    if evaluation is not None and record["evaluation"] is not None:
        evaluation.load_state_dict(record["evaluation"])
    return state["step"], record["seconds"]


def _save(run_dir: Path, step: int, seconds: float, objective: Objective, optimizer: torch.optim.Optimizer,
          scheduler: Any, data: StepData, evaluation: Evaluation | None, keep: int) -> None:
    """A resumable checkpoint of this exact point in training."""
    record = {"data": data.state_dict(), "seconds": seconds,
              "evaluation": None if evaluation is None else evaluation.state_dict()}
    state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": rng_state(), "record": json.dumps(record)}
    save_checkpoint(run_dir, step, objective.save, state, keep)
