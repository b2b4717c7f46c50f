"""Task models: an encoder plus a head, saved as the Hugging Face folder transformers loads for that task.

| class              | head                                   | saved as (transformers class, X = the family) | head tensors |
|--------------------|----------------------------------------|-----------------------------------|--------------------|
| SequenceClassifier | the family's head (encoderlab.tasks.heads) | XForSequenceClassification   | classifier.* (+ pre_classifier.*, pooler.*) |
| TokenClassifier    | each token -> dropout -> linear        | XForTokenClassification           | classifier.*       |
| SpanExtractor      | each token -> linear -> start, end     | XForQuestionAnswering             | qa_outputs.*       |
| SentenceEmbedder   | mean or [CLS] pooling, no parameters   | XModel (+ sentence-transformers files) | none          |
| BiLSTMClassifier   | a baseline from scratch: embeddings -> BiLSTM -> max pool -> linear | our own folder | all |

X is the family's class stem (Bert, Roberta, DistilBert, Albert, Electra, DebertaV2). The backbone goes through
the family's weight map (encoderlab.checkpoint) under its prefix (`bert.`, `roberta.`, ...); the head under
transformers' names. A head the user supplies (any module, (B, H) -> (B, L)) takes the place of the output
layer of the family's classification head; only an nn.Linear gives a folder transformers can load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import save_file
from torch import nn

from encoderlab.checkpoint import (has_pooler, hf_to_ours, normalize_hf_state, ours_to_hf, read_weights,
                                   resolve_model_path)
from encoderlab.config import EncoderConfig
from encoderlab.engine import settings
from encoderlab.errors import CheckpointError
from encoderlab.io import atomic_write, atomic_write_text, read_json_file
from encoderlab.models import FAMILIES, FamilySpec
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.heads import Pooler
from encoderlab.nn.model import EncoderModel
from encoderlab.nn.pooling import pool
from encoderlab.tasks.heads import SequenceHead, init_linear

TASK_FILE = "task.json"  # what encoderlab needs beyond config.json: task, columns, max_length, pooling


def hf_architecture(config: EncoderConfig, task: str | None) -> str:
    """transformers' class name for a family and task: "RobertaForTokenClassification"; the bare model for None."""
    base = FAMILIES[config.model_type].architectures["base"]
    return base if task is None else f"{base.removesuffix('Model')}For{task}"


class TaskModel(nn.Module):
    """An EncoderModel backbone and a head; subclasses name their transformers task and head layers."""

    task: ClassVar[str | None] = None  # transformers' task suffix ("TokenClassification"); None: the bare model

    def __init__(self, backbone: EncoderModel, pooler: bool = False) -> None:
        """pooler: whether the head reads the backbone's [CLS] pooler (one is made if the checkpoint had none)."""
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        if pooler and backbone.pooler is None:  # a checkpoint without pooler weights (e.g. MLM only)
            backbone.pooler = Pooler(self.config.hidden_size)
            init_linear(backbone.pooler.dense, self.config.initializer_range)
        if not pooler:
            backbone.pooler = None  # transformers' task classes build XModel(add_pooling_layer=False)

    @property
    def architecture(self) -> str:
        """transformers' class for this family and task."""
        return hf_architecture(self.config, self.task)

    @property
    def labels(self) -> list[str] | None:
        """Class or tag names (config.json id2label)."""
        return self.config.labels

    @classmethod
    def head_names(cls, spec: FamilySpec) -> list[tuple[str, str]]:
        """(our name prefix, transformers' name prefix) of each head layer in this family."""
        return []

    def head_state(self) -> dict[str, torch.Tensor]:
        """The head's tensors under transformers' names."""
        renames = self.head_names(FAMILIES[self.config.model_type])
        out = {}
        for name, tensor in self.state_dict().items():
            if name.startswith("backbone."):
                continue
            ours, theirs = next((o, t) for o, t in renames if name.startswith(o))
            out[theirs + name.removeprefix(ours)] = tensor
        return out

    def load_head(self, hf_head: dict[str, torch.Tensor]) -> None:
        """Assign head tensors given under transformers' names (their names and shapes already checked)."""
        renames = self.head_names(FAMILIES[self.config.model_type])
        ours = {}
        for name, tensor in hf_head.items():
            mine, theirs = max(((o, t) for o, t in renames if name.startswith(t)), key=lambda r: len(r[1]))
            ours[mine + name.removeprefix(theirs)] = tensor
        self.load_state_dict({**{f"backbone.{k}": v for k, v in self.backbone.state_dict().items()}, **ours},
                             assign=True)

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Every tensor under transformers' names: the prefixed backbone (`roberta.`, ...), then the head."""
        spec = FAMILIES[self.config.model_type]
        prefix = spec.base_prefix if self.task else ""
        backbone = {prefix + k: v for k, v in ours_to_hf(spec, self.backbone).items()}
        return backbone | {k: v.detach().clone().contiguous() for k, v in self.head_state().items()}

    def hf_config(self) -> dict:
        """config.json for this model's transformers class."""
        return self.config.to_hf_dict(self.architecture)


