"""Model families: each module holds a FamilySpec (presets, Hugging Face names, weight map)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FamilySpec:
    """Everything that ties one family (BERT, RoBERTa, ...) to Hugging Face: names, presets, weight map."""

    model_type: str
    """Hugging Face `model_type`."""
    architectures: dict[str, str]
    """Our model kind ("base", "mlm", "pretraining") -> Hugging Face class name."""
    base_prefix: str
    """Prefix of backbone weights inside Hugging Face head models ("bert.")."""
    weight_map: tuple[tuple[str, tuple[str, ...]], ...]
    """(our name prefix, Hugging Face name prefixes): several HF names are concatenated on dim 0 into ours.
    `{i}` stands for a layer index. Backbone entries start with "encoder." or "pooler." on our side."""
    presets: dict[str, dict] = field(default_factory=dict)
    """Preset name -> EncoderConfig fields."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Older HF weight names -> current names (e.g. LayerNorm.gamma -> LayerNorm.weight)."""
    tied: tuple[tuple[str, str], ...] = ()
    """(HF name, HF name) pairs that must hold the same tensor; the first is not stored by us."""
    ignored: tuple[str, ...] = ()
    """HF names of buffers that carry no weights (e.g. position_ids) and are dropped on load."""


def _families() -> dict[str, FamilySpec]:
    from encoderlab.models import bert

    return {spec.model_type: spec for spec in (bert.SPEC,)}


FAMILIES: dict[str, FamilySpec] = _families()
PRESETS: dict[str, dict] = {name: {"model_type": spec.model_type, **fields}
                            for spec in FAMILIES.values() for name, fields in spec.presets.items()}
