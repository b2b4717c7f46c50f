"""The index: a corpus's sentence vectors in shards, made by the Embed pipeline (so `index` gives the vectors `embed`
gives), searched exactly (dense), by BM25, or both fused; the best hits optionally reranked by a cross-encoder.

    from encoderlab import Index
    index = Index.build("minilm", "examples/corpus.jsonl", "runs/index", bm25=True)
    index.search("who wrote the theory of relativity?", top_k=3, mode="hybrid")[0][0]["id"]

A build streams the corpus a shard (shard_size documents) at a time: memory stays flat in the corpus's size. Each
shard's files are written atomically, its vectors last, so a shard whose .npy exists is finished; a build that was
cut off resumes (resume=True, `index --resume`) from the first unfinished shard and gives the vectors an unbroken
build gives (a shard is the same documents, embedded in the same batches). Under torchrun each rank encodes every
world_size-th shard and rank 0 finishes the index (encoderlab.retrieval.distributed). Layout:
encoderlab.retrieval.meta.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from encoderlab.cards import SEARCH
from encoderlab.choices import FUSIONS, SEARCH_MODES
from encoderlab.errors import InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.embedding import Embed
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.io import atomic_write, atomic_write_text, check_out_folder, progress_bar
from encoderlab.retrieval import ann, fusion, lexical, sparse
from encoderlab.retrieval.corpus import Document, read_documents, scan
from encoderlab.retrieval.distributed import WAIT, Dist, join, main_then_all, own_documents, owns, wait
from encoderlab.retrieval.meta import (BM25, FORMAT, OWN, SHARDS, check_model, index_kind, model_record, own_model,
                                       query_settings, read_meta, require_complete, source, write_meta)

SHARD_SIZE = 10_000  # documents per shard: 15 MB of minilm's float32 vectors, and the unit of resuming
MODES = SEARCH_MODES
HELD_BYTES = 2 << 30  # an index whose shard files fit in 2 GiB keeps them in memory once read (Index.shard)
DEPTH = 100  # candidates each retriever gives a fused ranking (BEIR's hybrid baselines fuse top-100 lists too)


class DenseVectors:
    """How a dense index stores and scores its vectors: (n, D) float32 .npy shards, dot products (cosines where the
    vectors are normalised); the Embed pipeline encodes documents and queries alike."""

    kind, suffix = "dense", ".npy"

    @staticmethod
    def documents(embedder: Pipeline, texts: list[str]) -> np.ndarray:
        """(n, D) document vectors."""
        return embedder.embed(texts)

    @staticmethod
    def queries(embedder: Pipeline, texts: list[str], index: Any = None) -> np.ndarray:
        """(Q, D) query vectors, made as the documents' (index: unused; a sparse index's terms)."""
        return embedder.embed(texts)

    @staticmethod
    def save(path: Path, vectors: np.ndarray) -> None:
        with open(path, "wb") as handle:
            np.save(handle, np.ascontiguousarray(vectors, dtype=np.float32))

    @staticmethod
    def load(path: Path) -> np.ndarray:
        return np.load(path)

    @staticmethod
    def scores(queries: np.ndarray, shard: np.ndarray) -> torch.Tensor:
        """(Q, n) dot products of query vectors (Q, D) with a shard's (n, D)."""
        return torch.from_numpy(queries) @ torch.from_numpy(shard).T

    @staticmethod
    def meta(embedder: Pipeline) -> dict[str, Any]:
        """index.json's record of how the vectors were made (what encodes the queries the same way)."""
        if not isinstance(embedder, Embed):
            raise InputError(f"index needs an embed pipeline, not {embedder.task}")
        return {"pooling": embedder.pooling, "normalize": embedder.normalize, "dimensions": embedder.dimensions,
                "max_length": embedder.max_length, "stride": embedder.stride,
                "similarity": "cosine" if embedder.normalize else "dot",
                "dtype": "float32"}

    @staticmethod
    def encoder(meta: dict[str, Any], model: str | os.PathLike, **options: Any) -> Pipeline:
        """The pipeline that encodes queries as the index's documents were."""
        return pipeline("embed", model, **query_settings(meta) | options)


VECTOR_KINDS = {kind.kind: kind for kind in (DenseVectors, sparse.SparseVectors)}
"""index.json's "kind" -> how its shards are stored, encoded and scored (an index.json without one is dense)."""


