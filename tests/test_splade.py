"""Learned sparse retrieval (encoderlab.tasks.splade, encoderlab.retrieval.sparse): the SPLADE weights, FLOPS and
its warm-up against their formulas; a sparse index searched as brute-force dot products; `embed --sparse`;
sentence-transformers' SparseEncoder reading our folders (normal and inference-free) with equal vectors; training
lowering the loss; the bad inputs."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import scipy.sparse
import torch
from torch.testing import assert_close

from test_tasks_finetune import CITIES, FILLER, NAMES, tiny_vocabulary

from encoderlab import MaskedLMModel, save_pretrained
from encoderlab.choices import START_SAMPLE, START_TERMS
from encoderlab.cli import build_parser, main
from encoderlab.infer.pipelines import pipeline
from encoderlab.retrieval import index as index_module
from encoderlab.retrieval.index import Index
from encoderlab.tasks.splade import (SpladeTask, contrastive_sum, df_scale, flops, flops_weight, idf_table,
                                     max_by_owner, sparse_weights, static_weights, write_sparse_encoder)
from encoderlab.tasks.readers import TextExample
from encoderlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

def run(*argv):
    """A command's result, through the whole command line's parser."""
    args = build_parser().parse_args([str(a) for a in argv])
    return args.func(args)


WORDS = FILLER + NAMES + CITIES + ["lives", "in", "where", "does", "live", "?", "."]


def write_tiny_splade(folder, inference_free: bool = False, seed: int = 0):
    """A random 2-layer, 32-wide masked-LM model saved as a SPLADE folder (as `finetune splade` leaves one)."""
    tokenizer, config = tiny_vocabulary(folder, WORDS)
    torch.manual_seed(seed)
    model = MaskedLMModel(config)
    task = SpladeTask(tokenizer, 32, inference_free=inference_free)
    if inference_free:
        task.table = torch.rand(config.vocab_size) * 3
    save_pretrained(model, folder, tokenizer, task.info())
    write_sparse_encoder(folder, task)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_splade(tmp_path_factory.mktemp("splade") / "model")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 short documents: who lives where."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    rows = [{"_id": f"d{i}", "title": "", "text": f"{NAMES[i % 4]} lives in {CITIES[(i // 4) % 4]} {FILLER[i % 12]}"}
            for i in range(40)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ---- the formulas -----------------------------------------------------------------------------------------------
def test_weights_are_log1p_relu_of_the_logits_max_pooled_over_real_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11) * 3
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    logits[0, 3:] = 100.0  # padding: however large, never counted
    expected = torch.zeros(2, 11)
    for b in range(2):
        for j in range(11):
            expected[b, j] = max(math.log(1 + max(float(logits[b, t, j]), 0.0)) for t in range(5) if mask[b, t])
    assert_close(sparse_weights(logits, mask), expected)


def test_the_pooled_weights_gradient_is_the_plain_formulas():
    """SparseMaxPool keeps the winning tokens instead of two (B, T, V) tensors: the logits' gradient must equal
    autograd's through log1p(relu(.)), the mask and amax, padding and columns with no positive logit included."""
    torch.manual_seed(3)
    logits = (torch.randn(3, 6, 13) * 2).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    with torch.no_grad():
        logits[0, 4:] = 50.0  # padding above every real token: no gradient may reach it
        logits[2, :, 5] = -1.0  # a column with no positive logit: weight 0, no gradient
    upstream = torch.randn(3, 13)
    plain = logits.detach().clone().requires_grad_()
    expected = (torch.log1p(torch.relu(plain)) * mask[:, :, None]).amax(dim=1)
    (expected * upstream).sum().backward()
    pooled = sparse_weights(logits, mask)
    (pooled * upstream).sum().backward()
    assert_close(pooled, expected)
    assert_close(logits.grad, plain.grad)
    assert logits.grad[0, 4:].abs().sum() == 0 and logits.grad[2, :, 5].abs().sum() == 0
    half = logits.detach().bfloat16().requires_grad_()  # bf16 logits (--precision bf16): a bf16 gradient
    sparse_weights(half, mask).sum().backward()
    assert half.grad.dtype == torch.bfloat16


