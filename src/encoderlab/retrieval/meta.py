"""An index folder's index.json, torch-free: what model made the vectors (a fingerprint of its files), how they were
made (pooling, normalisation, dimensions, window), the corpus files they came from, and whether the build finished.
The command line reads it to refuse a mismatched model before torch loads.

    DIR/index.json          this record
    DIR/shards/00000.npy    (n, D) float32 vectors of documents 0..n-1 of the shard, in corpus order
    DIR/shards/00000.ids.json, 00000.docs.jsonl   their ids, and their {"_id", "title", "text"} to show and to rescore
    DIR/bm25/               bm25s's index (with --bm25)
    DIR/ann/index.faiss     the approximate or quantised structure (with --ann or --quantize), settings in "ann"
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from encoderlab.errors import InputError
from encoderlab.folder import read_task_info
from encoderlab.io import atomic_write_text
from encoderlab.paths import resolve_model_path

INDEX_FILE = "index.json"
SHARDS = "shards"
BM25 = "bm25"
ANN = "ann"
# --ann hnsw's defaults: links per node, candidates kept while linking and while searching. Picked by bench/ann.py
# (docs/retrieval.md, "Approximate search"): on 10,000 minilm Wikipedia vectors M 32 beat M 16 at every ef_search,
# and ef_search 128 kept 0.999 of the exact top 10 (64: 0.990) at 0.55 ms: the margin a corpus 20x bigger needs.
HNSW_M, EF_CONSTRUCTION, EF_SEARCH = 32, 200, 128
FORMAT = 1
MULTIVECTOR = "multivector"
KIND_OF_TASK = {"splade": "sparse", "colbert": MULTIVECTOR}  # task.json's task -> its vectors' index kind (else dense)
PIPELINE_OF_KIND = {"dense": "embed", "sparse": "splade", MULTIVECTOR: "colbert"}  # what encodes a kind's texts
OWN = (INDEX_FILE, SHARDS, BM25, ANN)  # what an index folder holds: --add and --resume find these and nothing else
# Files that decide a model's vectors, hashed whole (small), and weights, fingerprinted by name, size and SAMPLES
# pieces of SAMPLE_BYTES spread over the file (1 MiB: hashing 90 MB of weights would take longer than searching; a
# model trained again in place changes every piece). Indexes built before the samples ("weights_sampled" absent)
# are checked by name and size.
HASHED = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "modules.json",
          "sentence_bert_config.json", "1_Pooling/config.json", "task.json")
WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
SAMPLES, SAMPLE_BYTES = 16, 1 << 16


def fingerprint(model: str | os.PathLike, sampled: bool = True) -> str:
    """A short hash of a model folder's config, tokenizer and pooling files and its weight files' sizes and (sampled)
    pieces of their bytes."""
    folder = resolve_model_path(model)
    digest = hashlib.sha256()
    for name in HASHED:
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    for name in WEIGHTS:
        if (folder / name).is_file():
            digest.update(f"{name}\0{(folder / name).stat().st_size}".encode())
            if sampled:
                digest.update(weight_sample(folder / name))
    return digest.hexdigest()[:16]


def weight_sample(path: Path) -> bytes:
    """SAMPLES pieces of SAMPLE_BYTES of a file, evenly spaced from its start to its end (the whole of a small one)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= SAMPLES * SAMPLE_BYTES:
            return f.read()
        pieces = []
        for k in range(SAMPLES):
            f.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
            pieces.append(f.read(SAMPLE_BYTES))
    return b"".join(pieces)


def model_record(model: str | os.PathLike) -> dict[str, Any]:
    """index.json's "model": the name given, the folder it resolved to and that folder's fingerprint."""
    return {"name": str(model), "path": str(resolve_model_path(model).resolve()), "fingerprint": fingerprint(model),
            "weights_sampled": True}


def own_model(folder: str | os.PathLike, meta: dict[str, Any]) -> str:
    """The folder of the model an index was built with, to encode its queries; InputError if that folder's files
    have changed since (a model trained again in place would encode queries the index's vectors do not match)."""
    built = meta["model"]
    path = built["path"]
    if Path(path).is_dir() and fingerprint(path, built.get("weights_sampled", False)) != built["fingerprint"]:
        raise InputError(f"--index {folder} was built with the model at {path}, whose files have changed since "
                         f"(trained or saved again there?): its query vectors would not match the index's. Index "
                         f"again with it, or pass --model with the model the index was built with")
    return path


def query_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The embed pipeline's options that encode queries as the index's documents were (its index.json's)."""
    return {"pooling": meta["pooling"], "normalize": meta["normalize"], "dimensions": meta["dimensions"],
            "max_length": meta["max_length"]}


def source(path: str | os.PathLike, first_shard: int) -> dict[str, Any]:
    """A corpus file as index.json records it: where, its size and time (a resume reads the same file) and the
    shard its documents start at."""
    stat = Path(path).stat()
    return {"path": str(Path(path).resolve()), "bytes": stat.st_size, "mtime": stat.st_mtime,
            "first_shard": first_shard}


def index_bytes(folder: str | os.PathLike) -> int:
    """Bytes of an index's vector shards (what search reads; the stored documents aside)."""
    return sum(p.stat().st_size for suffix in ("*.npz", "*.npy") for p in (Path(folder) / SHARDS).glob(suffix))


def read_meta(folder: str | os.PathLike) -> dict[str, Any]:
    """index.json of an index folder; InputError when the folder holds none or a broken one."""
    path = Path(folder) / INDEX_FILE
    if not path.is_file():
        raise InputError(f"--index {folder}: no {INDEX_FILE} there (build one with `encoderlab index`)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise InputError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{path}: not an encoderlab index of format {FORMAT}")
    return meta


def write_meta(folder: str | os.PathLike, meta: dict[str, Any]) -> None:
    """index.json, atomically."""
    atomic_write_text(Path(folder) / INDEX_FILE, json.dumps(meta, indent=2) + "\n")


def require_complete(folder: str | os.PathLike, meta: dict[str, Any]) -> None:
    """InputError for an index whose build was cut off (finish it with --resume)."""
    if not meta.get("complete"):
        raise InputError(f"--index {folder}: its build did not finish: run the same `encoderlab index` command with "
                         f"--resume to complete it")


def model_index_kind(model: str | os.PathLike) -> str:
    """The index kind a model's vectors make, by its task.json: sparse for SPLADE, multivector for ColBERT, else
    dense."""
    return KIND_OF_TASK.get(read_task_info(resolve_model_path(model)).get("task"), "dense")


def check_model(folder: str | os.PathLike, meta: dict[str, Any], model: str | os.PathLike | None) -> None:
    """InputError, naming both, when `model` is not the model the index was built with (None: the index's own):
    first when it makes another kind of vectors (a dense model on a sparse index, or the reverse)."""
    if model is None:
        return
    built = meta["model"]
    kind, given = index_kind(meta), model_index_kind(model)
    if given != kind:
        raise InputError(f"--index {folder} is a {kind} index (built with {built['name']}); --model {model} is a "
                         f"{given} model: it cannot encode queries for it. Search with a {kind} model, or index "
                         f"again with {model}")
    if fingerprint(model, built.get("weights_sampled", False)) != built["fingerprint"]:
        raise InputError(f"--index {folder} was built with the model {built['name']} ({built['path']}); --model "
                         f"{model} is another model (its files differ): its query vectors would not match the "
                         f"index's. Search with {built['name']}, or index again with {model}")


def index_kind(meta: dict[str, Any]) -> str:
    """The index's kind: dense unless index.json says otherwise (indexes built before kinds are dense)."""
    return meta.get("kind", "dense")