class SequenceClassifier(TaskModel):
    """The family's classification head on the encoder -> logits (B, L); one output for regression."""

    task = "SequenceClassification"

    def __init__(self, backbone: EncoderModel, num_labels: int | None = None, head: nn.Module | None = None,
                 regression: bool = False) -> None:
        """head: a module (B, H) -> (B, L) in place of the output layer of the family's head."""
        if head is None and num_labels is None:
            raise ValueError("SequenceClassifier needs num_labels or a head module")
        layout = FAMILIES[backbone.config.model_type].classifier_head
        super().__init__(backbone, pooler=layout.dense is None)
        self.regression = regression
        self.head = SequenceHead(layout, self.config, num_labels, head)

    @classmethod
    def head_names(cls, spec: FamilySpec) -> list[tuple[str, str]]:
        layout = spec.classifier_head
        return [("head.out.", layout.out)] + ([("head.dense.", layout.dense)] if layout.dense else [])

    @property
    def num_outputs(self) -> int:
        """Logits per input: classes, or 1 for regression."""
        out = self.head.out
        if isinstance(out, nn.Linear):
            return out.out_features
        return 1 if self.regression else len(self.labels or [])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        out = self.backbone(input_ids, attention_mask, token_type_ids)
        return self.head(out.last_hidden_state, out.pooled)  # (B, L)

    def hf_config(self) -> dict:
        config = super().hf_config()
        if self.regression:
            config.update(num_labels=1, problem_type="regression")
        else:
            config["problem_type"] = "single_label_classification"
            config.setdefault("id2label", {str(i): f"LABEL_{i}" for i in range(self.num_outputs)})
        return config


class TokenClassifier(TaskModel):
    """Token vectors (B, T, H) -> dropout -> linear -> logits (B, T, L)."""

    task = "TokenClassification"

    def __init__(self, backbone: EncoderModel, num_labels: int) -> None:
        super().__init__(backbone)
        self.dropout = Dropout(self.config.hidden_dropout)
        self.classifier = init_linear(nn.Linear(self.config.hidden_size, num_labels), self.config.initializer_range)

    @classmethod
    def head_names(cls, spec: FamilySpec) -> list[tuple[str, str]]:
        return [("classifier.", "classifier.")]

    def hf_config(self) -> dict:
        config = super().hf_config()
        config.setdefault("id2label", {str(i): f"LABEL_{i}" for i in range(self.classifier.out_features)})
        return config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        return self.classifier(self.dropout(hidden))  # (B, T, L)


class SpanExtractor(TaskModel):
    """Token vectors (B, T, H) -> linear -> start and end logits, each (B, T) (BERT paper, section 4.2)."""

    task = "QuestionAnswering"

    def __init__(self, backbone: EncoderModel) -> None:
        super().__init__(backbone)
        self.qa_outputs = init_linear(nn.Linear(self.config.hidden_size, 2), self.config.initializer_range)

    @classmethod
    def head_names(cls, spec: FamilySpec) -> list[tuple[str, str]]:
        return [("qa_outputs.", "qa_outputs.")]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.backbone(input_ids, attention_mask, token_type_ids).last_hidden_state
        start, end = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        return start, end


class SentenceEmbedder(TaskModel):
    """Token vectors pooled into one (B, H) vector per text: mean over real tokens or [CLS]."""

    def __init__(self, backbone: EncoderModel, pooling: str = "mean") -> None:
        nn.Module.__init__(self)  # the pooler is kept as loaded: the folder stays a complete XModel
        self.backbone, self.config, self.pooling = backbone, backbone.config, pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids, attention_mask, token_type_ids).last_hidden_state
        return pool(hidden.float(), attention_mask, self.pooling)  # (B, H)



