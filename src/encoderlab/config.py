"""EncoderConfig: the one config system, a typed dataclass that maps to and from Hugging Face config.json.

Our field names are plain (`num_layers`); the Hugging Face names (`num_hidden_layers`) are translated only here. Every
switch that changes the computation is a field, so the models read the config and nothing else. A family
(encoderlab.models) registers its defaults, presets and config.json names with `register_family` on import."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoderlab.errors import ConfigError
from encoderlab.io import read_json_file

# hidden_act / head_activation names as in Hugging Face config.json; nn/mlp.py maps each to its function.
ACTIVATION_NAMES = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")  # transformers' names

# Our field name -> Hugging Face config.json name, where they differ.
_HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
             "hidden_dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob"}

# Keys transformers writes into every config.json that carry nothing our models use: accepted and dropped (any
# other unknown key is an error that names it).
_HF_BOOKKEEPING = frozenset({
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "use_cache",
    "gradient_checkpointing", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "tie_word_embeddings", "output_past", "return_dict", "output_hidden_states", "output_attentions",
    "torchscript", "pruned_heads", "chunk_size_feed_forward", "num_labels",
    "finetuning_task", "prefix", "task_specific_params", "tokenizer_class", "tie_encoder_decoder",
    "is_encoder_decoder", "label2id", "directionality", "pooler_fc_size", "pooler_num_attention_heads",
    "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type", "classifier_dropout",
})

# Keys we accept only with the value we implement: anything else would silently change the maths.
_HF_REQUIRED_VALUES = {"position_embedding_type": ("absolute",), "is_decoder": (False,),
                       "add_cross_attention": (False,)}


@dataclass
class EncoderConfig:
    """Hyperparameters of one BERT-family encoder (defaults: bert-base-uncased)."""

    model_type: str = "bert"
    """Family name (`bert`, ...): selects the weight-name map, the config.json names and the switches' defaults."""
    vocab_size: int = 30522
    """Number of token ids, including special tokens."""
    hidden_size: int = 768
    """Width of every token vector between blocks."""
    num_layers: int = 12
    """Number of transformer blocks."""
    num_heads: int = 12
    """Attention heads per block; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer inside each block (4x hidden in BERT)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: gelu (erf), gelu_new (tanh approximation), relu or silu."""
    hidden_dropout: float = 0.1
    """Dropout on embeddings and on each residual branch."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the learned position table covers."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids; 0 means no segment embedding."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    pad_token_id: int = 0
    """Id of the padding token."""
    initializer_range: float = 0.02
    """Standard deviation of the normal init of weight matrices (BERT paper, appendix A)."""
    initializer_cutoff_factor: float = 0.0
    """0: BERT's plain normal init. c > 0 (ModernBERT: 2): normals truncated at c standard deviations, and each
    block's output projections at initializer_range / sqrt(2 num_layers) (nn/encoder.py init_weights)."""
    labels: list[str] | None = None
    """Class names of a classification head (Hugging Face id2label), if any."""
    # ---- variant switches: each family sets some of these in its FamilyConfig.defaults --------------
    # The model builds any combination; only a family's config.json refuses what its transformers class lacks.
    embedding_size: int | None = None
    """Width of the embedding tables when it differs from hidden_size (ALBERT, ELECTRA): a linear layer
    projects up to hidden_size (Lan et al. 2019, section 3.1, factorized embedding parameterization)."""
    shared_layers: bool = False
    """One set of block weights applied num_layers times (ALBERT, Lan et al. 2019, section 3.1)."""
    positions_after_pad: bool = False
    """RoBERTa's position ids: real tokens count from pad_token_id + 1, padding takes pad_token_id (fairseq)."""
    absolute_positions: bool = True
    """Learned absolute position embeddings added to the input (DeBERTa-v3 has none: position_biased_input)."""
    relative_attention: bool = False
    """DeBERTa's disentangled attention over relative positions (He et al. 2021, section 3.1)."""
    position_buckets: int = 0
    """Relative positions are log-bucketed into this many buckets each side (DeBERTa-v3: 256); 0: no buckets."""
    max_relative_positions: int = -1
    """Largest relative distance attended to; -1 means max_position_embeddings (DeBERTa)."""
    pooler: bool = True
    """The bare model's [CLS] pooler, tanh(W h_[CLS] + b) (BERT paper, section 3); DistilBERT, ELECTRA and
    DeBERTa have none."""
    head_activation: str | None = None
    """Activation in the MLM head's transform when it is not hidden_act (RoBERTa's lm_head and ELECTRA's generator
    head always use gelu); None: hidden_act."""
    always_project: bool = False
    """Project the embeddings to hidden_size even at equal widths (ALBERT's embedding_hidden_mapping_in is
    always there)."""
    rope_theta: float | None = None
    """Rotary position embeddings on queries and keys with this base in global layers (Su et al. 2021,
    arXiv:2104.09864, eq. 34); None: none."""
    local_rope_theta: float | None = None
    """The rotary base of local (sliding-window) layers; None: rope_theta."""
    local_attention: int = 0
    """Window of local layers in tokens: a query sees keys at most local_attention // 2 away (ModernBERT's
    sliding window, Warner et al. 2024, arXiv:2412.13663, section 2.1.2); 0: every layer global."""
    global_attn_every_n_layers: int = 1
    """With local_attention, layers 0, n, 2n, ... are global and the others local (ModernBERT: n = 3)."""
    pre_norm: bool = False
    """Pre-LayerNorm blocks, x + f(LN(x)), and a final LayerNorm (Xiong et al. 2020, arXiv:2002.04745); the
    first block normalizes nothing before attention, as its input is the normalized embeddings (ModernBERT)."""
    gated_ffn: bool = False
    """Gated feed-forward act(x W) * (x V) (GeGLU with gelu: Shazeer 2020, arXiv:2002.05202, eq. 6)."""
    bias: bool = True
    """Biases in the encoder's linear and LayerNorm layers and in the heads' dense and norm (ModernBERT: none)."""
    # ---- head layout: what the family's XFor... task heads compute (their weight names are weight-map rows) ----
    classifier_pooling: str = "cls"
    """What a sequence-classification head reads: the first token (cls) or the mean of the real tokens (mean)."""
    classifier_dense: bool = False
    """The sequence-classification head passes that vector through its own dense layer and activation; False: it
    reads the backbone's [CLS] pooler (BERT, ALBERT)."""
    classifier_activation: str | None = "tanh"
    """Activation after the head's dense layer (RoBERTa tanh, ELECTRA and DeBERTa gelu, DistilBERT relu); None: the
    MLM head's (head_activation, else hidden_act)."""
    classifier_norm: bool = False
    """A LayerNorm after the classification head's activation (ModernBertPredictionHead)."""
    classifier_dropout_first: bool = True
    """Dropout before the head's dense layer as well as before its output layer (DistilBERT, ModernBERT: only there)."""
    task_transform: bool = False
    """The token-classification and QA heads pass each token through dense, activation and LayerNorm first
    (ModernBERT: every task model has the same `head`)."""
    problem_type: str | None = None
    """transformers' problem_type of a classification head: regression, single_label_classification or
    multi_label_classification; None: not a classifier."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first field that is out of range or inconsistent."""
        if not isinstance(self.model_type, str) or self.model_type not in _FAMILIES:
            raise ConfigError(f"model_type {self.model_type!r} is not one of {sorted(_FAMILIES)}")
        for name, (ok, what) in _RULES.items():
            if not ok(getattr(self, name)):
                raise ConfigError(f"{name} must be {what}, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id ({self.pad_token_id}) must lie in [0, vocab_size={self.vocab_size})")

    @property
    def embedding_width(self) -> int:
        """Width of the embedding tables: embedding_size, or hidden_size when not factorized."""
        return self.embedding_size or self.hidden_size

    def is_local(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends within the local window."""
        return bool(self.local_attention) and layer % self.global_attn_every_n_layers != 0

    @property
    def position_offset(self) -> int:
        """The position of a sequence's first token: pad_token_id + 1 where positions count past the pad (RoBERTa)."""
        return self.pad_token_id + 1 if self.positions_after_pad else 0

    @property
    def max_tokens(self) -> int:
        """The longest input the position table holds."""
        return self.max_position_embeddings - self.position_offset

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads

    def replace(self, **changes: Any) -> "EncoderConfig":
        """A copy with some fields changed (validated; unknown names are an error)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown config key(s) {sorted(unknown)}; known: {field_names()}")
        return dataclasses.replace(self, **changes)

    # ---- presets --------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "EncoderConfig":
        """The config of a named preset (see `presets()`), with optional field overrides."""
        known = presets()
        if name not in known:
            raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(known)}")
        return cls(**known[name]).replace(**overrides)

    # ---- Hugging Face config.json -----------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], source: str = "config.json") -> "EncoderConfig":
        """Build from a Hugging Face config dict (other switches: the family's); ConfigError for unknown keys/values."""
        model_type = data.get("model_type", "bert")
        if not isinstance(model_type, str) or model_type not in _FAMILIES:
            raise ConfigError(f"{source}: model_type {model_type!r} is not one of {sorted(_FAMILIES)}")
        spec = _FAMILIES[model_type]
        try:
            data = spec.hf_rewrite[0](data) if spec.hf_rewrite else data
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
        ours = {hf: name for name, hf in _hf_names(spec).items() if hf}
        required = _HF_REQUIRED_VALUES | spec.hf_constants
        kwargs: dict[str, Any] = dict(spec.defaults)
        for key, value in data.items():
            if key in ours:
                kwargs[ours[key]] = value
            elif key == "id2label":
                kwargs["labels"] = _labels(value, source)
            elif key in required:
                if not _one_of(value, required[key]):
                    raise ConfigError(f"{source}: {key}={value!r} is not supported for {model_type} "
                                      f"(expected {required[key][0]!r})")
            elif key not in _HF_BOOKKEEPING and key not in spec.hf_unused:
                raise ConfigError(f"{source}: unknown key {key!r}")
        missing = sorted(spec.hf_required - set(data))
        if missing:
            raise ConfigError(f"{source}: {missing[0]} is missing; without it transformers builds a {model_type} we "
                              f"do not support (expected {missing[0]}={required[missing[0]][0]!r})")
        labels = kwargs.get("labels")  # transformers writes LABEL_0, LABEL_1 when no head was trained: not real names
        if labels is not None and all(label == f"LABEL_{i}" for i, label in enumerate(labels)):
            kwargs.pop("labels")
        try:
            return cls(**kwargs)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None

    def to_hf_dict(self, architecture: str) -> dict[str, Any]:
        """The Hugging Face config.json dict for this config and model class name; a switch the family's config.json
        cannot hold must keep the family's value, or the file would lie (transformers could not compute this model)."""
        spec = _FAMILIES[self.model_type]
        out: dict[str, Any] = {"architectures": [architecture]}
        for name, hf in _hf_names(spec).items():
            if hf:
                out[hf] = self.embedding_width if name == "embedding_size" else getattr(self, name)
            elif getattr(self, name) != spec.defaults.get(name, _FIELD_DEFAULTS[name]):
                raise ConfigError(f"{name}={getattr(self, name)!r} cannot be saved in a transformers "
                                  f"{self.model_type} config.json (it has no key for it)")
        out.update({key: values[0] for key, values in (_HF_REQUIRED_VALUES | spec.hf_constants).items()
                    if key not in ("is_decoder", "add_cross_attention")})
        out["tie_word_embeddings"] = True
        if self.problem_type is None:  # transformers reads an absent key as None: a bare model's file stays as it was
            del out["problem_type"]
        if self.labels:
            out["id2label"] = {str(i): label for i, label in enumerate(self.labels)}
            out["label2id"] = {label: i for i, label in enumerate(self.labels)}
        return spec.hf_rewrite[1](out) if spec.hf_rewrite else out

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "EncoderConfig":
        """Read a Hugging Face config.json file."""
        path = Path(path)
        return cls.from_hf_dict(read_json_file(path, dict, ConfigError), source=str(path))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# What each field must be (any combination of the variant switches is a model we can build): a check and the words
# of its error ("num_heads must be a positive integer, got 0").
_POSITIVE = (lambda v: _is_int(v) and v > 0, "a positive integer")
_SWITCH = (lambda v: isinstance(v, bool), "true or false")
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **dict.fromkeys(("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings"), _POSITIVE),
    "hidden_act": (lambda v: v in ACTIVATION_NAMES, f"one of {sorted(ACTIVATION_NAMES)}"),
    **dict.fromkeys(("hidden_dropout", "attention_dropout"), (lambda v: _is_number(v) and 0 <= v < 1, "in [0, 1)")),
    **dict.fromkeys(("layer_norm_eps", "initializer_range", "initializer_cutoff_factor"),
                    (lambda v: _is_number(v) and v >= 0, "a number >= 0")),
    **dict.fromkeys(("type_vocab_size", "pad_token_id", "position_buckets"), (lambda v: _is_int(v) and v >= 0,
                                                                             "an integer >= 0")),
    "labels": (lambda v: v is None or isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "embedding_size": (lambda v: v is None or _is_int(v) and v > 0, "a positive integer or None"),
    **dict.fromkeys(("shared_layers", "positions_after_pad", "absolute_positions", "relative_attention", "pooler",
                     "always_project", "pre_norm", "gated_ffn", "bias"), _SWITCH),
    "head_activation": (lambda v: v is None or v in ACTIVATION_NAMES, f"None or one of {sorted(ACTIVATION_NAMES)}"),
    "max_relative_positions": (lambda v: _is_int(v) and (v == -1 or v > 0), "-1 or a positive integer"),
    **dict.fromkeys(("rope_theta", "local_rope_theta"), (lambda v: v is None or _is_number(v) and v > 0,
                                                         "a positive number or None")),
    "local_attention": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "global_attn_every_n_layers": _POSITIVE,
    "classifier_pooling": (lambda v: v in ("cls", "mean"), "'cls' or 'mean'"),
    **dict.fromkeys(("classifier_dense", "classifier_norm", "classifier_dropout_first", "task_transform"), _SWITCH),
    "classifier_activation": (lambda v: v is None or v in ("tanh", *ACTIVATION_NAMES),
                              f"None or one of {sorted(('tanh', *ACTIVATION_NAMES))}"),
    "problem_type": (lambda v: v is None or v in PROBLEM_TYPES, f"None or one of {list(PROBLEM_TYPES)}"),
}


# Fields BERT's config.json has no key for: only some families write them (through FamilyConfig.hf_names).
_VARIANT_FIELDS = ("shared_layers", "positions_after_pad", "absolute_positions", "relative_attention", "pooler",
                   "head_activation", "always_project", "embedding_size", "position_buckets", "max_relative_positions",
                   "rope_theta", "local_rope_theta", "local_attention", "global_attn_every_n_layers", "pre_norm",
                   "gated_ffn", "bias", "classifier_pooling", "initializer_cutoff_factor", "classifier_dense",
                   "classifier_activation", "classifier_norm", "classifier_dropout_first", "task_transform")
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EncoderConfig)}