def test_flops_is_the_sum_of_squared_mean_weights():
    torch.manual_seed(1)
    weights = torch.rand(4, 9)
    expected = sum((sum(float(weights[i, j]) for i in range(4)) / 4) ** 2 for j in range(9))
    assert float(flops(weights)) == pytest.approx(expected, rel=1e-6)


def test_df_scale_is_half_at_the_cutoff_and_grows_with_document_frequency():
    """DF-FLOPS's logistic (arXiv:2505.15070): 1/2 for a token in the cutoff's share of the documents, 1 for one in
    all, near 0 for a rare one, rising in between; computed from where the documents weigh anything."""
    documents = torch.zeros(200, 6)
    for j, share in enumerate((1.0, 0.5, 0.2, 0.1, 0.02, 0.0)):
        documents[: round(200 * share), j] = torch.rand(round(200 * share)) + 0.01
    scale = df_scale(documents, 0.1, steepness=5.0)
    assert float(scale[0]) == pytest.approx(1.0) and float(scale[3]) == pytest.approx(0.5)
    x = 0.02
    assert float(scale[4]) == pytest.approx(1 / (1 + (x ** (math.log(2) / math.log(0.1)) - 1) ** 5), rel=1e-4)
    assert float(scale[4]) < 0.05 and float(scale[5]) < 1e-6
    assert all(float(scale[j]) > float(scale[j + 1]) for j in range(5))
    assert float(df_scale(documents, 0.5, steepness=5.0)[1]) == pytest.approx(0.5)  # the cutoff moves the half


def test_df_flops_weighs_each_term_by_its_scale():
    torch.manual_seed(3)
    weights, scale = torch.rand(4, 9), torch.rand(9)
    expected = sum(float(scale[j]) * (sum(float(weights[i, j]) for i in range(4)) / 4) ** 2 for j in range(9))
    assert float(flops(weights, scale)) == pytest.approx(expected, rel=1e-6)


def test_flops_weight_rises_quadratically_then_stays():
    assert flops_weight(0, 100, 3e-5) == 0.0
    assert flops_weight(50, 100, 3e-5) == pytest.approx(3e-5 / 4)
    assert flops_weight(10, 100, 3e-5) == pytest.approx(3e-5 / 100)
    assert flops_weight(100, 100, 3e-5) == flops_weight(5000, 100, 3e-5) == 3e-5


def test_contrastive_sum_is_the_cross_entropy_of_dot_products():
    torch.manual_seed(2)
    queries, documents = torch.rand(3, 7), torch.rand(5, 7)
    expected = 0.0
    for i in range(3):
        scores = [float(queries[i] @ documents[c]) for c in range(5)]
        expected -= scores[i] - math.log(sum(math.exp(s) for s in scores))
    assert float(contrastive_sum(queries, documents)) == pytest.approx(expected, rel=1e-5)


def test_static_weights_and_idf():
    table = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    ids = torch.tensor([[3, 1, 3, 0], [2, 0, 0, 0]])
    keep = torch.tensor([[True, True, True, False], [True, False, False, False]])
    assert_close(static_weights(ids, keep, table), torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0],
                                                                 [0.0, 0.0, 2.0, 0.0, 0.0]]))


def test_idf_table_is_bm25s_idf(tiny):
    tokenizer = Tokenizer.from_pretrained(tiny)
    idf = idf_table(["anna lives in rome", "peter lives in oslo", "anna"], tokenizer, tokenizer.vocab_size)
    anna, lives, lima = (tokenizer.token_to_id(w) for w in ("anna", "lives", "lima"))
    assert float(idf[anna]) == pytest.approx(math.log(1 + (3 - 2 + 0.5) / 2.5))
    assert float(idf[lives]) == float(idf[anna]) and float(idf[lima]) == pytest.approx(math.log(1 + 3.5 / 0.5))


# ---- pipeline, index, search --------------------------------------------------------------------------------
def test_pipeline_gives_the_weights_of_the_model(tiny):
    pipe = pipeline("splade", tiny)
    texts = ["where does anna live ?", "peter lives in rome"]
    matrix = pipe.vectors(texts).toarray()
    tokenizer = Tokenizer.from_pretrained(tiny)
    batch = tokenizer.encode_batch(texts)
    with torch.no_grad():
        logits = pipe.model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits
    assert_close(torch.from_numpy(matrix), sparse_weights(logits, batch.attention_mask))
    result = pipe(texts[:1], top_k=3)[0]
    order = np.argsort(-matrix[0], kind="stable")[:3]
    assert result["indices"] == order.tolist() and result["tokens"] == [tokenizer.id_to_token(int(i)) for i in order]


