"""One wrapper over the `tokenizers` library: load (tokenizer.json or a BERT vocab.txt), train, encode, save.

The wrapper owns truncation and padding: whatever a tokenizer.json has baked in (MiniLM's pads every
text to 128) is switched off at load and set per call, so a call means the same for every checkpoint.
Special tokens are looked up by tokenizer kind in SPECIAL_TOKENS; only WordPiece (BERT) exists so far.
"""

from __future__ import annotations

import codecs
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece

from encoderlab.errors import ConfigError, InputError
from encoderlab.io import atomic_write_text

PathLike = str | os.PathLike
DEFAULT_MODEL_MAX_LENGTH = 512
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class SpecialTokens:
    """The special token strings of one tokenizer kind, by role."""

    pad: str
    unk: str
    cls: str
    sep: str
    mask: str
    order: tuple[str, ...]  # the order a trainer gives them ids 0, 1, 2, ...

    def by_role(self) -> dict[str, str]:
        """{"pad_token": "[PAD]", ...}: the keys transformers' special_tokens_map.json uses."""
        return {f"{f.name}_token": getattr(self, f.name) for f in fields(self) if f.name != "order"}


# Keyed by the tokenizers model type, lowercased. RoBERTa's BPE (<s> </s> <pad> <mask> <unk>) and
# Unigram go here when they are added; everything else reads its tokens from this table.
SPECIAL_TOKENS = {
    "wordpiece": SpecialTokens(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                               order=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")),
}


@dataclass
class Batch:
    """A rectangular batch of encoded texts, padded on the right."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long, 1 real / 0 pad
    token_type_ids: torch.Tensor  # (B, T) long
    offsets: list[list[tuple[int, int]]]  # (start, end) in the text the token came from; (0, 0) special/pad
    word_ids: list[list[int | None]]
    sequence_ids: list[list[int | None]]  # 0 text A, 1 text B, None special/pad
    num_truncated: int  # how many inputs lost tokens to truncation

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with its tensors on `device`."""
        return replace(self, input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
                       token_type_ids=self.token_type_ids.to(device))


class Tokenizer:
    """A WordPiece (BERT) tokenizer with per-call truncation and padding; ids match transformers'."""

    def __init__(self, backend: RustTokenizer, kind: str, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
                 source: str = "tokenizer"):
        if kind not in SPECIAL_TOKENS:
            raise InputError(f"{source}: {kind} tokenizers are not supported yet "
                             f"(supported: {', '.join(SPECIAL_TOKENS)})")
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        self._lock = threading.Lock()  # truncation/padding are set on the shared Rust object for each call
        self.kind = kind
        self.specials = SPECIAL_TOKENS[kind]
        self.model_max_length = model_max_length
        self.mask_token = self.specials.mask
        _require_specials(backend.get_vocab(), self.specials, source)
        ids = {role: backend.token_to_id(token) for role, token in self.specials.by_role().items()}
        self.pad_id, self.unk_id, self.cls_id = ids["pad_token"], ids["unk_token"], ids["cls_token"]
        self.sep_id, self.mask_id = ids["sep_token"], ids["mask_token"]
        self.special_ids = frozenset(ids.values())

    # ---- loading and training ------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: PathLike) -> Tokenizer:
        """Load a folder (tokenizer.json, else vocab.txt), an alias such as `minilm`, or one of those files."""
        path = _resolve(name_or_path)
        if path.is_dir():
            if (path / "tokenizer.json").is_file():
                path = path / "tokenizer.json"
            elif (path / "vocab.txt").is_file():
                path = path / "vocab.txt"
            else:
                raise InputError(f"{path}: neither tokenizer.json nor vocab.txt in this folder")
        config = _read_tokenizer_config(path.parent / "tokenizer_config.json")
        max_length = int(config.get("model_max_length") or DEFAULT_MODEL_MAX_LENGTH)
        max_length = min(max_length, 1 << 20)  # transformers writes 1e30 for "no limit"
        if path.suffix == ".json":
            backend = _read_tokenizer_json(path)
            return cls(backend, type(backend.model).__name__.lower(), max_length, str(path))
        vocab = _read_vocab(path)
        _require_specials(vocab, SPECIAL_TOKENS["wordpiece"], str(path))
        lowercase = bool(config.get("do_lower_case", True))
        backend = _wordpiece_pipeline(vocab, lowercase, SPECIAL_TOKENS["wordpiece"],
                                      strip_accents=config.get("strip_accents"),
                                      chinese_chars=bool(config.get("tokenize_chinese_chars", True)))
        return cls(backend, "wordpiece", max_length, str(path))

    @classmethod
    def train_wordpiece(cls, files: list[PathLike], vocab_size: int, lowercase: bool = True,
                        min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
        """Train a BERT WordPiece vocabulary of at most `vocab_size` tokens on UTF-8 text files."""
        if not files:
            raise InputError("train_wordpiece: no training files given")
        for file in files:
            _check_text_file(Path(file))
        return cls._train_wordpiece(lambda backend, trainer: backend.train([str(f) for f in files], trainer),
                                    vocab_size, lowercase, min_frequency, show_progress)

    @classmethod
    def train_wordpiece_from_iterator(cls, texts: Iterable[str], vocab_size: int, lowercase: bool = True,
                                      min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
        """Train a BERT WordPiece vocabulary on a stream of texts (paragraphs of a corpus, never all in memory)."""
        return cls._train_wordpiece(lambda backend, trainer: backend.train_from_iterator(texts, trainer),
                                    vocab_size, lowercase, min_frequency, show_progress)

    @classmethod
    def _train_wordpiece(cls, run, vocab_size: int, lowercase: bool, min_frequency: int,
                         show_progress: bool) -> Tokenizer:
        """Set up a BERT WordPiece trainer, let `run(backend, trainer)` feed it, and wrap the result."""
        specials = SPECIAL_TOKENS["wordpiece"]
        if vocab_size <= len(specials.order):
            raise ConfigError(f"vocab_size={vocab_size}: must exceed the {len(specials.order)} special tokens")
        backend = RustTokenizer(WordPiece(unk_token=specials.unk))
        backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=list(specials.order), show_progress=show_progress,
                                            continuing_subword_prefix="##")
        run(backend, trainer)
        # Rebuild from the learned vocabulary so trained and loaded tokenizers share one pipeline.
        return cls(_wordpiece_pipeline(backend.get_vocab(), lowercase, specials), "wordpiece")

    def save(self, folder: PathLike) -> None:
        """Write tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json that transformers loads."""
        folder = Path(folder)
        with self._lock:
            serialized = self._backend.to_str(pretty=True)
        atomic_write_text(folder / "tokenizer.json", serialized)
        if self.kind == "wordpiece":
            tokens = sorted(self._backend.get_vocab().items(), key=lambda item: item[1])
            atomic_write_text(folder / "vocab.txt", "".join(f"{token}\n" for token, _ in tokens))
        atomic_write_text(folder / "tokenizer_config.json", _dumps(self._hf_config(json.loads(serialized))))
        atomic_write_text(folder / "special_tokens_map.json", _dumps(self.specials.by_role()))

    def _hf_config(self, serialized: dict) -> dict:
        """tokenizer_config.json: transformers 5 rebuilds BertTokenizer's normalizer from these keys."""
        normalizer = serialized.get("normalizer") or {}
        config = {"tokenizer_class": "BertTokenizer", "model_max_length": self.model_max_length}
        if normalizer.get("type") == "BertNormalizer":
            config.update(do_lower_case=normalizer.get("lowercase", True),
                          strip_accents=normalizer.get("strip_accents"),
                          tokenize_chinese_chars=normalizer.get("handle_chinese_chars", True))
        return config | self.specials.by_role()

    # ---- vocabulary ----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The number of ids, special and added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of `token`, or None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        """The token of id `i`, or None when out of range."""
        return self._backend.id_to_token(i)

    def num_special_tokens(self, pair: bool = False) -> int:
        """How many special tokens encode adds around one text (pair=False) or two (pair=True)."""
        return self._backend.post_processor.num_special_tokens_to_add(pair)

    # ---- encoding ------------------------------------------------------------------------------------
    def encode(self, text: str, pair: str | None = None, max_length: int | None = 512, truncation: bool = True,
               add_special_tokens: bool = True) -> list[int]:
        """The ids of one text (or pair), truncated longest-first to max_length, not padded."""
        limit = self._limit(max_length, truncation, pair is not None, add_special_tokens)
        with self._lock:
            try:
                if limit is not None:
                    self._backend.enable_truncation(limit, strategy="longest_first")
                return self._backend.encode(text, pair, add_special_tokens=add_special_tokens).ids
            finally:
                self._backend.no_truncation()

    def encode_batch(self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = 512,
                     padding: str = "longest", truncation: bool = True,
                     pad_to_multiple_of: int | None = None) -> Batch:
        """Encode texts (and their pairs) into a (B, T) batch padded to the longest, or to max_length."""
        if not texts:
            raise InputError("encode_batch: the list of texts is empty")
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"encode_batch: {len(texts)} texts but {len(pairs)} pairs")
        if padding not in ("longest", "max_length"):
            raise ConfigError(f"padding={padding!r}: expected 'longest' or 'max_length'")
        if padding == "max_length" and max_length is None:
            raise ConfigError("padding='max_length' needs a max_length")
        limit = self._limit(max_length, truncation, pairs is not None, True)
        inputs = list(zip(texts, pairs)) if pairs is not None else list(texts)
        with self._lock:
            try:
                if limit is not None:
                    self._backend.enable_truncation(limit, strategy="longest_first")
                self._backend.enable_padding(pad_id=self.pad_id, pad_type_id=0, pad_token=self.specials.pad,
                                             length=max_length if padding == "max_length" else None,
                                             pad_to_multiple_of=pad_to_multiple_of)
                encodings = self._backend.encode_batch(inputs)
            finally:
                self._backend.no_truncation()
                self._backend.no_padding()
        return _to_batch(encodings)

    def encode_plain(self, texts: list[str]) -> list[list[int]]:
        """Ids of each text without special tokens or truncation, for preparing pretraining data."""
        with self._lock:  # another thread may have truncation set for the moment
            return [e.ids for e in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_words(self, texts: list[str]) -> tuple[list[list[int]], list[list[int | None]]]:
        """Ids and word index of each token of each text, no special tokens or truncation (for whole-word masking).

        Word indices come from the pre-tokenizer's split, so they mark words for any model kind, not only
        WordPiece's "##" pieces. (encode_batch_fast is not used: it leaves word indices empty.)
        """
        with self._lock:
            encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings], [e.word_ids for e in encodings]

    def decode(self, ids: list[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        """The text of a list (or 1-D tensor) of ids, WordPiece pieces joined back into words."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def _limit(self, max_length: int | None, truncation: bool, pair: bool, add_special_tokens: bool) -> int | None:
        """The truncation length to set, or None; a max_length too short for the special tokens is refused."""
        if not truncation or max_length is None:
            return None
        needed = self.num_special_tokens(pair) if add_special_tokens else 0
        if max_length < max(needed, 1):
            raise ConfigError(f"max_length={max_length}: too short for the {needed} special tokens "
                              f"of a {'pair' if pair else 'single text'}")
        return max_length

    # ---- plumbing ------------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        """Pickle without the lock (DataLoader workers receive a copy)."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        """Restore a pickled tokenizer with a fresh lock."""
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


# ---- helpers ---------------------------------------------------------------------------------------------
def _resolve(name_or_path: PathLike) -> Path:
    """An existing path, or the folder behind a model alias; InputError naming the path otherwise."""
    path = Path(name_or_path)
    if path.exists():
        return path
    # Imported here: checkpoint pulls in the model code, and only aliases need it.
    from encoderlab.checkpoint import model_aliases, resolve_model_path
    from encoderlab.errors import CheckpointError

    aliases = model_aliases()
    if str(name_or_path) not in aliases:
        raise InputError(f"{path}: no such tokenizer file or folder, and not a known alias ({', '.join(aliases)})")
    try:
        return resolve_model_path(name_or_path)
    except CheckpointError as err:
        raise InputError(str(err)) from None


def _read_tokenizer_json(path: Path) -> RustTokenizer:
    """A tokenizers serialization, with InputError naming the file (and line) when it is corrupted."""
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)  # for a line number: the Rust parser's message has none that is reliable
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not valid UTF-8 (at byte {err.start})") from None
    except ValueError as err:
        raise InputError(f"{path}:{err.lineno}: corrupted tokenizer.json ({err.msg})") from None
    try:
        return RustTokenizer.from_str(text)
    except Exception as err:  # the Rust side raises a bare Exception
        raise InputError(f"{path}: not a valid tokenizer.json ({err})") from None


def _read_tokenizer_config(path: Path) -> dict:
    """tokenizer_config.json as a dict; {} when absent."""
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not valid UTF-8 (at byte {err.start})") from None
    except ValueError as err:
        raise InputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: expected a JSON object")
    return config


def _read_vocab(path: Path) -> dict[str, int]:
    """A BERT vocab.txt (one token a line, id = line number - 1), with errors naming file and line."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[err.start]:02x})") from None
    # As tokenizers' WordPiece.from_file: trailing whitespace (a \r) is not part of the token.
    tokens = [line.rstrip() for line in text.split("\n")]
    if tokens and tokens[-1] == "":
        tokens.pop()
    if not tokens:
        raise InputError(f"{path}: the vocabulary is empty (expected one token a line)")
    return {token: i for i, token in enumerate(tokens)}


def _require_specials(vocab: dict[str, int], specials: SpecialTokens, source: str) -> None:
    """Refuse a vocabulary that lacks one of the kind's special tokens, naming them."""
    missing = [token for token in specials.by_role().values() if token not in vocab]
    if missing:
        raise InputError(f"{source}: the vocabulary lacks the special tokens {', '.join(missing)}")


def _wordpiece_pipeline(vocab: dict[str, int], lowercase: bool, specials: SpecialTokens,
                        strip_accents: bool | None = None, chinese_chars: bool = True) -> RustTokenizer:
    """The BERT pipeline around a vocabulary: what BertTokenizerFast builds from a vocab.txt."""
    backend = RustTokenizer(WordPiece(vocab, unk_token=specials.unk, continuing_subword_prefix="##",
                                      max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                                    strip_accents=strip_accents, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_token, sep_token = specials.cls, specials.sep
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, vocab[cls_token]), (sep_token, vocab[sep_token])])
    backend.decoder = decoders.WordPiece(prefix="##")
    # Registered as special so "[MASK]" in a text is one token, not "[", "mask", "]".
    backend.add_special_tokens([t for t in specials.order if t in vocab])
    return backend


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


def _to_batch(encodings: list) -> Batch:
    """A Batch from padded tokenizers Encodings."""
    def tensor(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long)

    return Batch(input_ids=tensor([e.ids for e in encodings]),
                 attention_mask=tensor([e.attention_mask for e in encodings]),
                 token_type_ids=tensor([e.type_ids for e in encodings]),
                 offsets=[e.offsets for e in encodings],
                 word_ids=[e.word_ids for e in encodings],
                 sequence_ids=[e.sequence_ids for e in encodings],
                 num_truncated=sum(1 for e in encodings if e.overflowing))


def _dumps(obj: dict) -> str:
    """Indented JSON with a final newline, as transformers writes its config files."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
