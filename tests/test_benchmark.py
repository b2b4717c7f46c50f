"""`encoderlab benchmark`: tiny made-up files in every task's exact official format (CoLA without a header, MRPC with a
BOM, MNLI's two dev files, SemEval STS rows with trailing fields, aclImdb folders) run end to end on a tiny model; the
harness's figures equal `finetune` + `evaluate` run by hand with the same recipe and seed; a rerun skips what is done
and refuses another recipe; an interrupted run resumes to the uninterrupted result."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_tasks_finetune import CITIES, NAMES, sentence, tagged, tiny_model  # noqa: F401 (tiny_model: a fixture)

from encoderlab import compare as cmp
from encoderlab.cli import main
from encoderlab.tasks.benchmark import GLUE

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
ROOT = Path(__file__).resolve().parents[1]
FAST = ["--epochs", "1", "--batch-size", "16", "--lr", "1e-3", "--no-progress", "--threads", "1"]
NLI = ["entailment", "neutral", "contradiction"]


def write(path: Path, text: str, bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))


def rows(count: int, make) -> str:
    rng = random.Random(count)
    return "".join(make(i, rng) + "\n" for i in range(count))


# ---- the files, in each task's official format -----------------------------------------------------------------
def glue_task(folder: Path, task: str, count: int, split: str) -> None:
    """FOLDER/<split>.tsv of one GLUE task, with `count` rows, in the columns the official file has."""
    pair = lambda r: f"{sentence(r, 1)}\t{sentence(r, 0)}"  # noqa: E731
    formats = {
        "CoLA": ("", lambda i, r: f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\t{sentence(r, i % 2)}"),
        "SST-2": ("sentence\tlabel\n", lambda i, r: f"{sentence(r, i % 2)}\t{i % 2}"),
        "MRPC": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n",
                 lambda i, r: f"{i % 2}\t{100 + i}\t{200 + i}\t\"{sentence(r, 1)}\" he said\t{sentence(r, i % 2)}"),
        "STS-B": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n",
                  lambda i, r: f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{pair(r)}\t{r.uniform(0, 5):.3f}"),
        "QQP": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n",
                lambda i, r: f"{i}\t{2 * i}\t{2 * i + 1}\t{pair(r)}\t{i % 2}"),
        "QNLI": ("index\tquestion\tsentence\tlabel\n",
                 lambda i, r: f"{i}\t{pair(r)}\t{['entailment', 'not_entailment'][i % 2]}"),
        "RTE": ("index\tsentence1\tsentence2\tlabel\n",
                lambda i, r: f"{i}\t{pair(r)}\t{['entailment', 'not_entailment'][i % 2]}"),
        "WNLI": ("index\tsentence1\tsentence2\tlabel\n", lambda i, r: f"{i}\t{pair(r)}\t{i % 2}")}
    head, make = formats[task]
    write(folder / task / f"{split}.tsv", head + rows(count, make), bom=task == "MRPC")


def mnli(folder: Path) -> None:
    """MNLI's train.tsv and its two dev files, whose columns differ (label1 vs label1..label5)."""
    parses = "sentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse"
    make = lambda labels: lambda i, r: (f"{i}\t{i}\t{i}e\tfiction\t( a )\t( b )\t(ROOT a)\t(ROOT b)\t"  # noqa: E731
                                       f"{sentence(r, 1)}\t{sentence(r, 0)}\t" + "\t".join([NLI[i % 3]] * labels))
    write(folder / "MNLI/train.tsv", f"index\tpromptID\tpairID\tgenre\t{parses}\tsentence1\tsentence2\tlabel1\t"
          "gold_label\n" + rows(48, make(2)))
    for name, count in (("dev_matched", 15), ("dev_mismatched", 12)):
        write(folder / f"MNLI/{name}.tsv", f"index\tpromptID\tpairID\tgenre\t{parses}\tsentence1\tsentence2\t"
              "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n" + rows(count, make(6)))


DEV_ROWS = {"CoLA": 21, "SST-2": 20, "MRPC": 18, "STS-B": 16, "QQP": 20, "QNLI": 14, "RTE": 12, "WNLI": 10}


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    """A GLUE folder with all nine tasks in their official formats."""
    folder = tmp_path_factory.mktemp("glue")
    for task, count in DEV_ROWS.items():
        glue_task(folder, task, 48, "train")
        glue_task(folder, task, count, "dev")
    mnli(folder)
    return folder


