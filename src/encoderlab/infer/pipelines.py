"""Inference pipelines on their runtime: pipeline(name, model) loads the Pipeline a capability's card names (each
lives beside its task, in its module under encoderlab.tasks; encoderlab.cards lists them), and prepare puts it on an
engine and precision.

    from encoderlab.infer.pipelines import pipeline
    fill = pipeline("fill-mask")  # the shipped encoderlab-fill-mask; or pipeline("fill-mask", "runs/my-mlm")
    fill(["Paris is the [MASK] of France."])[0]["masks"][0]["predictions"][0]["token"]

Every pipeline takes a list of inputs and returns one plain dict (JSON-ready) per input, in input order.
A pipeline loaded from a folder runs as the folder says (encoderlab.folder.settings: window, pooling,
normalisation, QA decoding); keyword options override it. Texts longer than the model's window are truncated
with one warning per call (fill-mask, embed, classify, ner) or split into overlapping windows (qa); they never
crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from encoderlab.cards import card, load, served
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer import backends
from encoderlab.infer.compiled import compile_encoders
from encoderlab.tasks.pipeline import Pipeline


def prepare(pipe: Pipeline, precision: str = "fp32", engine: str = "torch", engine_cache: str | Path | None = None,
            compile: bool = False) -> Pipeline:
    """The pipeline on its runtime: its model converted to `precision` and run by `engine` (encoderlab.infer.backends;
    exports go to engine_cache), or torch.compile'd in place and warmed up (encoderlab.infer.compiled)."""
    if compile and engine != "torch":
        raise ConfigError(f"--compile compiles torch's encoder; --engine {engine} runs another runtime")
    pipe.model, pipe.precision, pipe.engine_name = backends.resolve(
        pipe.model, engine, precision, pipe.probe, pipe.device, pipe.tokenizer, pipe.max_length, pipe.task,
        engine_cache)
    pipe.compiled = compile
    if compile:
        compile_encoders(pipe.model, pipe.probe)
    return pipe


def pipeline_classes() -> dict[str, type[Pipeline]]:
    """Every capability's Pipeline class by name, in the cards' order (the order the server offers them)."""
    return {task.name: load(task.pipeline) for task in served()}


def pipeline_class(task: str) -> type[Pipeline]:
    """The Pipeline class of a capability's card; InputError naming the capabilities with a pipeline."""
    names = [c.name for c in served()]
    if task not in names:
        raise InputError(f"unknown pipeline {task!r}; expected one of {', '.join(names)}")
    return load(card(task).pipeline)


def pipeline(task: str, model: str | Path | None = None, precision: str = "fp32", *, engine: str = "torch",
             engine_cache: str | Path | None = None, compile: bool = False, **options: Any) -> Pipeline:
    """A ready pipeline for `task` (a card with a pipeline) on a checkpoint folder or alias, on its runtime (prepare);
    model None: the card's default model (fill-mask: the shipped encoderlab-fill-mask; the other tasks have none)."""
    kind = pipeline_class(task)
    model = model if model is not None else card(task).default_model
    if model is None:
        raise InputError(f"pipeline {task!r} has no default model: pass a checkpoint folder or alias")
    return prepare(kind.from_pretrained(model, **options), precision, engine, engine_cache, compile)
