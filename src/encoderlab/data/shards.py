"""Token shards: the on-disk format of a prepared corpus, its streaming writer and its memory-mapped reader.

A prepared folder holds raw little-endian arrays (as nanoGPT's train.bin), described by meta.json:

    meta.json                  format version, token dtype, tokenizer ids, the shards of each split, statistics
    tokenizer/                 the tokenizer the ids belong to
    train/00000.tokens         (N,) uint16 (vocabulary <= 65,536) or uint32 token ids, back to back
    train/00000.word_starts    (N,) uint8: 1 where a token begins a word (from the tokenizer's word ids)
    train/00000.sentences      (S+1,) int64 offsets into tokens: sentence s is tokens[o[s]:o[s+1]]
    train/00000.documents      (D+1,) int64 offsets into sentences: document d is sentences o[d]:o[d+1]
    valid/...                  the same for the held-out documents, when there are any

A document never spans two shards: a shard is closed at the first document boundary after shard_tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from encoderlab.errors import InputError
from encoderlab.io import atomic_write_text, read_json_file

FORMAT = "encoderlab-token-shards"
VERSION = 1
SPLITS = ("train", "valid")
ARRAYS = ("tokens", "word_starts", "sentences", "documents")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (half the disk and page cache of uint32), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass
class EncodedDocuments:
    """Tokenized documents in memory, laid out as in a shard: tokens back to back plus length arrays."""

    tokens: np.ndarray  # (N,) token ids
    word_starts: np.ndarray  # (N,) bool
    sentence_lengths: np.ndarray  # (S,) int64 tokens per sentence, each >= 1
    document_sentences: np.ndarray  # (D,) int64 sentences per document, each >= 1
    held_out: np.ndarray  # (D,) bool: the document belongs to the valid split

    def select(self, documents: np.ndarray) -> EncodedDocuments:
        """The documents where the (D,) bool mask is true."""
        sentences = np.repeat(documents, self.document_sentences)  # (S,)
        tokens = np.repeat(sentences, self.sentence_lengths)  # (N,)
        return EncodedDocuments(self.tokens[tokens], self.word_starts[tokens], self.sentence_lengths[sentences],
                                self.document_sentences[documents], self.held_out[documents])

    def document_tokens(self) -> np.ndarray:
        """(D,) tokens per document."""
        if not len(self.document_sentences):
            return np.zeros(0, np.int64)
        starts = np.concatenate([[0], np.cumsum(self.document_sentences)[:-1]])
        return np.add.reduceat(self.sentence_lengths, starts)


class ShardWriter:
    """Appends documents to the shards of one split, opening a new shard after `shard_tokens` tokens."""

    def __init__(self, folder: Path, dtype: np.dtype, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = Path(folder), np.dtype(dtype), shard_tokens
        self.shards: list[dict] = []  # {"name", "tokens", "sentences", "documents"} of each closed shard
        self._files: dict[str, BinaryIO] | None = None
        self._counts = {"tokens": 0, "sentences": 0, "documents": 0}

    def add(self, docs: EncodedDocuments) -> None:
        """Write the documents in order, splitting them between shards only at document boundaries."""
        doc_tokens, first = docs.document_tokens(), 0
        sentence_ends, token_ends = np.cumsum(docs.document_sentences), np.cumsum(doc_tokens)
        while first < len(doc_tokens):
            if self._files is None:
                self._open()
            room = self.shard_tokens - self._counts["tokens"]
            before = token_ends[first:] - doc_tokens[first:]  # tokens of this call before each document
            before -= before[0]
            last = first + max(1, int(np.searchsorted(before, room, side="left")))
            s0, s1 = (sentence_ends[first - 1] if first else 0), sentence_ends[last - 1]
            t0, t1 = (token_ends[first - 1] if first else 0), token_ends[last - 1]
            self._write(docs.tokens[t0:t1], docs.word_starts[t0:t1], docs.sentence_lengths[s0:s1],
                        docs.document_sentences[first:last])
            if self._counts["tokens"] >= self.shard_tokens:
                self._close()
            first = last

    def close(self) -> list[dict]:
        """Close the open shard; the list of every shard written."""
        if self._files is not None:
            self._close()
        return self.shards

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{len(self.shards):05d}"
        # open across add() calls, closed in _close()
        self._files = {kind: open(self.folder / f"{name}.{kind}", "wb") for kind in ARRAYS}  # noqa: SIM115
        self._counts = {"tokens": 0, "sentences": 0, "documents": 0}
        np.zeros(1, np.int64).tofile(self._files["sentences"])  # offsets start at 0
        np.zeros(1, np.int64).tofile(self._files["documents"])

    def _write(self, tokens: np.ndarray, word_starts: np.ndarray, sentence_lengths: np.ndarray,
               document_sentences: np.ndarray) -> None:
        files, counts = self._files, self._counts
        tokens.astype(self.dtype, copy=False).tofile(files["tokens"])
        word_starts.astype(np.uint8, copy=False).tofile(files["word_starts"])
        (counts["tokens"] + np.cumsum(sentence_lengths, dtype=np.int64)).tofile(files["sentences"])
        (counts["sentences"] + np.cumsum(document_sentences, dtype=np.int64)).tofile(files["documents"])
        counts["tokens"] += int(sentence_lengths.sum())
        counts["sentences"] += len(sentence_lengths)
        counts["documents"] += len(document_sentences)

    def _close(self) -> None:
        for handle in self._files.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        self.shards.append({"name": f"{len(self.shards):05d}", **self._counts})
        self._files = None


@dataclass(frozen=True)
class Shard:
    """One shard's arrays, memory-mapped read-only (ndarray views whose .base is the np.memmap)."""

    tokens: np.ndarray  # (N,) uint16 | uint32
    word_starts: np.ndarray  # (N,) bool
    sentence_offsets: np.ndarray  # (S+1,) int64 into tokens
    document_offsets: np.ndarray  # (D+1,) int64 into sentences

    @property
    def num_documents(self) -> int:
        """Documents in this shard."""
        return len(self.document_offsets) - 1

    def document_sentence_offsets(self, document: int) -> np.ndarray:
        """(k+1,) token offsets of the k sentences of a local document: sentence i is tokens[o[i]:o[i+1]]."""
        return self.sentence_offsets[self.document_offsets[document]:self.document_offsets[document + 1] + 1]


