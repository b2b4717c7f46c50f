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

from encoderlab.cards import TaskOptions, card, given
from encoderlab.choices import BILSTM
from encoderlab.engine import resolve_device as engine_device, window
from encoderlab.errors import ConfigError, InputError
from encoderlab.folder import read_task_info, settings
from encoderlab.hub_data import LocalData, is_hub_data, local_copy
from encoderlab.io import atomic_write_text, clear_folder
from encoderlab.checkpoint import load_model, model_config, save_pretrained
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.tasks.base import Task
from encoderlab.tasks.objective import TrainOptions, train
from encoderlab.tasks.readers import LABEL_NAMES
from encoderlab.tasks.spec import Reading, TaskSpec, task_spec
from encoderlab.tokenizer import Tokenizer
from encoderlab.train import distributed
from encoderlab.train.state import clear_checkpoints, seed_everything


@dataclass
class FinetuneJob:
    """One `finetune` job: the data, the model, the task's options and the recipe."""

    task: str
    model: str
    train: str
    out: str | Path
    options: TrainOptions = field(default_factory=TrainOptions)
    eval: str | None = None
    tokenizer: str | None = None
    reading: Reading = Reading()
    head: TaskOptions | None = None
    """The task's options (its card's options dataclass); None: their defaults."""
    max_length: int | None = None
    seeds: int = 1
    metric: str | None = None
    device: str | None = None
    resume: bool = False
    max_train: int | None = None
    max_eval: int | None = None
    keep_state: bool = True
    """Keep OUT/checkpoints (the optimizer state --resume continues from, about 3x the model) after a finished run."""
    overwrite: bool = False
    """Empty OUT once the data is read and checked, before the first file is written (`--overwrite`)."""


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
def read_examples(spec: TaskSpec, source: str, reading: Reading, info: dict, head: TaskOptions,
                  default_split: str = "validation") -> list:
    """The examples of a data file, or of a Hub dataset's split (hf:NAME[/CONFIG][:SPLIT], encoderlab.hub_data)
    written once as the file the task's reader reads."""
    if is_hub_data(source):
        source = str(local_copy(source, card(spec.name).reads, default_split).path)
    return spec.read(source, reading, info, head)


def hub_labels(job: FinetuneJob) -> TaskOptions:
    """The head, with a Hub dataset's class names (its label column's ClassLabel, in id order) as the labels
    when none are given: SST-2's negative, positive keep the ids and the positive class that F1 is of."""
    reads = card(job.task).reads
    if getattr(job.head, "labels", True) or job.head.regression or not is_hub_data(job.train) or reads != "table":
        return job.head  # a task without class names, or given them
    local = local_copy(job.train, reads, "train")
    column = _label_column(local, job.reading.label_col)
    names = local.classes.get(column) if column else None
    return replace(job.head, labels=names) if names else job.head


def _label_column(local: LocalData, label_col: str | None) -> str | None:
    """The label column's name, as the reader picks it: --label-col (a name or an index), else the first of
    LABEL_NAMES there is."""
    lowered = {name.lower(): name for name in local.columns}
    if label_col is not None and label_col.strip().lstrip("-").isdigit():
        index = int(label_col)
        return local.columns[index] if -len(local.columns) <= index < len(local.columns) else None
    if label_col is not None:
        return lowered.get(label_col.strip().lower())
    return next((lowered[name] for name in LABEL_NAMES if name in lowered), None)


