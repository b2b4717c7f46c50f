"""encoderlab.retrieval and the index, search and evaluate retrieval commands: exact search equals brute force over the
Embed pipeline's vectors, a resumed build equals an unbroken one, BM25 equals bm25s run directly, fusion and metrics
equal hand computations and pytrec_eval, and bad input exits 2 with one line, writing nothing."""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
from pathlib import Path

import bm25s
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytrec_eval
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from encoderlab import EncoderConfig, EncoderModel, Index, SequenceClassifier, save_pretrained
from encoderlab.checkpoint import resolve_model_path
from encoderlab.cli import main
from encoderlab.errors import InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.retrieval import fusion
from encoderlab.retrieval.corpus import read_documents, read_qrels
from encoderlab.retrieval.metrics import evaluate, read_run
from encoderlab.retrieval.meta import fingerprint

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
WORDS = ("river mountain city music painting war king queen science physics energy ocean forest bird computer "
         "language harbour castle garden winter").split()
ROOT = Path(__file__).resolve().parents[1]


def tiny_folder(folder: Path, cls: type = EncoderModel, **options) -> Path:
    """A random 2-layer, 32-wide BERT with minilm's tokenizer and sentence-transformers files (mean pooling,
    Normalize): a sentence embedder that loads in a fraction of a second."""
    minilm = resolve_model_path("minilm")
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=30522, hidden_size=32, num_heads=2,
                                       intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    save_pretrained(cls(config, **options), folder)
    for item in minilm.iterdir():
        if item.name not in ("config.json", "model.safetensors", "README.md"):
            (shutil.copytree if item.is_dir() else shutil.copy)(item, folder / item.name)
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps(json.loads(pooling.read_text()) | {"word_embedding_dimension": 32}))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("tiny"))


