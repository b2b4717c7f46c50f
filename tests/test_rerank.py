"""The cross-encoder reranker (encoderlab.tasks.rerank): ranking metrics, a tiny model learning which passage
answers a query through the CLI, its pipeline, command and endpoint, parity with transformers, bad input."""

from __future__ import annotations

import json
import math
import random

import httpx
import pytest
import torch
from torch.testing import assert_close
from transformers import BertForSequenceClassification

from hf_oracle import TOL
from test_server import running
from test_tasks_finetune import CITIES, FILLER, NAMES, run, tiny_model  # noqa: F401

from encoderlab import EncoderConfig, SequenceClassifier, load_model
from encoderlab.cli import main
from encoderlab.errors import InputError
from encoderlab.infer.limits import Limits
from encoderlab.infer.pipelines import pipeline
from encoderlab.nn.output import batch_counts
from encoderlab.infer.server import create_app, load_pipelines
from encoderlab.tasks.rerank import RerankTask, listwise, ranking_metrics
from encoderlab.tasks.readers import TextExample
from encoderlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def test_ranking_metrics_by_hand():
    # query 1: relevant at rank 2 of 3; query 2: relevant at rank 1 and 3; query 3: none in the top 10
    got = ranking_metrics([[0, 1, 0], [1, 0, 1], [0] * 10 + [1]])
    assert got["mrr_at_10"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert got["hit_at_1"] == pytest.approx(1 / 3)
    ndcg1 = (1 / math.log2(3)) / 1
    ndcg2 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert got["ndcg_at_10"] == pytest.approx((ndcg1 + ndcg2 + 0) / 3)


def queries(rng: random.Random, count: int) -> list[tuple[str, str, int]]:
    """Rows (query, passage, label): who lives where; the relevant passage names the query's person."""
    rows, seen = [], set()
    while len(seen) < count:
        person = rng.choice(NAMES)
        query = f"{' '.join(rng.choices(FILLER, k=3))} where does {person} live ?"  # distinct: rows group by query
        if query in seen:
            continue
        seen.add(query)
        for other in NAMES:
            filler = " ".join(rng.choices(FILLER, k=2))
            rows.append((query, f"{other} lives in {rng.choice(CITIES)} {filler}", int(other == person)))
    return rows


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_path):
    """all-MiniLM-L6-v2's encoder under a new one-logit head, fine-tuned briefly (a random tiny encoder does not
    learn to match words across the pair in a test's time). Every query has its 4 passages, one relevant: it trains
    listwise, 4 queries (16 pairs) a step."""
    folder = tmp_path_factory.mktemp("rerank")
    rng = random.Random(0)
    for name, count in (("train", 80), ("dev", 20)):
        rows = queries(rng, count)
        (folder / f"{name}.tsv").write_text("query\tpassage\tlabel\n" + "".join(f"{q}\t{p}\t{y}\n" for q, p, y in rows))
    summary = run("finetune", "rerank", "--model", minilm_path, "--train", folder / "train.tsv", "--eval",
                  folder / "dev.tsv", "--out", folder / "run", "--lr", "1e-4", "--epochs", "1", "--batch-size", "4",
                  "--max-length", "32", "--no-progress")
    return folder, summary


def test_a_tiny_cross_encoder_learns_to_rank_and_evaluates_the_same(reranker):
    folder, summary = reranker
    # chance: the relevant passage is one of 4, MRR (1 + 1/2 + 1/3 + 1/4) / 4 = 0.52
    assert summary["metric"] == "mrr_at_10" and summary["best"]["eval_mrr_at_10"] >= 0.9
    model = load_model(folder / "run")
    assert isinstance(model, SequenceClassifier) and model.num_outputs == 1
    assert json.loads((folder / "run" / "task.json").read_text())["loss"] == "listwise"
    result = run("evaluate", "rerank", "--model", folder / "run", "--data", folder / "dev.tsv")
    assert result["metrics"]["mrr_at_10"] == pytest.approx(summary["best"]["eval_mrr_at_10"])
    assert result["metrics"]["queries"] == 20


