"""The Objective interface every objective implements (its loss normalised by the whole step's counts of each term's
unit, nn.output), the model a run starts from (ModelChoice), and ObjectiveSpec: what registers an objective, as
FamilySpec registers a family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from encoderlab.checkpoint import init_from, load_weights, read_config, save_pretrained
from encoderlab.config import EncoderConfig
from encoderlab.data.collate import MaskBudget
from encoderlab.errors import ConfigError, InputError
from encoderlab.models import FAMILIES
from encoderlab.nn.output import Counts
from encoderlab.paths import resolve_model_path
from encoderlab.tokenizer import Tokenizer

class Objective(nn.Module):
    """Base of the objectives: forward(batch, counts) -> (loss, sums); metrics from summed sums; save/load/export,
    by default of the one model kept, `self.model`."""

    unused_parameters = False  # whether forward may leave some parameters without a gradient (DDP must know)
    new_tensors: list[str] = []  # with init_from: the tensors the checkpoint did not hold (start_from's answer)
    frozen: tuple[str, ...] = ()  # attributes holding frozen models (an anchor, a teacher), None where absent
    mask_budget: MaskBudget | None = None
    """The collator's cap on predictions (pretrain sets it from the recipe's mlm_probability): an objective whose
    model predicts masked tokens runs its MLM head on that fixed count, with no host sync; None: on the exact count."""

    def train(self, mode: bool = True) -> Objective:
        super().train(mode)
        for model in (getattr(self, name) for name in self.frozen):
            if model is not None:
                model.eval()  # a frozen model's dropout stays off: its targets must not be noisy
        return self

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the step's loss, given the whole step's counts of each unit (nn.output's
        batch_counts, summed over micro-batches and ranks), and detached sums (losses, correct counts) for the logs."""
        raise NotImplementedError

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        """Per-token (or per-sequence) figures from sums over a step or an evaluation; "loss" is the total."""
        raise NotImplementedError

    def start_from(self, name: str) -> list[str]:
        """Continued pretraining: load a checkpoint's weights into the trained model in place; return the
        names of the tensors it did not hold (fresh heads, a generator), which keep their initialisation."""
        return init_from(self.model, name)

    def save(self, folder: Path) -> None:
        """Write the trained weights into a checkpoint folder (exactly enough to resume)."""
        save_pretrained(self.model, folder)

    def load(self, folder: Path) -> None:
        """Load what save() wrote, in place."""
        load_weights(self.model, folder)

    def export(self, folder: Path, tokenizer: Tokenizer) -> None:
        """The final model(s) as Hugging Face folders with the tokenizer."""
        save_pretrained(self.model, folder, tokenizer)


def check_vocabulary(tokenizer: Tokenizer, data: str, name: str, role: str) -> None:
    """Refuse a checkpoint (init_from, a teacher) whose tokenizer is not the one `data` was prepared with: another
    kind, size or any token id. A checkpoint with no tokenizer files passes: its config's vocabulary size is
    all that can be checked, and the model config does that."""
    try:
        theirs = Tokenizer.from_pretrained(resolve_model_path(name))
    except (InputError, ConfigError, OSError):
        return
    difference = tokenizer.difference(theirs)
    if difference is not None:
        raise ConfigError(f"{role}: {name}'s tokenizer differs from the one {data} was prepared with ({difference}): "
                          f"prepare the data with `encoderlab prepare --tokenizer {name}`")


