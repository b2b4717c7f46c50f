"""`encoderlab serve --index DIR` over a sparse (SPLADE) and a multi-vector (ColBERT) index: POST /search answers what
the index's own search gives (ids, scores, texts) for queries sent one by one and at once (so they share the index's
query batcher), with the served splade or colbert pipeline as the query encoder; /health names the kind; the command
refuses --tasks without that pipeline before torch loads."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_colbert import CORPUS as COLBERT_CORPUS, write_tiny_colbert, write_tiny_encoder_with_markers
from test_splade import write_tiny_splade
from test_tasks_finetune import CITIES, FILLER, NAMES

from encoderlab.cli import main
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app
from encoderlab.retrieval.index import Index
from encoderlab.retrieval.multivector import MultiVectorIndex
from encoderlab.retrieval.serving import IndexRoutes

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
QUERIES = ["where does anna live ?", "who lives in oslo ?", "maria lima", "john", "rome paris"]


def write_corpus(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny SPLADE folder and its index over 40 who-lives-where documents (3 shards)."""
    root = tmp_path_factory.mktemp("sparse")
    model = write_tiny_splade(root / "model")
    texts = [f"{NAMES[i % 4]} lives in {CITIES[(i // 4) % 4]} {FILLER[i % 12]}" for i in range(40)]
    corpus = write_corpus(root / "corpus.jsonl", texts)
    assert main(["index", "--model", str(model), "--corpus", str(corpus), "--out", str(root / "index"),
                 "--shard-size", "16", "--no-progress", "--json"]) == 0
    return model, root / "index"


@pytest.fixture(scope="module")
def multivector(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny ColBERT folder (16-wide projection) and its index over 32 documents (4 shards)."""
    root = tmp_path_factory.mktemp("multivector")
    model = write_tiny_colbert(write_tiny_encoder_with_markers(root / "tiny"), root / "colbert")
    corpus = write_corpus(root / "corpus.jsonl", COLBERT_CORPUS)
    assert main(["index", "--model", str(model), "--corpus", str(corpus), "--out", str(root / "index"),
                 "--shard-size", "10", "--no-progress", "--json"]) == 0
    return model, root / "index"


def served_hits(client: TestClient, body: dict) -> list[list[dict]]:
    response = client.post("/search", json=body)
    assert response.status_code == 200, response.text
    return [result["hits"] for result in response.json()["results"]]


def assert_same(got: list[dict], expected: list[dict]) -> None:
    assert [h["id"] for h in got] == [h["id"] for h in expected]
    assert [h["score"] for h in got] == pytest.approx([h["score"] for h in expected], abs=1e-4)
    assert [h["text"] for h in got] == [h["text"] for h in expected]


@pytest.mark.parametrize("kind", ["sparse", "multivector"])
@pytest.mark.slow
def test_search_answers_what_the_index_gives(kind, sparse, multivector, capsys):
    model, folder = {"sparse": sparse, "multivector": multivector}[kind]
    task = {"sparse": "splade", "multivector": "colbert"}[kind]
    opened = (MultiVectorIndex if kind == "multivector" else Index)(folder)
    expected = opened.search(QUERIES, top_k=5)  # the index's own query encoder, loaded by itself
    pipes = {task: pipeline(task, model, max_length=opened.meta["max_length"])}
    with TestClient(create_app(pipes, Limits(), model=task, index=IndexRoutes(folder, pipes))) as client:
        for query, want in zip(QUERIES, expected):  # one query a request
            assert_same(served_hits(client, {"query": query, "top_k": 5})[0], want)
        for got, want in zip(served_hits(client, {"query": QUERIES, "top_k": 5}), expected):  # all in one request
            assert_same(got, want)
        with ThreadPoolExecutor(len(QUERIES)) as pool:  # at once: they share the index's query batcher
            answers = list(pool.map(lambda q: served_hits(client, {"query": q, "top_k": 5})[0], QUERIES))
        for got, want in zip(answers, expected):
            assert_same(got, want)
        health = client.get("/health").json()
        bm25 = client.post("/search", json={"query": "anna", "mode": "bm25"})
    assert health["index"]["kind"] == kind and health["index"]["documents"] == len(opened)
    assert bm25.status_code == 422 and "no BM25 index" in bm25.text
    # the command: a --tasks list without the index's query encoder is refused before torch or a port
    capsys.readouterr()
    assert main(["serve", "--index", str(folder), "--tasks", "embed"]) == 2
    err = capsys.readouterr().err
    assert f"({kind}) needs {task}" in err and err.count("\n") == 1


def test_a_served_pipeline_of_another_window_is_refused(sparse):
    model, folder = sparse
    pipes = {"splade": pipeline("splade", model, max_length=16)}
    with pytest.raises(Exception, match="reads 16 tokens"):
        IndexRoutes(folder, pipes)
