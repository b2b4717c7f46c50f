"""Long texts read whole in sliding windows: classify and embed (pipelines, finetune, evaluate) against windows
built by hand and run through transformers' own models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from transformers import BertConfig, BertForSequenceClassification, BertModel

from encoderlab.cli import main
from encoderlab.engine import Encoded, encode, split_windows
from encoderlab.errors import InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.tokenizer import Tokenizer
from hf_oracle import randomize

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

WORDS = "the a film movie was good bad very long story actor plot and it but not great dull".split()
LENGTH, STRIDE = 16, 4  # a window of 16 tokens holds 14 of the text; neighbours share 4


def long_text(seed: int, words: int = 40) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny classifier and a tiny bare encoder, transformers' own, with a WordPiece tokenizer."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, id2label={0: "neg", 1: "pos"},
                        label2id={"neg": 0, "pos": 1})
    out = {}
    for name, cls in (("classify", BertForSequenceClassification), ("base", BertModel)):
        torch.manual_seed(0)
        model = cls(config).eval()
        randomize(model, seed=5)
        out[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(out[name])
        tokenizer.save(out[name])
    return out


def hand_windows(tokenizer: Tokenizer, text: str) -> list[list[int]]:
    """[CLS] piece [SEP] windows of LENGTH tokens whose pieces overlap by STRIDE, built without encoderlab's code."""
    ids = tokenizer.encode(text, truncation=False, add_special_tokens=False)
    room, out = LENGTH - 2, []
    for start in range(0, len(ids), room - STRIDE):
        out.append([tokenizer.cls_id, *ids[start:start + room], tokenizer.sep_id])
        if start + room >= len(ids):
            return out
    return out


def test_split_windows_cover_the_text_with_the_stride_between_neighbours(folders):
    tokenizer = Tokenizer.from_pretrained(folders["base"])
    [item] = encode(tokenizer, [long_text(1)])
    windows = split_windows(item, LENGTH, STRIDE)
    assert [w.input_ids for _, w in windows] == hand_windows(tokenizer, long_text(1))
    starts = [start for start, _ in windows]
    assert starts[1] - starts[0] == LENGTH - 2 - STRIDE and all(len(w.input_ids) <= LENGTH for _, w in windows)
    assert windows[0][1].offsets[1] == item.offsets[1]  # characters still map back to the text
    [short] = encode(tokenizer, ["a good film"])
    assert split_windows(short, LENGTH, STRIDE) == [(0, short)]
    with pytest.raises(InputError, match="stride 14"):
        split_windows(item, LENGTH, LENGTH - 2)


@pytest.mark.parametrize("combine", ["logits", "probs"])
def test_classify_averages_the_windows_as_transformers_computes_them(folders, combine):
    tokenizer = Tokenizer.from_pretrained(folders["classify"])
    oracle = BertForSequenceClassification.from_pretrained(folders["classify"]).eval()
    texts = [long_text(2), "a good film", long_text(3, 70)]
    got = pipeline("classify", folders["classify"], max_length=LENGTH, stride=STRIDE, combine=combine)(texts)
    for text, result in zip(texts, got):
        with torch.no_grad():
            logits = torch.cat([oracle(torch.tensor([w])).logits for w in hand_windows(tokenizer, text)])
        probs = logits.softmax(-1).mean(0) if combine == "probs" else logits.mean(0).softmax(-1)
        assert_close(torch.tensor([result["scores"]["neg"], result["scores"]["pos"]]), probs, atol=2e-6, rtol=0)
    truncated = pipeline("classify", folders["classify"], max_length=LENGTH)(texts)
    assert truncated[1] == got[1]  # a text that fits is read as before
    assert truncated[0]["scores"] != got[0]["scores"]


def test_embed_averages_the_pooled_windows_then_normalizes(folders):
    tokenizer = Tokenizer.from_pretrained(folders["base"])
    oracle = BertModel.from_pretrained(folders["base"]).eval()
    text = long_text(4, 60)
    got = pipeline("embed", folders["base"], max_length=LENGTH, stride=STRIDE, normalize=True).embed([text])
    with torch.no_grad():
        pooled = torch.stack([oracle(torch.tensor([w])).last_hidden_state[0].mean(0)
                              for w in hand_windows(tokenizer, text)])
    assert_close(torch.from_numpy(got[0]), torch.nn.functional.normalize(pooled.mean(0), dim=0), atol=2e-6, rtol=0)


def test_finetune_trains_on_every_window_and_the_folder_keeps_the_stride(folders, tmp_path, capsys):
    rows = [f"{long_text(10 + i)}\t{i % 2}" for i in range(12)]
    (tmp_path / "long.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["finetune", "classify", "--model", str(folders["classify"]), "--train", str(tmp_path / "long.tsv"),
                 "--eval", str(tmp_path / "long.tsv"), "--out", str(out), "--max-length", str(LENGTH),
                 "--stride", str(STRIDE), "--epochs", "1", "--batch-size", "8", "--no-progress", "--json"]) == 0
    training = json.loads((out / "training.json").read_text())
    assert training["train_features"] > 2 * training["train_examples"]  # every window is a training feature
    assert json.loads((out / "task.json").read_text())["stride"] == STRIDE
    capsys.readouterr()
    assert main(["evaluate", "classify", "--model", str(out), "--data", str(tmp_path / "long.tsv"), "--json"]) == 0
    accuracy = json.loads(capsys.readouterr().out)["metrics"]["accuracy"]
    classify = pipeline("classify", out)  # the folder's stride: the pipeline reads texts as evaluate does
    assert classify.stride == STRIDE
    predicted = [r["label"] for r in classify([row.split("\t")[0] for row in rows])]
    assert accuracy == pytest.approx(np.mean([p == str(i % 2) for i, p in enumerate(predicted)]))


def test_a_stride_that_leaves_no_room_is_refused(folders):
    with pytest.raises(InputError, match="stride"):
        pipeline("classify", folders["classify"], max_length=LENGTH, stride=LENGTH)([long_text(5)])
    with pytest.raises(InputError, match="combine"):
        pipeline("classify", folders["classify"], combine="max")
