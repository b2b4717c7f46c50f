"""The pipeline commands, one per card with a Command (encoderlab.cards), each reading its inputs with one of the
readers here (named by the inputs' shape: texts, pairs, questions, a query and texts), and attention (embed and
similarity: encoderlab.cli.models).

Inputs come as arguments or from a file (--input: one text per line; for qa, JSONL with question and
context). Output is a short human-readable listing, or one JSON document with --json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from encoderlab.cards import Card, load, served
from encoderlab.choices import MAX_TOKENS_SHOWN
from encoderlab.cli.options import (MODEL_HELP, add_fields, add_inference_options, add_json, add_model, add_options,
                                    add_window_options, load_pipeline)
from encoderlab.errors import InputError
from encoderlab.retrieval.meta import model_index_kind
from encoderlab.io import check_texts, qa_inputs, read_lines, read_text, require_text

if TYPE_CHECKING:
    from encoderlab.viz.attention import AttentionMaps


def read_inputs(args: argparse.Namespace) -> list[str]:
    """TEXT arguments, or the lines of --input (blank lines skipped); InputError when there are none."""
    if args.texts and args.input:
        raise InputError("give texts as arguments or with --input, not both")
    texts = read_lines(args.input) if args.input else list(args.texts)
    if not texts:
        raise InputError("no input texts: pass them as arguments or with --input FILE")
    return check_texts(texts)  # before any model loads


# ---- the commands: one per card with a Command (encoderlab.cards) ----------------------------------
def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Check the inputs, load the pipeline, print each result as the pipeline shows it (or one JSON document)."""
    task: Card = args.card
    command = task.command
    items = load(command.inputs)(args)  # --top-k: checked with the other counts (encoderlab.cli.options.check_counts)
    pipe = load_pipeline(task.name, args, **{name: getattr(args, name) for name in command.load})
    results = pipe(items, **{name: getattr(args, name) for name in command.call})
    if args.json:
        json.dump(results, sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        print("\n".join(pipe.show(result) for result in results))
    return results


def splade_inputs(args: argparse.Namespace) -> list[str]:
    """The texts, for a SPLADE folder's --model (its task.json), checked before it loads."""
    texts = read_inputs(args)
    if model_index_kind(args.model) != "sparse":
        raise InputError(f"--model {args.model} is not a SPLADE model (expected a folder of `encoderlab finetune "
                         f"splade`, its task.json saying \"task\": \"splade\")")
    if args.top_k is not None and args.top_k < 1:
        raise InputError(f"--top-k {args.top_k}: expected a positive number")
    return texts


def classify_inputs(args: argparse.Namespace) -> list[Any]:
    """The texts, or [text, pair] items with --pair."""
    texts = read_inputs(args)
    if args.pair is None:
        return texts
    if len(args.pair) != len(texts):
        raise InputError(f"{len(texts)} texts but {len(args.pair)} --pair texts")
    check_texts(args.pair, "--pair text")
    return [[a, b] for a, b in zip(texts, args.pair)]


def qa_items(args: argparse.Namespace) -> list[dict[str, str]]:
    """{"question", "context"} items from --input, or from --question and --context (or --context-file)."""
    if args.input:
        return read_questions(args.input)
    if not args.question or not (args.context or args.context_file):
        raise InputError("qa needs --question and --context (or --context-file), or --input FILE.jsonl")
    context = read_text(args.context_file) if args.context_file else args.context
    if args.context_file and not context.strip():
        raise InputError(f"{args.context_file}: the context file is empty")
    items = [{"question": question, "context": context} for question in args.question]
    qa_inputs(items)  # blank questions or context: refused before the model loads
    return items


def query_items(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One {"query", "passages"} item: --query and the texts (a card whose pipeline orders texts by a query)."""
    if not args.query.strip():
        raise InputError(f"{args.card.name}: --query is empty or only whitespace (expected some words)")
    return [{"query": args.query, "passages": read_inputs(args)}]


def read_questions(path: str) -> list[dict[str, str]]:
    """The {"question", "context"} objects of a JSONL file; InputError naming the file and line of a bad one."""
    items = []
    for number, line in enumerate(read_lines(path), 1):  # read_lines refuses blank lines: numbers are file lines
        try:
            item = json.loads(line)
        except ValueError as err:
            raise InputError(f"{path}:{number}: not valid JSON ({err})") from None
        try:
            qa_inputs([item])
        except InputError as err:
            raise InputError(f"{path}:{number}: {str(err).removeprefix('input 0: ')}") from None
        items.append(item)
    return items


def cmd_attention(args: argparse.Namespace) -> None:
    """Draw the attention of one text (or pair) at one layer: one head, or a grid of all heads."""
    require_text(args.text, args.pair)  # before the model is loaded
    if args.max_tokens < 1:
        raise InputError(f"--max-tokens {args.max_tokens}: expected at least 1")
    from encoderlab.checkpoint import load_model, resolve_model_path
    from encoderlab.folder import settings
    from encoderlab.tokenizer import Tokenizer
    from encoderlab.viz.attention import attention_maps, plot_attention

    folder = resolve_model_path(args.model)
    model = load_model(folder, kind="base")  # any checkpoint: bare, MLM or fine-tuned; fp32 probabilities
    maps = attention_maps(model, Tokenizer.from_pretrained(folder), args.text, args.pair, [args.layer],
                          settings(folder).max_length)  # the window the pipelines use
    out = plot_attention(maps, args.out, args.layer, args.head, args.max_tokens)
    if args.json:
        print(json.dumps(_summary(maps, args.layer, args.head, out)))
    else:
        what = f"head {args.head % maps.num_heads}" if args.head is not None else f"all {maps.num_heads} heads"
        cut = " (truncated to the model's window)" if maps.truncated else ""
        print(f"wrote {out}: layer {maps.layers[0]}, {what}, {len(maps.tokens)} tokens{cut}")


def _summary(maps: AttentionMaps, layer: int, head: int | None, out: Path) -> dict:
    """The JSON of `attention --json`: tokens, the chosen map(s) and each head's mean row entropy."""
    from encoderlab.viz.attention import head_entropy

    selected = maps.select(layer, head)
    entropy = head_entropy(selected)  # () or (heads,)
    return {"png": str(out), "tokens": maps.tokens, "layer": maps.layers[maps.layer_index(layer)],
            "head": None if head is None else head % maps.num_heads, "num_heads": maps.num_heads,
            "truncated": maps.truncated, "attention": selected.tolist(),  # (T, T) or (heads, T, T), rows = queries
            "entropy_nats": entropy.tolist(), "max_entropy_nats": math.log(len(maps.tokens))}


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """The pipeline commands (the cards with a Command), then attention."""
    for task in served():
        command = task.command
        if command is None:
            continue
        parser = subparsers.add_parser(task.name, help=task.help, description=command.description or task.help)
        add_model(parser, command.model_help or MODEL_HELP, default=task.default_model)
        if command.texts:
            parser.add_argument("texts", nargs="*", metavar="TEXT", help="input texts (or use --input)")
            parser.add_argument("--input", metavar="FILE", help="UTF-8 file with one input text per line")
        add_inference_options(parser, progress=True)
        add_json(parser)
        if command.window:
            add_window_options(parser)
        if command.options is not None:
            add_fields(parser, command.options)
        parser.set_defaults(func=run, card=task)

    parser = subparsers.add_parser("attention", help="heat-map of a layer's attention for one text",
                                   description=cmd_attention.__doc__)
    add_model(parser, "checkpoint folder (bare, MLM or fine-tuned), or the alias 'minilm'")
    parser.add_argument("text", metavar="TEXT", help="the text to look at; past the model's window (the folder's "
                        "max length, else all the model takes) it is truncated, and the output says so")
    add_options(parser, (
        ("--pair", None, None, "TEXT", "a second text, encoded as [CLS] A [SEP] B [SEP]"),
        ("--layer", int, -1, "L", "layer to draw, from 0; negative counts from the last (default: -1, the last)"),
        ("--head", int, None, "H", "one head to draw, from 0; negative counts from the last (default: a grid of all)"),
        ("--max-tokens", int, MAX_TOKENS_SHOWN, "N", f"draw at most the first N tokens (default: {MAX_TOKENS_SHOWN})")))
    parser.add_argument("--out", required=True, metavar="FILE.png", help="where to write the PNG")
    add_json(parser, "print tokens, the drawn map(s) and each head's entropy as JSON")
    parser.set_defaults(func=cmd_attention)