def test_weights_of_a_vocabulary_are_the_full_weights_of_those_ids(tiny):
    """vectors(vocabulary=ids): the decoder computes the ids' logits alone (its output is (B, T, R)) and the weights
    of those ids equal the full ones, every other id 0; the inference-free lookup is unchanged by it."""
    pipe = pipeline("splade", tiny)
    texts = ["where does anna live ?", "peter lives in rome", "maria"]
    full = pipe.vectors(texts).toarray()
    vocabulary = np.flatnonzero(np.random.default_rng(0).random(full.shape[1]) < 0.4)
    widths = []
    hook = pipe.model.mlm.register_forward_hook(lambda module, args, output: widths.append(output.shape[-1]))
    part = pipe.vectors(texts, vocabulary=vocabulary).toarray()
    hook.remove()
    assert widths == [len(vocabulary)] and part.shape == full.shape
    assert_close(torch.from_numpy(part[:, vocabulary]), torch.from_numpy(full[:, vocabulary]))
    assert not np.delete(part, vocabulary, axis=1).any() and full[:, vocabulary].any()


def test_sparse_index_search_equals_brute_force_dot_products(tiny, corpus, tmp_path, capsys):
    out = tmp_path / "index"
    summary = run("index", "--model", tiny, "--corpus", corpus, "--out", out, "--shard-size", "16", "--no-progress",
                  "--json")
    assert summary["kind"] == "sparse" and summary["shards"] == 3 and summary["bytes"] > 0
    meta = json.loads((out / "index.json").read_text())
    assert meta["kind"] == "sparse" and sorted(p.suffix for p in (out / "shards").glob("*.npz")) == [".npz"] * 3
    pipe = pipeline("splade", tiny)
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    documents = pipe.vectors([" " + t for t in texts]).toarray()  # the index embeds title + " " + text
    index = Index(out)
    assert_close(torch.from_numpy(index.vectors().toarray()), torch.from_numpy(documents))
    assert np.array_equal(index.terms(), np.flatnonzero((documents > 0).any(axis=0)))  # what queries are weighed on
    queries = ["where does anna live ?", "maria lima"]
    scores = pipe.vectors(queries).toarray() @ documents.T  # (Q, N)
    capsys.readouterr()
    hits = run("search", "--index", out, *queries, "--top-k", "5", "--json")
    for row, found in zip(scores, hits):
        best = -np.sort(-row)[:5]
        assert_close(torch.tensor([h["score"] for h in found]), torch.from_numpy(best).float(), atol=1e-5, rtol=0)
        assert all(row[int(h["id"][1:])] == pytest.approx(h["score"], abs=1e-5) for h in found)


def test_an_index_that_fits_reads_its_shards_once(tiny, corpus, tmp_path, monkeypatch):
    """Searching keeps the shards of an index under HELD_BYTES in memory after the first search (reading them again
    was 70 ms of the bench's inference-free search at p50): with the shard files gone, the second search answers as
    the first. Over the limit, each search reads the files."""
    out = tmp_path / "index"
    run("index", "--model", tiny, "--corpus", corpus, "--out", out, "--shard-size", "16", "--no-progress", "--json")
    queries = ["where does anna live ?", "maria lima"]
    index, streamed = Index(out, pipeline("splade", tiny)), Index(out, pipeline("splade", tiny))
    first = index.search(queries, top_k=5)
    monkeypatch.setattr(index_module, "HELD_BYTES", 0)
    assert streamed.search(queries, top_k=5) == first
    for path in (out / "shards").glob("*.npz"):
        path.rename(path.with_suffix(".moved"))
    assert index.search(queries, top_k=5) == first
    with pytest.raises(FileNotFoundError):
        streamed.search(queries, top_k=5)


