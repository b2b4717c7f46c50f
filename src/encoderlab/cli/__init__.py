"""The `encoderlab` command. Each subcommand is a small function; errors in user input exit 2 with one line, argument
errors included. Building the parser imports no torch (encoderlab.cli.options says how)."""

from __future__ import annotations

import argparse
import logging
import sys

from encoderlab.cli import benchmark, export, finetune, hub, models, pipelines, retrieval, serve, train
from encoderlab.cli.options import Parser, check_counts
from encoderlab.errors import EncoderlabError, Terminated
from encoderlab.hub_data import is_hub_data, parse_hub_dataset
from encoderlab.paths import check_model_name

# Each command group's module adds its subcommands with add_commands(subparsers), in this order; what the group does,
# for the tagline of `encoderlab --help` (tests/test_help.py: every group of commands has its words there).
COMMAND_GROUPS = (
    (models, "inspect, embed, compare and merge models"),
    (train, "train tokenizers and pretrain"),
    (finetune, "fine-tune and evaluate"),
    (benchmark, "benchmark"),
    (pipelines, "run pipelines"),
    (retrieval, "index and search a corpus"),
    (export, "export to ONNX"),
    (serve, "serve over HTTP"),
    (hub, "push to the Hugging Face Hub"),
)
COMMAND_MODULES = tuple(module for module, _ in COMMAND_GROUPS)
TAGLINE = "BERT-family encoders: " + "; ".join(does for _, does in COMMAND_GROUPS) + "."
EPILOG = ("--model takes a checkpoint folder (config.json + model.safetensors), the alias 'minilm', a model "
          "shipped under models/ (fill-mask's default, encoderlab-fill-mask), or a Hugging Face Hub name "
          "(org/name[@revision]), downloaded into the Hub's cache unless it is there. --train, --eval, --data and "
          "--corpus also take a Hub dataset, hf:NAME[/CONFIG][:SPLIT] (hf:stanfordnlp/sst2:train, "
          "hf:nyu-mll/glue/sst2:validation): NAME is name or org/name, a third segment the config; loaded through "
          "`datasets` into its cache (HF_HOME, HF_DATASETS_CACHE).")
DATA_OPTIONS = ("train", "eval", "data", "corpus")  # the options that take a data file, or a Hub dataset


# ---- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = Parser(prog="encoderlab", description=TAGLINE, epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_commands(commands)
    return parser


def _one_line(err: Exception) -> str:
    """An error's message on one line (a YAML parser's message spans several, with a caret under the column)."""
    lines = [line.strip() for line in str(err).splitlines()]
    return " ".join(line for line in lines if line and set(line) != {"^"})


def check_data_names(args: argparse.Namespace) -> None:
    """Refuse a malformed hf: data name before a command imports torch (a suite's --data takes no split)."""
    for option in DATA_OPTIONS:
        values = getattr(args, option, None)
        for value in values if isinstance(values, list) else [values]:
            if is_hub_data(value):
                parse_hub_dataset(value, split=args.command != "benchmark")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 ok, 2 bad input, 1 I/O failure)."""
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # what a result records as its command
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        if getattr(args, "model", None) is not None:
            check_model_name(args.model)  # a malformed name is refused here, before a command imports torch
        check_counts(args)
        check_data_names(args)
        args.func(args)
    except (EncoderlabError, OSError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2 if isinstance(err, EncoderlabError) else 1
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143  # 128 + SIGTERM, as a shell reports it
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
