"""Nothing a user made is lost or silently wrong (issue 42): pretrain, finetune, export and merge refuse an --out
holding files they did not make unless --overwrite (or --resume); an export is one self-contained folder; a model
fine-tuned from a normalised embedder keeps giving unit vectors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from test_pretrain import TINY, _write_corpus
from test_tasks_finetune import write_tiny_encoder

from encoderlab.cli import main
from encoderlab.data.prepare import prepare
from encoderlab.infer.onnx import OnnxRunner
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.classify import Classify
from encoderlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

WORDS = "a the cat dog sat ran on mat park good bad very film was it".split()
TEXTS = ["a cat sat on the mat", "the dog ran in the park", "it was a very good film"]
QUIET = ["--no-progress", "--threads", "1"]


def tiny_encoder(folder: Path, seed: int) -> Path:
    """A random 2-layer, 32-wide encoder with a whole-word WordPiece vocabulary of WORDS, saved as a folder."""
    return write_tiny_encoder(folder, WORDS, seed)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny encoders, scored sentence pairs and a prepared corpus: what the four commands read."""
    root = tmp_path_factory.mktemp("inputs")
    pairs = root / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{TEXTS[i % 3]}\t{TEXTS[(i + 1) % 3]}\t{i % 5}\n" for i in range(8)), encoding="utf-8")
    corpus = root / "corpus.txt"
    _write_corpus(corpus, documents=20)
    Tokenizer.train("wordpiece", [corpus], vocab_size=120).save(root / "tokenizer")
    prepare([str(corpus)], root / "tokenizer", root / "data", holdout=0.1, workers=1)
    return {"a": tiny_encoder(root / "a", 0), "b": tiny_encoder(root / "b", 1), "pairs": pairs, "data": root / "data"}


def command(name: str, inputs: dict[str, Path], out: Path) -> list[str]:
    """A short run of each command that writes a folder."""
    model = str(inputs["a"])
    return {
        "pretrain": ["pretrain", *[a for s in [f"data={inputs['data']}", *TINY, "max_steps=2"] for a in ("--set", s)]],
        "finetune": ["finetune", "embed", "--model", model, "--train", str(inputs["pairs"]), "--epochs", "1",
                     "--batch-size", "4", *QUIET],
        "export": ["export", "onnx", "--model", model],
        "merge": ["merge", model, str(inputs["b"])],
    }[name] + ["--out", str(out)]


