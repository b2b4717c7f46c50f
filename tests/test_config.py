"""EncoderConfig: presets, the Hugging Face config.json boundary (checked against transformers), and errors."""

from __future__ import annotations

import json
from pathlib import Path

import dataclasses

import pytest
from transformers import BertConfig, RobertaConfig

from encoderlab import ConfigError, EncoderConfig
from encoderlab.config import ACTIVATION_NAMES, field_names, presets, register_family
from encoderlab.models import FAMILIES, PRESETS
from encoderlab.nn.mlp import ACTIVATIONS

# Our field name -> transformers BertConfig attribute, for every field both sides have.
HF_ATTRIBUTES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_act",
    "hidden_dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "initializer_range": "initializer_range",
}


def unusual_config() -> EncoderConfig:
    """A tiny config whose every field differs from the bert-base default, so a dropped field shows."""
    return EncoderConfig(vocab_size=101, hidden_size=48, num_layers=3, num_heads=6, intermediate_size=77,
                         hidden_act="gelu_new", hidden_dropout=0.25, attention_dropout=0.125,
                         max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-7, pad_token_id=5,
                         initializer_range=0.05, labels=["neg", "neutral", "pos"])


def write_config(folder: Path, data: dict | bytes | str) -> Path:
    """A config.json holding `data` (a dict is JSON-encoded; bytes and str are written as given)."""
    path = folder / "config.json"
    if isinstance(data, dict):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def tiny_hf_dict(**changes) -> dict:
    """A minimal valid Hugging Face BERT config dict."""
    return {"model_type": "bert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 37, **changes}


# ---- presets -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, layers, hidden", [
    ("bert-tiny", 2, 128), ("bert-mini", 4, 256), ("bert-small", 4, 512),
    ("bert-medium", 8, 512), ("bert-base", 12, 768), ("bert-large", 24, 1024),
])
def test_preset_has_the_published_shape(name: str, layers: int, hidden: int) -> None:
    config = EncoderConfig.from_preset(name)
    assert (config.num_layers, config.hidden_size) == (layers, hidden)
    assert config.head_dim == 64  # every Google BERT release uses 64-wide heads
    assert config.intermediate_size == 4 * hidden
    assert config.model_type == "bert"


def test_bert_presets_are_exactly_the_six_published_ones() -> None:
    bert = {name for name, fields in PRESETS.items() if fields["model_type"] == "bert"}
    assert bert == {"bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base", "bert-large"}


def test_preset_overrides_apply_and_are_validated() -> None:
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=100, max_position_embeddings=64)
    assert (config.vocab_size, config.max_position_embeddings, config.hidden_size) == (100, 64, 128)
    with pytest.raises(ConfigError, match="num_heads"):
        EncoderConfig.from_preset("bert-tiny", num_heads=3)
    with pytest.raises(ConfigError, match="no_such_field"):
        EncoderConfig.from_preset("bert-tiny", no_such_field=1)


def test_unknown_preset_names_it_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="bert-huge") as err:
        EncoderConfig.from_preset("bert-huge")
    assert "bert-base" in str(err.value)


def test_default_config_is_bert_base_uncased() -> None:
    hf = BertConfig()  # transformers' defaults are bert-base-uncased's
    ours = EncoderConfig()
    for field, attribute in HF_ATTRIBUTES.items():
        assert getattr(ours, field) == getattr(hf, attribute), field


# ---- Hugging Face config.json round trip ------------------------------------------------------------
def test_saved_config_is_read_by_transformers_with_the_same_values(tmp_path: Path) -> None:
    ours = unusual_config()
    (tmp_path / "config.json").write_text(json.dumps(ours.to_hf_dict("BertForMaskedLM")), encoding="utf-8")
    hf = BertConfig.from_pretrained(tmp_path)
    for field, attribute in HF_ATTRIBUTES.items():
        assert getattr(hf, attribute) == getattr(ours, field), field
    assert hf.model_type == "bert"
    assert hf.architectures == ["BertForMaskedLM"]
    assert hf.position_embedding_type == "absolute"
    assert hf.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    assert hf.label2id == {"neg": 0, "neutral": 1, "pos": 2}
    assert EncoderConfig.from_json(tmp_path / "config.json") == ours


