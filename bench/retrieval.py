"""Retrieval end to end on SQuAD as a BEIR folder (scripts/squad_beir.py): `encoderlab index` + exact dense search,
BM25 and hybrid, against the peers run directly on the same folder; the hybrid fusion tuned on the training
questions; optionally a cross-encoder reranking the dense top 100.

Each held-out question (qrels/test.tsv, the articles bench/rerank.py never trains on) must find the paragraph it was
written about among every paragraph of part A (1,545). Figures, all scored by pytrec_eval:
- ours: minilm indexed by encoderlab.Index (the Embed pipeline, shards), searched exactly; BM25 (bm25s inside the
  index); hybrid with Index's default fusion (a weighted sum of z-scores, dense 0.55), and RRF k=60 (the old default),
  over each one's top 100;
- the fusion tuned: every setting of grid() (RRF's k, the weighted sum's alpha under min-max and z-score, the depth)
  scored by nDCG@10 on qrels/train.tsv only (5,190 questions of the other articles); the best one then scored on
  qrels/test.tsv, which takes no part in the choice;
- with --reranker DIR (bench/rerank.py --save DIR): the dense top 100 over the whole corpus reordered by that
  cross-encoder, against dense alone, on a fixed random subset of the held-out questions, and pairs reranked per second;
- the peers: sentence-transformers' encode of the same `title + " " + text` (BEIR's dense join) and the same questions,
  exact cosine, top 100; bm25s run directly (bm25s.tokenize(stopwords="en") + BM25().retrieve);
- documents/s of building the dense index against the Embed pipeline's embed of the same texts (best of 2 each).
Goals: dense and BM25 nDCG@10 within 0.002 of their peers; hybrid (the default, and this run's pick on train) at
least 1 point above the better of the two; indexing at 0.95x embed's documents/s or better; reranking the dense top
100 at least 3 points of MRR@10 above dense alone.

    python bench/retrieval.py            # all of part A: 1,545 paragraphs, 2,933 held-out questions (a few minutes)
    python bench/retrieval.py --reranker runs/cross --rerank-questions 500   # ... and the cross-encoder on 500
    python bench/retrieval.py --quick    # 100 paragraphs and their held-out questions: that it runs
    python bench/retrieval.py --smoke    # a tiny random model on a synthetic corpus (make test)

Data: ../shared/data/squad_v1.1/dev-v1.1.part-a.json. Run with OMP_NUM_THREADS=1 on a shared machine.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import bm25s
import numpy as np
import pytrec_eval
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from common import goal, parser, size, tiny_model, write_results  # noqa: E402
from rerank import SIZES, SQUAD  # noqa: E402
from squad_beir import squad_to_beir  # noqa: E402

from encoderlab.checkpoint import resolve_model_path  # noqa: E402
from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.retrieval import fusion  # noqa: E402
from encoderlab.retrieval.corpus import read_documents, read_qrels, read_queries  # noqa: E402
from encoderlab.retrieval.evaluation import BeirFolder, evaluate_index  # noqa: E402
from encoderlab.retrieval.index import Index  # noqa: E402
from encoderlab.retrieval.metrics import Run, evaluate  # noqa: E402

DOCUMENTS = {"full": None, "quick": 100, "smoke": 60}  # corpus paragraphs kept (None: all)
DEPTH = 100
# The fusion grid searched on qrels/train.tsv: RRF's k around the paper's 60 down to 1 (small k trusts the top ranks
# more), the weighted sum's alpha in steps of 0.05 under both normalisations Bruch et al. 2023 compare, and how deep
# each retriever's list goes into the fusion.
# hybrid: Index's default fusion (the one picked on qrels/train); hybrid_rrf_k60: the paper's RRF, the old default
RETRIEVERS = {"dense": {"mode": "dense"}, "bm25": {"mode": "bm25"}, "hybrid": {"mode": "hybrid"},
              "hybrid_rrf_k60": {"mode": "hybrid", "fusion": "rrf", "rrf_k": 60}}
RRF_KS = (1, 2, 5, 10, 20, 30, 60, 100)
ALPHAS = tuple(round(0.05 * i, 2) for i in range(1, 20))
DEPTHS = (10, 20, 50, 100)
RERANK_QUESTIONS = {"full": 500, "quick": 20, "smoke": 8}  # held-out questions whose dense top 100 is reranked
RERANK_TOP = 100
RERANK_MAX_LENGTH = SIZES["full"][4]  # tokens per pair: what bench/rerank.py trains the cross-encoder at


def subset(data: Path, out: Path, documents: int | None) -> BeirFolder:
    """The BEIR folder cut to its first `documents` documents and the test questions about them."""
    if documents is None:
        return BeirFolder.of(data)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    lines = (data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:documents]
    kept = {json.loads(line)["_id"] for line in lines}
    (out / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for split in ("test", "train"):
        qrels = [line for line in (data / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
                 if line.split()[1] in kept]
        (out / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    (out / "queries.jsonl").write_bytes((data / "queries.jsonl").read_bytes())
    return BeirFolder.of(out)


def synthetic(out: Path) -> Path:
    """A BEIR folder of random-word documents, each with one query of three of its words (--smoke)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    (out / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": f"t{i}", "text": " ".join(rng.choices(words, k=30))} for i in range(80)]
    queries = [{"_id": f"q{i}", "text": " ".join(rng.sample(d["text"].split(), 3))} for i, d in enumerate(docs)]
    (out / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (out / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in (("test", range(0, len(docs), 2)), ("train", range(1, len(docs), 2))):
        (out / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
            f"q{i}\td{i}\t1\n" for i in rows))
    return out


def ndcg(qrels: dict, run: dict) -> float:
    """Mean nDCG@10 over the judged queries, by pytrec_eval (the peers' scoring, apart from ours)."""
    rows = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return sum(row["ndcg_cut_10"] for row in rows.values()) / len(qrels)


def top_run(ids: list[str], qids: list[str], scores: np.ndarray, positions: np.ndarray) -> dict:
    """{query: {doc: score}} from (Q, k) scores and positions."""
    return {q: {ids[int(p)]: float(s) for s, p in zip(row_s, row_p)}
            for q, row_s, row_p in zip(qids, scores, positions)}


def peers(model: str, data: BeirFolder, qrels: dict, queries: dict) -> dict:
    """sentence-transformers + exact cosine, and bm25s, run directly: nDCG@10 of each."""
    from sentence_transformers import SentenceTransformer

    documents = list(read_documents(data.corpus))
    ids, texts = [d.id for d in documents], [(d.title + " " + d.text).strip() for d in documents]
    qids = list(qrels)
    encoder = SentenceTransformer(str(resolve_model_path(model)), device="cpu")
    started = time.perf_counter()
    vectors = encoder.encode(texts, batch_size=32, convert_to_tensor=True, normalize_embeddings=True)
    seconds = time.perf_counter() - started
    asked = encoder.encode([queries[q] for q in qids], batch_size=32, convert_to_tensor=True,
                           normalize_embeddings=True)
    top = (asked @ vectors.T).topk(min(DEPTH, len(ids)), dim=1)
    dense = ndcg(qrels, top_run(ids, qids, top.values.numpy(), top.indices.numpy()))
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    positions, scores = retriever.retrieve(bm25s.tokenize([queries[q] for q in qids], stopwords="en",
                                                          show_progress=False), k=min(DEPTH, len(ids)),
                                           show_progress=False)
    return {"sentence_transformers_dense_ndcg_at_10": round(dense, 4),
            "bm25s_ndcg_at_10": round(ndcg(qrels, top_run(ids, qids, scores, positions)), 4),
            "sentence_transformers_documents_per_second": round(len(texts) / seconds, 1)}


def grid() -> list[dict]:
    """Every fusion setting tried: RRF's k, the weighted sum's alpha and normalisation, each at every depth."""
    fusions = [{"fusion": "rrf", "k": k} for k in RRF_KS] + [
        {"fusion": "weighted", "alpha": a, "normalisation": n} for n in fusion.NORMALISATIONS for a in ALPHAS]
    return [f | {"depth": d} for f in fusions for d in DEPTHS]


def fuse(setting: dict, dense: dict, lexical: dict, cut: int = DEPTH) -> Run:
    """{query: {doc: fused score}}: each query's dense and BM25 lists (best first), cut to the setting's depth, fused
    by the same functions Index.rank calls; the best `cut` of each query kept."""
    out = {}
    for q in dense:
        a, b = dense[q][:setting["depth"]], lexical[q][:setting["depth"]]
        out[q] = dict(fusion.fuse(a, b, setting["fusion"], setting.get("alpha", 0.0), setting.get("k", 0),
                                  setting.get("normalisation", "min-max"))[:cut])
    return out


def ranked(index: Index, queries: dict, qids: list[str], mode: str) -> dict:
    """{query: [(doc, score)] best first}: the index's DEPTH best of `mode` for each query id."""
    return dict(zip(qids, index.rank([queries[q] for q in qids], DEPTH, mode)))


def tune_fusion(index: Index, data: BeirFolder, queries: dict) -> dict:
    """Every grid() setting scored by nDCG@10 on qrels/train.tsv only; the best one (and RRF k=60's figure there),
    then scored on qrels/test.tsv: the test questions take no part in the choice."""
    train, test = read_qrels(data.qrels.with_name("train.tsv")), read_qrels(data.qrels)
    lists = {mode: ranked(index, queries, [*train, *test], mode) for mode in ("dense", "bm25")}
    on = lambda qrels: {m: {q: lists[m][q] for q in qrels} for m in lists}  # noqa: E731
    on_train = on(train)
    # nDCG@10 reads each query's best 10 only: the fused runs are cut there (the grid is 184 settings x 5,190 questions)
    scores = [(ndcg(train, fuse(s, on_train["dense"], on_train["bm25"], 10)), s) for s in grid()]
    best_score, best = max(scores, key=lambda row: row[0])
    default = next(score for score, s in scores if s == {"fusion": "rrf", "k": 60, "depth": DEPTH})
    on_test = on(test)
    return {"grid_size": len(scores), "train_questions": len(train), "picked_on_train": best,
            "picked_is_the_default": best == {"fusion": fusion.DEFAULT_FUSION, "alpha": fusion.DEFAULT_ALPHA,
                                              "normalisation": fusion.DEFAULT_NORMALISATION, "depth": DEPTH},
            "train_ndcg_at_10": round(best_score, 4), "train_ndcg_at_10_of_rrf_k60": round(default, 4),
            "train_ndcg_at_10_dense": round(ndcg(train, dict_run(on_train["dense"])), 4),
            "train_ndcg_at_10_bm25": round(ndcg(train, dict_run(on_train["bm25"])), 4),
            "test": evaluate(test, fuse(best, on_test["dense"], on_test["bm25"])),
            "best_per_family_on_train": {name: max((row for row in scores if family(row[1]) == name),
                                                   key=lambda row: row[0])[1] | {"train_ndcg_at_10": round(max(
                                                       row[0] for row in scores if family(row[1]) == name), 4)}
                                         for name in ("rrf", "weighted min-max", "weighted z-score")}}


def family(setting: dict) -> str:
    """rrf, weighted min-max or weighted z-score."""
    return setting["fusion"] if setting["fusion"] == "rrf" else f"weighted {setting['normalisation']}"


def dict_run(lists: dict) -> Run:
    """{query: [(doc, score)]} as a run."""
    return {q: dict(hits) for q, hits in lists.items()}


def rerank_corpus(index: Index, data: BeirFolder, queries: dict, reranker: str, count: int) -> dict:
    """Dense top RERANK_TOP over the whole corpus, reordered by the cross-encoder, against dense alone, on a fixed
    random subset of `count` held-out questions; the pairs reranked per second."""
    qrels = read_qrels(data.qrels)
    picked = sorted(random.Random(0).sample(sorted(qrels), min(count, len(qrels))))
    subset_qrels = {q: qrels[q] for q in picked}
    texts = [queries[q] for q in picked]
    first = index.rank(texts, RERANK_TOP, "dense")
    cross = pipeline("rerank", reranker, max_length=RERANK_MAX_LENGTH)
    started = time.perf_counter()
    reordered = index.rerank(cross, texts, first, RERANK_TOP)
    seconds = time.perf_counter() - started
    pairs = sum(min(len(hits), RERANK_TOP) for hits in first)
    return {"reranker": str(reranker), "questions": len(picked), "of_held_out_questions": len(qrels),
            "reranked_top": RERANK_TOP, "max_length": RERANK_MAX_LENGTH,
            "dense": evaluate(subset_qrels, dict_run(dict(zip(picked, first)))),
            "dense_reranked": evaluate(subset_qrels, dict_run(dict(zip(picked, reordered)))),
            "seconds": round(seconds, 1), "pairs_per_second": round(pairs / seconds, 1)}


def speeds(model: str, data: BeirFolder, scratch: Path) -> dict:
    """Documents/s of a dense index build and of embed on the same texts, best of 2 each, alternated."""
    texts = [d.joined for d in read_documents(data.corpus)]
    embedder = pipeline("embed", model)
    index_s, embed_s = [], []
    for attempt in range(2):
        started = time.perf_counter()
        embedder.embed(texts)
        embed_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        Index.build(model, data.corpus, scratch / f"speed{attempt}", embedder=embedder, progress=False)
        index_s.append(time.perf_counter() - started)
    return {"index_documents_per_second": round(len(texts) / min(index_s), 1),
            "embed_documents_per_second": round(len(texts) / min(embed_s), 1)}


def main() -> None:
    cli = parser(__doc__, "100 paragraphs and their held-out questions: that it runs, not a measurement")
    cli.add_argument("--reranker", metavar="DIR", help="also rerank the dense top 100 of held-out questions with this "
                     "cross-encoder (bench/rerank.py --save DIR); --smoke: a tiny random one")
    cli.add_argument("--rerank-questions", type=int, metavar="N", help="held-out questions reranked, a fixed random "
                     "subset (default: 500; --quick 20)")
    args = cli.parse_args()
    mode = size(args)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        if mode == "smoke":
            model, data = str(tiny_model(scratch / "tiny")), BeirFolder.of(synthetic(scratch / "beir"))
        elif not SQUAD.is_file():
            raise SystemExit(f"{SQUAD} is absent: this bench needs SQuAD v1.1 part A (run --smoke for the synthetic "
                             f"check)")
        else:
            squad_to_beir(SQUAD, scratch / "squad")
            model, data = "minilm", subset(scratch / "squad", scratch / "subset", DOCUMENTS[mode])
        qrels, queries = read_qrels(data.qrels), read_queries(data.queries)
        figures: dict = {"model": model, "data": "synthetic" if mode == "smoke" else "SQuAD v1.1 part A as BEIR "
                         "(scripts/squad_beir.py), qrels/test.tsv", "threads": torch.get_num_threads()}
        figures |= speeds(model, data, scratch)
        index = Index.build(model, data.corpus, scratch / "index", bm25=True, progress=False)
        figures |= {"documents": len(index), "queries": len(qrels)}
        for name, options in RETRIEVERS.items():
            started = time.perf_counter()
            result, run = evaluate_index(index, data, DEPTH, **options)
            figures[name] = result["metrics"] | {"seconds": round(time.perf_counter() - started, 1)}
            assert abs(evaluate(qrels, run)["ndcg_at_10"] - ndcg(qrels, run)) < 1e-9  # one scorer, two callers
        figures["fusion_tuned_on_train"] = tune_fusion(index, data, queries)
        if args.reranker or mode == "smoke":
            cross = args.reranker or str(tiny_model(scratch / "cross", cross_encoder=True))
            figures["rerank"] = rerank_corpus(index, data, queries, cross,
                                              args.rerank_questions or RERANK_QUESTIONS[mode])
        figures["peers"] = peers(model, data, qrels, queries)
    peer = figures["peers"]
    dense, lexical, hybrid = (figures[n]["ndcg_at_10"] for n in ("dense", "bm25", "hybrid"))
    goals = [goal("dense nDCG@10 minus sentence-transformers + exact cosine's (absolute)",
                  abs(dense - peer["sentence_transformers_dense_ndcg_at_10"]), 0.002, at_most=True),
             goal("BM25 nDCG@10 minus bm25s run directly (absolute)", abs(lexical - peer["bm25s_ndcg_at_10"]), 0.002,
                  at_most=True),
             goal("hybrid (Index's default fusion) nDCG@10 minus the better of dense and BM25 (points)",
                  100 * (hybrid - max(dense, lexical)),
                  1.0),
             goal("index documents/s over embed's on the same texts", figures["index_documents_per_second"]
                  / figures["embed_documents_per_second"], 0.95)]
    tuned = figures["fusion_tuned_on_train"]
    goals.append(goal("hybrid with the fusion picked on qrels/train, nDCG@10 on qrels/test minus the better of dense "
                      "and BM25 (points)", 100 * (tuned["test"]["ndcg_at_10"] - max(dense, lexical)), 1.0))
    if "rerank" in figures:
        rerank = figures["rerank"]
        goals.append(goal(f"dense + the cross-encoder reranking its top {RERANK_TOP} minus dense alone, MRR@10 on "
                          f"{rerank['questions']} held-out questions (points)",
                          100 * (rerank["dense_reranked"]["mrr_at_10"] - rerank["dense"]["mrr_at_10"]), 3.0))
    path = write_results(args, "retrieval", figures, goals)
    for name in RETRIEVERS:
        print(f"{name:<15}" + "  ".join(f"{k} {v:.4f}" for k, v in figures[name].items() if k != "seconds"))
    print(f"peers  {peer}")
    for row in goals:
        print(f"{'met ' if row['met'] else 'MISS'} {row['what']}: {row['value']} (target {row['target']})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
