"""Approximate and quantised search over an index's vectors, with faiss-cpu (bench/ann.py measured it against
usearch; docs/retrieval.md says why this one).

- hnsw: a hierarchical navigable small-world graph (Malkov & Yashunin 2018, arXiv:1603.09320) over the float32
  vectors (faiss IndexHNSWFlat), or over their int8 or binary codes;
- quantize int8: one byte a dimension, each dimension's range learnt from the vectors (faiss ScalarQuantizer
  QT_8bit); binary: one bit a dimension, its sign, compared by Hamming distance (faiss IndexBinary*);
- quantised candidates are rescored by the float32 vectors, which stay in the shards: the rescoring that
  sentence-transformers' quantization guide recommends (Shakir, Aarsen & Lee 2024, "Binary and Scalar Embedding
  Quantization", huggingface.co/blog/embedding-quantization: retrieve rescore_multiplier x k, rescore), here with the
  document's float32 vector rather than its code, so a rescored score is the exact one.

    DIR/ann/index.faiss     the structure (faiss.write_index / write_index_binary); its settings: index.json "ann"
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from encoderlab.errors import InputError
from encoderlab.io import atomic_write
from encoderlab.retrieval.meta import ANN, EF_CONSTRUCTION, EF_SEARCH, HNSW_M

FILE = "index.faiss"
KINDS = ("hnsw", "flat")  # flat: every code compared (exact over the quantised vectors); only with a quantisation
QUANTIZE = ("int8", "binary")
# Candidates rescored per hit asked for: the guide's rescore_multiplier is 4, which int8 codes need at most (2 kept
# all of the exact top 10 on bench/ann.py's 10,000 Wikipedia vectors). Sign bits lose far more order: rescoring
# the Hamming top 10 found 0.48 of the exact top 10, the top 40 0.80, 100 0.92, 400 0.99: binary rescores 40 per hit.
RESCORE = {None: 1, "int8": 4, "binary": 40}


def settings(kind: str | None, quantize: str | None, dimensions: int, m: int = HNSW_M,
             ef_construction: int = EF_CONSTRUCTION, ef_search: int = EF_SEARCH) -> dict[str, Any]:
    """index.json's "ann" record for --ann KIND and --quantize Q, checked; InputError names the flag at fault."""
    if kind is not None and kind not in KINDS[:1]:
        raise InputError(f"--ann {kind!r}: expected {KINDS[0]}")
    if quantize is not None and quantize not in QUANTIZE:
        raise InputError(f"--quantize {quantize!r}: expected one of {', '.join(QUANTIZE)}")
    if kind is None and quantize is None:
        raise InputError("pass --ann hnsw, --quantize int8|binary, or both")
    if quantize == "binary" and dimensions % 8:
        raise InputError(f"--quantize binary packs 8 dimensions a byte: the index has {dimensions} dimensions, not "
                         f"a multiple of 8 (pick --dimensions accordingly)")
    for name, value in (("--ann-m", m), ("--ef-construction", ef_construction), ("--ef-search", ef_search)):
        if value < 1:
            raise InputError(f"{name} {value}: expected a positive number")
    return {"kind": kind or "flat", "quantize": quantize, "m": m, "ef_construction": ef_construction,
            "ef_search": ef_search, "rescore": RESCORE[quantize],
            "library": f"faiss-cpu {metadata.version('faiss-cpu')}"}


def create(ann: dict[str, Any], dimensions: int) -> Any:
    """An empty faiss index for the settings (inner product: the cosine of normalised vectors)."""
    ip, q8 = faiss.METRIC_INNER_PRODUCT, faiss.ScalarQuantizer.QT_8bit
    hnsw = ann["kind"] == "hnsw"
    if ann["quantize"] == "binary":
        return faiss.IndexBinaryHNSW(dimensions, ann["m"]) if hnsw else faiss.IndexBinaryFlat(dimensions)
    if ann["quantize"] == "int8":
        return faiss.IndexHNSWSQ(dimensions, q8, ann["m"], ip) if hnsw else faiss.IndexScalarQuantizer(
            dimensions, q8, ip)
    return faiss.IndexHNSWFlat(dimensions, ann["m"], ip)


def codes(vectors: np.ndarray, quantize: str | None) -> np.ndarray:
    """What the faiss index holds for (N, D) float32 vectors: themselves, or (N, D/8) sign bits for binary."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return np.packbits(vectors > 0, axis=1) if quantize == "binary" else vectors


def build(vectors: np.ndarray, ann: dict[str, Any], folder: Path) -> None:
    """Build the structure over (N, D) vectors (in index order: a hit's number is its position) and write
    folder/ann/index.faiss atomically."""
    index = create(ann, vectors.shape[1])
    if hasattr(index, "hnsw"):
        index.hnsw.efConstruction = ann["ef_construction"]
    data = codes(vectors, ann["quantize"])
    if not index.is_trained:
        index.train(data)  # int8: each dimension's min and max
    index.add(data)
    write = faiss.write_index_binary if ann["quantize"] == "binary" else faiss.write_index
    atomic_write(folder / ANN / FILE, lambda tmp: write(index, str(tmp)))


def load(folder: Path, ann: dict[str, Any]) -> Any:
    """The structure build() wrote; InputError when it is missing (an index copied without its ann folder)."""
    path = folder / ANN / FILE
    if not path.is_file():
        raise InputError(f"{path}: missing, though index.json records an ann index: build it again with "
                         f"`encoderlab index --out {folder} --ann {ann['kind']}` (or search with --exact)")
    return faiss.read_index_binary(str(path)) if ann["quantize"] == "binary" else faiss.read_index(str(path))


def search(index: Any, ann: dict[str, Any], queries: np.ndarray, k: int, rows: Callable[[np.ndarray], np.ndarray],
           ef_search: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each (Q, D) query's best k: scores (Q, k) and positions (Q, k), best first. Quantised candidates (rescore x k
    of them) are scored again with the float32 vectors rows(positions) gives, (n, D)."""
    depth = min(k * ann["rescore"], index.ntotal)
    if ann["kind"] == "hnsw":
        index.hnsw.efSearch = max(ef_search or ann["ef_search"], depth)  # HNSW returns at most ef results
    scores, positions = index.search(codes(queries, ann["quantize"]), depth)  # (Q, depth)
    if ann["quantize"] is None:  # HNSW can find fewer than depth (near-duplicate vectors): -1, scored -inf
        return np.where(positions < 0, -np.inf, scores)[:, :k], positions[:, :k]
    found = positions.clip(min=0)  # -1: fewer results than asked (a tiny index); scored below every real one
    exact = np.einsum("qd,qcd->qc", queries, rows(found.ravel()).reshape(*found.shape, -1))  # (Q, depth)
    exact[positions < 0] = -np.inf
    order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(exact, order, 1), np.take_along_axis(found, order, 1)
