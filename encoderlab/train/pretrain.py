"""Pretraining: one loop for every objective (MLM, MLM+NSP/SOP, ELECTRA's RTD, distillation), resumable
exactly, DDP-ready. What is trained and how its loss is computed is the objective's (encoderlab/objectives).

Exactness rests on three rules:
- the data position is a cursor (epoch, index) into a deterministic example order;
- each example's mask is drawn from a generator seeded by (seed, epoch, index), so a batch's masks do not
  depend on which rank, micro-batch or restart produced it;
- the loss is a sum over masked tokens (real tokens, sequences) divided by the count of the whole optimizer
  step (all ranks, all micro-batches), so accumulation and DDP give the same gradient as one big batch.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from encoderlab.config import EncoderConfig
from encoderlab.data.collate import MaskingCollator
from encoderlab.data.examples import PretrainingExamples
from encoderlab.data.shards import TokenShards
from encoderlab.errors import ConfigError, InputError
from encoderlab.io import atomic_write_text
from encoderlab.models import FAMILIES
from encoderlab.nn.encoder import Encoder
from encoderlab.nn.model import IGNORE_INDEX, Model
from encoderlab.objectives import Objective, build_objective
from encoderlab.objectives.mlm import MaskedLanguageModeling
from encoderlab.tokenizer import Tokenizer
from encoderlab.train import distributed
from encoderlab.train.config import PretrainConfig
from encoderlab.train.logger import RunLogger
from encoderlab.train.optim import linear_schedule, make_optimizer
from encoderlab.train.state import (DeferredInterrupt, latest_checkpoint, load_trainer_state, remove_leftovers,
                                    rng_state, save_checkpoint, set_rng_state)


@dataclass
class Cursor:
    """Position in the stream of examples: epoch, and index into that epoch's shuffled order."""

    epoch: int = 0
    index: int = 0

    def take(self, count: int, examples: PretrainingExamples) -> list[tuple[int, int]]:
        """The next `count` (epoch, index) pairs, moving on to the next epoch when one runs out."""
        out = []
        while len(out) < count:
            available = examples.num_examples(self.epoch) - self.index
            if available <= 0:
                self.epoch, self.index = self.epoch + 1, 0
                continue
            step = min(available, count - len(out))
            out.extend((self.epoch, i) for i in range(self.index, self.index + step))
            self.index += step
        return out


