"""What a fine-tuning task is, for every command that trains, scores or lists tasks: a TaskSpec per task, registered
by the task's own module (as the families register a FamilySpec), so that finetune, evaluate and benchmark iterate
the specs instead of comparing task names.

A new task is one module under tasks/ that defines its Task and registers its spec, plus its name in the import line
of encoderlab.tasks.finetune and its card in encoderlab.choices.TASK_CARDS (what the command line shows before torch
loads); its pipeline (an encoderlab.engine.Pipeline in the same module, as rerank's) is one line in
encoderlab.infer.pipelines.PIPELINES, its command one Command card in encoderlab.cli.pipelines. A variant of a task
(classify's multilabel) registers under the task's name with its `variant`: the command line's --task-type picks it,
and task.json records it for evaluate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from encoderlab.folder import Settings
from encoderlab.errors import ConfigError
from encoderlab.tasks.base import Task
from encoderlab.tokenizer import Tokenizer


@dataclass(frozen=True)
class Reading:
    """How to read a data file; a None falls back to the model's task.json, then to the reader's default."""

    text_cols: str | None = None
    """Text column(s) of a table, "A" or "A,B", by header name or 0-based index."""
    label_col: str | None = None
    """Label (or score) column of a table."""
    tag_col: int | None = None
    """Column of the tags in a CoNLL file."""
    token_col: int | None = None
    """Column of the words in a CoNLL file."""
    header: bool = True
    """The table has a header row."""

    def info(self) -> dict[str, Any]:
        """The reader options to record in task.json."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def option(self, name: str, info: dict, default: Any = None) -> Any:
        """An option given here, else the one task.json recorded, else `default`."""
        value = getattr(self, name)
        return value if value is not None else info.get(name, default)


@dataclass(frozen=True)
class Head(Settings):
    """What a new task model needs beyond the training data (each field is read by the tasks it names): the folder
    settings it will be run with (qa windows and decoding, embed pooling), and these."""

    labels: list[str] | None = None
    """classify: class names in id order (default: those of the training file)."""
    task_type: str = "classification"
    """classify: classification (one class, cross-entropy), regression (a score, MSE) or multilabel (a set of
    classes, sigmoid and binary cross-entropy)."""
    loss: str | None = None
    """embed: mnrl, cosent or cosine (default: cosent when every pair has a score, else mnrl)."""
    scale: float = 20.0
    """embed: similarity scale of mnrl and cosent."""
    matryoshka: tuple[int, ...] | None = None
    """embed: also train the first N dimensions of each vector to stand alone, for each N given (Matryoshka
    representation learning, Kusupati et al. 2022): the loss is summed over the truncated prefixes."""
    dim: int = 128
    """colbert: dimensions of each token vector (the projection's width; the paper's 128)."""
    teacher: str | None = None
    """colbert: a cross-encoder folder (`finetune rerank`) whose scores the model is also distilled from (KL)."""
    query_flops: float | None = None
    """splade: peak weight of the queries' FLOPS regulariser (default: encoderlab.choices.QUERY_FLOPS)."""
    document_flops: float | None = None
    """splade: peak weight of the documents' FLOPS regulariser (default: encoderlab.choices.DOCUMENT_FLOPS)."""
    flops_warmup: int | None = None
    """splade: steps of the FLOPS weights' quadratic warm-up (default: a third of the first epoch's)."""
    inference_free: bool = False
    """splade: queries are a lookup of learned per-token weights (IDF-initialised), not a pass through the model."""
    embed_dim: int = 300
    """BiLSTM baseline: embedding width."""
    lstm_hidden: int = 256
    """BiLSTM baseline: hidden width per direction."""

    @property
    def regression(self) -> bool:
        """classify: a score (MSE) instead of classes."""
        return self.task_type == "regression"


@dataclass(frozen=True)
class TaskSpec:
    """One task: how its data is read, how its Task is built (from training examples, or for a loaded model) and
    which models it trains and scores."""

    name: str
    read: Callable[[str, Reading, dict, Head], list]
    """(path, reading, task.json of the model or {}, head) -> examples."""
    build: Callable[[Head, Tokenizer, list, int, dict], Task]
    """(head, tokenizer, training examples, max_length, {batch_size, precision}) -> the Task to fine-tune."""
    restore: Callable[[nn.Module, Settings, dict, Tokenizer, int, dict], Task]
    """(model, the folder's settings with the command line's overrides, task.json, tokenizer, max_length,
    {batch_size}) -> the Task that scores a fine-tuned model."""
    models: tuple[type[nn.Module], ...]
    """What a model must be to be scored on the task."""
    model_kind: str
    """The kind load_model builds for fine-tuning (encoderlab.nn.model's table)."""
    model_options: Callable[[Task, Head], dict] = lambda task, head: {}
    """Keyword options of load_model for a new task model (class counts, pooling)."""
    evaluate_kind: str | None = None
    """The kind evaluate loads a folder as; None: what the folder holds."""
    keeps_labels: bool = False
    """The model's config records the task's labels (id2label)."""
    info: Callable[[Task, Head], dict] = lambda task, head: {}
    """What task.json records beyond task.info(): settings the task's pipeline reads back."""
    variant: str | None = None
    """The --task-type this spec is of its task (None: the task's default)."""
    load: Callable[[str, Head], nn.Module] | None = None
    """(checkpoint or alias, head) -> the task's model, where it is not one load_model builds (colbert: an encoder
    and a projection); None: load_model(kind=model_kind)."""
    check_model: Callable[[str], None] = lambda name: None
    """(--model) -> None, or InputError where the checkpoint cannot start this task (before training starts)."""
    after_save: Callable[[Path, Task], None] = lambda folder, task: None
    """(folder, task): files the task adds beside each saved checkpoint (another library's layout)."""
    prepare: Callable[[nn.Module, Task], None] = lambda model, task: None
    """(new task model, task): what the task adds to the model before training (trainable tensors of its own)."""

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.variant


TASKS: dict[tuple[str, str | None], TaskSpec] = {}
"""Every registered task by (name, variant), in registration order."""


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add a task; a second one of the same name and variant is refused (it would silently replace the first)."""
    if spec.key in TASKS:
        raise ConfigError(f"task {spec.name!r}{f' ({spec.variant})' if spec.variant else ''} is registered twice")
    TASKS[spec.key] = spec
    return spec


def task_spec(name: str, variant: str | None = None) -> TaskSpec:
    """The registered task `name` (its `variant` where one is registered), or a ConfigError naming the known ones."""
    if (name, variant) in TASKS:
        return TASKS[name, variant]
    if (name, None) in TASKS:
        return TASKS[name, None]
    raise ConfigError(f"unknown task {name!r}; expected one of {', '.join(sorted({n for n, _ in TASKS}))}")


def numbered_labels(model: nn.Module) -> list[str]:
    """Class names "0", "1", ... for a head saved without id2label."""
    count = model.num_outputs if hasattr(model, "num_outputs") else model.classifier.out_features
    return [str(i) for i in range(count)]
