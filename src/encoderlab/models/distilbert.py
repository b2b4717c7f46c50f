"""DistilBERT (Sanh et al. 2019, arXiv:1910.01108): a 6-layer BERT distilled from a 12-layer teacher. Departures:
- half the layers, no token types and no pooler (section 3: "the token-type embeddings and the pooler
  are removed"); the student starts from every other layer of the teacher (objective `distill`);
- its own weight and config.json names (`dim`, `n_layers`, `q_lin`, `sa_layer_norm`, ...); the LayerNorm
  epsilon is fixed at 1e-12 in transformers, so config.json has no key for it.
"""

from __future__ import annotations

from encoderlab.models.bert import task_heads
from encoderlab.models.family import FamilySpec

_LAYER = "transformer.layer.{i}."

SPEC = FamilySpec(
    model_type="distilbert",
    architectures={"base": "DistilBertModel", "mlm": "DistilBertForMaskedLM"},
    base_prefix="distilbert.",
    weight_map=(
        ("encoder.embeddings.word.", ("embeddings.word_embeddings.",)),
        ("encoder.embeddings.position.", ("embeddings.position_embeddings.",)),
        ("encoder.embeddings.norm.", ("embeddings.LayerNorm.",)),
        ("encoder.layers.{i}.attn.qkv.", tuple(f"{_LAYER}attention.{p}_lin." for p in "qkv")),
        ("encoder.layers.{i}.attn.out.", (f"{_LAYER}attention.out_lin.",)),
        ("encoder.layers.{i}.attn_norm.", (f"{_LAYER}sa_layer_norm.",)),
        ("encoder.layers.{i}.mlp.up.", (f"{_LAYER}ffn.lin1.",)),
        ("encoder.layers.{i}.mlp.down.", (f"{_LAYER}ffn.lin2.",)),
        ("encoder.layers.{i}.mlp_norm.", (f"{_LAYER}output_layer_norm.",)),
        ("mlm.transform.", ("vocab_transform.",)),
        ("mlm.norm.", ("vocab_layer_norm.",)),
        ("mlm.bias", ("vocab_projector.bias",)),
        *task_heads(dense="pre_classifier."),
    ),
    presets={
        "distilbert-mini": {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024},
        "distilbert-base": {"num_layers": 6},
    },
    tied=(("vocab_projector.weight", "embeddings.word_embeddings.weight"),),
    ignored=("embeddings.position_ids",),
    # DistilBertForSequenceClassification: the first token -> pre_classifier -> ReLU -> dropout -> classifier.
    defaults={"type_vocab_size": 0, "layer_norm_eps": 1e-12, "pooler": False, "classifier_dense": True,
              "classifier_activation": "relu", "classifier_dropout_first": False},
    hf_names={"hidden_size": "dim", "num_layers": "n_layers", "num_heads": "n_heads", "intermediate_size": "hidden_dim",
              "hidden_dropout": "dropout", "attention_dropout": "attention_dropout", "hidden_act": "activation",
              "type_vocab_size": None, "layer_norm_eps": None},
    hf_constants={"sinusoidal_pos_embds": (False,)},
    hf_unused=frozenset({"qa_dropout", "seq_classif_dropout", "tie_weights_"}),
)
