"""DeBERTa-v3 (model_type deberta-v2) beyond the parity tests every family shares (test_family.py): the log
buckets against their formula, a sequence long enough for them to matter, the fast path against the eager one,
the variants without buckets or with token types, and the config.json values we refuse."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from torch.testing import assert_close
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

from hf_oracle import TOL, randomize
from test_family import family_batch, hf_class, hf_forward, save_tiny_hf, tiny_config

from encoderlab import EncoderConfig, load_model
from encoderlab.errors import ConfigError
from encoderlab.nn.disentangled import RelativeEmbeddings, log_bucket
from encoderlab.nn.model import EncoderModel

# microsoft/deberta-v3-base's config.json as published on the Hugging Face hub.
V3_BASE_CONFIG = {
    "model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 512,
    "relative_attention": True, "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
    "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7, "max_relative_positions": -1, "position_biased_input": False,
    "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 0, "vocab_size": 128100,
}


def bucket_by_formula(distance: int, buckets: int, max_position: int) -> int:
    """DeBERTa's log bucket of one distance, in plain float64 arithmetic: exact up to half the buckets, then
    mid + ceil((mid - 1) * log(|d| / mid) / log((max_position - 1) / mid)) with the sign of d."""
    mid = buckets // 2
    if abs(distance) <= mid:
        return distance
    far = mid + math.ceil((mid - 1) * math.log(abs(distance) / mid) / math.log((max_position - 1) / mid))
    return far if distance > 0 else -far


# ---- log buckets --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("buckets, max_position", [(8, 64), (32, 100), (256, 512)])
def test_log_buckets_follow_the_formula(buckets: int, max_position: int) -> None:
    distances = torch.arange(-(max_position - 1), max_position)
    ours = log_bucket(distances, buckets, max_position)
    assert ours.tolist() == [bucket_by_formula(d, buckets, max_position) for d in distances.tolist()]
    assert torch.equal(ours, make_log_bucket_position(distances, buckets, max_position).long())
    assert ours.abs().max() == buckets - 1  # the farthest distance takes the last row of each side
    assert (ours.diff() >= 0).all()  # farther never maps nearer


def test_every_layer_reads_the_row_of_its_bucketed_distance() -> None:
    config = EncoderConfig.from_preset("deberta-v3-mini", position_buckets=8, max_position_embeddings=64)
    relative = RelativeEmbeddings(config)
    positions = relative(40, torch.device("cpu"))
    i = torch.arange(40)
    expected = log_bucket(i[:, None] - i[None, :], 8, 64) + 8  # row delta(i, j) of the 2k-row table
    first = int(expected.min())
    assert torch.equal(positions.index, expected - first)
    assert_close(positions.embeddings, relative.norm(relative.table.weight)[first:expected.max() + 1])
    short = relative(3, torch.device("cpu"))  # distances -2..2: five rows
    assert torch.equal(short.index, torch.tensor([[2, 1, 0], [3, 2, 1], [4, 3, 2]]))
    assert short.embeddings.shape == (5, config.hidden_size)


# ---- parity on what the shared tests do not reach -----------------------------------------------------------
def assert_matches_transformers(folder: Path, lengths: tuple[int, ...]) -> None:
    """Hidden states and attentions (eager path), and the fast path's last hidden state, against transformers."""
    ours = load_model(folder)
    hf = hf_class("deberta-v2", "base").from_pretrained(folder, attn_implementation="eager").eval()
    batch = family_batch(ours.config, lengths=lengths)
    ref = hf_forward(hf, batch, output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        eager = ours(**batch, output_hidden_states=True, output_attentions=True)
        fast = ours(**batch)
    for mine, theirs in zip(eager.hidden_states + eager.attentions, ref.hidden_states + ref.attentions, strict=True):
        assert_close(mine, theirs, **TOL)
    assert_close(fast.last_hidden_state, ref.last_hidden_state, **TOL)


def test_a_long_sequence_with_log_buckets_matches_transformers(tmp_path: Path) -> None:
    """40 tokens with 8 buckets: distances up to 39 share log-spaced buckets."""
    assert_matches_transformers(save_tiny_hf("deberta-v2", "base", tmp_path), lengths=(40, 23, 5))


def test_without_buckets_distances_are_clamped_as_in_transformers(tmp_path: Path) -> None:
    folder = save_tiny_hf("deberta-v2", "base", tmp_path, position_buckets=0, max_relative_positions=6)
    assert load_model(folder).encoder.relative.table.num_embeddings == 12
    assert_matches_transformers(folder, lengths=(11, 7, 4))


def test_token_types_are_added_as_in_transformers(tmp_path: Path) -> None:
    folder = save_tiny_hf("deberta-v2", "base", tmp_path, type_vocab_size=2)
    assert load_model(folder).encoder.embeddings.segment is not None
    assert_matches_transformers(folder, lengths=(11, 7, 4))


def test_fast_path_gives_the_eager_outputs_and_gradients() -> None:
    config = tiny_config("deberta-v2").replace(position_buckets=8, hidden_dropout=0.0, attention_dropout=0.0)
    model = EncoderModel(config).train()
    randomize(model, seed=1)
    batch = family_batch(config, lengths=(20, 13, 3))
    results = []
    for eager in (False, True):
        model.zero_grad()
        out = model(**batch, output_attentions=eager).last_hidden_state
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        results.append((out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (fast, fast_grads), (eager, eager_grads) = results
    assert_close(fast, eager, **TOL)
    assert fast_grads.keys() == eager_grads.keys()
    for name in fast_grads:  # gradients here reach ~100: float32 sums of that size differ by ~1e-5 between kernels
        scale = max(1.0, float(eager_grads[name].abs().max()))
        assert_close(fast_grads[name], eager_grads[name], rtol=TOL["rtol"], atol=TOL["atol"] * scale, msg=name)
    assert fast_grads["encoder.relative.table.weight"].abs().sum() > 0  # the positions are learned through the bias


def test_padding_changes_nothing_for_the_real_tokens() -> None:
    model = EncoderModel(tiny_config("deberta-v2")).eval()
    randomize(model, seed=2)
    batch = family_batch(model.config, lengths=(9, 5))
    with torch.no_grad():
        padded = model(**batch).last_hidden_state
        alone = model(batch["input_ids"][1:, :5]).last_hidden_state
    assert_close(padded[1:, :5], alone, **TOL)


# ---- config.json ---------------------------------------------------------------------------------------------
def test_the_released_v3_base_config_is_the_preset() -> None:
    config = EncoderConfig.from_hf_dict(V3_BASE_CONFIG)
    assert config == EncoderConfig.from_preset("deberta-v3-base")
    exported = config.to_hf_dict("DebertaV2ForMaskedLM")
    assert exported["legacy"] is True and exported["share_att_key"] is True
    assert {key: exported[key] for key in V3_BASE_CONFIG if key != "pos_att_type"} == \
        {key: value for key, value in V3_BASE_CONFIG.items() if key != "pos_att_type"}
    assert transformers.DebertaV2Config(**exported).pos_att_type == ["p2c", "c2p"]


@pytest.mark.parametrize("key, value", [
    ("share_att_key", False), ("pos_att_type", ["c2p"]), ("pos_att_type", "p2c"), ("pos_att_type", None),
    ("norm_rel_ebd", "none"), ("position_biased_input", True), ("conv_kernel_size", 3), ("legacy", False),
    ("relative_attention", False), ("position_buckets", -1), ("attention_head_size", 16),
])
def test_unsupported_deberta_settings_are_refused_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        EncoderConfig.from_hf_dict({**V3_BASE_CONFIG, key: value})


def test_a_single_position_bucket_is_refused() -> None:
    with pytest.raises(ConfigError, match="position_buckets"):
        EncoderModel(tiny_config("deberta-v2").replace(position_buckets=1))


@pytest.mark.parametrize("family, architecture, value", [("deberta-v2", "DebertaV2Model", False),
                                                          ("bert", "BertModel", True)])
def test_relative_attention_switched_builds_but_is_not_saved(family: str, architecture: str, value: bool) -> None:
    config = tiny_config(family).replace(relative_attention=value)  # any combination is a model we can run
    assert (EncoderModel(config).encoder.relative is not None) == value
    with pytest.raises(ConfigError, match="relative_attention"):  # but not one transformers' class computes
        config.to_hf_dict(architecture)


@pytest.mark.parametrize("key", ["share_att_key", "norm_rel_ebd", "position_biased_input", "relative_attention",
                                 "pos_att_type"])
def test_a_config_json_without_a_v3_key_is_refused_by_name(key: str) -> None:
    """transformers reads the absent key as another architecture (e.g. no shared keys): not silently ours."""
    data = EncoderConfig.from_preset("deberta-v3-mini").to_hf_dict("DebertaV2Model")
    del data[key]
    with pytest.raises(ConfigError, match=f"{key} is missing"):
        EncoderConfig.from_hf_dict(data)
