"""Data by its Hub name, hf:NAME[/CONFIG][:SPLIT] (encoderlab.hub_data), against the loopback Hub of
tests/loopback_hub.py serving a tiny Parquet dataset repository laid out as the Hub's are (data/SPLIT-*.parquet and a
README whose YAML names the features, ClassLabel included). Nothing leaves the machine: every run is a subprocess
with HF_ENDPOINT set to the loopback server (or HF_HUB_OFFLINE=1) and HF_HOME to a temporary folder."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from encoderlab.errors import InputError
from encoderlab.hub_data import HubDataset, parse_hub_dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import tiny_model  # noqa: E402  (the benches' tiny random BERT with minilm's tokenizer files)
from loopback_hub import Repo, cli, error_line, hub_env, loopback  # noqa: E402,F401  (a fixture)

NAMES = ["negative", "positive"]
TRAIN = [("a gripping, beautifully acted film", 1), ("two hours I will never get back", 0), ("a joy", 1),
         ("dull and far too long", 0), ("the best film of the year", 1), ("I walked out", 0)]
VALIDATION = [("wonderful", 1), ("awful", 0), ("moving and funny", 1), ("a mess", 0)]
CARD = """---
dataset_info:
  features:
  - name: idx
    dtype: int32
  - name: sentence
    dtype: string
  - name: label
    dtype:
      class_label:
        names:
          '0': negative
          '1': positive
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
  - split: validation
    path: data/validation-*
