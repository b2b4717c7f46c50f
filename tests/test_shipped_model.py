"""Models under models/NAME load as `--model NAME`, and models/encoderlab-mini, the encoder this toolkit
pretrained itself (issue 7).

The name lookup is tested on a tiny model planted in a temporary models/ folder. The weights of encoderlab-mini
are not tracked (the repository keeps no large files): `python scripts/ship_model.py runs/encoderlab-mini`
writes them, and the tests of the real model skip, with that reason, where they are absent. Where present, it
loads by name, transformers loads the same files as a BertForMaskedLM with the same logits, its card states
what it saw, and fill-mask runs on it from the CLI. The fill-mask goals of the issue are a test too: it is
expected to fail (strictly) while the model is the short CPU run, and must be turned back into a plain test the
day a better-trained model is shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoTokenizer, BertForMaskedLM

from encoderlab import EncoderConfig, MaskedLMModel
from encoderlab import paths
from encoderlab.checkpoint import load_model, save_pretrained
from encoderlab.cli import main
from encoderlab.errors import CheckpointError
from encoderlab.infer.pipelines import pipeline
from encoderlab.paths import model_aliases, resolve_model_path, shipped_model

ROOT = Path(__file__).resolve().parents[1]
NAME = "encoderlab-mini"
FOLDER = ROOT / "models" / NAME
SEED_SENTENCES = ["The cat [MASK] on the mat.", "Paris is the [MASK] of France.", "I love [MASK] learning."]
needs_the_model = pytest.mark.skipif(
    not (FOLDER / "model.safetensors").is_file(),
    reason=f"{FOLDER} is not in the repository (large files are not tracked); "
           "make it with `python scripts/ship_model.py runs/encoderlab-mini` after the README's pretraining run")


def test_a_model_under_models_loads_by_its_plain_name_in_fp32(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "SHIPPED_MODELS", tmp_path)
    torch.manual_seed(0)
    model = MaskedLMModel(EncoderConfig.from_preset("bert-tiny", vocab_size=64, max_position_embeddings=32)).eval()
    save_pretrained(model.to(torch.bfloat16), tmp_path / "tiny-mini")  # shipped in bf16, like encoderlab-mini
    assert resolve_model_path("tiny-mini") == tmp_path / "tiny-mini"
    assert "tiny-mini" in model_aliases()
    for bad in ("../" + tmp_path.name + "/tiny-mini", ".tiny-mini", ""):
        assert shipped_model(bad) is None
    with pytest.raises(CheckpointError, match="tiny-mini"):  # the error lists what --model accepts
        resolve_model_path("tiny-nope")
    loaded = load_model("tiny-mini")
    assert loaded.kind == "mlm" and next(loaded.parameters()).dtype == torch.float32  # bf16 on disk, fp32 in use
    ids = torch.randint(5, 64, (2, 9))
    with torch.no_grad():
        assert_close(loaded(ids, torch.ones_like(ids), torch.zeros_like(ids)).logits,
                     model.float()(ids, torch.ones_like(ids), torch.zeros_like(ids)).logits)  # the bf16-rounded weights


@needs_the_model
def test_it_ships_within_the_size_limit_with_a_card():
    files = {p.name for p in FOLDER.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "README.md"} <= files
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) <= 60e6
    card = (FOLDER / "README.md").read_text(encoding="utf-8")
    rows = [line for line in (FOLDER / "metrics.csv").read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("step")]
    steps = int(rows[-1].split(",")[0])
    assert f"| steps | {steps:,} of batch" in card  # the card states the steps the metrics record
    for fact in ("tokens seen", "compute", "held-out MLM accuracy", "WordPiece, uncased"):
        assert fact in card


@needs_the_model
def test_transformers_loads_it_as_bert_for_masked_lm_with_the_same_logits():
    reference, info = BertForMaskedLM.from_pretrained(FOLDER, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    batch = tokenizer(SEED_SENTENCES, padding=True, return_tensors="pt")
    ours = load_model(NAME)
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    got = got.logits
    mask = batch["attention_mask"].bool()
    assert_close(got[mask], expected[mask], atol=1e-4, rtol=1e-4)


@needs_the_model
def test_fill_mask_cli_runs_on_it(capsys):
    assert main(["fill-mask", "--model", NAME, *SEED_SENTENCES, "--top-k", "5", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in results] == SEED_SENTENCES
    for result in results:
        (only,) = result["masks"]
        assert len(only["predictions"]) == 5
        assert all(0 <= p["score"] <= 1 for p in only["predictions"])


@needs_the_model
@pytest.mark.xfail(strict=True, reason="the shipped model is a short CPU run (see models/encoderlab-mini/README.md): "
                                       "it predicts frequent words; no GPU was lent to train it further")
def test_the_issue_fill_mask_goals():
    spec = json.loads((ROOT / "configs" / "fill-mask-probes.json").read_text(encoding="utf-8"))
    fill = pipeline("fill-mask", NAME)

    def passed(cases: list[dict]) -> int:
        results = fill([c["text"] for c in cases], top_k=5)
        return sum(any(p["token"] in c["answers"] for p in r["masks"][0]["predictions"])
                   for c, r in zip(cases, results))

    assert passed(spec["required"]) == len(spec["required"])  # "capital" and "sat" in the top 5
    assert passed(spec["probes"]) >= 8
