"""BM25 over an index's documents with bm25s (Lu 2024, "BM25S: Orders of magnitude faster lexical search via eager
sparse scoring", arXiv:2407.03618): Lucene's BM25 (k1 = 1.5, b = 0.75, bm25s's defaults), words tokenised as bm25s's
README does, `bm25s.tokenize(texts, stopwords="en")`: lower-cased, split on \\b\\w\\w+\\b, English stopwords removed.

The documents are tokenised a shard at a time into one growing vocabulary (bm25s's Tokenizer), so the texts are never
all in memory, only their token ids; a document left with no words has no tokens, as bm25s.tokenize gives it (not
Tokenizer's default empty token, which would count as a word in the mean length). tests/test_retrieval.py pins the
scores to bm25s.tokenize + BM25 run directly."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import bm25s
import numpy as np
from bm25s.tokenization import Tokenized, Tokenizer

STOPWORDS = "en"
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG: a line per index built


def build(chunks: Iterable[Sequence[str]], folder: Path) -> int:
    """Index the texts, chunk by chunk in corpus order, into `folder` (replaced whole, via a temp folder and a
    rename); the number of documents."""
    tokenizer = Tokenizer(stopwords=STOPWORDS)
    ids: list[list[int]] = []
    for texts in chunks:
        ids += tokenizer.tokenize(list(texts), update_vocab=True, return_as="ids", show_progress=False,
                                  allow_empty=False)
    retriever = bm25s.BM25()
    retriever.index(Tokenized(ids=ids, vocab=tokenizer.get_vocab_dict()), show_progress=False)
    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    retriever.save(str(staging), show_progress=False)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return len(ids)


def load(folder: Path) -> bm25s.BM25:
    """A saved BM25 index (its arrays memory-mapped)."""
    return bm25s.BM25.load(str(folder), mmap=True, show_progress=False)


def search(retriever: bm25s.BM25, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k documents of each query: scores (Q, k) and document positions (Q, k), best first."""
    k = min(k, int(retriever.scores["num_docs"]))
    tokens = bm25s.tokenize(list(queries), stopwords=STOPWORDS, return_ids=False, show_progress=False)
    positions, scores = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    return scores, positions