def test_max_by_owner_is_the_elementwise_max_of_each_owners_rows():
    rng = np.random.default_rng(0)
    rows = rng.random((7, 11)) * (rng.random((7, 11)) < 0.4)  # non-negative, mostly 0
    owners = [0, 0, 1, 2, 2, 2, 4]  # owner 3 has no rows: all 0
    expected = np.zeros((5, 11))
    for row, owner in zip(rows, owners):
        expected[owner] = np.maximum(expected[owner], row)
    got = max_by_owner(scipy.sparse.csr_matrix(rows.astype(np.float32)), owners, 5)
    assert got.shape == (5, 11) and np.array_equal(got.toarray(), expected.astype(np.float32))


def test_index_stride_max_pools_the_windows_of_a_long_document(tiny, tmp_path, capsys):
    """`index --stride N` reads a document longer than the window whole: its weights are the max over its windows'
    weights, each window run through the model alone; index.json records the stride and --add refuses another."""
    texts = [" ".join(f"{NAMES[i % 4]} lives in {CITIES[(i + j) % 4]} {FILLER[j]}" for j in range(3)) for i in range(5)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    command = ["index", "--model", tiny, "--corpus", corpus, "--max-length", "8", "--no-progress", "--json"]
    run(*command, "--out", tmp_path / "whole", "--stride", "2")
    run(*command, "--out", tmp_path / "cut")
    whole, cut = Index(tmp_path / "whole"), Index(tmp_path / "cut")
    pipe = pipeline("splade", tiny, max_length=8)
    windows, owners = pipe.engine.windows([" " + t for t in texts], 2)  # the index reads title + " " + text
    expected = np.zeros((len(texts), pipe.model.config.vocab_size), dtype=np.float32)
    with torch.no_grad():
        for window, owner in zip(windows, owners):
            ids = torch.tensor([window.input_ids])
            logits = pipe.model(ids, torch.ones_like(ids), torch.zeros_like(ids)).logits
            expected[owner] = np.maximum(expected[owner], sparse_weights(logits, torch.ones_like(ids))[0].numpy())
    assert len(windows) > 2 * len(texts) and whole.meta["stride"] == 2 and cut.meta["stride"] is None
    assert_close(torch.from_numpy(whole.vectors().toarray()), torch.from_numpy(expected), atol=1e-5, rtol=1e-5)
    assert (whole.vectors() != cut.vectors()).nnz > 0
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "new", "text": texts[0]}) + "\n")
    capsys.readouterr()
    assert main([str(a) for a in command[:3]] + ["--corpus", str(more), "--out", str(tmp_path / "cut"), "--add",
                                                  "--stride", "2"]) == 2
    assert "read without --stride; --add reads the new ones the same way" in capsys.readouterr().err


def test_a_model_of_another_kind_is_refused_naming_both(tiny, corpus, tmp_path, minilm_path, capsys):
    out = tmp_path / "index"
    run("index", "--model", tiny, "--corpus", corpus, "--out", out, "--no-progress")
    capsys.readouterr()
    assert main(["search", "--index", str(out), "--model", "minilm", "anna"]) == 2
    err = capsys.readouterr().err
    assert "sparse index" in err and "dense model" in err and str(tiny) in err and err.count("\n") == 1
    dense = tmp_path / "dense"
    (dense / "index.json").parent.mkdir()
    meta = json.loads((out / "index.json").read_text()) | {"kind": "dense"}  # a dense index of minilm
    meta["model"] = {"name": "minilm", "path": str(minilm_path), "fingerprint": "x"}
    (dense / "index.json").write_text(json.dumps(meta))
    assert main(["search", "--index", str(dense), "--model", str(tiny), "anna"]) == 2
    err = capsys.readouterr().err
    assert "dense index" in err and "sparse model" in err and "minilm" in err


def test_evaluate_retrieval_runs_on_a_sparse_index(tiny, corpus, tmp_path, capsys):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(corpus.read_text())
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"where does {n} live ?"}) + "\n"
                                                for i, n in enumerate(NAMES)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\td{i}\t1\n" for i in range(4)))
    run("index", "--model", tiny, "--corpus", beir / "corpus.jsonl", "--out", tmp_path / "index", "--no-progress")
    capsys.readouterr()
    result = run("evaluate", "retrieval", "--index", tmp_path / "index", "--data", beir, "--json", "--no-progress")
    assert result["queries"] == 4 and 0.0 <= result["metrics"]["ndcg_at_10"] <= 1.0


