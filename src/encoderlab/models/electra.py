"""ELECTRA (Clark et al. 2020, arXiv:2003.10555): a discriminator trained to spot replaced tokens. Departures from BERT:
- embeddings of width `embedding_size` projected to hidden_size where the two differ (`embeddings_project`);
  the generator and the discriminator share the embedding tables (section 3.2);
- no pooler; the discriminator head (`rtd`, HF ElectraForPreTraining) scores each token as replaced;
- the generator's MLM head (`generator_predictions`) always uses gelu;
- pretraining (objective `rtd`): generator MLM loss + 50 x discriminator loss (section 2, lambda = 50).
Sizes from table 6: small is 12 layers of 256 with 128-wide embeddings and 4 heads; base is BERT-base.
"""

from __future__ import annotations

from encoderlab.models.bert import backbone_map, task_heads
from encoderlab.models.family import FamilySpec

SPEC = FamilySpec(
    model_type="electra",
    architectures={"base": "ElectraModel", "mlm": "ElectraForMaskedLM", "rtd": "ElectraForPreTraining"},
    base_prefix="electra.",
    weight_map=(
        *backbone_map(),
        ("encoder.project.", ("embeddings_project.",)),
        ("mlm.transform.", ("generator_predictions.dense.",)),
        ("mlm.norm.", ("generator_predictions.LayerNorm.",)),
        ("mlm.bias", ("generator_lm_head.bias",)),
        ("rtd.dense.", ("discriminator_predictions.dense.",)),
        ("rtd.prediction.", ("discriminator_predictions.dense_prediction.",)),
        *task_heads("classifier.out_proj.", "classifier.dense."),
    ),
    presets={
        "electra-mini": {"num_layers": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024,
                         "embedding_size": 128},
        "electra-small": {"num_layers": 12, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024,
                          "embedding_size": 128},
        "electra-base": {},
        "electra-large": {"num_layers": 24, "hidden_size": 1024, "num_heads": 16, "intermediate_size": 4096},
    },
    tied=(("generator_lm_head.weight", "embeddings.word_embeddings.weight"),),
    ignored=("embeddings.position_ids", "embeddings.token_type_ids"),
    hf_names={"embedding_size": "embedding_size"},
    hf_unused=frozenset({"summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout",
                         "summary_first_dropout", "classifier_dropout"}),
    # ElectraClassificationHead: RoBERTa's layout with gelu in place of tanh, whatever hidden_act says.
    defaults={"pooler": False, "head_activation": "gelu", "classifier_dense": True, "classifier_activation": "gelu"},
)
