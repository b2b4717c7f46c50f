"""Model families: each module holds a FamilySpec (presets, Hugging Face names, weight map, switches).

A family is BERT plus a few config switches (see ../shared/STYLE.md): the spec says which switches it sets
(`defaults`), how its config.json names our fields, and where its tensors live in a Hugging Face folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClassifierHead:
    """The layout of a family's sequence-classification head (transformers' XForSequenceClassification).

    BERT and ALBERT classify the pooled [CLS] vector; the others put a dense layer and an activation on the
    first token's vector instead, under their own tensor names.
    """

    dense: str | None = None
    """Hugging Face name prefix of the dense layer on the first token ("classifier.dense."); None: the head
    reads the backbone's [CLS] pooler."""
    activation: str | None = "tanh"
    """Activation after the dense layer; None: the config's hidden_act."""
    out: str = "classifier."
    """Hugging Face name prefix of the output layer (hidden -> labels)."""
    dropout_first: bool = True
    """Whether dropout also comes before the dense layer (DistilBERT has it only before the output layer)."""


@dataclass(frozen=True)
class FamilySpec:
    """Everything that ties one family (BERT, RoBERTa, ...) to Hugging Face: names, presets, weight map."""

    model_type: str
    """Hugging Face `model_type`."""
    architectures: dict[str, str]
    """Our model kind ("base", "mlm", "pretraining", "rtd") -> Hugging Face class name."""
    base_prefix: str
    """Prefix of backbone weights inside Hugging Face head models ("bert.")."""
    weight_map: tuple[tuple[str, tuple[str, ...]], ...]
    """(our name prefix, Hugging Face name prefixes): several HF names are concatenated on dim 0 into ours.
    `{i}` stands for a layer index. Backbone entries start with "encoder." or "pooler." on our side."""
    presets: dict[str, dict] = field(default_factory=dict)
    """Preset name -> EncoderConfig fields (on top of `defaults`)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Older HF weight names -> current names (e.g. LayerNorm.gamma -> LayerNorm.weight)."""
    tied: tuple[tuple[str, str], ...] = ()
    """(HF name, HF name) pairs that must hold the same tensor; the first is not stored by us."""
    ignored: tuple[str, ...] = ()
    """HF names of buffers that carry no weights (e.g. position_ids) and are dropped on load."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """EncoderConfig fields the family fixes (its switches): applied under every preset and HF config."""
    hf_names: dict[str, str] = field(default_factory=dict)
    """Our field -> this family's config.json key, where it differs from BERT's (DistilBERT's `dim`) or is a
    field only this family writes (ALBERT's `embedding_size`)."""
    hf_constants: dict[str, tuple] = field(default_factory=dict)
    """config.json keys that must hold one of these values (the first is written on export)."""
    hf_required: frozenset[str] = frozenset()
    """hf_constants keys that must be present: transformers reads their absence as a value we do not build."""
    hf_unused: frozenset[str] = frozenset()
    """config.json keys of this family that carry nothing the backbone uses (dropped on load)."""
    pooler: bool = True
    """Whether the family's bare model (BertModel, ...) has a [CLS] pooler."""
    head_activation: str | None = None
    """Activation of the MLM head's transform when it is fixed rather than `hidden_act` (RoBERTa: gelu)."""
    always_project: bool = False
    """Whether the embeddings are projected to hidden_size even at equal widths (ALBERT's mapping layer)."""
    tokenizer_kind: str = "wordpiece"
    """The tokenizer the family was released with: wordpiece, bpe (byte-level) or unigram."""
    classifier_head: ClassifierHead = ClassifierHead()
    """The sequence-classification head of the family's XForSequenceClassification (default: BERT's)."""


def _families() -> dict[str, FamilySpec]:
    from encoderlab.models import albert, bert, deberta, distilbert, electra, roberta

    return {spec.model_type: spec for spec in (bert.SPEC, roberta.SPEC, distilbert.SPEC, albert.SPEC, electra.SPEC,
                                               deberta.SPEC)}


FAMILIES: dict[str, FamilySpec] = _families()
PRESETS: dict[str, dict] = {name: {"model_type": spec.model_type, **spec.defaults, **fields}
                            for spec in FAMILIES.values() for name, fields in spec.presets.items()}
