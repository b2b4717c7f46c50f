"""One model stack: every architecture is picked from config.json by one loader, every kind returns a
ModelOutput whose loss is there exactly when labels are given, and the task losses equal transformers'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close
from transformers import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

from hf_oracle import TOL, VOCAB, randomize, tiny_hf_config
from test_family import HF_CONFIGS, family_batch

from encoderlab import BiLSTMClassifier, CheckpointError, EncoderConfig, ModelOutput, load_model, save_pretrained
from encoderlab.models import FAMILIES
from encoderlab import checkpoint
from encoderlab.checkpoint import architecture_name, architectures
from encoderlab.engine import forward, sentence_vectors
from encoderlab.nn.model import MODEL_CLASSES, EncoderModel, SentenceEmbedder
from encoderlab.nn.output import batch_counts

LABELS = ["a", "b", "c"]


def tiny_config(family: str) -> EncoderConfig:
    """The family's tiny config (test_family.py), with three labels for the classifiers."""
    data = HF_CONFIGS[family]().to_dict() | {"architectures": None}
    return EncoderConfig.from_hf_dict(data).replace(labels=LABELS)


def build(kind: str, config: EncoderConfig) -> torch.nn.Module:
    """A fresh model of our `kind`, randomized so no tensor sits at its init value."""
    torch.manual_seed(0)
    model = MODEL_CLASSES[kind](config).eval()
    randomize(model, seed=1)
    return model


FAMILY_CLASSES = sorted((spec.model_type, architecture_name(spec, cls), kind) for spec in FAMILIES.values()
                        for kind, cls in MODEL_CLASSES.items()
                        if kind not in ("embed", "bilstm") and (cls.hf_suffix or kind in spec.architectures))


def test_the_registry_names_every_architecture_of_every_family() -> None:
    ARCHITECTURES = architectures()
    assert ARCHITECTURES["RobertaForTokenClassification"].kind == "ner"
    assert ARCHITECTURES["DebertaV2ForQuestionAnswering"].kind == "qa"
    assert ARCHITECTURES["ElectraForPreTraining"].kind == "rtd" and ARCHITECTURES["BertForPreTraining"].kind == "pretraining"
    assert ARCHITECTURES["DistilBertModel"] is EncoderModel
    assert len(FAMILY_CLASSES) == len(ARCHITECTURES) == sum(len(s.architectures) + 3 for s in FAMILIES.values())


@pytest.mark.parametrize("family, architecture, kind", FAMILY_CLASSES)
def test_load_model_picks_the_class_config_json_names(tmp_path: Path, family: str, architecture: str,
                                                      kind: str) -> None:
    model = build(kind, tiny_config(family))
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [architecture]
    loaded = load_model(tmp_path)
    assert type(loaded) is type(model) and checkpoint.architecture(loaded) == architecture
    batch = family_batch(model.config)
    with torch.no_grad():
        ours, again = model(**batch), loaded(**batch)
    assert_close(again.logits if again.logits is not None else again.last_hidden_state,
                 ours.logits if ours.logits is not None else ours.last_hidden_state)


def test_unknown_architecture_is_refused_naming_the_file_and_the_class(tmp_path: Path) -> None:
    save_pretrained(build("base", tiny_config("bert")), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"architectures": ["BertForMultipleChoice"]}))
    with pytest.raises(CheckpointError, match="config.json: architecture 'BertForMultipleChoice' is not one"):
        load_model(tmp_path)
    assert type(load_model(tmp_path, kind="base")) is EncoderModel  # asked for explicitly, the encoder still loads