def test_transformers_config_is_read_with_the_same_values(tmp_path: Path) -> None:
    hf = BertConfig(vocab_size=101, hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=77,
                    hidden_act="gelu_new", hidden_dropout_prob=0.25, attention_probs_dropout_prob=0.125,
                    max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-7, pad_token_id=5,
                    initializer_range=0.05, id2label={0: "neg", 1: "neutral", 2: "pos"})
    hf.architectures = ["BertModel"]
    hf.save_pretrained(tmp_path)
    ours = EncoderConfig.from_json(tmp_path / "config.json")
    for field, attribute in HF_ATTRIBUTES.items():
        assert getattr(ours, field) == getattr(hf, attribute), field
    assert ours.labels == ["neg", "neutral", "pos"]
    assert ours == unusual_config()


def test_transformers_placeholder_labels_are_not_kept(tmp_path: Path) -> None:
    BertConfig(**{k: v for k, v in tiny_hf_dict().items() if k != "model_type"}, num_labels=3).save_pretrained(tmp_path)
    assert "LABEL_2" in (tmp_path / "config.json").read_text()
    assert EncoderConfig.from_json(tmp_path / "config.json").labels is None


# ---- the head layout ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family, layout", [
    ("bert", (False, "tanh", False, True, False)), ("roberta", (True, "tanh", False, True, False)),
    ("electra", (True, "gelu", False, True, False)), ("distilbert", (True, "relu", False, False, False)),
    ("deberta-v2", (True, "gelu", False, True, False)), ("modernbert", (True, None, True, False, True))])
def test_the_head_layout_is_config_data_from_the_family(family: str, layout: tuple) -> None:
    config = EncoderConfig.from_preset(next(iter(FAMILIES[family].presets)))
    assert (config.classifier_dense, config.classifier_activation, config.classifier_norm,
            config.classifier_dropout_first, config.task_transform) == layout
    base = FAMILIES[family].architectures["base"]
    assert EncoderConfig.from_hf_dict(config.to_hf_dict(base)) == config


def test_a_head_layout_the_family_config_json_cannot_hold_is_refused_on_export() -> None:
    config = EncoderConfig.from_preset("roberta-mini").replace(classifier_dense=False)  # BERT's pooled head
    with pytest.raises(ConfigError, match="classifier_dense=False cannot be saved in a transformers roberta"):
        config.to_hf_dict("RobertaForSequenceClassification")


def test_problem_type_is_transformers_key_both_ways(tmp_path: Path) -> None:
    config = EncoderConfig.from_preset("roberta-mini", problem_type="multi_label_classification")
    data = config.to_hf_dict("RobertaForSequenceClassification")
    assert data["problem_type"] == "multi_label_classification" and "classifier_dense" not in data
    (tmp_path / "config.json").write_text(json.dumps(data), encoding="utf-8")
    assert RobertaConfig.from_pretrained(tmp_path).problem_type == "multi_label_classification"
    assert EncoderConfig.from_json(tmp_path / "config.json") == config
    assert "problem_type" not in EncoderConfig.from_preset("roberta-mini").to_hf_dict("RobertaModel")
    with pytest.raises(ConfigError, match="problem_type"):
        config.replace(problem_type="multilabel")


def test_a_second_registration_of_a_family_is_refused() -> None:
    clone = dataclasses.replace(FAMILIES["roberta"], presets={"roberta-clone": {}})
    with pytest.raises(ConfigError, match="'roberta' is already registered"):
        register_family(clone)
    assert "roberta-clone" not in presets() and EncoderConfig.from_preset("roberta-mini").model_type == "roberta"