@dataclass
class ModelChoice:
    """The model a run trains: a preset from scratch, or init_from's architecture and weights; overrides on top."""

    preset: str = "bert-mini"
    """Model preset to start from (see `encoderlab info --preset`); unused with init_from."""
    init_from: str = ""
    """Continued pretraining: a checkpoint folder or alias whose architecture and weights the run starts from
    (heads it lacks start fresh, as from scratch); the data must be prepared with its tokenizer."""
    overrides: dict = field(default_factory=dict)
    """EncoderConfig field overrides (the recipe's `model` key), e.g. {hidden_dropout: 0.0}; vocab_size comes from
    the tokenizer."""
    pad_vocab_multiple: int = 1
    """From scratch: the embedding and MLM decoder get the tokenizer's vocabulary rounded up to a multiple of
    this, the extra rows never seen in the data (ModernBERT's vocabulary is 50,368 = 787 x 64 ids, unused ones
    included, chosen as a multiple of 64 for GPU efficiency; Warner et al. 2024, arXiv:2412.13663, section 2.2,
    Tokenizer). 1 = no padding; init_from keeps the checkpoint's own size."""

    @property
    def source(self) -> str:
        """Where the architecture comes from, for messages: "preset 'bert-mini'" or "init_from 'folder'"."""
        return f"init_from {self.init_from!r}" if self.init_from else f"preset {self.preset!r}"

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field; unknown presets and override keys fail by name."""
        if self.pad_vocab_multiple < 1:
            raise ConfigError(f"pad_vocab_multiple must be a positive number of rows, got {self.pad_vocab_multiple}")
        if not isinstance(self.overrides, dict):
            raise ConfigError(f"model must be a mapping of EncoderConfig fields, got {self.overrides!r}")
        self.encoder_config()

    def encoder_config(self, **sized: Any) -> EncoderConfig:
        """The architecture: init_from's config.json, or the preset with `sized` (vocab_size and pad_token_id from
        the tokenizer); then the overrides."""
        if not self.init_from:
            return EncoderConfig.from_preset(self.preset, **{**sized, **self.overrides})
        folder = resolve_model_path(self.init_from)
        return EncoderConfig.from_hf_dict(read_config(folder), str(folder / "config.json")).replace(**self.overrides)

    def sized(self, tokenizer: Tokenizer, max_length: int) -> EncoderConfig:
        """The architecture sized to the tokenizer's vocabulary (rounded up to pad_vocab_multiple), checked to read
        its ids and max_length tokens."""
        rows = -(-tokenizer.vocab_size // self.pad_vocab_multiple) * self.pad_vocab_multiple
        config = self.encoder_config(vocab_size=rows, pad_token_id=tokenizer.pad_id)
        if self.init_from and tokenizer.pad_id != config.pad_token_id:
            raise ConfigError(f"the data's tokenizer pads with id {tokenizer.pad_id}, {self.source} with "
                              f"{config.pad_token_id}: prepare the data with `encoderlab prepare --tokenizer "
                              f"{self.init_from}`")
        if tokenizer.vocab_size > config.vocab_size:
            raise ConfigError(f"the data's tokenizer has {tokenizer.vocab_size:,} tokens, more than the "
                              f"{config.vocab_size:,} of {self.source}")
        if max_length > config.max_tokens:
            raise ConfigError(f"max_length {max_length} exceeds the positions of {self.source} "
                              f"(max_position_embeddings {config.max_position_embeddings})")
        return config


@dataclass(frozen=True)
class ObjectiveSpec:
    """What ties one objective to a recipe: its name, typed options, how the data is cut for it and its builder."""

    name: str
    """The recipe's `objective` value ("mlm", "rtd", ...)."""
    options: type
    """Its options: a dataclass whose fields are flat recipe keys, a docstring each, with validate(config, source)."""
    build: Callable[[Any, ModelChoice, Tokenizer, str, int], Objective]
    """(options, model, tokenizer, data folder, max_length) -> the objective, its models freshly initialised."""
    examples: str = "mlm"
    """How prepared text is cut into examples: mlm (packed whole sentences), nsp or sop (segment pairs)."""
    pair_head: bool = False
    """Whether the model needs a sentence-pair head, which only some families have in transformers."""

    def validate(self, options: Any, config: EncoderConfig, source: str) -> None:
        """Raise ConfigError when the options are out of range or the model's family cannot be trained with them."""
        if self.pair_head and "pretraining" not in FAMILIES[config.model_type].architectures:
            raise ConfigError(f"objective {self.name} needs a family with a sentence-pair head; {source} is "
                              f"{config.model_type}, which has none in transformers")
        options.validate(config, source)


OBJECTIVES: dict[str, ObjectiveSpec] = {}


def register_objective(spec: ObjectiveSpec) -> None:
    """Make an objective known to recipes by its name; a name taken already is refused."""
    if spec.name in OBJECTIVES:
        raise ConfigError(f"objective {spec.name!r} is registered already (its options: "
                          f"{OBJECTIVES[spec.name].options.__name__}); register another under a new name")
    OBJECTIVES[spec.name] = spec
