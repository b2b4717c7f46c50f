"""Scoring an index on a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv; Thakur et al. 2021): search every
judged query, then encoderlab.retrieval.metrics over the run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from encoderlab.errors import InputError
from encoderlab.retrieval.corpus import read_qrels, read_queries
from encoderlab.retrieval.index import Index
from encoderlab.retrieval.metrics import Run, evaluate, unknown_ids

RUN_DEPTH = 100  # hits per query in the run: Recall@100 and MAP@100 read that deep


@dataclass(frozen=True)
class BeirFolder:
    """The files of a BEIR data set folder for one split."""

    corpus: Path
    queries: Path
    qrels: Path

    @classmethod
    def of(cls, folder: str | os.PathLike, split: str = "test") -> BeirFolder:
        """The folder's files; InputError naming the first one missing."""
        folder = Path(folder)
        found = cls(folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / f"{split}.tsv")
        for path in (found.corpus, found.queries, found.qrels):
            if not path.is_file():
                raise InputError(f"--data {folder}: no {path.relative_to(folder)} (expected BEIR's layout: "
                                 f"corpus.jsonl, queries.jsonl, qrels/{split}.tsv)")
        return found


def run_queries(index: Index, queries: dict[str, str], depth: int = RUN_DEPTH, **search: Any) -> Run:
    """{query id: {doc id: score}}: each query's best `depth` hits (`search`: Index.search's options)."""
    ids = list(queries)
    results = index.search([queries[q] for q in ids], top_k=depth, **search)
    return {q: {hit["id"]: hit["score"] for hit in hits} for q, hits in zip(ids, results)}


def evaluate_index(index: Index, data: BeirFolder, depth: int = RUN_DEPTH, ignore_identical_ids: bool = True,
                   **search: Any) -> tuple[dict[str, Any], Run]:
    """The metrics of the index on the judged queries of a BEIR split, and the run they were computed on."""
    qrels = read_qrels(data.qrels)
    queries = read_queries(data.queries)
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise InputError(f"{data.qrels}: {len(missing)} judged queries are not in {data.queries} (first: "
                         f"{missing[0]!r})")
    unknown = unknown_ids(qrels, set(index.ids))
    run = run_queries(index, {q: queries[q] for q in qrels}, depth, **search)
    metrics = evaluate(qrels, run, ignore_identical_ids)
    return {"metrics": metrics, "queries": len(qrels), "documents": len(index), "unknown_judgements": unknown}, run
