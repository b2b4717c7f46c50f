"""PretrainConfig: a pretraining recipe, read from YAML with strict keys and `--set key=value` overrides.

YAML is parsed with `yaml.safe_load`: a recipe is data, never code.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from encoderlab.checkpoint import read_config
from encoderlab.choices import TRAINING_PRECISIONS
from encoderlab.config import EncoderConfig
from encoderlab.errors import ConfigError
from encoderlab.models import FAMILIES
from encoderlab.paths import resolve_model_path
from encoderlab.objectives.rtd import generator_config
from encoderlab.train.optim import SCHEDULES

OBJECTIVES = ("mlm", "mlm+nsp", "mlm+sop", "rtd", "distill")
PRECISIONS = TRAINING_PRECISIONS  # fp32, or bf16 autocast
EMBEDDING_SHARING = ("shared", "gdes")
ANCHOR_LAYERS = ("last", "all")


@dataclass
class PretrainConfig:
    """Everything that defines a pretraining run; a YAML recipe sets any subset of these fields."""

    data: str = ""
    """Folder written by `encoderlab prepare` (token shards, meta.json, tokenizer/)."""
    preset: str = "bert-mini"
    """Model preset to start from (see `encoderlab info --preset`); unused with init_from."""
    init_from: str = ""
    """Continued pretraining: a checkpoint folder or alias whose architecture and weights the run starts from
    (heads it lacks start fresh, as from scratch); the data must be prepared with its tokenizer."""
    anchor: str = ""
    """mlm objectives: a checkpoint folder or alias (usually init_from's) whose last hidden states the model is
    kept near, a frozen copy reading the same batch: anchor_weight x (1 - cosine) over the real tokens not
    selected for prediction is added to the loss, so that adaptation does not wander far from an encoder that
    was already good (DistilBERT's cosine loss, Sanh et al. 2019, used against the starting model, as in
    Li & Hoiem 2016, "Learning without Forgetting"). Empty: plain MLM."""
    anchor_weight: float = 1.0
    """mlm with anchor: the weight of the anchor's cosine loss beside the MLM loss."""
    anchor_layers: str = "last"
    """mlm with anchor: last (the last hidden states) or all (every hidden state, the embeddings' and each layer's,
    the cosine averaged over them; the anchor must have as many layers as the model)."""
    model: dict = field(default_factory=dict)
    """EncoderConfig field overrides, e.g. {hidden_dropout: 0.0}; vocab_size comes from the tokenizer."""
    pad_vocab_multiple: int = 1
    """From scratch: the embedding and MLM decoder get the tokenizer's vocabulary rounded up to a multiple of
    this, the extra rows never seen in the data (ModernBERT's vocabulary is 50,368 = 787 x 64 ids, unused ones
    included, chosen as a multiple of 64 for GPU efficiency; Warner et al. 2024, arXiv:2412.13663, section 2.2,
    Tokenizer). 1 = no padding; init_from keeps the checkpoint's own size."""
    objective: str = "mlm"
    """mlm (packed sequences, RoBERTa-style), mlm+nsp (BERT segment pairs), mlm+sop (ALBERT sentence order),
    rtd (ELECTRA and DeBERTa-v3 replaced-token detection, packed sequences) or distill (DistilBERT, packed
    sequences)."""
    max_length: int = 128
    """Tokens per sequence, special tokens included."""
    batch_size: int = 32
    """Global sequences per optimizer step, over all ranks and accumulation steps."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (per rank)."""
    max_steps: int = 1000
    """Optimizer steps to run."""
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
    clip_norm: float = 1.0
    """Gradient clipping by global L2 norm; 0 disables it."""
    mlm_probability: float = 0.15
    """Fraction of tokens selected for masking (BERT paper, sec. 3.1)."""
    whole_word: bool = False
    """Mask all sub-tokens of a word together (word ids from the tokenizer)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter target length for NSP pairs (BERT's create_pretraining_data.py)."""
    precision: str = "bf16"
    """fp32, or bf16 autocast (CPU and CUDA)."""
    compile: bool = False
    """torch.compile the whole objective (encoder, heads and loss), every batch padded to max_length so that one
    graph serves every step; the run's log says how many graphs were compiled after the first step."""
    data_workers: int = -1
    """Processes that build batches ahead of the step (encoderlab/train/prefetch.py); -1: auto (up to 4 on CUDA,
    none on CPU, where the model's threads use every core); 0: built in the main process between steps. A step's
    batches are the same whatever the number, so a run may resume with another."""
    seed: int = 0
    """Seed of init, data order, masking and dropout."""
    device: str = "auto"
    """auto (cuda when present), cpu or cuda."""
    log_every: int = 10
    """Steps between metrics.csv / TensorBoard rows."""
    eval_every: int = 200
    """Steps between held-out evaluations (0: only at the end)."""
    eval_batches: int = 20
    """Batches of the held-out split per evaluation."""
    save_every: int = 200
    """Steps between checkpoints (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many step checkpoints to keep."""
    # ---- rtd (ELECTRA, Clark et al. 2020; DeBERTa-v3, He et al. 2021) ----------------------------
    generator_size: float = 0.25
    """rtd: the generator's width, heads and feed-forward as a fraction of the discriminator's (ELECTRA,
    section 3.2 and appendix: 1/4 to 1/2 of the discriminator works best). A generator narrower than the
    shared embeddings projects them to its width, which the family's config.json must hold (ELECTRA's
    embedding_size; DeBERTa's config.json has none, so its generator keeps the full width)."""
    generator_layers: float = 1.0
    """rtd: the generator's depth as a fraction of the discriminator's (ELECTRA: 1.0, the same depth; DeBERTa-v3:
    0.5 at full width, as in the released RTD configs of microsoft/DeBERTa, experiments/language_model)."""
    rtd_weight: float = 50.0
    """rtd: weight of the discriminator's loss beside the generator's MLM loss (ELECTRA, section 2: lambda = 50)."""
    embedding_sharing: str = "shared"
    """rtd: shared (one embeddings module, ELECTRA) or gdes (E_D = sg(E_G) + E_delta, DeBERTa-v3 section 3)."""
    # ---- distill (DistilBERT, Sanh et al. 2019) --------------------------------------------------
    teacher: str = ""
    """distill: checkpoint folder or alias of the teacher, a BERT-like masked LM over the data's vocabulary."""
    temperature: float = 2.0
    """distill: softmax temperature of the soft targets (transformers' distillation example)."""
    alpha_ce: float = 5.0
    """distill: weight of T^2 x KL(teacher || student) over the masked tokens."""
    alpha_mlm: float = 2.0
    """distill: weight of the student's MLM loss."""
    alpha_cos: float = 1.0
    """distill: weight of the cosine loss between the last hidden states."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field."""
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name in ("max_length", "batch_size", "grad_accum", "max_steps"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.data_workers < -1:
            raise ConfigError(f"data_workers must be -1 (auto), 0 or a number of processes, got {self.data_workers}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.pad_vocab_multiple < 1:
            raise ConfigError(f"pad_vocab_multiple must be a positive number of rows, got {self.pad_vocab_multiple}")
        if not 0 < self.mlm_probability < 1:
            raise ConfigError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not isinstance(self.model, dict):
            raise ConfigError(f"model must be a mapping of EncoderConfig fields, got {self.model!r}")
        if not str(self.data).strip():
            raise ConfigError("data is required: the folder `encoderlab prepare` wrote (shards and meta.json)")
        self._validate_objective(self.encoder_config())  # unknown preset or model keys fail here, by name

    def encoder_config(self, **sized: Any) -> EncoderConfig:
        """The model's architecture: init_from's config.json, or the preset with `sized` (vocab_size and
        pad_token_id from the tokenizer); then the recipe's `model` overrides."""
        if not self.init_from:
            return EncoderConfig.from_preset(self.preset, **{**sized, **self.model})
        folder = resolve_model_path(self.init_from)
        return EncoderConfig.from_hf_dict(read_config(folder), str(folder / "config.json")).replace(**self.model)

    def _validate_objective(self, config: EncoderConfig) -> None:
        """The objective's own keys, and whether the model's family can be trained and saved with it."""
        spec = FAMILIES[config.model_type]
        source = f"init_from {self.init_from!r}" if self.init_from else f"preset {self.preset!r}"
        if self.objective in ("mlm+nsp", "mlm+sop") and "pretraining" not in spec.architectures:
            raise ConfigError(f"objective {self.objective} needs a family with a sentence-pair head; "
                              f"{source} is {config.model_type}, which has none in transformers")
        if self.anchor.strip():
            if not self.objective.startswith("mlm"):
                raise ConfigError(f"anchor applies to the mlm objectives (mlm, mlm+nsp, mlm+sop), not {self.objective}; "
                                  f"distill keeps its student near the teacher with alpha_cos")
            if not self.anchor_weight > 0:
                raise ConfigError(f"anchor_weight must be positive, got {self.anchor_weight}")
            if self.anchor_layers not in ANCHOR_LAYERS:
                raise ConfigError(f"anchor_layers must be one of {ANCHOR_LAYERS}, got {self.anchor_layers!r}")
        if self.objective == "rtd":
            self._validate_rtd(config)
        if self.objective == "distill":
            if not self.teacher.strip():
                raise ConfigError("teacher is required for objective distill: a checkpoint folder or alias of a "
                                  "BERT-like masked LM (e.g. a run's model/ folder)")
            if config.model_type != "distilbert":
                raise ConfigError(f"objective distill trains a distilbert student; preset {self.preset!r} is "
                                  f"{config.model_type}: use a distilbert-* preset")
            if self.temperature <= 0:
                raise ConfigError(f"temperature must be positive, got {self.temperature}")
            weights = {"alpha_ce": self.alpha_ce, "alpha_mlm": self.alpha_mlm, "alpha_cos": self.alpha_cos}
            if any(w < 0 for w in weights.values()) or not any(weights.values()):
                raise ConfigError(f"alpha_ce, alpha_mlm and alpha_cos must be >= 0, not all 0; got {weights}")

    def _validate_rtd(self, config: EncoderConfig) -> None:
        """rtd's keys, and whether the preset's family can save the generator they describe."""
        for name in ("generator_size", "generator_layers"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.rtd_weight <= 0:
            raise ConfigError(f"rtd_weight must be positive, got {self.rtd_weight}")
        if self.embedding_sharing not in EMBEDDING_SHARING:
            raise ConfigError(f"embedding_sharing must be one of {EMBEDDING_SHARING}, got {self.embedding_sharing!r}")
        generator = generator_config(config, self.generator_size, self.generator_layers)
        if generator.embedding_size is not None and "embedding_size" not in FAMILIES[config.model_type].hf_names:
            raise ConfigError(f"generator_size {self.generator_size} makes the generator {generator.hidden_size} wide "
                              f"beside {config.embedding_width}-wide embeddings, a projection that the config.json "
                              f"of preset {self.preset!r} ({config.model_type}) cannot hold (no embedding_size): "
                              f"use generator_size: 1.0 and a shallower generator (generator_layers: 0.5, "
                              f"as DeBERTa-v3), or an electra-* preset")

    def micro_batch(self, world_size: int) -> int:
        """Sequences per forward pass on one rank."""
        per_pass = self.grad_accum * world_size
        if self.batch_size % per_pass:
            raise ConfigError(f"batch_size {self.batch_size} is not divisible by grad_accum x ranks = {per_pass}")
        return self.batch_size // per_pass


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


def _apply(values: dict[str, Any], base: dict[str, Any], source: str) -> None:
    """Merge `values` into `base`, checking every key and type against PretrainConfig."""
    hints = typing.get_type_hints(PretrainConfig)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"{source}: unknown key {key!r}; known keys: {', '.join(hints)}")
        base[key] = _coerce(key, value, hints[key], source)


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
        return PretrainConfig(**values)
    except ConfigError as err:
        raise ConfigError(f"{path or '--set'}: {err}") from None