def hashes(root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under root."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def users_folder(path: Path) -> Path:
    """A folder holding what a user made: a note, and a finished model's weights."""
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("my results\n", encoding="utf-8")
    (path / "sub" / "model.safetensors").write_bytes(b"weights I trained for a week")
    return path


COMMANDS = ["pretrain", "finetune", "export", "merge"]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_folder_holding_a_users_files_is_refused_and_left_as_it_was(name, inputs, tmp_path, capsys):
    out = users_folder(tmp_path / "out")
    before = hashes(out)
    assert main(command(name, inputs, out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --out {out} holds") and "--overwrite" in err, err
    assert ("--resume" in err) == (name in ("pretrain", "finetune"))
    assert hashes(out) == before  # not a byte changed, nothing added (no metrics.csv)


@pytest.mark.parametrize("name", COMMANDS)
def test_overwrite_replaces_the_folder(name, inputs, tmp_path):
    out = users_folder(tmp_path / "out")
    assert main(command(name, inputs, out) + ["--overwrite"]) == 0
    left = set(hashes(out))
    assert "notes.txt" not in left and "sub/model.safetensors" not in left
    assert {"config.json"} <= {Path(p).name for p in left}


@pytest.mark.parametrize("name", COMMANDS)
def test_an_out_that_is_a_file_is_refused_in_one_line(name, inputs, tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("keep me\n", encoding="utf-8")
    assert main(command(name, inputs, out)) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out}: is a file, expected a folder\n"
    assert out.read_text(encoding="utf-8") == "keep me\n"


@pytest.mark.parametrize("name", COMMANDS)
def test_an_empty_or_absent_folder_is_fine(name, inputs, tmp_path):
    (tmp_path / "empty").mkdir()
    assert main(command(name, inputs, tmp_path / "empty")) == 0
    assert main(command(name, inputs, tmp_path / "absent" / "out")) == 0


def test_a_finished_finetune_is_not_replaced_by_a_second_run(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(command("finetune", inputs, out)) == 0
    before = hashes(out)
    capsys.readouterr()
    assert main(command("finetune", inputs, out)) == 2
    assert "--overwrite" in capsys.readouterr().err and hashes(out) == before


def test_overwrite_and_resume_together_are_refused(inputs, tmp_path, capsys):
    assert main(command("finetune", inputs, tmp_path / "out") + ["--overwrite", "--resume"]) == 2
    assert "give one" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["finetune", "export", "merge"])
def test_the_input_models_folder_is_never_the_output(name, inputs, tmp_path, capsys):
    before = hashes(inputs["a"])
    assert main(command(name, inputs, inputs["a"].parent) + ["--overwrite"]) == 2
    assert "holds the input" in capsys.readouterr().err and hashes(inputs["a"]) == before


# ---- export: one self-contained folder per model --------------------------------------------------------------
def test_two_exports_under_one_parent_each_keep_their_own_vectors(inputs, tmp_path):
    first, second = tmp_path / "out" / "a", tmp_path / "out" / "b"
    assert main(command("export", inputs, first)) == 0
    before = OnnxRunner(first, threads=1).embed(TEXTS)
    assert_close(torch.from_numpy(before), torch.from_numpy(pipeline("embed", inputs["a"]).embed(TEXTS)),
                 atol=1e-5, rtol=1e-4)
    assert main(["export", "onnx", "--model", str(inputs["b"]), "--out", str(second)]) == 0
    assert np.array_equal(OnnxRunner(first, threads=1).embed(TEXTS), before)
    assert not np.allclose(OnnxRunner(second, threads=1).embed(TEXTS), before, atol=1e-3)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a", "b"]  # nothing loose beside them


# ---- a fine-tuned embedder keeps its normalisation ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned_minilm(tmp_path_factory, inputs) -> Path:
    out = tmp_path_factory.mktemp("tuned") / "minilm"
    assert main(["finetune", "embed", "--model", "minilm", "--train", str(inputs["pairs"]), "--epochs", "1",
                 "--batch-size", "4", "--max-length", "16", *QUIET, "--out", str(out)]) == 0
    return out


def test_finetune_embed_from_minilm_keeps_unit_vectors(tuned_minilm):
    for dimensions in (None, 128):
        vectors = pipeline("embed", tuned_minilm, dimensions=dimensions).embed(TEXTS)
        assert vectors.shape[1] == (dimensions or 384)
        assert_close(torch.from_numpy(np.linalg.norm(vectors, axis=1)), torch.ones(3), atol=1e-5, rtol=0)


def test_sentence_transformers_loads_the_same_vectors(tuned_minilm):
    from sentence_transformers import SentenceTransformer

    theirs = SentenceTransformer(str(tuned_minilm), device="cpu").encode(TEXTS, convert_to_tensor=True)
    ours = torch.from_numpy(pipeline("embed", tuned_minilm).embed(TEXTS))
    assert_close(theirs.cpu(), ours, atol=1e-5, rtol=1e-4)


def test_a_multilabel_row_with_no_class_above_a_half_shows_its_top_scores():
    shown = Classify.show({"labels": [], "scores": {"sport": 0.31, "music": 0.42, "war": 0.05, "art": 0.2}})
    assert shown == "no class above 0.5; top: music 0.4200, sport 0.3100, art 0.2000"
    assert Classify.show({"labels": ["sport"], "scores": {"sport": 0.9}}) == "sport"
