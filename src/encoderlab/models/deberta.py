"""DeBERTa-v3 (He et al. 2021, arXiv:2111.09543) on DeBERTa's disentangled attention (arXiv:2006.03654); transformers'
model_type "deberta-v2"; "v2 notes": the "New in v2" list of the microsoft/DeBERTa README. Departures from BERT:
- disentangled attention over relative positions in every block (`relative_attention`, nn/disentangled.py):
  content-to-position and position-to-content terms (arXiv:2006.03654, section 3.1) projected with the
  content's own query and key matrices (share_att_key, v2 notes), distances log-bucketed into 2 x 256 rows
  (`position_buckets`, v2 notes);
- the relative table and its LayerNorm live in the encoder (encoder.rel_embeddings, encoder.LayerNorm);
- no absolute position table (position_biased_input false: `absolute_positions`), no token types; padded
  embeddings are zeroed and padded queries attend to nothing, as in the released code;
- no pooler; the MLM head is BERT's (transformers' `legacy` head); LayerNorm epsilon 1e-7;
  a SentencePiece (Unigram) vocabulary of 128K pieces (v2 notes; 128,100 ids).
Left out, and refused in config.json: nGiE's convolution beside the first layer (v2 notes) and separate
position projections (DeBERTa-v2 xlarge and v1), other pos_att_type, an un-normalized table, absolute positions.
DeBERTa-v3's RTD pretraining with gradient-disentangled embedding sharing (arXiv:2111.09543, section 3) is an
objective, not part of this module.
"""

from __future__ import annotations

from encoderlab.models.bert import backbone_map, preset, task_heads
from encoderlab.models.family import FamilySpec


def _preset(layers: int, hidden: int) -> dict:
    """A DeBERTa-v3 shape: BERT's, with 256 position buckets each side."""
    return preset(layers, hidden) | {"position_buckets": 256}


PRESETS = {
    # Ours, for tests and quick runs; not a Microsoft release.
    "deberta-v3-mini": _preset(4, 256),
    # The released models (microsoft/deberta-v3-* config.json files; arXiv:2111.09543, section 5).
    "deberta-v3-xsmall": _preset(12, 384),
    "deberta-v3-small": _preset(6, 768),
    "deberta-v3-base": _preset(12, 768),
    "deberta-v3-large": _preset(24, 1024),
}

SPEC = FamilySpec(
    model_type="deberta-v2",
    architectures={"base": "DebertaV2Model", "mlm": "DebertaV2ForMaskedLM"},
    base_prefix="deberta.",
    weight_map=(
        *backbone_map("_proj"),
        ("encoder.relative.table.", ("encoder.rel_embeddings.",)),
        ("encoder.relative.norm.", ("encoder.LayerNorm.",)),
        ("mlm.transform.", ("cls.predictions.transform.dense.",)),
        ("mlm.norm.", ("cls.predictions.transform.LayerNorm.",)),
        ("mlm.bias", ("cls.predictions.bias",)),
        # DebertaV2ForSequenceClassification's ContextPooler: dropout, pooler.dense, pooler_hidden_act on the first
        # token, then dropout and classifier (the pooler is the head's, unprefixed, not the backbone's).
        *task_heads(dense="pooler.dense."),
    ),
    presets=PRESETS,
    aliases={"cls.predictions.decoder.bias": "cls.predictions.bias"},
    tied=(("cls.predictions.decoder.weight", "embeddings.word_embeddings.weight"),),
    ignored=("embeddings.position_ids",),
    # position_buckets is not fixed here: a config.json without it means no buckets, as in transformers.
    defaults={"vocab_size": 128100, "type_vocab_size": 0, "layer_norm_eps": 1e-7, "relative_attention": True,
              "absolute_positions": False, "pooler": False, "classifier_dense": True, "classifier_activation": "gelu"},
    hf_names={"position_buckets": "position_buckets", "max_relative_positions": "max_relative_positions",
              "classifier_activation": "pooler_hidden_act"},  # gelu in every released v3 config
    hf_constants={
        "relative_attention": (True,),
        "pos_att_type": (["p2c", "c2p"], "p2c|c2p", "c2p|p2c"),  # a list, or the "|"-joined string of v3's files
        "share_att_key": (True,),
        "norm_rel_ebd": ("layer_norm",),
        "position_biased_input": (False,),
        "conv_kernel_size": (0,),
        "legacy": (True,),  # the MLM head under cls.predictions.*, laid out as BERT's
    },
    # transformers reads an absent key as relative_attention false, no pos_att_type, share_att_key false,
    # norm_rel_ebd "none" and position_biased_input true (DebertaV2Config and its modeling code)
    hf_required=frozenset({"relative_attention", "pos_att_type", "share_att_key", "norm_rel_ebd",
                           "position_biased_input"}),
    hf_unused=frozenset({"pooler_dropout", "pooler_hidden_size", "conv_act", "conv_groups"}),
    tokenizer_kind="unigram",
)