def vector_kind(meta: dict[str, Any]) -> Any:
    """The vector kind of an index.json."""
    return VECTOR_KINDS[index_kind(meta)]


class Index:
    """An index folder: vectors in shards, their documents, index.json, and a BM25 index if built with one."""

    def __init__(self, folder: str | os.PathLike, embedder: Pipeline | None = None) -> None:
        """Open a finished index; embedder: the Embed pipeline for queries (None: loaded from index.json's model on
        the first dense search). InputError when the folder holds no finished index or embedder is another model."""
        self.folder = Path(folder)
        self.meta = read_meta(self.folder)
        require_complete(self.folder, self.meta)
        self._embedder = embedder
        self.kind = vector_kind(self.meta)
        self.shards = shard_names(self.folder, self.kind.suffix)
        self.ids = [i for name in self.shards for i in json.loads(self._path(name, ".ids.json").read_text("utf-8"))]
        self._docs: dict[str, list[Document]] = {}
        self._bm25 = None
        self._ann = None
        self._mapped: list[np.ndarray] = []
        self._hold: bool | None = None  # whether the shards stay in memory once read (None: not decided yet)
        self._held: dict[str, Any] = {}
        self._terms: np.ndarray | None = None  # a sparse index's (terms())

    # ---- building ---------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, model: str | os.PathLike, corpus: str | os.PathLike, folder: str | os.PathLike, *,
              embedder: Pipeline | None = None, dimensions: int | None = None, bm25: bool = False,
              shard_size: int = SHARD_SIZE, overwrite: bool = False, resume: bool = False, progress: bool = True,
              ann_kind: str | None = None, quantize: str | None = None, hnsw: dict[str, int] | None = None,
              ranks: Dist | None = None, **options: Any) -> Index | None:
        """Index a corpus file (encoderlab.retrieval.corpus's formats) into `folder` with `model`'s Embed pipeline
        (embedder: one already loaded; else pipeline("embed", model, dimensions=..., **options)). Refuses a folder
        holding anything unless overwrite, or resume (an unfinished build of the same model and corpus). ann_kind
        ("hnsw") and quantize ("int8", "binary"): also build that structure (encoderlab.retrieval.ann), hnsw: its
        m, ef_construction, ef_search where not the defaults. ranks: this process's place under torchrun (None:
        distributed.join(), alone without torchrun); the ranks other than 0 return None (opening the index reads
        every id: gigabytes at 100M documents, on every rank)."""
        folder = Path(folder)
        check_out_folder(folder, overwrite, resume, inputs=[corpus])
        if shard_size < 1:
            raise InputError(f"shard size {shard_size}: expected a positive number")
        count = scan(corpus)  # the whole corpus checked before anything is written
        previous = read_meta(folder) if resume and (folder / "index.json").is_file() else None
        ranks = ranks or join(options.get("device"))
        if ranks.world_size > 1:
            options["device"] = ranks.device
        embedder = embedder or pipeline("embed", model, dimensions=dimensions, **options)
        meta = new_meta(model, embedder, shard_size, bm25)
        kind = vector_kind(meta)
        if (ann_kind or quantize) and kind is not DenseVectors:
            raise InputError(f"--ann/--quantize: a {kind.kind} index is searched exactly (its inverted index); "
                             f"they are for dense vectors")
        if ann_kind or quantize:
            meta["ann"] = ann.settings(ann_kind, quantize, embedder.dimensions, **(hnsw or {}))
        meta["sources"] = [source(corpus, 0) | {"documents": count}]
        if previous is not None:
            meta = check_resumable(folder, previous, meta)

        def start() -> None:
            if previous is None and overwrite and folder.exists():
                shutil.rmtree(folder)  # only now, with the corpus and the model checked (by every rank)
            folder.mkdir(parents=True, exist_ok=True)
            write_meta(folder, meta)

        main_then_all(ranks, start)
        return cls._finish(folder, meta, embedder, progress, ranks)

    def add(self, corpus: str | os.PathLike, progress: bool = True, ranks: Dist | None = None) -> int:
        """Append a corpus file's documents as new shards (BM25 rebuilt if the index has one); InputError, before
        anything is written, for an id the index holds already. The number of documents added. ranks: as build's."""
        count = scan(corpus)
        known = set(self.ids)
        for document in read_documents(corpus):
            if document.id in known:
                raise InputError(f"{document.where}: id {document.id!r} is in the index already")
        self.meta["sources"].append(source(corpus, len(self.shards)) | {"documents": count})
        self.meta["complete"] = False
        ranks = ranks or join()
        main_then_all(ranks, lambda: write_meta(self.folder, self.meta))
        done = self._finish(self.folder, self.meta, self.embedder, progress, ranks)
        if done is not None:  # rank 0 (build's note on the others)
            self.__dict__.update(done.__dict__)
        return count

    def save(self, folder: str | os.PathLike, overwrite: bool = False) -> Index:
        """A copy of this index in another folder (an index lives on disk: build and add write as they go)."""
        folder = Path(folder)
        check_out_folder(folder, overwrite)
        staging = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(self.folder, staging)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        return Index(folder, self._embedder)

    @classmethod
    def load(cls, folder: str | os.PathLike, model: str | os.PathLike | None = None, **options: Any) -> Index:
        """Open an index; model: the query encoder, refused (naming both) unless it is the index's model."""
        meta = read_meta(folder)
        check_model(folder, meta, model)
        embedder = None if model is None else vector_kind(meta).encoder(meta, model, **options)
        return cls(folder, embedder)

    @classmethod
    def _finish(cls, folder: Path, meta: dict[str, Any], embedder: Pipeline, progress: bool,
                ranks: Dist) -> Index | None:
        """Encode every unfinished shard of every source that is this rank's; once every rank has, rank 0 builds
        BM25 if asked, marks the index complete and opens it (the other ranks: None)."""
        bar = progress_bar(total=own_documents(meta, ranks), unit="doc", desc="index",
                           disable=not progress or not ranks.is_main)
        kind = vector_kind(meta)
        for corpus in meta["sources"]:
            chunks = batched(read_documents(corpus["path"]), meta["shard_size"])
            for number, chunk in enumerate(chunks, corpus["first_shard"]):
                name = f"{number:05d}"
                if not owns(ranks, number):
                    continue
                if not (folder / SHARDS / f"{name}{kind.suffix}").is_file():
                    cls.write_chunk(folder, name, chunk, embedder, kind)
                bar.update(len(chunk))
        bar.close()
        wait(ranks, WAIT)  # every rank's shards are on disk
        if not ranks.is_main:
            return None
        names = shard_names(folder, kind.suffix)
        meta["count"] = sum(len(json.loads((folder / SHARDS / f"{n}.ids.json").read_text("utf-8"))) for n in names)
        if meta["bm25"]:
            lexical.build(([d.joined for d in shard_documents(folder, n)] for n in names), folder / BM25)
        cls.build_structures(folder, meta, names)
        meta["complete"] = True
        write_meta(folder, meta)
        return cls(folder, embedder)

    @classmethod
    def write_chunk(cls, folder: Path, name: str, chunk: list[Document], embedder: Any, kind: Any) -> None:
        """Encode one shard's documents and write the shard as `kind` stores it (a multi-vector index writes token
        vectors and their offsets)."""
        write_shard(folder, name, chunk, kind.documents(embedder, [d.joined for d in chunk]), kind)

    @classmethod
    def build_structures(cls, folder: Path, meta: dict[str, Any], names: list[str]) -> None:
        """Once every shard is written: the search structures index.json asks for, over every vector."""
        if meta.get("ann"):  # rebuilt from every vector: HNSW graphs are built whole (faiss adds, never merges)
            ann.build(np.concatenate([np.load(folder / SHARDS / f"{n}.npy") for n in names]), meta["ann"], folder)

    def build_ann(self, kind: str | None, quantize: str | None, **options: int) -> None:
        """(Re)build the approximate or quantised structure (encoderlab.retrieval.ann) over every vector, as
        ann.settings(kind, quantize, dimensions, **options) describes, and record it in index.json."""
        settings = ann.settings(kind, quantize, self.meta["dimensions"], **options)
        ann.build(self.vectors(), settings, self.folder)
        self.meta["ann"], self._ann = settings, None
        write_meta(self.folder, self.meta)

    # ---- searching --------------------------------------------------------------------------------------------
    @property
    def embedder(self) -> Pipeline:
        """The query encoder: the index's model, with its pooling, normalisation and dimensions."""
        if self._embedder is None:
            self._embedder = self.kind.encoder(self.meta, own_model(self.folder, self.meta))
        return self._embedder

    def vectors(self) -> np.ndarray:
        """Every document vector, (N, D), in index order (for tests and exports; search reads shard by shard); a
        sparse index's as one scipy.sparse matrix."""
        if self.kind is not DenseVectors:
            return self.kind.stack([self.kind.load(self._path(name, self.kind.suffix)) for name in self.shards])
        return np.concatenate([np.load(self._path(name, ".npy")) for name in self.shards])

    def dense(self, queries: Sequence[str], k: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's best k documents by the dot product of the vectors (the cosine where they are normalised):
        scores (Q, k) and positions (Q, k), best first (nearest)."""
        return self.nearest(self.kind.queries(self.embedder, list(queries), self), k, exact)

    def terms(self) -> np.ndarray:
        """A sparse index's vocabulary ids that some document weighs, sorted, read once (the only terms a query can
        score with; an --add opens the index again)."""
        if self._terms is None:
            used = np.zeros(self.meta["dimensions"], dtype=bool)
            for name in self.shards:
                used |= self.kind.terms(self.shard(name))
            self._terms = np.flatnonzero(used)
        return self._terms

    def nearest(self, vectors: np.ndarray, k: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Query vectors' (Q, D) best k: by the ann structure where index.json records one (and not exact), else
        exactly, shard by shard with a running top-k. Scores (Q, k) and positions (Q, k), best first."""
        if self.meta.get("ann") and not exact:
            if self._ann is None:
                self._ann = ann.load(self.folder, self.meta["ann"])
            scores, positions = ann.search(self._ann, self.meta["ann"], vectors, k, self.rows)
            return torch.from_numpy(scores), torch.from_numpy(positions.astype(np.int64))
        best = torch.empty(vectors.shape[0], 0)
        where = torch.empty(vectors.shape[0], 0, dtype=torch.long)
        offset = 0
        for name in self.shards:
            shard = self.shard(name)  # (n, D)
            scores = self.kind.scores(vectors, shard)  # (Q, n)
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            merged = torch.cat([best, top.values], dim=1).topk(min(k, best.shape[1] + top.values.shape[1]), dim=1)
            where = torch.cat([where, top.indices + offset], dim=1).gather(1, merged.indices)
            best, offset = merged.values, offset + shard.shape[0]
        return best, where

    def shard(self, name: str) -> Any:
        """A shard's vectors (n, D), read once and kept while every shard's file fits in HELD_BYTES together, so a
        server's searches read no file (the inference-free SPLADE's whole search in bench/late_sparse.py went from
        70 ms to 1 ms at p50); a larger index is read a shard at a time on each search, so it never needs to fit in
        memory."""
        if self._hold is None:
            self._hold = sum(self._path(n, self.kind.suffix).stat().st_size for n in self.shards) <= HELD_BYTES
        if not self._hold:
            return self.kind.load(self._path(name, self.kind.suffix))
        if name not in self._held:
            self._held[name] = self.kind.load(self._path(name, self.kind.suffix))
        return self._held[name]

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The float32 vectors (n, D) at index positions (n,), read from the memory-mapped shards."""
        return self.gather(positions, lambda a: torch.from_numpy(np.asarray(a)).float().numpy())  # 3x numpy's cast

    def gather(self, positions: np.ndarray, convert: Any) -> np.ndarray:
        """The shards' rows at index positions (n,), each shard's through convert (rows -> an array), in order."""
        if not self._mapped:
            self._mapped = [np.load(self._path(name, ".npy"), mmap_mode="r") for name in self.shards]
            self._offsets = np.cumsum([0] + [len(m) for m in self._mapped])
        if len(self._mapped) == 1 or not len(positions):
            return convert(self._mapped[0][positions])
        shard = np.searchsorted(self._offsets, positions, side="right") - 1
        parts = {n: convert(self._mapped[n][positions[shard == n] - self._offsets[n]]) for n in np.unique(shard)}
        first = next(iter(parts.values()))
        out = np.empty((len(positions), first.shape[1]), dtype=first.dtype)
        for number, part in parts.items():
            out[shard == number] = part
        return out

    def bm25(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """BM25's best k documents per query: scores (Q, k) and positions (Q, k)."""
        if not self.meta.get("bm25"):
            raise InputError(f"--index {self.folder} has no BM25 index: build it with `encoderlab index --bm25`")
        if self._bm25 is None:
            self._bm25 = lexical.load(self.folder / BM25)
        return lexical.search(self._bm25, queries, k)

    def rank(self, queries: Sequence[str], k: int, mode: str = SEARCH.mode, fusion_name: str = SEARCH.fusion,
             alpha: float = SEARCH.alpha, depth: int = DEPTH, rrf_k: int = SEARCH.rrf_k,
             normalisation: str = SEARCH.normalisation, exact: bool = SEARCH.exact) -> list[list[tuple[str, float]]]:
        """Each query's best k (doc id, score), best first, by mode: dense, bm25, or hybrid (the two rankings' best
        max(depth, k) fused by reciprocal rank (rrf_k) or a weighted sum of normalised scores; alpha weighs dense);
        exact: dense search ignores the ann structure."""
        if mode not in MODES:
            raise InputError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode != "hybrid":
            scores, positions = self.dense(queries, k, exact) if mode == "dense" else self.bm25(queries, k)
            return [[(self.ids[int(p)], float(s)) for s, p in zip(row_s, row_p) if p >= 0]  # -1: nothing found
                    for row_s, row_p in zip(scores.tolist(), positions.tolist())]
        dense = self.rank(queries, max(depth, k), "dense", exact=exact)
        lexical_ = self.rank(queries, max(depth, k), "bm25")
        if fusion_name not in FUSIONS:
            raise InputError(f"fusion {fusion_name!r}: expected one of {', '.join(FUSIONS)}")
        return [fusion.fuse(a, b, fusion_name, alpha, rrf_k, normalisation)[:k] for a, b in zip(dense, lexical_)]

    def search(self, queries: str | Sequence[str], top_k: int = 10, mode: str = SEARCH.mode,
               fusion: str = SEARCH.fusion, alpha: float = SEARCH.alpha, rerank: Pipeline | str | None = None,
               rerank_top: int = SEARCH.rerank_top, depth: int = DEPTH, rrf_k: int = SEARCH.rrf_k,
               normalisation: str = SEARCH.normalisation, exact: bool = SEARCH.exact) -> list[list[dict[str, Any]]]:
        """Each query's best top_k hits, {"id", "score", "title", "text"}, best first; rerank: a cross-encoder (a
        Rerank pipeline or its model) reorders the first stage's best rerank_top; exact: ignore the ann
        structure (the float32 vectors searched whole)."""
        queries = [queries] if isinstance(queries, str) else list(queries)
        if top_k < 1 or rerank_top < 1:
            raise InputError(f"top_k {top_k}, rerank_top {rerank_top}: expected positive numbers")
        first = self.rank(queries, max(top_k, rerank_top) if rerank else top_k, mode, fusion, alpha, depth, rrf_k,
                          normalisation, exact)
        if rerank is not None:
            reranker = pipeline("rerank", rerank) if isinstance(rerank, (str, os.PathLike)) else rerank
            first = self.rerank(reranker, queries, first, rerank_top)
        return [[self.hit(ident, score) for ident, score in hits[:top_k]] for hits in first]

    def rerank(self, reranker: Pipeline, queries: Sequence[str], ranked: list[list[tuple[str, float]]],
               top: int) -> list[list[tuple[str, float]]]:
        """The best `top` of each ranking reordered by the cross-encoder's score; the hits below keep their order,
        scored below every reranked one (a run's scores must fall with its ranks)."""
        items = [{"query": q, "passages": [self.document(i).joined for i, _ in hits[:top]]}
                 for q, hits in zip(queries, ranked)]
        out = []
        for hits, result in zip(ranked, reranker(items)):
            head = [(hits[row["index"]][0], row["score"]) for row in result["ranking"]]
            floor = min((s for _, s in head), default=0.0) - 1.0
            out.append(head + [(i, floor - n / len(hits)) for n, (i, _) in enumerate(hits[top:])])
        return out

    def hit(self, ident: str, score: float) -> dict[str, Any]:
        """One hit as search returns it."""
        document = self.document(ident)
        return {"id": ident, "score": round(score, 6), "title": document.title, "text": document.text}

    def document(self, ident: str) -> Document:
        """The stored document of an id (its shard's documents read once)."""
        if not hasattr(self, "_where"):
            self._where = {i: p for p, i in enumerate(self.ids)}
            self._starts = list(itertools.accumulate(
                [0] + [len(json.loads(self._path(n, ".ids.json").read_text("utf-8"))) for n in self.shards]))
        position = self._where[ident]
        shard = next(s for s in range(len(self.shards)) if self._starts[s + 1] > position)
        name = self.shards[shard]
        if name not in self._docs:
            self._docs[name] = shard_documents(self.folder, name)
        return self._docs[name][position - self._starts[shard]]

    def _path(self, name: str, suffix: str) -> Path:
        return self.folder / SHARDS / f"{name}{suffix}"

    def __len__(self) -> int:
        return len(self.ids)