class BiLSTMClassifier(nn.Module):
    """Baseline from scratch: token ids -> embeddings -> BiLSTM -> max over time (B, 2h) -> linear (B, L).

    Max pooling over the BiLSTM states follows InferSent (Conneau et al. 2017, section 3.2.2). It reads the
    same token ids as the encoders (any tokenizer) but learns its own embeddings.
    """

    architecture = "BiLSTMClassifier"

    def __init__(self, vocab_size: int, num_labels: int, pad_id: int = 0, embed_dim: int = 300,
                 hidden_size: int = 256, num_layers: int = 1, dropout: float = 0.3,
                 labels: list[str] | None = None, regression: bool = False) -> None:
        super().__init__()
        self.settings = {"vocab_size": vocab_size, "num_labels": num_labels, "pad_id": pad_id, "embed_dim": embed_dim,
                         "hidden_size": hidden_size, "num_layers": num_layers, "dropout": dropout}
        self.labels, self.regression = labels, regression
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True, bidirectional=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        lengths = attention_mask.sum(1).clamp(min=1).cpu()
        x = self.dropout(self.embedding(input_ids))  # (B, T, E)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=input_ids.shape[1])
        states = states.masked_fill(~attention_mask.bool()[..., None], float("-inf"))  # (B, T, 2h)
        return self.classifier(self.dropout(states.max(1).values))  # (B, L)

    def hf_state(self) -> dict[str, torch.Tensor]:
        """The tensors to save (our own names: no transformers class exists for this model)."""
        return {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}

    def hf_config(self) -> dict:
        """config.json of our own format."""
        config = {"architectures": [self.architecture], "model_type": "encoderlab-bilstm", **self.settings}
        if self.labels:
            config["id2label"] = {str(i): label for i, label in enumerate(self.labels)}
        if self.regression:
            config["problem_type"] = "regression"
        return config


# ---- loading and saving ----------------------------------------------------------------------------------
TASK_CLASSES: dict[str, type[TaskModel]] = {cls.task: cls for cls in (SequenceClassifier, TokenClassifier,
                                                                       SpanExtractor)}


def task_class(architecture: str | None) -> type[TaskModel]:
    """Our class for a config.json architecture ("AlbertForTokenClassification" -> TokenClassifier); any other
    (a bare XModel, an MLM checkpoint) is a SentenceEmbedder."""
    for task, cls in TASK_CLASSES.items():
        if architecture and architecture.endswith(f"For{task}"):
            return cls
    return SentenceEmbedder


def build_backbone(config: EncoderConfig, hf_state: dict[str, torch.Tensor], source: str,
                   architecture: str | None = None) -> EncoderModel:
    """An EncoderModel from Hugging Face tensors; the task head of `architecture` and MLM/NSP heads are left out."""
    spec = FAMILIES[config.model_type]
    head = tuple(theirs for _, theirs in task_class(architecture).head_names(spec))
    state = normalize_hf_state(spec, {k: v for k, v in hf_state.items() if not (head and k.startswith(head))})
    with torch.device("meta"):  # no time spent on a random init that is overwritten at once
        model = EncoderModel(config, pooler=has_pooler(spec, state))  # its name differs by family (ALBERT)
    model.load_state_dict(hf_to_ours(spec, state, model, source), assign=True)
    return model


def load_backbone(name: str | os.PathLike) -> EncoderModel:
    """The encoder of any checkpoint folder or alias (bare, MLM, or one of our fine-tuned models), in train mode."""
    folder = resolve_model_path(name)
    config, architecture = _read_config(folder)
    return build_backbone(EncoderConfig.from_hf_dict(config, str(folder / "config.json")),
                          read_weights(folder), str(folder), architecture).train()


def _read_config(folder: Path) -> tuple[dict, str | None]:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json (not a checkpoint folder?)")
    config = read_json_file(path)
    return config, (config.get("architectures") or [None])[0]


def read_task_info(folder: str | os.PathLike) -> dict:
    """task.json of a fine-tuned folder, or {} for a plain checkpoint."""
    path = resolve_model_path(folder) / TASK_FILE
    return read_json_file(path) if path.is_file() else {}


def load_task_model(name: str | os.PathLike, head: nn.Module | None = None) -> nn.Module:
    """A fine-tuned model from its folder, in eval mode: the class is chosen by config.json's architecture.

    A bare model folder (XModel, or an alias such as `minilm`) loads as a SentenceEmbedder. Pass `head` to load
    a SequenceClassifier saved with an output layer of your own.
    """
    folder = resolve_model_path(name)
    raw, architecture = _read_config(folder)
    info = read_task_info(folder)
    state = read_weights(folder)
    if architecture == BiLSTMClassifier.architecture:
        return _load_bilstm(raw, state, folder)
    cls = task_class(architecture)
    config = EncoderConfig.from_hf_dict(raw, str(folder / "config.json"))
    spec = FAMILIES[config.model_type]
    backbone = build_backbone(config, state, str(folder), architecture)
    head_prefixes = tuple(theirs for _, theirs in cls.head_names(spec))
    head_state = {k: v for k, v in state.items() if head_prefixes and k.startswith(head_prefixes)}
    if cls is SentenceEmbedder:
        return SentenceEmbedder(backbone, settings(folder).pooling).eval()
    with torch.device("meta"):  # the head's tensors are assigned from the file below
        if cls is SequenceClassifier:
            model = _sequence_classifier(backbone, head_state, head, raw, info, folder)
        elif cls is TokenClassifier:
            model = TokenClassifier(backbone, _num_rows(head_state, "classifier.weight", folder))
        else:
            model = SpanExtractor(backbone)
    _load_head(model, head_state, folder)
    return model.eval()


