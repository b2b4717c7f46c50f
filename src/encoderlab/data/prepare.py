"""`prepare`: a raw-text corpus to memory-mapped token shards with sentence, document and word boundaries.

The main process parses the files (cheap) and cuts the documents into ~1 MB chunks; workers split sentences and
tokenize (the expensive part); results are appended in submission order, so the output does not depend on the
worker count, and at most two chunks per worker are in flight, so memory stays flat.
Held-out documents are chosen by a hash of their text falling below a threshold: deterministic, one pass, and
duplicated documents land on the same side, so valid never repeats a training document verbatim.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import logging
import multiprocessing
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from encoderlab.data.corpus import DocumentReader, corpus_files
from encoderlab.data.sentences import split_sentences
from encoderlab.data.shards import EncodedDocuments, ShardWriter, token_dtype, write_meta
from encoderlab.errors import ConfigError, InputError
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)
DEFAULT_SHARD_TOKENS = 1 << 26  # 64 Mi tokens: 128 MB of uint16 per shard file
CHUNK_BYTES = 1 << 20  # text per work item: large enough to amortize IPC, small enough to keep memory flat
_OUTPUTS = ("meta.json", "train", "valid", "tokenizer")  # what prepare writes, and may replace


def prepare(corpus: list[str | os.PathLike], tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike,
            holdout: float = 0.0, workers: int | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
            progress: bool | None = None) -> dict:
    """Tokenize the corpus into out_dir's train split, and the valid one for holdout (a fraction < 1 or a number of
    documents); workers: processes (default: every core; 1 tokenizes here). Returns the statistics."""
    started = time.perf_counter()
    files = corpus_files(corpus)
    workers = _check_options(holdout, workers, shard_tokens)
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    dtype = token_dtype(tokenizer.vocab_size)
    out = _clear_outputs(Path(out_dir))
    tokenizer.save(out / "tokenizer")
    threshold = _holdout_threshold(files, holdout)
    readers = [DocumentReader(path) for path in files]
    splits = _Splits(out, dtype, shard_tokens)
    with tqdm(total=sum(p.stat().st_size for p in files), unit="B", unit_scale=True, desc="prepare",
              disable=None if progress is None else not progress, dynamic_ncols=True) as bar:
        for docs in _encode_all(_chunks(readers, CHUNK_BYTES), out / "tokenizer", dtype, threshold, workers):
            splits.add(docs)
            text_bytes = sum(r.bytes_read for r in readers)
            bar.update(sum(r.disk_bytes_read for r in readers) - bar.n)  # on-disk bytes: the total is known
            bar.set_postfix(tokens=f"{splits.counts['tokens']:,}",
                            MB_s=f"{text_bytes / 1e6 / (time.perf_counter() - started):.2f}")
    shards = splits.close(holdout)
    stats = _stats(files, readers, splits.counts, time.perf_counter() - started, workers)
    write_meta(out, dtype, _tokenizer_ids(tokenizer), shards, holdout=holdout, holdout_threshold=threshold,
               sources=[str(c) for c in corpus], corpus=[str(p) for p in files], stats=stats)
    log.info("prepared %s: %d documents, %d tokens, %.1f MB in %.1f s (%.2f MB/s)", out, stats["documents"],
             stats["tokens"], stats["bytes"] / 1e6, stats["seconds"], stats["mb_per_s"])
    return stats


class _Splits:
    """The train and valid shard writers, and running counts of what went into them."""

    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int):
        self.writers = {split: ShardWriter(out / split, dtype, shard_tokens) for split in ("train", "valid")}
        self.counts = dict.fromkeys(("documents", "sentences", "tokens", "valid_documents", "valid_tokens"), 0)

    def add(self, docs: EncodedDocuments) -> None:
        """Send each document of a chunk to its split."""
        valid = docs.select(docs.held_out)
        self.writers["train"].add(docs.select(~docs.held_out) if len(valid.document_sentences) else docs)
        self.writers["valid"].add(valid)
        self.counts["documents"] += len(docs.document_sentences)
        self.counts["sentences"] += len(docs.sentence_lengths)
        self.counts["tokens"] += len(docs.tokens)
        self.counts["valid_documents"] += len(valid.document_sentences)
        self.counts["valid_tokens"] += len(valid.tokens)

    def close(self, holdout: float) -> dict[str, list[dict]]:
        """The shards of each split; refuse a corpus with no training documents, warn on an empty valid."""
        shards = {split: writer.close() for split, writer in self.writers.items()}
        documents, held_out = self.counts["documents"], self.counts["valid_documents"]
        if documents == 0:
            raise InputError("the corpus holds no text: its files contain no documents")
        if documents == held_out:
            raise ConfigError(f"holdout={holdout}: every one of the {documents} documents was held out")
        if holdout > 0 and held_out == 0:
            log.warning("holdout=%s selected none of the %d documents; no valid split was written", holdout, documents)
        return shards


def _check_options(holdout: float, workers: int | None, shard_tokens: int) -> int:
    """Validate the options; the number of worker processes to use."""
    if holdout < 0 or (holdout >= 1 and not float(holdout).is_integer()):
        raise ConfigError(f"holdout={holdout}: expected a fraction in [0, 1) or a whole number of documents")
    if shard_tokens < 1:
        raise ConfigError(f"shard_tokens={shard_tokens}: must be positive")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers < 1:
        raise ConfigError(f"workers={workers}: must be at least 1")
    return workers


def _clear_outputs(out: Path) -> Path:
    """Make out_dir ready: created if absent; a previous prepare's outputs removed; anything else refused."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    foreign = sorted(p.name for p in out.iterdir() if p.name not in _OUTPUTS)
    if foreign:
        raise InputError(f"{out}: the output folder holds other files ({', '.join(foreign[:5])}); "
                         "give an empty or new folder, or one that prepare wrote before")
    (out / "meta.json").unlink(missing_ok=True)  # first: an interrupted run must not look complete
    for name in _OUTPUTS[1:]:
        shutil.rmtree(out / name, ignore_errors=True)
    return out


