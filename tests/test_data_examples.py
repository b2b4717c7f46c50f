"""encoderlab.data.examples: packed and paired examples respect documents, follow BERT's statistics, and are
deterministic in (seed, epoch, index).

The shards here are synthetic: token id = 10 + position in the corpus, so every example can be traced back
to the documents and sentences it came from.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from encoderlab.data.examples import PretrainingExamples, trim_lengths
from encoderlab.data.shards import (
    EncodedDocuments,
    ShardWriter,
    TokenShards,
    write_meta,
)
from encoderlab.errors import ConfigError

CLS, SEP, FIRST_ID = 2, 3, 10


class Corpus:
    """Synthetic shards plus the maps from a token id back to its document and sentence."""

    def __init__(self, folder: Path, documents: list[list[int]], shard_tokens: int = 5000):
        lengths = np.array([n for doc in documents for n in doc], np.int64)
        total = int(lengths.sum())
        self.word_starts = np.random.default_rng(0).random(total) < 0.6  # (N,) words of ~1.7 tokens
        docs = EncodedDocuments(np.arange(FIRST_ID, FIRST_ID + total, dtype=np.uint32), self.word_starts, lengths, np.array([len(d) for d in documents], np.int64),
                                np.zeros(len(documents), bool))
        writer = ShardWriter(folder / "train", np.uint32, shard_tokens)
        writer.add(docs)
        ids = {"vocab_size": FIRST_ID + total, "pad_id": 0, "unk_id": 1, "cls_id": CLS, "sep_id": SEP,
               "mask_id": 4, "special_ids": [0, 1, 2, 3, 4]}
        write_meta(folder, np.uint32, ids, {"train": writer.close()})
        self.shards = TokenShards(folder)
        self.sentence_starts = np.concatenate([[0], np.cumsum(lengths)])  # (S+1,) positions
        per_doc = np.cumsum([0] + [len(d) for d in documents])
        self.document_starts = self.sentence_starts[per_doc]  # (D+1,) positions

    def document_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.document_starts, ids - FIRST_ID, side="right") - 1

    def is_sentence_start(self, token_id: int) -> bool:
        return token_id - FIRST_ID in set(self.sentence_starts.tolist())


def random_documents(count: int, seed: int, long_every: int = 0) -> list[list[int]]:
    """Sentence lengths of `count` documents: 1-30 sentences of 1-12 tokens, plus an occasional 100-token one."""
    rng = random.Random(seed)
    return [[100 if long_every and rng.randrange(long_every) == 0 else rng.randint(1, 12)
             for _ in range(rng.randint(1, 30))] for _ in range(count)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("shards"), random_documents(600, seed=0, long_every=50))


def segments(example) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) token ids of an example, checking the [CLS] A [SEP] (B [SEP]) layout and token types."""
    ids, types = example.input_ids, example.token_type_ids
    assert ids[0] == CLS and ids[-1] == SEP
    seps = np.flatnonzero(ids == SEP)
    a, b = ids[1:seps[0]], ids[seps[0] + 1:-1] if len(seps) == 2 else ids[:0]
    assert len(seps) in (1, 2) and len(a) >= 1 and (len(seps) == 1 or len(b) >= 1)
    assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
    assert example.word_starts.dtype == bool and example.word_starts[[0, seps[0], -1]].all()
    return a, b


def contiguous(tokens: np.ndarray) -> bool:
    return bool((np.diff(tokens.astype(np.int64)) == 1).all())


def all_examples(examples: PretrainingExamples, epoch: int = 0) -> list:
    return [examples.get(epoch, i) for i in range(examples.num_examples(epoch))]


