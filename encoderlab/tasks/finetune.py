"""Fine-tune a model on a task (one run per seed, the best checkpoint kept) and score a fine-tuned model.

What `encoderlab finetune` and `encoderlab evaluate` run, with typed arguments: the CLI only parses them."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from encoderlab.choices import BATCH_SIZE, BILSTM, MAX_LENGTH, split_names
from encoderlab.engine import resolve_device as engine_device, window
from encoderlab.errors import ConfigError, InputError
from encoderlab.folder import Settings, read_task_info, settings
from encoderlab.io import atomic_write_text
from encoderlab.checkpoint import load_model, model_config, save_pretrained
from encoderlab.nn import model as models
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.tasks import readers
from encoderlab.tasks.base import Task
from encoderlab.tasks.classify import ClassifyTask, label_set
from encoderlab.tasks.embedding import EmbedTask
from encoderlab.tasks.objective import TrainOptions, train
from encoderlab.tasks.qa import QATask, fit_to_window
from encoderlab.tasks.tagging import TagTask, tag_set
from encoderlab.tokenizer import Tokenizer
from encoderlab.train import distributed
from encoderlab.train.state import clear_checkpoints, seed_everything



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


@dataclass(frozen=True)
class Head(Settings):
    """What a new task model needs beyond the training data (each field is read by the tasks it names): the folder
    settings it will be run with (qa windows and decoding, embed pooling), and these."""

    labels: list[str] | None = None
    """classify: class names in id order (default: those of the training file)."""
    regression: bool = False
    """classify: a score (MSE) instead of classes."""
    loss: str | None = None
    """embed: mnrl, cosent or cosine (default: cosent when every pair has a score, else mnrl)."""
    scale: float = 20.0
    """embed: similarity scale of mnrl and cosent."""
    embed_dim: int = 300
    """BiLSTM baseline: embedding width."""
    lstm_hidden: int = 256
    """BiLSTM baseline: hidden width per direction."""


@dataclass
class FinetuneJob:
    """One `finetune` job: the data, the model, the head and the recipe."""

    task: str
    model: str
    train: str
    out: str | Path
    options: TrainOptions = field(default_factory=TrainOptions)
    eval: str | None = None
    tokenizer: str | None = None
    reading: Reading = Reading()
    head: Head = Head()
    max_length: int | None = None
    seeds: int = 1
    metric: str | None = None
    device: str | None = None
    resume: bool = False
    max_train: int | None = None
    max_eval: int | None = None
    keep_state: bool = True
    """Keep OUT/checkpoints (the optimizer state --resume continues from, about 3x the model) after a finished run."""


@dataclass
class EvaluateJob:
    """One `evaluate` job: a fine-tuned model scored on a labelled file."""

    task: str
    model: str
    data: str
    reading: Reading = Reading()
    pooling: str | None = None
    batch_size: int | None = None
    max_length: int | None = None
    precision: str = "fp32"
    """bf16: score the model with its weights converted to bf16, as the pipelines run it (not under autocast)."""
    max_eval: int | None = None
    predictions: str | None = None
    device: str | None = None
    stride: int | None = None
    combine: str | None = None


# ---- reading data ---------------------------------------------------------------------------------------------
def read_examples(task: str, path: str, reading: Reading, info: dict | None = None, regression: bool = False) -> list:
    """The examples of a data file for a task; reader options from `reading`, else from the model's task.json (whose
    labels pick the class folders of a folder of examples)."""
    info = info or {}

    def option(name: str, default: Any = None) -> Any:
        value = getattr(reading, name)
        return value if value is not None else info.get(name, default)

    if task == "ner":
        return readers.read_conll(path, tag_col=option("tag_col", -1), token_col=option("token_col", 0))
    if task == "qa":
        return readers.read_squad(path)
    header = reading.header and info.get("header", True)
    text_cols, label_col = split_names(option("text_cols")), option("label_col")
    if task == "embed":
        return readers.read_texts(path, text_cols, label_col, regression=True, header=header, need_label=False)
    return readers.read_texts(path, text_cols, label_col, regression, header, classes=info.get("labels"))


def subsample(examples: list, limit: int | None) -> list:
    """At most `limit` examples, drawn with a fixed seed (independent of --seed) and kept in file order."""
    if not limit or limit >= len(examples):
        return examples
    keep = sorted(random.Random(0).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


# ---- building tasks and models ------------------------------------------------------------------------------
def build_task(name: str, head: Head, tokenizer: Tokenizer, train: list, max_length: int, batch_size: int,
               precision: str) -> Task:
    """The Task for `name`, its label set learned from the training examples."""
    common = {"batch_size": batch_size, "precision": precision}
    if name == "classify":
        labels = None if head.regression else (head.labels or label_set(train))
        return ClassifyTask(tokenizer, max_length, labels, head.regression, stride=head.stride, combine=head.combine,
                            **common)
    if name == "ner":
        return TagTask(tokenizer, max_length, tag_set(train), **common)
    if name == "qa":
        return QATask(tokenizer, max_length, *fit_to_window(max_length, head.doc_stride, head.max_query_length),
                      head.max_answer_length, head.n_best, allow_null=any(e.is_impossible for e in train), **common)
    loss = head.loss or ("cosent" if all(isinstance(e.label, float) for e in train) else "mnrl")
    return EmbedTask(tokenizer, max_length, loss, head.scale, **common)


def build_model(name: str, model: str, head: Head, task: Task, tokenizer: Tokenizer) -> torch.nn.Module:
    """A task model: the encoder of `model` (or a BiLSTM) with the task's head, new unless `model` holds it."""
    if model == BILSTM:
        if name != "classify":
            raise ConfigError(f"--model {BILSTM} is a text-classification baseline; it cannot do {name}")
        return BiLSTMClassifier(tokenizer.vocab_size, task.num_outputs, tokenizer.pad_id,
                                head.embed_dim, head.lstm_hidden, labels=task.labels, regression=task.regression)
    options = ({"num_labels": task.num_outputs, "regression": task.regression} if name == "classify" else
               {"num_labels": len(task.labels)} if name == "ner" else {"pooling": head.pooling} if name == "embed"
               else {})
    built = load_model(model, kind=name, **options).train()
    if built.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
                          f"{built.config.vocab_size}")
    built.config.labels = task.labels if name in ("classify", "ner") else None
    return built