def test_the_pipeline_command_and_endpoint_rank_alike(reranker, capsys):
    folder, _ = reranker
    passages = ["peter lives in rome", "anna lives in paris", "maria lives in oslo"]
    ranked = pipeline("rerank", folder / "run")([{"query": "where does anna live ?", "passages": passages}])[0]
    assert ranked["ranking"][0]["passage"] == "anna lives in paris" and ranked["ranking"][0]["index"] == 1
    scores = [row["score"] for row in ranked["ranking"]]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert main(["rerank", "--model", str(folder / "run"), "--query", "where does anna live ?", "--top-k", "2",
                 "--json", *passages]) == 0
    assert json.loads(capsys.readouterr().out)[0]["ranking"] == ranked["ranking"][:2]
    pipelines, reasons = load_pipelines(str(folder / "run"), tasks=["rerank"])
    with running(create_app(pipelines, Limits(), model="rerank", unavailable=reasons)) as url:
        body = {"items": [{"query": "where does anna live ?", "passages": passages}], "top_k": 2}
        response = httpx.post(f"{url}/rerank", json=body, timeout=30)
        empty = httpx.post(f"{url}/rerank", json={"items": [{"query": "who", "passages": []}]}, timeout=30)
    assert response.status_code == 200 and response.json()["results"][0]["ranking"] == ranked["ranking"][:2]
    assert empty.status_code == 422


def test_transformers_reads_the_reranker_as_a_one_label_classifier(reranker):
    folder, _ = reranker
    hf = BertForSequenceClassification.from_pretrained(folder / "run").eval()
    assert hf.config.num_labels == 1 and hf.config.problem_type == "multi_label_classification"
    ours = load_model(folder / "run")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, ours.config.vocab_size, (3, 12), generator=gen)
    with torch.no_grad():
        assert_close(ours(ids).logits, hf(ids).logits, **TOL)


def test_bad_input_is_refused(tmp_path, tiny_model, reranker, capsys):  # noqa: F811
    bad = tmp_path / "bad.tsv"
    bad.write_text("query\tpassage\tlabel\nwhere\tanna lives in paris\t1\nwho\tpeter\t2\n")
    with pytest.raises(InputError, match=r"bad.tsv:3.*relevance label of 0 or 1"):
        run("finetune", "rerank", "--model", tiny_model, "--train", bad, "--out", tmp_path / "out", "--no-progress")
    assert not (tmp_path / "out").exists()
    folder, _ = reranker
    rerank = pipeline("rerank", folder / "run")
    with pytest.raises(InputError, match="input 0: \"passages\" must be a non-empty list"):
        rerank([{"query": "where", "passages": []}])
    classifier = SequenceClassifier(EncoderConfig.from_hf_dict(
        load_model(folder / "run").config.to_hf_dict("BertForSequenceClassification")), 3)
    with pytest.raises(InputError, match="this classifier has 3 classes"):
        type(rerank)(classifier, rerank.tokenizer)
    assert main(["rerank", "--model", str(folder / "run"), "--query", "  ", "anna lives in paris"]) == 2
    assert capsys.readouterr().err.strip() == "error: rerank: --query is empty or only whitespace (expected some words)"


def rows_as_examples(rows: list[tuple[str, str, float]]) -> list[TextExample]:
    return [TextExample((q, p), float(y), f"line {i + 2}") for i, (q, p, y) in enumerate(rows)]


def test_listwise_when_every_query_has_a_relevant_passage_and_another():
    grouped = rows_as_examples([("a", "x", 1), ("a", "y", 0), ("b", "z", 0), ("b", "w", 1), ("b", "v", 0)])
    assert listwise(grouped)
    assert not listwise(grouped[:4] + rows_as_examples([("c", "u", 1)]))  # a query with one passage
    assert not listwise(rows_as_examples([("a", "x", 0), ("a", "y", 0.2)]))  # no relevant passage
    assert not listwise([])


def test_the_listwise_loss_is_a_softmax_cross_entropy_per_query(minilm_path):
    """Queries of 2 and 3 passages in one batch: the loss is the sum over queries of the cross-entropy of the softmax
    over that query's passages, computed here query by query, counted per query."""
    tokenizer = Tokenizer.from_pretrained(minilm_path)
    task = RerankTask(tokenizer, 32, listwise=True)
    examples = rows_as_examples([("who is anna ?", "anna lives in rome", 1), ("who is anna ?", "peter is here", 0),
                                 ("where is oslo ?", "paris is big", 0), ("where is oslo ?", "oslo is north", 1),
                                 ("where is oslo ?", "a city", 0)])
    features = task.features(examples)
    assert [len(f["group"]) for f in features] == [2, 3]
    batch = task.collate(features)
    model = load_model(minilm_path, kind="classify", num_labels=1, multilabel=True)
    (got, count, unit), = task.loss(model, batch).values()
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits[:, 0]
    want = (torch.nn.functional.cross_entropy(logits[None, :2], torch.tensor([0]), reduction="sum")
            + torch.nn.functional.cross_entropy(logits[None, 2:], torch.tensor([1]), reduction="sum"))
    assert_close(got, want)
    assert unit == "groups" and int(count) == 2 == int(batch_counts(batch)["groups"])
    pointwise = RerankTask(tokenizer, 32)
    assert len(pointwise.features(examples)) == 5 and "labels" in pointwise.collate(pointwise.features(examples))