# ---- held-out split -------------------------------------------------------------------------------------
def document_hash(paragraphs: list[str]) -> float:
    """A document's text hashed to a number in [0, 1): the same text always gives the same number."""
    digest = hashlib.blake2b("\n".join(paragraphs).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _holdout_threshold(files: list[Path], holdout: float) -> float:
    """Documents whose hash is below this go to valid: the fraction itself, or for a count N the N-th hash."""
    if holdout < 1:
        return float(holdout)
    count, smallest = int(holdout), []  # a max-heap (negated) of the `count` smallest hashes
    total = 0
    for document in itertools.chain.from_iterable(DocumentReader(p) for p in files):
        total += 1
        value = -document_hash(document)
        if len(smallest) < count:
            heapq.heappush(smallest, value)
        elif value > smallest[0]:
            heapq.heapreplace(smallest, value)
    if count >= total:
        raise ConfigError(f"holdout={count} documents, but the corpus has only {total}: nothing would be left "
                          "to train on")
    return float(np.nextafter(-smallest[0], 1.0))


# ---- reading and encoding -------------------------------------------------------------------------------
def _chunks(readers: list[DocumentReader], chunk_bytes: int) -> Iterator[list[list[str]]]:
    """Documents of every file in order, grouped into lists of about chunk_bytes characters."""
    chunk, size = [], 0
    for document in itertools.chain.from_iterable(readers):
        chunk.append(document)
        size += sum(map(len, document))
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class DocumentEncoder:
    """Turns documents into EncodedDocuments: sentences split, tokenized, word starts marked, hashes drawn."""

    def __init__(self, tokenizer_dir: str | os.PathLike, dtype: np.dtype, threshold: float):
        self.tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
        self.dtype, self.threshold = np.dtype(dtype), threshold

    def __call__(self, documents: list[list[str]]) -> EncodedDocuments:
        """Encode a chunk of documents; documents and sentences without any token are left out."""
        sentences, per_document, held_out = [], [], []
        # Byte-level BPE spells a word after a space differently ("Ġword"): a sentence that continues its
        # document keeps the space before it, as RoBERTa's pretraining saw whole documents.
        space = " " if self.tokenizer.spaces_in_tokens else ""
        for paragraphs in documents:
            before = len(sentences)
            for paragraph in paragraphs:
                sentences.extend(space + s if len(sentences) > before else s for s in split_sentences(paragraph))
            if len(sentences) > before:
                per_document.append(len(sentences) - before)
                held_out.append(document_hash(paragraphs) < self.threshold)
        ids, word_ids = self.tokenizer.encode_words(sentences) if sentences else ([], [])
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))  # (S,)
        tokens = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, int(lengths.sum()))
        docs = EncodedDocuments(tokens, _word_starts(word_ids, lengths), lengths,
                                np.asarray(per_document, np.int64), np.asarray(held_out, bool))
        return _drop_empty_sentences(docs)


