"""Multi-label classification (encoderlab.tasks.multilabel): parity with transformers' multi_label_classification,
reading label sets, metrics, and a tiny model learning a synthetic two-topic task through the CLI."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from transformers import BertForSequenceClassification

from hf_oracle import TOL, VOCAB, randomize, tiny_hf_config
from test_tasks_finetune import CITIES, FILLER, NEGATIVE, POSITIVE, run, tiny_model  # noqa: F401

from encoderlab import EncoderConfig, SequenceClassifier, load_model, save_pretrained
from encoderlab.errors import InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.nn.output import batch_counts, step_means
from encoderlab.tasks.multilabel import MultiLabelTask, label_sets, multilabel_metrics
from encoderlab.tasks.readers import TextExample
from encoderlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tiny_config(**changes) -> EncoderConfig:
    return EncoderConfig.from_hf_dict(tiny_hf_config().to_dict() | {"architectures": None} | changes)


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(9) < torch.tensor([[9], [5], [3], [7]])).long()
    return {"input_ids": torch.randint(1, VOCAB, (4, 9), generator=gen) * mask, "attention_mask": mask,
            "token_type_ids": torch.zeros(4, 9, dtype=torch.long)}


TARGETS = torch.tensor([[1., 0., 1.], [0., 0., 0.], [1., 1., 1.], [0., 1., 0.]])


def test_we_load_and_score_what_transformers_trains_as_multi_label(tmp_path):
    hf = BertForSequenceClassification(tiny_hf_config(num_labels=3, problem_type="multi_label_classification"))
    randomize(hf.eval(), seed=5)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert isinstance(ours, SequenceClassifier) and ours.multilabel and not ours.regression
    with torch.no_grad():
        theirs = hf(**inputs(), labels=TARGETS)
        mine = ours(**inputs(), labels=TARGETS)
    assert_close(mine.logits, theirs.logits, **TOL)
    assert_close(mine.loss, theirs.loss, **TOL)  # BCEWithLogits, the mean over every (row, class)


def test_transformers_loads_our_multilabel_head_as_multi_label(tmp_path):
    ours = SequenceClassifier(tiny_config(id2label={0: "a", 1: "b", 2: "c"}), 3, multilabel=True).eval()
    randomize(ours, seed=6)
    save_pretrained(ours, tmp_path)
    hf = BertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert hf.config.problem_type == "multi_label_classification"
    with torch.no_grad():
        assert_close(hf(**inputs(1), labels=TARGETS).loss, ours(**inputs(1), labels=TARGETS).loss, **TOL)
    assert load_model(tmp_path).multilabel


def test_the_task_loss_is_counted_per_row_and_class_and_its_step_mean_is_torchs_bce_mean(minilm_path):
    """The multilabel term's unit is the (row, class) cell: its sum over the step's count of that unit (the loop's one
    division, no per-task patch) equals torch's BCEWithLogits mean on random targets."""
    task = MultiLabelTask(Tokenizer.from_pretrained(minilm_path), 16, ["a", "b", "c"])
    model = SequenceClassifier(tiny_config(), 3, multilabel=True).eval()
    randomize(model, seed=7)
    targets = torch.randint(0, 2, (4, 3), generator=torch.Generator().manual_seed(3)).float()
    batch = inputs(2) | {"labels": targets}
    with torch.no_grad():
        terms = task.loss(model, batch)
        logits = model(**inputs(2)).logits
    (term,) = terms.values()
    assert term.unit == "label_cells" and int(term.count) == targets.numel() == int(batch_counts(batch)[term.unit])
    (mean,) = step_means(terms, batch_counts(batch)).values()
    assert_close(mean, torch.nn.functional.binary_cross_entropy_with_logits(logits, targets))


def example(label: str, line: int = 1) -> TextExample:
    return TextExample(("some text",), label, f"train.tsv:{line}")


def test_label_sets_are_read_from_separated_cells(minilm_path):
    examples = [example("sports|politics"), example("politics", 2), example(" art | sports ", 3)]
    assert label_sets(examples) == ["art", "politics", "sports"]
    task = MultiLabelTask(Tokenizer.from_pretrained(minilm_path), 16, label_sets(examples))
    assert [task.target(e) for e in examples] == [[0, 1, 1], [0, 1, 0], [1, 0, 1]]
    with pytest.raises(InputError, match=r"train.tsv:4: label 'music' is not one of"):
        task.target(example("music|art", 4))
    with pytest.raises(InputError, match=r"train.tsv:5: empty class name"):
        task.target(example("art||sports", 5))


