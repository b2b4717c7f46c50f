"""BERT (Devlin et al. 2019, arXiv:1810.04805): the reference family every other variant departs from.

Presets follow Google's BERT release: bert-base/large from the paper (table in section 3), and the compact models
bert-tiny ... bert-medium of Turc et al. 2019 ("Well-Read Students Learn Better", arXiv:1908.08962), all with 4x
feed-forward width and 64-wide heads."""

from __future__ import annotations

from encoderlab.models.family import FamilySpec


def preset(layers: int, hidden: int) -> dict:
    """BERT's shape, which RoBERTa, ALBERT and DeBERTa-v3 keep: heads of width 64, feed-forward 4x hidden."""
    return {"num_layers": layers, "hidden_size": hidden, "num_heads": hidden // 64, "intermediate_size": 4 * hidden}


PRESETS = {
    "bert-tiny": preset(2, 128),
    "bert-mini": preset(4, 256),
    "bert-small": preset(4, 512),
    "bert-medium": preset(8, 512),
    "bert-base": preset(12, 768),
    "bert-large": preset(24, 1024),
}

def backbone_map(projection: str = "") -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The encoder's weight names as BERT lays them out; RoBERTa and ELECTRA keep them, DeBERTa names its attention
    projections query_proj, ... (projection "_proj") and has no position table (that rule goes unused)."""
    layer = "encoder.layer.{i}."
    qkv = tuple(f"{layer}attention.self.{p}{projection}." for p in ("query", "key", "value"))
    return (
        ("encoder.embeddings.word.", ("embeddings.word_embeddings.",)),
        ("encoder.embeddings.position.", ("embeddings.position_embeddings.",)),
        ("encoder.embeddings.segment.", ("embeddings.token_type_embeddings.",)),
        ("encoder.embeddings.norm.", ("embeddings.LayerNorm.",)),
        ("encoder.layers.{i}.attn.qkv.", qkv),
        ("encoder.layers.{i}.attn.out.", (f"{layer}attention.output.dense.",)),
        ("encoder.layers.{i}.attn_norm.", (f"{layer}attention.output.LayerNorm.",)),
        ("encoder.layers.{i}.mlp.up.", (f"{layer}intermediate.dense.",)),
        ("encoder.layers.{i}.mlp.down.", (f"{layer}output.dense.",)),
        ("encoder.layers.{i}.mlp_norm.", (f"{layer}output.LayerNorm.",)),
    )


def task_heads(out: str = "classifier.", dense: str | None = None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The task heads' rows: XForSequenceClassification's output layer `out` and dense layer (classifier_dense),
    XForTokenClassification's classifier, XForQuestionAnswering's qa_outputs."""
    dense_row = (("head.dense.", (dense,)),) if dense else ()
    return (*dense_row, ("head.out.", (out,)), ("classifier.", ("classifier.",)), ("qa_outputs.", ("qa_outputs.",)))


WEIGHT_MAP = (
    *backbone_map(),
    ("pooler.dense.", ("pooler.dense.",)),
    ("mlm.transform.", ("cls.predictions.transform.dense.",)),
    ("mlm.norm.", ("cls.predictions.transform.LayerNorm.",)),
    ("mlm.bias", ("cls.predictions.bias",)),
    ("nsp.classifier.", ("cls.seq_relationship.",)),
    *task_heads(),
)

SPEC = FamilySpec(
    model_type="bert",
    architectures={"base": "BertModel", "mlm": "BertForMaskedLM", "pretraining": "BertForPreTraining"},
    base_prefix="bert.",
    weight_map=WEIGHT_MAP,
    presets=PRESETS,
    aliases={"cls.predictions.decoder.bias": "cls.predictions.bias"},
    tied=(("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),),
    ignored=("embeddings.position_ids",),
)
