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