def test_metrics_are_micro_and_macro_f1_over_the_classes():
    from sklearn.metrics import f1_score  # the oracle, imported here: 3.4 CPU s in every xdist worker's collection

    rng = np.random.default_rng(0)
    gold, predicted = rng.integers(0, 2, (50, 4)), rng.integers(0, 2, (50, 4))
    got = multilabel_metrics(gold, predicted)
    # micro F1 by hand: pooled true positives over pooled predicted and gold positives
    tp = (gold & predicted).sum()
    assert got["micro_f1"] == pytest.approx(2 * tp / (gold.sum() + predicted.sum()))
    assert got["macro_f1"] == pytest.approx(f1_score(gold, predicted, average="macro"))
    assert got["subset_accuracy"] == pytest.approx(np.mean([(g == p).all() for g, p in zip(gold, predicted)]))
    gold[:, 0], predicted[:, 0] = 0, 0  # a class neither gold nor predicted: F1 0 (zero_division=0), still averaged
    got = multilabel_metrics(gold, predicted)
    assert got["macro_f1"] == pytest.approx(f1_score(gold, predicted, average="macro", zero_division=0))
    assert got["micro_f1"] == pytest.approx(f1_score(gold, predicted, average="micro", zero_division=0))


def topics(rng: random.Random) -> tuple[str, str]:
    """A sentence and its topics: 'mood' if it holds a sentiment word, 'place' if a city (one or both)."""
    words = rng.choices(FILLER, k=rng.randint(3, 5))
    chosen = rng.choice([["mood"], ["place"], ["mood", "place"]])
    pools = {"mood": POSITIVE + NEGATIVE, "place": CITIES}
    for topic in chosen:
        words.insert(rng.randint(0, len(words)), rng.choice(pools[topic]))
    return " ".join(words), "|".join(chosen)


def test_a_tiny_model_learns_label_sets_saves_evaluates_and_serves(tmp_path, tiny_model):  # noqa: F811
    rng = random.Random(0)
    for name, count in (("train", 320), ("dev", 80)):
        rows = [topics(rng) for _ in range(count)]
        (tmp_path / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    out = tmp_path / "run"
    summary = run("finetune", "classify", "--task-type", "multilabel", "--model", tiny_model,
                  "--train", tmp_path / "train.tsv", "--eval", tmp_path / "dev.tsv", "--out", out,
                  "--lr", "3e-3", "--epochs", "4", "--batch-size", "16", "--no-progress")
    assert summary["metric"] == "micro_f1" and summary["best"]["eval_micro_f1"] >= 0.85
    assert json.loads((out / "task.json").read_text())["task_type"] == "multilabel"
    model = load_model(out)
    assert model.multilabel and model.labels == ["mood", "place"]
    result = run("evaluate", "classify", "--model", out, "--data", tmp_path / "dev.tsv",
                 "--predictions", tmp_path / "p.jsonl")
    assert result["metrics"]["micro_f1"] == pytest.approx(summary["best"]["eval_micro_f1"])
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(predicted) == 80 and all(set(p) <= {"mood", "place"} for p in predicted)
    texts = [line.split("\t")[0] for line in (tmp_path / "dev.tsv").read_text().splitlines()[1:]]
    served = pipeline("classify", out)(texts)  # the pipeline decides as evaluate did
    assert [r["labels"] for r in served] == predicted
    assert set(served[0]["scores"]) == {"mood", "place"} and "label" not in served[0]


def test_the_classify_command_prints_a_multilabel_models_label_sets(tmp_path, capsys):
    tokenizer = Tokenizer.train_from_iterator("wordpiece", ["a calm day in a busy city"] * 3, vocab_size=60,
                                              min_frequency=1)
    config = tiny_config(vocab_size=tokenizer.vocab_size, id2label={0: "mood", 1: "place"})
    model = SequenceClassifier(config, 2, multilabel=True).eval()
    with torch.no_grad():
        model.head.out.bias.copy_(torch.tensor([10.0, -10.0]))  # every text: mood, never place
    save_pretrained(model, tmp_path, tokenizer)
    from encoderlab.cli import main

    assert main(["classify", "--model", str(tmp_path), "a calm day", "a busy city"]) == 0
    assert capsys.readouterr().out.splitlines() == ["mood", "mood"]
