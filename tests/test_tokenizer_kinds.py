"""The three tokenizer kinds (WordPiece, byte-level BPE, Unigram): training, special-token layout, save and
reload, and ids equal to transformers' fast tokenizers (the oracle) loading the same folder."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from conftest import shared_file
from encoderlab.cli import main
from encoderlab.data.tokenizer_training import corpus_paragraphs, train_tokenizer
from encoderlab.errors import ConfigError, InputError
from encoderlab.tokenizer import KINDS, SPECIAL_TOKENS, Tokenizer

VOCAB_SIZES = {"wordpiece": 150, "bpe": 400, "unigram": 200}  # byte-level BPE starts from 256 bytes
# The pair middle each model family uses: BERT and ALBERT one [SEP], RoBERTa two </s> (its post-processor).
PAIR_SEPARATORS = {"wordpiece": 1, "bpe": 2, "unigram": 1}
B_TYPE_ID = {"wordpiece": 1, "bpe": 0, "unigram": 1}  # RoBERTa has a single token type


def made_up_texts(lines: int = 300, seed: int = 0) -> list[str]:
    """Sentences of made-up words from a few syllables, mixed case and punctuation, so there is much to merge."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zen", "qua"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(200)]
    texts = []
    for _ in range(lines):
        sentence = [rng.choice(words) for _ in range(rng.randint(3, 14))]
        sentence[0] = sentence[0].capitalize()
        texts.append(" ".join(sentence) + rng.choice([".", "!", "?", ", yes."]))
    return texts


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return made_up_texts()


