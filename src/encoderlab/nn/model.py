"""Whole models, one class per Hugging Face architecture: the same Encoder plus one head, one output type.

| class                 | kind        | head                                  | transformers class (X: family stem) | loss (unit)        |
|-----------------------|-------------|---------------------------------------|-------------------------------------|--------------------|
| EncoderModel          | base        | the [CLS] pooler, when there is one   | XModel                              | none               |
| SentenceEmbedder      | embed       | mean or [CLS] pooling, no parameters  | XModel (+ sentence-transformers)    | none               |
| MaskedLMModel         | mlm         | MLM head tied to the word embeddings  | XForMaskedLM                        | CE (masked)        |
| PreTrainingModel      | pretraining | pooler + MLM head + NSP (SOP) head    | XForPreTraining                     | MLM; NSP (pairs)   |
| ReplacedTokenDetector | rtd         | ELECTRA's discriminator               | ElectraForPreTraining               | BCE (tokens)       |
| SequenceClassifier    | classify    | the family's head (nn.heads)          | XForSequenceClassification          | by problem_type    |
| TokenClassifier       | ner         | each token -> dropout -> linear       | XForTokenClassification             | CE (masked)        |
| SpanExtractor         | qa          | each token -> linear -> start, end    | XForQuestionAnswering               | CE/2 each (seqs.)  |

SequenceClassifier's loss follows transformers' problem_type: regression, MSE per row (sequences);
single_label_classification, CE per row (sequences); multi_label_classification, BCE per (row, class) (label_cells).

Every model returns a ModelOutput (nn/output.py), given labels with each loss term as a LossTerm (sum, count, unit).
A family changes the config (its head layout too) and the weight-name map, not these classes; encoderlab.checkpoint
names, loads and saves them all (load_model, save_pretrained), finding a class by its `kind` in MODEL_CLASSES and
building it with its own from_stored: nothing here imports checkpoint, so nn/ never sees the family registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.dropout import Dropout
from encoderlab.nn.encoder import Encoder, init_weights
from encoderlab.nn.heads import MLMHead, NSPHead, Pooler, RTDHead, SequenceHead, Transform, init_linear
from encoderlab.nn.output import IGNORE_INDEX, LossTerm, ModelOutput
from encoderlab.nn.pooling import pool


@dataclass(frozen=True)
class Stored:
    """What a checkpoint folder fixes of a model it loads as (encoderlab.checkpoint reads it, the class uses it)."""

    new_head: bool  # the folder holds another kind's task head (or none): the class's head starts fresh
    pooler: bool  # the folder holds the [CLS] pooler's weights
    outputs: int | None  # rows of the stored output layer (the class's output_layer); None: absent or new_head
    settings: Callable[[], Any]  # -> the folder's inference settings (pooling, normalize), read when asked
    task_info: Callable[[], dict]  # -> the folder's task.json, read when asked ({} without one)


class Model(nn.Module):
    """Base of all models: the Encoder (and a [CLS] pooler) under a head."""

    kind: ClassVar[str]  # our name for the architecture (see the table above): load_model's kind=
    hf_kind: ClassVar[str | None] = None  # the kind whose transformers class this one saves as (None: its own)
    hf_suffix: ClassVar[str | None] = None  # transformers' class is the family stem + this; None: FamilySpec names it
    task_head: ClassVar[tuple[str, ...]] = ()  # prefixes of our task head's tensors: a checkpoint may lack them
    output_layer: ClassVar[str | None] = None  # our name of the output layer's weight: its rows are the labels
    bare: ClassVar[bool] = False  # saved as transformers' XModel: backbone tensors without the base prefix

    @classmethod
    def from_stored(cls, config: EncoderConfig, stored: Stored, **options: Any) -> Model:
        """The model a checkpoint folder holds: what the folder fixes (head size, pooling), then `options`."""
        return cls(config, **options)

    def __init__(self, config: EncoderConfig, pooler: bool = False) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.pooler = Pooler(config.hidden_size) if pooler else None

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, **flags: bool) -> ModelOutput:
        """Token ids (B, T) -> the encoder's output, with the pooled [CLS] (B, H) when the model has a pooler."""
        out = self.encoder(input_ids, attention_mask, token_type_ids, **flags)
        if self.pooler is not None:
            out.pooled = self.pooler(out.last_hidden_state)
        return out

    labels = property(lambda self: self.config.labels, doc="Class or tag names (config.json id2label)")

    def hf_config(self, architecture: str) -> dict:
        """config.json of this model as transformers' class `architecture` (encoderlab.checkpoint names it)."""
        return self.config.to_hf_dict(architecture)

    def init_weights(self) -> None:
        """Fresh random weights, as for pretraining from scratch."""
        init_weights(self, self.config)

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())