def _word_starts(word_ids: list[list[int | None]], lengths: np.ndarray) -> np.ndarray:
    """(N,) bool: a token starts a word when its word index differs from the previous token's, or starts a sentence."""
    total = int(lengths.sum())
    try:
        words = np.fromiter(itertools.chain.from_iterable(word_ids), np.int64, total)
    except TypeError:  # a None (a token outside any word): it is a word of its own
        words = np.array([-1 - i if w is None else w for i, w in enumerate(itertools.chain(*word_ids))], np.int64)
    starts = np.ones(total, bool)
    starts[1:] = words[1:] != words[:-1]
    starts[np.cumsum(lengths)[:-1]] = True
    return starts


def _drop_empty_sentences(docs: EncodedDocuments) -> EncodedDocuments:
    """Without sentences of zero tokens (only characters the normalizer deletes) and documents left empty."""
    kept = docs.sentence_lengths > 0
    if kept.all():
        return docs
    starts = np.concatenate([[0], np.cumsum(docs.document_sentences)[:-1]])
    per_document = np.add.reduceat(kept.astype(np.int64), starts) if len(starts) else starts
    alive = per_document > 0
    return EncodedDocuments(docs.tokens, docs.word_starts, docs.sentence_lengths[kept], per_document[alive],
                            docs.held_out[alive])


_WORKER_ENCODER: DocumentEncoder | None = None


def _start_worker(tokenizer_dir: Path, dtype: str, threshold: float) -> None:
    """Pool initializer: each worker loads the tokenizer once."""
    global _WORKER_ENCODER
    _WORKER_ENCODER = DocumentEncoder(tokenizer_dir, np.dtype(dtype), threshold)


def _encode_in_worker(documents: list[list[str]]) -> EncodedDocuments:
    """One chunk, encoded in a pool worker."""
    return _WORKER_ENCODER(documents)


def _encode_all(chunks: Iterator[list[list[str]]], tokenizer_dir: Path, dtype: np.dtype, threshold: float,
                workers: int) -> Iterator[EncodedDocuments]:
    """Encoded chunks in input order: in this process for one worker, else from a pool with bounded backlog."""
    if workers == 1:
        encoder = DocumentEncoder(tokenizer_dir, dtype, threshold)  # tokenizers' own threads still apply
        yield from map(encoder, chunks)
        return
    # Each worker tokenizes on one thread (processes already fill the cores; more threads only contend).
    # The children inherit the variable at start; this process gets its own setting back right after.
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        # fork starts workers in milliseconds; spawn (other platforms) re-imports this module instead.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        pool = multiprocessing.get_context(method).Pool(workers, _start_worker, (tokenizer_dir, dtype.str, threshold))
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    with pool:
        pending = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---- bookkeeping ----------------------------------------------------------------------------------------
def _stats(files: list[Path], readers: list[DocumentReader], counts: dict, seconds: float, workers: int) -> dict:
    """The numbers prepare reports: sizes, counts, time and throughput."""
    text_bytes = sum(r.bytes_read for r in readers)
    return {"files": len(files), "bytes": text_bytes, "file_bytes": sum(p.stat().st_size for p in files),
            **counts, "seconds": round(seconds, 3), "mb_per_s": round(text_bytes / 1e6 / max(seconds, 1e-9), 3),
            "tokens_per_s": round(counts["tokens"] / max(seconds, 1e-9)), "workers": workers}


def _tokenizer_ids(tokenizer: Tokenizer) -> dict:
    """What examples and collators need of the tokenizer, kept in meta.json so they need not load it."""
    middle, b_type_id = tokenizer.pair_layout()
    return {"path": "tokenizer", "kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
            "pad_id": tokenizer.pad_id, "unk_id": tokenizer.unk_id, "cls_id": tokenizer.cls_id,
            "sep_id": tokenizer.sep_id, "mask_id": tokenizer.mask_id, "special_ids": sorted(tokenizer.special_ids),
            "pair_middle_ids": middle, "pair_b_type_id": b_type_id}
