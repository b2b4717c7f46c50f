"""Checkpoint folders: loading Hugging Face weights, exporting ours to transformers, and every refusal.

transformers is the oracle: it writes the folders we read and reads the folders we write. Tiny random
models are built locally from a config; nothing is downloaded.
"""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.testing import assert_close
from transformers import BertForMaskedLM, BertForPreTraining, BertModel

from hf_oracle import TOL, VOCAB, randomize, tiny_hf_config

from encoderlab import (CheckpointError, EncoderConfig, EncoderModel, MaskedLMModel, PreTrainingModel, load_model,
                        save_pretrained)
from encoderlab.checkpoint import resolve_model_path

HF_CLASSES = {"base": BertModel, "mlm": BertForMaskedLM, "pretraining": BertForPreTraining}
OUR_CLASSES = {"base": EncoderModel, "mlm": MaskedLMModel, "pretraining": PreTrainingModel}
KINDS = list(HF_CLASSES)


# ---- tiny Hugging Face models -----------------------------------------------------------------------
def tiny_hf(kind: str, seed: int = 0) -> nn.Module:
    """A random tiny transformers model of our `kind`, in eval mode."""
    torch.manual_seed(seed)
    model = HF_CLASSES[kind](tiny_hf_config())
    randomize(model, seed)
    return model.eval()


def save_hf_config(model: nn.Module, folder: Path) -> None:
    """Only config.json, naming the model's class as save_pretrained would (for hand-written weight files)."""
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)


def save_tiny_hf(kind: str, folder: Path, seed: int = 0) -> nn.Module:
    """Save a random tiny transformers model into `folder` and return it."""
    model = tiny_hf(kind, seed)
    model.save_pretrained(folder)
    return model


