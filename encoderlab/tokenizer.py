"""One wrapper over the `tokenizers` library: load (tokenizer.json or a BERT vocab.txt), train, encode, save.

Three kinds, named by the tokenizers model type: "wordpiece" (BERT, DistilBERT, ELECTRA), "bpe" (RoBERTa's
byte-level BPE) and "unigram" (SentencePiece-style, ALBERT and DeBERTa-v3). A trained tokenizer gets the
pipeline transformers' BertTokenizer, RobertaTokenizer or AlbertTokenizer builds, so both give the same ids.

The wrapper owns truncation and padding: whatever a tokenizer.json has baked in (MiniLM's pads every
text to 128) is switched off at load and set per call, so a call means the same for every checkpoint.
Special tokens come from the folder's special_tokens_map.json / tokenizer_config.json where they name them,
else from the first convention of the kind (SPECIAL_TOKENS, then OTHER_CONVENTIONS) the vocabulary holds.
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
from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import BPE, Unigram, WordPiece

from encoderlab.errors import ConfigError, InputError
from encoderlab.io import atomic_write_text

PathLike = str | os.PathLike
DEFAULT_MODEL_MAX_LENGTH = 512
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class SpecialTokens:
    """The special token strings of one tokenizer convention, by role."""

    pad: str
    unk: str
    cls: str
    sep: str
    mask: str
    order: tuple[str, ...]  # the order a trainer gives them ids 0, 1, 2, ...; a role not listed gets the last id

    def by_role(self) -> dict[str, str]:
        """{"pad_token": "[PAD]", ...}: the keys transformers' special_tokens_map.json uses."""
        return {f"{role}_token": getattr(self, role) for role in ROLES}


ROLES = ("pad", "unk", "cls", "sep", "mask")

