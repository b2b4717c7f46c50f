"""Task models: an encoder plus a head, saved as the Hugging Face folder transformers loads for that task.

| class              | head                                   | saved as (transformers class)   | head tensors        |
|--------------------|----------------------------------------|---------------------------------|---------------------|
| SequenceClassifier | pooled [CLS] -> dropout -> head        | BertForSequenceClassification   | classifier.*        |
| TokenClassifier    | each token -> dropout -> linear        | BertForTokenClassification      | classifier.*        |
| SpanExtractor      | each token -> linear -> start, end     | BertForQuestionAnswering        | qa_outputs.*        |
| SentenceEmbedder   | mean or [CLS] pooling, no parameters   | BertModel (+ sentence-transformers files) | none      |
| BiLSTMClassifier   | a baseline from scratch: embeddings -> BiLSTM -> max pool -> linear | our own folder | all |

The backbone goes through the family's weight map (encoderlab.checkpoint) under the `bert.` prefix; the
head under transformers' names. A head the user supplies (any module, (B, H) -> (B, L)) is saved under
`classifier.` too, but only an nn.Linear gives a folder transformers can load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import save_file
from torch import nn

from encoderlab.checkpoint import normalize_hf_state, hf_to_ours, ours_to_hf, read_weights, resolve_model_path
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError
from encoderlab.infer.embed import pool
from encoderlab.io import atomic_write, atomic_write_text
from encoderlab.models import FAMILIES
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.heads import Pooler
from encoderlab.nn.model import EncoderModel

HEAD_PREFIXES = ("classifier.", "qa_outputs.")
TASK_FILE = "task.json"  # what encoderlab needs beyond config.json: task, columns, max_length, pooling


def _init_linear(layer: nn.Module, std: float) -> nn.Module:
    """BERT's init for a fresh head layer: N(0, std) weights, zero bias."""
    if isinstance(layer, nn.Linear):
        nn.init.normal_(layer.weight, std=std)
        nn.init.zeros_(layer.bias)
    return layer