def tiny_batch() -> dict[str, torch.Tensor]:
    """Three rows, two padded at the end; segment 1 on the second half of each real row."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([[10], [6], [3]])
    attention_mask = (torch.arange(10) < lengths).long()  # (B, T)
    input_ids = torch.randint(1, VOCAB, (3, 10), generator=gen) * attention_mask
    token_type_ids = ((torch.arange(10) >= lengths // 2) & attention_mask.bool()).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def hf_outputs(model: nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    """The outputs of a transformers model by our names."""
    with torch.no_grad():
        out = model(**batch)
    if isinstance(model, BertModel):
        return {"last_hidden_state": out.last_hidden_state, "pooled": out.pooler_output}
    if isinstance(model, BertForMaskedLM):
        return {"mlm_logits": out.logits}
    return {"mlm_logits": out.prediction_logits, "nsp_logits": out.seq_relationship_logits}


def our_outputs(model: nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    """The outputs of one of our models, named as in hf_outputs."""
    with torch.no_grad():
        out = model(**batch)
    if isinstance(model, EncoderModel):
        return {"last_hidden_state": out.last_hidden_state, "pooled": out.pooled}
    if isinstance(model, MaskedLMModel):
        return {"mlm_logits": out.logits}
    return {"mlm_logits": out.logits, "nsp_logits": out.nsp_logits}


def assert_same_outputs(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert_close(ours[name], theirs[name], **TOL, msg=lambda m: f"{name}: {m}")


def assert_clean_loading_info(info: dict) -> None:
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def edit_safetensors(folder: Path, edit) -> None:
    """Rewrite folder/model.safetensors after `edit(tensors)` changed the dict in place."""
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


# ---- export to transformers -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_export_of_a_loaded_hf_model_is_read_back_by_transformers(tmp_path: Path, kind: str) -> None:
    hf = save_tiny_hf(kind, tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert type(ours) is OUR_CLASSES[kind]
    save_pretrained(ours, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == [HF_CLASSES[kind].__name__]
    reloaded, info = HF_CLASSES[kind].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert_clean_loading_info(info)
    batch = tiny_batch()
    assert_same_outputs(hf_outputs(reloaded.eval(), batch), hf_outputs(hf, batch))
    assert_same_outputs(our_outputs(ours, batch), hf_outputs(hf, batch))


@pytest.mark.parametrize("kind", KINDS)
def test_export_of_a_model_built_from_a_preset_is_read_by_transformers(tmp_path: Path, kind: str) -> None:
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=VOCAB, max_position_embeddings=64)
    ours = OUR_CLASSES[kind](config)
    randomize(ours, seed=1)  # our own init leaves biases at zero: redraw so a misplaced one shows
    save_pretrained(ours.eval(), tmp_path)
    hf, info = HF_CLASSES[kind].from_pretrained(tmp_path, output_loading_info=True)
    assert_clean_loading_info(info)
    assert (hf.config.num_hidden_layers, hf.config.hidden_size, hf.config.vocab_size) == (2, 128, VOCAB)
    batch = tiny_batch()
    assert_same_outputs(our_outputs(ours, batch), hf_outputs(hf.eval(), batch))


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_round_trip_is_exact(tmp_path: Path, kind: str) -> None:
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=VOCAB, max_position_embeddings=64,
                                       hidden_act="gelu_new", labels=["a", "b"])
    ours = OUR_CLASSES[kind](config)
    randomize(ours, seed=2)
    save_pretrained(ours, tmp_path)
    loaded = load_model(tmp_path)
    assert type(loaded) is type(ours) and loaded.config == config
    expected, actual = ours.state_dict(), loaded.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


@pytest.mark.parametrize("kind", KINDS)
def test_saving_is_atomic_and_leaves_no_temp_files(tmp_path: Path, kind: str) -> None:
    save_tiny_hf(kind, tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    folder = tmp_path / "new" / "nested"  # created on demand
    save_pretrained(ours, folder)
    save_pretrained(ours, folder)  # overwriting an existing checkpoint too
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert not list(folder.rglob("*.tmp"))


# ---- other layouts: pytorch_model.bin, old names, shards ----------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_pytorch_model_bin_is_loaded(tmp_path: Path, kind: str) -> None:
    hf = tiny_hf(kind)
    save_hf_config(hf, tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # what save_pretrained wrote before safetensors
    assert not (tmp_path / "model.safetensors").exists()
    batch = tiny_batch()
    assert_same_outputs(our_outputs(load_model(tmp_path), batch), hf_outputs(hf, batch))


def test_old_weight_names_are_accepted(tmp_path: Path) -> None:
    """TF-era names (LayerNorm.gamma/beta), the decoder bias alias and the position_ids buffer."""
    hf = tiny_hf("mlm")
    save_hf_config(hf, tmp_path)
    old = {}
    for name, tensor in hf.state_dict().items():
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        old[name.replace("cls.predictions.bias", "cls.predictions.decoder.bias")] = tensor.clone()
    old["bert.embeddings.position_ids"] = torch.arange(64)[None]
    assert "bert.embeddings.LayerNorm.gamma" in old and "cls.predictions.decoder.bias" in old
    save_file(old, tmp_path / "model.safetensors")
    batch = tiny_batch()
    assert_same_outputs(our_outputs(load_model(tmp_path), batch), hf_outputs(hf, batch))


def test_sharded_safetensors_are_loaded(tmp_path: Path) -> None:
    hf = tiny_hf("pretraining")
    save_hf_config(hf, tmp_path)
    tensors = {k: v.clone() for k, v in hf.state_dict().items() if k != "cls.predictions.decoder.weight"}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / shard)
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    batch = tiny_batch()
    assert_same_outputs(our_outputs(load_model(tmp_path), batch), hf_outputs(hf, batch))


# ---- pickles that hold code -----------------------------------------------------------------------------------
class Payload:
    """An object whose unpickling calls `function(argument)`: what a malicious checkpoint does."""

    def __init__(self, function, argument: str) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self):
        return self.function, (self.argument,)


def payload(how: str, marker: Path) -> Payload:
    """A payload that creates `marker` when unpickled, through os.system or builtins.exec."""
    if how == "os.system":
        return Payload(os.system, f"touch '{marker}'")
    return Payload(builtins.exec, f"open({str(marker)!r}, 'w').close()")


@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
def test_pickle_holding_code_is_refused_and_never_run(tmp_path: Path, how: str) -> None:
    # The payload is live: an unrestricted unpickler runs it (else this test could not fail).
    control = tmp_path / "control-ran"
    torch.save({"w": payload(how, control)}, tmp_path / "control.bin")
    torch.load(tmp_path / "control.bin", weights_only=False)
    assert control.exists()

    folder, marker = tmp_path / "model", tmp_path / "payload-ran"
    tiny_hf_config().save_pretrained(folder)
    state = dict(tiny_hf("base").state_dict())
    state["embeddings.word_embeddings.weight"] = payload(how, marker)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin") as err:
        load_model(folder)
    assert "weights_only" in str(err.value)
    assert not marker.exists()


def test_pickle_that_is_not_a_state_dict_is_refused(tmp_path: Path) -> None:
    tiny_hf_config().save_pretrained(tmp_path)
    torch.save([torch.zeros(2)], tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*expected a dict of tensors"):
        load_model(tmp_path)


# ---- refusals that name the tensor or file ---------------------------------------------------------------------
def test_missing_tensor_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    edit_safetensors(tmp_path, lambda t: t.pop("encoder.layer.1.output.dense.weight"))
    with pytest.raises(CheckpointError, match="missing tensors: encoder.layer.1.output.dense.weight") as err:
        load_model(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_unexpected_tensor_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    edit_safetensors(tmp_path, lambda t: t.update({"encoder.layer.0.foo.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match="unexpected tensors: encoder.layer.0.foo.weight"):
        load_model(tmp_path)


def test_tensor_of_a_layer_the_config_does_not_have_is_unexpected(tmp_path: Path) -> None:
    """A third layer in a two-layer checkpoint would otherwise be dropped without a word."""
    save_tiny_hf("base", tmp_path)
    extra = "encoder.layer.2.attention.self.query.weight"
    edit_safetensors(tmp_path, lambda t: t.update({extra: t["encoder.layer.1.attention.self.query.weight"].clone()}))
    with pytest.raises(CheckpointError, match=f"unexpected tensors: {extra}"):
        load_model(tmp_path)


def test_shape_mismatch_is_named_with_both_shapes(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    edit_safetensors(tmp_path, lambda t: t.update({"encoder.layer.0.intermediate.dense.weight": torch.zeros(36, 32)}))
    with pytest.raises(CheckpointError, match=r"shape mismatch: encoder.layer.0.intermediate.dense.weight "
                                              r"\(36, 32\) \(expected \(37, 32\)"):
        load_model(tmp_path)


def test_shape_mismatch_inside_a_fused_tensor_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    edit_safetensors(tmp_path, lambda t: t.update({"encoder.layer.1.attention.self.key.bias": torch.zeros(31)}))
    with pytest.raises(CheckpointError, match=r"encoder.layer.1.attention.self.key.bias \(31,\)"):
        load_model(tmp_path)


def test_corrupted_safetensors_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(os.urandom(64) + b"\x00" * 4000)
    with pytest.raises(CheckpointError, match="model.safetensors: corrupted or truncated"):
        load_model(tmp_path)


def test_truncated_safetensors_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: corrupted or truncated"):
        load_model(tmp_path)


def test_folder_without_weights_is_named(tmp_path: Path) -> None:
    tiny_hf_config().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="no weights found") as err:
        load_model(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_folder_without_config_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json") as err:
        load_model(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_missing_model_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such folder") as err:
        load_model(tmp_path / "not-there")
    assert "not-there" in str(err.value)


def test_file_given_for_a_folder_is_named(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    with pytest.raises(CheckpointError, match="expected a checkpoint folder.*got a file") as err:
        load_model(tmp_path / "model.safetensors")
    assert "model.safetensors" in str(err.value)


def test_alias_resolves_to_the_installed_package_folder() -> None:
    folder = resolve_model_path("minilm")
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def test_base_checkpoint_loaded_as_mlm_names_the_missing_head(tmp_path: Path) -> None:
    save_tiny_hf("base", tmp_path)
    with pytest.raises(CheckpointError, match="BertForMaskedLM") as err:
        load_model(tmp_path, kind="mlm")
    message = str(err.value)
    for name in ("cls.predictions.transform.dense.weight", "cls.predictions.transform.LayerNorm.weight",
                 "cls.predictions.bias"):
        assert name in message


def test_pretraining_checkpoint_loads_as_base(tmp_path: Path) -> None:
    save_tiny_hf("pretraining", tmp_path)
    ours = load_model(tmp_path, kind="base")
    assert type(ours) is EncoderModel and ours.pooler is not None
    hf = BertModel.from_pretrained(tmp_path).eval()  # transformers drops the heads the same way
    batch = tiny_batch()
    assert_same_outputs(our_outputs(ours, batch), hf_outputs(hf, batch))


def test_pretraining_checkpoint_loads_as_mlm(tmp_path: Path) -> None:
    save_tiny_hf("pretraining", tmp_path)
    ours = load_model(tmp_path, kind="mlm")
    hf = BertForMaskedLM.from_pretrained(tmp_path).eval()
    batch = tiny_batch()
    assert_same_outputs(our_outputs(ours, batch), hf_outputs(hf, batch))


def test_base_checkpoint_without_pooler_loads_without_one(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = BertModel(tiny_hf_config(), add_pooling_layer=False)
    randomize(hf)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert ours.pooler is None
    batch = tiny_batch()
    with torch.no_grad():
        assert_close(ours(**batch).last_hidden_state, hf.eval()(**batch).last_hidden_state, **TOL)