# ---- helpers --------------------------------------------------------------------------------------------------
def new_meta(model: str | os.PathLike, embedder: Pipeline, shard_size: int, bm25: bool) -> dict[str, Any]:
    """index.json of a new index, before its shards: of the kind of `embedder` (Embed: dense; Splade: sparse)."""
    kind = next((k for k in VECTOR_KINDS.values() if k is not DenseVectors and k.made_by(embedder)), DenseVectors)
    return {"format": FORMAT, "complete": False, "kind": kind.kind,
            "model": model_record(model),
            **kind.meta(embedder), "shard_size": shard_size, "bm25": bm25, "ann": None, "count": 0,
            "text": "title + ' ' + text (BEIR's dense models)"}


def check_resumable(folder: Path, previous: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """`previous`, the index.json of an unfinished build (or add) with the same model and settings whose last corpus
    is the same file, unchanged; InputError otherwise."""
    if previous.get("complete"):
        raise InputError(f"--out {folder} holds a finished index: nothing to resume (--overwrite builds it again, "
                         f"--add appends documents)")
    keys = ("model", "pooling", "normalize", "dimensions", "max_length", "stride", "shard_size", "bm25", "ann",
            "token_pooling", "dtype", "residual_bits")  # the last three: a multivector index's
    differ = [key for key in keys if previous.get(key) != meta.get(key)]
    last, given = previous["sources"][-1], meta["sources"][0]
    differ += ["corpus"] if any(last[key] != given[key] for key in ("path", "bytes", "mtime")) else []
    if differ:
        raise InputError(f"--resume: --out {folder} was being built with other settings ({', '.join(differ)} "
                         f"differ): run the command it was started with, or --overwrite")
    return previous


def write_shard(folder: Path, name: str, documents: list[Document], vectors: Any, kind: Any = DenseVectors) -> None:
    """A shard's documents and ids, then its vectors (its mark of completion; stored as `kind` stores them), each
    written atomically."""
    lines = [json.dumps({"_id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) for d in documents]
    atomic_write_text(folder / SHARDS / f"{name}.docs.jsonl", "\n".join(lines) + "\n")
    atomic_write_text(folder / SHARDS / f"{name}.ids.json", json.dumps([d.id for d in documents]))

    atomic_write(folder / SHARDS / f"{name}{kind.suffix}", lambda tmp: kind.save(tmp, vectors))


def shard_names(folder: Path, suffix: str = ".npy") -> list[str]:
    """The finished shards (their vector files, of `suffix`), in order."""
    return sorted(p.name.removesuffix(suffix) for p in (folder / SHARDS).glob(f"*{suffix}")) \
        if (folder / SHARDS).is_dir() else []


def shard_documents(folder: Path, name: str) -> list[Document]:
    """A shard's stored documents."""
    lines = (folder / SHARDS / f"{name}.docs.jsonl").read_text(encoding="utf-8").splitlines()
    return [Document(row["_id"], row["title"], row["text"]) for row in map(json.loads, lines)]


def batched(items: Iterator[Document], size: int) -> Iterator[list[Document]]:
    """Consecutive lists of `size` items (the last shorter)."""
    while chunk := list(itertools.islice(items, size)):
        yield chunk


__all__ = ["Index", "MODES", "FUSIONS", "SHARD_SIZE", "OWN"]
