"""`encoderlab benchmark beir`: one embedder scored on every BEIR set of a folder (Thakur et al. 2021,
arXiv:2104.08663), dense, BM25 and hybrid side by side, and the mean over the sets (BEIR's own summary is each set's nDCG@10 and their
plain mean, Table 2 of the paper).

A set is a folder holding corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv: --data itself, or each folder under it
that holds one of those (CQADupStack's sub-forums count as sets of their own). Each set is indexed on the fly into a
temporary folder and scored by encoderlab.retrieval.evaluation (the code behind `evaluate retrieval`), so a set's
figures equal `evaluate retrieval --model M --data SET --mode MODE`'s. OUT/SET/result.json holds a finished set: a
rerun with the same settings skips it (the unit of resuming); OUT/results.json and OUT/results.md hold the table.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from encoderlab.tasks.pipeline import Pipeline
from encoderlab.errors import InputError
from encoderlab.io import atomic_write_text
from encoderlab.retrieval.corpus import read_qrels, read_queries, scan
from encoderlab.retrieval.evaluation import BeirFolder, evaluate_index
from encoderlab.retrieval.index import Index

BEIR_FILES = ("corpus.jsonl", "queries.jsonl", "qrels")
SHOWN = {"ndcg_at_10": "nDCG@10", "mrr_at_10": "MRR@10", "recall_at_100": "R@100"}  # the table's columns
RESULT = "result.json"
SUMMARY = ("results.json", "results.md")


def find_sets(data: str | os.PathLike, split: str = "test") -> dict[str, BeirFolder]:
    """{name: files} of every BEIR set at or under `data` (name "." for data itself), by name; InputError for a
    folder with no set, or a set missing a file (BeirFolder.of names it)."""
    root = Path(data)
    if not root.is_dir():
        raise InputError(f"--data {data}: {'no such folder' if not root.exists() else 'is a file'}, expected a "
                         f"folder of BEIR sets")
    folders = {p.parent for name in BEIR_FILES for p in root.rglob(name)}
    if not folders:
        raise InputError(f"--data {data}: no BEIR set (expected corpus.jsonl, queries.jsonl and qrels/{split}.tsv "
                         f"in it or in its subfolders)")
    return {folder.relative_to(root).as_posix(): BeirFolder.of(folder, split) for folder in sorted(folders)}


def check_sets(sets: dict[str, BeirFolder]) -> None:
    """Read every set's corpus, queries and qrels once (a bad line or id refused) before a model loads."""
    for files in sets.values():
        scan(files.corpus)
        queries = read_queries(files.queries)
        missing = [q for q in read_qrels(files.qrels) if q not in queries]
        if missing:
            raise InputError(f"{files.qrels}: {len(missing)} judged queries are not in {files.queries} (first: "
                             f"{missing[0]!r})")


def score_set(model: str, embedder: Pipeline, files: BeirFolder, modes: list[str], search: dict[str, Any],
              progress: bool) -> dict[str, Any]:
    """One set indexed into a temporary folder and scored in each mode: {"documents", "queries", "modes": {mode:
    metrics}, "seconds"}."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="encoderlab-beir-") as scratch:
        index = Index.build(model, files.corpus, Path(scratch) / "index", embedder=embedder,
                            bm25=modes != ["dense"], progress=progress)
        scored = {mode: evaluate_index(index, files, mode=mode, **search)[0] for mode in modes}
    first = next(iter(scored.values()))
    return {"documents": first["documents"], "queries": first["queries"],
            "modes": {mode: result["metrics"] for mode, result in scored.items()},
            "seconds": round(time.perf_counter() - started, 1)}


def run_sets(sets: dict[str, BeirFolder], out: Path, settings: dict[str, Any],
             score: Callable[[BeirFolder], dict[str, Any]], redo: bool) -> list[dict[str, Any]]:
    """Each set's result, from OUT/SET/result.json where a run with the same settings finished it (unless redo),
    else scored and written there."""
    results = []
    for name, files in sets.items():
        done = out / name / RESULT
        if done.is_file() and not redo:
            before = json.loads(done.read_text(encoding="utf-8"))
            if before.get("settings") == settings:
                results.append(before | {"skipped": True})
                continue
        result = {"set": name, "settings": settings} | score(files)
        atomic_write_text(done, json.dumps(result, indent=2) + "\n")
        results.append(result)
    return results


def means(results: list[dict[str, Any]], modes: list[str]) -> dict[str, dict[str, float]]:
    """{mode: {metric: the plain mean over the sets}} (every set weighs the same, as in BEIR's Table 2)."""
    return {mode: {metric: statistics.mean(r["modes"][mode][metric] for r in results)
                   for metric in results[0]["modes"][mode]} for mode in modes}


def summarise(results: list[dict[str, Any]], settings: dict[str, Any], out: Path, header: dict[str, Any]) -> dict:
    """The summary (header, settings, each set, the means), written to OUT/results.json and OUT/results.md."""
    summary = header | {"settings": settings, "sets": results, "mean": means(results, settings["modes"])}
    atomic_write_text(out / SUMMARY[0], json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out / SUMMARY[1], f"# encoderlab benchmark beir: {settings['model']}\n\n`{header['command']}` "
                      f"on {header['machine']}\n\n{table(summary)}\n")
    return summary


def table(summary: dict[str, Any]) -> str:
    """A markdown table: one row per set and mode, then the mean of each mode over the sets."""
    lines = ["| set | mode | " + " | ".join(SHOWN.values()) + " | documents | queries |",
             "|---|---|" + "---|" * (len(SHOWN) + 2)]
    for r in summary["sets"]:
        lines += [f"| {r['set']} | {mode} | " + " | ".join(f"{m[k]:.4f}" for k in SHOWN) +
                  f" | {r['documents']} | {r['queries']} |" for mode, m in r["modes"].items()]
    count = len(summary["sets"])
    lines += [f"| mean of {count} | {mode} | " + " | ".join(f"{m[k]:.4f}" for k in SHOWN) + " | | |"
              for mode, m in summary["mean"].items()]
    return "\n".join(lines)