def resolve_device(name: str | None) -> torch.device:
    """--device, or CUDA when there is one, else the CPU (engine.resolve_device); under torchrun, this rank's."""
    if distributed.world_size() > 1:
        return distributed.setup(name or "auto").device
    return engine_device(name)


# ---- finetune ------------------------------------------------------------------------------------------------
def finetune(job: FinetuneJob) -> dict[str, Any]:
    """Fine-tune one run per seed, keeping each run's best checkpoint by the eval metric; the result (or spread)."""
    name, out = job.task, Path(job.out)
    job.options.validate()
    if job.seeds < 1:
        raise ConfigError(f"--seeds {job.seeds}: expected a positive number")
    tokenizer = Tokenizer.from_pretrained(job.tokenizer or ("minilm" if job.model == BILSTM else job.model))
    regression = job.head.regression
    classes = {"labels": job.head.labels}
    train_set = subsample(read_examples(name, job.train, job.reading, classes, regression), job.max_train)
    evaluation = None
    if job.eval:
        evaluation = subsample(read_examples(name, job.eval, job.reading, classes, regression), job.max_eval)
    task = build_task(name, job.head, tokenizer, train_set, train_window(job, tokenizer), job.options.batch_size,
                      job.options.precision)
    _check_metric(job.metric, task, evaluation)
    features = task.features(train_set)
    if evaluation is not None:
        task.validate(evaluation)  # an unknown label in the eval file fails now, not after the first epoch
    seeds = [job.options.seed + k for k in range(job.seeds)]
    runs = [_one_run(job, task, tokenizer, features, evaluation, seed,
                     out if len(seeds) == 1 else out / f"seed-{seed}", len(train_set)) for seed in seeds]
    return runs[0] if len(runs) == 1 else _summarize(runs, out)


