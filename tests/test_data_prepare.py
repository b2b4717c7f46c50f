"""encoderlab.data.prepare, .shards and .tokenizer_training: round trips from text to memory-mapped shards."""

from __future__ import annotations

import gzip
import itertools
import json
import pickle
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderlab.data.prepare import prepare
from encoderlab.data.sentences import split_sentences
from encoderlab.data.shards import TokenShards
from encoderlab.data.tokenizer_training import train_tokenizer
from encoderlab.errors import ConfigError, InputError
from encoderlab.tokenizer import Tokenizer

SYLLABLES = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "bi", "do"]


def make_documents(count: int, seed: int = 0) -> list[list[str]]:
    """Documents of made-up words (1-4 syllables, so a small vocabulary splits them into pieces)."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(300)]

    def sentence() -> str:
        return " ".join(rng.choices(words, k=rng.randint(2, 12))).capitalize() + rng.choice(".!?")

    def paragraph() -> str:
        if rng.random() < 0.2:  # a heading: one word, no period, so its word index is 0 up to the end
            return rng.choice(words).capitalize()
        return " ".join(sentence() for _ in range(rng.randint(1, 4)))

    return [[paragraph() for _ in range(rng.randint(1, 5))] for _ in range(count)]


def write_corpus(folder: Path, documents: list[list[str]]) -> list[Path]:
    """Half the documents as plain text, half as gzipped JSONL: two formats in one corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    half = len(documents) // 2
    plain = folder / "a.txt"
    plain.write_text("\n\n".join("\n".join(doc) for doc in documents[:half]) + "\n", encoding="utf-8")
    jsonl = folder / "b.jsonl.gz"
    jsonl.write_bytes(gzip.compress("".join(json.dumps({"text": "\n".join(doc)}) + "\n"
                                            for doc in documents[half:]).encode()))
    return [plain, jsonl]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[list[Path], list[list[str]], Path]:
    """(files, documents, tokenizer folder) of a 120-document synthetic corpus and a 150-token vocabulary."""
    folder = tmp_path_factory.mktemp("corpus")
    documents = make_documents(120)
    files = write_corpus(folder / "text", documents)
    train_tokenizer(files, vocab_size=150, out_dir=folder / "tokenizer", min_frequency=1)
    return files, documents, folder / "tokenizer"


def document_sentences(shards: TokenShards, document: int) -> list[np.ndarray]:
    """The token arrays of one document's sentences."""
    shard, local = shards.locate(document)
    offsets = shards.shards[shard].document_sentence_offsets(local)
    return [shards.shards[shard].tokens[a:b] for a, b in itertools.pairwise(offsets)]


def document_word_starts(shards: TokenShards, document: int) -> list[np.ndarray]:
    shard, local = shards.locate(document)
    offsets = shards.shards[shard].document_sentence_offsets(local)
    return [shards.shards[shard].word_starts[a:b] for a, b in itertools.pairwise(offsets)]


def sentences_of(document: list[str]) -> list[str]:
    return [s for paragraph in document for s in split_sentences(paragraph)]


def test_round_trip_decodes_every_sentence_and_marks_every_word(corpus, tmp_path):
    files, documents, tokenizer_dir = corpus
    stats = prepare(files, tokenizer_dir, tmp_path / "out", workers=1, progress=False)
    shards, tokenizer = TokenShards(tmp_path / "out"), Tokenizer.from_pretrained(tmp_path / "out" / "tokenizer")
    assert shards.num_documents == stats["documents"] == len(documents)
    sentences = sum(len(shard.sentence_offsets) - 1 for shard in shards.shards)
    assert sentences == stats["sentences"] == sum(len(sentences_of(d)) for d in documents)
    assert shards.num_tokens == stats["tokens"] and stats["files"] == 2 and stats["mb_per_s"] > 0
    assert shards.dtype == np.uint16 and shards.meta["splits"]["valid"]["shards"] == []
    pieces = 0
    for d, document in enumerate(documents):
        expected = sentences_of(document)
        tokens, starts = document_sentences(shards, d), document_word_starts(shards, d)
        assert [tokenizer.decode(t.tolist()) for t in tokens] == [s.lower() for s in expected]
        # one word start per word and per punctuation mark, counted from the text, not from the tokenizer
        assert [int(s.sum()) for s in starts] == [len(re.findall(r"\w+|[^\w\s]", s)) for s in expected]
        pieces += sum(int((~s).sum()) for s in starts)
    assert pieces > 0.2 * shards.num_tokens  # the small vocabulary really splits words, so the flags matter


