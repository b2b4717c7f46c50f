"""ALBERT (Lan et al. 2019, arXiv:1909.11942): BERT with far fewer parameters. Departures (section 3.1), each a switch:
- factorized embeddings: tables of width `embedding_size` (128) projected up to hidden_size; transformers
  always has that projection, even when the widths are equal;
- cross-layer sharing: one block's weights used by all layers (`shared_layers`);
- sentence-order prediction instead of NSP (objective `mlm+sop`; the head is `sop_classifier`);
- the MLM head maps back down to embedding_size before the tied decoder; a Unigram (SentencePiece) vocabulary
  of 30,000; no dropout in the v2 models; gelu_new.
"""

from __future__ import annotations

from encoderlab.models.bert import backbone_map, preset, task_heads
from encoderlab.models.family import FamilySpec

_LAYER = "encoder.albert_layer_groups.0.albert_layers.{i}."


SPEC = FamilySpec(
    model_type="albert",
    architectures={"base": "AlbertModel", "mlm": "AlbertForMaskedLM", "pretraining": "AlbertForPreTraining"},
    base_prefix="albert.",
    weight_map=(
        *backbone_map()[:4],  # BERT's embedding tables and LayerNorm
        ("encoder.project.", ("encoder.embedding_hidden_mapping_in.",)),
        ("encoder.layers.{i}.attn.qkv.", tuple(f"{_LAYER}attention.{p}." for p in ("query", "key", "value"))),
        ("encoder.layers.{i}.attn.out.", (f"{_LAYER}attention.dense.",)),
        ("encoder.layers.{i}.attn_norm.", (f"{_LAYER}attention.LayerNorm.",)),
        ("encoder.layers.{i}.mlp.up.", (f"{_LAYER}ffn.",)),
        ("encoder.layers.{i}.mlp.down.", (f"{_LAYER}ffn_output.",)),
        ("encoder.layers.{i}.mlp_norm.", (f"{_LAYER}full_layer_layer_norm.",)),
        ("pooler.dense.", ("pooler.",)),
        ("mlm.transform.", ("predictions.dense.",)),
        ("mlm.norm.", ("predictions.LayerNorm.",)),
        ("mlm.bias", ("predictions.bias",)),
        ("nsp.classifier.", ("sop_classifier.classifier.",)),
        *task_heads(),
    ),
    # Table 1's shapes are BERT's, with 128-wide embeddings (defaults).
    presets={"albert-mini": preset(4, 256), "albert-base": preset(12, 768), "albert-large": preset(24, 1024)},
    aliases={"predictions.decoder.bias": "predictions.bias"},
    tied=(("predictions.decoder.weight", "embeddings.word_embeddings.weight"),),
    ignored=("embeddings.position_ids", "embeddings.token_type_ids"),
    defaults={"vocab_size": 30000, "embedding_size": 128, "shared_layers": True, "always_project": True,
              "hidden_act": "gelu_new", "hidden_dropout": 0.0, "attention_dropout": 0.0},
    hf_names={"embedding_size": "embedding_size"},
    hf_constants={"num_hidden_groups": (1,), "inner_group_num": (1,)},
    hf_unused=frozenset({"classifier_dropout_prob"}),
    tokenizer_kind="unigram",
)
