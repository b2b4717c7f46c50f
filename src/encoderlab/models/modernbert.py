"""ModernBERT (Warner et al. 2024, arXiv:2412.13663), also the architecture of its successors Ettin and mmBERT
(model_type "modernbert"). Departures from BERT (section 2.1), each a switch:
- rotary positions, base 160,000 in global and 10,000 in local layers, and no position table (`rope_theta`,
  `local_rope_theta`, `absolute_positions`); no token types;
- alternating attention: a sliding window of 128 tokens (`local_attention`), global every third layer
  (`global_attn_every_n_layers`; transformers' config.json lists each layer in `layer_types`);
- GeGLU feed-forward (`gated_ffn`); pre-LayerNorm blocks with a norm after the embeddings and a final one
  (`pre_norm`); no biases in linear or norm layers (`bias`); LayerNorm epsilon 1e-5; no dropout;
- the MLM head is dense, gelu, norm and the tied decoder with a bias; the classification head reads the first token
  or the mean (`classifier_pooling`) through the same dense, gelu and norm, as do the token and QA heads;
- a BPE vocabulary of 50,368 ids (a multiple of 64), padding id 50283.
Left out, and refused in config.json: biases (attention_bias, mlp_bias, norm_bias, classifier_bias), a decoder
without bias, RoPE scaling, and a layer pattern that is not "global every n-th". Unpadding is a speed path, not a
different model.
"""

from __future__ import annotations

from encoderlab.errors import ConfigError
from encoderlab.models.family import FamilySpec

_LAYER = "layers.{i}."
_TYPES = ("full_attention", "sliding_attention")  # transformers' layer_types: global, local
_ROPE = (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta"))


def _layer_types(every: int, count: int) -> list[str]:
    """transformers' layer_types of `count` layers, global every `every`-th from layer 0."""
    return [_TYPES[i % every != 0] for i in range(count)]


def _read(data: dict) -> dict:
    """config.json -> flat keys: `layer_types` as global_attn_every_n_layers, `rope_parameters` as the two thetas
    (transformers >= 5 writes these; older files hold the flat keys already)."""
    data = dict(data)
    types = data.pop("layer_types", None)
    if types is not None:  # the file's own n first: with few layers, several n give the same list
        given = data.get("global_attn_every_n_layers")
        candidates = ([given] if isinstance(given, int) and given > 0 else []) + list(range(1, len(types) + 1))
        every = next((n for n in candidates if _layer_types(n, len(types)) == types), None)
        if every is None:
            raise ConfigError(f"layer_types {types} is not global every n-th layer from layer 0")
        data["global_attn_every_n_layers"] = every
    rope = data.pop("rope_parameters", None) or {}
    for kind, key in _ROPE:
        params = dict(rope.get(kind) or {})
        if params.pop("rope_type", "default") != "default" or set(params) - {"rope_theta"}:
            raise ConfigError(f"rope_parameters[{kind!r}] is not plain RoPE ({{'rope_type': 'default'}})")
        if "rope_theta" in params:
            data[key] = params["rope_theta"]
    return data


def _write(out: dict) -> dict:
    """Flat keys -> config.json with transformers' layer_types and rope_parameters too (older versions read the
    flat keys, newer ones these)."""
    every = out["global_attn_every_n_layers"] if out["local_attention"] else 1  # no window: every layer global
    out["layer_types"] = _layer_types(every, out["num_hidden_layers"])
    out["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": out[key]} for kind, key in _ROPE}
    out.pop("position_embedding_type", None)  # BERT's key: ModernBERT has no position table to name
    return out


def _preset(layers: int, hidden: int, intermediate: int, heads: int) -> dict:
    return {"num_layers": layers, "hidden_size": hidden, "intermediate_size": intermediate, "num_heads": heads}


