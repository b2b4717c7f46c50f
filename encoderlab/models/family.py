"""FamilySpec: what ties one family (BERT, RoBERTa, ...) to Hugging Face: the switches it sets, how its config.json
names our fields and where its tensors live in a Hugging Face folder; each family module holds one."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoderlab.config import EncoderConfig, FamilyConfig


@dataclass(frozen=True)
class ClassifierHead:
    """The layout of a family's XForSequenceClassification head: BERT and ALBERT classify the pooled [CLS]; the others
    a dense layer and an activation on the first token, under their own tensor names."""

    dense: str | None = None
    """Hugging Face name prefix of the dense layer on the first token ("classifier.dense."); None: the head
    reads the backbone's [CLS] pooler."""
    activation: str | None = "tanh"
    """Activation after the dense layer; None: the config's hidden_act."""
    out: str = "classifier."
    """Hugging Face name prefix of the output layer (hidden -> labels)."""
    dropout_first: bool = True
    """Whether dropout also comes before the dense layer (DistilBERT has it only before the output layer)."""
    norm: str | None = None
    """Hugging Face name prefix of a LayerNorm after the activation ("head.norm."); None: no norm."""
    every_task: bool = False
    """The token-classification and QA heads also pass each token through dense, activation and norm, and QA's
    output layer is named `out` (ModernBERT: every task model has the same `head`)."""


@dataclass(frozen=True, kw_only=True)
class FamilySpec(FamilyConfig):
    """Everything that ties one family to Hugging Face: the config's part (FamilyConfig), class and weight names."""

    architectures: dict[str, str]
    """Our model kind ("base", "mlm", "pretraining", "rtd") -> Hugging Face class name."""
    base_prefix: str
    """Prefix of backbone weights inside Hugging Face head models ("bert.")."""
    weight_map: tuple[tuple[str, tuple[str, ...]], ...]
    """(our name prefix, Hugging Face name prefixes): several HF names are concatenated on dim 0 into ours.
    `{i}` stands for a layer index. Backbone entries start with "encoder." or "pooler." on our side."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Older HF weight names -> current names (e.g. LayerNorm.gamma -> LayerNorm.weight)."""
    tied: tuple[tuple[str, str], ...] = ()
    """(HF name, HF name) pairs that must hold the same tensor; the first is not stored by us."""
    ignored: tuple[str, ...] = ()
    """HF names of buffers that carry no weights (e.g. position_ids) and are dropped on load."""
    tokenizer_kind: str = "wordpiece"
    """The tokenizer the family was released with: wordpiece, bpe (byte-level) or unigram."""
    classifier_head: ClassifierHead = ClassifierHead()
    """The sequence-classification head of the family's XForSequenceClassification (default: BERT's)."""

    @property
    def pooler(self) -> bool:
        """Whether the family's bare model (BertModel, ...) has a [CLS] pooler (its `pooler` switch)."""
        return self.defaults.get("pooler", EncoderConfig.pooler)