def test_embed_sparse_prints_the_heaviest_terms(tiny, capsys):
    results = run("embed", "--sparse", "--model", tiny, "anna lives in rome", "peter", "--top-k", "3", "--json")
    shown = json.loads(capsys.readouterr().out)
    top = pipeline("splade", tiny)(["anna lives in rome", "peter"])
    assert shown == results == [{k: v[:3] for k, v in row.items()} for row in top]
    assert shown[0]["values"] == sorted(shown[0]["values"], reverse=True)
    assert run("splade", "--model", tiny, "anna lives in rome", "peter", "--top-k", "3", "--json") == results
    capsys.readouterr()
    run("embed", "--sparse", "--model", tiny, "anna lives in rome")
    text = capsys.readouterr().out
    assert text.startswith(f"{len(top[0]['values'])} terms: {top[0]['tokens'][0]} {top[0]['values'][0]:.2f}  ")


# ---- interop ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # importing the oracle costs seconds
@pytest.mark.parametrize("inference_free", [False, True], ids=["splade", "inference-free"])
def test_sentence_transformers_sparse_encoder_gives_our_vectors(tmp_path, inference_free):
    from sentence_transformers import SparseEncoder  # the oracle, imported where it is used (a second of collection)

    folder = write_tiny_splade(tmp_path / "model", inference_free)
    texts = ["where does anna live ?", "peter lives in rome", "the movie was quite so"]
    theirs = SparseEncoder(str(folder), device="cpu")
    ours = pipeline("splade", folder)
    assert ours.inference_free == inference_free
    for query, encode in ((False, theirs.encode_document), (True, theirs.encode_query)):
        expected = encode(texts, convert_to_tensor=True).to_dense().float()
        assert_close(torch.from_numpy(ours.vectors(texts, query=query).toarray()), expected, atol=1e-4, rtol=0)


# ---- training -----------------------------------------------------------------------------------------------
def triplets(path, count: int, seed: int = 0):
    """query \\t positive \\t negative rows: the positive names the query's person."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        person, other = rng.sample(NAMES, 2)
        rows.append(f"where does {person} live ?\t{person} lives in {rng.choice(CITIES)}\t"
                    f"{other} lives in {rng.choice(CITIES)}\n")
    path.write_text("query\tpositive\tnegative\n" + "".join(rows), encoding="utf-8")
    return path


def test_features_encode_a_column_at_a_time_and_warn_once_a_column(tiny, caplog):
    """Rows of two and three texts, most too long: each row's ids are its texts' own, and the truncation warning
    comes once per column (queries, positives, hard negatives), not once per row (5,190 lines on SQuAD)."""
    tokenizer = Tokenizer.from_pretrained(tiny)
    task = SpladeTask(tokenizer, 6)
    long = " ".join(FILLER)
    examples = [TextExample((f"where does {NAMES[i % 4]} live {long}", f"{NAMES[i % 4]} lives in {long}",
                             *([f"{NAMES[(i + 1) % 4]} lives {long}"] if i % 3 else [])), None, f"t:{i}")
                for i in range(9)]
    with caplog.at_level("WARNING"):
        features = task.features(examples)
    cut = [r for r in caplog.records if "were truncated" in r.getMessage()]
    assert [r.getMessage().split(" were")[0] for r in cut] == ["9 of 9 queries", "9 of 9 positives",
                                                               "6 of 6 hard negatives"]
    for example, feature in zip(examples, features):
        rows, _ = tokenizer.encode_rows(list(example.texts), max_length=6)
        assert [feature[f"{c}.input_ids"] for c in range(len(rows))] == [r.input_ids for r in rows]
        assert ("2.input_ids" in feature) == (len(example.texts) == 3)


@pytest.mark.slow
def test_training_lowers_the_loss(tmp_path):
    model = write_tiny_splade(tmp_path / "start")
    train = triplets(tmp_path / "train.tsv", 48)
    summary = run("finetune", "splade", "--model", model, "--train", train, "--out", tmp_path / "run", "--epochs",
                  "3", "--batch-size", "8", "--lr", "2e-3", "--max-length", "16", "--no-progress")
    rows = [row.split(",") for row in (tmp_path / "run" / "metrics.csv").read_text().splitlines()]
    column = rows[0].index("loss")
    losses = [float(row[column]) for row in rows[1:] if row[column]]
    assert summary["steps"] == 18 and np.mean(losses[-3:]) < np.mean(losses[:3])
    info = json.loads((tmp_path / "run" / "task.json").read_text())
    assert info["task"] == "splade" and not info["inference_free"] and (tmp_path / "run" / "modules.json").is_file()
    assert info["start_terms"] == START_TERMS and info["logit_shift"] > 0  # the random head started dense


def test_inference_free_queries_train_the_table_without_a_flops_term(tiny, tmp_path):
    """One loss step: the query table gets gradients, the queries never go through the model, and the loss is the
    contrastive term plus the documents' FLOPS only."""
    from encoderlab.checkpoint import load_model
    from encoderlab.tasks.readers import TextExample
    from encoderlab.tasks.splade import model_weights, prepare_model

    tokenizer = Tokenizer.from_pretrained(tiny)
    rows = [("where does anna live ?", "anna lives in rome", "john lives in oslo"),
            ("where does peter live ?", "peter lives in lima", "maria lives in paris")]
    task = SpladeTask(tokenizer, 16, batch_size=2, inference_free=True, flops_warmup=1,
                      documents=[t for row in rows for t in row[1:]])
    model = load_model(tiny, kind="mlm")  # eval mode: no dropout, so the terms can be recomputed
    prepare_model(model, task)
    assert "query_table" not in model.state_dict() and task.table is model.query_table
    batch = task.collate(task.features([TextExample(tuple(row), None, f"row {i}") for i, row in enumerate(rows)]))
    task.step = 4  # past the warm-up: the full FLOPS weights
    terms = task.loss(model, batch)
    queries = task.query_weights(model, batch["0"])
    documents = torch.cat([model_weights(model, batch["1"]), model_weights(model, batch["2"])])
    assert {t.unit for t in terms.values()} == {"sequences"} and all(t.count == 2 for t in terms.values())
    assert_close(terms["contrastive"].total, contrastive_sum(queries, documents))
    assert_close(terms["flops"].total, task.document_flops * flops(documents) * 2)  # the documents' alone
    loss = sum(t.total for t in terms.values())
    loss.backward()
    assert model.query_table.grad is not None and model.query_table.grad.abs().sum() > 0