def bench(*argv) -> dict:
    assert main(["benchmark", *map(str, argv)]) == 0
    out = Path(argv[list(argv).index("--out") + 1])
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def figures(summary: dict) -> dict:
    return {r["task"]: r["metrics"] for r in summary["tasks"]}


# ---- GLUE ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_glue_every_task_in_its_official_format(glue, tiny_model, tmp_path, capsys):
    summary = bench("glue", "--model", tiny_model, "--data", glue, "--out", tmp_path / "out", *FAST, "--plot")
    tasks = {r["task"]: r for r in summary["tasks"]}
    assert list(tasks) == [spec.name for spec in GLUE] and summary["absent"] == []
    scored = {r["task"]: {s: v["examples"] for s, v in r["runs"][0]["scores"].items()} for r in summary["tasks"]}
    assert scored["cola"] == {"dev": 21}  # the headerless file's first row is a row, not a header
    assert scored["mnli"] == {"dev_matched": 15, "dev_mismatched": 12}
    assert {name: scored[spec.name]["dev"] for spec in GLUE if spec.name != "mnli"
            for name in [spec.folder]} == DEV_ROWS  # no row of any dev file lost
    assert set(tasks["mrpc"]["metrics"]["dev"]) == {"f1", "accuracy"} and tasks["mrpc"]["f1_of"] == "class '1'"
    assert set(tasks["stsb"]["metrics"]["dev"]) == {"pearson", "spearman"}
    assert set(tasks["cola"]["metrics"]["dev"]) == {"mcc"}
    # The GLUE score: the mean over tasks of each task's mean metric; MNLI's m and mm averaged into one task.
    per_task = [statistics.mean(s["median"] for split in r["metrics"].values() for s in split.values())
                for r in summary["tasks"]]
    assert summary["glue"]["complete"] and summary["glue"]["score"] == pytest.approx(statistics.mean(per_task))
    mnli_score = statistics.mean(tasks["mnli"]["metrics"][s]["accuracy"]["median"] for s in ("dev_matched",
                                                                                            "dev_mismatched"))
    assert tasks["mnli"]["score"] == pytest.approx(mnli_score)
    table = (tmp_path / "out" / "results.md").read_text(encoding="utf-8")
    assert "| mnli | dev_mismatched | accuracy |" in table and "GLUE score (Wang et al. 2018)" in table
    assert (tmp_path / "out" / "spread.png").stat().st_size > 1000
    assert not (tmp_path / "out" / "sst2" / "seed-42" / "checkpoints").exists()  # --no-keep-state by default
    assert "| cola | dev | mcc |" in capsys.readouterr().out


def test_compare_reads_the_harness_sst2_median(glue, tiny_model, tmp_path):
    """`encoderlab compare --sst2-results OUT/results.json`: the median over the seeds' own result files."""
    bench("glue", "--model", tiny_model, "--data", glue, "--out", tmp_path / "out", "--tasks", "sst2", "--seeds", "3",
          *FAST)
    per_seed = [json.loads((tmp_path / "out" / "sst2" / f"seed-{s}" / "result.json").read_text())
                ["scores"]["dev"]["accuracy"] for s in (42, 43, 44)]
    found = cmp.sst2_accuracies([tmp_path / "out" / "results.json"])
    assert list(found) == [Path(tiny_model).name]
    assert found[Path(tiny_model).name]["sst2_accuracy"] == pytest.approx(statistics.median(per_seed))
    assert found[Path(tiny_model).name]["sst2_source"].endswith("results.json:sst2 median of seeds 42,43,44")


def test_absent_tasks_are_listed(glue, tiny_model, tmp_path):
    partial = tmp_path / "partial"
    glue_task(partial, "RTE", 24, "train")
    glue_task(partial, "RTE", 8, "dev")
    summary = bench("glue", "--model", tiny_model, "--data", partial, "--out", tmp_path / "out", *FAST)
    assert [r["task"] for r in summary["tasks"]] == ["rte"] and not summary["glue"]["complete"]
    assert len(summary["absent"]) == 8 and f"cola (no {partial / 'CoLA' / 'train.tsv'})" in summary["absent"]
    assert main(["benchmark", "glue", "--model", str(tiny_model), "--data", str(partial), "--out", str(tmp_path),
                 "--tasks", "rte,sst-2"]) == 2


