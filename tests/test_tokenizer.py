"""encoderlab.tokenizer against transformers' BertTokenizerFast (the oracle) on real text, training, errors."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertTokenizerFast

from encoderlab.errors import ConfigError, InputError
from encoderlab.tokenizer import SPECIAL_TOKENS, Batch, Tokenizer


@pytest.fixture(scope="module")
def ours(minilm_path: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def hf(minilm_path: Path) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(minilm_path)  # a local folder: nothing is downloaded


@pytest.fixture(scope="module")
def conll_texts(conll_sentences: list[list[str]]) -> list[str]:
    return [" ".join(tokens) for tokens in conll_sentences]


def assert_same_batch(batch: Batch, hf_out) -> None:
    """Ids, type ids and attention mask equal to transformers' padded output."""
    assert torch.equal(batch.input_ids, hf_out["input_ids"])
    assert torch.equal(batch.token_type_ids, hf_out["token_type_ids"])
    assert torch.equal(batch.attention_mask, hf_out["attention_mask"])


def hf_offsets(hf_out) -> list[list[tuple[int, int]]]:
    return [[tuple(pair) for pair in row] for row in hf_out["offset_mapping"].tolist()]


# ---- parity with transformers on real data -------------------------------------------------------------
@pytest.mark.parametrize("corpus", ["sst2", "conll"])
@pytest.mark.slow
def test_single_texts_match_transformers(corpus, ours, hf, sst2_dev_sentences, conll_texts):
    texts = sst2_dev_sentences if corpus == "sst2" else conll_texts
    batch = ours.encode_batch(texts)
    expected = hf(texts, padding=True, truncation=True, max_length=512, return_tensors="pt",
                  return_offsets_mapping=True)
    assert_same_batch(batch, expected)
    assert batch.offsets == hf_offsets(expected)
    assert batch.word_ids == [expected.word_ids(i) for i in range(len(texts))]
    assert batch.sequence_ids == [expected.sequence_ids(i) for i in range(len(texts))]
    assert batch.num_truncated == 0


@pytest.mark.parametrize("corpus", ["sst2", "conll"])
@pytest.mark.slow
def test_pairs_truncated_longest_first_match_transformers(corpus, ours, hf, sst2_dev_sentences, conll_texts):
    texts = sst2_dev_sentences if corpus == "sst2" else conll_texts
    first, second = texts[:-1], texts[1:]  # consecutive sentences as A / B
    max_length = 24
    batch = ours.encode_batch(first, second, max_length=max_length)
    expected = hf(first, second, padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                  return_offsets_mapping=True)
    assert_same_batch(batch, expected)
    assert batch.offsets == hf_offsets(expected)
    assert batch.sequence_ids == [expected.sequence_ids(i) for i in range(len(first))]
    full_lengths = [len(ids) for ids in hf(first, second)["input_ids"]]
    assert batch.num_truncated == sum(n > max_length for n in full_lengths) > 0


@pytest.mark.parametrize("paired", [False, True])
def test_unpadded_rows_match_transformers(paired, ours, hf, sst2_dev_sentences):
    first, second = sst2_dev_sentences[:-1], (sst2_dev_sentences[1:] if paired else None)
    rows, truncated = ours.encode_rows(first, second, max_length=24)
    expected = hf(first, second, truncation=True, max_length=24, return_offsets_mapping=True)  # unpadded lists
    assert [r.input_ids for r in rows] == expected["input_ids"]
    assert [r.token_type_ids for r in rows] == expected["token_type_ids"]
    assert [r.offsets for r in rows] == [[tuple(p) for p in row] for row in expected["offset_mapping"]]
    assert [r.sequence_ids for r in rows] == [expected.sequence_ids(i) for i in range(len(first))]
    full = hf(first, second)["input_ids"]
    assert truncated == sum(len(ids) > 24 for ids in full) > 0
    with pytest.raises(InputError, match="2 texts but 1 pairs"):
        ours.encode_rows(["a", "b"], ["c"])


def test_single_texts_truncated_match_transformers(ours, hf, sst2_dev_sentences):
    batch = ours.encode_batch(sst2_dev_sentences, max_length=16)
    assert_same_batch(batch, hf(sst2_dev_sentences, padding=True, truncation=True, max_length=16, return_tensors="pt"))
    assert batch.input_ids.shape[1] == 16


def test_vocab_txt_and_tokenizer_json_agree(minilm_path, ours, sst2_dev_sentences):
    from_vocab = Tokenizer.from_pretrained(minilm_path / "vocab.txt")
    assert from_vocab.vocab_size == ours.vocab_size
    expected = ours.encode_batch(sst2_dev_sentences, sst2_dev_sentences[::-1], max_length=40)
    batch = from_vocab.encode_batch(sst2_dev_sentences, sst2_dev_sentences[::-1], max_length=40)
    assert torch.equal(batch.input_ids, expected.input_ids)
    assert torch.equal(batch.token_type_ids, expected.token_type_ids)
    assert batch.offsets == expected.offsets
    with_specials = "a [MASK] in a text [SEP] stays one token [CLS]"
    assert from_vocab.encode(with_specials) == ours.encode(with_specials)