def test_df_flops_scales_both_terms_by_the_documents_frequency(tiny):
    """With --df-flops, the queries' and the documents' FLOPS terms are each weighted per token by df_scale of the
    batch's documents (not of the queries), and the run's task.json records the cutoff."""
    from encoderlab.checkpoint import load_model
    from encoderlab.tasks.splade import model_weights

    tokenizer = Tokenizer.from_pretrained(tiny)
    rows = [("where does anna live ?", "anna lives in rome", "john lives in oslo"),
            ("where does peter live ?", "peter lives in lima", "maria lives in paris")]
    task = SpladeTask(tokenizer, 16, batch_size=2, flops_warmup=1, df_flops=0.3)
    model = load_model(tiny, kind="mlm")
    batch = task.collate(task.features([TextExample(tuple(row), None, f"row {i}") for i, row in enumerate(rows)]))
    task.step = 4
    with torch.no_grad():
        terms = task.loss(model, batch)
        queries = model_weights(model, batch["0"])
        documents = torch.cat([model_weights(model, batch["1"]), model_weights(model, batch["2"])])
    scale = df_scale(documents, 0.3)
    assert 0 < float(scale.min()) < 0.5 < float(scale.max())  # a batch of rare and shared tokens
    expected = task.document_flops * flops(documents, scale) + task.query_flops * flops(queries, scale)
    assert_close(terms["flops"].total, expected * 2)
    assert float(terms["flops"].total) < float(2 * (task.document_flops * flops(documents)
                                             + task.query_flops * flops(queries)))
    assert task.info()["df_flops"] == 0.3


