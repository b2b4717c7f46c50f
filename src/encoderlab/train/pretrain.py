"""Pretraining (MLM, MLM+NSP/SOP, ELECTRA's RTD, distillation) on the one loop (encoderlab.train.loop).
What is trained and how its loss is computed is the objective's (src/encoderlab/objectives); this module gives
the loop its data and held-out evaluation, and exports the final model.

The data position is a cursor (epoch, index) into a deterministic example order, and each example's mask is
drawn from a generator seeded by (seed, epoch, index), so a batch's masks do not depend on which rank,
micro-batch or restart produced it.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from encoderlab.data.collate import MaskBudget, MaskingCollator
from encoderlab.data.examples import PretrainingExamples
from encoderlab.data.shards import TokenShards
from encoderlab.engine import eval_mode
from encoderlab.errors import InputError
from encoderlab.io import atomic_write_text, clear_folder
from encoderlab.models import FAMILIES
from encoderlab.nn.model import Model
from encoderlab.nn.output import batch_counts
from encoderlab.objectives import OBJECTIVES, Objective, build_objective as build
from encoderlab.objectives.mlm import MaskedLanguageModeling
from encoderlab.paths import resolve_model_path
from encoderlab.tokenizer import Tokenizer
from encoderlab.train import distributed
from encoderlab.train.config import PretrainConfig
from encoderlab.train.loop import Evaluation, RunSetup, autocast, run_loop, to_device
from encoderlab.train.prefetch import PrefetchedSteps, default_workers

log = logging.getLogger(__name__)
# The held-out split's example and masking seed, fixed so that runs with different recipe seeds (the cycles of a
# continued model: seed 0, then 1) score on the same masked batches; it was the recipe's seed + 1.
HELDOUT_SEED = 1


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
    length: int | None = None  # pad every batch to this many tokens (one shape for a compiled step); None: the longest

    def make(self, positions: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        """A padded batch; example (e, i) is masked by a generator seeded from (seed, e, i) alone."""
        examples = [self.examples.get(epoch, index) for epoch, index in positions]
        return self.collator.seeded(examples, [_mix(self.seed, epoch, index) for epoch, index in positions],
                                    self.length)


def _mix(*values: int) -> int:
    """A 63-bit seed from several integers (splitmix64-style mixing)."""
    h = 0x9E3779B97F4A7C15
    for value in values:
        h = (h ^ (value + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return h >> 1


@torch.no_grad()
def evaluate(model: Objective | Model, batches: Batches, cfg: PretrainConfig, micro: int,
             device: torch.device) -> dict[str, float]:
    """The objective's figures on the first examples of the held-out split, prefixed eval_: MLM loss, accuracy
    and perplexity, plus the NSP/SOP, replaced-token-detection or distillation terms."""
    objective = model if isinstance(model, Objective) else MaskedLanguageModeling(model)
    sums, counts = Counter(), Counter()  # summed over the batches
    count = min(cfg.eval_batches * micro, batches.examples.num_examples(0))
    with eval_mode(objective):
        for start in range(0, count, micro):
            batch = to_device(batches.make([(0, i) for i in range(start, min(start + micro, count))]), device)
            units = batch_counts(batch)
            with autocast(cfg.loop.precision, device):
                _, parts = objective(batch, {key: torch.tensor(1.0, device=device) for key in units})
            counts.update({key: float(value) for key, value in units.items()})
            sums.update({key: float(value) for key, value in parts.items()})
    result = {f"eval_{k}": v for k, v in objective.metrics(sums, counts).items()}
    result["eval_perplexity"] = math.exp(min(result["eval_mlm_loss"], 50.0))
    return result


@dataclass
class PretrainingData:
    """The loop's data (encoderlab.train.loop.StepData, and a Plannable for encoderlab.train.prefetch): each step the
    next batch_size examples of the cursor, rank r taking the r-th slice of micro x grad_accum of them. A step is
    planned (positions, cheap, in order) and built (examples, masks, padding) apart, so workers can build ahead."""

    batches: Batches
    batch_size: int
    micro: int
    cursor: Cursor = field(default_factory=Cursor)

    def next_step(self, rank: int, world_size: int, grad_accum: int) -> list[dict[str, torch.Tensor]]:
        return self.build(self.plan(rank, world_size, grad_accum))

    def plan(self, rank: int, world_size: int, grad_accum: int) -> list[list[tuple[int, int]]]:
        """This rank's micro-batches of the next step as (epoch, index) positions; moves the cursor past the step."""
        positions = self.cursor.take(self.batch_size, self.batches.examples)  # the same on every rank
        mine = positions[rank * self.micro * grad_accum:(rank + 1) * self.micro * grad_accum]
        return [mine[i:i + self.micro] for i in range(0, len(mine), self.micro)]

    def build(self, plan: list[list[tuple[int, int]]]) -> list[dict[str, torch.Tensor]]:
        """The micro-batches of a planned step."""
        return [self.batches.make(positions) for positions in plan]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.cursor.epoch, "index": self.cursor.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor = Cursor(**state)


