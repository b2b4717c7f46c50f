"""encoderlab: BERT-family encoders written from scratch, with Hugging Face parity.

The models and loaders below load torch, so they are imported on first use (PEP 562's module __getattr__), not
with the package: `encoderlab --help` and the CLI's input checks answer without torch (docs/reliability.md)."""

from __future__ import annotations

import importlib
from typing import Any

from encoderlab import models  # noqa: F401  (registers every family's presets and config.json names with config)
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError, EncoderlabError, InputError

__version__ = "0.1.0"

_LAZY = {  # name -> the module that defines it (each of these imports torch)
    "load_model": "encoderlab.checkpoint", "resolve_model_path": "encoderlab.checkpoint",
    "save_pretrained": "encoderlab.checkpoint", "BiLSTMClassifier": "encoderlab.nn.bilstm",
    "Index": "encoderlab.retrieval.index",
    **{name: "encoderlab.nn.model" for name in (
        "EncoderModel", "MaskedLMModel", "ModelOutput", "PreTrainingModel", "ReplacedTokenDetector",
        "SentenceEmbedder", "SequenceClassifier", "SpanExtractor", "TokenClassifier")},
}

__all__ = ["CheckpointError", "ConfigError", "EncoderConfig", "EncoderlabError", "InputError", *_LAZY]


def __getattr__(name: str) -> Any:
    """The lazily imported names of __all__ (`from encoderlab import EncoderModel` works as before)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'encoderlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
