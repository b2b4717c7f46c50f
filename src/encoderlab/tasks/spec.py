"""What a fine-tuning task is, for every command that trains, scores or lists tasks: a TaskSpec per task, the SPEC
of the task's own module, named by its card (encoderlab.cards), so that finetune, evaluate and benchmark iterate the
cards instead of comparing task names.

A new task is one module under tasks/ that defines its Task, its SPEC and its Pipeline, plus one row in
encoderlab.cards.CARDS (docs/design.md#adding-a-capability). A variant of a task (classify's multilabel) is a second
spec on the task's card with its `variant`: the task's options pick it (ClassifyOptions.variant, --task-type), and
task.json records it for evaluate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from encoderlab.cards import TaskOptions, card, load, trainable
from encoderlab.errors import InputError
from encoderlab.folder import Settings
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
class TaskSpec:
    """One task: how its data is read, how its Task is built (from training examples, or for a loaded model) and
    which models it trains and scores."""

    name: str
    read: Callable[[str, Reading, dict, TaskOptions], list]
    """(path, reading, task.json of the model or {}, the task's options) -> examples."""
    build: Callable[[TaskOptions, Tokenizer, list, int, dict], Task]
    """(the task's options, tokenizer, training examples, max_length, {batch_size, precision}) -> the Task to
    fine-tune."""
    restore: Callable[[nn.Module, Settings, dict, Tokenizer, int, dict], Task]
    """(model, the folder's settings with the command line's overrides, task.json, tokenizer, max_length,
    {batch_size}) -> the Task that scores a fine-tuned model."""
    models: tuple[type[nn.Module], ...]
    """What a model must be to be scored on the task."""
    model_kind: str
    """The kind load_model builds for fine-tuning (encoderlab.nn.model's table)."""
    model_options: Callable[[Task, TaskOptions], dict] = lambda task, head: {}
    """Keyword options of load_model for a new task model (class counts, pooling)."""
    evaluate_kind: str | None = None
    """The kind evaluate loads a folder as; None: what the folder holds."""
    keeps_labels: bool = False
    """The model's config records the task's labels (id2label)."""
    info: Callable[[Task, TaskOptions], dict] = lambda task, head: {}
    """What task.json records beyond task.info(): settings the task's pipeline reads back."""
    variant: str | None = None
    """The --task-type this spec is of its task (None: the task's default)."""
    load: Callable[[str, Any], nn.Module] | None = None
    """(checkpoint or alias, head) -> the task's model, where it is not one load_model builds (colbert: an encoder
    and a projection); None: load_model(kind=model_kind)."""
    check_model: Callable[[str], None] = lambda name: None
    """(--model) -> None, or InputError where the checkpoint cannot start this task (before training starts)."""
    check_job: Callable[[Any], None] = lambda job: None
    """(the FinetuneJob) -> None, or InputError for options this task cannot run together (splade: --resume of an
    --inference-free run), before anything is written."""
    after_save: Callable[[Path, Task], None] = lambda folder, task: None
    """(folder, task): files the task adds beside each saved checkpoint (another library's layout)."""
    prepare: Callable[[nn.Module, Task], None] = lambda model, task: None
    """(new task model, task): what the task adds to the model before training (trainable tensors of its own)."""

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.variant


def task_spec(name: str, variant: str | None = None) -> TaskSpec:
    """The training spec of the card `name` (its `variant` where the card has one, else its default), or an
    InputError naming the tasks there are."""
    names = [c.name for c in trainable()]
    if name not in names:
        raise InputError(f"unknown task {name!r}; expected one of {', '.join(names)}")
    specs = [load(reference) for reference in card(name).spec]
    return next((spec for spec in specs if spec.variant == variant), specs[0])


def numbered_labels(model: nn.Module) -> list[str]:
    """Class names "0", "1", ... for a head saved without id2label."""
    count = model.num_outputs if hasattr(model, "num_outputs") else model.classifier.out_features
    return [str(i) for i in range(count)]