def subsample(examples: list, limit: int | None) -> list:
    """At most `limit` examples, drawn with a fixed seed (independent of --seed) and kept in file order."""
    if not limit or limit >= len(examples):
        return examples
    keep = sorted(random.Random(0).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


# ---- building tasks and models ------------------------------------------------------------------------------
def build_model(spec: TaskSpec, model: str, head: TaskOptions, task: Task, tokenizer: Tokenizer) -> torch.nn.Module:
    """A task model: the encoder of `model` (or a BiLSTM) with the task's head, new unless `model` holds it."""
    if model == BILSTM:
        if BiLSTMClassifier not in spec.models:
            raise ConfigError(f"--model {BILSTM} is a text-classification baseline; it cannot do {spec.name}")
        return BiLSTMClassifier(tokenizer.vocab_size, task.num_outputs, tokenizer.pad_id,
                                head.embed_dim, head.lstm_hidden, labels=task.labels, regression=task.regression)
    built = (spec.load(model, head) if spec.load else
             load_model(model, kind=spec.model_kind, **spec.model_options(task, head))).train()
    if built.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
                          f"{built.config.vocab_size}")
    built.config.labels = task.labels if spec.keeps_labels else None
    spec.prepare(built, task)
    return built


def resolve_device(name: str | None) -> torch.device:
    """--device, or CUDA when there is one, else the CPU (engine.resolve_device); under torchrun, this rank's."""
    if distributed.world_size() > 1:
        return distributed.setup(name or "auto").device
    return engine_device(name)


# ---- finetune ------------------------------------------------------------------------------------------------
def finetune(job: FinetuneJob) -> dict[str, Any]:
    """Fine-tune one run per seed, keeping each run's best checkpoint by the eval metric; the result (or spread)."""
    job = replace(job, head=job.head or card(job.task).options())
    spec, out = task_spec(job.task, job.head.variant), Path(job.out)
    job.options.validate()
    spec.check_job(job)
    if job.seeds < 1:
        raise ConfigError(f"--seeds {job.seeds}: expected a positive number")
    tokenizer = Tokenizer.from_pretrained(job.tokenizer or ("minilm" if job.model == BILSTM else job.model))
    job = replace(job, head=hub_labels(job))
    classes = {"labels": getattr(job.head, "labels", None)}  # the class names given, for a task that has them
    train_set = subsample(read_examples(spec, job.train, job.reading, classes, job.head, "train"), job.max_train)
    evaluation = None
    if job.eval:
        evaluation = subsample(read_examples(spec, job.eval, job.reading, classes, job.head), job.max_eval)
    task = spec.build(job.head, tokenizer, train_set, train_window(job, tokenizer),
                      {"batch_size": job.options.batch_size, "precision": job.options.precision})
    _check_metric(job.metric, task, evaluation)
    if job.model != BILSTM:
        spec.check_model(job.model)
        task.check_config(model_config(job.model))  # config.json only: a misfit is refused before training starts
    features = task.features(train_set)
    if evaluation is not None:
        task.validate(evaluation)  # an unknown label in the eval file fails now, not after the first epoch
    if job.overwrite and distributed.is_main_process():
        clear_folder(out)
    seeds = [job.options.seed + k for k in range(job.seeds)]
    runs = [_one_run(job, spec, task, tokenizer, features, evaluation, seed,
                     out if len(seeds) == 1 else out / f"seed-{seed}", len(train_set)) for seed in seeds]
    return runs[0] if len(runs) == 1 else _summarize(runs, out)


def train_window(job: FinetuneJob, tokenizer: Tokenizer) -> int:
    """Tokens per training input: --max-length, else the task's default, within what the model takes."""
    config = None if job.model == BILSTM else model_config(job.model)
    return window(config, tokenizer, job.max_length, card(job.task).max_length)


def _check_metric(metric: str | None, task: Task, evaluation: list | None) -> None:
    """--metric must be one the task reports (and needs an eval set)."""
    if metric is None:
        return
    if evaluation is None:
        raise ConfigError("--metric needs --eval: the best checkpoint is chosen on the eval set")
    allowed = task.metrics + task.other_metrics
    if metric not in allowed:
        raise ConfigError(f"--metric {metric!r}: {task.name} reports {', '.join(allowed)}")