# Keyed by the tokenizers model type, lowercased: the convention a tokenizer of that kind is trained with.
SPECIAL_TOKENS = {
    # BERT (Devlin et al., 2019): bert-base-uncased's vocab.txt starts [PAD], then [unused*], [UNK], [CLS], ...
    "wordpiece": SpecialTokens(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                               order=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")),
    # RoBERTa (Liu et al., 2019): roberta-base's vocab.json has <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> last.
    "bpe": SpecialTokens(pad="<pad>", unk="<unk>", cls="<s>", sep="</s>", mask="<mask>",
                         order=("<s>", "<pad>", "</s>", "<unk>")),
    # ALBERT (Lan et al., 2019): albert-base-v2's spiece.model has <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4.
    "unigram": SpecialTokens(pad="<pad>", unk="<unk>", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                             order=("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")),
}
KINDS = tuple(SPECIAL_TOKENS)
# Other conventions a loaded tokenizer of a kind may follow, tried in turn when no config file names its tokens.
OTHER_CONVENTIONS = {
    # DeBERTa-v3 (He et al., 2021): [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, [MASK] after the pieces (id 128000).
    "unigram": (SpecialTokens(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                              order=("[PAD]", "[CLS]", "[SEP]", "[UNK]")),),
}
# The transformers class a saved folder names, per kind; its pipeline is the one we build for that kind.
HF_CLASSES = {"wordpiece": "BertTokenizer", "bpe": "RobertaTokenizer", "unigram": "AlbertTokenizer"}
METASPACE = "\u2581"  # "▁": SentencePiece's mark for a preceding space (Kudo & Richardson, 2018)


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
    """A WordPiece (BERT), byte-level BPE (RoBERTa) or Unigram (ALBERT, DeBERTa) tokenizer with per-call
    truncation and padding; ids match transformers'."""

    def __init__(self, backend: RustTokenizer, kind: str, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
                 source: str = "tokenizer", specials: SpecialTokens | None = None, hf_class: str | None = None):
        if kind not in SPECIAL_TOKENS:
            raise InputError(f"{source}: {kind} tokenizers are not supported (supported: {', '.join(KINDS)})")
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        self._lock = threading.Lock()  # truncation/padding are set on the shared Rust object for each call
        self.kind = kind
        self.specials = specials or _choose_specials(backend.get_vocab(), kind, {}, source)
        self.hf_class = hf_class or HF_CLASSES[kind]
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
        hf_class = config.get("tokenizer_class") if isinstance(config.get("tokenizer_class"), str) else None
        if path.suffix == ".json":
            backend = _read_tokenizer_json(path)
            kind = type(backend.model).__name__.lower()
            if kind not in SPECIAL_TOKENS:
                raise InputError(f"{path}: {kind} tokenizers are not supported (supported: {', '.join(KINDS)})")
            given = _configured_specials(path.parent, config)
            specials = _choose_specials(backend.get_vocab(), kind, given, str(path))
            return cls(backend, kind, max_length, str(path), specials, hf_class)
        vocab = _read_vocab(path)
        _require_specials(vocab, SPECIAL_TOKENS["wordpiece"], str(path))
        lowercase = bool(config.get("do_lower_case", True))
        backend = _wordpiece_pipeline(vocab, lowercase, SPECIAL_TOKENS["wordpiece"],
                                      strip_accents=config.get("strip_accents"),
                                      chinese_chars=bool(config.get("tokenize_chinese_chars", True)))
        return cls(backend, "wordpiece", max_length, str(path), hf_class=hf_class)

    @classmethod
    def train(cls, kind: str, files: list[PathLike], vocab_size: int, lowercase: bool | None = None,
              min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
        """Train a `kind` ("wordpiece" | "bpe" | "unigram") vocabulary of at most vocab_size tokens on UTF-8 files."""
        if not files:
            raise InputError(f"train {kind}: no training files given")
        for file in files:
            _check_text_file(Path(file))
        return cls._train(kind, lambda backend, trainer: backend.train([str(f) for f in files], trainer),
                          vocab_size, lowercase, min_frequency, show_progress)

    @classmethod
    def train_from_iterator(cls, kind: str, texts: Iterable[str], vocab_size: int, lowercase: bool | None = None,
                            min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
        """Train a `kind` vocabulary on a stream of texts (paragraphs of a corpus, never all in memory)."""
        return cls._train(kind, lambda backend, trainer: backend.train_from_iterator(texts, trainer),
                          vocab_size, lowercase, min_frequency, show_progress)

    @classmethod
    def train_wordpiece(cls, files: list[PathLike], vocab_size: int, lowercase: bool = True,
                        min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
        """Train a BERT WordPiece vocabulary of at most `vocab_size` tokens on UTF-8 text files."""
        return cls.train("wordpiece", files, vocab_size, lowercase, min_frequency, show_progress)

    @classmethod
    def train_wordpiece_from_iterator(cls, texts: Iterable[str], vocab_size: int, lowercase: bool = True,
                                      min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
        """Train a BERT WordPiece vocabulary on a stream of texts."""
        return cls.train_from_iterator("wordpiece", texts, vocab_size, lowercase, min_frequency, show_progress)

    @classmethod
    def _train(cls, kind: str, run, vocab_size: int, lowercase: bool | None, min_frequency: int,
               show_progress: bool) -> Tokenizer:
        """Set up the kind's trainer, let `run(backend, trainer)` feed it, and wrap the rebuilt result."""
        if kind not in _TRAINERS:
            raise ConfigError(f"tokenizer kind {kind!r}: expected one of {', '.join(KINDS)}")
        specials = SPECIAL_TOKENS[kind]
        lowercase = _DEFAULT_LOWERCASE[kind] if lowercase is None else lowercase
        minimum = len(specials.by_role()) + (256 if kind == "bpe" else 0)  # byte-level BPE keeps all 256 bytes
        if vocab_size <= minimum:
            raise ConfigError(f"vocab_size={vocab_size}: a {kind} vocabulary must exceed {minimum} tokens "
                              f"({len(specials.by_role())} special" + (" + 256 bytes)" if kind == "bpe" else ")"))
        untrained, rebuild = _TRAINERS[kind]
        backend, trainer = untrained(specials, vocab_size, lowercase, min_frequency, show_progress)
        run(backend, trainer)
        # Rebuild from the learned model so trained and loaded tokenizers share one pipeline.
        return cls(rebuild(json.loads(backend.to_str())["model"], specials, lowercase), kind, specials=specials)

    def save(self, folder: PathLike) -> None:
        """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json (and vocab.txt for WordPiece,
        vocab.json and merges.txt for BPE): the files transformers loads."""
        folder = Path(folder)
        with self._lock:
            serialized = self._backend.to_str(pretty=True)
        atomic_write_text(folder / "tokenizer.json", serialized)
        parsed = json.loads(serialized)
        for name, text in _vocab_files(self.kind, parsed["model"], self._backend.get_vocab()).items():
            atomic_write_text(folder / name, text)
        atomic_write_text(folder / "tokenizer_config.json", _dumps(self._hf_config(parsed)))
        atomic_write_text(folder / "special_tokens_map.json", _dumps(self._special_tokens_map()))

    def _special_tokens_map(self) -> dict:
        """special_tokens_map.json: the five roles, and bos/eos where the convention has them (= cls/sep)."""
        extra = {} if self.kind == "wordpiece" else {"bos_token": self.specials.cls, "eos_token": self.specials.sep}
        return self.specials.by_role() | extra

    def _hf_config(self, serialized: dict) -> dict:
        """tokenizer_config.json: transformers 5 rebuilds the named class's pipeline from these keys."""
        normalizers_used = _normalizer_types(serialized.get("normalizer"))
        normalizer = serialized.get("normalizer") or {}
        config = {"tokenizer_class": self.hf_class, "model_max_length": self.model_max_length}
        if normalizer.get("type") == "BertNormalizer":
            config.update(do_lower_case=normalizer.get("lowercase", True),
                          strip_accents=normalizer.get("strip_accents"),
                          tokenize_chinese_chars=normalizer.get("handle_chinese_chars", True))
        elif self.kind == "unigram":  # AlbertTokenizer's and DebertaV2Tokenizer's keys
            config.update(do_lower_case="Lowercase" in normalizers_used,
                          keep_accents="StripAccents" not in normalizers_used)
        elif self.kind == "bpe":  # RobertaTokenizer's keys, as our pipeline sets them
            config.update(add_prefix_space=False, trim_offsets=True)
        return config | self._special_tokens_map()

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

    def pair_layout(self) -> tuple[list[int], int]:
        """The special ids between text A and text B of a pair (BERT's [SEP], RoBERTa's </s></s>) and B's type id.

        Every kind wraps a single text as [CLS] A [SEP] (cls_id, sep_id) and ends a pair with sep_id; only the
        middle and the type ids differ, so this is all that builders of pairs by hand need to know.
        """
        with self._lock:  # another thread may have truncation set for the moment
            encoding = self._backend.encode(["a"], ["b"], is_pretokenized=True)
        sequence = encoding.sequence_ids
        a_end = max(i for i, s in enumerate(sequence) if s == 0) + 1
        b_start = sequence.index(1)
        return encoding.ids[a_end:b_start], encoding.type_ids[b_start]

    @property
    def spaces_in_tokens(self) -> bool:
        """True when a word's leading space is part of its token (byte-level BPE's "Ġ"), so a text that
        continues another must be encoded with its leading space."""
        return isinstance(self._backend.pre_tokenizer, pre_tokenizers.ByteLevel)

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
        """The text of a list (or 1-D tensor) of ids, pieces joined back into words by the kind's decoder."""
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


def _configured_specials(folder: Path, config: dict) -> dict[str, str]:
    """The special tokens a folder's special_tokens_map.json and tokenizer_config.json name, by role."""
    token_map = _read_tokenizer_config(folder / "special_tokens_map.json")
    given = {}
    for role in ROLES:
        value = token_map.get(f"{role}_token", config.get(f"{role}_token"))
        value = value.get("content") if isinstance(value, dict) else value  # transformers' AddedToken form
        if isinstance(value, str) and value:
            given[role] = value
    return given


def _choose_specials(vocab: dict[str, int], kind: str, given: dict[str, str], source: str) -> SpecialTokens:
    """The first convention of the kind whose tokens (after those the config names) are all in the vocabulary."""
    candidates = [replace(c, **given) for c in (SPECIAL_TOKENS[kind], *OTHER_CONVENTIONS.get(kind, ()))]
    for candidate in candidates:
        if all(token in vocab for token in candidate.by_role().values()):
            return candidate
    _require_specials(vocab, candidates[0], source)  # raises, naming the missing tokens
    return candidates[0]


def _normalizer_types(normalizer: dict | None) -> set[str]:
    """The type names of a serialized normalizer and, for a Sequence, of its members."""
    if not normalizer:
        return set()
    members = normalizer.get("normalizers") or []
    return {normalizer.get("type")} | {m.get("type") for m in members if isinstance(m, dict)}


def _vocab_files(kind: str, model: dict, vocab: dict[str, int]) -> dict[str, str]:
    """The plain vocabulary files beside tokenizer.json: BERT's vocab.txt, GPT-2/RoBERTa's vocab.json + merges.txt."""
    by_id = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    if kind == "wordpiece":
        return {"vocab.txt": "".join(f"{token}\n" for token in by_id)}
    if kind == "bpe":
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        return {"vocab.json": json.dumps({t: i for i, t in enumerate(by_id)}, ensure_ascii=False) + "\n",
                "merges.txt": "#version: 0.2\n" + "".join(f"{m}\n" for m in merges)}
    return {}  # Unigram: tokenizer.json alone (the slow tokenizers' spiece.model is not written)


def _wordpiece_pipeline(vocab: dict[str, int], lowercase: bool, specials: SpecialTokens,
                        strip_accents: bool | None = None, chinese_chars: bool = True) -> RustTokenizer:
    """The BERT pipeline around a vocabulary: what BertTokenizerFast builds from a vocab.txt."""
    backend = RustTokenizer(WordPiece(vocab, unk_token=specials.unk, continuing_subword_prefix="##",
                                      max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                                    strip_accents=strip_accents, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = _bert_template(specials, vocab)
    backend.decoder = decoders.WordPiece(prefix="##")
    # Registered as special so "[MASK]" in a text is one token, not "[", "mask", "]".
    backend.add_special_tokens([t for t in specials.order if t in vocab])
    return backend


def _bert_template(specials: SpecialTokens, vocab: dict[str, int]) -> processors.TemplateProcessing:
    """`[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` with B's type id 1: BERT's layout, which ALBERT keeps."""
    cls_token, sep_token = specials.cls, specials.sep
    return processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, vocab[cls_token]), (sep_token, vocab[sep_token])])


def _register_specials(backend: RustTokenizer, specials: SpecialTokens, vocab: dict[str, int],
                       mask_takes_space: bool = False) -> None:
    """Mark the special tokens so one in a text is one token ("[MASK]", not "[", "mask", "]")."""
    tokens = [t for t in dict.fromkeys((*specials.order, *specials.by_role().values())) if t in vocab]
    backend.add_special_tokens([AddedToken(t, lstrip=mask_takes_space and t == specials.mask, special=True)
                                for t in tokens])


def _wordpiece_untrained(specials: SpecialTokens, vocab_size: int, lowercase: bool, min_frequency: int,
                         show_progress: bool) -> tuple[RustTokenizer, trainers.Trainer]:
    """An empty BERT WordPiece tokenizer and its trainer."""
    backend = RustTokenizer(WordPiece(unk_token=specials.unk))
    backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(specials.order), show_progress=show_progress,
                                        continuing_subword_prefix="##")
    return backend, trainer


def _bpe_untrained(specials: SpecialTokens, vocab_size: int, lowercase: bool, min_frequency: int,
                   show_progress: bool) -> tuple[RustTokenizer, trainers.Trainer]:
    """An empty byte-level BPE tokenizer and its trainer; one id is kept back for a mask appended last."""
    if lowercase:
        raise ConfigError("bpe: byte-level BPE is cased, as RoBERTa's (transformers' RobertaTokenizer has no "
                          "lowercasing step to match); train it without lowercasing")
    backend = RustTokenizer(BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    appended = [t for t in specials.by_role().values() if t not in specials.order]
    # initial_alphabet: every byte is a token, so no text is ever unknown (Radford et al., 2019, section 2.2).
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(appended), min_frequency=min_frequency,
                                  special_tokens=list(specials.order), show_progress=show_progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return backend, trainer


def _unigram_untrained(specials: SpecialTokens, vocab_size: int, lowercase: bool, min_frequency: int,
                       show_progress: bool) -> tuple[RustTokenizer, trainers.Trainer]:
    """An empty Unigram tokenizer and its trainer (min_frequency does not apply: Unigram prunes by likelihood)."""
    backend = RustTokenizer(Unigram())
    backend.normalizer = _albert_normalizer(lowercase)
    backend.pre_tokenizer = _metaspace_pre_tokenizer()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(specials.order),
                                      unk_token=specials.unk, show_progress=show_progress)
    return backend, trainer


def _wordpiece_rebuilt(model: dict, specials: SpecialTokens, lowercase: bool) -> RustTokenizer:
    """The BERT pipeline around a trained WordPiece model's vocabulary."""
    return _wordpiece_pipeline(model["vocab"], lowercase, specials)


def _bpe_rebuilt(model: dict, specials: SpecialTokens, lowercase: bool) -> RustTokenizer:
    """RoBERTa's pipeline, as transformers' RobertaTokenizer builds it, around trained BPE vocab and merges; the
    roles the trainer did not place (RoBERTa's <mask>) take the last ids."""
    vocab = dict(model["vocab"])
    for token in specials.by_role().values():
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    backend = RustTokenizer(BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # `<s> A </s>` and `<s> A </s></s> B </s>`, every type id 0 (RoBERTa has one token type).
    backend.post_processor = processors.RobertaProcessing((specials.sep, vocab[specials.sep]),
                                                          (specials.cls, vocab[specials.cls]),
                                                          trim_offsets=True, add_prefix_space=False)
    # roberta-base's <mask> takes the space before it (lstrip), so "the <mask>" masks the word " capital".
    _register_specials(backend, specials, vocab, mask_takes_space=True)
    return backend


def _unigram_rebuilt(model: dict, specials: SpecialTokens, lowercase: bool) -> RustTokenizer:
    """ALBERT's pipeline, as transformers' AlbertTokenizer builds it, around trained Unigram pieces and scores."""
    pieces = [(piece, float(score)) for piece, score in model["vocab"]]
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    backend = RustTokenizer(Unigram(pieces, unk_id=vocab[specials.unk], byte_fallback=False))
    backend.normalizer = _albert_normalizer(lowercase)
    backend.pre_tokenizer = _metaspace_pre_tokenizer()
    backend.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    backend.post_processor = _bert_template(specials, vocab)
    _register_specials(backend, specials, vocab)
    return backend


def _albert_normalizer(lowercase: bool) -> normalizers.Normalizer:
    """ALBERT's normalizer: `` and '' to ", accents stripped and lowercase when uncased (kept when cased)."""
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    return normalizers.Sequence(steps)


def _metaspace_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Split on whitespace, then mark each word's leading space with ▁, as SentencePiece does."""
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                    pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")])


_TRAINERS = {"wordpiece": (_wordpiece_untrained, _wordpiece_rebuilt), "bpe": (_bpe_untrained, _bpe_rebuilt),
             "unigram": (_unigram_untrained, _unigram_rebuilt)}
# BERT and ALBERT were released uncased first; RoBERTa's byte-level BPE is always cased.
_DEFAULT_LOWERCASE = {"wordpiece": True, "bpe": False, "unigram": True}


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
