"""Train a tokenizer on a raw corpus in any format `corpus.py` reads, streaming its paragraphs to the trainer (never
the files' markup: WikiExtractor's `<doc ...>` tags and JSONL keys would become vocabulary entries)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from encoderlab.data.corpus import corpus_files, iter_documents
from encoderlab.errors import InputError
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def corpus_paragraphs(corpus: list[str | os.PathLike], progress: bool = False) -> Iterator[str]:
    """Every paragraph of every document of the corpus, in file order (with a bar over files if asked)."""
    files = corpus_files(corpus)
    for path in tqdm(files, desc="read corpus", unit="file", disable=not progress or len(files) < 2, file=sys.stderr):
        for document in iter_documents(path):
            yield from document


def train_tokenizer(corpus: list[str | os.PathLike], kind: str = "wordpiece", vocab_size: int = 30522,
                    out_dir: str | os.PathLike | None = None, lowercase: bool | None = None,
                    min_frequency: int = 2, progress: bool = False) -> Tokenizer:
    """Train a `kind` vocabulary of at most vocab_size tokens on the corpus, saved to out_dir when given; lowercase
    None: the kind's default (uncased BERT/ALBERT, cased RoBERTa)."""
    counter = _Counter(corpus_paragraphs(corpus, progress))
    with _stdout_to_stderr() if progress else contextlib.nullcontext():
        tokenizer = Tokenizer.train_from_iterator(kind, counter, vocab_size, lowercase=lowercase,
                                                  min_frequency=min_frequency, show_progress=progress)
    if counter.count == 0:
        raise InputError(f"{', '.join(map(str, corpus))}: no text to train a tokenizer on")
    if out_dir is not None:
        tokenizer.save(Path(out_dir))
    log.info("trained a %s vocabulary of %d tokens on %d paragraphs", kind, tokenizer.vocab_size, counter.count)
    return tokenizer


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what is written to file descriptor 1 to descriptor 2 meanwhile: the tokenizers library ends each of its
    progress bars (drawn on stderr) with a newline printed from Rust to stdout, which left three blank lines ahead of
    `tokenizer train`'s output (issue 46)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _Counter:
    """Passes texts through, counting them (an empty corpus must be an error, not an empty vocabulary)."""

    def __init__(self, texts: Iterator[str]):
        self.texts, self.count = texts, 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            self.count += 1
            yield text
