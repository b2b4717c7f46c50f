"""Retrieval metrics over a run (query id -> {doc id: score}) against qrels (query id -> {doc id: relevance}),
computed by pytrec_eval (Van Gysel and de Rijke 2018), trec_eval's own code: nDCG@10 with graded gains (trec_eval's
ndcg_cut: gain = relevance, log2 discount), MAP@100, Recall@10/100, and MRR@10 (trec_eval's recip_rank on the run
cut to its best 10, as BEIR's mrr@10 counts it).

As BEIR's EvaluateRetrieval.evaluate (beir/retrieval/evaluation.py, ignore_identical_ids=True by default), a hit whose
doc id equals its query id is dropped first (on corpora where queries are documents too, e.g. Quora, ArguAna), and
the measures are averaged over the queries that have judgements; a judged query the run missed counts 0. The run
format is TREC's: `qid Q0 docid rank score tag` a line."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytrec_eval

from encoderlab.errors import InputError
from encoderlab.io import atomic_write_text

log = logging.getLogger(__name__)
MEASURES = {"ndcg_cut.10": "ndcg_at_10", "map_cut.100": "map_at_100", "recall.10": "recall_at_10",
            "recall.100": "recall_at_100"}
Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


def evaluate(qrels: Qrels, run: Run, ignore_identical_ids: bool = True) -> dict[str, float]:
    """nDCG@10, MRR@10, Recall@10/100 and MAP@100 of a run, averaged over the judged queries."""
    if ignore_identical_ids:
        run = {q: {d: s for d, s in hits.items() if d != q} for q, hits in run.items()}
    run = {q: hits for q, hits in run.items() if q in qrels}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(MEASURES)).evaluate(run)
    top10 = {q: dict(sorted(hits.items(), key=lambda item: (-item[1], item[0]))[:10]) for q, hits in run.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    n = len(qrels)
    out = {name: sum(row[measure.replace(".", "_")] for row in per_query.values()) / n
           for measure, name in MEASURES.items()}
    return {"ndcg_at_10": out["ndcg_at_10"], "mrr_at_10": sum(r["recip_rank"] for r in reciprocal.values()) / n,
            "recall_at_10": out["recall_at_10"], "recall_at_100": out["recall_at_100"],
            "map_at_100": out["map_at_100"]}


def unknown_ids(qrels: Qrels, known: set[str]) -> int:
    """How many judgements name a document the index lacks (logged as a warning): they can never be found."""
    count = sum(doc not in known for docs in qrels.values() for doc in docs)
    if count:
        log.warning("%d of %d relevance judgements name documents that are not in the index: they count as misses",
                    count, sum(map(len, qrels.values())))
    return count


def run_lines(run: Run, tag: str) -> list[str]:
    """TREC run lines, each query's hits best first."""
    lines = []
    for query, hits in run.items():
        ranked = sorted(hits.items(), key=lambda item: -item[1])
        lines += [f"{query} Q0 {doc} {rank} {score:.6f} {tag}" for rank, (doc, score) in enumerate(ranked, 1)]
    return lines


def write_run(path: str | os.PathLike, run: Run, tag: str) -> None:
    """Write a TREC run file atomically."""
    atomic_write_text(Path(path), "\n".join(run_lines(run, tag)) + "\n")


def read_run(path: str | os.PathLike) -> Run:
    """A TREC run file: {query id: {doc id: score}}."""
    run: Run = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if len(fields) != 6:
            raise InputError(f"{path}:{number}: expected `qid Q0 docid rank score tag`, got {line[:100]!r}")
        run.setdefault(fields[0], {})[fields[2]] = float(fields[4])
    return run
