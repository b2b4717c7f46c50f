"""Training a vocabulary of each kind with the `tokenizers` trainers, on files or a stream of texts; the kind's
pipeline is then rebuilt around the trained model, so a trained tokenizer and the same one loaded back are one."""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Tokenizer as RustTokenizer
from tokenizers import pre_tokenizers, trainers
from tokenizers.models import BPE, Unigram, WordPiece

from encoderlab.errors import ConfigError, InputError
from encoderlab.tokenizer.kinds import (DEFAULT_LOWERCASE, KINDS, SPECIAL_TOKENS, SpecialTokens, front,
                                       trained_pipeline)

_CHUNK_BYTES = 1 << 20
Trained = tuple[RustTokenizer, SpecialTokens]


def train_on_files(kind: str, files: list[str | os.PathLike], vocab_size: int, lowercase: bool | None,
                   min_frequency: int, show_progress: bool) -> Trained:
    """A `kind` pipeline trained on UTF-8 text files (each checked first), and its special tokens."""
    if not files:
        raise InputError(f"train {kind}: no training files given")
    for file in files:
        _check_text_file(Path(file))
    return _train(kind, lambda backend, trainer: backend.train([str(f) for f in files], trainer),
                  vocab_size, lowercase, min_frequency, show_progress)


def train_on_texts(kind: str, texts: Iterable[str], vocab_size: int, lowercase: bool | None,
                   min_frequency: int, show_progress: bool) -> Trained:
    """A `kind` pipeline trained on a stream of texts, and its special tokens."""
    return _train(kind, lambda backend, trainer: backend.train_from_iterator(texts, trainer),
                  vocab_size, lowercase, min_frequency, show_progress)


def _train(kind: str, run: Callable[[RustTokenizer, trainers.Trainer], None], vocab_size: int,
           lowercase: bool | None, min_frequency: int, show_progress: bool) -> Trained:
    """Check the settings, let `run(backend, trainer)` feed the kind's trainer, and rebuild the kind's pipeline."""
    if kind not in KINDS:
        raise ConfigError(f"tokenizer kind {kind!r}: expected one of {', '.join(KINDS)}")
    specials = SPECIAL_TOKENS[kind]
    lowercase = DEFAULT_LOWERCASE[kind] if lowercase is None else lowercase
    minimum = len(specials.by_role()) + (256 if kind == "bpe" else 0)  # byte-level BPE keeps all 256 bytes
    if vocab_size <= minimum:
        raise ConfigError(f"vocab_size={vocab_size}: a {kind} vocabulary must exceed {minimum} tokens "
                          f"({len(specials.by_role())} special" + (" + 256 bytes)" if kind == "bpe" else ")"))
    if kind == "bpe" and lowercase:
        raise ConfigError("bpe: byte-level BPE is cased, as RoBERTa's (transformers' RobertaTokenizer has no "
                          "lowercasing step to match); train it without lowercasing")
    backend = RustTokenizer({"wordpiece": WordPiece(unk_token=specials.unk), "bpe": BPE(), "unigram": Unigram()}[kind])
    backend.normalizer, backend.pre_tokenizer = front(kind, lowercase)
    run(backend, _trainer(kind, specials, vocab_size, min_frequency, show_progress))
    return trained_pipeline(kind, json.loads(backend.to_str())["model"], specials, lowercase), specials


def _trainer(kind: str, specials: SpecialTokens, vocab_size: int, min_frequency: int,
             show_progress: bool) -> trainers.Trainer:
    """The kind's trainer; the special tokens take the first ids, in the convention's order."""
    common = {"special_tokens": list(specials.order), "show_progress": show_progress}
    if kind == "wordpiece":
        return trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                         continuing_subword_prefix="##", **common)
    if kind == "bpe":
        # One id kept back per role the order leaves out (RoBERTa's <mask>, appended last); initial_alphabet:
        # every byte is a token, so no text is ever unknown (Radford et al., 2019, section 2.2).
        appended = [t for t in specials.by_role().values() if t not in specials.order]
        return trainers.BpeTrainer(vocab_size=vocab_size - len(appended), min_frequency=min_frequency,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common)
    # min_frequency does not apply: Unigram prunes by likelihood.
    return trainers.UnigramTrainer(vocab_size=vocab_size, unk_token=specials.unk, **common)


def _check_text_file(path: Path) -> None:
    """Refuse a missing, empty or non-UTF-8 training file, naming it; streams, so size is no matter."""
    if not path.is_file():
        raise InputError(f"{path}: no such file" if not path.exists() else f"{path}: is a folder, expected a text file")
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines_before, has_text = 0, False
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK_BYTES)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                # err.object is the decoder's carried-over bytes (never a newline) plus this chunk.
                line = lines_before + err.object[: err.start].count(b"\n") + 1
                raise InputError(f"{path}:{line}: not valid UTF-8 (byte 0x{err.object[err.start]:02x})") from None
            has_text = has_text or bool(text.strip())
            lines_before += text.count("\n")
            if not chunk:
                break
    if not has_text:
        raise InputError(f"{path}: the file is empty (expected text to train on)")
