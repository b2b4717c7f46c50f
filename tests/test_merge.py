"""`encoderlab merge`: the weighted average of models of one architecture. For every family and kind, the merged
folder loads in transformers, each of its tensors is the weighted average of the transformers models' tensors, and
our merged model computes what transformers' does; a head only the first model has is kept, another model's extra
tensors are left out and reported; models of another shape, family, labels or vocabulary are refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch.testing import assert_close

from hf_oracle import randomize
from test_family import FAMILY_KINDS, HF_CONFIGS, family_batch, hf_class, hf_forward, save_tiny_hf

from encoderlab import load_model
from encoderlab.cli import main
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.merge import MERGE_FILE, merge, merge_to_folder
from encoderlab.paths import resolve_model_path

OUTPUTS = {"base": ("last_hidden_state", "last_hidden_state"), "mlm": ("logits", "logits"),
           "pretraining": ("logits", "prediction_logits"), "rtd": ("logits", "logits")}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _classifier(folder: Path, seed: int, **changes) -> Path:
    """A tiny random BertForSequenceClassification (its task heads are not in the family table's kinds)."""
    torch.manual_seed(seed)
    config = HF_CONFIGS["bert"]()
    for key, value in changes.items():
        setattr(config, key, value)
    model = transformers.BertForSequenceClassification(config)
    randomize(model, seed)
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family, kind", FAMILY_KINDS)
def test_the_merge_is_the_weighted_average_of_the_transformers_models(tmp_path: Path, family: str, kind: str) -> None:
    a = save_tiny_hf(family, kind, tmp_path / "a", seed=1)
    b = save_tiny_hf(family, kind, tmp_path / "b", seed=2)
    merge_to_folder([a, b], tmp_path / "m", weights=[1, 3])
    cls = hf_class(family, kind)
    merged, info = cls.from_pretrained(tmp_path / "m", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    first, second = cls.from_pretrained(a).state_dict(), cls.from_pretrained(b).state_dict()
    for name, tensor in merged.state_dict().items():
        if tensor.is_floating_point():
            assert_close(tensor, 0.25 * first[name] + 0.75 * second[name], atol=1e-6, rtol=1e-6, msg=name)
    ours = load_model(tmp_path / "m")
    batch = family_batch(ours.config)
    with torch.no_grad():
        out = ours(**batch)
    mine, theirs = OUTPUTS[kind]
    assert_close(getattr(out, mine), getattr(hf_forward(merged.eval(), batch), theirs), atol=1e-5, rtol=1e-5)


def test_a_head_only_the_first_model_has_is_kept_and_the_others_extra_tensors_left_out(tmp_path: Path) -> None:
    mlm = save_tiny_hf("bert", "mlm", tmp_path / "mlm", seed=1)
    base = save_tiny_hf("bert", "base", tmp_path / "base", seed=2)  # BertModel: a pooler, no MLM head
    model, report = merge([mlm, base], weights=[0.5, 0.5])
    own, other = load_model(mlm).state_dict(), load_model(base).state_dict()
    for key, tensor in model.state_dict().items():
        if key.startswith("mlm."):
            assert torch.equal(tensor, own[key]), key  # kept whole: nothing to average it with
            assert report.partial[key] == [0]
        else:
            assert_close(tensor, (own[key] + other[key]) / 2, msg=key)
    assert report.left_out == {1: ["pooler.dense.bias", "pooler.dense.weight"]}
    assert not any(k.startswith("encoder.") for k in report.partial)


def test_a_classifier_soup_keeps_the_labels_and_task_file(tmp_path: Path) -> None:
    labels = {"id2label": {0: "neg", 1: "neutral", 2: "pos"}, "label2id": {"neg": 0, "neutral": 1, "pos": 2}}
    a = _classifier(tmp_path / "a", seed=1, **labels)
    b = _classifier(tmp_path / "b", seed=2, **labels)
    (a / "task.json").write_text(json.dumps({"task": "classify", "max_length": 48}))
    merge_to_folder([a, b], tmp_path / "m")
    soup = load_model(tmp_path / "m")
    assert soup.config.labels == ["neg", "neutral", "pos"]
    assert json.loads((tmp_path / "m" / "task.json").read_text()) == {"task": "classify", "max_length": 48}
    first, second = load_model(a).state_dict(), load_model(b).state_dict()
    for key, tensor in soup.state_dict().items():
        assert_close(tensor, (first[key] + second[key]) / 2, msg=key)


@pytest.mark.slow
def test_the_end_points_of_an_interpolation_are_the_models_themselves() -> None:
    """The shipped model (bf16, `bert.` names, an MLM head) and minilm (fp32, bare names, a pooler): weight 1 on
    either gives that model's tensors back, so names were matched across both layouts."""
    shipped, minilm = resolve_model_path("encoderlab-fill-mask"), resolve_model_path("minilm")
    alone, _ = merge([shipped, minilm], weights=[1, 0])
    for key, tensor in load_model(shipped).state_dict().items():
        assert torch.equal(alone.state_dict()[key], tensor), key
    start, report = merge([shipped, minilm], weights=[0, 1])
    theirs = load_model(minilm).state_dict()
    for key, tensor in start.state_dict().items():
        if key in theirs:
            assert torch.equal(tensor, theirs[key]), key
    assert sorted(report.partial) == sorted(k for k in start.state_dict() if k.startswith("mlm."))


def test_models_of_another_shape_family_or_labels_are_refused(tmp_path: Path) -> None:
    a = save_tiny_hf("bert", "mlm", tmp_path / "a", seed=1)
    wider = save_tiny_hf("bert", "mlm", tmp_path / "wider", seed=2, intermediate_size=41)
    with pytest.raises(ConfigError, match=r"wider.*intermediate_size: 41 vs 37"):
        merge([a, wider])
    roberta = save_tiny_hf("roberta", "mlm", tmp_path / "roberta", seed=2)
    with pytest.raises(ConfigError, match="model_type: 'roberta' vs 'bert'"):
        merge([a, roberta])
    two = _classifier(tmp_path / "two", seed=1)
    three = _classifier(tmp_path / "three", seed=2, num_labels=3)
    with pytest.raises(CheckpointError, match=r"three: classifier.weight has shape \(3, 32\)"):
        merge([two, three])
    renamed = _classifier(tmp_path / "renamed", seed=2, id2label={0: "bad", 1: "good"}, label2id={"bad": 0, "good": 1})
    named = _classifier(tmp_path / "named", seed=1, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    with pytest.raises(ConfigError, match=r"renamed.*labels: \['bad', 'good'\] vs \['neg', 'pos'\]"):
        merge([named, renamed])


def test_a_tokenizer_that_maps_a_token_to_another_id_is_refused(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(99 - len(SPECIALS))]
    a = save_tiny_hf("bert", "mlm", tmp_path / "a", seed=1)
    b = save_tiny_hf("bert", "mlm", tmp_path / "b", seed=2)
    (a / "vocab.txt").write_text("\n".join(SPECIALS + words) + "\n")
    (b / "vocab.txt").write_text("\n".join(SPECIALS + words[:7] + [words[8], words[7]] + words[9:]) + "\n")
    with pytest.raises(ConfigError, match=r"tokenizer differs.*id 12: 'w8' vs 'w7'"):
        merge([a, b])
    (b / "vocab.txt").write_text((a / "vocab.txt").read_text())
    merge([a, b])  # the same vocabulary passes


@pytest.mark.parametrize("weights, problem", [([1], "1 weight"), ([1, -1], ">= 0"), ([0, 0], "sum > 0"),
                                              ([1, float("nan")], ">= 0")])
def test_bad_weights_are_refused(tmp_path: Path, weights: list[float], problem: str) -> None:
    a = save_tiny_hf("bert", "mlm", tmp_path / "a", seed=1)
    with pytest.raises(InputError, match=problem):
        merge([a, a], weights=weights)


def test_one_model_and_an_input_as_output_are_refused_and_the_input_survives(tmp_path: Path) -> None:
    a = save_tiny_hf("bert", "mlm", tmp_path / "a", seed=1)
    b = save_tiny_hf("bert", "mlm", tmp_path / "b", seed=2)
    with pytest.raises(InputError, match="at least two"):
        merge([a])
    before = (b / "model.safetensors").read_bytes()
    for out in (b, tmp_path):  # the input itself, or a folder holding it: even --overwrite may not empty it
        with pytest.raises(InputError, match="holds the input"):
            merge_to_folder([a, b], out, overwrite=True)
    assert (b / "model.safetensors").read_bytes() == before


def test_cli_writes_the_merge_and_its_record(tmp_path: Path, capsys) -> None:
    a = save_tiny_hf("bert", "mlm", tmp_path / "a", seed=1)
    base = save_tiny_hf("bert", "base", tmp_path / "base", seed=2)
    assert main(["merge", str(a), str(base), "--weights", "3", "1", "--out", str(tmp_path / "m")]) == 0
    printed = capsys.readouterr().out
    assert "x 0.75" in printed and "x 0.25" in printed and "pooler.dense.weight" in printed
    record = json.loads((tmp_path / "m" / MERGE_FILE).read_text())
    assert record["weights"] == [0.75, 0.25] and record["models"] == [str(a), str(base)]
    digest = hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest()
    assert record["sha256"][1] == {"model.safetensors": digest}
    merged, first = load_file(tmp_path / "m" / "model.safetensors"), load_file(a / "model.safetensors")
    assert set(merged) == set(first)  # the first model's layout: BertForMaskedLM, no pooler
    assert main(["merge", str(a), str(base), "--weights", "1", "--out", str(tmp_path / "n")]) == 2
    assert "--weights: 1 weight(s) for 2 models" in capsys.readouterr().err


def test_unrelated_models_are_flagged_and_relatives_are_not(tmp_path: Path, capsys) -> None:
    a = save_tiny_hf("bert", "mlm", tmp_path / "a", seed=1)
    stranger = save_tiny_hf("bert", "mlm", tmp_path / "stranger", seed=2)  # another random initialisation
    relative = transformers.BertForMaskedLM.from_pretrained(a)
    with torch.no_grad():
        for param in relative.parameters():
            param.add_(0.1 * param.std() * torch.randn_like(param))  # a fine-tune's worth of drift
    relative.save_pretrained(tmp_path / "relative")
    _, report = merge([a, tmp_path / "relative", stranger])
    assert report.cosines[1] > 0.9 and abs(report.cosines[2]) < 0.2, report.cosines
    assert report.unrelated() == [2]
    assert main(["merge", str(a), str(stranger), "--out", str(tmp_path / "m")]) == 0
    assert f"warning: {stranger} looks unrelated" in capsys.readouterr().err
    assert main(["merge", str(a), str(tmp_path / "relative"), "--out", str(tmp_path / "n")]) == 0
    assert "warning" not in capsys.readouterr().err
