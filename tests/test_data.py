"""The pretraining data pipeline end to end on real Wikipedia (WikiExtractor .gz): train a vocabulary, prepare
shards, build examples of every objective, mask a batch. The parts are tested in test_data_*.py."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch
from conftest import shared_file

from encoderlab.data.collate import IGNORE_INDEX, MaskingCollator
from encoderlab.data.corpus import iter_documents
from encoderlab.data.examples import PretrainingExamples
from encoderlab.data.prepare import prepare
from encoderlab.data.shards import TokenShards
from encoderlab.data.tokenizer_training import train_tokenizer
from encoderlab.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def wikipedia(tmp_path_factory):
    """Two real WikiExtractor files, a 4,000-token vocabulary trained on the first, and their shards."""
    files = [shared_file("wikipedia/AA/wiki_00.gz"), shared_file("wikipedia/AA/wiki_01.gz")]
    folder = tmp_path_factory.mktemp("wikipedia")
    train_tokenizer(files[:1], vocab_size=4000, out_dir=folder / "tokenizer")
    stats = prepare(files, folder / "tokenizer", folder / "out", holdout=0.1, workers=2, progress=False)
    return files, folder / "out", stats


def test_prepare_real_wikipedia(wikipedia):
    files, out, stats = wikipedia
    articles = sum(1 for f in files for _ in iter_documents(f))
    with gzip.open(files[0], "rb") as a, gzip.open(files[1], "rb") as b:
        assert stats["bytes"] == len(a.read()) + len(b.read())
    train, valid = TokenShards(out, "train"), TokenShards(out, "valid")
    assert train.num_documents + valid.num_documents == stats["documents"] == articles
    assert 0 < valid.num_documents == stats["valid_documents"] < articles / 3
    assert train.num_tokens + valid.num_tokens == stats["tokens"] > 200_000
    assert stats["sentences"] > 10_000 and train.dtype == np.uint16
    tokenizer = Tokenizer.from_pretrained(out / "tokenizer")
    texts = [tokenizer.decode(train.document_tokens(d).tolist()) for d in range(train.num_documents)]
    held_out = [tokenizer.decode(valid.document_tokens(d).tolist()) for d in range(valid.num_documents)]
    assert not set(texts) & set(held_out)
    assert sum(t.startswith("anarchism is a political philosophy") for t in texts + held_out) == 1
    assert not any("doc id" in t or "curid" in t for t in texts + held_out)


@pytest.mark.parametrize("objective", ["mlm", "nsp", "sop"])
def test_real_examples_and_masked_batches(wikipedia, objective):
    _, out, _ = wikipedia
    shards = TokenShards(out)
    examples = PretrainingExamples(shards, objective, 128, seed=0)
    batch_examples = [examples.get(0, i) for i in range(64)]
    assert all(len(e.input_ids) <= 128 for e in batch_examples)
    masker = MaskingCollator(shards.vocab_size, shards.mask_id, shards.pad_id, shards.special_ids, whole_word=True)
    batch = masker(batch_examples, torch.Generator().manual_seed(0))
    chosen = batch["labels"] != IGNORE_INDEX
    assert 0.1 < chosen.sum() / batch["attention_mask"].sum() < 0.2
    assert ("next_sentence_label" in batch) == (objective != "mlm")
    if objective == "nsp":
        labels = [examples.get(0, i).next_sentence_label for i in range(examples.num_examples(0))]
        assert 0.45 < np.mean(labels) < 0.6
