"""models/encoderlab-mini: the encoder this toolkit pretrained itself, shipped in the repository (issue 7).

It loads by name, transformers loads the same files as a BertForMaskedLM with the same logits, its card states
what it saw and what it scores, and fill-mask runs on it from the CLI. The fill-mask goals of the issue are a
test too: it is expected to fail (strictly) while the model is the short CPU run, and must be turned back into
a plain test the day a better-trained model is shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoTokenizer, BertForMaskedLM

from encoderlab.checkpoint import load_model, model_aliases, resolve_model_path, shipped_model
from encoderlab.cli import main
from encoderlab.errors import CheckpointError
from encoderlab.infer.pipelines import pipeline

ROOT = Path(__file__).resolve().parents[1]
NAME = "encoderlab-mini"
FOLDER = ROOT / "models" / NAME
SEED_SENTENCES = ["The cat [MASK] on the mat.", "Paris is the [MASK] of France.", "I love [MASK] learning."]


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


def test_it_loads_by_name_and_only_by_a_plain_name():
    assert resolve_model_path(NAME) == FOLDER
    assert NAME in model_aliases()
    for bad in ("../models/" + NAME, "." + NAME, ""):
        assert shipped_model(bad) is None
    with pytest.raises(CheckpointError, match=NAME):  # the error lists what --model accepts
        resolve_model_path("encoderlab-nope")
    model = load_model(NAME)
    assert model.kind == "mlm" and next(model.parameters()).dtype == torch.float32  # bf16 on disk, fp32 in use


def test_transformers_loads_it_as_bert_for_masked_lm_with_the_same_logits():
    reference, info = BertForMaskedLM.from_pretrained(FOLDER, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    batch = tokenizer(SEED_SENTENCES, padding=True, return_tensors="pt")
    ours = load_model(NAME)
    with torch.no_grad():
        expected = reference.eval()(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    got = got.logits if hasattr(got, "logits") else got
    mask = batch["attention_mask"].bool()
    assert_close(got[mask], expected[mask], atol=1e-4, rtol=1e-4)


def test_fill_mask_cli_runs_on_it(capsys):
    assert main(["fill-mask", "--model", NAME, *SEED_SENTENCES, "--top-k", "5", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in results] == SEED_SENTENCES
    for result in results:
        (only,) = result["masks"]
        assert len(only["predictions"]) == 5
        assert all(0 <= p["score"] <= 1 for p in only["predictions"])


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