def write_meta(folder: Path, dtype: np.dtype, tokenizer_ids: dict, shards: dict[str, list[dict]], **extra) -> None:
    """meta.json, written last and atomically: its presence means the shards are complete. tokenizer_ids: the
    special and pair ids readers need; shards: split -> the list ShardWriter.close returned."""
    splits = {split: {"shards": items, **{key: sum(s[key] for s in items) for key in ("documents", "sentences",
                                                                                      "tokens")}}
              for split, items in shards.items()}
    meta = {"format": FORMAT, "version": VERSION, "token_dtype": np.dtype(dtype).name, "tokenizer": tokenizer_ids,
            "splits": splits, **extra}
    atomic_write_text(Path(folder) / "meta.json", json.dumps(meta, indent=2) + "\n")


def read_meta(folder: str | os.PathLike) -> dict:
    """meta.json of a prepared folder; InputError naming the folder when it is missing or not ours."""
    path = Path(folder) / "meta.json"
    if not path.is_file():
        raise InputError(f"{folder}: no meta.json; not a prepared corpus (run `encoderlab prepare` first)")
    meta = read_json_file(path, dict, InputError)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InputError(f"{path}: expected format {FORMAT!r} version {VERSION}, got {meta.get('format')} "
                         f"version {meta.get('version')}")
    return meta


