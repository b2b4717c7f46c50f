"""Sentence embeddings of a loaded encoder through the engine, and cosine similarity (mean pooling and
normalization reproduce sentence-transformers' all-MiniLM-L6-v2 `encode`; a folder's own choice is in its settings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from encoderlab.checkpoint import settings
from encoderlab.engine import Engine, check_texts, forward, sentence_vectors
from encoderlab.errors import InputError
from encoderlab.nn.pooling import POOLINGS
from encoderlab.tasks.base import model_device
from encoderlab.tokenizer import Tokenizer


def default_max_length(model_folder: Path | None, model: nn.Module) -> int:
    """The sequence limit: the folder's (sentence_bert_config.json's max_seq_length, ...), else the model's."""
    limit = model.config.max_position_embeddings
    return min(limit, (settings(model_folder).max_length or limit) if model_folder else limit)


def embed(model: nn.Module, tokenizer: Tokenizer, texts: list[str], pooling: str = "mean", normalize: bool = False,
          batch_size: int = 32, max_length: int | None = None) -> np.ndarray:
    """Embed texts into a float32 array (N, H), in input order, with an encoder (or a sentence embedder)."""
    if pooling not in POOLINGS:
        raise InputError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
    engine = Engine(tokenizer, max_length or model.config.max_position_embeddings, batch_size, model_device(model))
    return engine.rows(engine.encode(check_texts(texts)), lambda batch: sentence_vectors(
        forward(model, batch), batch["attention_mask"], pooling, normalize)).numpy()


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of a (N, H) with each row of b (M, H): (N, M)."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True).clip(min=1e-12)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True).clip(min=1e-12)
    return a @ b.T
