"""encoderlab.retrieval.ann and `index --ann/--quantize`, `search --exact`: HNSW at a high ef finds what exact search
finds, quantised search with rescoring finds the exact best hit for most queries, index.json records the settings,
--add rebuilds the structure, and bad input exits 2 with one line, writing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest

from encoderlab import Index
from encoderlab.retrieval import ann
from encoderlab.retrieval.corpus import read_documents
from encoderlab.retrieval.meta import ANN
from test_retrieval import hashes, run_cli, tiny_folder, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(autouse=True, scope="module")
def one_faiss_thread():
    """faiss's OpenMP threads, like torch's, wait on each other on a busy 2-core machine."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def unit_vectors() -> tuple[np.ndarray, np.ndarray]:
    """2,000 random unit vectors of 64 dimensions, and 100 queries that are noisy copies of some of them."""
    rng = np.random.default_rng(0)
    documents = rng.normal(size=(2000, 64)).astype(np.float32)
    documents /= np.linalg.norm(documents, axis=1, keepdims=True)
    queries = documents[rng.choice(2000, 100, replace=False)] + rng.normal(scale=0.1, size=(100, 64)).astype(np.float32)
    return documents, queries / np.linalg.norm(queries, axis=1, keepdims=True)


def exact_top(documents: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Brute-force best k positions by dot product, (Q, k)."""
    return np.argsort(-(queries @ documents.T), axis=1, kind="stable")[:, :k]


def search_built(documents: np.ndarray, queries: np.ndarray, folder: Path, kind: str | None,
                 quantize: str | None, **options: int) -> tuple[np.ndarray, np.ndarray]:
    """Build the structure for the settings in `folder`, load it and search the queries' best 10."""
    settings = ann.settings(kind, quantize, documents.shape[1], **options)
    ann.build(documents, settings, folder)
    return ann.search(ann.load(folder, settings), settings, queries, 10, lambda p: documents[p])


def test_hnsw_at_a_high_ef_finds_what_exact_search_finds(unit_vectors, tmp_path):
    documents, queries = unit_vectors
    scores, positions = search_built(documents, queries, tmp_path, "hnsw", None, ef_search=400)
    truth = exact_top(documents, queries, 10)
    assert np.mean([len(set(p) & set(t)) / 10 for p, t in zip(positions, truth)]) == 1.0
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ documents.T, truth, 1), atol=1e-5)


@pytest.mark.parametrize("kind", ["hnsw", None])
@pytest.mark.parametrize("quantize", ["int8", "binary"])
def test_quantised_search_rescored_finds_the_exact_best_hit_for_most_queries(unit_vectors, tmp_path, kind,
                                                                               quantize):
    documents, queries = unit_vectors
    scores, positions = search_built(documents, queries, tmp_path, kind, quantize, m=16, ef_construction=64)
    truth = exact_top(documents, queries, 1)[:, 0]
    assert np.mean(positions[:, 0] == truth) >= 0.9
    # rescored: each score is the float32 dot product, best first
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, documents[positions]), atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-7).all()


def test_hnsw_that_finds_fewer_than_asked_marks_the_rest_missing(tmp_path):
    """Near-duplicate vectors in a sparse graph (M 4, ef_construction 8): HNSW returns -1 for what it did not reach;
    those positions must come back scored -inf (never as the last document, which position -1 would index)."""
    rng = np.random.default_rng(0)
    documents = (np.ones((3000, 16)) + 1e-7 * rng.normal(size=(3000, 16))).astype(np.float32)
    settings = ann.settings("hnsw", None, 16, m=4, ef_construction=8)
    ann.build(documents, settings, tmp_path)
    scores, positions = ann.search(ann.load(tmp_path, settings), settings, -documents[:5], 500, lambda p: documents[p])
    assert (positions < 0).any()  # the case exists: faiss left some unfound
    assert np.isneginf(scores[positions < 0]).all() and np.isfinite(scores[positions >= 0]).all()


def test_binary_needs_dimensions_in_whole_bytes():
    with pytest.raises(Exception, match="not a multiple of 8"):
        ann.settings(None, "binary", 12)


# ---- the index and the command line -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", count=40)