def test_without_architectures_a_folder_is_the_bare_model_and_a_sentence_transformers_one_an_embedder(
        tmp_path: Path) -> None:
    save_pretrained(build("base", tiny_config("bert")), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    assert type(load_model(tmp_path)) is EncoderModel
    embedder = load_model("minilm")
    assert type(embedder) is SentenceEmbedder and embedder.pooling == "mean"  # its modules.json and 1_Pooling


def batch_and_labels(kind: str, config: EncoderConfig) -> tuple[dict, dict]:
    """A family batch and the labels our `kind` takes (keyword arguments of forward)."""
    batch = family_batch(config)
    B, T = batch["input_ids"].shape
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 3, (B, T), generator=gen).masked_fill(batch["attention_mask"] == 0, -100)
    labels = {"mlm": {"labels": torch.randint(0, VOCAB, (B, T), generator=gen).masked_fill(tokens < 1, -100)},
              "pretraining": {"labels": torch.randint(0, VOCAB, (B, T), generator=gen).masked_fill(tokens < 1, -100),
                              "next_sentence_label": torch.tensor([0, 1, 1])},
              "rtd": {"labels": tokens.clamp(max=1).masked_fill(tokens < 0, -100)},
              "classify": {"labels": torch.tensor([0, 2, 1])}, "ner": {"labels": tokens},
              "qa": {"labels": torch.tensor([[1, 2], [3, 3], [0, 0]])}}
    return batch, labels.get(kind, {})


@pytest.mark.parametrize("kind", sorted(set(MODEL_CLASSES) - {"bilstm"}))  # the BiLSTM: its own test below
@pytest.mark.parametrize("family", ["bert", "electra"])
def test_every_kind_returns_a_model_output_with_a_loss_exactly_when_labels_are_given(family: str, kind: str) -> None:
    if kind in ("pretraining", "rtd") and kind not in FAMILIES[family].architectures:
        pytest.skip(f"{family} has no {kind} class")
    model = build(kind, tiny_config(family))
    batch, labels = batch_and_labels(kind, model.config)
    out = model(**batch)
    assert isinstance(out, ModelOutput) and out.last_hidden_state.shape[:2] == batch["input_ids"].shape
    assert out.loss is None and out.losses == {}
    if labels:
        labelled = model(**batch, **labels)
        assert labelled.loss.dim() == 0 and torch.isfinite(labelled.loss) and labelled.loss > 0
        labelled.loss.backward()  # a loss a training loop can use
        assert next(model.parameters()).grad is not None
    else:
        assert out.logits is None  # the bare encoder and the embedder have no head logits
        assert (out.embedding is not None) == (kind == "embed")


# What each term counts: its units in the labels a model is given (None: not labelled).
UNITS = {"mlm": lambda labels: (labels["labels"] != -100).sum(),
         "nsp": lambda labels: (labels["next_sentence_label"] != -100).sum(),
         "rtd": lambda labels: (labels["labels"] != -100).sum(), "ner": lambda labels: (labels["labels"] != -100).sum(),
         "classify": lambda labels: labels["labels"].shape[0],
         "qa_start": lambda labels: labels["labels"].shape[0], "qa_end": lambda labels: labels["labels"].shape[0]}


@pytest.mark.parametrize("kind", ["mlm", "pretraining", "rtd", "classify", "ner", "qa"])
def test_the_model_gives_each_loss_term_as_a_sum_and_its_count_whose_means_make_the_loss(kind: str) -> None:
    """What the training loop reads: (summed loss, count) per term, so it can divide by a whole step's counts."""
    family = "electra" if kind == "rtd" else "bert"
    model = build(kind, tiny_config(family))
    batch, labels = batch_and_labels(kind, model.config)
    if kind == "pretraining":
        labels["next_sentence_label"] = torch.tensor([0, -100, 1])  # an unlabelled pair counts nowhere
    out = model(**batch, **labels)
    expected = {"mlm": ["mlm"], "pretraining": ["mlm", "nsp"], "qa": ["qa_start", "qa_end"]}.get(kind, [kind])
    assert sorted(out.sums) == sorted(expected)
    for name, (total, count, unit) in out.sums.items():
        assert total.dim() == 0 and int(count) == int(UNITS[name](labels)) > 0
        assert int(batch_counts(batch | labels)[unit]) == int(count)  # what the loop divides by: the term's count
        assert_close(out.losses[name], total / count)
    assert_close(out.loss, sum(total / count for total, count, _ in out.sums.values()))


