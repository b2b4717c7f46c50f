"""The `encoderlab` command: every subcommand runs, prints real output, and refuses bad input cleanly."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderlab.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001 (argparse has no public getter)


@pytest.mark.parametrize("command", [[]] + [[c] for c in SUBCOMMANDS])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main(command + ["--help"])
    assert stop.value.code == 0
    assert "usage: encoderlab" in capsys.readouterr().out


def test_info_preset_json_reports_the_parameter_count(capsys):
    assert main(["info", "--preset", "bert-base", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["parameters"] == 109_482_240
    assert (summary["num_layers"], summary["hidden_size"]) == (12, 768)


def test_info_on_minilm(capsys):
    assert main(["info", "--model", "minilm"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"num_layers\s+6", out) and re.search(r"hidden_size\s+384", out)
    assert "22,713,216" in out.replace("\u202f", ",")  # HF BertModel of this config has 22,713,216 parameters


def test_embed_writes_one_normalized_row_per_line(tmp_path, capsys):
    lines = ["A man is playing a guitar.", "The market fell.", "A cat sleeps."]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.npy"
    assert main(["embed", "--model", "minilm", "--input", str(source), "--out", str(out), "--normalize"]) == 0
    vectors = np.load(out)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert "wrote" in capsys.readouterr().out


def test_similarity_ranks_the_related_sentence_first(capsys):
    assert main(["similarity", "--model", "minilm", "--json", "A person plays an instrument.",
                 "The stock market fell sharply.", "A man is playing a guitar."]) == 0
    ranking = json.loads(capsys.readouterr().out)["ranking"]
    assert ranking[0]["text"] == "A man is playing a guitar."
    assert ranking[0]["cosine"] > ranking[1]["cosine"]


def _run_error(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_empty_input_file(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    err = _run_error(["embed", "--model", "minilm", "--input", str(empty), "--out", str(tmp_path / "o.npy")], capsys)
    assert "empty.txt" in err and "empty" in err
    assert not (tmp_path / "o.npy").exists()


def test_non_utf8_input_file_names_the_line(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\ncaf\xe9 au lait\n".encode("latin-1"))
    err = _run_error(["embed", "--model", "minilm", "--input", str(bad), "--out", str(tmp_path / "o.npy")], capsys)
    assert "latin1.txt:2" in err and "UTF-8" in err


def test_blank_line_in_input_is_named(tmp_path, capsys):
    source = tmp_path / "gap.txt"
    source.write_text("one\n\nthree\n", encoding="utf-8")
    err = _run_error(["embed", "--model", "minilm", "--input", str(source), "--out", str(tmp_path / "o.npy")], capsys)
    assert "gap.txt:2" in err


def test_missing_model_folder(tmp_path, capsys):
    err = _run_error(["info", "--model", str(tmp_path / "nowhere")], capsys)
    assert "nowhere" in err and "no such folder" in err


def test_corrupted_safetensors(tmp_path, minilm_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(minilm_path, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a download cut short
    err = _run_error(["similarity", "--model", str(broken), "a", "b"], capsys)
    assert "model.safetensors" in err and "corrupted" in err


def test_similarity_needs_two_texts(capsys):
    _run_error(["similarity", "--model", "minilm", "alone"], capsys)


@pytest.mark.parametrize("command", [
    ["similarity", "--model", "minilm", "a", "b"], ["fill-mask", "--model", "minilm", "a [MASK]"],
    ["serve", "--model", "minilm"], ["evaluate", "classify", "--model", "minilm", "--data", "x.tsv"],
    ["finetune", "classify", "--model", "minilm", "--train", "x.tsv", "--out", "run"],
])
def test_threads_below_one_is_refused_the_same_way_everywhere(command, capsys):
    err = _run_error(command + ["--threads", "0"], capsys)
    assert err == "error: --threads 0: expected a positive number\n"


def test_argparse_lives_only_in_the_cli_package():
    """Library functions take typed arguments; only encoderlab/cli/ turns a command line into them."""
    pattern = re.compile(r"^\s*(import argparse|from argparse import)", re.M)
    library = [p for p in (ROOT / "src" / "encoderlab").rglob("*.py") if p.relative_to(ROOT / "src" / "encoderlab").parts[0] != "cli"]
    assert [str(p) for p in library if pattern.search(p.read_text(encoding="utf-8"))] == []


@pytest.mark.slow
def test_runtime_never_imports_the_oracles():
    """transformers, sentence-transformers and scikit-learn are test oracles: no encoderlab module may import them."""
    pattern = re.compile(r"^\s*(import|from)\s+(transformers|sentence_transformers|sklearn)\b", re.M)
    offenders = [str(p) for p in (ROOT / "src" / "encoderlab").rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
    probe = ("import sys, encoderlab.cli as c; c.main(['similarity', '--model', 'minilm', 'a cat', 'a dog']); "
             "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'sentence_transformers')]; "
             "assert not bad, bad")
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, cwd=ROOT)


def test_tokenizer_train_has_help(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["tokenizer", "train", "--help"])
    assert stop.value.code == 0 and "--vocab-size" in capsys.readouterr().out


def test_raw_text_to_pretrained_model_through_the_cli(tmp_path, capsys):
    """tokenizer train -> prepare -> pretrain, as a user types them, on a gzip JSONL corpus."""
    import gzip

    words = "the cat sat on a mat while dogs ran under tables near rivers and houses".split()
    docs = [{"text": f"document {i}: " + " ".join(words[(i * 7 + j * j) % len(words)] for j in range(40)) + "."}
            for i in range(40)]
    corpus = tmp_path / "corpus.jsonl.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(json.dumps(d) for d in docs) + "\n")
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "80", "--out", str(tmp_path / "tok")]) == 0
    assert main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--out",
                 str(tmp_path / "data"), "--holdout", "4", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert stats["documents"] == 40 and stats["valid_documents"] == 4 and stats["tokens"] > 1000
    sets = ["data=" + str(tmp_path / "data"), "model.hidden_size=32", "model.num_heads=2", "model.num_layers=1",
            "model.intermediate_size=32", "max_length=32", "batch_size=4", "max_steps=2", "precision=fp32"]
    recipe = [a for s in sets for a in ("--set", s)]
    assert main(["pretrain", *recipe, "--out", str(tmp_path / "run"), "--stop-at", "1"]) == 0
    assert (tmp_path / "run" / "checkpoints" / "step-000001").is_dir()  # stopped at step 1 of 2 ...
    assert not (tmp_path / "run" / "model").exists()
    assert main(["pretrain", *recipe, "--out", str(tmp_path / "run"), "--resume"]) == 0  # ... and continued
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "checkpoints" / "step-000002").is_dir()


def test_prepare_names_the_unreadable_file(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\n\xff\xfe broken\n")
    _run_error(["tokenizer", "train", "--corpus", str(bad), "--out", str(tmp_path / "tok")], capsys)
    tokenizer_dir = tmp_path / "tok2"
    from encoderlab.tokenizer import Tokenizer

    good = tmp_path / "good.txt"
    good.write_text("some words here\n", encoding="utf-8")
    Tokenizer.train("wordpiece", [good], vocab_size=40).save(tokenizer_dir)
    err = _run_error(["prepare", "--corpus", str(bad), "--tokenizer", str(tokenizer_dir), "--out",
                      str(tmp_path / "data")], capsys)
    assert "bad.txt" in err


# ---- a fast start: --help, argument errors and input checks without torch (issue 37) --------------------------
def _fresh(*argv: str) -> subprocess.CompletedProcess:
    """`encoderlab ARGV` in a fresh interpreter, which then prints the heavy modules it imported."""
    code = ("import sys\nfrom encoderlab.cli import main\ntry:\n    code = main(sys.argv[1:])\nexcept SystemExit as stop:\n"
            "    code = stop.code\nheavy = sorted(m for m in ('torch', 'numpy', 'fastapi', 'onnxruntime', 'transformers')"
            " if m in sys.modules)\nprint('HEAVY', ','.join(heavy), 'EXIT', code)\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False)


FAST_ANSWERS = [  # (argv, exit code, what the one error line says)
    (["--help"], 0, None),
    (["fill-mask", "--help"], 0, None),
    (["finetune", "--help"], 0, None),  # the task list, from encoderlab.choices (tests/test_help.py)
    (["pretrain", "--help"], 0, None),  # the objectives, from encoderlab.choices
    (["finetune", "classify", "--model", "minilm", "--train", "t.tsv", "--out", "r", "--batch-size", "0"], 2,
     "--batch-size 0: expected a positive number"),
    (["fill-mask", "--precision", "fp64", "Paris is the [MASK]."], 2, "invalid choice: 'fp64'"),
    (["fill-mask", ""], 2, "text 0 is empty or whitespace only"),
    (["fill-mask", "--top-k", "-1", "Paris is the [MASK]."], 2, "--top-k -1: expected a positive number"),
    (["embed", "--model", "minilm", "--input", "nope.txt", "--out", "x.npy"], 2, "nope.txt: no such file"),
    (["similarity", "--model", "minilm", "a query", " "], 2, "text 1 is empty or whitespace only"),
    (["qa", "--model", "minilm", "--question", " ", "--context", "Paris."], 2, "the question is empty"),
    (["classify", "--model", "minilm", "--device", "gpu", "a"], 2, "'gpu': expected cpu, cuda or cuda:N"),
    (["serve", "--model", "minilm", "--batch-size", "0"], 2, "--batch-size 0: expected a positive number"),
]


@pytest.mark.parametrize("argv, code, says", FAST_ANSWERS, ids=[" ".join(a[:3]) for a, _, _ in FAST_ANSWERS])
def test_help_argument_errors_and_bad_inputs_answer_in_one_line_and_never_import_torch(argv, code, says):
    """Each answer comes before a model loads: the exit code and one error line, and no heavy module imported (one
    fresh interpreter checks both)."""
    done = _fresh(*argv)
    assert f"EXIT {code}" in done.stdout, done.stdout + done.stderr
    assert "HEAVY  EXIT" in done.stdout, done.stdout  # nothing heavy imported
    if says is not None:
        assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: "), done.stderr
        assert says in done.stderr and "usage:" not in done.stderr


def test_the_names_the_parser_checks_are_the_ones_the_code_runs():
    """encoderlab.choices holds what the parser checks without torch; the modules that act on them agree."""
    from encoderlab import choices
    from encoderlab.tokenizer import KINDS
    from encoderlab.train.loop import PRECISIONS

    assert choices.TRAINING_PRECISIONS == PRECISIONS and choices.TOKENIZER_KINDS == KINDS


@pytest.mark.slow
def test_loading_a_checkpoint_imports_no_compiler():
    """A one-shot command takes the shortest path: building the model on the meta device runs no initialiser
    (which would import torch._dynamo, 2.4 s of a 6 s fill-mask on 2 cores) and nothing compiles."""
    code = ("import sys\nfrom encoderlab.infer.pipelines import pipeline\npipeline('fill-mask')(['Paris is the [MASK].'])\n"
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


# ---- --device on every command that runs a model (issue 35, item 8) ---------------------------------------------
DEVICE_COMMANDS = {
    "fill-mask": ["fill-mask", "Paris is the [MASK] of France."],
    "embed": ["embed", "--model", "minilm", "--input", "examples/sentences.txt", "--out", "{tmp}/x.npy"],
    "similarity": ["similarity", "--model", "minilm", "a query", "a candidate"],
    "classify": ["classify", "--model", "minilm", "a text"],
    "ner": ["ner", "--model", "minilm", "a text"],
    "qa": ["qa", "--model", "minilm", "--question", "Who?", "--context", "Anna."],
    "serve": ["serve", "--model", "minilm"],
    "benchmark": ["benchmark", "sts", "--model", "minilm", "--data", "{tmp}", "--out", "{tmp}/out"],
}


@pytest.mark.parametrize("command", sorted(DEVICE_COMMANDS))
def test_device_refuses_a_bad_name_in_one_line(command, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in DEVICE_COMMANDS[command]] + ["--device", "gpu"]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: argument --device: 'gpu': expected cpu, cuda or cuda:N"), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --device cuda is not refused here")
@pytest.mark.parametrize("command", sorted(DEVICE_COMMANDS))
def test_device_cuda_without_a_gpu_is_refused_before_anything_loads(command, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in DEVICE_COMMANDS[command]] + ["--device", "cuda:0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "error: --device cuda:0: CUDA is not available on this machine (use --device cpu)\n"


def test_device_cpu_runs_and_the_pipeline_is_on_it(tmp_path, capsys):
    assert main(["fill-mask", "Paris is the [MASK] of France.", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["masks"][0]["predictions"][0]["token"] == "capital"
    out = tmp_path / "x.npy"
    assert main(["embed", "--model", "minilm", "--input", str(ROOT / "examples" / "sentences.txt"), "--out", str(out),
                 "--device", "cpu"]) == 0
    assert np.load(out).shape == (6, 384)
    from encoderlab.cli.options import resolve_device

    assert str(resolve_device("cpu")) == "cpu"
    assert str(resolve_device(None)) == ("cuda" if torch.cuda.is_available() else "cpu")  # the default


class Terminal(io.StringIO):
    """stderr as a terminal: what a person running a command sees (a log file is not one)."""

    def isatty(self) -> bool:
        return True


def test_every_command_with_an_input_file_takes_no_progress():
    """--no-progress means the same on every command that reads --input: no bar."""
    parser = build_parser()
    choices = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    readers = [name for name, sub in choices.items() if "--input" in sub._option_string_actions]  # noqa: SLF001
    assert {"embed", "classify", "ner", "fill-mask", "rerank", "splade"} <= set(readers)
    refused = [name for name in readers if "--no-progress" not in choices[name]._option_string_actions]  # noqa: SLF001
    assert not refused, f"these read --input but refuse --no-progress: {refused}"


@pytest.mark.parametrize("flags, terminal, shown", [([], True, True), (["--no-progress"], True, False),
                                                    ([], False, False)])
def test_embed_shows_a_progress_bar_on_a_terminal_only(tmp_path, monkeypatch, flags, terminal, shown):
    """40 texts in batches of 8: a bar counting them (as often as tqdm redraws it) on a terminal, none with
    --no-progress or into a file; the vectors are the same either way."""
    source = tmp_path / "in.txt"
    source.write_text("\n".join(f"sentence number {i} about things" for i in range(40)) + "\n", encoding="utf-8")
    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    out = tmp_path / "v.npy"
    assert main(["embed", "--model", "minilm", "--input", str(source), "--out", str(out), "--batch-size", "8",
                 *flags]) == 0
    assert ("embed:" in err.getvalue() and "/40 [" in err.getvalue()) == shown, err.getvalue()  # "16/40 [00:00<..."
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    quiet = tmp_path / "q.npy"
    assert main(["embed", "--model", "minilm", "--input", str(source), "--out", str(quiet), "--batch-size", "8"]) == 0
    np.testing.assert_array_equal(np.load(out), np.load(quiet))