---
# tiny-sst: SST-2's layout (stanfordnlp/sst2) in ten rows
"""


def parquet(rows: list[tuple[str, int]]) -> bytes:
    """A Parquet file of (sentence, label) rows with SST-2's columns idx, sentence, label."""
    table = pa.table({"idx": pa.array(range(len(rows)), pa.int32()), "sentence": [text for text, _ in rows],
                      "label": pa.array([label for _, label in rows], pa.int64())})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def serve_tiny_sst(server) -> None:
    """org/tiny-sst on the loopback Hub: a README card and one Parquet file per split, as the Hub lays them out."""
    server.datasets["org/tiny-sst"] = Repo()
    server.datasets["org/tiny-sst"].commit({"README.md": CARD.encode(),
                                            "data/train-00000-of-00001.parquet": parquet(TRAIN),
                                            "data/validation-00000-of-00001.parquet": parquet(VALIDATION)})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny random BERT with minilm's tokenizer."""
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def readme_command() -> list[str]:
    """The README's by-name fine-tuning command (SST-2 by its Hub name), as argv after `encoderlab`."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "finetune classify" in line and "hf:stanfordnlp/sst2" in line)
    return shlex.split(line.split("encoderlab", 1)[1].split("#")[0])


def rows_read(env: dict[str, str], spec: str) -> list[list]:
    """The (texts, label) pairs classify's reader gives for a hf: name, read in a fresh process."""
    code = ("import json, sys\nfrom encoderlab.hub_data import local_copy\nfrom encoderlab.tasks.readers import "
            "read_texts\nrows = read_texts(local_copy(sys.argv[1], 'table').path)\n"
            "print(json.dumps([[list(r.texts), r.label] for r in rows]))\n")
    done = subprocess.run([sys.executable, "-c", code, spec], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# ---- names -----------------------------------------------------------------------------------------------------
def test_names_parse_by_the_documented_rule():
    assert parse_hub_dataset("hf:imdb") == HubDataset("imdb", None, "train")
    assert parse_hub_dataset("hf:imdb:test") == HubDataset("imdb", None, "test")
    assert parse_hub_dataset("hf:stanfordnlp/sst2:validation") == HubDataset("stanfordnlp/sst2", None, "validation")
    assert parse_hub_dataset("hf:nyu-mll/glue/sst2:train") == HubDataset("nyu-mll/glue", "sst2", "train")
    assert parse_hub_dataset("hf:imdb/plain_text") == HubDataset("imdb/plain_text", None, "train")  # two: org/name
    assert parse_hub_dataset("hf:stanfordnlp/imdb/plain_text:train[:1000]").split == "train[:1000]"
    assert parse_hub_dataset("hf:org/x", default_split="validation").split == "validation"
    assert str(parse_hub_dataset("hf:nyu-mll/glue/sst2")) == "hf:nyu-mll/glue/sst2:train"
    for bad in ("hf:", "hf:a/b/c/d", "hf:x:", "hf:a b", "hf:org--x/y", "hf:/x", "hf:x:train:test", "hf:a..b"):
        with pytest.raises(InputError, match="expected hf:NAME"):
            parse_hub_dataset(bad)
    with pytest.raises(InputError, match="without a split"):
        parse_hub_dataset("hf:nyu-mll/glue:train", split=False)


@pytest.mark.parametrize("argv", [
    ["finetune", "classify", "--model", "x", "--train", "hf:", "--out", "o"],
    ["finetune", "classify", "--model", "x", "--train", "hf:org/a", "--eval", "hf:a/b/c/d", "--out", "o"],
    ["evaluate", "classify", "--model", "x", "--data", "hf:x:"],
    ["prepare", "--corpus", "hf:a/b/c/d", "--tokenizer", "t", "--out", "o"],
])
def test_a_bad_name_is_refused_before_torch_loads(argv):
    code = ("import sys\nfrom encoderlab.cli import main\ncode = main(sys.argv[1:])\n"
            "print('HEAVY', sorted(m for m in ('torch', 'datasets') if m in sys.modules), 'EXIT', code)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert "HEAVY [] EXIT 2" in done.stdout, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "expected hf:NAME[/CONFIG][:SPLIT]" in done.stderr, done.stderr


# ---- the rows --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_rows_read_are_the_parquet_rows_with_class_names(tmp_path, loopback):
    serve_tiny_sst(loopback)
    env = hub_env(tmp_path, loopback)
    assert rows_read(env, "hf:org/tiny-sst:train") == [[[text], NAMES[label]] for text, label in TRAIN]
    assert rows_read(env, "hf:org/tiny-sst:validation") == [[[text], NAMES[label]] for text, label in VALIDATION]
    assert any(r.startswith("GET /api/datasets/org/tiny-sst/") for r in loopback.requests)
    assert any("datasets-server." in r for r in loopback.requests)  # the viewer's question came here, not out
    copies = list((tmp_path / "hf" / "datasets" / "encoderlab").rglob("*.jsonl"))
    assert len(copies) == 2  # written once per split, in the datasets cache
    loopback.requests.clear()
    offline = hub_env(tmp_path, None, offline=True)  # the warm cache, no Hub
    assert rows_read(offline, "hf:org/tiny-sst:train") == [[[text], NAMES[label]] for text, label in TRAIN]


@pytest.mark.slow
def test_a_missing_split_lists_the_splits(tmp_path, loopback):
    serve_tiny_sst(loopback)
    done = cli(hub_env(tmp_path, loopback), "prepare", "--corpus", "hf:org/tiny-sst:test", "--tokenizer", "minilm",
               "--out", str(tmp_path / "shards"))
    err = error_line(done)
    assert "hf:org/tiny-sst:test" in err and "'train', 'validation'" in err


@pytest.mark.slow
def test_offline_with_a_cold_cache_names_the_dataset_and_the_cache(tmp_path, tiny):
    done = cli(hub_env(tmp_path, None, offline=True), "finetune", "classify", "--model", str(tiny), "--train",
               "hf:org/absent:train", "--out", str(tmp_path / "run"))
    err = error_line(done)
    assert "hf:org/absent:train" in err and str(tmp_path / "hf" / "datasets") in err and "HF_HUB_OFFLINE" in err
    assert not (tmp_path / "run").exists()


# ---- the README's command --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_readme_by_name_finetune_runs_from_the_hub_and_then_offline_from_the_cache(tmp_path, loopback, tiny):
    """The README's command with SST-2's name, model and folder swapped for the tiny ones: from the (loopback) Hub,
    then with HF_HUB_OFFLINE=1 from the cache the first run filled, with no other file."""
    serve_tiny_sst(loopback)
    argv = readme_command()
    assert argv[:2] == ["finetune", "classify"] and "hf:stanfordnlp/sst2:validation" in argv
    swap = {"minilm": str(tiny), "runs/sst2-hub": str(tmp_path / "online")}
    argv = [swap.get(a, re.sub(r"^hf:stanfordnlp/sst2", "hf:org/tiny-sst", a)) for a in argv]
    done = cli(hub_env(tmp_path, loopback), *argv, "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    task = json.loads((tmp_path / "online" / "task.json").read_text())
    assert task["labels"] == NAMES  # the ClassLabel's names, in id order
    assert "f1 of class 'positive'" in done.stdout
    training = json.loads((tmp_path / "online" / "training.json").read_text())
    assert training["train"] == "hf:org/tiny-sst:train" and training["train_examples"] == len(TRAIN)
    offline = [a.replace(str(tmp_path / "online"), str(tmp_path / "offline")) for a in argv]
    done = cli(hub_env(tmp_path, None, offline=True), *offline, "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "offline" / "task.json").read_text())["labels"] == NAMES


# ---- each task's form: the Hub's columns written as the file its reader reads ---------------------------------
def _written(tmp_path: Path, dataset, form: str) -> Path:
    """A split written as `form`'s file, as local_copy writes it."""
    from encoderlab.hub_data import _write

    path = tmp_path / f"split.{'json' if form == 'squad' else 'jsonl'}"
    _write(dataset, HubDataset("org/x", None, "train"), form, path)
    return path


def test_ner_qa_multilabel_and_corpus_splits_read_as_their_files(tmp_path):
    import datasets

    from encoderlab.data.corpus import iter_documents
    from encoderlab.tasks.readers import read_conll, read_squad, read_texts

    tags = datasets.ClassLabel(names=["O", "B-PER", "I-PER", "B-LOC"])  # conll2003's ner_tags, shortened
    ner = datasets.Dataset.from_dict({"id": ["0"], "tokens": [["Ada", "Lovelace", "visited", "Paris"]],
                                      "ner_tags": [[1, 2, 0, 3]]},
                                     features=datasets.Features({"id": datasets.Value("string"),
                                                                 "tokens": datasets.List(datasets.Value("string")),
                                                                 "ner_tags": datasets.List(tags)}))
    [sentence] = read_conll(_written(tmp_path, ner, "conll"))
    assert sentence.words == ["Ada", "Lovelace", "visited", "Paris"]
    assert sentence.tags == ["B-PER", "I-PER", "O", "B-LOC"]

    squad = datasets.Dataset.from_dict({  # SQuAD's (rajpurkar/squad, squad_v2) flat rows
        "id": ["q1", "q2", "q3"], "title": ["Paris"] * 3, "context": ["Paris is the capital of France."] * 3,
        "question": ["What is Paris?", "Of what?", "Who sang?"],
        "answers": [{"text": ["the capital"], "answer_start": [9]}, {"text": ["France"], "answer_start": [24]},
                    {"text": [], "answer_start": []}]})
    questions = read_squad(_written(tmp_path, squad, "squad"))
    assert [(q.id, [(a.text, a.start) for a in q.answers], q.is_impossible) for q in questions] == [
        ("q1", [("the capital", 9)], False), ("q2", [("France", 24)], False), ("q3", [], True)]

    topics = datasets.ClassLabel(names=["sports", "politics", "none"])
    multi = datasets.Dataset.from_dict({"text": ["a match and a vote", "nothing"], "labels": [[0, 1], [2]]},
                                       features=datasets.Features({"text": datasets.Value("string"),
                                                                   "labels": datasets.List(topics)}))
    assert [(r.texts, r.label) for r in read_texts(_written(tmp_path, multi, "table"))] == [
        (("a match and a vote",), "sports|politics"), (("nothing",), "none")]

    corpus = datasets.Dataset.from_dict({"title": ["A", "B"], "text": ["One.\nTwo.", "Three."]})
    assert list(iter_documents(_written(tmp_path, corpus, "corpus"))) == [["One.", "Two."], ["Three."]]


def test_an_unlabelled_split_is_refused_by_name(tmp_path):
    import datasets

    test = datasets.Dataset.from_dict({"sentence": ["hidden"], "label": [-1]},  # GLUE's test splits
                                      features=datasets.Features({"sentence": datasets.Value("string"),
                                                                  "label": datasets.ClassLabel(names=NAMES)}))
    with pytest.raises(InputError, match="hf:org/x:train row 0: no label .* unlabelled"):
        _written(tmp_path, test, "table")


@pytest.mark.slow
def test_prepare_takes_a_corpus_by_name(tmp_path, loopback):
    """A repository without a card: datasets finds the split by its file name, the corpus its text column."""
    table = pa.table({"title": ["A", "B", "C"], "text": ["The cat sat.\nIt slept.", "Dogs bark.", "Birds sing."]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    loopback.datasets["org/tiny-wiki"] = Repo()
    loopback.datasets["org/tiny-wiki"].commit({"data/train-00000-of-00001.parquet": buffer.getvalue()})
    done = cli(hub_env(tmp_path, loopback), "prepare", "--corpus", "hf:org/tiny-wiki", "--tokenizer", "minilm",
               "--out", str(tmp_path / "shards"), "--holdout", "0", "--workers", "1", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["documents"] == 3 and stats["sentences"] == 4
    meta = json.loads((tmp_path / "shards" / "meta.json").read_text())
    assert meta["sources"] == ["hf:org/tiny-wiki"]  # the name as given; meta["corpus"]: the cached file read
    from encoderlab.errors import ConfigError
    from encoderlab.train.config import load_recipe

    with pytest.raises(ConfigError, match="encoderlab prepare --corpus hf:org/tiny-wiki"):
        load_recipe(None, ["data=hf:org/tiny-wiki"])  # a recipe names the prepared folder, and is told so


# ---- benchmark --data hf:NAME[/CONFIG] -------------------------------------------------------------------------
def test_a_suite_by_name_reads_each_task_from_its_hub_splits():
    from encoderlab.tasks.benchmark import BenchJob, find_tasks

    found, absent = find_tasks(BenchJob("glue", "m", "hf:nyu-mll/glue", "out", tasks=["sst2", "mnli", "stsb"]))
    assert absent == [] and [(f.spec.name, f.train, f.evals) for f in found] == [
        ("sst2", "hf:nyu-mll/glue/sst2:train", [("validation", "hf:nyu-mll/glue/sst2:validation")]),
        ("stsb", "hf:nyu-mll/glue/stsb:train", [("validation", "hf:nyu-mll/glue/stsb:validation")]),
        ("mnli", "hf:nyu-mll/glue/mnli:train", [("validation_matched", "hf:nyu-mll/glue/mnli:validation_matched"),
                                                ("validation_mismatched",
                                                 "hf:nyu-mll/glue/mnli:validation_mismatched")])]
    assert found[1].spec.regression and found[0].spec.reading.text_cols is None  # columns by the Hub's names
    [imdb], _ = find_tasks(BenchJob("imdb", "m", "hf:stanfordnlp/imdb", "out"))
    assert (imdb.train, imdb.evals) == ("hf:stanfordnlp/imdb:train", [("test", "hf:stanfordnlp/imdb:test")])
    [one], _ = find_tasks(BenchJob("glue", "m", "hf:nyu-mll/glue/rte", "out"))
    assert one.spec.name == "rte"


@pytest.mark.slow
def test_benchmark_glue_by_name_runs_a_task_from_the_hub(tmp_path, loopback, tiny):
    card = CARD.replace("- config_name: default", "- config_name: sst2").replace("path: data/", "path: sst2/")
    loopback.datasets["org/tiny-glue"] = Repo()
    loopback.datasets["org/tiny-glue"].commit({"README.md": card.encode(),
                                               "sst2/train-00000-of-00001.parquet": parquet(TRAIN),
                                               "sst2/validation-00000-of-00001.parquet": parquet(VALIDATION)})
    done = cli(hub_env(tmp_path, loopback), "benchmark", "glue", "--model", str(tiny), "--data", "hf:org/tiny-glue",
               "--tasks", "sst2", "--quick", "--out", str(tmp_path / "bench"), "--no-progress", "--json")
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)["tasks"]
    assert result["task"] == "sst2" and result["runs"][0]["scores"]["validation"]["examples"] == len(VALIDATION)
    assert "--train hf:org/tiny-glue/sst2:train" in result["runs"][0]["commands"][0]