class EncoderModel(Model):
    """The bare encoder (HF `BertModel`): token ids -> hidden states, plus the [CLS] pooler if present."""

    kind, bare = "base", True

    @classmethod
    def from_stored(cls, config: EncoderConfig, stored: Stored, **options: Any) -> Model:
        """A pooler only where the checkpoint holds one (an MLM-only BERT checkpoint has none)."""
        return cls(config, **{"pooler": stored.pooler} | options)

    def __init__(self, config: EncoderConfig, pooler: bool | None = None) -> None:
        """pooler: whether to build the [CLS] pooler (a checkpoint may lack it); by default, config.pooler."""
        super().__init__(config, config.pooler if pooler is None else pooler)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> ModelOutput:
        return self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states=output_hidden_states,
                           output_attentions=output_attentions)


class SentenceEmbedder(EncoderModel):
    """The bare encoder whose token vectors are pooled into one (B, H) vector per text: mean or [CLS]."""

    kind, hf_kind = "embed", "base"

    @classmethod
    def from_stored(cls, config: EncoderConfig, stored: Stored, **options: Any) -> Model:
        """The folder's pooler, pooling and normalisation (sentence-transformers' modules), then `options`."""
        settings = stored.settings()
        return cls(config, **{"pooler": stored.pooler, "pooling": settings.pooling,
                              "normalize": settings.normalize} | options)

    def __init__(self, config: EncoderConfig, pooling: str = "mean", pooler: bool | None = None,
                 normalize: bool = False) -> None:
        """pooler: kept as the checkpoint has it, so the folder stays a complete XModel. normalize: the folder's
        vectors are L2-normalised (its modules.json ends in Normalize): saved so, it is applied by the pipelines."""
        super().__init__(config, pooler)
        self.pooling, self.normalize = pooling, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **flags: bool) -> ModelOutput:
        hidden = self.encode(input_ids, attention_mask, token_type_ids, **flags)
        return replace(hidden, embedding=pool(hidden.last_hidden_state.float(), attention_mask, self.pooling))


class MaskedLMModel(Model):
    """Encoder + MLM head (HF `BertForMaskedLM`). Given labels (fill-mask too), the decoder runs only on the labelled
    positions: with 15% masking that skips 85% of the largest matmul in the model."""

    kind = "mlm"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.mlm = MLMHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, masked_budget: int | None = None) -> ModelOutput:
        hidden = self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states=output_hidden_states)
        return _mlm_output(self, hidden, labels, masked_budget)


def _mlm_output(model: MaskedLMModel | PreTrainingModel, hidden: ModelOutput, labels: torch.Tensor | None,
                masked_budget: int | None = None) -> ModelOutput:
    """Full logits (B, T, V) without labels; with labels, logits (N, V) of the labelled positions and their loss.
    Given masked_budget (at least the labelled count), N is that fixed number: the labelled positions, then
    unlabelled ones whose targets are IGNORE_INDEX, so the shapes never depend on the data (no host sync)."""
    word_embeddings = model.encoder.embeddings.word.weight
    if labels is None:
        return replace(hidden, logits=model.mlm(hidden.last_hidden_state, word_embeddings))
    states = hidden.last_hidden_state.flatten(0, 1)  # (B*T, H)
    if masked_budget is None:
        positions = (labels != IGNORE_INDEX).flatten().nonzero().squeeze(1)  # (N,): a data-dependent size
    else:
        positions = labelled_first(labels, masked_budget)  # (N,) = (masked_budget,)
    logits, targets = model.mlm(states[positions], word_embeddings), labels.flatten()[positions]
    return replace(hidden, logits=logits, targets=targets,
                   terms={"mlm": lambda: cross_entropy_sum(logits, targets, "masked")})


def labelled_first(labels: torch.Tensor, budget: int) -> torch.Tensor:
    """(B, T) labels -> (budget,) flat positions: every labelled one (there must be at most budget) before any
    other; a top-k of the label mask, whose size is fixed."""
    labelled = (labels != IGNORE_INDEX).flatten().to(torch.int32)  # (B*T,)
    return torch.topk(labelled, min(budget, labelled.numel()), sorted=True).indices


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, unit: str) -> LossTerm:
    """Cross-entropy of logits (N, C) summed over the labels (N,) that are not IGNORE_INDEX, counted in `unit`."""
    return LossTerm(F.cross_entropy(logits.float(), labels, reduction="sum"), (labels != IGNORE_INDEX).sum(), unit)


