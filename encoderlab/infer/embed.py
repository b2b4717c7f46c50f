"""Sentence embeddings: encode texts, pool token vectors (mean over real tokens, or [CLS]), optionally L2-normalize.

Mean pooling over non-padding tokens followed by normalization is what sentence-transformers does for
all-MiniLM-L6-v2 (its 1_Pooling/config.json: pooling_mode_mean_tokens), so the vectors match its `encode`.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from encoderlab.errors import InputError
from encoderlab.nn.model import EncoderModel
from encoderlab.nn.pooling import POOLINGS, pool
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def default_max_length(model_folder: Path | None, model: EncoderModel) -> int:
    """The sequence limit: sentence_bert_config.json's max_seq_length if the folder has one, else the model's."""
    limit = model.config.max_position_embeddings
    settings = model_folder / "sentence_bert_config.json" if model_folder else None
    if settings is not None and settings.is_file():
        limit = min(limit, int(json.loads(settings.read_text(encoding="utf-8")).get("max_seq_length", limit)))
    return limit


@torch.inference_mode()
def embed(model: EncoderModel, tokenizer: Tokenizer, texts: list[str], pooling: str = "mean",
          normalize: bool = False, batch_size: int = 32, max_length: int | None = None,
          progress: bool | None = None) -> np.ndarray:
    """Embed texts into a float32 array (N, H), in input order.

    Batches are formed from texts of similar length so little compute goes to padding.
    """
    if not texts:
        raise InputError("no texts to embed")
    for i, text in enumerate(texts):
        if not text.strip():
            raise InputError(f"text {i} is empty or whitespace only")
    if pooling not in POOLINGS:
        raise InputError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    max_length = max_length or model.config.max_position_embeddings
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)
    truncated = 0
    show = progress if progress is not None else len(texts) > 20 * batch_size
    for start in tqdm(range(0, len(texts), batch_size), desc="embed", unit="batch", disable=not show, file=sys.stderr):
        index = order[start:start + batch_size]
        batch = tokenizer.encode_batch([texts[i] for i in index], max_length=max_length)
        truncated += batch.num_truncated
        hidden = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state
        vectors = pool(hidden.float(), batch.attention_mask, pooling)
        if normalize:
            vectors = F.normalize(vectors, dim=-1)
        out[index] = vectors.numpy()
    if truncated:
        log.warning("%d of %d texts were longer than %d tokens and were truncated", truncated, len(texts), max_length)
    return out


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of a (N, H) with each row of b (M, H): (N, M)."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True).clip(min=1e-12)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True).clip(min=1e-12)
    return a @ b.T