def test_worker_processes_write_the_same_shards_and_documents_stay_whole(corpus, tmp_path):
    files, documents, tokenizer_dir = corpus
    prepare(files, tokenizer_dir, tmp_path / "one", workers=1, shard_tokens=2000, progress=False)
    prepare(files, tokenizer_dir, tmp_path / "two", workers=2, shard_tokens=2000, progress=False)
    one, two = TokenShards(tmp_path / "one"), TokenShards(tmp_path / "two")
    assert len(one.shards) == len(two.shards) > 3
    for a, b in zip(one.shards, two.shards):
        for name in ("tokens", "word_starts", "sentence_offsets", "document_offsets"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert a.sentence_offsets[-1] == len(a.tokens) and a.document_offsets[-1] == len(a.sentence_offsets) - 1
    for shard in one.shards[:-1]:  # a shard closes at the first document boundary past 2000 tokens
        doc_tokens = np.diff(shard.sentence_offsets[shard.document_offsets])
        assert len(shard.tokens) >= 2000 and len(shard.tokens) - doc_tokens[-1] < 2000
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    assert [tokenizer.decode(one.document_tokens(d).tolist()) for d in range(one.num_documents)] == \
        [tokenizer.decode(tokenizer.encode(" ".join(doc), add_special_tokens=False, max_length=None))
         for doc in documents]


@pytest.mark.slow
def test_vocabulary_over_65536_tokens_is_stored_as_uint32(tmp_path):
    words = [f"w{i:05d}" for i in range(70_000)]
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(words)], vocab_size=70_100, min_frequency=1)
    tokenizer.save(tmp_path / "tok")
    assert tokenizer.vocab_size > 65_536
    late = [w for w in words if tokenizer.token_to_id(w) is not None and tokenizer.token_to_id(w) >= 65_536][:50]
    (tmp_path / "c.txt").write_text(" ".join(late) + "\n")
    prepare([tmp_path / "c.txt"], tmp_path / "tok", tmp_path / "out", workers=1, progress=False)
    shards = TokenShards(tmp_path / "out")
    assert shards.dtype == np.uint32 and shards.meta["token_dtype"] == "uint32"
    assert int(shards.shards[0].tokens.max()) >= 65_536
    assert tokenizer.decode(shards.document_tokens(0).tolist()) == " ".join(late)


def test_holdout_fraction_is_whole_documents_disjoint_and_deterministic(corpus, tmp_path):
    files, documents, tokenizer_dir = corpus
    stats = prepare(files, tokenizer_dir, tmp_path / "a", holdout=0.25, workers=1, progress=False)
    prepare(files, tokenizer_dir, tmp_path / "b", holdout=0.25, workers=2, progress=False)
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)

    def texts(folder: Path, split: str) -> list[str]:
        shards = TokenShards(folder, split)
        return [tokenizer.decode(shards.document_tokens(d).tolist()) for d in range(shards.num_documents)]

    train, valid = texts(tmp_path / "a", "train"), texts(tmp_path / "a", "valid")
    everything = [tokenizer.decode(tokenizer.encode(" ".join(doc), add_special_tokens=False, max_length=None))
                  for doc in documents]
    assert sorted(train + valid) == sorted(everything) and not set(train) & set(valid)
    assert 15 <= len(valid) <= 45 and stats["valid_documents"] == len(valid)
    assert valid == texts(tmp_path / "b", "valid") and train == texts(tmp_path / "b", "train")
    assert [t for t in everything if t in set(valid)] == valid  # corpus order within the split


def test_holdout_count_holds_out_exactly_that_many_documents(corpus, tmp_path):
    files, documents, tokenizer_dir = corpus
    stats = prepare(files, tokenizer_dir, tmp_path / "out", holdout=7, workers=1, progress=False)
    assert TokenShards(tmp_path / "out", "valid").num_documents == stats["valid_documents"] == 7
    assert TokenShards(tmp_path / "out", "train").num_documents == len(documents) - 7


