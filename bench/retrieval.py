"""Retrieval end to end on SQuAD as a BEIR folder (scripts/squad_beir.py): `encoderlab index` + exact dense search,
BM25 and hybrid (reciprocal rank fusion), against the peers run directly on the same folder.

Each held-out question (qrels/test.tsv, the articles bench/rerank.py never trains on) must find the paragraph it was
written about among every paragraph of part A (1,545). Figures, all scored by pytrec_eval:
- ours: minilm indexed by encoderlab.Index (the Embed pipeline, shards), searched exactly; BM25 (bm25s inside the
  index); hybrid, RRF k=60 over each one's top 100;
- the peers: sentence-transformers' encode of the same `title + " " + text` (BEIR's dense join) and the same questions,
  exact cosine, top 100; bm25s run directly (bm25s.tokenize(stopwords="en") + BM25().retrieve);
- documents/s of building the dense index against the Embed pipeline's embed of the same texts (best of 2 each).
Goals: dense and BM25 nDCG@10 within 0.002 of their peers; hybrid at least 1 point above the better of the two;
indexing at 0.95x embed's documents/s or better.

    python bench/retrieval.py            # all of part A: 1,545 paragraphs, 2,933 held-out questions (a few minutes)
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
from rerank import SQUAD  # noqa: E402
from squad_beir import squad_to_beir  # noqa: E402

from encoderlab.checkpoint import resolve_model_path  # noqa: E402
from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.retrieval.corpus import read_documents, read_qrels, read_queries  # noqa: E402
from encoderlab.retrieval.evaluation import BeirFolder, evaluate_index  # noqa: E402
from encoderlab.retrieval.index import Index  # noqa: E402
from encoderlab.retrieval.metrics import evaluate  # noqa: E402

DOCUMENTS = {"full": None, "quick": 100, "smoke": 60}  # corpus paragraphs kept (None: all)
DEPTH = 100


def subset(data: Path, out: Path, documents: int | None) -> BeirFolder:
    """The BEIR folder cut to its first `documents` documents and the test questions about them."""
    if documents is None:
        return BeirFolder.of(data)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    lines = (data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:documents]
    kept = {json.loads(line)["_id"] for line in lines}
    (out / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    qrels = [line for line in (data / "qrels" / "test.tsv").read_text().splitlines()[1:] if line.split()[1] in kept]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
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
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\td{i}\t1\n" for i in range(len(docs))))
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
        for name in ("dense", "bm25", "hybrid"):
            started = time.perf_counter()
            result, run = evaluate_index(index, data, DEPTH, mode=name)
            figures[name] = result["metrics"] | {"seconds": round(time.perf_counter() - started, 1)}
            assert abs(evaluate(qrels, run)["ndcg_at_10"] - ndcg(qrels, run)) < 1e-9  # one scorer, two callers
        figures["peers"] = peers(model, data, qrels, queries)
    peer = figures["peers"]
    dense, lexical, hybrid = (figures[n]["ndcg_at_10"] for n in ("dense", "bm25", "hybrid"))
    goals = [goal("dense nDCG@10 minus sentence-transformers + exact cosine's (absolute)",
                  abs(dense - peer["sentence_transformers_dense_ndcg_at_10"]), 0.002, at_most=True),
             goal("BM25 nDCG@10 minus bm25s run directly (absolute)", abs(lexical - peer["bm25s_ndcg_at_10"]), 0.002,
                  at_most=True),
             goal("hybrid nDCG@10 minus the better of dense and BM25 (points)", 100 * (hybrid - max(dense, lexical)),
                  1.0),
             goal("index documents/s over embed's on the same texts", figures["index_documents_per_second"]
                  / figures["embed_documents_per_second"], 0.95)]
    path = write_results(args, "retrieval", figures, goals)
    for name in ("dense", "bm25", "hybrid"):
        print(f"{name:<7}" + "  ".join(f"{k} {v:.4f}" for k, v in figures[name].items() if k != "seconds"))
    print(f"peers  {peer}")
    for row in goals:
        print(f"{'met ' if row['met'] else 'MISS'} {row['what']}: {row['value']} (target {row['target']})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