@dataclass(frozen=True, kw_only=True)
class FamilyConfig:
    """What a family tells the config: its switches' values, presets and config.json names (models.FamilySpec)."""

    model_type: str
    """Hugging Face `model_type`."""
    presets: dict[str, dict] = field(default_factory=dict)
    """Preset name -> EncoderConfig fields (on top of `defaults`)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """EncoderConfig fields the family sets (its switches): applied under every preset and HF config."""
    hf_names: dict[str, str | None] = field(default_factory=dict)
    """Our field -> this family's config.json key, where it differs from BERT's (DistilBERT's `dim`) or is a
    field only this family writes (ALBERT's `embedding_size`); None: the family's config.json has no key for it."""
    hf_constants: dict[str, tuple] = field(default_factory=dict)
    """config.json keys that must hold one of these values (the first is written on export)."""
    hf_required: frozenset[str] = frozenset()
    """hf_constants keys that must be present: transformers reads their absence as a value we do not build."""
    hf_unused: frozenset[str] = frozenset()
    """config.json keys of this family that carry nothing the backbone uses (dropped on load)."""
    hf_rewrite: tuple[Callable[[dict], dict], Callable[[dict], dict]] | None = None
    """(read, write): the family's config.json dict to flat keys the names above map, and back (ModernBERT's
    per-layer lists and nested rope parameters)."""


_FAMILIES: dict[str, FamilyConfig] = {}


def register_family(family: FamilyConfig) -> None:
    """Make a family's presets and config.json names known (encoderlab.models registers each family on import)."""
    if family.model_type in _FAMILIES:
        raise ConfigError(f"family {family.model_type!r} is already registered; a second registration would replace "
                          f"its presets and config.json names (give the new family its own model_type)")
    _FAMILIES[family.model_type] = family


def presets() -> dict[str, dict]:
    """Preset name -> the EncoderConfig fields of every registered family's presets."""
    return {name: {"model_type": family.model_type, **family.defaults, **fields}
            for family in _FAMILIES.values() for name, fields in family.presets.items()}


def _labels(id2label: Any, source: str) -> list[str]:
    """Class names in id order from Hugging Face's id2label ({"0": "neg", "1": "pos"}): ids 0..N-1, names strings."""
    if not isinstance(id2label, dict) or not all(str(k).isdigit() and isinstance(v, str) for k, v in id2label.items()):
        raise ConfigError(f"{source}: id2label must map ids \"0\", \"1\", ... to label names, got {id2label!r}")
    ids = sorted(int(k) for k in id2label)
    if ids != list(range(len(ids))):
        raise ConfigError(f"{source}: id2label ids must be 0..{len(ids) - 1} without gaps, got {ids}")
    return [id2label[k] for k in sorted(id2label, key=int)]


def _one_of(value: Any, allowed: tuple) -> bool:
    """Whether a config.json value is one of the allowed ones (lists compared as sets: ["p2c", "c2p"])."""
    if isinstance(value, list):
        return any(isinstance(a, (list, tuple)) and sorted(map(str, value)) == sorted(map(str, a)) for a in allowed)
    return value in allowed


def _hf_names(spec: FamilyConfig) -> dict[str, str | None]:
    """Our field -> the family's config.json key; None where the family's config.json has no key for it."""
    names: dict[str, str | None] = {f.name: _HF_NAMES.get(f.name, f.name) for f in dataclasses.fields(EncoderConfig)
                                    if f.name not in _VARIANT_FIELDS and f.name != "labels"}
    return names | dict.fromkeys(_VARIANT_FIELDS) | spec.hf_names


def field_names() -> list[str]:
    """All EncoderConfig field names, for error messages and `--set` validation."""
    return [f.name for f in dataclasses.fields(EncoderConfig)]


__all__ = ["ACTIVATION_NAMES", "PROBLEM_TYPES", "EncoderConfig", "FamilyConfig", "field_names", "presets",
           "register_family"]