def _one_run(job: FinetuneJob, spec: TaskSpec, task: Task, tokenizer: Tokenizer, features: list,
             evaluation: list | None, seed: int, out: Path, num_train: int) -> dict[str, Any]:
    """Train one seed into `out`; returns what training.json records."""
    seed_everything(seed)
    model = build_model(spec, job.model, job.head, task, tokenizer).to(resolve_device(job.device))
    options = replace(job.options, seed=seed)
    info = task.info() | job.reading.info() | spec.info(task, job.head) | (
        {"task_type": spec.variant} if spec.variant else {})
    record: dict[str, Any] = {"task": job.task, "model": job.model, "train": job.train, "eval": job.eval,
                              **task.notes(), "train_examples": num_train, "train_features": len(features),
                              "eval_examples": len(evaluation) if evaluation else 0,
                              "options": asdict(options), "info": info}

    def write_log(result) -> None:
        atomic_write_text(out / "training.json", json.dumps(record | asdict(result), indent=2) + "\n")

    result = train(model, task, features, options,
                   evaluate=(lambda m: task.evaluate(m, evaluation)) if evaluation else None, metric=job.metric,
                   save=lambda m: (save_pretrained(m, out, tokenizer, info), spec.after_save(out, task)), on_eval=write_log,
                   run_dir=out, resume=job.resume)
    if distributed.is_main_process():
        write_log(result)
        if not job.keep_state:
            clear_checkpoints(out)
    return record | asdict(result) | {"out": str(out)}


def seed_spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and sample standard deviation of one metric over the seeds, and the values."""
    median = statistics.median(values)
    if all(isinstance(v, int) for v in values) and float(median).is_integer():
        median = int(median)  # a count (a ranking task's queries) stays a count, as number_text prints it
    return {"median": median, "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


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
    spec = task_spec(job.task, info.get("task_type") or ("multilabel" if getattr(model, "multilabel", False) else None))
    if not isinstance(model, spec.models):
        raise InputError(f"{job.model}: a {type(model).__name__} cannot be evaluated on {job.task} "
                         f"(expected {' or '.join(c.__name__ for c in spec.models)})")
    given = settings(job.model)  # the folder's window and QA decoding, as every pipeline reads them
    given = replace(given, **{k: v for k in ("stride", "combine") if (v := getattr(job, k)) is not None})
    max_length = window(getattr(model, "config", None), tokenizer, job.max_length, given.max_length,
                        card(job.task).max_length)
    # an fp32 engine: evaluate() converted the weights
    return spec.restore(model, given, info, tokenizer, max_length,
                        {"batch_size": job.batch_size or card(job.task).batch_size})


def evaluate(job: EvaluateJob) -> dict[str, Any]:
    """Score a fine-tuned model on a labelled data file: task, model, data, examples and metrics."""
    info = read_task_info(job.model)
    spec = task_spec(job.task, info.get("task_type"))
    # embed: the encoder under any head, pooled as job.pooling says (default: the folder's, else mean)
    # --precision bf16 converts the weights, as the pipelines do (a model fine-tuned with --precision bf16 trained
    # under autocast, but what it serves and is scored as is the converted model)
    dtype = torch.bfloat16 if job.precision == "bf16" else None
    loading = {"kind": spec.evaluate_kind, "pooling": job.pooling} if spec.evaluate_kind else {}
    model = (spec.load(job.model, given(card(job.task).options, {})).to(dtype) if spec.load else load_model(job.model, dtype=dtype, **loading)
             ).to(resolve_device(job.device))
    task = task_for_model(job, model, info, Tokenizer.from_pretrained(job.model))
    head = given(card(job.task).options, {"task_type": info.get("task_type") or (
        "regression" if getattr(model, "regression", False) else "classification")})
    examples = subsample(read_examples(spec, job.data, job.reading, info, head), job.max_eval)
    task.validate(examples)  # a label or tag the model does not know is an error, not a silent miss
    predictions, metrics = task.assess(model, examples)
    if job.predictions and predictions is not None:
        atomic_write_text(Path(job.predictions), task.prediction_file(examples, predictions))
    return {"task": job.task, "model": job.model, "data": job.data, "examples": len(examples), "metrics": metrics,
            **task.notes()}