def _sequence_classifier(backbone: EncoderModel, head_state: dict[str, torch.Tensor], head: nn.Module | None,
                         raw: dict, info: dict, folder: Path) -> SequenceClassifier:
    """A SequenceClassifier shaped for a saved head (its tensors still to be loaded)."""
    layout = FAMILIES[backbone.config.model_type].classifier_head
    if layout.dense is None and backbone.pooler is None:
        raise CheckpointError(f"{folder}: missing tensors pooler.dense.* (a {layout.out}* head on the pooled "
                              f"[CLS] needs the pooler)")
    out = f"{layout.out}weight"
    if head is None and out not in head_state:
        raise CheckpointError(f"{folder}: head does not fit a linear classifier (expected {out}; tensors "
                              f"{', '.join(sorted(head_state)) or 'none'}): pass head= the module it was saved with")
    regression = raw.get("problem_type") == "regression" or info.get("task_type") == "regression"
    return SequenceClassifier(backbone, head_state[out].shape[0] if head is None else None, head, regression)


def _num_rows(state: dict[str, torch.Tensor], key: str, folder: Path) -> int:
    if key not in state:
        raise CheckpointError(f"{folder}: missing tensor {key}")
    return state[key].shape[0]


def _load_head(model: TaskModel, head_state: dict[str, torch.Tensor], folder: Path) -> None:
    """Assign the head tensors; a missing, unexpected or mis-shaped one is named."""
    expected = model.head_state()
    missing = sorted(set(expected) - set(head_state))
    unexpected = sorted(set(head_state) - set(expected))
    wrong = [f"{k} {tuple(head_state[k].shape)} (expected {tuple(expected[k].shape)})"
             for k in expected if k in head_state and head_state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(f"{folder}: head does not fit {type(model).__name__} ({model.architecture}): "
                              f"missing {missing}, unexpected {unexpected}, shape mismatch {wrong}")
    model.load_head(head_state)


def _load_bilstm(raw: dict, state: dict[str, torch.Tensor], folder: Path) -> BiLSTMClassifier:
    keys = ("vocab_size", "num_labels", "pad_id", "embed_dim", "hidden_size", "num_layers", "dropout")
    try:
        settings = {k: raw[k] for k in keys}
    except KeyError as err:
        raise CheckpointError(f"{folder / 'config.json'}: missing key {err}") from None
    labels = [raw["id2label"][k] for k in sorted(raw["id2label"], key=int)] if raw.get("id2label") else None
    model = BiLSTMClassifier(**settings, labels=labels, regression=raw.get("problem_type") == "regression")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(f"{folder}: weights do not fit BiLSTMClassifier ({str(err).splitlines()[0]})") from None
    return model.eval()


def save_task_model(model: nn.Module, folder: str | os.PathLike, tokenizer=None, info: dict | None = None) -> None:
    """Write config.json, model.safetensors, the tokenizer and task.json, each file atomically.

    Only model.safetensors changes between the epochs of a run, so a crash leaves the previous best whole.
    """
    folder = Path(folder)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in model.hf_state().items()}
    config = model.hf_config()
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    atomic_write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(folder)
    if info is not None:
        atomic_write_text(folder / TASK_FILE, json.dumps(info, indent=2) + "\n")
    if isinstance(model, SentenceEmbedder):
        _write_sentence_transformers_files(folder, model, (info or {}).get("max_length", 256))


def _write_sentence_transformers_files(folder: Path, model: SentenceEmbedder, max_length: int) -> None:
    """modules.json, sentence_bert_config.json and 1_Pooling/config.json: sentence-transformers loads the folder."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    pooling = {"word_embedding_dimension": model.config.hidden_size,
               "pooling_mode_cls_token": model.pooling == "cls", "pooling_mode_mean_tokens": model.pooling == "mean",
               "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    atomic_write_text(folder / "modules.json", json.dumps(modules, indent=2) + "\n")
    atomic_write_text(folder / "sentence_bert_config.json",
                      json.dumps({"max_seq_length": max_length, "do_lower_case": False}, indent=2) + "\n")
    atomic_write_text(folder / "1_Pooling" / "config.json", json.dumps(pooling, indent=2) + "\n")