def write_corpus(path: Path, count: int = 25, seed: int = 0, prefix: str = "d") -> Path:
    """A BEIR corpus.jsonl of random sentences over WORDS, titled."""
    rng = random.Random(seed)
    rows = [{"_id": f"{prefix}{i}", "title": f"Title {i % 5}", "text": " ".join(rng.choices(WORDS, k=rng.randint(4, 20)))}
            for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def built(tiny, corpus, tmp_path_factory) -> Index:
    """The corpus indexed in 3 shards of 10, with BM25."""
    return Index.build(tiny, corpus, tmp_path_factory.mktemp("index") / "idx", bm25=True, shard_size=10,
                       overwrite=True, progress=False)


def texts_of(corpus: Path) -> list[str]:
    """BEIR's `title + " " + text` of each document."""
    return [f"{d.title} {d.text}".strip() for d in read_documents(corpus)]


def hashes(folder: Path) -> dict[str, str]:
    """Every file under a folder (absent: nothing) with its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()} if folder.exists() else {}


# ---- dense ------------------------------------------------------------------------------------------------------
def test_dense_search_equals_brute_force_over_the_embed_pipelines_vectors(built, tiny, corpus):
    embed = pipeline("embed", tiny)
    documents = torch.from_numpy(embed.embed(texts_of(corpus)))
    torch.testing.assert_close(torch.from_numpy(built.vectors()), documents)
    queries = ["river king castle", "ocean bird winter"]
    scores = torch.from_numpy(embed.embed(queries)) @ documents.T
    top = scores.topk(5, dim=1)
    hits = built.search(queries, top_k=5)
    for q in range(2):
        assert [h["id"] for h in hits[q]] == [f"d{i}" for i in top.indices[q].tolist()]
        torch.testing.assert_close(torch.tensor([h["score"] for h in hits[q]]), top.values[q], atol=1e-6, rtol=0)
    assert hits[0][0]["title"].startswith("Title") and hits[0][0]["text"]


def test_the_title_joins_the_text_as_beirs_dense_models_do(corpus):
    first = json.loads(corpus.read_text().splitlines()[0])
    assert next(read_documents(corpus)).joined == first["title"] + " " + first["text"]


def test_a_resumed_build_gives_the_vectors_of_an_unbroken_one(built, tiny, corpus, tmp_path):
    folder = tmp_path / "idx"
    shutil.copytree(built.folder, folder)
    meta = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps(meta | {"complete": False}))  # killed during shard 2
    (folder / "shards" / "00002.npy").unlink()
    (folder / "shards" / "00002.ids.json").write_text("[]")  # a torn side file, rewritten on resume
    kept = (folder / "shards" / "00000.npy").stat().st_mtime_ns
    with pytest.raises(InputError, match="did not finish"):
        Index(folder)
    resumed = Index.build(tiny, corpus, folder, resume=True, shard_size=10, bm25=True, progress=False)
    assert np.array_equal(resumed.vectors(), built.vectors())
    assert resumed.ids == built.ids and len(resumed) == 25
    assert (folder / "shards" / "00000.npy").stat().st_mtime_ns == kept  # finished shards are not redone


def test_resume_refuses_another_corpus_or_setting(built, tiny, corpus, tmp_path):
    folder = tmp_path / "idx"
    shutil.copytree(built.folder, folder)
    meta = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps(meta | {"complete": False}))
    with pytest.raises(InputError, match="shard_size"):
        Index.build(tiny, corpus, folder, resume=True, shard_size=7, bm25=True, progress=False)
    other = write_corpus(tmp_path / "other.jsonl", seed=1)
    with pytest.raises(InputError, match="corpus"):
        Index.build(tiny, other, folder, resume=True, shard_size=10, bm25=True, progress=False)


# ---- BM25 and fusion --------------------------------------------------------------------------------------------
def test_bm25_scores_equal_bm25s_run_directly(built, corpus):
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts_of(corpus), stopwords="en", show_progress=False), show_progress=False)
    queries = ["river king", "the ocean and the birds", "castle garden winter war"]
    positions, scores = retriever.retrieve(bm25s.tokenize(queries, stopwords="en", show_progress=False), k=5,
                                           show_progress=False)
    hits = built.search(queries, top_k=5, mode="bm25")
    for q in range(len(queries)):
        np.testing.assert_allclose([h["score"] for h in hits[q]], scores[q], atol=1e-5)
        assert {h["id"] for h in hits[q] if h["score"] > 0} == {f"d{p}" for p, s in zip(positions[q], scores[q])
                                                                if s > 0}


def test_rrf_equals_a_hand_computation():
    fused = fusion.rrf([["a", "b", "c"], ["c", "a", "d"]])
    expected = {"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63}
    assert [i for i, _ in fused] == ["a", "c", "b", "d"]
    for ident, score in fused:
        assert score == pytest.approx(expected[ident])


def test_weighted_fusion_equals_a_hand_computation():
    fused = dict(fusion.weighted({"a": 3.0, "b": 1.0, "c": 2.0}, {"b": 10.0, "d": 0.0}, alpha=0.25))
    # min-max: dense a 1, b 0, c 0.5; bm25 b 1, d 0; missing counts 0
    assert fused == pytest.approx({"a": 0.25, "b": 0.75, "c": 0.125, "d": 0.0})


def test_z_score_fusion_equals_a_hand_computation():
    fused = dict(fusion.weighted({"a": 3.0, "b": 1.0, "c": 2.0}, {"b": 10.0, "d": 0.0}, alpha=0.25,
                                 normalisation="z-score"))
    # z-scores: dense mean 2, std sqrt(2/3): a +1.2247, b -1.2247, c 0; bm25 mean 5, std 5: b +1, d -1; a missing
    # document gets its ranking's lowest z-score
    s = math.sqrt(2 / 3)
    expected = {"a": 0.25 * 1 / s + 0.75 * -1, "b": 0.25 * -1 / s + 0.75, "c": 0.75 * -1, "d": 0.25 * -1 / s - 0.75}
    assert fused == pytest.approx(expected)
    with pytest.raises(ValueError, match="normalisation 'rank'"):
        fusion.weighted({"a": 1.0}, {"a": 1.0}, 0.5, "rank")


def test_hybrid_fuses_the_dense_and_bm25_rankings(built):
    query = "river king castle"
    dense = [h["id"] for h in built.search(query, top_k=25)[0]]
    lexical = [h["id"] for h in built.search(query, top_k=25, mode="bm25")[0]]
    hybrid = built.search(query, top_k=5, mode="hybrid", fusion="rrf")[0]
    assert [h["id"] for h in hybrid] == [i for i, _ in fusion.rrf([dense, lexical])[:5]]
    scored = [dict(built.rank([query], 25, mode)[0]) for mode in ("dense", "bm25")]
    default = built.search(query, top_k=5, mode="hybrid")[0]  # the weighted sum of z-scores, dense weighing 0.55
    assert [h["id"] for h in default] == [i for i, _ in fusion.weighted(*scored, 0.55, "z-score")[:5]]


def test_hybrid_takes_rrfs_k_and_the_weighted_sums_normalisation(built):
    query = "river king castle"
    dense, lexical = built.rank([query], 25, "dense")[0], built.rank([query], 25, "bm25")[0]
    small_k = built.rank([query], 5, "hybrid", "rrf", depth=25, rrf_k=2)[0]
    assert small_k == fusion.rrf([[i for i, _ in dense], [i for i, _ in lexical]], 2)[:5]
    z = built.rank([query], 5, "hybrid", "weighted", alpha=0.3, depth=25, normalisation="z-score")[0]
    assert z == fusion.weighted(dict(dense), dict(lexical), 0.3, "z-score")[:5]


# ---- metrics ----------------------------------------------------------------------------------------------------
def test_metrics_equal_a_hand_computation_on_three_documents():
    qrels = {"q1": {"d1": 2, "d3": 1}}
    run = {"q1": {"d2": 0.9, "d1": 0.8, "d3": 0.7}}
    dcg = 2 / math.log2(3) + 1 / math.log2(4)  # trec_eval's gain is the relevance, its discount log2(rank + 1)
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    metrics = evaluate(qrels, run)
    assert metrics["ndcg_at_10"] == pytest.approx(dcg / ideal)
    assert metrics["mrr_at_10"] == pytest.approx(0.5)
    assert metrics["map_at_100"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert metrics["recall_at_10"] == pytest.approx(1.0)


def test_metrics_equal_pytrec_evals_and_drop_identical_ids():
    rng = random.Random(3)
    qrels = {f"q{q}": {f"d{d}": rng.randint(1, 3) for d in rng.sample(range(40), 4)} for q in range(6)}
    run = {q: {f"d{d}": rng.random() for d in range(40)} for q in qrels}
    direct = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "map_cut.100", "recall.100"}).evaluate(run)
    metrics = evaluate(qrels, run)
    assert metrics["ndcg_at_10"] == pytest.approx(np.mean([r["ndcg_cut_10"] for r in direct.values()]))
    assert metrics["map_at_100"] == pytest.approx(np.mean([r["map_cut_100"] for r in direct.values()]))
    assert metrics["recall_at_100"] == pytest.approx(1.0)
    # BEIR's ignore_identical_ids: a hit whose doc id is the query id goes, before scoring
    with_self = {"q1": {"q1": 9.0, "d2": 1.0}}
    assert evaluate({"q1": {"d2": 1}}, with_self)["mrr_at_10"] == 1.0
    assert evaluate({"q1": {"d2": 1}}, with_self, ignore_identical_ids=False)["mrr_at_10"] == 0.5


# ---- readers ----------------------------------------------------------------------------------------------------
def test_tsv_csv_parquet_and_lines_read_the_same_documents(tmp_path):
    rows = [("a1", "Alpha", "first text, with a comma"), ("a2", "", "second text")]
    (tmp_path / "c.tsv").write_text("id\ttitle\ttext\n" + "".join("\t".join(r) + "\n" for r in rows))
    (tmp_path / "c.csv").write_text('_id,title,text\na1,Alpha,"first text, with a comma"\na2,,second text\n')
    pq.write_table(pa.table({"_id": [r[0] for r in rows], "title": [r[1] for r in rows],
                             "text": [r[2] for r in rows]}), tmp_path / "c.parquet", row_group_size=1)
    expected = [(i, t, x) for i, t, x in rows]
    for name in ("c.tsv", "c.csv", "c.parquet"):
        assert [(d.id, d.title, d.text) for d in read_documents(tmp_path / name)] == expected, name
    (tmp_path / "c.txt").write_text("one\n\nthree\n")
    assert [(d.id, d.text) for d in read_documents(tmp_path / "c.txt")] == [("1", "one"), ("3", "three")]
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ta1\t1\nq1\ta2\t2\n")
    assert read_qrels(tmp_path / "qrels.tsv") == {"q1": {"a1": 1, "a2": 2}}


# ---- the commands -----------------------------------------------------------------------------------------------
def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_index_add_and_search_commands(tiny, corpus, tmp_path, capsys):
    folder = tmp_path / "idx"
    code, out, _ = run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", folder, "--bm25",
                           "--no-progress", "--json")
    assert code == 0 and json.loads(out)["documents"] == 25
    more = tmp_path / "more.tsv"
    more.write_text("id\ttitle\ttext\nx1\tHarbour\tharbour castle winter harbour\n")
    assert run_cli(capsys, "index", "--model", tiny, "--corpus", more, "--out", folder, "--add",
                   "--no-progress")[0] == 0
    before = hashes(folder)
    code, _, err = run_cli(capsys, "index", "--model", tiny, "--corpus", more, "--out", folder, "--add")
    assert code == 2 and "'x1' is in the index" in err and hashes(folder) == before
    code, out, _ = run_cli(capsys, "search", "--index", folder, "harbour castle", "--mode", "bm25", "--json")
    assert code == 0 and json.loads(out)[0]["hits"][0]["id"] == "x1"
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "river king"}\n{"_id": "q2", "text": "harbour"}\n')
    code, _, _ = run_cli(capsys, "search", "--index", folder, "--queries", queries, "--out", tmp_path / "run.tsv",
                         "--mode", "hybrid", "--top-k", "4")
    lines = (tmp_path / "run.tsv").read_text().splitlines()
    assert code == 0 and len(lines) == 8 and lines[0].split()[:2] == ["q1", "Q0"] and lines[0].split()[3] == "1"


def test_index_stride_averages_the_windows_of_a_long_document(tiny, corpus, tmp_path, capsys):
    """`index --stride N` embeds a document longer than --max-length whole: its vector is the mean of its windows'
    vectors (each window embedded alone), normalised as the model says; index.json records the stride, --add of
    another is refused."""
    code, _, _ = run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", tmp_path / "idx",
                         "--max-length", "8", "--stride", "2", "--no-progress")
    index, embed = Index(tmp_path / "idx"), pipeline("embed", tiny, max_length=8)
    windows, owners = embed.engine.windows(texts_of(corpus), 2)
    vectors = torch.zeros(len(index), index.meta["dimensions"])
    for window, owner in zip(windows, owners):
        ids = torch.tensor([window.input_ids])
        output = embed.model(ids, torch.ones_like(ids), torch.zeros_like(ids))
        vectors[owner] += output.last_hidden_state.mean(1)[0] / owners.count(owner)
    expected = torch.nn.functional.normalize(vectors, dim=-1) if index.meta["normalize"] else vectors
    assert code == 0 and index.meta["stride"] == 2 and len(windows) > len(index)
    torch.testing.assert_close(torch.from_numpy(index.vectors()), expected.detach(), atol=1e-5, rtol=1e-5)
    more = tmp_path / "more.tsv"
    more.write_text("id\ttext\nx1\tharbour castle winter harbour\n")
    code, _, err = run_cli(capsys, "index", "--model", tiny, "--corpus", more, "--out", tmp_path / "idx", "--add",
                           "--stride", "3")
    assert code == 2 and "read with --stride 2; --add reads the new ones the same way" in err
    code, _, err = run_cli(capsys, "index", "--model", tiny, "--corpus", corpus, "--out", tmp_path / "wide",
                           "--max-length", "8", "--stride", "6")
    assert code == 2 and "--stride 6: expected 0 to 5" in err and not (tmp_path / "wide").exists()


def test_evaluate_retrieval_scores_the_run_it_writes(tiny, corpus, tmp_path, capsys):
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    shutil.copy(corpus, data / "corpus.jsonl")
    (data / "queries.jsonl").write_text('{"_id": "q1", "text": "river king"}\n{"_id": "q2", "text": "ocean bird"}\n')
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\nq2\td7\t1\nq2\tnowhere\t1\n")
    code, out, err = run_cli(capsys, "evaluate", "retrieval", "--model", tiny, "--data", data, "--mode", "hybrid",
                             "--run", tmp_path / "run.tsv", "--json", "--no-progress")
    result = json.loads(out)
    assert code == 0 and result["queries"] == 2 and result["unknown_judgements"] == 1
    assert result["metrics"] == pytest.approx(evaluate(read_qrels(data / "qrels" / "test.tsv"),
                                                       read_run(tmp_path / "run.tsv")), abs=1e-6)


@pytest.mark.parametrize("fusion_args", [[], ["--fusion", "rrf", "--rrf-k", "5"]])
def test_fusing_two_run_files_equals_the_indexs_hybrid(fusion_args, built, corpus, tmp_path, capsys):
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    shutil.copy(corpus, data / "corpus.jsonl")
    (data / "queries.jsonl").write_text('{"_id": "q1", "text": "river king"}\n{"_id": "q2", "text": "ocean bird"}\n')
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\nq2\td7\t1\nq2\td9\t1\n")
    for mode in ("dense", "bm25"):
        assert run_cli(capsys, "search", "--index", built.folder, "--queries", data / "queries.jsonl", "--out",
                       tmp_path / f"{mode}.tsv", "--mode", mode, "--top-k", "100")[0] == 0
    code, out, _ = run_cli(capsys, "evaluate", "retrieval", "--data", data, "--fuse", tmp_path / "dense.tsv",
                           tmp_path / "bm25.tsv", "--json", *fusion_args)
    hybrid = run_cli(capsys, "evaluate", "retrieval", "--index", built.folder, "--data", data, "--mode", "hybrid",
                     "--json", *fusion_args)[1]
    assert code == 0 and json.loads(out)["metrics"] == pytest.approx(json.loads(hybrid)["metrics"], abs=1e-6)
    code, _, err = run_cli(capsys, "evaluate", "retrieval", "--data", data, "--fuse", tmp_path / "dense.tsv",
                           data / "corpus.jsonl")
    assert code == 2 and "corpus.jsonl:1: expected `qid Q0 docid rank score tag`" in err


def test_rerank_reorders_the_best_hits_by_the_cross_encoder(built, tmp_path):
    folder = tiny_folder(tmp_path / "ce", SequenceClassifier, num_labels=1, multilabel=True)
    reranker = pipeline("rerank", folder)
    first = built.search("river king", top_k=8)[0]
    hits = built.search("river king", top_k=8, rerank=reranker, rerank_top=5)[0]
    direct = reranker([{"query": "river king", "passages": [f"{h['title']} {h['text']}" for h in first[:5]]}])
    assert [h["id"] for h in hits[:5]] == [first[row["index"]]["id"] for row in direct[0]["ranking"]]
    assert [h["id"] for h in hits[5:]] == [h["id"] for h in first[5:]]
    assert all(a["score"] > b["score"] for a, b in zip(hits, hits[1:]))


# ---- bad input: one line, exit 2, nothing written ---------------------------------------------------------------
BAD_CORPORA = {
    "not JSON": ('{"_id": "a", "text": "fine"}\n{"_id": "b", text}\n', "corpus.jsonl:2: not valid JSON"),
    "no id": ('{"_id": "a", "text": "fine"}\n{"title": "t", "text": "no id"}\n', "corpus.jsonl:2: no id"),
    "no text": ('{"_id": "a", "title": "t"}\n', "corpus.jsonl:1: id 'a' has no text"),
    "duplicate": ('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n', "corpus.jsonl:2: duplicate id 'a'"),
    "empty": ("\n", "holds no documents"),
}


@pytest.mark.parametrize("case", BAD_CORPORA)
def test_a_bad_corpus_exits_2_naming_the_line_and_writes_nothing(case, tiny, tmp_path, capsys):
    text, message = BAD_CORPORA[case]
    (tmp_path / "corpus.jsonl").write_text(text)
    code, _, err = run_cli(capsys, "index", "--model", tiny, "--corpus", tmp_path / "corpus.jsonl",
                           "--out", tmp_path / "idx")
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "idx").exists()


def test_a_model_trained_again_in_place_is_refused_by_its_index(corpus, tmp_path, capsys):
    """The model folder an index was built with, saved again with other weights of the same shapes: searching with
    it (named or, by default, at its recorded path) exits 2 naming the change, and opening the index's own encoder
    refuses it; an index recorded before the weights were sampled is still checked by name and size."""
    model = tiny_folder(tmp_path / "model")
    index = Index.build(model, corpus, tmp_path / "idx", shard_size=10, progress=False)
    assert index.meta["model"]["weights_sampled"] and main(["search", "--index", str(index.folder), "river"]) == 0
    capsys.readouterr()
    before = (model / "model.safetensors").stat().st_size
    with safe_open(model / "model.safetensors", "pt") as f:
        header = f.metadata()
    state = load_file(model / "model.safetensors")
    save_file({name: tensor + 0.01 for name, tensor in state.items()}, model / "model.safetensors", metadata=header)
    assert (model / "model.safetensors").stat().st_size == before  # the old fingerprint cannot tell
    for argv, message in ((["search", "--index", index.folder, "river"], "whose files have changed since"),
                          (["serve", "--index", index.folder], "whose files have changed since"),
                          (["search", "--index", index.folder, "--model", model, "river"], "is another model")):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and message in err and err.count("\n") == 1, (argv, err)
    with pytest.raises(InputError, match="whose files have changed since"):
        Index.load(index.folder).embedder
    meta = json.loads((index.folder / "index.json").read_text())
    del meta["model"]["weights_sampled"]
    meta["model"]["fingerprint"] = fingerprint(model, sampled=False)
    (index.folder / "index.json").write_text(json.dumps(meta))
    code, out, err = run_cli(capsys, "search", "--index", index.folder, "river")
    assert code == 0 and out.strip(), err


def test_bad_models_and_options_exit_2_and_write_nothing(built, tiny, corpus, tmp_path, capsys):
    classifier = tiny_folder(tmp_path / "cls", SequenceClassifier, num_labels=2)
    other = tiny_folder(tmp_path / "other")
    (other / "config.json").write_text((other / "config.json").read_text().replace('"hidden_act"', '"hidden_act" '))
    before = hashes(built.folder)
    cases = [
        (("index", "--model", classifier, "--corpus", corpus, "--out", tmp_path / "a"), "not a SequenceClassifier"),
        (("index", "--model", tiny, "--corpus", corpus, "--out", tmp_path / "a", "--dimensions", "33"),
         "dimensions 33: expected a whole number from 1 to 32"),
        (("index", "--model", tiny, "--corpus", corpus, "--out", built.folder), "holds an index"),
        (("search", "--index", built.folder, "--model", other, "river"), f"built with the model {tiny}"),
        (("index", "--model", other, "--corpus", corpus, "--out", built.folder, "--add"), f"--model {other} is"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and message in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "a").exists() and hashes(built.folder) == before
