"""A sparse index (index.json "kind": "sparse"): a learned sparse model's (SPLADE, encoderlab.tasks.splade) document
weights, one scipy.sparse CSC matrix (n, V) per shard. Compressed by column, a shard is an inverted index: column j
holds the documents that weigh vocabulary token j and their weights (its posting list), so a query's score against
every document of the shard, the dot product of their weights, reads only the posting lists of the query's own
tokens (`query @ shard.T`, exact; Lassance and Clinchant 2022, arXiv:2207.03834, measure SPLADE's latency on such
lists). scipy is a dependency already, and exact; an approximate sparse library (Seismic, PISA) would trade exactness
for speed this corpus size does not need, and none installs from this machine's registries as a wheel.

The Index (encoderlab.retrieval.index) builds, resumes, adds to and searches it as it does a dense one; this class
says how its shards are stored, encoded and scored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import torch

from encoderlab.tasks.pipeline import Pipeline
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.splade import Splade


class SparseVectors:
    """How a sparse index stores and scores its vectors: CSC shards (n, V), float32 weights; the Splade pipeline
    encodes documents, and queries (through the query table in an inference-free model)."""

    kind, suffix = "sparse", ".npz"

    @staticmethod
    def made_by(embedder: Pipeline) -> bool:
        """Whether this pipeline makes vectors of this kind."""
        return isinstance(embedder, Splade)

    @staticmethod
    def documents(embedder: Splade, texts: list[str]) -> scipy.sparse.csc_matrix:
        """(n, V) document weights, by column: the shard's posting lists."""
        return embedder.vectors(texts).tocsc()

    @staticmethod
    def queries(embedder: Splade, texts: list[str], index: Any = None) -> scipy.sparse.csr_matrix:
        """(Q, V) query weights, by row: of the index's terms alone where an index is given (the others would score
        nothing; the MLM decoder computes fewer logits, encoderlab.tasks.splade.Splade.vectors)."""
        return embedder.vectors(texts, query=True, vocabulary=None if index is None else index.terms())

    @staticmethod
    def terms(shard: scipy.sparse.csc_matrix) -> np.ndarray:
        """(V,) whether some document of the shard weighs each vocabulary id: a posting list that is not empty."""
        return np.diff(shard.indptr) > 0

    @staticmethod
    def save(path: Path, vectors: scipy.sparse.csc_matrix) -> None:
        with open(path, "wb") as handle:
            scipy.sparse.save_npz(handle, vectors.astype(np.float32), compressed=False)

    @staticmethod
    def load(path: Path) -> scipy.sparse.csc_matrix:
        return scipy.sparse.load_npz(path).tocsc()

    @staticmethod
    def stack(shards: list[scipy.sparse.spmatrix]) -> scipy.sparse.csc_matrix:
        """Every shard's rows, in order, as one matrix."""
        return scipy.sparse.vstack(shards, format="csc")

    @staticmethod
    def scores(queries: scipy.sparse.csr_matrix, shard: scipy.sparse.csc_matrix) -> torch.Tensor:
        """(Q, n) dot products: each query's tokens' posting lists, weighted and summed."""
        return torch.from_numpy(np.asarray((queries @ shard.T).todense(), dtype=np.float32))

    @staticmethod
    def meta(embedder: Splade) -> dict[str, Any]:
        """index.json's record of how the weights were made."""
        return {"dimensions": embedder.model.config.vocab_size, "max_length": embedder.max_length,
                "stride": embedder.stride,
                "similarity": "dot", "dtype": "float32", "inference_free": embedder.inference_free}

    @staticmethod
    def encoder(meta: dict[str, Any], model: str | os.PathLike, **options: Any) -> Pipeline:
        """The Splade pipeline that encodes queries as the index's documents were (same window)."""
        options = {k: v for k, v in options.items() if k not in ("pooling", "normalize", "dimensions")}
        return pipeline("splade", model, **{"max_length": meta["max_length"]} | options)