@pytest.mark.parametrize("max_length", [16, 64])
def test_packed_sequences_stay_in_one_document_and_cover_every_token_once(corpus, max_length):
    examples = PretrainingExamples(corpus.shards, "mlm", max_length, seed=0)
    covered, spans = np.zeros(corpus.shards.num_tokens, int), []
    for example in all_examples(examples):
        a, b = segments(example)
        assert len(b) == 0 and example.next_sentence_label == -1 and len(example.input_ids) <= max_length
        assert contiguous(a) and len(set(corpus.document_of(a))) == 1
        covered[a - FIRST_ID] += 1
        spans.append((int(a[0]), int(a[-1])))
    assert (covered == 1).all()
    # Greedy packing: a sequence starts at a sentence start (or inside a sentence longer than a sequence)
    # and could not have taken its successor's first sentence in the same document.
    budget, starts = max_length - 2, corpus.sentence_starts
    for (first, last), (next_first, _) in zip(sorted(spans), sorted(spans)[1:]):
        sentence = int(np.searchsorted(starts, next_first - FIRST_ID, side="right")) - 1
        if starts[sentence] == next_first - FIRST_ID and np.ptp(corpus.document_of(np.array([last, next_first]))) == 0:
            assert next_first - first + (starts[sentence + 1] - starts[sentence]) > budget
        assert starts[sentence + 1] - starts[sentence] > budget or starts[sentence] == next_first - FIRST_ID


def test_nsp_true_next_follows_a_in_its_document_and_random_next_comes_from_another(tmp_path):
    # Long documents, as in Wikipedia: few chunks of a single sentence, which BERT always pairs with a random B.
    rng = random.Random(3)
    corpus = Corpus(tmp_path, [[rng.randint(1, 12) for _ in range(rng.randint(100, 200))] for _ in range(150)])
    examples = PretrainingExamples(corpus.shards, "nsp", 32, seed=0)
    labels, untrimmed = [], 0
    for example in all_examples(examples):
        a, b = segments(example)
        assert len(example.input_ids) <= 32 and contiguous(a) and contiguous(b)
        doc_a, doc_b = corpus.document_of(a), corpus.document_of(b)
        assert len(set(doc_a)) == 1 and len(set(doc_b)) == 1
        if example.next_sentence_label == 0:
            assert doc_a[0] == doc_b[0] and b[0] > a[-1]
            if len(example.input_ids) < 32:  # nothing trimmed: B starts right where A ends, on sentence bounds
                untrimmed += 1
                assert b[0] == a[-1] + 1 and corpus.is_sentence_start(a[0]) and corpus.is_sentence_start(b[0])
        else:
            assert example.next_sentence_label == 1 and doc_a[0] != doc_b[0]
        labels.append(example.next_sentence_label)
    assert len(labels) > 5000 and untrimmed > 100
    assert 0.47 < np.mean(labels) < 0.55  # sigma ~ 0.007; forced random pairs add ~0.02


def test_short_sequence_probability_sets_the_rate_of_short_examples(tmp_path):
    corpus = Corpus(tmp_path, [[4] * 20_000 for _ in range(3)], shard_tokens=10**6)  # 4-token sentences

    def short_rate(probability: float) -> float:
        examples = PretrainingExamples(corpus.shards, "nsp", 32, seed=1, short_seq_prob=probability)
        lengths = np.array([len(e.input_ids) for e in all_examples(examples)])
        assert lengths.max() <= 32 and len(lengths) > 7000
        return float(np.mean(lengths < 28))

    # A full target (29 tokens) always fills 32 - 3 tokens; a short one is uniform in [2, 29] and gathers
    # whole 4-token sentences, so it stays under 28 - 3 tokens when it is <= 24: 23 of its 28 values.
    assert short_rate(0.0) < 0.002
    assert abs(short_rate(0.1) - 0.1 * 23 / 28) < 0.015  # sigma ~ 0.003
    assert abs(short_rate(0.5) - 0.5 * 23 / 28) < 0.03


def test_sop_pairs_are_consecutive_and_swapped_half_the_time(corpus):
    examples = PretrainingExamples(corpus.shards, "sop", 32, seed=0)
    labels = []
    for example in all_examples(examples):
        a, b = segments(example)
        if example.next_sentence_label == -1:  # a one-token chunk: nothing to pair
            assert len(b) == 0
            continue
        first, second = (a, b) if example.next_sentence_label == 0 else (b, a)
        assert second[0] > first[-1] and len(set(corpus.document_of(np.concatenate([a, b])))) == 1
        labels.append(example.next_sentence_label)
    assert len(labels) > 2000 and 0.45 < np.mean(labels) < 0.55  # sigma ~ 0.011


