"""The shipped models/encoderlab-fill-mask is the default fill-mask model (issue 16): `encoderlab fill-mask` and
pipeline("fill-mask") without a model, and serve's /fill-mask where the served model has no masked-LM head.

The wiring is tested on a tiny masked-LM model planted as the default in a temporary models/ folder, and on
minilm (no masked-LM head). The tests of the real shipped model skip where models/encoderlab-fill-mask is absent.
Its quality (held-out accuracy, the probes) is bench/'s to measure, not these tests'.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import uvicorn
from fastapi.testclient import TestClient
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.testing import assert_close
from transformers import AutoTokenizer, BertForMaskedLM

from encoderlab import EncoderConfig, MaskedLMModel
from encoderlab import paths
from encoderlab.checkpoint import load_model, save_pretrained
from encoderlab.cli import main
from encoderlab.errors import CheckpointError, InputError, MissingHeadError
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app, load_pipelines
from encoderlab.nn.model import SequenceClassifier
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL
from encoderlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / DEFAULT_FILL_MASK_MODEL
SEED_SENTENCES = ["The cat [MASK] on the mat.", "Paris is the [MASK] of France.", "I love [MASK] learning."]
WORDS = "the cat sat on mat paris is capital of france i love deep learning a dog ran".split()
TINY_TEXTS = ["the cat [MASK] on the mat", "paris is the [MASK] of france"]
needs_the_model = pytest.mark.skipif(
    not (SHIPPED / "model.safetensors").is_file(),
    reason=f"{SHIPPED} is absent: it is made by the continued-pretraining run of configs/fill-mask-minilm.yaml "
           "and committed under models/ (see the README)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A random 2-layer masked-LM model and a classifier (no masked-LM head), with a tiny WordPiece vocabulary."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {"mlm": MaskedLMModel(config), "other-mlm": MaskedLMModel(config),
              "classify": SequenceClassifier(config.replace(labels=["neg", "pos"]), num_labels=2)}
    root = tmp_path_factory.mktemp("models")
    for name, model in models.items():
        save_pretrained(model.eval(), root / name)
        tokenizer.save(root / name)
    return {name: root / name for name in models}


@pytest.fixture
def planted_default(tiny, tmp_path, monkeypatch) -> Path:
    """models/ is a temporary folder whose encoderlab-fill-mask is the tiny masked-LM model."""
    monkeypatch.setattr(paths, "SHIPPED_MODELS", tmp_path)
    (tmp_path / DEFAULT_FILL_MASK_MODEL).symlink_to(tiny["mlm"], target_is_directory=True)
    return tiny["mlm"]


# ---- the default, wired everywhere ---------------------------------------------------------------------------
def test_fill_mask_cli_and_pipeline_without_a_model_use_the_default(planted_default, capsys):
    expected = pipeline("fill-mask", planted_default)(TINY_TEXTS, top_k=3)
    assert main(["fill-mask", *TINY_TEXTS, "--top-k", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(expected))
    assert pipeline("fill-mask")(TINY_TEXTS, top_k=3) == expected


def test_other_pipelines_have_no_default():
    with pytest.raises(InputError, match="'embed' has no default model"):
        pipeline("embed")


def test_a_missing_default_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(paths, "SHIPPED_MODELS", tmp_path)  # a models/ folder without the shipped model
    assert main(["fill-mask", "Paris is the [MASK] of France."]) == 2
    err = capsys.readouterr().err
    assert "default fill-mask model 'encoderlab-fill-mask' is missing" in err
    assert str(tmp_path / DEFAULT_FILL_MASK_MODEL / "config.json") in err
    with pytest.raises(CheckpointError, match="is missing"):
        pipeline("fill-mask")


# ---- no masked-LM head: the error names the shipped model ------------------------------------------------------
def test_fill_mask_of_minilm_says_it_has_no_mlm_head_and_names_the_default(capsys):
    assert main(["fill-mask", "--model", "minilm", "Paris is the [MASK] of France."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: minilm has no masked-LM head (its config.json names BertModel)")
    assert f"use --model {DEFAULT_FILL_MASK_MODEL} (the default)" in err


def test_fill_mask_pipeline_of_a_classifier_raises_missing_head(tiny):
    with pytest.raises(MissingHeadError, match=f"no masked-LM head .*BertForSequenceClassification.*"
                                               f"{DEFAULT_FILL_MASK_MODEL}"):
        pipeline("fill-mask", tiny["classify"])


def test_a_damaged_mlm_checkpoint_keeps_its_own_error(tiny, tmp_path):
    """A folder that says it holds a masked-LM head but lacks its tensors is reported as it is, not as headless."""
    damaged = shutil.copytree(tiny["mlm"], tmp_path / "damaged")
    tensors = load_file(damaged / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.startswith("cls.")}, damaged / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing tensors: cls.predictions") as caught:
        pipeline("fill-mask", damaged)
    assert not isinstance(caught.value, MissingHeadError)


# ---- serve: /fill-mask by the default where the model has no masked-LM head ------------------------------------
def test_server_without_a_masked_lm_model_answers_fill_mask_with_the_fallback(tiny):
    pipelines, reasons = load_pipelines(str(tiny["classify"]), fill_mask_model=str(tiny["mlm"]))
    assert sorted(pipelines) == ["classify", "fill-mask"] and "fill-mask" not in reasons
    expected = pipeline("fill-mask", tiny["mlm"])(TINY_TEXTS, top_k=3)
    with TestClient(create_app(pipelines, Limits(), model=str(tiny["classify"]), unavailable=reasons)) as client:
        response = client.post("/fill-mask", json={"texts": TINY_TEXTS, "top_k": 3})
        health = client.get("/health").json()
    assert response.status_code == 200, response.text
    assert response.json()["results"] == json.loads(json.dumps(expected))
    assert health["models"] == {"classify": str(tiny["classify"]), "fill-mask": str(tiny["mlm"])}


def test_server_with_a_masked_lm_model_serves_fill_mask_by_it_alone(tiny):
    pipelines, reasons = load_pipelines(str(tiny["mlm"]), fill_mask_model=str(tiny["other-mlm"]))
    assert sorted(pipelines) == ["embed", "fill-mask"]
    assert {task: pipe.model_name for task, pipe in pipelines.items()} == {"embed": str(tiny["mlm"]),
                                                                          "fill-mask": str(tiny["mlm"])}


def test_server_fallback_is_not_loaded_when_fill_mask_is_not_asked_for(tiny, tmp_path):
    pipelines, reasons = load_pipelines(str(tiny["classify"]), tasks=["classify"],
                                        fill_mask_model=str(tmp_path / "absent"))  # loading it would fail
    assert list(pipelines) == ["classify"] and reasons["fill-mask"] == "not asked for (--tasks)"


def test_server_says_why_fill_mask_is_missing_when_the_fallback_fails_too(minilm_path, tmp_path):
    pipelines, reasons = load_pipelines(str(minilm_path), tasks=["embed", "fill-mask"],
                                        fill_mask_model=str(tmp_path / "absent"))
    assert list(pipelines) == ["embed"]
    assert "no masked-LM head" in reasons["fill-mask"] and DEFAULT_FILL_MASK_MODEL in reasons["fill-mask"]
    assert f"{tmp_path / 'absent'} could not serve it either" in reasons["fill-mask"]


# ---- the shipped model itself ----------------------------------------------------------------------------------
@needs_the_model
def test_fill_mask_cli_without_model_answers_the_seeds_sentences(capsys):
    assert main(["fill-mask", *SEED_SENTENCES]) == 0  # no --model: the shipped model, offline
    lines = capsys.readouterr().out.splitlines()
    assert lines[0::2] == SEED_SENTENCES
    for line in lines[1::2]:
        assert line.startswith("  [MASK] 1: ")
        scores = [float(s) for s in line.removeprefix("  [MASK] 1: ").split()[1::2]]
        assert len(scores) == 5 and all(0 < s <= 1 for s in scores) and scores == sorted(scores, reverse=True)


# What each of the seeds' sentences expects in the top 5 (issue 46, item 4: the card says which ones the model misses).
SEED_ANSWERS = {"The cat [MASK] on the mat.": {"sat"}, "Paris is the [MASK] of France.": {"capital"},
                "I love [MASK] learning.": {"deep", "machine"}}


@needs_the_model
def test_the_card_says_which_of_the_seeds_sentences_the_model_misses():
    """The card's list of the seeds' sentences shows the top 5 the model gives today and passes or misses each as
    the model does: a reshipped model whose card was not updated fails here."""
    card = (SHIPPED / "README.md").read_text(encoding="utf-8")
    section = card.split("The seeds' sentences", 1)[1].split("It reproduces with these commands", 1)[0]
    results = pipeline("fill-mask", DEFAULT_FILL_MASK_MODEL)(list(SEED_ANSWERS), top_k=5)
    for (sentence, expected), result in zip(SEED_ANSWERS.items(), results):
        top = [p["token"] for p in result["masks"][0]["predictions"]]
        verdict = "pass" if expected & set(top) else "miss"
        row = f"- `{sentence}` -> {' '.join(f'`{t}`' for t in top)} ({verdict}; expected "
        assert row in section, f"the card's row for {sentence!r} should begin: {row}"
    assert "22.7M parameters" in section and "two CPU cores" in section and "GPU" in section  # why, and what next


@needs_the_model
def test_serve_of_minilm_answers_fill_mask_with_the_shipped_model(monkeypatch):
    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **config: apps.append(app))  # the app `serve` built, in-process
    assert main(["serve", "--model", "minilm", "--tasks", "embed", "fill-mask", "--threads", "1"]) == 0
    expected = pipeline("fill-mask")(SEED_SENTENCES, top_k=5)
    with TestClient(apps[0], base_url="http://localhost") as client:
        response = client.post("/fill-mask", json={"texts": SEED_SENTENCES})
        health = client.get("/health").json()
    assert response.status_code == 200, response.text
    assert response.json()["results"] == json.loads(json.dumps(expected))
    assert health["models"] == {"embed": "minilm", "fill-mask": DEFAULT_FILL_MASK_MODEL}
    assert health["tasks"] == ["embed", "fill-mask"] and health["unavailable"] == {
        task: "not asked for (--tasks)" for task in ("classify", "ner", "qa", "rerank", "colbert", "splade")}


@needs_the_model
def test_transformers_loads_it_as_bert_for_masked_lm_with_the_same_logits():
    reference, info = BertForMaskedLM.from_pretrained(SHIPPED, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    batch = AutoTokenizer.from_pretrained(SHIPPED)(SEED_SENTENCES, padding=True, return_tensors="pt")
    ours = load_model(DEFAULT_FILL_MASK_MODEL)
    assert ours.kind == "mlm"
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    mask = batch["attention_mask"].bool()
    assert_close(got[mask], expected[mask], atol=1e-4, rtol=1e-4)


@needs_the_model
def test_it_ships_in_bf16_within_the_size_limit_with_a_card_naming_its_start():
    files = {p.name for p in SHIPPED.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    assert sum(p.stat().st_size for p in SHIPPED.iterdir() if p.is_file()) <= 60e6
    config = json.loads((SHIPPED / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["BertForMaskedLM"]
    with safe_open(SHIPPED / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}
    card = (SHIPPED / "README.md").read_text(encoding="utf-8")
    assert "minilm" in card and "all-MiniLM-L6-v2" in card
