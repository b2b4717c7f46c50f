"""Saving a tokenizer as the files transformers loads: tokenizer.json, tokenizer_config.json,
special_tokens_map.json, and the plain vocabulary files (BERT's vocab.txt, RoBERTa's vocab.json + merges.txt)."""

from __future__ import annotations

import json
from pathlib import Path

from encoderlab.io import atomic_write_text
from encoderlab.tokenizer.conventions import SpecialTokens


def write_hf_files(folder: Path, serialized: str, vocab: dict[str, int], kind: str, specials: SpecialTokens,
                   hf_class: str, model_max_length: int) -> None:
    """Write `serialized` (a tokenizer.json) and the files transformers reads beside it, each atomically."""
    atomic_write_text(folder / "tokenizer.json", serialized)
    parsed = json.loads(serialized)
    for name, text in _vocab_files(kind, parsed["model"], vocab).items():
        atomic_write_text(folder / name, text)
    token_map = _special_tokens_map(kind, specials)
    config = _hf_config(kind, parsed, hf_class, model_max_length) | token_map
    atomic_write_text(folder / "tokenizer_config.json", _dumps(config))
    atomic_write_text(folder / "special_tokens_map.json", _dumps(token_map))


def _special_tokens_map(kind: str, specials: SpecialTokens) -> dict:
    """special_tokens_map.json: the five roles, and bos/eos where the convention has them (= cls/sep)."""
    extra = {} if kind == "wordpiece" else {"bos_token": specials.cls, "eos_token": specials.sep}
    return specials.by_role() | extra


def _hf_config(kind: str, serialized: dict, hf_class: str, model_max_length: int) -> dict:
    """tokenizer_config.json without its special tokens: transformers 5 rebuilds the named class's pipeline
    from these keys."""
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