class PreTrainingModel(Model):
    """Encoder + pooler + MLM head + NSP head (HF `BertForPreTraining`); loss = MLM + NSP."""

    kind = "pretraining"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config, pooler=True)
        self.mlm = MLMHead(config)
        self.nsp = NSPHead(config.hidden_size)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, output_hidden_states: bool = False,
                masked_budget: int | None = None) -> ModelOutput:
        hidden = self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states=output_hidden_states)
        out = _mlm_output(self, hidden, labels, masked_budget)
        out.nsp_logits = nsp_logits = self.nsp(hidden.pooled)  # (B, 2)
        if next_sentence_label is not None:
            out.terms["nsp"] = lambda: cross_entropy_sum(nsp_logits, next_sentence_label, "pairs")
        return out


class ReplacedTokenDetector(Model):
    """Encoder + ELECTRA's discriminator head (HF `ElectraForPreTraining`): is each token the original?"""

    kind = "rtd"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.rtd = RTDHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        """labels (B, T): 1 replaced, 0 original, IGNORE_INDEX on padding."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        logits = self.rtd(hidden.last_hidden_state)  # (B, T)
        if labels is None:
            return replace(hidden, logits=logits)
        real = labels != IGNORE_INDEX
        return replace(hidden, logits=logits, terms={"rtd": lambda: LossTerm(F.binary_cross_entropy_with_logits(
            logits[real].float(), labels[real].float(), reduction="sum"), real.sum(), "tokens")})


def sequence_sum(logits: torch.Tensor, labels: torch.Tensor, problem_type: str | None) -> LossTerm:
    """By transformers' problem_type: squared error of logits (B, 1) for scores (B,), per row (regression); binary
    cross-entropy of each logit of (B, L) against 0/1 targets (B, L), per (row, class) as BCEWithLogitsLoss averages
    them (multi_label_classification); else cross-entropy of (B, L) for class ids (B,), per row."""
    # torch.full, not torch.tensor: a copy from the host would wait for the GPU's queue
    if problem_type == "regression":
        count = torch.full((), labels.shape[0], device=labels.device)
        return LossTerm(F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction="sum"), count, "sequences")
    if problem_type == "multi_label_classification":
        count = torch.full((), labels.numel(), device=labels.device)
        total = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="sum")
        return LossTerm(total, count, "label_cells")
    return cross_entropy_sum(logits, labels, "sequences")


class SequenceClassifier(Model):
    """The family's classification head on the encoder -> logits (B, L), one for regression. A user's `head` module
    ((B, H) -> (B, L)) replaces its output layer; only an nn.Linear gives a folder transformers can load."""

    kind, hf_suffix, task_head, output_layer = "classify", "ForSequenceClassification", ("head.",), "head.out.weight"

    @classmethod
    def from_stored(cls, config: EncoderConfig, stored: Stored, **options: Any) -> Model:
        """The stored head's size and problem_type (a folder older than problem_type says regression in task.json);
        a problem_type in `options` replaces the config's."""
        problem_type = options.pop("problem_type", None)
        if problem_type is None and not stored.new_head and stored.task_info().get("task_type") == "regression":
            problem_type = "regression"
        config = config if problem_type is None else config.replace(problem_type=problem_type)
        return cls(config, **{"num_labels": stored.outputs} | options)

    def __init__(self, config: EncoderConfig, num_labels: int | None = None, head: nn.Module | None = None,
                 multilabel: bool = False) -> None:
        """config.problem_type chooses the loss (see sequence_sum; None: single_label_classification); multilabel
        sets it to multi_label_classification: each logit a yes/no of its class (sigmoid, binary cross-entropy).
        num_labels: by default 1 for regression, else one per config.labels."""
        if multilabel and config.problem_type == "regression":
            raise ValueError("a SequenceClassifier is for regression or multilabel classification, not both")
        problem_type = "multi_label_classification" if multilabel else config.problem_type
        config = config.replace(problem_type=problem_type or "single_label_classification")  # transformers' key
        super().__init__(config, pooler=not config.classifier_dense)  # BERT and ALBERT classify the pooled [CLS]
        if num_labels is None and head is None:
            if not self.regression and not config.labels:
                raise ValueError("SequenceClassifier needs num_labels, config.labels or a head module")
            num_labels = 1 if self.regression else len(config.labels)
        self.head = SequenceHead(config, num_labels, head)
        # Not self.init_weights(): a head module the user supplies keeps its own initialisation.
        init_weights(self.encoder, config)
        if self.pooler is not None:
            init_linear(self.pooler.dense, config.initializer_range)

    regression = property(lambda self: self.config.problem_type == "regression", doc="A score per input (MSE)")
    multilabel = property(lambda self: self.config.problem_type == "multi_label_classification",
                          doc="Each logit a yes/no of its class (sigmoid, binary cross-entropy)")

    @property
    def num_outputs(self) -> int:
        """Logits per input: classes, or 1 for regression."""
        out = self.head.out
        if isinstance(out, nn.Linear):
            return out.out_features
        return 1 if self.regression else len(self.config.labels or [])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        """labels (B,): class ids, or target values for regression; (B, L) 0/1 per class for multilabel."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        logits = self.head(hidden.last_hidden_state, hidden.pooled, attention_mask)  # (B, L)
        terms = {} if labels is None else {
            "classify": lambda: sequence_sum(logits, labels, self.config.problem_type)}
        return replace(hidden, logits=logits, terms=terms)

    def hf_config(self, architecture: str) -> dict:
        return _with_labels(super().hf_config(architecture), self.num_outputs)  # problem_type is the config's


class TokenClassifier(Model):
    """Token vectors (B, T, H) -> [transform] -> dropout -> linear -> logits (B, T, L)."""

    kind, hf_suffix, task_head, output_layer = "ner", "ForTokenClassification", ("transform.", "classifier."), \
        "classifier.weight"

    @classmethod
    def from_stored(cls, config: EncoderConfig, stored: Stored, **options: Any) -> Model:
        """The stored tag count, then `options`."""
        return cls(config, **{"num_labels": stored.outputs} | options)

    def __init__(self, config: EncoderConfig, num_labels: int | None = None) -> None:
        """num_labels: by default one per config.labels."""
        super().__init__(config)
        if not (num_labels or config.labels):
            raise ValueError("TokenClassifier needs num_labels or config.labels")
        self.transform = Transform(config) if config.task_transform else None  # ModernBERT's head on every token
        self.dropout = Dropout(config.hidden_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels or len(config.labels))
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        """labels (B, T): tag ids, IGNORE_INDEX where a token carries none."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        x = hidden.last_hidden_state if self.transform is None else self.transform(hidden.last_hidden_state)
        logits = self.classifier(self.dropout(x))  # (B, T, L)
        terms = {} if labels is None else {
            "ner": lambda: cross_entropy_sum(logits.flatten(0, 1), labels.flatten(), "masked")}
        return replace(hidden, logits=logits, terms=terms)

    def hf_config(self, architecture: str) -> dict:
        return _with_labels(super().hf_config(architecture), self.classifier.out_features)