class TaskModel(nn.Module):
    """An EncoderModel backbone and a head; subclasses name their transformers class and head prefix."""

    architecture: ClassVar[str]
    head_prefix: ClassVar[str] = ""
    uses_pooler: ClassVar[bool] = False

    def __init__(self, backbone: EncoderModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        if self.uses_pooler and backbone.pooler is None:  # a checkpoint without pooler weights (e.g. MLM only)
            backbone.pooler = Pooler(self.config.hidden_size)
            _init_linear(backbone.pooler.dense, self.config.initializer_range)
        if not self.uses_pooler:
            backbone.pooler = None  # transformers' task classes build BertModel(add_pooling_layer=False)

    @property
    def labels(self) -> list[str] | None:
        """Class or tag names (config.json id2label)."""
        return self.config.labels

    def head_state(self) -> dict[str, torch.Tensor]:
        """The head's tensors under transformers' names."""
        return {name: tensor for name, tensor in self.state_dict().items() if not name.startswith("backbone.")}

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Every tensor under transformers' names: `bert.`-prefixed backbone, then the head."""
        spec = FAMILIES[self.config.model_type]
        prefix = spec.base_prefix if self.head_prefix else ""
        backbone = {prefix + k: v for k, v in ours_to_hf(spec, self.backbone).items()}
        return backbone | {k: v.detach().clone().contiguous() for k, v in self.head_state().items()}

    def hf_config(self) -> dict:
        """config.json for this model's transformers class."""
        return self.config.to_hf_dict(self.architecture)


class SequenceClassifier(TaskModel):
    """Pooled [CLS] (B, H) -> dropout -> head -> logits (B, L); one output for regression."""

    architecture = "BertForSequenceClassification"
    head_prefix = "classifier."
    uses_pooler = True

    def __init__(self, backbone: EncoderModel, num_labels: int | None = None, head: nn.Module | None = None,
                 regression: bool = False) -> None:
        super().__init__(backbone)
        if head is None and num_labels is None:
            raise ValueError("SequenceClassifier needs num_labels or a head module")
        self.regression = regression
        self.dropout = Dropout(self.config.hidden_dropout)
        self.classifier = head if head is not None else _init_linear(
            nn.Linear(self.config.hidden_size, num_labels), self.config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        pooled = self.backbone(input_ids, attention_mask, token_type_ids).pooled  # (B, H)
        return self.classifier(self.dropout(pooled))  # (B, L)

    def hf_config(self) -> dict:
        config = super().hf_config()
        if self.regression:
            config.update(num_labels=1, problem_type="regression")
        else:
            config["problem_type"] = "single_label_classification"
        return config


class TokenClassifier(TaskModel):
    """Token vectors (B, T, H) -> dropout -> linear -> logits (B, T, L)."""

    architecture = "BertForTokenClassification"
    head_prefix = "classifier."

    def __init__(self, backbone: EncoderModel, num_labels: int) -> None:
        super().__init__(backbone)
        self.dropout = Dropout(self.config.hidden_dropout)
        self.classifier = _init_linear(nn.Linear(self.config.hidden_size, num_labels), self.config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        return self.classifier(self.dropout(hidden))  # (B, T, L)


class SpanExtractor(TaskModel):
    """Token vectors (B, T, H) -> linear -> start and end logits, each (B, T) (BERT paper, section 4.2)."""

    architecture = "BertForQuestionAnswering"
    head_prefix = "qa_outputs."

    def __init__(self, backbone: EncoderModel) -> None:
        super().__init__(backbone)
        self.qa_outputs = _init_linear(nn.Linear(self.config.hidden_size, 2), self.config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.backbone(input_ids, attention_mask, token_type_ids).last_hidden_state
        start, end = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        return start, end


class SentenceEmbedder(TaskModel):
    """Token vectors pooled into one (B, H) vector per text: mean over real tokens or [CLS]."""

    architecture = "BertModel"
    uses_pooler = True  # kept as loaded: the folder stays a complete BertModel

    def __init__(self, backbone: EncoderModel, pooling: str = "mean") -> None:
        nn.Module.__init__(self)
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
ARCHITECTURES: dict[str, type[nn.Module]] = {cls.architecture: cls for cls in (
    SequenceClassifier, TokenClassifier, SpanExtractor, BiLSTMClassifier)}


def build_backbone(config: EncoderConfig, hf_state: dict[str, torch.Tensor], source: str) -> EncoderModel:
    """An EncoderModel from Hugging Face tensors; head tensors (classifier, qa_outputs, MLM, NSP) are left out."""
    spec = FAMILIES[config.model_type]
    state = normalize_hf_state(spec, {k: v for k, v in hf_state.items() if not k.startswith(HEAD_PREFIXES)})
    with torch.device("meta"):  # no time spent on a random init that is overwritten at once
        model = EncoderModel(config, pooler="pooler.dense.weight" in state)
    model.load_state_dict(hf_to_ours(spec, state, model, source), assign=True)
    return model


def load_backbone(name: str | os.PathLike) -> EncoderModel:
    """The encoder of any checkpoint folder or alias (bare, MLM, or one of our fine-tuned models), in train mode."""
    folder = resolve_model_path(name)
    config, _ = _read_config(folder)
    return build_backbone(EncoderConfig.from_hf_dict(config, str(folder / "config.json")),
                          read_weights(folder), str(folder)).train()


def read_json_file(path: Path, kind: type = dict) -> Any:
    """A checkpoint folder's JSON file whose top level is a `kind` (dict or list); CheckpointError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: not valid UTF-8 JSON ({err})") from None
    if not isinstance(data, kind):
        raise CheckpointError(f"{path}: expected a JSON {'object' if kind is dict else 'array'}, "
                              f"got {type(data).__name__}")
    return data


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

    A plain BertModel folder (or an alias such as `minilm`) loads as a SentenceEmbedder. Pass `head` to load
    a SequenceClassifier saved with a head of your own.
    """
    folder = resolve_model_path(name)
    raw, architecture = _read_config(folder)
    info = read_task_info(folder)
    state = read_weights(folder)
    if architecture == BiLSTMClassifier.architecture:
        return _load_bilstm(raw, state, folder)
    cls = ARCHITECTURES.get(architecture, SentenceEmbedder)
    config = EncoderConfig.from_hf_dict(raw, str(folder / "config.json"))
    backbone = build_backbone(config, state, str(folder))
    if cls.uses_pooler and cls is not SentenceEmbedder and backbone.pooler is None:
        raise CheckpointError(f"{folder}: missing tensors pooler.dense.* ({architecture} needs the pooler)")
    head_state = {k: v for k, v in state.items() if k.startswith(cls.head_prefix)} if cls.head_prefix else {}
    if cls is SentenceEmbedder:
        model = SentenceEmbedder(backbone, info.get("pooling") or _sentence_transformers_pooling(folder))
    elif cls is SequenceClassifier:
        regression = raw.get("problem_type") == "regression" or info.get("task_type") == "regression"
        if head is None and "classifier.weight" not in head_state:
            raise CheckpointError(f"{folder}: head does not fit a linear classifier (tensors "
                                  f"{', '.join(sorted(head_state)) or 'none'}): "
                                  f"pass head= the module it was saved with")
        num_labels = head_state["classifier.weight"].shape[0] if head is None else None
        with torch.device("meta"):
            model = SequenceClassifier(backbone, num_labels, head, regression)
    elif cls is TokenClassifier:
        with torch.device("meta"):
            model = TokenClassifier(backbone, _num_rows(head_state, "classifier.weight", folder))
    else:
        with torch.device("meta"):
            model = SpanExtractor(backbone)
    _load_head(model, head_state, folder)
    return model.eval()


def _sentence_transformers_pooling(folder: Path) -> str:
    """The pooling a sentence-transformers folder declares in 1_Pooling/config.json; mean when there is none."""
    path = folder / "1_Pooling" / "config.json"
    settings = read_json_file(path) if path.is_file() else {}
    return "cls" if settings.get("pooling_mode_cls_token") else "mean"


def _num_rows(state: dict[str, torch.Tensor], key: str, folder: Path) -> int:
    if key not in state:
        raise CheckpointError(f"{folder}: missing tensor {key}")
    return state[key].shape[0]


def _load_head(model: TaskModel, head_state: dict[str, torch.Tensor], folder: Path) -> None:
    """Assign the head tensors; a missing, unexpected or mis-shaped one is named."""
    expected = model.head_state() if not isinstance(model, SentenceEmbedder) else {}
    missing = sorted(set(expected) - set(head_state))
    unexpected = sorted(set(head_state) - set(expected))
    wrong = [f"{k} {tuple(head_state[k].shape)} (expected {tuple(expected[k].shape)})"
             for k in expected if k in head_state and head_state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(f"{folder}: head does not fit {type(model).__name__}: "
                              f"missing {missing}, unexpected {unexpected}, shape mismatch {wrong}")
    if expected:
        model.load_state_dict({**{f"backbone.{k}": v for k, v in model.backbone.state_dict().items()},
                               **head_state}, assign=True)


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
