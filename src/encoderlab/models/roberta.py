"""RoBERTa (Liu et al. 2019, arXiv:1907.11692): BERT trained longer on more data, without NSP. Departures from BERT:
- positions count from pad_token_id + 1 and padding takes position pad_token_id (`positions_after_pad`,
  fairseq's make_positions), so the table has 514 rows for 512 tokens;
- one token type; LayerNorm epsilon 1e-5; byte-level BPE vocabulary of 50,265 (section 4.4);
- the MLM head is `lm_head.*` and always uses gelu;
- pretraining is MLM alone on packed full sentences with dynamic masking (objective `mlm`, section 4.2).
"""

from __future__ import annotations

from encoderlab.models.bert import backbone_map, preset, task_heads
from encoderlab.models.family import FamilySpec

# RobertaClassificationHead: the <s> vector -> dense -> tanh -> out_proj; the pooler goes unused.
DEFAULTS = {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1,
            "layer_norm_eps": 1e-5, "positions_after_pad": True, "head_activation": "gelu", "classifier_dense": True}


SPEC = FamilySpec(
    model_type="roberta",
    architectures={"base": "RobertaModel", "mlm": "RobertaForMaskedLM"},
    base_prefix="roberta.",
    weight_map=(
        *backbone_map(),
        ("pooler.dense.", ("pooler.dense.",)),
        ("mlm.transform.", ("lm_head.dense.",)),
        ("mlm.norm.", ("lm_head.layer_norm.",)),
        ("mlm.bias", ("lm_head.bias",)),
        *task_heads("classifier.out_proj.", "classifier.dense."),
    ),
    presets={"roberta-mini": preset(4, 256), "roberta-base": preset(12, 768), "roberta-large": preset(24, 1024)},
    aliases={"lm_head.decoder.bias": "lm_head.bias"},
    tied=(("lm_head.decoder.weight", "embeddings.word_embeddings.weight"),),
    ignored=("embeddings.position_ids", "embeddings.token_type_ids"),
    defaults=DEFAULTS,
    tokenizer_kind="bpe",
)