@pytest.mark.parametrize("holdout, message", [(120, "has only 120"), (1.5, "whole number"), (-0.1, "fraction")])
def test_impossible_holdout_is_refused(corpus, tmp_path, holdout, message):
    files, _, tokenizer_dir = corpus
    with pytest.raises(ConfigError, match=message):
        prepare(files, tokenizer_dir, tmp_path / "out", holdout=holdout, workers=1, progress=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_unreadable_file_is_named_and_nothing_looks_complete(corpus, tmp_path, workers):
    files, _, tokenizer_dir = corpus
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Fine line.\n\xff\xfe broken\n")
    with pytest.raises(InputError, match=r"bad\.txt:2: not valid UTF-8"):
        prepare([*files, bad], tokenizer_dir, tmp_path / "out", workers=workers, progress=False)
    assert not (tmp_path / "out" / "meta.json").exists()
    with pytest.raises(InputError, match="no meta.json"):
        TokenShards(tmp_path / "out")


def test_output_folder_with_other_files_is_refused_and_a_previous_run_is_replaced(corpus, tmp_path):
    files, _, tokenizer_dir = corpus
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"busy: the output folder holds other files \(notes.txt\)"):
        prepare(files, tokenizer_dir, tmp_path / "busy", workers=1, progress=False)
    prepare(files, tokenizer_dir, tmp_path / "out", holdout=0.3, workers=1, progress=False)
    prepare(files[:1], tokenizer_dir, tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out" / "valid").exists() and TokenShards(tmp_path / "out").num_documents == 60


def test_shards_refuse_truncated_files_and_pickle_without_their_data(corpus, tmp_path):
    files, _, tokenizer_dir = corpus
    prepare(files, tokenizer_dir, tmp_path / "out", workers=1, progress=False)
    shards = TokenShards(tmp_path / "out")
    copy = pickle.loads(data := pickle.dumps(shards))
    assert len(data) < 1000 and np.array_equal(copy.shards[0].tokens, shards.shards[0].tokens)
    assert isinstance(shards.shards[0].tokens.base, np.memmap)  # mapped, not read into memory
    with pytest.raises(InputError, match="the 'valid' split holds no documents"):
        TokenShards(tmp_path / "out", "valid")
    path = tmp_path / "out" / "train" / "00000.tokens"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(InputError, match=r"00000\.tokens: .* bytes, expected .* bytes"):
        TokenShards(tmp_path / "out")


def test_tokenizer_training_never_sees_wikiextractor_markup(tmp_path):
    article = '<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="Page {i}">\nPage {i}\n\n{body}\n</doc>\n'
    documents = make_documents(40, seed=1)
    text = "".join(article.format(i=i, body="\n".join(doc)) for i, doc in enumerate(documents))
    (tmp_path / "wiki_00.gz").write_bytes(gzip.compress(text.encode()))
    tokenizer = train_tokenizer([tmp_path], vocab_size=400, out_dir=tmp_path / "tok", min_frequency=1)
    vocabulary = set(Tokenizer.from_pretrained(tmp_path / "tok")._backend.get_vocab())
    assert tokenizer.vocab_size <= 400 and {"ka", "lo", "##ka"} <= vocabulary
    # c, h, w, g, y occur only in the markup and the title lines (the syllables never use them)
    assert not {"doc", "curid", "url", "wikipedia", "<", "page", "c", "h", "w", "g", "y"} & vocabulary


def test_tokenizer_training_names_a_bad_file(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"txt": "oops"}\n')
    with pytest.raises(InputError, match=r"c\.jsonl:2: expected a JSON object with a \"text\" field"):
        train_tokenizer([tmp_path / "c.jsonl"], vocab_size=100, out_dir=tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


# ---- other tokenizer kinds ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_prepare_and_examples_use_the_tokenizers_own_specials(kind, tmp_path):
    from encoderlab.data.collate import MaskingCollator
    from encoderlab.data.examples import PretrainingExamples

    documents = make_documents(40, seed=3)
    files = write_corpus(tmp_path / "text", documents)
    tokenizer = train_tokenizer(files, kind=kind, vocab_size=400, out_dir=tmp_path / "tok", min_frequency=1)
    stats = prepare(files, tmp_path / "tok", tmp_path / "data", workers=1, progress=False)
    shards = TokenShards(tmp_path / "data")
    assert stats["documents"] == shards.num_documents == 40
    assert shards.meta["tokenizer"]["kind"] == kind and shards.mask_id == tokenizer.mask_id
    # A document's sentences, encoded one by one, decode to the document (BPE keeps the spaces between them).
    assert [tokenizer.decode(shards.document_tokens(d).tolist()) for d in range(40)] == \
        [tokenizer.decode(tokenizer.encode(" ".join(doc), add_special_tokens=False, max_length=None))
         for doc in documents]
    middle, b_type = tokenizer.pair_layout()
    for objective in ("mlm", "sop"):
        example = PretrainingExamples(shards, objective, max_length=32, seed=0).get(0, 0)
        ids = example.input_ids.tolist()
        assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id and len(ids) <= 32
        specials_inside = [i for i in ids[1:-1] if i in tokenizer.special_ids]
        assert specials_inside == ([] if objective == "mlm" else middle)  # `<s> A </s></s> B </s>` for RoBERTa
        b_at = ids.index(middle[0]) + len(middle) if objective == "sop" else len(ids)
        assert set(example.token_type_ids[:b_at].tolist()) == {0}
        assert set(example.token_type_ids[b_at:].tolist()) <= {b_type}  # RoBERTa: 0 throughout
    collator = MaskingCollator(shards.vocab_size, shards.mask_id, shards.pad_id, shards.special_ids,
                               mlm_probability=0.5, whole_word=True)
    examples = [PretrainingExamples(shards, "mlm", max_length=32, seed=0).get(0, i) for i in range(8)]
    batch = collator(examples, torch.Generator().manual_seed(0))
    masked_originals = batch["labels"][batch["labels"] != -100]
    assert len(masked_originals) > 0 and (batch["input_ids"] == tokenizer.mask_id).any()
    assert not torch.isin(masked_originals, torch.tensor(sorted(tokenizer.special_ids))).any()
