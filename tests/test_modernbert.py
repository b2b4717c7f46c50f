"""ModernBERT beyond the parity tests every family shares (test_family.py, test_tasks_family.py): sequences several
times longer than the local window through global and local layers with distinct rotary bases, the window in the
attention maps, mean pooling, and the config.json layouts transformers has written (flat keys before v5,
layer_types and rope_parameters since), with the settings we refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from torch.testing import assert_close

from hf_oracle import TOL, randomize
from test_family import family_batch, hf_class, hf_forward, save_tiny_hf, tiny_config
from test_tasks_family import outputs

from encoderlab import EncoderConfig, load_model, save_pretrained
from encoderlab.errors import ConfigError
from encoderlab.nn import attention as attention_module
from encoderlab.nn import window
from encoderlab.nn.model import EncoderModel, MaskedLMModel, SequenceClassifier
from encoderlab.nn.window import Band

# Four layers: 0 and 3 global, 1 and 2 local with a window of 6 (3 each side); rotary bases far apart, so a layer
# that used the other's base would not match.
LONG = {"num_hidden_layers": 4, "local_attention": 6, "global_rope_theta": 1000.0, "local_rope_theta": 10.0}
LENGTHS = (29, 17, 5)
TINY_HF = {"vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 37,
           "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
           "sep_token_id": 2}


def long_folder(kind: str, folder: Path, **changes) -> Path:
    """A tiny random transformers ModernBERT of `kind` with LONG's layers, saved into folder."""
    config = transformers.ModernBertConfig(**{**TINY_HF, **LONG, **changes})
    torch.manual_seed(0)
    model = hf_class("modernbert", kind)(config)
    randomize(model)
    model.save_pretrained(folder)
    return folder