def test_the_flops_warm_up_follows_the_runs_steps_resumed_or_not(tiny):
    """The warm-up's clock is the loop's step: a run resumed at step 3 weighs FLOPS at step 4 as the uninterrupted
    run does (it restarted from 0 before), and the pieces of an accumulated step share their step's weight."""
    from encoderlab.checkpoint import load_model
    from encoderlab.tasks.objective import FeatureBatches
    from encoderlab.tasks.splade import model_weights

    tokenizer = Tokenizer.from_pretrained(tiny)
    model = load_model(tiny, kind="mlm")
    examples = [TextExample((f"where does {NAMES[i % 4]} live ?", f"{NAMES[i % 4]} lives in {CITIES[i % 4]}"), None,
                            f"row {i}") for i in range(16)]
    first, second = (SpladeTask(tokenizer, 16, batch_size=2, flops_warmup=8) for _ in range(2))
    features = first.features(examples)
    run = FeatureBatches(first, features, 2, seed=0)
    for _ in range(3):
        run.next_step(0, 1, 1)
    resumed = FeatureBatches(second, features, 2, seed=0)
    resumed.load_state_dict(run.state_dict())
    pieces, resumed_pieces = run.next_step(0, 1, 2), resumed.next_step(0, 1, 2)
    assert first.step == second.step == 4 and len(pieces) == 2
    with torch.no_grad():
        for piece, again in zip(pieces, resumed_pieces):
            documents = model_weights(model, piece["1"])
            expected = (4 / 8) ** 2 * (first.document_flops * flops(documents)
                                       + first.query_flops * flops(model_weights(model, piece["0"])))
            assert_close(first.loss(model, piece)["flops"].total, expected * len(documents))
            assert_close(second.loss(model, again)["flops"].total, expected * len(documents))


def real_logits(model, tokenizer, texts):
    """(tokens, V) logits of the texts' real tokens, in eval mode."""
    rows, _ = tokenizer.encode_rows(texts, None, max_length=16, truncation=True)
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([r.input_ids])).logits[0].float() for r in rows])


@pytest.mark.parametrize("gather_rows", [1 << 16, 7])  # one gather, and many (a batch's pairs in pieces)
def test_the_sparse_heads_gradients_are_autograds_through_the_decoder(tiny, gather_rows, monkeypatch):
    """SparseHead's backward gathers the (row, term) pairs that weigh something instead of multiplying a (B, T, V)
    gradient by the decoder: every parameter's gradient must equal autograd's through the model's logits and the
    plain formula, padding included."""
    from encoderlab.checkpoint import load_model
    from encoderlab.tasks import splade

    monkeypatch.setattr(splade, "GATHER_ROWS", gather_rows)
    tokenizer = Tokenizer.from_pretrained(tiny)
    model = load_model(tiny, kind="mlm").eval()
    texts = [f"{NAMES[i % 4]} lives in {CITIES[i % 4]} {FILLER[i % 12]}" * (1 + i % 3) for i in range(5)]
    batch = splade.pad_features([{"input_ids": r.input_ids, "token_type_ids": r.token_type_ids} for r in
                                 tokenizer.encode_rows(texts, None, max_length=24, truncation=True)[0]],
                                tokenizer.pad_id)
    upstream = torch.randn(len(texts), model.config.vocab_size, generator=torch.Generator().manual_seed(0))

    def grads(weigh) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        pooled = weigh()
        (pooled * upstream).sum().backward()
        return pooled.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    mask = batch["attention_mask"][:, :, None]
    plain, expected = grads(lambda: (torch.log1p(torch.relu(model(batch["input_ids"], batch["attention_mask"],
                                                                  batch["token_type_ids"]).logits)) * mask).amax(1))
    pooled, got = grads(lambda: splade.model_weights(model, batch))
    assert_close(pooled, plain)
    assert got.keys() == expected.keys() and "mlm.bias" in got
    for name in expected:
        assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_start_shift_leaves_the_median_token_k_positive_logits_and_the_masked_lm_as_it_was(tiny):
    """A random head has about half its logits above 0 (dense first vectors); lowered by the start shift, the
    median token of the sample has `start_terms` of them (K - 1 or K: its K-th is at 0), every logit moved by one
    constant, so the masked LM's distribution is the same; the task records the shift."""
    from encoderlab.checkpoint import load_model
    from encoderlab.tasks.splade import shift_to_sparse_start

    tokenizer = Tokenizer.from_pretrained(tiny)
    model = load_model(tiny, kind="mlm")
    documents = [f"{NAMES[i % 4]} lives in {CITIES[i % 4]} {FILLER[i % 12]}" for i in range(6)]
    before = real_logits(model, tokenizer, documents)
    assert float((before > 0).sum(-1).float().median()) > 3
    task = SpladeTask(tokenizer, 16, start_terms=3, documents=documents)
    shift_to_sparse_start(model, task)
    after = real_logits(model, tokenizer, documents)
    assert task.logit_shift > 0 and task.info()["logit_shift"] == round(task.logit_shift, 4)
    assert_close(after, before - task.logit_shift)
    assert_close(after.log_softmax(-1), before.log_softmax(-1))
    assert int((after > 0).sum(-1).median()) in (2, 3)


