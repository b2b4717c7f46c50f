"""POST /search for `encoderlab serve --index DIR`: an index (encoderlab.retrieval.Index) searched behind the server's
limits, batching and errors. The server (encoderlab.infer, a layer below) knows no index: IndexRoutes is what its
create_app(index=...) takes, adding the route and saying what /health and /info show of it.

    encoderlab serve --index out/example-index --rerank out/reranker
    curl -s localhost:8000/search -H 'content-type: application/json' -d '{"query": "who discovered penicillin?"}'

The index is searched through its public API on a thread pool of its own, off the event loop; its query encoder is a
QueryEncoder, which hands the queries to the server's embed batcher (with /embed's own key) and waits: concurrent
/search, /embed and /v1/embeddings requests share forward passes, and a query gets the vector /embed gives it. The
reranker (--rerank) likewise goes through the /rerank batcher. The embed pipeline is loaded with the index's pooling,
normalisation, dimensions and window (query_settings), so the queries are encoded as the documents were.

A sparse (SPLADE) or multi-vector (ColBERT) index encodes its queries with the served splade or colbert pipeline
(PIPELINE_OF_KIND), through a batcher of the index's own on the same model thread: concurrent searches share a
forward pass, and no second copy of the model is loaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import scipy.sparse
import torch
from fastapi import FastAPI
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from encoderlab.cards import SearchOptions, bounds, flags
from encoderlab.errors import InputError
from encoderlab.infer.batching import Batcher, submit
from encoderlab.infer.compat import answered, embed_vectors, ours
from encoderlab.infer.limits import Limits
from encoderlab.retrieval.index import MODES, Index
from encoderlab.retrieval.meta import MULTIVECTOR, PIPELINE_OF_KIND, index_kind, query_settings, read_meta
from encoderlab.retrieval.multivector import MultiVectorIndex
from encoderlab.tasks.colbert import padded

MAX_TOP_K = 1000  # hits (and reranked candidates) one query may ask for: BEIR retrieves max(k_values) = 1,000
SERVER_BOUNDS = {"rerank_top": {"le": MAX_TOP_K}}  # beside SearchOptions' own (encoderlab.cards)
# by default (beir.retrieval.evaluation.EvaluateRetrieval), the deepest a benchmark looks
SEARCH_THREADS = 4  # searches at once: a thread waiting on the embed batcher costs nothing, and waiting together
# is what lets concurrent queries share a forward pass
RERANK_KEY: Hashable = ((("top_k", None),), ("dict",))  # what our /rerank's request_items gives a plain request
QUERIES_KEY: Hashable = ((), ("str",))  # the index's own query batcher: one kind of call


class QueryEncoder:
    """An Index's query encoder that runs on the server's embed batcher: embed() is called on a search thread,
    submits to the batcher on the event loop and waits for the vectors."""

    def __init__(self, batchers: dict[str, Batcher]) -> None:
        self.batchers = batchers
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, set when it starts (bind)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Submit to the batchers of this (running) event loop."""
        self.loop = loop

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(Q, D) float32 query vectors, computed in a batch with whatever else the embed batcher holds."""
        work = asyncio.run_coroutine_threadsafe(embed_vectors(self.batchers["embed"], list(texts)), self.loop)
        return np.asarray(work.result(), dtype=np.float32)

    def rerank(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rerank pipeline's results for items [{"query", "passages"}], through the /rerank batcher."""
        return asyncio.run_coroutine_threadsafe(submit(self.batchers["rerank"], "rerank", items, RERANK_KEY),
                                                self.loop).result()

    def rows(self, texts: Sequence[str]) -> list[Any]:
        """Each query's encoding by a sparse or multi-vector index's pipeline, through the index's query batcher."""
        return asyncio.run_coroutine_threadsafe(submit(self.batchers["queries"], "search", list(texts), QUERIES_KEY),
                                                self.loop).result()

    def vectors(self, texts: Sequence[str], query: bool = True, vocabulary: Any = None) -> Any:
        """A sparse index's (Q, V) query weights (what Splade.vectors(texts, query=True) gives); vocabulary: the
        index's terms, which the query batcher already restricts the weights to (query_rows)."""
        return scipy.sparse.vstack(self.rows(texts), format="csr")

    def queries(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """A multi-vector index's (Q, QUERY_LENGTH, dim) query token vectors and their mask (as its Encoder's)."""
        return padded(self.rows(texts))


def query_rows(kind: str, pipe: Any, terms: Any = None) -> Any:
    """(queries) -> one encoding per query, by the served pipeline of a sparse or multi-vector index: the function
    the index's query batcher runs on the model thread; terms: a sparse index's (Index.terms()), the only ones
    weighed."""
    if kind == MULTIVECTOR:
        return lambda texts: pipe.tokens(texts, query=True)

    def sparse_rows(texts: list[str]) -> list[Any]:
        weights = pipe.vectors(texts, query=True, vocabulary=terms)
        return [weights[i] for i in range(weights.shape[0])]
    return sparse_rows


# ---- request and response ---------------------------------------------------------------------------------------
def search_request(text: Any, limits: Limits) -> type[BaseModel]:
    """POST /search's body, the limits in its schema (and /docs)."""
    # one query read as a list of one: one schema, so a bad query gets one reason (a union gives one per branch)
    queries = Annotated[list[text], BeforeValidator(lambda v: [v] if isinstance(v, str) else v,
                                                    json_schema_input_type=str | list[str]),
                        Field(min_length=1, max_length=limits.max_batch)]
    return create_model(
        "SearchRequest", __config__=ConfigDict(extra="forbid"),
        query=(queries, Field(description=f"a query, or a list of 1 to {limits.max_batch}")),
        top_k=(int, Field(10, ge=1, le=MAX_TOP_K, description="hits per query")),
        **{f.name: (f.kind, Field(f.default, description=f.help, **bounds(f) | SERVER_BOUNDS.get(f.name, {})))
           for f in flags(SearchOptions)},
        rerank=(bool, Field(False, description="reorder the best hits by the server's cross-encoder (--rerank)")))


class Hit(BaseModel):
    id: str
    score: float
    title: str
    text: str


class QueryHits(BaseModel):
    query: str
    hits: list[Hit] = Field(description="best first")


class SearchResponse(BaseModel):
    results: list[QueryHits] = Field(description="one per query, in order")
    model: str = Field(description="the query encoder: the index's model")
    index: str = Field(description="the index folder")


# ---- the routes -------------------------------------------------------------------------------------------------
class IndexRoutes:
    """POST /search over the index at `folder`, its queries encoded by the served embed pipeline (which must encode as
    the index was built) and reranked by the served rerank pipeline where there is one (serve --rerank)."""

    def __init__(self, folder: str | Path, pipelines: dict[str, Any]) -> None:
        self.encoder = QueryEncoder({})  # the server's batchers come with start
        self.index = open_index(folder, self.encoder)
        self.kind = index_kind(self.index.meta)
        self.can_rerank = "rerank" in pipelines
        self.reranker = getattr(pipelines.get("rerank"), "model_name", None)
        self.query_pipe = pipelines.get(PIPELINE_OF_KIND[self.kind])
        check_encoder(folder, self.index.meta, self.query_pipe)
        self.server_batchers: dict[str, Batcher] = {}  # add_routes: the server's
        self.limits: Limits | None = None
        self.worker: asyncio.Task | None = None  # a sparse or multi-vector index's query batcher, while serving
        if len(self.index):
            self.index.document(self.index.ids[0])  # fills its id -> shard maps once: no search thread races to
        if self.index.meta["bm25"]:
            self.index.bm25(["warm"], 1)  # ... nor to load the BM25 index
        self.executor: ThreadPoolExecutor | None = None  # one per run of the server (start, stop)

    def add_routes(self, app: FastAPI, batchers: dict[str, Batcher], text: Any, limits: Limits) -> None:
        """POST /search on `app`, submitting to its batchers (filled when it starts)."""
        self.server_batchers, self.limits = batchers, limits  # the server fills its batchers when it starts

        async def search(body: BaseModel) -> dict[str, Any]:
            queries = body.query  # a list: search_request reads one query as a list of one
            self.check(body)
            reranker = self.encoder.rerank if body.rerank else None
            found = await answered(asyncio.get_running_loop().run_in_executor(self.executor, lambda: self.index.search(
                queries, body.top_k, body.mode, body.fusion, body.alpha, reranker, body.rerank_top,
                rrf_k=body.rrf_k, normalisation=body.normalisation, exact=body.exact)), ours)
            return {"results": [{"query": q, "hits": hits} for q, hits in zip(queries, found)],
                    "model": self.index.meta["model"]["name"], "index": str(self.index.folder)}

        search.__annotations__["body"] = search_request(text, limits)
        app.post("/search", response_model=SearchResponse, summary="search the served index: dense, BM25 or hybrid, "
                 "optionally reranked", responses={422: {"description": "invalid request"}})(search)

    def check(self, body: BaseModel) -> None:
        """InputError for what this index or server cannot do: BM25 without a BM25 index, rerank without a reranker."""
        if body.mode != "dense" and not self.index.meta["bm25"]:
            raise InputError(f"mode {body.mode}: the index {self.index.folder} has no BM25 index (build it with "
                             f"`encoderlab index --bm25`); mode dense searches it")
        if body.rerank and not self.can_rerank:
            raise InputError("rerank: this server has no reranker (start it with `encoderlab serve --index DIR "
                             "--rerank MODEL`)")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The server's event loop is running: searches run on a pool of their own and submit to that loop."""
        self.encoder.bind(loop)
        self.encoder.batchers = dict(self.server_batchers)  # and, below, the index's own query batcher
        if self.kind != "dense":  # on the server's model thread, beside the pipelines' own batchers
            model_thread = self.server_batchers[PIPELINE_OF_KIND[self.kind]].executor
            self.encoder.batchers["queries"] = batcher = Batcher(
                query_rows(self.kind, self.query_pipe, self.index.terms() if self.kind == "sparse" else None),
                model_thread, self.limits.max_batch,
                self.limits.batch_wait_ms / 1e3)
            self.worker = loop.create_task(batcher.work(), name="batch-search-queries")
        self.executor = ThreadPoolExecutor(max_workers=SEARCH_THREADS, thread_name_prefix="search")

    def stop(self) -> None:
        """The server is stopping (uvicorn has answered the requests in flight): no more searches."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.worker:
            self.worker.cancel()

    def info(self) -> dict[str, Any]:
        """What /health and /info say of the index."""
        meta = self.index.meta
        return {"path": str(self.index.folder), "kind": self.kind, "documents": len(self.index),
                "dimensions": meta["dimensions"], "similarity": meta["similarity"], "bm25": bool(meta["bm25"]),
                "model": meta["model"]["name"], "modes": [m for m in MODES if m == "dense" or meta["bm25"]],
                "reranker": self.reranker}


def open_index(folder: str | Path, encoder: QueryEncoder) -> Index:
    """The index at `folder` (a MultiVectorIndex for a multi-vector one), its queries encoded by `encoder`."""
    if index_kind(read_meta(folder)) == MULTIVECTOR:
        return MultiVectorIndex(folder, encoder)
    return Index(folder, encoder)


def check_encoder(folder: str | Path, meta: dict[str, Any], pipe: Any) -> None:
    """InputError unless the served pipeline of the index's kind (embed, splade or colbert) encodes queries as the
    index's documents were encoded."""
    task = PIPELINE_OF_KIND[index_kind(meta)]
    if pipe is None:
        raise InputError(f"--index {folder}: serving this index needs the {task} endpoint (its query encoder)")
    if task != "embed":
        if pipe.max_length != meta["max_length"]:
            raise InputError(f"--index {folder}: the served {task} pipeline reads {pipe.max_length} tokens (the "
                             f"index's: {meta['max_length']})")
        return
    served = {"pooling": pipe.pooling, "normalize": pipe.normalize, "dimensions": pipe.dimensions,
              "max_length": pipe.max_length}
    differ = [f"{k} {served[k]} (the index's: {v})" for k, v in query_settings(meta).items() if served[k] != v]
    if differ:
        raise InputError(f"--index {folder}: the served embed pipeline encodes otherwise: {', '.join(differ)}")