def test_a_span_past_the_window_counts_only_on_its_side_as_in_transformers(tmp_path: Path) -> None:
    """transformers ignores a start or end position clamped to T: each side is a mean over its own positions."""
    torch.manual_seed(0)
    hf = BertForQuestionAnswering(tiny_hf_config(num_labels=2))
    randomize(hf.eval(), seed=3)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    batch, _ = batch_and_labels("qa", ours.config)
    T = batch["input_ids"].shape[1]
    positions = torch.tensor([[1, T + 5], [3, 3], [0, 2]])
    with torch.no_grad():
        out = ours(**batch, labels=positions)
        theirs = hf(**batch, start_positions=positions[:, 0], end_positions=positions[:, 1]).loss
    assert [int(count) for _, count, _ in out.sums.values()] == [3, 2]
    assert_close(out.loss, theirs, **TOL)


def test_one_output_type_from_the_encoder_to_the_engine() -> None:
    model = build("embed", tiny_config("bert"))
    batch, _ = batch_and_labels("embed", model.config)
    assert isinstance(model.encoder(batch["input_ids"], batch["attention_mask"]), ModelOutput)
    out = forward(model, batch)
    assert isinstance(out, ModelOutput) and out.logits is None  # sentence vectors are the embedding, not logits
    assert_close(sentence_vectors(out, batch["attention_mask"], "cls", normalize=False), out.embedding)


def test_bilstm_returns_the_same_output_type(tmp_path: Path) -> None:
    model = BiLSTMClassifier(VOCAB, 2, embed_dim=12, hidden_size=8).eval()
    batch, _ = batch_and_labels("classify", tiny_config("bert"))
    assert model(**batch).loss is None and model(**batch, labels=torch.tensor([0, 1, 1])).loss > 0
    save_pretrained(model, tmp_path)
    assert type(load_model(tmp_path)) is BiLSTMClassifier


HF_TASKS = {"classify": BertForSequenceClassification, "regression": BertForSequenceClassification,
            "ner": BertForTokenClassification, "qa": BertForQuestionAnswering}


@pytest.mark.parametrize("task", list(HF_TASKS))
def test_task_losses_equal_transformers(tmp_path: Path, task: str) -> None:
    torch.manual_seed(0)
    hf = HF_TASKS[task](tiny_hf_config(num_labels={"regression": 1, "qa": 2}.get(task, 3),
                                       **({"problem_type": "regression"} if task == "regression" else {})))
    randomize(hf.eval(), seed=3)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    batch, labels = batch_and_labels("qa" if task == "qa" else "ner" if task == "ner" else "classify", ours.config)
    if task == "regression":
        labels = {"labels": torch.tensor([0.5, -1.0, 2.0])}
    theirs = {"start_positions": labels["labels"][:, 0], "end_positions": labels["labels"][:, 1]} if task == "qa" \
        else labels
    with torch.no_grad():
        assert_close(ours(**batch, **labels).loss, hf(**batch, **theirs).loss, **TOL)


def test_a_new_task_head_starts_fresh_on_a_pretrained_encoder(tmp_path: Path) -> None:
    save_pretrained(build("pretraining", tiny_config("bert")), tmp_path)
    torch.manual_seed(4)
    model = load_model(tmp_path, kind="ner", num_labels=5)
    assert model.classifier.weight.shape == (5, 32) and torch.all(model.classifier.bias == 0)
    assert model.classifier.weight.std() < 3 * model.config.initializer_range  # BERT's init, not the file's
    save_pretrained(model, tmp_path / "ner")
    with pytest.raises(CheckpointError, match="missing tensors: cls.predictions"):  # an MLM head is never made up
        load_model(tmp_path / "ner", kind="mlm")
