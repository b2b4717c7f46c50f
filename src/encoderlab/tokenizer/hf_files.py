"""A tokenizer folder as transformers reads and writes it: tokenizer.json (else BERT's vocab.txt) with
tokenizer_config.json and special_tokens_map.json, plus the plain vocabulary files written beside it (vocab.txt,
RoBERTa's vocab.json + merges.txt). Errors name the file and line at fault."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer as RustTokenizer

from encoderlab.errors import CheckpointError, InputError
from encoderlab.io import atomic_write_text, read_json_file, read_text
from encoderlab.hub import parse_hub_name
from encoderlab.paths import model_aliases, resolve_model_path
from encoderlab.tokenizer.kinds import (DEFAULT_MODEL_MAX_LENGTH, SPECIAL_TOKENS, SpecialTokens, choose_specials,
                                       configured_specials, require_kind, require_specials, wordpiece_pipeline)

Loaded = tuple[RustTokenizer, str, int, str, SpecialTokens | None, str | None]


def load(name_or_path: str | os.PathLike) -> Loaded:
    """The Tokenizer arguments of a saved tokenizer: backend, kind, model_max_length, source, specials, class."""
    path = _tokenizer_file(_resolve(name_or_path))
    config = read_json_file(path.parent / "tokenizer_config.json", dict, InputError, optional=True)
    max_length = int(config.get("model_max_length") or DEFAULT_MODEL_MAX_LENGTH)
    max_length = min(max_length, 1 << 20)  # transformers writes 1e30 for "no limit"
    hf_class = config.get("tokenizer_class") if isinstance(config.get("tokenizer_class"), str) else None
    if path.suffix == ".json":
        backend = _read_tokenizer_json(path)
        kind = type(backend.model).__name__.lower()
        require_kind(kind, str(path))
        token_map = read_json_file(path.parent / "special_tokens_map.json", dict, InputError, optional=True)
        given = configured_specials(token_map, config)
        specials = choose_specials(backend.get_vocab(), kind, given, str(path))
        return backend, kind, max_length, str(path), specials, hf_class
    vocab = _read_vocab(path)
    require_specials(vocab, SPECIAL_TOKENS["wordpiece"], str(path))
    backend = wordpiece_pipeline(vocab, bool(config.get("do_lower_case", True)), SPECIAL_TOKENS["wordpiece"],
                                 strip_accents=config.get("strip_accents"),
                                 chinese_chars=bool(config.get("tokenize_chinese_chars", True)))
    return backend, "wordpiece", max_length, str(path), None, hf_class


def _resolve(name_or_path: str | os.PathLike) -> Path:
    """An existing path, the folder behind a model alias, or a Hub model's snapshot (`org/name[@revision]`, fetched
    as `--model` fetches it); InputError naming the path otherwise."""
    path = Path(name_or_path)
    if path.exists():
        return path
    aliases = model_aliases()
    if str(name_or_path) not in aliases and parse_hub_name(str(name_or_path)) is None:
        raise InputError(f"{path}: no such tokenizer file or folder, not a known alias ({', '.join(aliases)}) and "
                         f"not a Hub name (org/name)")
    try:
        return resolve_model_path(name_or_path)
    except CheckpointError as err:
        raise InputError(str(err)) from None


def _tokenizer_file(path: Path) -> Path:
    """A folder's tokenizer.json, else its vocab.txt; a file as it is."""
    if not path.is_dir():
        return path
    for name in ("tokenizer.json", "vocab.txt"):
        if (path / name).is_file():
            return path / name
    raise InputError(f"{path}: neither tokenizer.json nor vocab.txt in this folder")


def _read_tokenizer_json(path: Path) -> RustTokenizer:
    """A tokenizers serialization, with InputError naming the file (and line) when it is corrupted."""
    try:
        return RustTokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception, with no line number that is reliable
        read_json_file(path, dict, InputError)  # so broken JSON is reported by Python's parser, with its line
        raise InputError(f"{path}: not a valid tokenizer.json ({err})") from None


def _read_vocab(path: Path) -> dict[str, int]:
    """A BERT vocab.txt (one token a line, id = line number - 1), with errors naming file and line."""
    # As tokenizers' WordPiece.from_file: trailing whitespace (a \r) is not part of the token.
    tokens = [line.rstrip() for line in read_text(path).split("\n")]
    if tokens and tokens[-1] == "":
        tokens.pop()
    if not tokens:
        raise InputError(f"{path}: the vocabulary is empty (expected one token a line)")
    return {token: i for i, token in enumerate(tokens)}


def write_hf_files(folder: Path, serialized: str, vocab: dict[str, int], kind: str, specials: SpecialTokens,
                   hf_class: str, model_max_length: int) -> None:
    """Write `serialized` (a tokenizer.json) and the files transformers reads beside it, each atomically."""
    atomic_write_text(folder / "tokenizer.json", serialized)
    parsed = json.loads(serialized)
    for name, text in _vocab_files(kind, parsed["model"], vocab).items():
        atomic_write_text(folder / name, text)
    # The five roles, and bos/eos (= cls/sep) where the convention has them, as RoBERTa's and ALBERT's maps do.
    bos_eos = {} if kind == "wordpiece" else {"bos_token": specials.cls, "eos_token": specials.sep}
    token_map = specials.by_role() | bos_eos
    config = _hf_config(kind, parsed, hf_class, model_max_length) | token_map
    atomic_write_text(folder / "tokenizer_config.json", _dumps(config))
    atomic_write_text(folder / "special_tokens_map.json", _dumps(token_map))


def _hf_config(kind: str, serialized: dict, hf_class: str, model_max_length: int) -> dict:
    """tokenizer_config.json less its special tokens: transformers 5 rebuilds the class's pipeline from these keys."""
    normalizer = serialized.get("normalizer") or {}
    config = {"tokenizer_class": hf_class, "model_max_length": model_max_length}
    if normalizer.get("type") == "BertNormalizer":
        config.update(do_lower_case=normalizer.get("lowercase", True), strip_accents=normalizer.get("strip_accents"),
                      tokenize_chinese_chars=normalizer.get("handle_chinese_chars", True))
    elif kind == "unigram":  # AlbertTokenizer's and DebertaV2Tokenizer's keys
        used = {normalizer.get("type")} | {m.get("type") for m in normalizer.get("normalizers") or []
                                           if isinstance(m, dict)}
        config.update(do_lower_case="Lowercase" in used, keep_accents="StripAccents" not in used)
    elif kind == "bpe":  # RobertaTokenizer's keys, as our pipeline sets them
        config.update(add_prefix_space=False, trim_offsets=True)
    return config


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


def _dumps(obj: dict) -> str:
    """Indented JSON with a final newline, as transformers writes its config files."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
