"""Model families, one module each with its FamilySpec. Importing this package registers every family with
EncoderConfig: adding a family means one module here and one entry in FAMILIES."""

from __future__ import annotations

from encoderlab.config import presets, register_family
from encoderlab.models import albert, bert, deberta, distilbert, electra, modernbert, roberta
from encoderlab.models.family import FamilySpec

FAMILIES: dict[str, FamilySpec] = {spec.model_type: spec for spec in (bert.SPEC, roberta.SPEC, distilbert.SPEC,
                                                                      albert.SPEC, electra.SPEC, deberta.SPEC,
                                                                      modernbert.SPEC)}
for _spec in FAMILIES.values():
    register_family(_spec)
PRESETS: dict[str, dict] = presets()

__all__ = ["FAMILIES", "PRESETS", "FamilySpec"]