# ---- errors -------------------------------------------------------------------------------------------
def test_unknown_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, tiny_hf_dict(rotary_base=10000))
    with pytest.raises(ConfigError, match="rotary_base") as err:
        EncoderConfig.from_json(path)
    assert str(path) in str(err.value)


def test_hidden_size_not_divisible_by_heads_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"hidden_size \(100\).*num_heads \(3\)"):
        EncoderConfig(hidden_size=100, num_heads=3)
    path = write_config(tmp_path, tiny_hf_dict(hidden_size=30, num_attention_heads=4))
    with pytest.raises(ConfigError, match="hidden_size") as err:
        EncoderConfig.from_json(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("kind", ["relative_key", "relative_key_query", "rotary"])
def test_unsupported_position_embedding_type_is_refused(tmp_path: Path, kind: str) -> None:
    path = write_config(tmp_path, tiny_hf_dict(position_embedding_type=kind))
    with pytest.raises(ConfigError, match=f"position_embedding_type={kind!r}") as err:
        EncoderConfig.from_json(path)
    assert str(path) in str(err.value)
    assert "absolute" in str(err.value)


def test_absolute_position_embedding_type_is_accepted(tmp_path: Path) -> None:
    path = write_config(tmp_path, tiny_hf_dict(position_embedding_type="absolute"))
    assert EncoderConfig.from_json(path).hidden_size == 32


@pytest.mark.parametrize("key, value", [("is_decoder", True), ("add_cross_attention", True)])
def test_decoder_configs_are_refused(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        EncoderConfig.from_json(write_config(tmp_path, tiny_hf_dict(**{key: value})))


@pytest.mark.parametrize("content", [
    b'{"hidden_size": 32, "hidden_act": "gel\xff"}',  # not UTF-8
    b"\xff\xfe{\x00}\x00",  # UTF-16 with a byte-order mark
    b'{"hidden_size": 32,',  # truncated JSON
    b"",  # empty file
], ids=["latin1-byte", "utf16", "truncated-json", "empty"])
def test_unreadable_config_names_the_file(tmp_path: Path, content: bytes) -> None:
    path = write_config(tmp_path, content)
    with pytest.raises(ConfigError, match="not valid UTF-8 JSON") as err:
        EncoderConfig.from_json(path)
    assert str(path) in str(err.value)


def test_config_that_is_not_an_object_names_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object") as err:
        EncoderConfig.from_json(path)
    assert str(path) in str(err.value)


def test_missing_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file") as err:
        EncoderConfig.from_json(tmp_path / "absent.json")
    assert "absent.json" in str(err.value)


@pytest.mark.parametrize("field, value", [
    ("vocab_size", 0), ("num_layers", -1), ("hidden_size", 32.0), ("num_heads", True),
    ("hidden_act", "tanh"), ("hidden_dropout", 1.0), ("attention_dropout", -0.1),
    ("type_vocab_size", -1), ("pad_token_id", 30522), ("model_type", "gpt2"),
    ("pooler", 1), ("always_project", "yes"), ("head_activation", "tanh"),
])
def test_out_of_range_field_is_named(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        EncoderConfig(**{field: value})


def test_replace_changes_a_copy_and_validates() -> None:
    base = EncoderConfig.from_preset("bert-tiny")
    changed = base.replace(vocab_size=100, hidden_act="relu")
    assert (changed.vocab_size, changed.hidden_act) == (100, "relu")
    assert (base.vocab_size, base.hidden_act) == (30522, "gelu")
    with pytest.raises(ConfigError, match="num_heads"):
        base.replace(num_heads=5)


def test_replace_with_unknown_field_names_it() -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers") as err:
        EncoderConfig().replace(num_hidden_layers=4)  # the HF name, not ours
    assert "num_layers" in str(err.value)  # the known names are listed
    assert "num_layers" in field_names()


def test_every_activation_the_config_accepts_is_one_the_model_computes() -> None:
    assert sorted(ACTIVATIONS) == sorted(ACTIVATION_NAMES)