@pytest.mark.parametrize("objective", ["mlm", "nsp", "sop"])
def test_examples_are_deterministic_in_seed_epoch_and_index(corpus, objective):
    first, again = (PretrainingExamples(corpus.shards, objective, 48, seed=5) for _ in range(2))
    other_seed = PretrainingExamples(corpus.shards, objective, 48, seed=6)
    picks = [(epoch, i) for epoch in (2, 0, 1) for i in (0, 7, 123, 999)]
    expected = {pick: first.get(*pick) for pick in picks}
    for pick in reversed(picks):  # another instance, asked in another order
        x, y = expected[pick], again.get(*pick)
        assert np.array_equal(x.input_ids, y.input_ids) and x.next_sentence_label == y.next_sentence_label
        assert np.array_equal(x.token_type_ids, y.token_type_ids) and np.array_equal(x.word_starts, y.word_starts)

    def first_tokens(examples: PretrainingExamples, epoch: int) -> list[int]:
        return [int(examples.get(epoch, i).input_ids[1]) for i in range(200)]

    assert first_tokens(first, 0) != first_tokens(first, 1)  # each epoch has its own order
    assert first_tokens(first, 0) != first_tokens(other_seed, 0)
    if objective == "mlm":
        assert first.num_examples(0) == first.num_examples(1)  # the same packing, reordered
        assert sorted(first_tokens(first, 0)) != sorted(first_tokens(first, 1))
    with pytest.raises(IndexError, match="out of range"):
        first.get(0, first.num_examples(0))


@pytest.mark.parametrize("objective", ["mlm", "nsp"])
def test_word_starts_come_from_the_shards_and_every_segment_starts_a_word(corpus, objective):
    examples = PretrainingExamples(corpus.shards, objective, 48, seed=0)
    for example in all_examples(examples)[:500]:
        seps = np.flatnonzero(example.input_ids == SEP)
        for first, end in [(1, seps[0])] + ([(seps[0] + 1, seps[1])] if len(seps) == 2 else []):
            flags = example.word_starts[first:end]
            assert flags[0] and (flags[1:] == corpus.word_starts[example.input_ids[first + 1:end] - FIRST_ID]).all()


def test_examples_span_shards(corpus):
    assert len(corpus.shards.shards) > 3  # the fixture's corpus is spread over several shards
    examples = PretrainingExamples(corpus.shards, "nsp", 64, seed=0)
    shards_used = {corpus.shards.locate(int(d))[0] for e in all_examples(examples)[:2000]
                   for d in corpus.document_of(segments(e)[1][:1])}
    assert shards_used == set(range(len(corpus.shards.shards)))


def test_trim_lengths_matches_truncate_seq_pair():
    def reference(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
        cut_a = cut_b = 0
        while len_a - cut_a + len_b - cut_b > max_tokens:
            if len_a - cut_a > len_b - cut_b:
                cut_a += 1
            else:
                cut_b += 1
        return cut_a, cut_b

    for len_a in range(1, 30):
        for len_b in range(1, 30):
            for max_tokens in (2, 7, 20, 40):
                assert trim_lengths(len_a, len_b, max_tokens) == reference(len_a, len_b, max_tokens)


def test_bad_settings_are_refused(tmp_path, corpus):
    with pytest.raises(ConfigError, match="objective 'rtd'"):
        PretrainingExamples(corpus.shards, "rtd", 64, seed=0)
    with pytest.raises(ConfigError, match="max_length=4: nsp needs at least 5"):
        PretrainingExamples(corpus.shards, "nsp", 4, seed=0)
    single = Corpus(tmp_path, [[3, 4, 5]])
    with pytest.raises(ConfigError, match="needs at least 2, found 1"):
        PretrainingExamples(single.shards, "nsp", 64, seed=0)
    assert PretrainingExamples(single.shards, "mlm", 64, seed=0).num_examples(0) == 1