def train_window(job: FinetuneJob, tokenizer: Tokenizer) -> int:
    """Tokens per training input: --max-length, else the task's default, within what the model takes."""
    config = None if job.model == BILSTM else model_config(job.model)
    return window(config, tokenizer, job.max_length, MAX_LENGTH[job.task])


def _check_metric(metric: str | None, task: Task, evaluation: list | None) -> None:
    """--metric must be one the task reports (and needs an eval set)."""
    if metric is None:
        return
    if evaluation is None:
        raise ConfigError("--metric needs --eval: the best checkpoint is chosen on the eval set")
    allowed = task.metrics + task.other_metrics
    if metric not in allowed:
        raise ConfigError(f"--metric {metric!r}: {task.name} reports {', '.join(allowed)}")


def _one_run(job: FinetuneJob, task: Task, tokenizer: Tokenizer, features: list, evaluation: list | None,
             seed: int, out: Path, num_train: int) -> dict[str, Any]:
    """Train one seed into `out`; returns what training.json records."""
    name = job.task
    seed_everything(seed)
    model = build_model(name, job.model, job.head, task, tokenizer).to(resolve_device(job.device))
    options = replace(job.options, seed=seed)
    info = task.info() | job.reading.info() | ({"pooling": job.head.pooling} if name == "embed" else {})
    record: dict[str, Any] = {"task": name, "model": job.model, "train": job.train, "eval": job.eval,
                              **f1_note(task), "train_examples": num_train, "train_features": len(features),
                              "eval_examples": len(evaluation) if evaluation else 0,
                              "options": asdict(options), "info": info}

    def write_log(result) -> None:
        atomic_write_text(out / "training.json", json.dumps(record | asdict(result), indent=2) + "\n")

    result = train(model, task, features, options,
                   evaluate=(lambda m: task.evaluate(m, evaluation)) if evaluation else None, metric=job.metric,
                   save=lambda m: save_pretrained(m, out, tokenizer, info), on_eval=write_log,
                   run_dir=out, resume=job.resume)
    if distributed.is_main_process():
        write_log(result)
        if not job.keep_state:
            clear_checkpoints(out)
    return record | asdict(result) | {"out": str(out)}


def seed_spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and sample standard deviation of one metric over the seeds, and the values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


def f1_note(task: Task) -> dict[str, str]:
    """{"f1_of": ...}: the class a binary F1 is computed for, or that it is a macro average; {} without F1."""
    if not isinstance(task, ClassifyTask) or task.regression:
        return {}
    labels = task.labels
    return {"f1_of": f"class {labels[1]!r}" if len(labels) == 2 else f"macro average over {len(labels)} classes"}