@dataclass
class Batches:
    """Examples plus the collator that turns them into masked tensors with per-example seeds."""

    examples: PretrainingExamples
    collator: MaskingCollator
    seed: int
    pad_id: int
    generator: torch.Generator = field(default_factory=torch.Generator)

    def make(self, positions: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        """A padded batch; example (e, i) is masked by a generator seeded from (seed, e, i) alone."""
        rows = []
        for epoch, index in positions:
            self.generator.manual_seed(_mix(self.seed, epoch, index))
            rows.append(self.collator([self.examples.get(epoch, index)], self.generator))
        return _stack(rows, self.pad_id)


def _mix(*values: int) -> int:
    """A 63-bit seed from several integers (splitmix64-style mixing)."""
    h = 0x9E3779B97F4A7C15
    for value in values:
        h = (h ^ (value + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return h >> 1


def _stack(rows: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Concatenate single-example batches, right-padding sequence tensors to the longest (multiple of 8)."""
    length = max(row["input_ids"].shape[1] for row in rows)
    length = -(-length // 8) * 8
    fill = {"input_ids": pad_id, "labels": IGNORE_INDEX}
    out = {}
    for key in rows[0]:
        if rows[0][key].ndim == 2:
            out[key] = torch.cat([F.pad(r[key], (0, length - r[key].shape[1]), value=fill.get(key, 0)) for r in rows])
        else:
            out[key] = torch.cat([r[key] for r in rows])
    return out


def build_model(cfg: PretrainConfig, tokenizer: Tokenizer) -> Model:
    """A freshly initialised model of an mlm / mlm+nsp / mlm+sop recipe's preset, sized to the tokenizer."""
    return build_objective(cfg, tokenizer).model


def _autocast(precision: str, device: torch.device):
    """bf16 autocast on CPU or CUDA when the recipe asks for it."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _counts(batches: list[dict[str, torch.Tensor]], dist: distributed.Dist) -> dict[str, torch.Tensor]:
    """Masked tokens, real tokens and sequences of a whole step: all micro-batches, summed over ranks (>= 1)."""
    local = torch.stack([sum((b["labels"] != IGNORE_INDEX).sum() for b in batches),
                         sum(b["attention_mask"].sum() for b in batches),
                         torch.tensor(sum(b["input_ids"].shape[0] for b in batches), device=dist.device)]).float()
    masked, tokens, sequences = dist.sum(local).clamp(min=1).unbind()
    return {"masked": masked, "tokens": tokens, "sequences": sequences}


@torch.no_grad()
def evaluate(model: Objective | Model, batches: Batches, cfg: PretrainConfig, micro: int,
             device: torch.device) -> dict[str, float]:
    """The objective's figures on the first examples of the held-out split, prefixed eval_: MLM loss, accuracy
    and perplexity, plus the NSP/SOP, replaced-token-detection or distillation terms."""
    objective = model if isinstance(model, Objective) else MaskedLanguageModeling(model)
    was_training = objective.training
    objective.eval()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    count = min(cfg.eval_batches * micro, batches.examples.num_examples(0))
    for start in range(0, count, micro):
        batch = {k: v.to(device) for k, v in batches.make([(0, i) for i in range(start, min(start + micro, count))]).items()}
        with _autocast(cfg.precision, device):
            _, parts = objective(batch, {key: torch.tensor(1.0, device=device) for key in ("masked", "tokens", "sequences")})
        for key, value in _counts([batch], distributed.Dist(device=device)).items():
            counts[key] = counts.get(key, 0.0) + float(value)
        for key, value in parts.items():
            sums[key] = sums.get(key, 0.0) + float(value)
    objective.train(was_training)
    result = {f"eval_{k}": v for k, v in objective.metrics(sums, counts).items()}
    result["eval_perplexity"] = math.exp(min(result["eval_mlm_loss"], 50.0))
    return result


def pretrain(cfg: PretrainConfig, run_dir: str | Path, resume: bool = False,
             stop_after: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) pretraining into run_dir; return the final metrics.

    stop_after: leave after that many optimizer steps with a checkpoint (a controlled interruption).
    Ctrl-C finishes the current step, saves a checkpoint and raises KeyboardInterrupt.
    """
    run_dir = Path(run_dir)
    dist = distributed.setup(cfg.device)
    _open_run_dir(run_dir, resume, dist.is_main)
    torch.manual_seed(cfg.seed)
    tokenizer = Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer")
    _check_tokenizer_kind(cfg, tokenizer)
    model = build_objective(cfg, tokenizer).to(dist.device)
    micro = cfg.micro_batch(dist.world_size)
    train_batches = Batches(PretrainingExamples(TokenShards(cfg.data, "train"), _objective(cfg), cfg.max_length,
                                                cfg.seed, cfg.short_seq_prob), masking_collator(cfg, tokenizer), cfg.seed,
                            tokenizer.pad_id)
    valid_batches = heldout_batches(cfg, tokenizer)
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(cfg.warmup_steps, cfg.max_steps))
    cursor, step = _restore(run_dir, model, optimizer, scheduler) if resume else (Cursor(), 0)
    trainable = DistributedDataParallel(model) if dist.world_size > 1 else model
    if cfg.compile:
        for module in model.modules():
            if isinstance(module, Encoder):
                module.compile()
    logger = RunLogger(run_dir, cfg.to_dict(), enabled=dist.is_main, resume=resume and step > 0, resume_step=step)
    model.train()
    final: dict[str, Any] = {}
    stop_at = cfg.max_steps if stop_after is None else min(cfg.max_steps, stop_after)
    bar = logger.progress(step, cfg.max_steps, progress)
    with bar, DeferredInterrupt() as interrupt:
        while step < stop_at:
            metrics = _train_step(trainable, train_batches, cursor, optimizer, scheduler, cfg, micro, dist)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
            if step % cfg.log_every == 0 or step == stop_at:
                logger.log(step, metrics)
            if valid_batches is not None and dist.is_main and (step == cfg.max_steps or
                                                               (cfg.eval_every and step % cfg.eval_every == 0)):
                final.update(evaluate(model, valid_batches, cfg, micro, dist.device))
                logger.log(step, final)
            stopping = step < stop_at and _any_rank(interrupt.requested, dist)
            if dist.is_main and (step == stop_at or stopping or (cfg.save_every and step % cfg.save_every == 0)):
                _save(run_dir, step, model, optimizer, scheduler, cursor, cfg)
            dist.barrier()
            if stopping:
                logger.note(f"interrupted at step {step}: checkpoint saved, continue with --resume")
                raise interrupt.stop()
    if dist.is_main and step == cfg.max_steps:
        _export_final(run_dir, model, tokenizer)
        logger.finish()
    final["step"] = step
    distributed.teardown()
    return final


def _check_tokenizer_kind(cfg: PretrainConfig, tokenizer: Tokenizer) -> None:
    """Warn when the data's tokenizer is not the kind the preset's family was released with (it still trains)."""
    family = FAMILIES[EncoderConfig.from_preset(cfg.preset, **cfg.model).model_type]
    if family.tokenizer_kind != tokenizer.kind:
        warnings.warn(f"preset {cfg.preset!r} ({family.model_type}) was released with a {family.tokenizer_kind} "
                      f"tokenizer, but data {cfg.data} was prepared with a {tokenizer.kind} one; the model will "
                      f"train, but its tokenizer is not the family's (see `encoderlab tokenizer train --kind`)",
                      stacklevel=2)


def _open_run_dir(run_dir: Path, resume: bool, is_main: bool) -> None:
    """Refuse a fresh run over an earlier run's checkpoints (they would mix); clear what a killed run left."""
    if not resume and (run_dir / "checkpoints" / "latest").exists():
        raise ConfigError(f"{run_dir}: holds checkpoints of an earlier run; pass --resume to continue it, "
                          f"or choose another --out")
    if is_main:
        remove_leftovers(run_dir, run_dir / "model")


def _any_rank(flag: bool, dist: distributed.Dist) -> bool:
    """True when `flag` is set on any rank, so that all ranks stop at the same step."""
    return bool(dist.sum(torch.tensor(int(flag), device=dist.device))) if dist.world_size > 1 else flag


def masking_collator(cfg: PretrainConfig, tokenizer: Tokenizer) -> MaskingCollator:
    """The recipe's masking (probability, whole-word) over the tokenizer's ids."""
    return MaskingCollator(tokenizer.vocab_size, tokenizer.mask_id, tokenizer.pad_id, tokenizer.special_ids,
                           mlm_probability=cfg.mlm_probability, whole_word=cfg.whole_word, pad_to_multiple_of=None)


def _objective(cfg: PretrainConfig) -> str:
    """The example builder's objective: nsp / sop -> segment pairs; the rest (mlm, rtd, distill) -> packed
    sequences of whole sentences (RoBERTa's DOC-SENTENCES; ELECTRA and DistilBERT train on such text too)."""
    return cfg.objective.removeprefix("mlm+") if cfg.objective.startswith("mlm+") else "mlm"


def heldout_batches(cfg: PretrainConfig, tokenizer: Tokenizer) -> Batches | None:
    """Masked batches over the held-out split, if `prepare` wrote one (what `evaluate` scores)."""
    try:
        shards = TokenShards(cfg.data, "valid")
    except InputError:  # no held-out split was prepared: evaluation is skipped, training goes on
        return None
    return Batches(PretrainingExamples(shards, _objective(cfg), cfg.max_length, cfg.seed + 1, cfg.short_seq_prob),
                   masking_collator(cfg, tokenizer), cfg.seed + 1, tokenizer.pad_id)


def _train_step(model: torch.nn.Module, batches: Batches, cursor: Cursor, optimizer: torch.optim.Optimizer,
                scheduler: Any, cfg: PretrainConfig, micro: int, dist: distributed.Dist) -> dict[str, float]:
    """One optimizer step: this rank's share of the next global batch, in grad_accum micro-batches."""
    started = time.perf_counter()
    positions = cursor.take(cfg.batch_size, batches.examples)  # the whole global batch, same on every rank
    mine = positions[dist.rank * micro * cfg.grad_accum:(dist.rank + 1) * micro * cfg.grad_accum]
    micro_batches = [batches.make(mine[i:i + micro]) for i in range(0, len(mine), micro)]
    metrics = optimizer_step(model, micro_batches, optimizer, scheduler, cfg.clip_norm, cfg.precision, dist)
    metrics["tokens_per_s"] = metrics["tokens"] / (time.perf_counter() - started)
    return metrics


def optimizer_step(model: torch.nn.Module, micro_batches: list[dict[str, torch.Tensor]],
                   optimizer: torch.optim.Optimizer, scheduler: Any, clip_norm: float, precision: str,
                   dist: distributed.Dist) -> dict[str, float]:
    """Forward and backward over the micro-batches, clip, step; the loss is normalised over the whole step.

    `model` is an Objective (or a DDP wrapper of one): it returns the micro-batch's share of the loss."""
    micro_batches = [{k: v.to(dist.device, non_blocking=True) for k, v in b.items()} for b in micro_batches]
    counts = _counts(micro_batches, dist)
    sums: dict[str, torch.Tensor] = {}
    for i, batch in enumerate(micro_batches):
        sync = i == len(micro_batches) - 1 or not isinstance(model, DistributedDataParallel)
        with (contextlib.nullcontext() if sync else model.no_sync()), _autocast(precision, dist.device):
            loss, parts = model(batch, counts)
            (loss * dist.world_size).backward()  # DDP averages gradients over ranks; we want the sum
        for key, value in parts.items():
            sums[key] = sums.get(key, 0) + value
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm else float("inf"))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    objective = model.module if isinstance(model, DistributedDataParallel) else model
    totals = {k: float(dist.sum(v.float())) for k, v in sums.items()}
    metrics = objective.metrics(totals, {k: float(v) for k, v in counts.items()})
    metrics.update(lr=scheduler.get_last_lr()[0], grad_norm=float(grad_norm), tokens=float(counts["tokens"]))
    return metrics


def _restore(run_dir: Path, model: Objective, optimizer: torch.optim.Optimizer, scheduler: Any) -> tuple[Cursor, int]:
    """Load the latest checkpoint into model, optimizer, scheduler and RNGs; the data cursor and step it holds."""
    folder = latest_checkpoint(run_dir)
    if folder is None:  # nothing saved yet (e.g. killed in the first steps): start from the beginning
        return Cursor(), 0
    model.load(folder)
    state = load_trainer_state(folder)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return Cursor(**state["cursor"]), state["step"]


def _save(run_dir: Path, step: int, model: Objective, optimizer: torch.optim.Optimizer, scheduler: Any,
          cursor: Cursor, cfg: PretrainConfig) -> None:
    """A resumable checkpoint of this exact point in training."""
    state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": rng_state(), "cursor": {"epoch": cursor.epoch, "index": cursor.index}}
    save_checkpoint(run_dir, step, model.save, state, cfg.keep_checkpoints)


def _export_final(run_dir: Path, model: Objective, tokenizer: Tokenizer) -> None:
    """The trained model with its tokenizer in run_dir/model: a Hugging Face folder (ELECTRA: the discriminator,
    its generator in model/generator)."""
    model.export(run_dir / "model", tokenizer)
    atomic_write_text(run_dir / "model" / "README.md",
                      "Pretrained by `encoderlab pretrain`; the recipe is ../recipe.yaml, the curves ../curves.png.\n")