def test_the_start_sample_is_spread_through_the_training_file(tiny):
    """A file whose first rows are all alike does not place the shift alone: the sample reaches its end; a file of
    fewer documents than the sample gives them all."""
    tokenizer = Tokenizer.from_pretrained(tiny)
    documents = ["the same first row"] * 40 + [f"{NAMES[i % 4]} lives in {CITIES[i % 4]}" for i in range(40)]
    sample = SpladeTask(tokenizer, 16, documents=documents).start_sample
    assert len(sample) == START_SAMPLE and sample[0] == documents[0]
    assert sum(text != "the same first row" for text in sample) == START_SAMPLE // 2  # half the sample: the later half
    assert SpladeTask(tokenizer, 16, documents=documents[40:45]).start_sample == documents[40:45]


def test_the_start_shift_never_raises_the_logits_and_zero_terms_leave_the_head(tiny):
    """A head already sparser than asked (a trained SPLADE continued) and --start-terms 0 are left as they are."""
    from encoderlab.checkpoint import load_model
    from encoderlab.tasks.splade import shift_to_sparse_start

    tokenizer = Tokenizer.from_pretrained(tiny)
    documents = [f"{NAMES[i % 4]} lives in {CITIES[i % 4]}" for i in range(4)]
    for terms, bias in ((3, -100.0), (0, None)):
        model = load_model(tiny, kind="mlm")
        if bias is not None:
            with torch.no_grad():
                model.mlm.bias.fill_(bias)
        kept = model.mlm.bias.detach().clone()
        task = SpladeTask(tokenizer, 16, start_terms=terms, documents=documents)
        shift_to_sparse_start(model, task)
        assert task.logit_shift == 0 and torch.equal(model.mlm.bias, kept)


# ---- bad input ----------------------------------------------------------------------------------------------
def test_a_checkpoint_without_an_mlm_head_is_refused(tmp_path, capsys):
    train = triplets(tmp_path / "train.tsv", 4)
    assert main(["finetune", "splade", "--model", "minilm", "--train", str(train), "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "masked-LM" in err and "minilm" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_df_flops_share_outside_0_to_1_is_refused(tiny, tmp_path, capsys):
    train = triplets(tmp_path / "train.tsv", 4)
    for share in ("0", "1.5"):
        assert main(["finetune", "splade", "--model", str(tiny), "--train", str(train), "--out",
                     str(tmp_path / "run"), "--df-flops", share]) == 2
        err = capsys.readouterr().err
        assert "--df-flops" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_negative_start_terms_is_refused(tiny, tmp_path, capsys):
    train = triplets(tmp_path / "train.tsv", 4)
    assert main(["finetune", "splade", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "run"),
                 "--start-terms", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--start-terms -1" in err and err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_inference_free_runs_cannot_resume(tiny, tmp_path, capsys):
    train = triplets(tmp_path / "train.tsv", 4)
    assert main(["finetune", "splade", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "run"),
                 "--inference-free", "--resume"]) == 2
    assert "--inference-free" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_embed_sparse_refuses_a_dense_model_and_dense_flags(tiny, capsys):
    assert main(["embed", "--sparse", "--model", "minilm", "a text"]) == 2
    assert "not a SPLADE model" in capsys.readouterr().err
    assert main(["embed", "--sparse", "--model", str(tiny), "--dimensions", "8", "a text"]) == 2
    assert "--dimensions" in capsys.readouterr().err
    assert main(["embed", "--model", str(tiny), "a text"]) == 2  # dense embed: --input and --out, no TEXT
    assert "--sparse" in capsys.readouterr().err
