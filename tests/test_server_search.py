"""`encoderlab serve --index DIR`: POST /search answers what encoderlab.Index.search gives for the same query (ids and
scores), in every mode and reranked; bad requests get one brief reason; /health, /info, /metrics and /docs know the
route; queries share the embed batcher's forward passes with /embed; the command refuses a wrong model before torch
loads. The index: examples/corpus.jsonl (20 documents) by a tiny random embedder, built once for the module."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from test_retrieval import tiny_folder
from test_server import running, wait_for_health

from encoderlab.cli import main
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app
from encoderlab.nn.model import SequenceClassifier
from encoderlab.retrieval.index import Index
from encoderlab.retrieval.serving import MAX_TOP_K, IndexRoutes, query_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "examples" / "corpus.jsonl"
QUERIES = ["who described gravity as curved spacetime?", "how do plants make sugar from light?"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def built(tiny, tmp_path_factory) -> Index:
    """The example corpus in 3 shards (of 8), with BM25."""
    return Index.build(tiny, CORPUS, tmp_path_factory.mktemp("index") / "idx", bm25=True, shard_size=8,
                       progress=False)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """A random tiny one-logit cross-encoder."""
    return pipeline("rerank", tiny_folder(tmp_path_factory.mktemp("ce"), SequenceClassifier, num_labels=1,
                                          multilabel=True))


@pytest.fixture(scope="module")
def pipelines(tiny, built, reranker) -> dict:
    """What `serve --index --rerank` loads: embed as the index was built, and the reranker."""
    return {"embed": pipeline("embed", tiny, **query_settings(built.meta)), "rerank": reranker}


@pytest.fixture(scope="module")
def client(built, pipelines):
    app = create_app(pipelines, Limits(), model="tiny", index=IndexRoutes(built.folder, pipelines))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def plain(tiny, tmp_path_factory):
    """A server of an index without BM25 and without a reranker."""
    index = Index.build(tiny, CORPUS, tmp_path_factory.mktemp("plain") / "idx", progress=False)
    pipes = {"embed": pipeline("embed", tiny, **query_settings(index.meta))}
    with TestClient(create_app(pipes, Limits(), model="tiny", index=IndexRoutes(index.folder, pipes))) as client:
        yield client


def same_hits(got: list[dict], expected: list[dict]) -> None:
    """The same documents in the same order, with the same scores (a query's vector may come from another batch)."""
    assert [h["id"] for h in got] == [h["id"] for h in expected]
    assert [h["score"] for h in got] == pytest.approx([h["score"] for h in expected], abs=1e-5)
    assert [(h["title"], h["text"]) for h in got] == [(h["title"], h["text"]) for h in expected]


@pytest.mark.parametrize("options", [{"mode": "dense"}, {"mode": "bm25", "top_k": 3},
                                     {"mode": "hybrid", "top_k": 7}, {"mode": "hybrid", "fusion": "weighted",
                                                                      "alpha": 0.3, "normalisation": "min-max"},
                                     {"mode": "hybrid", "fusion": "rrf", "rrf_k": 5}, {"mode": "dense", "exact": True}])
def test_search_gives_what_index_search_gives(client, built, pipelines, options):
    answer = client.post("/search", json={"query": QUERIES} | options)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = Index(built.folder, pipelines["embed"]).search(QUERIES, **options)
    assert [r["query"] for r in body["results"]] == QUERIES
    for result, hits in zip(body["results"], expected):
        same_hits(result["hits"], hits)
    assert body["index"] == str(built.folder) and body["model"] == built.meta["model"]["name"]


def test_search_reranks_with_the_servers_cross_encoder(client, built, pipelines, reranker):
    answer = client.post("/search", json={"query": QUERIES[0], "top_k": 6, "rerank": True, "rerank_top": 4})
    assert answer.status_code == 200, answer.text
    expected = Index(built.folder, pipelines["embed"]).search(QUERIES[0], 6, rerank=reranker, rerank_top=4)[0]
    same_hits(answer.json()["results"][0]["hits"], expected)
    plain = client.post("/search", json={"query": QUERIES[0], "top_k": 6}).json()["results"][0]["hits"]
    assert [h["id"] for h in plain[4:]] == [h["id"] for h in expected[4:]]  # below rerank_top: the first order


@pytest.mark.parametrize("body, where", [
    ({"query": ""}, "query"), ({"query": "   "}, "query"), ({"query": []}, "query"), ({}, "query"),
    ({"query": "q", "top_k": 0}, "top_k"), ({"query": "q", "top_k": MAX_TOP_K + 1}, "top_k"),
    ({"query": "q", "mode": "sparse"}, "mode"), ({"query": "q", "fusion": "max"}, "fusion"),
    ({"query": "q", "alpha": 1.5}, "alpha"), ({"query": "q", "rerank_top": 0}, "rerank_top"),
    ({"query": "q", "k": 3}, "k"), ({"query": ["q"] * (Limits.max_batch + 1)}, "query"),
    ({"query": "x" * (Limits.max_text_chars + 1)}, "query")])
def test_bad_requests_get_one_reason_naming_the_field(client, body, where):
    answer = client.post("/search", json=body)
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert len(detail) == 1 and detail[0]["loc"][:2] == ["body", where], detail


def test_what_the_server_cannot_do_is_refused_in_one_line(plain):
    for body, reason in (({"query": "q", "mode": "bm25"}, "has no BM25 index"),
                         ({"query": "q", "mode": "hybrid"}, "has no BM25 index"),
                         ({"query": "q", "rerank": True}, "no reranker (start it with")):
        answer = plain.post("/search", json=body)
        assert answer.status_code == 422 and reason in answer.json()["detail"], answer.text
        assert "\n" not in answer.json()["detail"]
    assert plain.post("/search", json={"query": "q", "top_k": 50}).status_code == 200  # more than it holds: all 20
    assert len(plain.post("/search", json={"query": "q", "top_k": 50}).json()["results"][0]["hits"]) == 20


def test_health_info_metrics_and_docs_know_the_index(client, built):
    client.post("/search", json={"query": "q"})
    index = client.get("/health").json()["index"]
    assert index == {"path": str(built.folder), "kind": "dense", "documents": 20, "dimensions": 32,
                     "similarity": "cosine", "bm25": True, "model": built.meta["model"]["name"],
                     "modes": ["dense", "bm25", "hybrid"], "reranker": index["reranker"]} and index["reranker"]
    assert client.get("/info").json()["index"] == index
    assert 'encoderlab_requests_total{route="/search",status="200"}' in client.get("/metrics").text
    schema = client.get("/openapi.json").json()
    assert "/search" in schema["paths"]
    request = schema["components"]["schemas"]["SearchRequest"]["properties"]
    assert request["top_k"]["maximum"] == MAX_TOP_K and request["mode"]["enum"] == ["dense", "bm25", "hybrid"]


def test_a_server_without_an_index_has_no_search(pipelines):
    with TestClient(create_app({"embed": pipelines["embed"]}, Limits(), model="tiny")) as client:
        assert client.post("/search", json={"query": "q"}).status_code == 404
        assert client.get("/health").json()["index"] is None


def test_searches_and_embeds_share_forward_passes(built, pipelines):
    """Requests that arrive together go through the embed batcher in one call, whichever route they came by."""
    app = create_app(pipelines, Limits(batch_wait_ms=400), model="tiny", index=IndexRoutes(built.folder, pipelines))
    texts = [f"{q} {n}" for n in range(3) for q in QUERIES]
    with running(app) as url, ThreadPoolExecutor(len(texts)) as pool:
        calls = [pool.submit(httpx.post, f"{url}/search", json={"query": text}, timeout=30) for text in texts[:4]]
        calls += [pool.submit(httpx.post, f"{url}/embed", json={"texts": [text]}, timeout=30) for text in texts[4:]]
        answers = [call.result() for call in calls]
        stats = httpx.get(f"{url}/health").json()["stats"]["embed"]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert stats["requests"] == len(texts) and stats["batches"] < len(texts)
    expected = Index(built.folder, pipelines["embed"]).search(texts[:4])
    for answer, hits in zip(answers, expected):
        same_hits(answer.json()["results"][0]["hits"], hits)


# ---- the command: refused before torch loads ----------------------------------------------------------------------
def test_serve_refuses_another_model_for_the_index(built, capsys):
    assert main(["serve", "--index", str(built.folder), "--model", "minilm"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--model minilm is another model" in error and str(built.meta["model"]["name"]) in error
    assert len(error.splitlines()) == 1


@pytest.mark.parametrize("argv, reason", [
    (["serve"], "needs --model M, or --index DIR"),
    (["serve", "--model", "minilm", "--rerank", "minilm"], "it needs --index DIR"),
    (["serve", "--index", "no/such/index"], "no index.json there"),
    (["serve", "--index", "{index}", "--tasks", "classify"], "(dense) needs embed (its queries' encoder)")])
def test_serve_refuses_what_it_cannot_serve(built, capsys, argv, reason):
    assert main([a.replace("{index}", str(built.folder)) for a in argv]) == 2
    assert reason in capsys.readouterr().err


@pytest.mark.slow  # a server process: torch's import and two models' loading
def test_serve_index_serves_search_with_the_indexs_settings(tiny, reranker, tmp_path):
    """`encoderlab serve --index` loads the index's model with the index's pooling and dimensions (here not the
    model's own: CLS pooling, 16 of 32 dimensions), and --rerank's cross-encoder: its answers equal Index.search's."""
    index = Index.build(tiny, CORPUS, tmp_path / "idx", pooling="cls", dimensions=16, bm25=True, progress=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "encoderlab", "serve", "--index", str(index.folder), "--port", str(port),
               "--threads", "1", "--tasks", "embed", "--rerank", reranker.model_name]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"PYTHONPATH": str(ROOT / "src")})
    url = f"http://127.0.0.1:{port}"
    try:
        health = wait_for_health(url, process)
        answers = [httpx.post(f"{url}/search", json={"query": QUERIES} | options, timeout=60)
                   for options in ({"mode": "hybrid"}, {"rerank": True, "rerank_top": 5})]
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert health["index"]["dimensions"] == 16 and health["index"]["reranker"] == reranker.model_name
    assert set(health["tasks"]) == {"embed", "rerank"}
    local = Index(index.folder, pipeline("embed", tiny, **query_settings(index.meta)))
    for answer, options in zip(answers, ({"mode": "hybrid"}, {"rerank": reranker, "rerank_top": 5})):
        assert answer.status_code == 200, answer.text
        for result, hits in zip(answer.json()["results"], local.search(QUERIES, **options)):
            same_hits(result["hits"], hits)