def test_vocab_txt_takes_do_lower_case_from_config_beside_it(minilm_path, tmp_path):
    shutil.copy(minilm_path / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = Tokenizer.from_pretrained(tmp_path)
    text = "Paris is the Capital of FRANCE"
    expected = BertTokenizerFast.from_pretrained(tmp_path)(text)["input_ids"]
    assert cased.encode(text) == expected
    assert cased.encode(text) != Tokenizer.from_pretrained(minilm_path).encode(text)


# ---- behaviour owned by the wrapper -------------------------------------------------------------------
def test_baked_in_truncation_and_padding_are_not_inherited(minilm_path):
    # MiniLM's tokenizer.json pads every text to 128 and truncates at 128; a fresh load must not.
    ours = Tokenizer.from_pretrained(minilm_path)
    long_text = " ".join(["word"] * 300)
    assert ours.encode_words([long_text, "a"])[0] == [[ours.token_to_id("word")] * 300, [ours.token_to_id("a")]]
    assert len(ours.encode("a")) == 3
    assert ours.encode_batch(["a"]).input_ids.shape == (1, 3)
    assert len(ours.encode(long_text, max_length=None)) == 302
    assert len(ours.encode(long_text)) == 302  # default max_length 512
    assert len(ours.encode(long_text, max_length=200)) == 200
    assert len(ours.encode(long_text, max_length=8, truncation=False)) == 302


def test_padding_to_max_length_and_multiple(ours, hf, sst2_dev_sentences):
    texts = sst2_dev_sentences[:50]
    batch = ours.encode_batch(texts, max_length=128, padding="max_length")
    assert_same_batch(batch, hf(texts, padding="max_length", truncation=True, max_length=128, return_tensors="pt"))
    batch = ours.encode_batch(["one two three"], pad_to_multiple_of=8)
    assert batch.input_ids.shape == (1, 8)
    assert batch.attention_mask.tolist() == [[1] * 5 + [0] * 3]
    assert batch.input_ids[0, 5:].tolist() == [ours.pad_id] * 3
    assert batch.offsets[0][5:] == [(0, 0)] * 3 and batch.sequence_ids[0][5:] == [None] * 3


def test_special_ids_and_tokens(ours, hf):
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (
        hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id)
    assert ours.special_ids == frozenset(hf.all_special_ids)
    assert ours.mask_token == "[MASK]" and ours.token_to_id(ours.mask_token) == ours.mask_id
    assert ours.id_to_token(ours.cls_id) == "[CLS]" and ours.token_to_id("no-such-token-xyz") is None
    assert ours.encode("a [MASK] b") == hf("a [MASK] b")["input_ids"]  # kept whole, not split into [ mask ]
    assert ours.num_special_tokens(pair=False) == 2 and ours.num_special_tokens(pair=True) == 3


def test_empty_text_and_plain_encoding(ours, sst2_dev_sentences):
    assert ours.encode("") == [ours.cls_id, ours.sep_id]
    plain = ours.encode_words(sst2_dev_sentences[:100])[0]
    assert plain == [ours.encode(t, truncation=False, add_special_tokens=False) for t in sst2_dev_sentences[:100]]
    assert ours.encode_words([" ".join(["word"] * 600)])[0][0] == [ours.token_to_id("word")] * 600  # no truncation


def test_decode_round_trip(ours, hf, sst2_dev_sentences):
    for text in sst2_dev_sentences[:50]:
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.decode(torch.tensor(ours.encode("hello world"))) == "hello world"
    assert ours.decode(ours.encode("hi"), skip_special_tokens=False) == "[CLS] hi [SEP]"


def test_batch_to_device_and_pickle(ours):
    batch = ours.encode_batch(["a b", "c"]).to("meta")
    assert batch.input_ids.device.type == batch.attention_mask.device.type == batch.token_type_ids.device.type == "meta"
    assert pickle.loads(pickle.dumps(ours)).encode("pickled text") == ours.encode("pickled text")


# ---- training -----------------------------------------------------------------------------------------
def write_corpus(path: Path, lines: int = 400, seed: int = 0) -> list[str]:
    """Sentences of made-up words built from a few syllables, so WordPiece has pieces to merge."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zen", "qua"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(300)]
    texts = []
    for _ in range(lines):
        sentence = [rng.choice(words[: rng.randint(10, 300)]) for _ in range(rng.randint(3, 15))]
        sentence[0] = sentence[0].capitalize()
        texts.append(" ".join(sentence) + rng.choice([".", "!", "?", ", yes."]))
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return texts


@pytest.mark.parametrize("lowercase", [True, False])
def test_train_wordpiece_save_and_load_in_transformers(tmp_path, lowercase):
    texts = write_corpus(tmp_path / "corpus.txt")
    vocab_size = 150
    trained = Tokenizer.train("wordpiece", [tmp_path / "corpus.txt"], vocab_size=vocab_size, lowercase=lowercase)
    assert 5 < trained.vocab_size <= vocab_size
    specials = SPECIAL_TOKENS["wordpiece"]
    assert [trained.token_to_id(t) for t in specials.order] == list(range(len(specials.order)))
    assert trained.pad_id == trained.token_to_id("[PAD]") and trained.mask_id == trained.token_to_id("[MASK]")
    assert any(len(trained.id_to_token(i).removeprefix("##")) > 2 for i in range(trained.vocab_size))  # merged
    expected = trained.encode_batch(texts, texts[::-1], max_length=32)
    assert trained.unk_id not in expected.input_ids.tolist()

    trained.save(tmp_path / "tok")
    vocab_lines = (tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab_lines == [trained.id_to_token(i) for i in range(trained.vocab_size)]
    for source in [tmp_path / "tok", tmp_path / "tok" / "vocab.txt"]:
        reloaded = Tokenizer.from_pretrained(source)
        assert torch.equal(reloaded.encode_batch(texts, texts[::-1], max_length=32).input_ids, expected.input_ids)

    for hf_class in (BertTokenizerFast, AutoTokenizer):
        theirs = hf_class.from_pretrained(tmp_path / "tok")
        assert_same_batch(expected, theirs(texts, texts[::-1], padding=True, truncation=True, max_length=32,
                                           return_tensors="pt"))
    cased = trained.encode("Kalo") != trained.encode("kalo")
    assert cased == (not lowercase)


# ---- errors -------------------------------------------------------------------------------------------
def test_missing_folder(tmp_path):
    with pytest.raises(InputError, match="no-such-folder"):
        Tokenizer.from_pretrained(tmp_path / "no-such-folder")


def test_folder_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError, match=f"{tmp_path}.*neither tokenizer.json nor vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "not_a_tokenizer"])
def test_corrupted_tokenizer_json(minilm_path, tmp_path, damage):
    text = (minilm_path / "tokenizer.json").read_text(encoding="utf-8")
    (tmp_path / "tokenizer.json").write_text(text[: len(text) // 2] if damage == "truncated" else '{"model": 1}')
    with pytest.raises(InputError, match="tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)


def test_vocab_txt_not_utf8_names_the_line(tmp_path):
    (tmp_path / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\nok\nbad\xff\n")
    with pytest.raises(InputError, match=r"vocab\.txt:4: not valid UTF-8"):
        Tokenizer.from_pretrained(tmp_path)


def test_vocab_txt_without_special_tokens(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(InputError, match=r"vocab\.txt.*\[CLS\]"):
        Tokenizer.from_pretrained(tmp_path)


def test_training_file_not_utf8_names_file_and_line(tmp_path):
    write_corpus(tmp_path / "good.txt", lines=20)
    (tmp_path / "bad.txt").write_bytes(b"fine line\nsecond line\nbroken \xc3\x28 here\n")
    with pytest.raises(InputError, match=r"bad\.txt:3: not valid UTF-8"):
        Tokenizer.train("wordpiece", [tmp_path / "good.txt", tmp_path / "bad.txt"], vocab_size=100)


def test_training_file_not_utf8_past_first_chunk(tmp_path):
    # Past the 1 MiB read size, with a multi-byte character split across the chunk boundary.
    line = "é" * 99 + "\n"  # 199 bytes: characters straddle chunk boundaries
    (tmp_path / "big.txt").write_bytes(line.encode() * 6000 + b"x\xff\n")
    with pytest.raises(InputError, match=r"big\.txt:6001: not valid UTF-8"):
        Tokenizer.train("wordpiece", [tmp_path / "big.txt"], vocab_size=100)


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_empty_training_file(tmp_path, content):
    (tmp_path / "empty.txt").write_bytes(content)
    with pytest.raises(InputError, match=r"empty\.txt: the file is empty"):
        Tokenizer.train("wordpiece", [tmp_path / "empty.txt"], vocab_size=100)


def test_missing_training_file_and_bad_arguments(tmp_path):
    with pytest.raises(InputError, match="absent.txt: no such file"):
        Tokenizer.train("wordpiece", [tmp_path / "absent.txt"], vocab_size=100)
    with pytest.raises(InputError, match="no training files"):
        Tokenizer.train("wordpiece", [], vocab_size=100)
    write_corpus(tmp_path / "corpus.txt", lines=5)
    with pytest.raises(ConfigError, match="vocab_size=5"):
        Tokenizer.train("wordpiece", [tmp_path / "corpus.txt"], vocab_size=5)


def test_encode_batch_argument_errors(ours):
    with pytest.raises(InputError, match="empty"):
        ours.encode_batch([])
    with pytest.raises(InputError, match="2 texts but 1 pairs"):
        ours.encode_batch(["a", "b"], ["c"])
    with pytest.raises(ConfigError, match="max_length=2"):
        ours.encode_batch(["a"], ["b"], max_length=2)
    with pytest.raises(ConfigError, match="padding='none'"):
        ours.encode_batch(["a"], padding="none")
    with pytest.raises(ConfigError, match="needs a max_length"):
        ours.encode_batch(["a"], padding="max_length", max_length=None)