def _summarize(runs: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Median, min, max and standard deviation of each best eval metric over the seeds; written to seeds.json."""
    keys = [k for k in (runs[0].get("best") or {}) if k.startswith("eval_")]
    spread = {key: seed_spread([run["best"][key] for run in runs]) for key in keys}
    summary = {"task": runs[0]["task"], "seeds": [run["options"]["seed"] for run in runs], "metrics": spread,
               "runs": [{"seed": run["options"]["seed"], "out": run["out"], "best": run["best"]} for run in runs],
               **{k: v for k, v in runs[0].items() if k == "f1_of"}}
    if distributed.is_main_process():
        atomic_write_text(out / "seeds.json", json.dumps(summary, indent=2) + "\n")
    return summary


# ---- evaluate ------------------------------------------------------------------------------------------------
def task_for_model(job: EvaluateJob, model: torch.nn.Module, info: dict, tokenizer: Tokenizer) -> Task:
    """The Task that scores a loaded model, refusing a model without the head the task needs."""
    name = job.task
    needs = {"classify": (models.SequenceClassifier, BiLSTMClassifier), "ner": (models.TokenClassifier,),
             "qa": (models.SpanExtractor,), "embed": (models.SentenceEmbedder,)}[name]
    if not isinstance(model, needs):
        raise InputError(f"{job.model}: a {type(model).__name__} cannot be evaluated on {name} "
                         f"(expected {' or '.join(c.__name__ for c in needs)})")
    given = settings(job.model)  # the folder's window and QA decoding, as every pipeline reads them
    max_length = window(getattr(model, "config", None), tokenizer, job.max_length, given.max_length, MAX_LENGTH[name])
    common = {"batch_size": job.batch_size or BATCH_SIZE[name]}  # fp32 engine: evaluate() converted the weights
    if name == "classify":
        labels = None if model.regression else model.labels or _numbered(model)
        return ClassifyTask(tokenizer, max_length, labels, model.regression, stride=_given(job.stride, given.stride),
                            combine=job.combine or given.combine, **common)
    if name == "ner":
        return TagTask(tokenizer, max_length, model.labels or _numbered(model), **common)
    if name == "qa":
        return QATask(tokenizer, max_length, *fit_to_window(max_length, given.doc_stride, given.max_query_length),
                      given.max_answer_length, given.n_best, given.allow_null, **common)
    return EmbedTask(tokenizer, max_length, info.get("loss") or "cosent", **common)


def _given(value: Any, default: Any) -> Any:
    """An option given on the command line, else the folder's setting."""
    return default if value is None else value


def _numbered(model: torch.nn.Module) -> list[str]:
    """Class names "0", "1", ... for a head saved without id2label."""
    count = model.num_outputs if hasattr(model, "num_outputs") else model.classifier.out_features
    return [str(i) for i in range(count)]


def evaluate(job: EvaluateJob) -> dict[str, Any]:
    """Score a fine-tuned model on a labelled data file: task, model, data, examples and metrics."""
    # embed: the encoder under any head, pooled as job.pooling says (default: the folder's, else mean)
    # --precision bf16 converts the weights, as the pipelines do (a model fine-tuned with --precision bf16 trained
    # under autocast, but what it serves and is scored as is the converted model)
    dtype = torch.bfloat16 if job.precision == "bf16" else None
    model = load_model(job.model, dtype=dtype,
                       **({"kind": "embed", "pooling": job.pooling} if job.task == "embed" else {}))
    model = model.to(resolve_device(job.device))
    info = read_task_info(job.model)
    task = task_for_model(job, model, info, Tokenizer.from_pretrained(job.model))
    regression = job.task == "classify" and model.regression
    examples = subsample(read_examples(job.task, job.data, job.reading, info, regression), job.max_eval)
    task.validate(examples)  # a label or tag the model does not know is an error, not a silent miss
    if job.task == "embed" and not all(isinstance(e.label, float) for e in examples):
        predictions, metrics = None, task.retrieval(model, examples)  # unscored pairs: retrieval
    else:
        predictions = task.predict(model, examples)
        metrics = task.score(examples, predictions)
    if job.predictions and predictions is not None:
        _write_predictions(Path(job.predictions), job.task, examples, predictions)
    return {"task": job.task, "model": job.model, "data": job.data, "examples": len(examples), "metrics": metrics,
            **f1_note(task)}


def _write_predictions(path: Path, task: str, examples: list, predictions: list) -> None:
    """SQuAD's {id: answer} for qa; one JSON value per line (label, score or tag list) otherwise."""
    if task == "qa":
        text = json.dumps({e.id: p for e, p in zip(examples, predictions)}, indent=2) + "\n"
    else:
        text = "".join(json.dumps(p) + "\n" for p in predictions)
    atomic_write_text(path, text)
