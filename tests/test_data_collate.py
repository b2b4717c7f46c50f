"""encoderlab.data.collate: BERT's masking statistics, never a special token or padding, fresh masks per call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderlab.data.collate import IGNORE_INDEX, MaskingCollator
from encoderlab.data.examples import Example
from encoderlab.errors import ConfigError

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = {PAD, UNK, CLS, SEP, MASK}
VOCAB = 1000


def make_examples(count: int, seed: int = 0, pairs: bool = False) -> list[Example]:
    """Random examples of 20-300 tokens, words of 1-4 tokens, some [UNK] inside the text."""
    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(count):
        n = int(rng.integers(20, 300))
        body = rng.integers(5, VOCAB, n)
        body[rng.random(n) < 0.02] = UNK
        boundaries = np.cumsum(rng.integers(1, 5, n))  # words of 1-4 tokens
        starts = np.zeros(n, bool)
        starts[0], starts[boundaries[boundaries < n]] = True, True
        cut = n // 2 if pairs else n
        ids = np.concatenate([[CLS], body[:cut], [SEP]] + ([body[cut:], [SEP]] if pairs else []))
        word_starts = np.concatenate([[True], starts[:cut], [True]] + ([starts[cut:], [True]] if pairs else []))
        word_starts[cut + 2 if pairs else 0] = True
        types = np.zeros(len(ids), np.int64)
        if pairs:
            types[cut + 2:] = 1
        examples.append(Example(ids.astype(np.int64), types, word_starts, int(rng.integers(0, 2)) if pairs else -1))
    return examples


def collator(**kwargs) -> MaskingCollator:
    return MaskingCollator(VOCAB, MASK, PAD, SPECIALS, **kwargs)


def originals(examples: list[Example], shape: tuple[int, int]) -> torch.Tensor:
    out = torch.full(shape, PAD)
    for row, example in enumerate(examples):
        out[row, :len(example.input_ids)] = torch.from_numpy(example.input_ids)
    return out


@pytest.mark.parametrize("probability", [0.15, 0.3])
@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_proportions(probability, whole_word):
    examples = make_examples(400)
    batch = collator(mlm_probability=probability, whole_word=whole_word)(examples, torch.Generator().manual_seed(1))
    before = originals(examples, batch["input_ids"].shape)
    maskable = (batch["attention_mask"] == 1) & ~torch.isin(before, torch.tensor(sorted(SPECIALS)))
    chosen = batch["labels"] != IGNORE_INDEX
    n = int(maskable.sum())  # ~64k tokens: sigma of the rate ~0.0014 (more for whole words: ~2 tokens a word)
    assert abs(chosen.sum() / n - probability) < (0.01 if whole_word else 0.006)
    after = batch["input_ids"][chosen]
    as_mask = float((after == MASK).float().mean())
    unchanged = float((after == before[chosen]).float().mean())
    replaced = 1 - as_mask - unchanged
    assert abs(as_mask - 0.8) < 0.015 and abs(replaced - 0.1) < 0.012 and abs(unchanged - 0.1) < 0.012


@pytest.mark.parametrize("whole_word", [False, True])
def test_specials_and_padding_are_never_masked_and_labels_are_ignore_elsewhere(whole_word):
    examples = make_examples(64, pairs=True)
    batch = collator(mlm_probability=0.9, whole_word=whole_word)(examples, torch.Generator().manual_seed(2))
    before = originals(examples, batch["input_ids"].shape)
    special = torch.isin(before, torch.tensor(sorted(SPECIALS))) | (batch["attention_mask"] == 0)
    chosen = batch["labels"] != IGNORE_INDEX
    assert not (chosen & special).any() and (chosen | special).float().mean() > 0.8
    assert torch.equal(batch["input_ids"][special], before[special])  # untouched, [UNK] inside the text too
    assert torch.equal(batch["labels"][chosen], before[chosen])
    assert not (batch["input_ids"] == before)[~chosen].logical_not().any()  # nothing changes unless chosen
    random_tokens = batch["input_ids"][chosen & (batch["input_ids"] != before) & (batch["input_ids"] != MASK)]
    assert len(random_tokens) > 100 and not torch.isin(random_tokens, torch.tensor(sorted(SPECIALS))).any()


def test_whole_word_masking_masks_all_pieces_of_a_word_together():
    examples = make_examples(200)
    batch = collator(whole_word=True)(examples, torch.Generator().manual_seed(3))
    chosen = batch["labels"] != IGNORE_INDEX
    partial = complete = 0
    for row, example in enumerate(examples):
        words = np.cumsum(example.word_starts)  # (T,) word number of each token
        ordinary = ~np.isin(example.input_ids, list(SPECIALS))  # an [UNK] piece stays unmasked in its word
        for word in np.unique(words[1:-1]):
            picked = chosen[row, :len(words)][torch.from_numpy((words == word) & ordinary)]
            complete += int(picked.all() and len(picked) > 1)
            partial += int(picked.any() and not picked.all())
    assert partial == 0 and complete > 500


def test_token_level_masking_does_split_words():
    # the counterpart of the test above: without whole_word, words are masked partially
    examples = make_examples(200)
    chosen = collator()(examples, torch.Generator().manual_seed(3))["labels"] != IGNORE_INDEX
    words = np.cumsum(examples[0].word_starts)
    partial = sum(int(chosen[0, :len(words)][torch.from_numpy(words == w)].any() and
                      not chosen[0, :len(words)][torch.from_numpy(words == w)].all()) for w in np.unique(words))
    assert partial > 0


def test_masks_are_drawn_anew_for_every_call_and_reproducible_from_the_seed():
    examples, masker = make_examples(16), collator()
    generator = torch.Generator().manual_seed(4)
    first, second = masker(examples, generator), masker(examples, generator)
    assert not torch.equal(first["labels"], second["labels"])  # dynamic masking
    again = masker(examples, torch.Generator().manual_seed(4))
    assert all(torch.equal(first[key], again[key]) for key in first)


@pytest.mark.parametrize("multiple, length", [(8, 304), (None, 301), (1, 301)])
def test_padding_to_the_longest_rounded_up(multiple, length):
    examples = make_examples(3)
    examples[1] = Example(np.arange(5, 306) % 900 + 5, np.zeros(301, np.int64), np.ones(301, bool))
    examples[1].input_ids[[0, -1]] = [CLS, SEP]
    batch = collator(pad_to_multiple_of=multiple)(examples, torch.Generator().manual_seed(0))
    assert all(t.shape == (3, length) for k, t in batch.items()) and "next_sentence_label" not in batch
    assert batch["attention_mask"].sum(1).tolist() == [len(e.input_ids) for e in examples]
    assert all(t.dtype == torch.long for t in batch.values())
    assert (batch["input_ids"][batch["attention_mask"] == 0] == PAD).all()
    assert (batch["token_type_ids"][batch["attention_mask"] == 0] == 0).all()


def test_next_sentence_label_is_batched_when_present():
    examples = make_examples(4, pairs=True)
    examples[2].next_sentence_label = -1  # n/a for this one: ignored by the loss
    batch = collator()(examples, torch.Generator().manual_seed(0))
    assert batch["next_sentence_label"].tolist() == [examples[0].next_sentence_label,
                                                     examples[1].next_sentence_label, IGNORE_INDEX,
                                                     examples[3].next_sentence_label]
    assert torch.equal(batch["token_type_ids"][0, :len(examples[0].input_ids)],
                       torch.from_numpy(examples[0].token_type_ids))


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="mlm_probability=0"):
        collator(mlm_probability=0)
    with pytest.raises(ConfigError, match="special ids"):
        MaskingCollator(4, MASK, PAD, SPECIALS)
    with pytest.raises(ConfigError, match="empty list"):
        collator()([], torch.Generator())