def pretrain(cfg: PretrainConfig, run_dir: str | Path, resume: bool = False,
             stop_after: int | None = None, progress: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Run (or resume) pretraining into run_dir; return the final metrics.

    stop_after: leave after that many optimizer steps with a checkpoint (a controlled interruption).
    overwrite: empty run_dir once the model is built, before the first file is written (`--overwrite`).
    Ctrl-C finishes the current step, saves a checkpoint and raises KeyboardInterrupt.
    """
    run_dir = Path(run_dir)
    dist = distributed.setup(cfg.device)
    torch.manual_seed(cfg.seed)
    tokenizer = Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer")
    _check_tokenizer_kind(cfg, tokenizer)
    model = build_objective(cfg, tokenizer).to(dist.device)
    if overwrite and dist.is_main:
        clear_folder(run_dir)
    if cfg.model.init_from and dist.is_main:
        _record_start(run_dir, cfg.model.init_from, model, progress)
    micro = cfg.micro_batch(dist.world_size)
    data = training_data(cfg, tokenizer, micro, dist)
    valid_batches = heldout_batches(cfg, tokenizer)
    evaluation = None if valid_batches is None else Evaluation(lambda: evaluate(model, valid_batches, cfg, micro,
                                                                                dist.device))
    optimizer = cfg.optim.optimizer(model)
    scheduler = cfg.optim.scheduler(optimizer, cfg.loop.max_steps)
    setup = RunSetup(progress=progress, name="pretrain", recipe=cfg.flat())
    try:
        result = run_loop(model, data, optimizer, scheduler, cfg.loop, run_dir, dist, resume, stop_after, evaluation,
                          setup)
    finally:
        if isinstance(data, PrefetchedSteps):
            data.close()
    if dist.is_main and result.step == cfg.loop.max_steps:
        _export_final(run_dir, model, tokenizer)
    final = {k: v for k, v in (evaluation.history[-1] if evaluation and evaluation.history else {}).items()
             if k.startswith("eval_")}
    distributed.teardown()
    return final | {"step": result.step} | ({"new_tensors": model.new_tensors} if cfg.model.init_from else {})


def build_objective(cfg: PretrainConfig, tokenizer: Tokenizer) -> Objective:
    """The recipe's objective (encoderlab.objectives.build_objective) over its data's tokenizer."""
    objective = build(cfg.objective, cfg.options, cfg.model, tokenizer, cfg.data, cfg.max_length)
    objective.mask_budget = MaskBudget(cfg.mlm_probability)  # the collator's cap: a fixed MLM head size
    return objective


def fixed_length(cfg: PretrainConfig) -> int | None:
    """The length every batch is padded to: max_length (rounded up to 8) when compiled, so that one graph serves
    every step; None (each batch to its longest) otherwise."""
    return -(-cfg.max_length // 8) * 8 if cfg.loop.compile else None


def training_data(cfg: PretrainConfig, tokenizer: Tokenizer, micro: int,
                  dist: distributed.Dist) -> PretrainingData | PrefetchedSteps:
    """The training split's steps, built ahead by cfg.data_workers processes (-1: default_workers) when there are any;
    the batches are the same whichever."""
    examples = PretrainingExamples(TokenShards(cfg.data, "train"), OBJECTIVES[cfg.objective].examples,
                                   cfg.max_length, cfg.seed, cfg.short_seq_prob)
    data = PretrainingData(Batches(examples, masking_collator(cfg, tokenizer), cfg.seed, fixed_length(cfg)),
                           cfg.batch_size, micro)
    workers = cfg.data_workers if cfg.data_workers >= 0 else default_workers(dist.device, dist.world_size)
    if not workers:
        return data
    examples.num_examples(0)  # the first epoch's plan, built once before the workers fork so they share it
    return PrefetchedSteps(data, workers, pin_memory=dist.device.type == "cuda")


def _record_start(run_dir: Path, init_from: str, model: Objective, progress: bool) -> None:
    """Say where a continued run started and which tensors were new: RUN/init_from.json and a line on stderr."""
    loaded = len(model.state_dict()) - len(model.new_tensors)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "init_from.json", json.dumps(
        {"init_from": init_from, "folder": str(resolve_model_path(init_from)), "loaded_tensors": loaded,
         "new_tensors": model.new_tensors}, indent=2) + "\n")
    line = (f"init_from {init_from}: {loaded} tensors loaded; new (initialised as from scratch): "
            f"{', '.join(model.new_tensors) or 'none'}")
    log.info(line)
    if progress:
        print(line, file=sys.stderr)


def _check_tokenizer_kind(cfg: PretrainConfig, tokenizer: Tokenizer) -> None:
    """Warn when the data's tokenizer is not the kind the preset's family was released with (it still trains)."""
    family = FAMILIES[cfg.model.encoder_config().model_type]
    if family.tokenizer_kind != tokenizer.kind and not cfg.model.init_from:  # init_from: checked against its own
        warnings.warn(f"preset {cfg.model.preset!r} ({family.model_type}) was released with a {family.tokenizer_kind} "
                      f"tokenizer, but data {cfg.data} was prepared with a {tokenizer.kind} one; the model will "
                      f"train, but its tokenizer is not the family's (see `encoderlab tokenizer train --kind`)",
                      stacklevel=2)


def masking_collator(cfg: PretrainConfig, tokenizer: Tokenizer) -> MaskingCollator:
    """The recipe's masking (probability, whole-word) over the tokenizer's ids."""
    return MaskingCollator(tokenizer.vocab_size, tokenizer.mask_id, tokenizer.pad_id, tokenizer.special_ids,
                           mlm_probability=cfg.mlm_probability, whole_word=cfg.whole_word, pad_to_multiple_of=None)


def heldout_batches(cfg: PretrainConfig, tokenizer: Tokenizer) -> Batches | None:
    """Masked batches over the held-out split, if `prepare` wrote one (what `evaluate` scores). Their sequences and
    masks come from HELDOUT_SEED, not the recipe's seed: two runs on the same data score on the same batches."""
    try:
        shards = TokenShards(cfg.data, "valid")
    except InputError:  # no held-out split was prepared: evaluation is skipped, training goes on
        return None
    examples = PretrainingExamples(shards, OBJECTIVES[cfg.objective].examples, cfg.max_length, HELDOUT_SEED,
                                   cfg.short_seq_prob)
    return Batches(examples, masking_collator(cfg, tokenizer), HELDOUT_SEED, fixed_length(cfg))


def _export_final(run_dir: Path, model: Objective, tokenizer: Tokenizer) -> None:
    """The trained model with its tokenizer in run_dir/model: a Hugging Face folder (ELECTRA: the discriminator,
    its generator in model/generator)."""
    model.export(run_dir / "model", tokenizer)
    atomic_write_text(run_dir / "model" / "README.md",
                      "Pretrained by `encoderlab pretrain`; the recipe is ../recipe.yaml, the curves ../curves.png.\n")
