"""`encoderlab benchmark beir` (encoderlab.retrieval.beir): each set's figures equal `evaluate retrieval`'s on that
set, the mean is the plain mean over the sets, a rerun skips finished sets, and bad input exits 2 with one line,
writing nothing."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from test_retrieval import WORDS, run_cli, tiny_folder, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
MODES = ("dense", "bm25", "hybrid")


def write_set(folder: Path, count: int, seed: int) -> Path:
    """A BEIR set: `count` random documents, each judged relevant to one query of three of its words."""
    (folder / "qrels").mkdir(parents=True)
    write_corpus(folder / "corpus.jsonl", count, seed)
    rng = random.Random(seed)
    texts = [json.loads(line)["text"].split() for line in (folder / "corpus.jsonl").read_text().splitlines()]
    (folder / "queries.jsonl").write_text("".join(
        json.dumps({"_id": f"q{i}", "text": " ".join(rng.sample(t, min(3, len(t))) or WORDS[:1])}) + "\n"
        for i, t in enumerate(texts)))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\td{i}\t1\n" for i in range(count)))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> Path:
    """Two sets of different sizes (their mean differs from a pooled score)."""
    root = tmp_path_factory.mktemp("beir")
    write_set(root / "alpha", 12, 1)
    write_set(root / "beta", 20, 2)
    return root


@pytest.fixture(scope="module")
def benchmarked(tiny, sets, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("out") / "bench"
    code = run_beir("--model", tiny, "--data", sets, "--out", out, "--json")
    assert code == 0
    return out, json.loads((out / "results.json").read_text())


def run_beir(*args) -> int:
    """`encoderlab benchmark beir ARGS --no-progress`'s exit code."""
    from encoderlab.cli import main

    return main(["benchmark", "beir", *map(str, args), "--no-progress"])


def test_each_set_equals_evaluate_retrieval_and_the_mean_is_their_mean(benchmarked, tiny, sets, capsys):
    _, summary = benchmarked
    assert [r["set"] for r in summary["sets"]] == ["alpha", "beta"]
    for mode in MODES:
        alone = []
        for name in ("alpha", "beta"):
            code, out, _ = run_cli(capsys, "evaluate", "retrieval", "--model", tiny, "--data", sets / name,
                                   "--mode", mode, "--json", "--no-progress")
            assert code == 0
            alone.append(json.loads(out)["metrics"])
        by_set = [r["modes"][mode] for r in summary["sets"]]
        assert by_set == [pytest.approx(m, abs=1e-9) for m in alone]
        for metric in ("ndcg_at_10", "mrr_at_10", "recall_at_100"):
            assert summary["mean"][mode][metric] == pytest.approx(statistics.mean(m[metric] for m in alone))


def test_the_table_shows_every_set_and_the_means(benchmarked):
    out, summary = benchmarked
    table = (out / "results.md").read_text()
    assert "| alpha | hybrid |" in table and f"{summary['mean']['bm25']['mrr_at_10']:.4f}" in table
    assert table.count("| mean of 2 |") == 3


def test_a_rerun_skips_finished_sets_and_a_new_setting_recomputes(benchmarked, tiny, sets):
    out, summary = benchmarked
    assert run_beir("--model", tiny, "--data", sets, "--out", out) == 0
    again = json.loads((out / "results.json").read_text())
    assert all(r.get("skipped") for r in again["sets"]) and again["mean"] == summary["mean"]
    assert run_beir("--model", tiny, "--data", sets, "--out", out, "--modes", "bm25") == 0
    bm25 = json.loads((out / "results.json").read_text())
    assert not any(r.get("skipped") for r in bm25["sets"]) and list(bm25["mean"]) == ["bm25"]
    assert bm25["mean"]["bm25"] == summary["mean"]["bm25"]


def test_a_folder_that_is_one_set_is_scored_alone(tiny, sets, tmp_path):
    assert run_beir("--model", tiny, "--data", sets / "beta", "--out", tmp_path / "out", "--modes", "bm25") == 0
    summary = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["set"] for r in summary["sets"]] == ["."] and summary["sets"][0]["queries"] == 20


@pytest.mark.parametrize("case", ["empty", "no_qrels", "bad_mode", "foreign_out"])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, tiny, sets, tmp_path, capsys):
    data, out, extra = sets, tmp_path / "out", []
    if case == "empty":
        data = tmp_path / "nothing"
        (data / "sub").mkdir(parents=True)
    elif case == "no_qrels":
        data = tmp_path / "data"
        write_set(data / "good", 5, 3)
        write_set(data / "bad", 5, 4)
        (data / "bad" / "qrels" / "test.tsv").unlink()
    elif case == "bad_mode":
        extra = ["--modes", "dense,sparse"]
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    code = run_beir("--model", tiny, "--data", data, "--out", out, *extra)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    expected = {"empty": "no BEIR set", "no_qrels": "qrels/test.tsv", "bad_mode": "--modes",
                "foreign_out": "did not make"}[case]
    assert expected in err
    assert sorted(p.name for p in out.iterdir()) == (["notes.txt"] if case == "foreign_out" else []) \
        if out.exists() else True