SPEC = FamilySpec(
    model_type="modernbert",
    architectures={"base": "ModernBertModel", "mlm": "ModernBertForMaskedLM"},
    base_prefix="model.",
    weight_map=(
        ("encoder.embeddings.word.", ("embeddings.tok_embeddings.",)),
        ("encoder.embeddings.norm.", ("embeddings.norm.",)),
        ("encoder.layers.{i}.attn.qkv.", (f"{_LAYER}attn.Wqkv.",)),
        ("encoder.layers.{i}.attn.out.", (f"{_LAYER}attn.Wo.",)),
        ("encoder.layers.{i}.attn_norm.", (f"{_LAYER}attn_norm.",)),
        ("encoder.layers.{i}.mlp.up.", (f"{_LAYER}mlp.Wi.",)),  # value and gate halves, in that order
        ("encoder.layers.{i}.mlp.down.", (f"{_LAYER}mlp.Wo.",)),
        ("encoder.layers.{i}.mlp_norm.", (f"{_LAYER}mlp_norm.",)),
        ("encoder.final_norm.", ("final_norm.",)),
        ("mlm.transform.", ("head.dense.",)),
        ("mlm.norm.", ("head.norm.",)),
        ("mlm.bias", ("decoder.bias",)),
        # Every task model has ModernBertPredictionHead (head.dense, classifier_activation, head.norm) before its
        # output layer `classifier`: ours are head.* (sequence) and transform.* (tokens, spans).
        ("head.dense.", ("head.dense.",)),
        ("head.norm.", ("head.norm.",)),
        ("head.out.", ("classifier.",)),
        ("transform.dense.", ("head.dense.",)),
        ("transform.norm.", ("head.norm.",)),
        ("classifier.", ("classifier.",)),
        ("qa_outputs.", ("classifier.",)),
    ),
    presets={
        # Ours, for tests and quick runs: not an Answer.AI release.
        "modernbert-mini": _preset(4, 256, 384, 4),
        # The released shapes (arXiv:2412.13663, table 8; answerdotai/ModernBERT-* config.json).
        "modernbert-base": _preset(22, 768, 1152, 12),
        "modernbert-large": _preset(28, 1024, 2624, 16),
    },
    tied=(("decoder.weight", "embeddings.tok_embeddings.weight"),),
    defaults={"vocab_size": 50368, "max_position_embeddings": 8192, "type_vocab_size": 0, "pad_token_id": 50283,
              "layer_norm_eps": 1e-5, "hidden_dropout": 0.0, "attention_dropout": 0.0, "absolute_positions": False,
              "pooler": False, "head_activation": "gelu", "rope_theta": 160000.0, "local_rope_theta": 10000.0,
              "local_attention": 128, "global_attn_every_n_layers": 3, "pre_norm": True, "gated_ffn": True,
              "bias": False, "initializer_cutoff_factor": 2.0, "classifier_dense": True, "classifier_activation": None,
              "classifier_norm": True, "classifier_dropout_first": False, "task_transform": True},
    hf_names={"hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps", "hidden_dropout": "embedding_dropout",
              "type_vocab_size": None, "head_activation": "classifier_activation", "rope_theta": "global_rope_theta",
              **{name: name for name in ("attention_dropout", "local_rope_theta", "local_attention",
                                         "global_attn_every_n_layers", "classifier_pooling",
                                         "initializer_cutoff_factor")}},
    hf_constants={"attention_bias": (False,), "mlp_bias": (False,), "norm_bias": (False,),
                  "classifier_bias": (False,), "decoder_bias": (True,)},
    # Training-only (dropout rates, flash-attn flags) or other token ids: nothing the forward pass reads.
    hf_unused=frozenset({"mlp_dropout", "deterministic_flash_attn", "sparse_prediction",
                         "sparse_pred_ignore_index", "cls_token_id", "reference_compile", "repad_logits_with_grad"}),
    hf_rewrite=(_read, _write),
    tokenizer_kind="bpe",
)