@pytest.fixture(scope="module", params=KINDS)
def saved(request, texts, tmp_path_factory) -> tuple[Tokenizer, Path]:
    """A tokenizer of each kind trained on a file of made-up text, and the folder it was saved to."""
    root = tmp_path_factory.mktemp(request.param)
    (root / "corpus.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    trained = Tokenizer.train(request.param, [root / "corpus.txt"], VOCAB_SIZES[request.param], min_frequency=1)
    trained.save(root / "tok")
    return trained, root / "tok"


def test_trained_vocabulary_puts_specials_where_the_model_family_does(saved):
    trained, _ = saved
    specials = SPECIAL_TOKENS[trained.kind]
    assert 10 < trained.vocab_size <= VOCAB_SIZES[trained.kind]
    assert [trained.token_to_id(t) for t in specials.order] == list(range(len(specials.order)))
    if trained.kind == "bpe":  # roberta-base: <mask> is the last id
        assert trained.mask_id == trained.vocab_size - 1
    for role in ("pad", "unk", "cls", "sep", "mask"):
        assert getattr(trained, f"{role}_id") == trained.token_to_id(getattr(specials, role))
    assert trained.special_ids == {trained.token_to_id(t) for t in specials.by_role().values()}


def test_single_and_pair_layout(saved, texts):
    trained, _ = saved
    a, b = texts[0], texts[1]
    plain_a, plain_b = (trained.encode(t, add_special_tokens=False) for t in (a, b))
    middle = [trained.sep_id] * PAIR_SEPARATORS[trained.kind]
    assert trained.encode(a) == [trained.cls_id, *plain_a, trained.sep_id]
    assert trained.encode(a, b) == [trained.cls_id, *plain_a, *middle, *plain_b, trained.sep_id]
    assert trained.num_special_tokens(pair=False) == 2
    assert trained.num_special_tokens(pair=True) == 2 + len(middle)
    assert trained.pair_layout() == (middle, B_TYPE_ID[trained.kind])
    batch = trained.encode_batch([a], [b])
    b_start = 1 + len(plain_a) + len(middle)
    assert batch.token_type_ids[0, :b_start].tolist() == [0] * b_start
    assert set(batch.token_type_ids[0, b_start:].tolist()) == {B_TYPE_ID[trained.kind]}


def test_mask_token_in_a_text_is_one_token_and_leaves_its_neighbours_alone(saved, texts):
    trained, _ = saved
    words = texts[0].split()
    ids = trained.encode(" ".join([*words[:2], trained.mask_token, *words[2:]]))
    assert ids.count(trained.mask_id) == 1
    # RoBERTa's <mask> takes the space before it (lstrip), so the next word keeps its own leading space.
    assert [i for i in ids if i != trained.mask_id] == trained.encode(" ".join(words))


def test_save_and_reload_detects_the_kind(saved, texts):
    trained, folder = saved
    expected_files = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    expected_files |= {"wordpiece": {"vocab.txt"}, "bpe": {"vocab.json", "merges.txt"}, "unigram": set()}[trained.kind]
    assert {p.name for p in folder.iterdir()} == expected_files
    reloaded = Tokenizer.from_pretrained(folder)
    assert reloaded.kind == trained.kind and reloaded.specials == trained.specials
    assert reloaded.vocab_size == trained.vocab_size
    assert torch.equal(reloaded.encode_batch(texts, texts[::-1], max_length=24).input_ids,
                       trained.encode_batch(texts, texts[::-1], max_length=24).input_ids)
    if trained.kind == "bpe":  # vocab.json and merges.txt are the model's own
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        assert vocab["<mask>"] == trained.mask_id and len(vocab) == trained.vocab_size
        assert (folder / "merges.txt").read_text(encoding="utf-8").startswith("#version")


def test_decode_round_trip(saved, texts):
    trained, _ = saved
    lowercase = trained.kind != "bpe"  # the kinds' defaults: uncased BERT and ALBERT, cased RoBERTa
    for text in texts[:50]:
        decoded = trained.decode(trained.encode(text, max_length=None))
        if trained.kind == "bpe":
            assert decoded == text  # byte-level: nothing is lost
        else:  # WordPiece spaces punctuation; both lowercase
            assert "".join(decoded.split()) == "".join((text.lower() if lowercase else text).split())


def test_encode_words_marks_each_whitespace_word(saved, texts):
    trained, _ = saved
    ids, word_ids = trained.encode_words([t.rstrip(".!?, yes") for t in texts[:40]])
    for text, row_ids, row_words in zip(texts, ids, word_ids):
        assert len(row_ids) == len(row_words)
        assert len(set(row_words)) == len(text.rstrip(".!?, yes").split())


@pytest.mark.parametrize("oracle", ["auto", "fast"])
def test_ids_equal_transformers_fast_tokenizer(saved, texts, oracle):
    trained, folder = saved
    theirs = (AutoTokenizer.from_pretrained(folder) if oracle == "auto"
              else PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **trained.specials.by_role()))
    with_masks = [t.replace(" ", f" {trained.mask_token} ", 1) for t in texts[:20]]
    singles = texts + with_masks
    assert theirs(singles)["input_ids"] == [trained.encode(t, max_length=None) for t in singles]
    firsts, seconds = texts[:150], texts[150:]
    expected = theirs(firsts, seconds, truncation=True, max_length=24, padding=True, return_tensors="pt",
                      return_token_type_ids=True)
    batch = trained.encode_batch(firsts, seconds, max_length=24)
    assert torch.equal(batch.input_ids, expected["input_ids"])
    assert torch.equal(batch.attention_mask, expected["attention_mask"])
    if oracle == "auto":  # the generic class gives no type ids for RoBERTa's processor; the model class does
        assert torch.equal(batch.token_type_ids, expected["token_type_ids"])
    assert [theirs.decode(trained.encode(t)[1:-1]) for t in texts[:20]] == \
        [trained.decode(trained.encode(t)) for t in texts[:20]]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_real_text_matches_transformers(kind, tmp_path):
    wiki = shared_file("wikipedia/AA/wiki_00.gz")
    train_tokenizer([wiki], kind=kind, vocab_size=1500, out_dir=tmp_path / "tok")
    ours, theirs = Tokenizer.from_pretrained(tmp_path / "tok"), AutoTokenizer.from_pretrained(tmp_path / "tok")
    paragraphs = list(itertools.islice(corpus_paragraphs([wiki]), 600))
    assert theirs(paragraphs[:300])["input_ids"] == [ours.encode(p, max_length=None) for p in paragraphs[:300]]
    expected = theirs(paragraphs[:300], paragraphs[300:], truncation=True, max_length=64)["input_ids"]
    assert expected == [ours.encode(a, b, max_length=64) for a, b in zip(paragraphs[:300], paragraphs[300:])]


