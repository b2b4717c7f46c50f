"""End to end through the CLI: tiny models learn synthetic tasks, save, reload and evaluate; bad input is refused."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest
import torch

from encoderlab import EncoderConfig, EncoderModel, load_model
from encoderlab.checkpoint import save_pretrained
from encoderlab.errors import ConfigError, InputError
from encoderlab.cli.finetune import add_commands
from encoderlab.infer import precision as precisions
from encoderlab.infer.pipelines import pipeline
from encoderlab.nn.model import SequenceClassifier
from encoderlab.tokenizer import Tokenizer

POSITIVE = ["good", "great", "fine", "nice", "superb"]
NEGATIVE = ["bad", "awful", "poor", "nasty", "dire"]
FILLER = ["the", "movie", "was", "a", "film", "plot", "very", "quite", "and", "it", "so", "this"]
NAMES, CITIES = ["anna", "peter", "maria", "john"], ["paris", "rome", "oslo", "lima"]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def parser() -> argparse.ArgumentParser:
    """The main CLI's shape: a parser whose subparsers get our commands."""
    main = argparse.ArgumentParser(prog="encoderlab")
    add_commands(main.add_subparsers(dest="command", required=True))
    return main


def run(*argv: str):
    args = parser().parse_args([str(a) for a in argv])
    return args.func(args)


def sentence(rng: random.Random, label: int) -> str:
    words = rng.choices(FILLER, k=rng.randint(3, 6))
    words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
    return " ".join(words)


def tiny_vocabulary(folder: Path, words: list[str]) -> tuple[Tokenizer, EncoderConfig]:
    """A WordPiece vocabulary of `words` written in folder, and a random 2-layer, 32-wide config for it."""
    # A fixed vocabulary (specials, characters, whole words) rather than a trained one: the WordPiece trainer orders
    # tied pieces differently from run to run, which moved these small tasks' results between runs.
    chars = sorted({c for word in words for c in word})
    vocab = dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars),
                           *sorted(set(words))])  # ordered, without repeats (".", "?" are words and characters)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab), encoding="utf-8")
    tokenizer = Tokenizer.from_pretrained(folder)
    return tokenizer, EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64,
                                                num_layers=2, vocab_size=tokenizer.vocab_size,
                                                max_position_embeddings=64)