def test_index_records_the_settings_and_search_equals_exact(tiny, corpus, tmp_path, capsys):
    folder = tmp_path / "idx"
    code, out, _ = run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", folder, "--ann", "hnsw",
                           "--quantize", "int8", "--hnsw-m", "8", "--shard-size", "15", "--no-progress")
    assert code == 0 and "HNSW (M 8, ef_search 128) over int8 vectors" in out
    meta = json.loads((folder / "index.json").read_text())
    assert meta["ann"] | {"library": None} == {"kind": "hnsw", "quantize": "int8", "m": 8, "ef_construction": 200,
                                               "ef_search": 128, "rescore": 4, "library": None}
    assert faiss.read_index(str(folder / ANN / ann.FILE)).ntotal == 40
    queries = ["river king castle", "ocean bird winter", "music war"]
    approximate = Index(folder).search(queries, top_k=5)
    exact = Index(folder).search(queries, top_k=5, exact=True)
    assert [[h["id"] for h in hits] for hits in approximate] == [[h["id"] for h in hits] for hits in exact]
    code, out, _ = run_cli(capsys, "search", "--index", folder, "--exact", "--json", *queries[:1])
    assert code == 0 and [h["id"] for h in json.loads(out)[0]["hits"][:5]] == [h["id"] for h in exact[0]]


def test_matryoshka_dimensions_reach_the_structure(tiny, corpus, tmp_path, capsys):
    folder = tmp_path / "idx"
    code, _, _ = run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", folder, "--dimensions", "16",
                         "--ann", "hnsw", "--quantize", "binary", "--no-progress")
    assert code == 0 and faiss.read_index_binary(str(folder / ANN / ann.FILE)).d == 16
    index = Index(folder)
    assert index.vectors().shape == (40, 16)
    queries = ["river king castle", "ocean bird winter"]
    assert [h[0]["id"] for h in index.search(queries)] == [h[0]["id"] for h in index.search(queries, exact=True)]


def test_add_rebuilds_and_a_finished_index_takes_a_structure_later(tiny, corpus, tmp_path, capsys):
    folder = tmp_path / "idx"
    assert run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", folder, "--no-progress")[0] == 0
    assert json.loads((folder / "index.json").read_text())["ann"] is None
    code, out, _ = run_cli(capsys, "index", "--model", tiny, "--out", folder, "--quantize", "binary")
    assert code == 0 and "exact search over binary vectors" in out
    assert faiss.read_index_binary(str(folder / ANN / ann.FILE)).ntotal == 40
    more = write_corpus(tmp_path / "more.jsonl", count=5, seed=1, prefix="new")
    code, _, _ = run_cli(capsys, "index", "--model", tiny, "--corpus", more, "--out", folder, "--add", "--no-progress")
    assert code == 0
    assert faiss.read_index_binary(str(folder / ANN / ann.FILE)).ntotal == 45
    first = next(read_documents(more))
    assert Index(folder).search(f"{first.title} {first.text}")[0][0]["id"] == "new0"


def test_bad_ann_input_exits_2_with_one_line_and_writes_nothing(tiny, corpus, tmp_path, capsys):
    folder = tmp_path / "idx"
    assert run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", folder, "--no-progress")[0] == 0
    before = hashes(folder)
    cases = [
        (("index", "--model", tiny, "--out", tmp_path / "empty", "--ann", "hnsw"), "empty: no index.json there"),
        (("index", "--model", tiny, "--out", folder), "--corpus FILE is required"),
        (("index", "--model", tiny, "--out", folder, "--ann", "hnsw", "--ef-search", "0"), "--ef-search 0"),
        (("index", "--model", tiny, "--corpus", corpus, "--out", tmp_path / "b", "--quantize", "binary",
          "--dimensions", "12"), "not a multiple of 8"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and message in err and err.count("\n") == 1, (argv, err)
    with pytest.raises(SystemExit) as exit_:
        run_cli(capsys, "index", "--model", tiny, "--out", folder, "--quantize", "int4")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'int4'" in err and err.count("\n") == 1
    assert hashes(folder) == before and not (tmp_path / "empty").exists() and not (tmp_path / "b").exists()
