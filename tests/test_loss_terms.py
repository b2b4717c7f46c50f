"""Loss terms in their units and model kinds as class attributes: every registered model class has its own kind and
loads through it; a step split into micro-batches gives the gradient of the whole batch for each task's loss, because
each term is divided by the whole step's count of its own unit (nn.output.step_means)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from encoderlab import EncoderConfig, load_model, save_pretrained
from encoderlab.nn.model import MODEL_CLASSES, Model, SequenceClassifier, SpanExtractor, TokenClassifier, by_kind
from encoderlab.tasks.classify import ClassifyTask
from encoderlab.tasks.multilabel import MultiLabelTask
from encoderlab.tasks.objective import TaskObjective
from encoderlab.tasks.tagging import TagTask
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.distributed import Dist
from encoderlab.train.loop import step_counts

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

VOCAB, LABELS = 99, 3


def tiny(family: str = "bert") -> EncoderConfig:
    """2 layers, 32 wide, no dropout: two ways of splitting a batch compute the same function."""
    return EncoderConfig.from_preset(f"{family}-tiny" if family == "bert" else "electra-mini", vocab_size=VOCAB,
                                     hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                     max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0,
                                     embedding_size=None, labels=[f"L{i}" for i in range(LABELS)])


@pytest.mark.parametrize("kind", sorted(MODEL_CLASSES))
def test_every_registered_model_class_declares_its_own_kind_and_loads_through_it(kind: str, tmp_path: Path) -> None:
    cls = MODEL_CLASSES[kind]
    assert cls.kind == kind and issubclass(cls, Model)
    family = "electra" if kind == "rtd" else "bert"
    torch.manual_seed(0)
    save_pretrained(cls(tiny(family)), tmp_path)
    assert type(load_model(tmp_path, kind=kind)) is cls
    assert type(load_model(tmp_path)) is cls  # config.json's architecture (an embedder's files) names the same class


def test_the_model_table_has_every_model_class_once_and_refuses_a_second_class_of_one_kind() -> None:
    defined = {cls for cls in vars(__import__("encoderlab.nn.model", fromlist=["_"])).values()
               if isinstance(cls, type) and issubclass(cls, Model) and cls is not Model}
    assert defined == set(MODEL_CLASSES.values())
    impostor = type("Impostor", (TokenClassifier,), {"kind": "classify"})
    with pytest.raises(TypeError, match="Impostor and SequenceClassifier both declare kind 'classify'"):
        by_kind(SequenceClassifier, impostor)


def test_problem_type_alone_chooses_regression_and_a_folder_keeps_it(tmp_path: Path) -> None:
    config = tiny()
    assert not SequenceClassifier(config, LABELS).regression
    model = SequenceClassifier(config.replace(problem_type="regression"), 1)
    assert model.regression and model.num_outputs == 1
    save_pretrained(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.regression and loaded.config.problem_type == "regression"
    assert not load_model(tmp_path, problem_type="single_label_classification").regression


def batch(kind: str, rows: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows of different lengths with labels of `kind`: tags on some tokens only, so the halves count differently."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 3, 9, 5, 7, 11][:rows])
    mask = (torch.arange(12) < lengths[:, None]).long()  # (B, T)
    out = {"input_ids": torch.randint(1, VOCAB, (rows, 12), generator=gen) * mask, "attention_mask": mask,
           "token_type_ids": torch.zeros(rows, 12, dtype=torch.long)}
    if kind == "ner":
        tags = torch.randint(0, LABELS, (rows, 12), generator=gen)
        tagged = (torch.rand(rows, 12, generator=gen) < 0.5) & mask.bool()
        out["labels"] = tags.masked_fill(~tagged, -100)
    elif kind == "multilabel":
        out["labels"] = torch.randint(0, 2, (rows, LABELS), generator=gen).float()
    elif kind == "regression":
        out["labels"] = torch.rand(rows, generator=gen) * 5
    elif kind == "qa":
        out["labels"] = torch.stack([torch.randint(0, 3, (rows,), generator=gen),
                                     torch.randint(3, 6, (rows,), generator=gen)], 1)
    else:
        out["labels"] = torch.randint(0, LABELS, (rows,), generator=gen)
    return out


def objective(kind: str, tokenizer: Tokenizer) -> TaskObjective:
    """A fresh tiny task model and the task whose loss fine-tuning trains it on."""
    torch.manual_seed(0)
    config = tiny().replace(problem_type="regression") if kind == "regression" else tiny()
    names = [f"L{i}" for i in range(LABELS)]
    model, task = {
        "classify": lambda: (SequenceClassifier(config, LABELS), ClassifyTask(tokenizer, 16, names)),
        "regression": lambda: (SequenceClassifier(config, 1), ClassifyTask(tokenizer, 16, None, regression=True)),
        "multilabel": lambda: (SequenceClassifier(config, LABELS, multilabel=True),
                               MultiLabelTask(tokenizer, 16, names)),
        "ner": lambda: (TokenClassifier(config, LABELS), TagTask(tokenizer, 16, names)),
        "qa": lambda: (SpanExtractor(config), ClassifyTask(tokenizer, 16, names)),  # the default Task.loss
    }[kind]()
    return TaskObjective(model, task)


def gradients(kind: str, tokenizer: Tokenizer, pieces: list[slice]) -> dict[str, torch.Tensor]:
    """The gradient of one step over the micro-batches cut from one batch, as the loop normalises it."""
    whole, target = batch(kind), objective(kind, tokenizer)
    micro = [{k: v[piece] for k, v in whole.items()} for piece in pieces]
    counts = step_counts(micro, Dist())
    for part in micro:
        loss, _ = target(part, counts)
        loss.backward()
    return {name: p.grad.clone() for name, p in target.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["classify", "regression", "multilabel", "ner", "qa"])
def test_two_half_batches_give_the_gradient_of_one_batch(kind: str, minilm_path: Path) -> None:
    """Uneven halves (1 and 3 rows; NER's tagged tokens differ between them): a mean per micro-batch would not match."""
    tokenizer = Tokenizer.from_pretrained(minilm_path)
    one, halves = (gradients(kind, tokenizer, pieces) for pieces in ([slice(0, 4)], [slice(0, 1), slice(1, 4)]))
    assert one.keys() == halves.keys() and one
    for name in one:
        torch.testing.assert_close(halves[name], one[name], rtol=1e-4, atol=1e-6, msg=name)