def write_tiny_encoder(folder: Path, words: list[str], seed: int = 0) -> Path:
    """A random 2-layer, 32-wide encoder and a WordPiece vocabulary of `words`, saved in folder."""
    tokenizer, config = tiny_vocabulary(folder, words)
    torch.manual_seed(seed)
    save_pretrained(EncoderModel(config), folder)
    tokenizer.save(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A random 2-layer, 32-wide encoder and a WordPiece vocabulary of the synthetic words, saved as a folder."""
    words = POSITIVE + NEGATIVE + FILLER + NAMES + CITIES + ["lives", "in", "where", "does", "is", "from", "?", "."]
    return write_tiny_encoder(tmp_path_factory.mktemp("tiny"), words)


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory) -> tuple[Path, Path]:
    """Train and eval TSVs: the label says whether the sentence holds a positive or a negative word."""
    folder = tmp_path_factory.mktemp("sentiment")
    rng = random.Random(0)
    paths = []
    for name, count in (("train", 320), ("dev", 80)):
        labels = [i % 2 for i in range(count)]
        rows = "".join(f"{sentence(rng, y)}\t{'pos' if y else 'neg'}\n" for y in labels)
        path = folder / f"{name}.tsv"
        path.write_text("sentence\tlabel\n" + rows, encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def test_classifier_learns_saves_and_evaluates(tmp_path, tiny_model, sentiment, capsys):
    train, dev = sentiment
    out = tmp_path / "run"
    summary = run("finetune", "classify", "--model", tiny_model, "--train", train, "--eval", dev, "--out", out,
                  "--lr", "3e-3", "--epochs", "4", "--batch-size", "16", "--no-progress")
    history = summary["history"]
    assert len(history) == 4 and history[-1]["train_loss"] < history[0]["train_loss"]
    assert summary["best"]["eval_accuracy"] >= 0.85  # chance is 0.5
    assert (out / "model.safetensors").is_file() and (out / "training.json").is_file()
    model = load_model(out)
    assert isinstance(model, SequenceClassifier) and model.labels == ["neg", "pos"]
    capsys.readouterr()
    result = run("evaluate", "classify", "--model", out, "--data", dev, "--json", "--predictions", tmp_path / "p.jsonl")
    assert result["metrics"]["accuracy"] == pytest.approx(summary["best"]["eval_accuracy"])
    assert json.loads(capsys.readouterr().out)["metrics"]["accuracy"] == result["metrics"]["accuracy"]
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(predicted) == 80 and set(predicted) <= {"neg", "pos"}


def test_keep_state_and_the_class_of_binary_f1(tmp_path, tiny_model, sentiment, capsys):
    train, dev = sentiment
    argv = ["finetune", "classify", "--model", tiny_model, "--train", train, "--eval", dev, "--epochs", "1",
            "--max-train", "32", "--no-progress"]
    kept = run(*argv, "--out", tmp_path / "kept")
    assert (tmp_path / "kept" / "checkpoints" / "latest").is_file() and kept["f1_of"] == "class 'pos'"
    run(*argv, "--out", tmp_path / "dropped", "--no-keep-state")
    assert not (tmp_path / "dropped" / "checkpoints").exists() and (tmp_path / "dropped" / "model.safetensors").is_file()
    assert "(f1 of class 'pos')" in capsys.readouterr().out
    run("evaluate", "classify", "--model", tmp_path / "dropped", "--data", dev)
    assert capsys.readouterr().out.rstrip().endswith("(f1 of class 'pos')")


def test_bilstm_baseline_learns(tmp_path, tiny_model, sentiment):
    train, dev = sentiment
    summary = run("finetune", "classify", "--model", "bilstm", "--tokenizer", tiny_model, "--train", train,
                  "--eval", dev, "--out", tmp_path / "lstm", "--embed-dim", "16", "--lstm-hidden", "16",
                  "--lr", "1e-2", "--epochs", "3", "--batch-size", "16", "--no-progress")
    assert summary["best"]["eval_accuracy"] >= 0.85
    result = run("evaluate", "classify", "--model", tmp_path / "lstm", "--data", dev)
    assert result["metrics"]["accuracy"] == pytest.approx(summary["best"]["eval_accuracy"])


def test_seeds_report_median_and_spread(tmp_path, tiny_model, sentiment):
    train, dev = sentiment
    summary = run("finetune", "classify", "--model", tiny_model, "--train", train, "--eval", dev, "--out", tmp_path,
                  "--epochs", "0.5", "--seeds", "2", "--max-train", "64", "--no-progress")
    accuracy = summary["metrics"]["eval_accuracy"]
    assert summary["seeds"] == [42, 43] and len(accuracy["values"]) == 2
    assert accuracy["min"] <= accuracy["median"] <= accuracy["max"]
    assert (tmp_path / "seed-42" / "model.safetensors").is_file() and (tmp_path / "seeds.json").is_file()


def tagged(rng: random.Random) -> tuple[list[str], list[str]]:
    words, tags = [], []
    for _ in range(rng.randint(4, 8)):
        kind = rng.random()
        if kind < 0.2:
            words.append(rng.choice(NAMES)), tags.append("B-PER")
        elif kind < 0.4:
            words.append(rng.choice(CITIES)), tags.append("B-LOC")
        else:
            words.append(rng.choice(FILLER)), tags.append("O")
    return words, tags


def test_ner_learns_entities(tmp_path, tiny_model):
    rng = random.Random(1)
    for name, count in (("train.txt", 300), ("valid.txt", 60)):
        blocks = ["-DOCSTART- -X- -X- O\n"]
        for _ in range(count):
            words, tags = tagged(rng)
            if name == "train.txt":  # IOB1 in the training file: the reader normalizes it to IOB2
                tags = [t if i and tags[i - 1][2:] == t[2:] else t.replace("B-", "I-") for i, t in enumerate(tags)]
            blocks.append("".join(f"{w} NN O {t}\n" for w, t in zip(words, tags)))
        (tmp_path / name).write_text("\n".join(blocks), encoding="utf-8")
    summary = run("finetune", "ner", "--model", tiny_model, "--train", tmp_path / "train.txt",
                  "--eval", tmp_path / "valid.txt", "--out", tmp_path / "ner", "--lr", "3e-3", "--epochs", "3",
                  "--batch-size", "16", "--no-progress")
    assert summary["best"]["eval_f1"] >= 0.7
    assert load_model(tmp_path / "ner").labels == ["O", "B-LOC", "B-PER"]
    result = run("evaluate", "ner", "--model", tmp_path / "ner", "--data", tmp_path / "valid.txt")
    assert result["metrics"]["f1"] == pytest.approx(summary["best"]["eval_f1"])


def squad_file(path: Path, rng: random.Random, count: int, version: str = "1.1") -> None:
    paragraphs = []
    for i in range(count):
        name, city = rng.choice(NAMES), rng.choice(CITIES)
        filler = " ".join(rng.choices(FILLER, k=4))
        context = f"{filler} {name} lives in {city} . {' '.join(rng.choices(FILLER, k=3))}"
        qas = [{"id": f"q{i}", "question": f"where does {name} live ?",
                "answers": [{"text": city, "answer_start": context.index(f"in {city}") + 3}]}]
        if version == "2.0" and i % 4 == 0:
            qas = [{"id": f"q{i}", "question": "where is it from ?", "answers": [], "is_impossible": True}]
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}))


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_qa_learns_the_answer_span(tmp_path, tiny_model, version):
    rng = random.Random(2)
    squad_file(tmp_path / "train.json", rng, 240, version)
    squad_file(tmp_path / "dev.json", rng, 40, version)
    summary = run("finetune", "qa", "--model", tiny_model, "--train", tmp_path / "train.json", "--eval",
                  tmp_path / "dev.json", "--out", tmp_path / "qa", "--lr", "3e-3", "--epochs", "3",
                  "--batch-size", "16",
                  "--max-length", "32", "--doc-stride", "8", "--max-query-length", "8", "--no-progress")
    history = summary["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert summary["best"]["eval_f1"] >= 50  # always answering the right word; a random span scores near 0
    result = run("evaluate", "qa", "--model", tmp_path / "qa", "--data", tmp_path / "dev.json",
                 "--predictions", tmp_path / "pred.json")
    assert result["metrics"]["f1"] == pytest.approx(summary["best"]["eval_f1"])
    assert set(json.loads((tmp_path / "pred.json").read_text())) == {f"q{i}" for i in range(40)}


def test_embed_trains_with_scored_pairs_and_with_in_batch_negatives(tmp_path, tiny_model):
    rng = random.Random(3)
    rows = []
    for _ in range(160):
        a, b = sentence(rng, 1), sentence(rng, rng.randint(0, 1))
        rows.append((a, b, 5.0 if (any(w in b for w in POSITIVE)) else 0.0))
    scored_rows = "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows)
    (tmp_path / "scored.tsv").write_text("sentence1\tsentence2\tscore\n" + scored_rows)
    (tmp_path / "pairs.tsv").write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b, _ in rows[:80]))
    scored = run("finetune", "embed", "--model", tiny_model, "--train", tmp_path / "scored.tsv", "--eval",
                 tmp_path / "scored.tsv", "--out", tmp_path / "sts", "--lr", "3e-3", "--epochs", "4", "--no-progress")
    assert scored["info"]["loss"] == "cosent" and scored["best"]["eval_spearman"] > 0.5
    assert (tmp_path / "sts" / "1_Pooling" / "config.json").is_file()
    pairs = run("finetune", "embed", "--model", tiny_model, "--train", tmp_path / "pairs.tsv", "--eval",
                tmp_path / "pairs.tsv", "--out", tmp_path / "mnrl", "--epochs", "1", "--no-progress")
    assert pairs["info"]["loss"] == "mnrl" and "eval_mrr" in pairs["best"]
    result = run("evaluate", "embed", "--model", tmp_path / "sts", "--data", tmp_path / "scored.tsv")
    # near-tied cosines may swap ranks between batchings, so the re-evaluation agrees to 1e-3, not bit for bit
    assert result["metrics"]["spearman"] == pytest.approx(scored["best"]["eval_spearman"], abs=1e-3)


# ---- refusals ----------------------------------------------------------------------------------------------------
def test_bad_rows_and_labels_are_refused_before_training(tmp_path, tiny_model, sentiment):
    train, dev = sentiment
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\ngood film\tpos\nno label here\n")
    with pytest.raises(InputError, match=r"bad\.tsv:3: expected 2 fields"):
        run("finetune", "classify", "--model", tiny_model, "--train", bad, "--out", tmp_path / "x")
    unknown = tmp_path / "unknown.tsv"
    unknown.write_text("sentence\tlabel\ngood film\tneutral\n")
    with pytest.raises(InputError, match=r"unknown\.tsv:2: label 'neutral' is not one of the model's labels"):
        run("finetune", "classify", "--model", tiny_model, "--train", train, "--eval", unknown, "--out", tmp_path / "x")
    with pytest.raises(ConfigError, match="--metric 'bleu'"):
        run("finetune", "classify", "--model", tiny_model, "--train", train, "--eval", dev, "--out", tmp_path / "x",
            "--metric", "bleu")
    with pytest.raises(InputError, match="cannot be evaluated on ner"):
        run("evaluate", "ner", "--model", tiny_model, "--data", dev)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("task, options", [
    ("classify", ["--text-cols", "--label-col", "--no-header", "--task-type", "--labels", "--tokenizer"]),
    ("ner", ["--tag-col", "--token-col"]),
    ("qa", ["--doc-stride", "--max-query-length", "--max-answer-length", "--n-best"]),
    ("embed", ["--pooling", "--loss", "--scale"]),
])
def test_every_option_is_in_help(task, options, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["finetune", task, "--help"])
    text = capsys.readouterr().out
    common = ["--model", "--train", "--eval", "--out", "--lr", "--weight-decay", "--warmup-ratio", "--epochs",
              "--batch-size", "--max-length", "--seed", "--seeds", "--precision", "--metric", "--max-train",
              "--threads", "--device", "--save-every", "--resume", "--keep-state", "--no-keep-state"]
    assert all(option in text for option in common + options)


def test_evaluate_bf16_converts_the_weights_as_the_classify_pipeline_does(tmp_path, tiny_model, monkeypatch):
    """Issue 36, one meaning per flag: `evaluate --precision bf16` scores the model with bf16 weights, as `classify
    --precision bf16` runs it (it ran fp32 weights under bf16 autocast: another computation under the same name)."""
    monkeypatch.setattr(precisions, "bf16_supported", lambda device="cpu": True)  # the pipeline converts on any CPU
    folder, data = tmp_path / "scorer", tmp_path / "data.tsv"
    tokenizer = Tokenizer.from_pretrained(tiny_model)
    save_pretrained(load_model(tiny_model, kind="classify", problem_type="regression"), folder, tokenizer,
                    {"task": "classify", "max_length": 32})  # a random regression head: scores, not labels
    rng = random.Random(1)
    texts = [sentence(rng, i % 2) for i in range(40)]
    data.write_text("sentence\tlabel\n" + "".join(f"{text}\t0.5\n" for text in texts), encoding="utf-8")
    scores = {}
    for precision in ("fp32", "bf16"):
        run("evaluate", "classify", "--model", folder, "--data", data, "--precision", precision,
            "--predictions", tmp_path / f"{precision}.jsonl")
        scores[precision] = [json.loads(line) for line in (tmp_path / f"{precision}.jsonl").read_text().splitlines()]
    piped = [result["score"] for result in pipeline("classify", folder, "bf16")(texts)]
    assert scores["bf16"] == pytest.approx(piped, abs=1e-6)
    assert scores["bf16"] != pytest.approx(scores["fp32"], abs=1e-4)  # bf16 did change the computation
