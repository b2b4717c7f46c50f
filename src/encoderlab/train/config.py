"""PretrainConfig: a pretraining recipe, read from YAML with strict keys and `--set key=value` overrides.

A recipe holds the data, the model (ModelChoice: a preset or init_from, with overrides), the objective with its own
typed options (its ObjectiveSpec's), the loop's options and the optimizer's (LoopOptions, OptimOptions: the types
fine-tuning hands the loop too). Its YAML keys are flat, each a field of one of these parts (the model's overrides
under `model`). A key of another objective's options is accepted at its default only: a run's recipe.yaml records
every registered objective's keys, and loads again.

YAML is parsed with `yaml.safe_load`: a recipe is data, never code.
"""

from __future__ import annotations

import difflib
import os
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from encoderlab.errors import ConfigError
from encoderlab.objectives import OBJECTIVES, ModelChoice
from encoderlab.objectives.mlm import MLMOptions
from encoderlab.train.loop import LoopOptions
from encoderlab.train.optim import OptimOptions

PARTS = {"model": ModelChoice, "loop": LoopOptions, "optim": OptimOptions}  # the recipe's typed parts
RECIPE_NAMES = {"overrides": "model"}  # a part's field -> its recipe key, where they differ


@dataclass
class PretrainConfig:
    """Everything that defines a pretraining run; a YAML recipe sets any subset of its flat keys."""

    data: str = ""
    """Folder written by `encoderlab prepare` (token shards, meta.json, tokenizer/)."""
    model: ModelChoice = field(default_factory=ModelChoice)
    """The model trained: keys preset, init_from, model (EncoderConfig overrides) and pad_vocab_multiple."""
    objective: str = "mlm"
    """mlm, mlm+nsp, mlm+sop, rtd or distill: a name in encoderlab.objectives.OBJECTIVES (its docstring says each)."""
    options: Any = field(default_factory=MLMOptions)
    """The objective's own options, of its ObjectiveSpec's type (MLMOptions, RTDOptions, DistillOptions)."""
    loop: LoopOptions = field(default_factory=LoopOptions)
    """Steps, accumulation, precision, clipping, compile; when to log, evaluate and save."""
    optim: OptimOptions = field(default_factory=OptimOptions)
    """AdamW and the learning-rate schedule."""
    max_length: int = 128
    """Tokens per sequence, special tokens included."""
    batch_size: int = 32
    """Global sequences per optimizer step, over all ranks and accumulation steps."""
    mlm_probability: float = 0.15
    """Fraction of tokens selected for masking (BERT paper, sec. 3.1)."""
    whole_word: bool = False
    """Mask all sub-tokens of a word together (word ids from the tokenizer)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter target length for NSP pairs (BERT's create_pretraining_data.py)."""
    data_workers: int = -1
    """Processes that build batches ahead of the step (src/encoderlab/train/prefetch.py); -1: auto (up to 4 on CUDA,
    none on CPU, where the model's threads use every core); 0: built in the main process between steps. A step's
    batches are the same whatever the number, so a run may resume with another."""
    seed: int = 0
    """Seed of init, data order, masking and dropout."""
    device: str = "auto"
    """auto (cuda when present), cpu or cuda."""
    eval_batches: int = 20
    """Batches of the held-out split per evaluation."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field."""
        spec = OBJECTIVES.get(self.objective)
        if spec is None:
            raise ConfigError(f"objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}")
        self.loop.validate()
        for name in ("max_length", "batch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.data_workers < -1:
            raise ConfigError(f"data_workers must be -1 (auto), 0 or a number of processes, got {self.data_workers}")
        self.optim.validate()
        self.model.validate()
        if not 0 < self.mlm_probability < 1:
            raise ConfigError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not str(self.data).strip():
            raise ConfigError("data is required: the folder `encoderlab prepare` wrote (shards and meta.json)")
        if str(self.data).startswith("hf:"):
            raise ConfigError(f"data {self.data}: pretraining reads token shards; write them first with `encoderlab "
                              f"prepare --corpus {self.data} --tokenizer TOKENIZER --out DIR` and give data: DIR")
        if not isinstance(self.options, spec.options):
            raise ConfigError(f"objective {self.objective} takes {spec.options.__name__}, got "
                              f"{type(self.options).__name__}")
        spec.validate(self.options, self.model.encoder_config(), self.model.source)  # unknown presets fail here

    def micro_batch(self, world_size: int) -> int:
        """Sequences per forward pass on one rank."""
        per_pass = self.loop.grad_accum * world_size
        if self.batch_size % per_pass:
            raise ConfigError(f"batch_size {self.batch_size} is not divisible by grad_accum x ranks = {per_pass}")
        return self.batch_size // per_pass

    def flat(self) -> dict[str, Any]:
        """The recipe as flat YAML keys, every registered objective's options at their defaults beside this
        objective's (what RUN/recipe.yaml holds; load_recipe reads it back to the same run)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in (*PARTS, "options")}
        out |= {RECIPE_NAMES.get(k, k): v for k, v in asdict(self.model).items()}
        for spec in OBJECTIVES.values():
            out |= asdict(spec.options())
        return out | asdict(self.options) | asdict(self.loop) | asdict(self.optim)


def recipe_keys() -> dict[str, tuple[Any, Any]]:
    """Every flat recipe key -> (where it goes: "" for PretrainConfig's own fields, a part's name, or an objective's
    options class; its type)."""
    hints = typing.get_type_hints(PretrainConfig)
    keys = {name: ("", kind) for name, kind in hints.items() if name not in (*PARTS, "options")}
    for part, kind in PARTS.items():
        keys |= {RECIPE_NAMES.get(n, n): (part, k) for n, k in typing.get_type_hints(kind).items()}
    for spec in OBJECTIVES.values():
        keys |= {n: (spec.options, k) for n, k in typing.get_type_hints(spec.options).items()}
    return keys


def from_flat(values: dict[str, Any], source: str = "recipe") -> PretrainConfig:
    """A PretrainConfig from flat recipe keys (as a YAML recipe holds them), each checked by name and type; a key of
    another objective's options must be at its default."""
    checked: dict[str, Any] = {}
    _apply(values, checked, source)
    objective = checked.get("objective", PretrainConfig.objective)
    spec = OBJECTIVES.get(objective)
    parts: dict[Any, dict[str, Any]] = {"": {}, **{part: {} for part in PARTS}, "options": {}}
    names, keys = {v: k for k, v in RECIPE_NAMES.items()}, recipe_keys()
    for key, value in checked.items():
        where = keys[key][0]
        if not isinstance(where, type):
            parts[where][names.get(key, key) if where else key] = value
        elif spec is not None and where is spec.options:
            parts["options"][key] = value
        elif spec is not None and value != getattr(where(), key):
            owners = [s.name for s in OBJECTIVES.values() if s.options is where]
            which = f"the {owners[0]} objectives ({', '.join(owners)})" if owners[1:] else f"objective {owners[0]}"
            raise ConfigError(f"{key} applies to {which}, not {objective}")
    options = spec.options(**parts["options"]) if spec is not None else MLMOptions()
    return PretrainConfig(**parts[""], **{part: kind(**parts[part]) for part, kind in PARTS.items()},
                          options=options)


def _coerce(name: str, value: Any, kind: Any, source: str) -> Any:
    """Check (and gently convert) one value to the field's declared type (bool, int, float, str or dict)."""
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if kind is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 5e-4 as a string
        except ValueError:
            pass
    if isinstance(value, (int, float) if kind is float else kind) and (kind is bool or not isinstance(value, bool)):
        return float(value) if kind is float else value  # True is an int to Python, not to a recipe
    raise ConfigError(f"{source}: {name} must be {kind.__name__}, got {value!r}")


def _close_keys(key: str, keys: list[str]) -> list[str]:
    """The recipe keys a mistyped one probably meant: spelled alike (difflib), else one of its _-separated words."""
    words = key.split("_")
    return difflib.get_close_matches(key, keys, n=3) or [k for k in keys if k in words][:3]


def _apply(values: dict[str, Any], base: dict[str, Any], source: str) -> None:
    """Merge `values` into `base`, checking every key and type against the recipe's flat keys."""
    keys = recipe_keys()
    for key, value in values.items():
        if key not in keys:
            close = _close_keys(key, list(keys))
            hint = f"did you mean: {', '.join(close)}?" if close else "see docs/pretraining.md for the recipe keys"
            raise ConfigError(f"unknown key {key!r} in {source}; {hint}")
        base[key] = _coerce(key, value, keys[key][1], source)


def load_recipe(path: str | os.PathLike | None, overrides: list[str] = ()) -> PretrainConfig:
    """A PretrainConfig from a YAML file plus `key=value` overrides (`model.hidden_dropout=0` reaches into model)."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such recipe file") from None
        except (UnicodeDecodeError, yaml.YAMLError) as err:
            raise ConfigError(f"{path}: not valid UTF-8 YAML ({err})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of keys to values")
        _apply(data, values, str(path))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value")
        value = yaml.safe_load(raw) if raw else ""
        if key.startswith("model."):
            values.setdefault("model", {})
            values["model"] = {**values["model"], key.removeprefix("model."): value}
        else:
            _apply({key: value}, values, f"--set {key}")
    try:
        return from_flat(values)
    except ConfigError as err:
        raise ConfigError(f"{path or '--set'}: {err}") from None
