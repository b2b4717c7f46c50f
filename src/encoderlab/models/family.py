"""FamilySpec: what ties one family (BERT, RoBERTa, ...) to Hugging Face: the switches it sets, how its config.json
names our fields and where its tensors live in a Hugging Face folder; each family module holds one."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoderlab.config import EncoderConfig, FamilyConfig


@dataclass(frozen=True, kw_only=True)
class FamilySpec(FamilyConfig):
    """Everything that ties one family to Hugging Face: the config's part (FamilyConfig), class and weight names."""

    architectures: dict[str, str]
    """Our model kind ("base", "mlm", "pretraining", "rtd") -> Hugging Face class name."""
    base_prefix: str
    """Prefix of backbone weights inside Hugging Face head models ("bert.")."""
    weight_map: tuple[tuple[str, tuple[str, ...]], ...]
    """(our name prefix, Hugging Face name prefixes): several HF names are concatenated on dim 0 into ours.
    `{i}` stands for a layer index. Backbone entries start with "encoder." or "pooler." on our side; the task heads'
    rows (our "head.", "transform.", "classifier.", "qa_outputs.") name the XFor... classes' own tensors, unprefixed."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Older HF weight names -> current names (e.g. LayerNorm.gamma -> LayerNorm.weight)."""
    tied: tuple[tuple[str, str], ...] = ()
    """(HF name, HF name) pairs that must hold the same tensor; the first is not stored by us."""
    ignored: tuple[str, ...] = ()
    """HF names of buffers that carry no weights (e.g. position_ids) and are dropped on load."""
    tokenizer_kind: str = "wordpiece"
    """The tokenizer the family was released with: wordpiece, bpe (byte-level) or unigram."""

    @property
    def pooler(self) -> bool:
        """Whether the family's bare model (BertModel, ...) has a [CLS] pooler (its `pooler` switch)."""
        return self.defaults.get("pooler", EncoderConfig.pooler)
