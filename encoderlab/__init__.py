"""encoderlab: BERT-family encoders written from scratch, with Hugging Face parity."""

from encoderlab import models  # noqa: F401  (registers every family's presets and config.json names with config)
from encoderlab.checkpoint import load_model, resolve_model_path, save_pretrained
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError, EncoderlabError, InputError
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.nn.model import (EncoderModel, MaskedLMModel, ModelOutput, PreTrainingModel, ReplacedTokenDetector,
                                 SentenceEmbedder, SequenceClassifier, SpanExtractor, TokenClassifier)

__version__ = "0.1.0"

__all__ = [
    "BiLSTMClassifier", "CheckpointError", "ConfigError", "EncoderConfig", "EncoderModel", "EncoderlabError",
    "InputError", "MaskedLMModel", "ModelOutput", "PreTrainingModel", "ReplacedTokenDetector", "SentenceEmbedder",
    "SequenceClassifier", "SpanExtractor", "TokenClassifier", "load_model", "resolve_model_path", "save_pretrained",
]