# ---- conventions of loaded tokenizers ---------------------------------------------------------------------
def deberta_v3_like(folder: Path) -> list[str]:
    """A Unigram tokenizer.json laid out as DeBERTa-v3's: [PAD] [CLS] [SEP] [UNK], the pieces, [MASK] last."""
    pieces = ["▁a", "▁b", "▁ab", "a", "b", "▁"]
    vocab = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0)]
    vocab += [(p, -1.0 - i) for i, p in enumerate(pieces)] + [("[MASK]", 0.0)]
    backend = RustTokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    return [token for token, _ in vocab]


def test_unigram_with_deberta_v3_specials_is_recognized(tmp_path):
    tokens = deberta_v3_like(tmp_path / "deberta")
    loaded = Tokenizer.from_pretrained(tmp_path / "deberta")
    assert loaded.kind == "unigram"
    assert [loaded.pad_id, loaded.cls_id, loaded.sep_id, loaded.unk_id, loaded.mask_id] == \
        [tokens.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")]


def test_special_tokens_map_names_the_specials(tmp_path):
    deberta_v3_like(tmp_path / "tok")
    names = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "▁a", "sep_token": "▁b",
             "mask_token": {"content": "[MASK]", "lstrip": False}}
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps(names), encoding="utf-8")
    loaded = Tokenizer.from_pretrained(tmp_path / "tok")
    assert (loaded.specials.cls, loaded.specials.sep, loaded.specials.mask) == ("▁a", "▁b", "[MASK]")
    names["sep_token"] = "<absent>"
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps(names), encoding="utf-8")
    with pytest.raises(InputError, match=r"tokenizer\.json.*<absent>"):
        Tokenizer.from_pretrained(tmp_path / "tok")


# ---- bad input --------------------------------------------------------------------------------------------
def test_unknown_kind_names_the_kinds(texts):
    with pytest.raises(ConfigError, match="sentencepiece.*wordpiece, bpe, unigram"):
        Tokenizer.train_from_iterator("sentencepiece", texts, 100)
    with pytest.raises(ConfigError, match="wordlevel.*wordpiece, bpe, unigram"):
        train_tokenizer(["unused.txt"], kind="wordlevel")


def test_unsupported_model_type_names_the_supported(tmp_path):
    backend = RustTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputError, match=r"tokenizer\.json: wordlevel .*wordpiece, bpe, unigram"):
        Tokenizer.from_pretrained(tmp_path)


def test_bpe_vocabulary_must_hold_the_bytes_and_stay_cased(texts):
    with pytest.raises(ConfigError, match=r"vocab_size=200.*256 bytes"):
        Tokenizer.train_from_iterator("bpe", texts, 200)
    with pytest.raises(ConfigError, match="bpe.*cased"):
        Tokenizer.train_from_iterator("bpe", texts, 400, lowercase=True)


# ---- command line -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_cli_tokenizer_train_kind(kind, texts, tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    assert main(["tokenizer", "train", "--kind", kind, "--corpus", str(tmp_path / "corpus.txt"),
                 "--vocab-size", "300", "--out", str(tmp_path / "tok")]) == 0
    assert f"{kind} vocabulary" in capsys.readouterr().out
    loaded = Tokenizer.from_pretrained(tmp_path / "tok")
    assert loaded.kind == kind and 10 < loaded.vocab_size <= 300
    assert (loaded.encode("Kalo") == loaded.encode("kalo")) == (kind == "unigram")  # cased RoBERTa, uncased ALBERT


def test_cli_unknown_kind_lists_the_kinds(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["tokenizer", "train", "--kind", "spm", "--corpus", str(tmp_path), "--out", str(tmp_path / "t")])
    assert "wordpiece" in capsys.readouterr().err