def test_a_quick_run_says_it_is_a_smoke_run_not_a_score(tiny_model, tmp_path, capsys):
    """--quick prints, and records in results.json and results.md, that its figures are not scores (issue 37: a
    quick STS-B run printed Pearson 2.53 with no word of it); a full run says nothing of the kind."""
    data = tmp_path / "glue"
    glue_task(data, "RTE", 24, "train")
    glue_task(data, "RTE", 8, "dev")
    quick = bench("glue", "--model", tiny_model, "--data", data, "--out", tmp_path / "quick", "--quick",
                  "--device", "cpu", "--no-progress", "--batch-size", "8")
    shown = capsys.readouterr().out
    assert quick["smoke_run"] is True and "not scores" in quick["note"]
    assert "a smoke run" in shown and "not scores" in shown
    assert "a smoke run" in (tmp_path / "quick" / "results.md").read_text(encoding="utf-8")
    full = bench("glue", "--model", tiny_model, "--data", data, "--out", tmp_path / "full", *FAST)
    assert full["smoke_run"] is False and "note" not in full and "a smoke run" not in capsys.readouterr().out


def test_figures_equal_finetune_then_evaluate_by_hand(glue, tiny_model, tmp_path, capsys):
    """The same recipe (finetune's defaults but the epochs, lr and batch) and seed give the same figures."""
    summary = bench("glue", "--model", tiny_model, "--data", glue, "--out", tmp_path / "bench", "--tasks",
                    "sst2,stsb", "--seed", "7", *FAST)
    by_hand = {}
    for task, extra, metric in (("SST-2", [], "accuracy"), ("STS-B", ["--task-type", "regression"], "pearson")):
        out = tmp_path / task
        assert main(["finetune", "classify", "--model", str(tiny_model), "--train", str(glue / task / "train.tsv"),
                     "--eval", str(glue / task / "dev.tsv"), "--out", str(out), *extra, "--seed", "7",
                     "--metric", metric, *FAST]) == 0
        capsys.readouterr()
        assert main(["evaluate", "classify", "--model", str(out), "--data", str(glue / task / "dev.tsv"),
                     "--batch-size", "16", "--json"]) == 0
        by_hand[task] = json.loads(capsys.readouterr().out)["metrics"]
    tasks = {r["task"]: r["runs"][0]["scores"]["dev"] for r in summary["tasks"]}
    assert tasks["sst2"]["accuracy"] == by_hand["SST-2"]["accuracy"]
    assert (tasks["stsb"]["pearson"], tasks["stsb"]["spearman"]) == (by_hand["STS-B"]["pearson"],
                                                                      by_hand["STS-B"]["spearman"])


def test_rerun_skips_finished_tasks_and_refuses_another_recipe(glue, tiny_model, tmp_path):
    argv = ["glue", "--model", tiny_model, "--data", glue, "--out", tmp_path, "--tasks", "rte", *FAST]
    first = bench(*argv)
    model = tmp_path / "rte" / "seed-42" / "model.safetensors"
    stamp = model.stat().st_mtime_ns
    second = bench(*argv)
    assert second["tasks"][0]["skipped"] and figures(second) == figures(first)
    more = bench(*argv, "--seeds", "2")  # seed 42 is reused, seed 43 is trained
    assert model.stat().st_mtime_ns == stamp and more["tasks"][0]["seeds"] == [42, 43]
    assert more["tasks"][0]["runs"][0] == first["tasks"][0]["runs"][0]
    assert main(["benchmark", *map(str, argv), "--lr", "5e-4"]) == 2  # results of another recipe are not mixed in


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written in time"
        time.sleep(0.005)


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_uninterrupted_result(glue, tiny_model, tmp_path):
    argv = ["benchmark", "glue", "--model", str(tiny_model), "--data", str(glue), "--tasks", "sst2", "--epochs", "3",
            "--batch-size", "2", "--lr", "1e-3", "--no-progress", "--threads", "1"]
    whole = bench(*argv[1:], "--out", tmp_path / "whole")
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "encoderlab", *argv, "--out", str(tmp_path / "cut")], cwd=ROOT,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(tmp_path / "cut" / "sst2" / "seed-42" / "checkpoints" / "latest", proc)  # after epoch 1 of 3
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted at step" in err, err[-2000:]
    assert not (tmp_path / "cut" / "sst2" / "result.json").exists()
    resumed = bench(*argv[1:], "--out", tmp_path / "cut")
    assert figures(resumed) == figures(whole)