class TokenShards:
    """A prepared split ("train" | "valid"), every array memory-mapped: nothing is read until it is indexed."""

    def __init__(self, folder: str | os.PathLike, split: str = "train"):
        self.folder, self.split = Path(folder), split
        self.meta = read_meta(folder)
        if split not in SPLITS:
            raise InputError(f"split {split!r}: expected one of {SPLITS}")
        entry = self.meta["splits"].get(split) or {}
        if not entry.get("shards"):
            raise InputError(f"{self.folder}: the {split!r} split holds no documents"
                             + (" (prepare with a holdout > 0 to get one)" if split == "valid" else ""))
        self.dtype = np.dtype(self.meta["token_dtype"])
        self.shards = [self._open(info) for info in entry["shards"]]
        self.document_starts = np.cumsum([0] + [s.num_documents for s in self.shards])  # (shards+1,)
        ids = self.meta["tokenizer"]
        self.vocab_size, self.pad_id, self.unk_id = ids["vocab_size"], ids["pad_id"], ids["unk_id"]
        self.cls_id, self.sep_id, self.mask_id = ids["cls_id"], ids["sep_id"], ids["mask_id"]
        self.special_ids = frozenset(ids["special_ids"])
        # How a pair is joined: BERT's [SEP] with B of type 1, RoBERTa's </s></s> with B of type 0 (older
        # meta.json files predate the keys and were all BERT's layout).
        self.pair_middle_ids = [int(i) for i in ids.get("pair_middle_ids", [self.sep_id])]
        self.pair_b_type_id = int(ids.get("pair_b_type_id", 1))

    @property
    def tokenizer_dir(self) -> Path:
        """The copy of the tokenizer saved beside the shards."""
        return self.folder / "tokenizer"

    @property
    def num_documents(self) -> int:
        """Documents in the split."""
        return int(self.document_starts[-1])

    @property
    def num_tokens(self) -> int:
        """Tokens in the split (special tokens are added later, per example)."""
        return sum(len(s.tokens) for s in self.shards)

    def locate(self, document: int) -> tuple[int, int]:
        """(shard index, document index within that shard) of a split-wide document index."""
        if not 0 <= document < self.num_documents:
            raise IndexError(f"document {document} out of range [0, {self.num_documents})")
        shard = int(np.searchsorted(self.document_starts, document, side="right")) - 1
        return shard, document - int(self.document_starts[shard])

    def document_tokens(self, document: int) -> np.ndarray:
        """(n,) token ids of one document, a view into the memory map."""
        shard, local = self.locate(document)
        offsets = self.shards[shard].document_sentence_offsets(local)
        return self.shards[shard].tokens[offsets[0]:offsets[-1]]

    def _open(self, info: dict) -> Shard:
        """Map a shard's four arrays, checking each file's size against meta.json."""
        lengths = {"tokens": info["tokens"], "word_starts": info["tokens"],
                   "sentences": info["sentences"] + 1, "documents": info["documents"] + 1}
        dtypes = {"tokens": self.dtype, "word_starts": np.dtype(np.bool_),
                  "sentences": np.dtype(np.int64), "documents": np.dtype(np.int64)}
        arrays = {}
        for kind in ARRAYS:
            path = self.folder / self.split / f"{info['name']}.{kind}"
            expected = lengths[kind] * dtypes[kind].itemsize
            size = path.stat().st_size if path.is_file() else None
            if size != expected:
                found = "missing" if size is None else f"{size:,} bytes"
                raise InputError(f"{path}: {found}, expected {expected:,} bytes (per meta.json); "
                                 "the prepared folder is incomplete or corrupted, run prepare again")
            # A plain ndarray view of the map: the same pages, without np.memmap's slow Python __getitem__.
            arrays[kind] = np.memmap(path, dtype=dtypes[kind], mode="r", shape=(lengths[kind],)).view(np.ndarray)
        return Shard(arrays["tokens"], arrays["word_starts"], arrays["sentences"], arrays["documents"])

    def __getstate__(self) -> dict:
        """Pickle the location only: a mapped array would pickle by value, the whole corpus."""
        return {"folder": self.folder, "split": self.split}

    def __setstate__(self, state: dict) -> None:
        """Reopen the maps (in a DataLoader worker, say)."""
        self.__init__(state["folder"], state["split"])

    def __repr__(self) -> str:
        return (f"TokenShards({str(self.folder)!r}, split={self.split!r}: {self.num_documents:,} documents, "
                f"{self.num_tokens:,} tokens in {len(self.shards)} shards)")