def _with_labels(config: dict, count: int) -> dict:
    """config.json with transformers' default id2label (LABEL_0, ...) where it names no labels."""
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(count)}} | config


class SpanExtractor(Model):
    """Token vectors (B, T, H) -> [transform] -> linear -> start and end logits, (B, T, 2) (BERT paper, section 4.2)."""

    kind, hf_suffix, task_head = "qa", "ForQuestionAnswering", ("transform.", "qa_outputs.")

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.transform = Transform(config) if config.task_transform else None  # ModernBERT's head on every token
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        """labels (B, 2): the answer's start and end token; one outside the window carries no loss."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        x = hidden.last_hidden_state if self.transform is None else self.transform(hidden.last_hidden_state)
        logits = self.qa_outputs(x)  # (B, T, 2)
        return replace(hidden, logits=logits, terms={} if labels is None else span_terms(logits, labels))


def span_terms(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Callable[[], LossTerm]]:
    """Half the start and end cross-entropies (BERT 4.2) of logits (B, T, 2) at positions (B, 2); a position past
    the window carries none (transformers clamps it to T and ignores T), so each side keeps its own count. The unit
    is the sequence: fine-tuning's features point an answer outside their window at [CLS], so every side counts."""
    positions = labels.clamp(min=0).masked_fill(labels >= logits.shape[1], IGNORE_INDEX)  # (B, 2)

    def half(i: int) -> LossTerm:
        total, count, unit = cross_entropy_sum(logits[..., i], positions[:, i], "sequences")
        return LossTerm(total / 2, count, unit)

    return {"qa_start": lambda: half(0), "qa_end": lambda: half(1)}


def by_kind(*classes: type[Model]) -> dict[str, type[Model]]:
    """Each class under its own `kind`; two classes claiming one kind are refused."""
    out: dict[str, type[Model]] = {}
    for cls in classes:
        if cls.kind in out:
            raise TypeError(f"{cls.__name__} and {out[cls.kind].__name__} both declare kind {cls.kind!r}")
        out[cls.kind] = cls
    return out


MODEL_CLASSES = by_kind(EncoderModel, SentenceEmbedder, MaskedLMModel, PreTrainingModel, ReplacedTokenDetector,
                        SequenceClassifier, TokenClassifier, SpanExtractor)
"""Model kind -> class, by each class's own `kind`: checkpoint.load_model builds a kind by name (the BiLSTM baseline
is its own format)."""