# ---- CoNLL, SQuAD, STS, IMDB -------------------------------------------------------------------------------------
def conll(path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    blocks = ["-DOCSTART- -X- -X- O\n"]
    for _ in range(count):
        words, tags = tagged(rng)
        blocks.append("".join(f"{w} NNP B-NP {t}\n" for w, t in zip(words, tags)))
    write(path, "\n".join(blocks))


def squad(path: Path, count: int, v2: bool) -> None:
    data = []
    for i in range(count):
        name, city = NAMES[i % 4], CITIES[i % 4]
        context = f"{name} lives in {city} ."
        qas = [{"id": f"q{i}", "question": f"where does {name} live ?",
                "answers": [{"text": city, "answer_start": context.index(city)}]}]
        if v2:
            qas.append({"id": f"n{i}", "question": "where is the film ?", "answers": [], "is_impossible": True})
        data.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": qas}]})
    write(path, json.dumps({"version": "v2.0" if v2 else "1.1", "data": data}))


SEMEVAL = ("main-captions\tMSRvid\t2012test\t{i:04d}\t{score:.3f}\t{a}\t{b}{extra}")


def test_conll_squad_sts_imdb_in_their_official_layouts(tiny_model, tmp_path):
    data = tmp_path / "data"
    conll(data / "conll" / "train.txt", 30, 0), conll(data / "conll" / "valid.txt", 9, 1)
    conll(data / "conll" / "test.txt", 7, 2)
    for version, v2 in (("v1.1", False), ("v2.0", True)):
        squad(data / "squad" / f"train-{version}.json", 12, v2), squad(data / "squad" / f"dev-{version}.json", 5, v2)
    for name, count in (("train", 40), ("dev", 13), ("test", 11)):  # SemEval rows: some with trailing source fields
        write(data / "semeval" / f"sts-{name}.csv", rows(count, lambda i, r: SEMEVAL.format(
            i=i, score=r.uniform(0, 5), a=sentence(r, 1), b=sentence(r, 0), extra="\tsource\tsource" * (i % 3 == 0))))
    for split, count in (("train", 16), ("test", 6)):
        for label in ("pos", "neg", "unsup") if split == "train" else ("pos", "neg"):
            for i in range(count):
                write(data / "aclImdb" / split / label / f"{i}_{8 if label == 'pos' else 2}.txt",
                      sentence(random.Random(i), label == "pos") + "<br /><br />" + sentence(random.Random(-i), 1))
    for split, count in (("train", 20), ("test", 9)):  # our IMDB TSV: id, rating, label, text
        write(data / "imdb-tsv" / f"{split}.tsv", "id\trating\tlabel\ttext\n" + rows(count, lambda i, r: (
            f"{i}\t{8 if i % 2 else 2}\t{'pos' if i % 2 else 'neg'}\t{sentence(r, i % 2)}<br /><br />it was so")))
    results = {}
    for suite, folder in (("conll", "conll"), ("squad", "squad"), ("sts", "semeval"), ("imdb", "aclImdb"),
                          ("imdb", "imdb-tsv")):
        summary = bench(suite, "--model", tiny_model, "--data", data / folder, "--out", tmp_path / folder, *FAST)
        results |= {r["task"]: {s: v["examples"] for s, v in r["runs"][0]["scores"].items()} for r in summary["tasks"]}
    assert results == {"conll2003": {"valid": 9, "test": 7}, "squad-v1.1": {"dev": 5}, "squad-v2.0": {"dev": 10},
                       "stsb-semeval": {"dev": 13, "test": 11}, "imdb": {"test": 12},
                       "imdb-tsv": {"test": 9}}
    squad_figures = figures(json.loads((tmp_path / "squad" / "results.json").read_text()))["squad-v1.1"]["dev"]
    assert set(squad_figures) == {"f1", "exact_match"} and 0 <= squad_figures["f1"]["median"] <= 100