def test_sequences_longer_than_the_window_match_transformers(tmp_path: Path) -> None:
    """Eager on both sides: every hidden state and attention map, padding included; SDPA: the last hidden state."""
    folder = long_folder("base", tmp_path)
    ours = load_model(folder)
    assert [ours.config.is_local(i) for i in range(4)] == [False, True, True, False]
    batch = family_batch(ours.config, lengths=LENGTHS)
    eager = hf_class("modernbert", "base").from_pretrained(folder, attn_implementation="eager").eval()
    ref = hf_forward(eager, batch, output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        out = ours(**batch, output_hidden_states=True, output_attentions=True)
        fast = ours(**batch)
    for mine, theirs in zip(out.hidden_states + out.attentions, ref.hidden_states + ref.attentions, strict=True):
        assert_close(mine, theirs, **TOL)
    sdpa = hf_class("modernbert", "base").from_pretrained(folder, attn_implementation="sdpa").eval()
    real = batch["attention_mask"].bool()
    assert_close(fast.last_hidden_state[real], hf_forward(sdpa, batch).last_hidden_state[real], **TOL)
    assert_close(fast.last_hidden_state[real], out.last_hidden_state[real], **TOL)


def test_local_layers_attend_only_within_the_window() -> None:
    config = tiny_config("modernbert").replace(num_layers=4, local_attention=6)
    model = EncoderModel(config).eval()
    randomize(model, seed=1)
    with torch.no_grad():
        maps = model(family_batch(config, lengths=(20,))["input_ids"], output_attentions=True).attentions
    i = torch.arange(20)
    outside = (i[:, None] - i[None, :]).abs() > 3
    for local in maps[1:3]:
        assert (local[..., outside] == 0).all() and (local[..., ~outside] > 0).all()
    assert (maps[0] > 0).all() and (maps[3] > 0).all()  # global


def test_padding_changes_nothing_for_the_real_tokens() -> None:
    model = EncoderModel(tiny_config("modernbert").replace(num_layers=3, local_attention=6)).eval()
    randomize(model, seed=2)
    batch = family_batch(model.config, lengths=(25, 12))
    with torch.no_grad():
        padded = model(**batch).last_hidden_state
        alone = model(batch["input_ids"][1:, :12]).last_hidden_state
    assert_close(padded[1:, :12], alone, **TOL)


@pytest.mark.parametrize("lengths", [(29, 17, 5), (40,) * 4 + (33, 9, 3, 1)], ids=["padded", "packed"])
def test_banded_local_attention_equals_the_dense_window(monkeypatch, lengths) -> None:
    """Local layers in blocks (nn/window.py) give the dense band mask's outputs, on the padded path and on packed
    tokens (>= 256 in the batch), with lengths that are not a multiple of the block; fp32 and gradients too."""
    model = EncoderModel(tiny_config("modernbert").replace(num_layers=3, local_attention=6)).eval()
    randomize(model, seed=3)
    batch = family_batch(model.config, lengths=lengths)
    T, real = batch["input_ids"].shape[1], batch["attention_mask"].bool()
    assert Band(3, None).banded(T) and window.banded_attention  # the blocks run at this length
    runs = {}
    for name, start in (("banded", window.BANDED_FROM), ("dense", 10**6)):
        monkeypatch.setattr(window, "BANDED_FROM", start)
        model.zero_grad()
        hidden = model(**batch).last_hidden_state
        hidden[real].square().sum().backward()
        runs[name] = hidden[real].detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert_close(runs["banded"][0], runs["dense"][0], **TOL)
    for a, b in zip(runs["banded"][1], runs["dense"][1], strict=True):  # sums in another order: relative to norm
        assert float((a - b).norm()) <= 1e-5 * float(b.norm()) + 1e-7


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_classifier_pooling_matches_transformers_both_ways(tmp_path: Path, pooling: str) -> None:
    hf_folder = long_folder("base", tmp_path / "hf", classifier_pooling=pooling, num_labels=3)
    hf = transformers.ModernBertForSequenceClassification.from_pretrained(hf_folder)  # a fresh head: randomize it
    randomize(hf.eval(), seed=4)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert isinstance(ours, SequenceClassifier) and ours.config.classifier_pooling == pooling
    batch = family_batch(ours.config, lengths=LENGTHS)
    assert_close(outputs(ours, batch), outputs(hf, batch), **TOL)
    save_pretrained(ours, tmp_path / "ours")
    again, info = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path / "ours",
                                                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert again.config.classifier_pooling == pooling
    assert_close(outputs(again.eval(), batch), outputs(hf, batch), **TOL)


# ---- config.json ---------------------------------------------------------------------------------------------
# answerdotai/ModernBERT-base's config.json as published (transformers 4.48: flat keys, no layer_types).
BASE_CONFIG = {
    "architectures": ["ModernBertForMaskedLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 50281, "classifier_activation": "gelu", "classifier_bias": False, "classifier_dropout": 0.0,
    "classifier_pooling": "mean", "cls_token_id": 50281, "decoder_bias": True, "deterministic_flash_attn": False,
    "embedding_dropout": 0.0, "eos_token_id": 50282, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
    "gradient_checkpointing": False, "hidden_activation": "gelu", "hidden_size": 768, "initializer_cutoff_factor": 2.0,
    "initializer_range": 0.02, "intermediate_size": 1152, "local_attention": 128,
    "local_rope_theta": 10000.0, "max_position_embeddings": 8192, "mlp_bias": False, "mlp_dropout": 0.0,
    "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05, "num_attention_heads": 12,
    "num_hidden_layers": 22, "pad_token_id": 50283, "position_embedding_type": "absolute", "sep_token_id": 50282,
    "tie_word_embeddings": True, "torch_dtype": "float32", "transformers_version": "4.47.0.dev0",
    "vocab_size": 50368,
}


def test_the_released_base_config_is_the_preset_in_both_layouts() -> None:
    config = EncoderConfig.from_hf_dict(BASE_CONFIG)
    assert config == EncoderConfig.from_preset("modernbert-base", classifier_pooling="mean")
    exported = config.to_hf_dict("ModernBertModel")
    theirs = transformers.ModernBertConfig(**{k: v for k, v in BASE_CONFIG.items() if k != "architectures"})
    assert exported["layer_types"] == theirs.layer_types and exported["rope_parameters"] == theirs.rope_parameters
    assert EncoderConfig.from_hf_dict(theirs.to_dict()) == config  # transformers 5's layout


@pytest.mark.parametrize("change, key", [
    ({"attention_bias": True}, "attention_bias"), ({"norm_bias": True}, "norm_bias"),
    ({"mlp_bias": True}, "mlp_bias"), ({"decoder_bias": False}, "decoder_bias"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"layer_types": ["sliding_attention", "full_attention"], "num_hidden_layers": 2}, "layer_types"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1.0, "factor": 2.0}}},
     "rope_parameters"),
])
def test_unsupported_modernbert_settings_are_refused_naming_the_key(change: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        EncoderConfig.from_hf_dict({**BASE_CONFIG, **change})


def test_fresh_weights_follow_transformers_init_truncated_and_residual_scaled() -> None:
    """A new model draws each matrix as transformers' ModernBertModel does: truncated at 2 standard deviations,
    the attention output and feed-forward down projections at 0.02 / sqrt(2 L); BERT's families stay untruncated."""
    config = EncoderConfig.from_preset("modernbert-mini", vocab_size=4000, pad_token_id=0)
    torch.manual_seed(0)
    ours = EncoderModel(config)
    theirs = transformers.ModernBertModel(transformers.ModernBertConfig(**config.to_hf_dict("ModernBertModel")))
    pairs = [(ours.encoder.embeddings.word.weight, theirs.embeddings.tok_embeddings.weight)]
    for mine, hf in zip(ours.encoder.layers, theirs.layers):
        pairs += [(mine.attn.qkv.weight, hf.attn.Wqkv.weight), (mine.attn.out.weight, hf.attn.Wo.weight),
                  (mine.mlp.up.weight, hf.mlp.Wi.weight), (mine.mlp.down.weight, hf.mlp.Wo.weight)]
    for mine, hf in pairs:
        assert mine.std().item() == pytest.approx(hf.std().item(), rel=0.03)
        assert mine.abs().max() <= hf.abs().max() * 1.001  # both truncated at the same bound
    residual = 0.02 / (2 * config.num_layers) ** 0.5
    assert ours.encoder.layers[0].attn.out.weight.abs().max() <= 2 * residual
    bert = EncoderModel(EncoderConfig.from_preset("bert-mini", vocab_size=4000))
    assert bert.encoder.layers[0].attn.out.weight.abs().max() > 3 * 0.02  # BERT's plain normal has tails


def _nan_on_empty_rows(q, k, v, attn_mask=None, dropout_p=0.0, **kwargs):
    """scaled_dot_product_attention as CUDA's memory-efficient kernel computes a query whose mask row is all False:
    softmax over nothing, 0/0 = NaN (pytorch/pytorch#103963; torch's CPU kernels return zeros there instead)."""
    scores = q @ k.transpose(-1, -2) * kwargs.get("scale", q.shape[-1] ** -0.5)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return scores.softmax(dim=-1) @ v


@pytest.mark.parametrize("T", [24, 48], ids=["dense-window", "banded-window"])
def test_padding_far_past_the_window_stays_finite_through_cuda_like_attention(monkeypatch, T) -> None:
    """The cause of modernbert-base's NaN on CUDA: a padding query more than half a window past its row's last real
    token had no key at all in local layers. With attention that gives NaN on such a row, as CUDA's kernel does,
    the MLM loss and every gradient stay finite, and the real tokens' outputs equal torch's own kernel's."""
    model = MaskedLMModel(tiny_config("modernbert").replace(num_layers=3, local_attention=6)).train()
    model.config.hidden_dropout = model.config.attention_dropout = 0.0
    randomize(model, seed=4)
    batch = family_batch(model.config, lengths=(T, 5))  # row 2: 5 real tokens, then T - 5 of padding
    assert Band(3, None).banded(T) == (T >= window.BANDED_FROM * 3)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    reference = model(**batch, labels=labels)
    for module in (attention_module, window):
        monkeypatch.setattr(module.F, "scaled_dot_product_attention", _nan_on_empty_rows)
    out = model(**batch, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert_close(out.logits, reference.logits, **TOL)
