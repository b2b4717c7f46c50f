"""The pipeline commands: fill-mask, classify, ner, qa, rerank and attention (embed and similarity: encoderlab.cli.models).

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

from encoderlab.choices import MAX_TOKENS_SHOWN
from encoderlab.cli.options import (MODEL_HELP, add_inference_options, add_json, add_model, add_options,
                                    add_window_options, check_top_k, load_pipeline)
from encoderlab.errors import InputError
from encoderlab.io import check_texts, qa_inputs, read_lines, read_text, require_text
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL

if TYPE_CHECKING:
    from encoderlab.viz.attention import AttentionMaps


def add_pipeline_options(parser: argparse.ArgumentParser, inputs: bool = True, help: str = MODEL_HELP,
                         default_model: str | None = None) -> None:
    """--model (required unless default_model), the inference options and --json (and TEXT.../--input)."""
    add_model(parser, help, default=default_model)
    if inputs:
        parser.add_argument("texts", nargs="*", metavar="TEXT", help="input texts (or use --input)")
        parser.add_argument("--input", metavar="FILE", help="UTF-8 file with one input text per line")
    add_inference_options(parser)
    add_json(parser)


def read_inputs(args: argparse.Namespace) -> list[str]:
    """TEXT arguments, or the lines of --input (blank lines skipped); InputError when there are none."""
    if args.texts and args.input:
        raise InputError("give texts as arguments or with --input, not both")
    texts = read_lines(args.input) if args.input else list(args.texts)
    if not texts:
        raise InputError("no input texts: pass them as arguments or with --input FILE")
    return check_texts(texts)  # before any model loads


def emit(args: argparse.Namespace, results: list[dict[str, Any]], show: callable) -> list[dict[str, Any]]:
    """Print the results as JSON or through `show` (one result at a time); returns them."""
    if args.json:
        json.dump(results, sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        for result in results:
            show(result)
    return results


# ---- the commands ------------------------------------------------------------------------------------
def cmd_fill_mask(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Predict the tokens behind [MASK] (several per text allowed): top-k with probabilities."""
    texts = read_inputs(args)
    check_top_k(args.top_k)
    results = load_pipeline("fill-mask", args)(texts, top_k=args.top_k)

    def show(result: dict[str, Any]) -> None:
        print(result["text"])
        for number, mask in enumerate(result["masks"], 1):
            tops = "  ".join(f"{p['token']} {p['score']:.3f}" for p in mask["predictions"])
            print(f"  [MASK] {number}: {tops}")

    return emit(args, results, show)


def cmd_classify(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Label texts (or text pairs) with a fine-tuned classifier."""
    texts = read_inputs(args)
    inputs: list[Any] = texts
    if args.pair is not None:
        if len(args.pair) != len(texts):
            raise InputError(f"{len(texts)} texts but {len(args.pair)} --pair texts")
        check_texts(args.pair, "--pair text")
        inputs = [[a, b] for a, b in zip(texts, args.pair)]
    results = load_pipeline("classify", args, stride=args.stride, combine=args.combine)(inputs)

    def show(result: dict[str, Any]) -> None:
        print(f"{result['score']:.4f}" if "label" not in result else f"{result['label']}\t{result['score']:.4f}")

    return emit(args, results, show)


def cmd_ner(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Find named entities: type, text, character offsets and score."""
    results = load_pipeline("ner", args)(read_inputs(args))

    def show(result: dict[str, Any]) -> None:
        print(result["text"])
        for entity in result["entities"]:
            print(f"  {entity['entity']:<6} {entity['text']!r} [{entity['start']}:{entity['end']}] "
                  f"{entity['score']:.3f}")

    return emit(args, results, show)


def cmd_qa(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Answer questions from a context; contexts longer than the window are read in overlapping windows."""
    if args.input:
        items = read_questions(args.input)
    else:
        if not args.question or not (args.context or args.context_file):
            raise InputError("qa needs --question and --context (or --context-file), or --input FILE.jsonl")
        context = read_text(args.context_file) if args.context_file else args.context
        if args.context_file and not context.strip():
            raise InputError(f"{args.context_file}: the context file is empty")
        items = [{"question": question, "context": context} for question in args.question]
        qa_inputs(items)  # blank questions or context: refused before the model loads
    results = load_pipeline("qa", args, doc_stride=args.doc_stride)(items)

    def show(result: dict[str, Any]) -> None:
        print(f"{result['answer']!r} [{result['start']}:{result['end']}] {result['score']:.3f}")

    return emit(args, results, show)


def cmd_rerank(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Order passages (TEXT arguments, or the lines of --input) by a cross-encoder's relevance to --query."""
    if args.top_k is not None:
        check_top_k(args.top_k)
    if not args.query.strip():
        raise InputError("rerank: --query is empty or only whitespace (expected some words)")
    results = load_pipeline("rerank", args)([{"query": args.query, "passages": read_inputs(args)}], top_k=args.top_k)

    def show(result: dict[str, Any]) -> None:
        for row in result["ranking"]:
            print(f"{row['score']:.4f}  [{row['index']}] {row['passage']}")

    return emit(args, results, show)


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
    """fill-mask, classify, ner, qa, attention."""
    fill = subparsers.add_parser("fill-mask", help="top-k tokens for each [MASK]", description=cmd_fill_mask.__doc__)
    add_pipeline_options(fill, help="masked-LM checkpoint folder, or the name of a shipped model",
                         default_model=DEFAULT_FILL_MASK_MODEL)
    fill.add_argument("--top-k", type=int, default=5, metavar="K", help="predictions per mask (default: 5)")
    fill.set_defaults(func=cmd_fill_mask)

    classify = subparsers.add_parser("classify", help="label texts with a fine-tuned classifier",
                                     description=cmd_classify.__doc__)
    add_pipeline_options(classify)
    add_window_options(classify)
    classify.add_argument("--pair", nargs="+", metavar="TEXT", help="second texts of pairs, one per input text")
    classify.set_defaults(func=cmd_classify)

    ner = subparsers.add_parser("ner", help="named entities with character offsets", description=cmd_ner.__doc__)
    add_pipeline_options(ner)
    ner.set_defaults(func=cmd_ner)

    qa = subparsers.add_parser("qa", help="extractive question answering", description=cmd_qa.__doc__)
    add_pipeline_options(qa, inputs=False)
    qa.add_argument("--question", nargs="+", metavar="Q", help="one or more questions about the context")
    add_options(qa, (
        ("--context", None, None, "TEXT", "the passage to answer from"),
        ("--context-file", None, None, "FILE", "read the passage from a UTF-8 file"),
        ("--input", None, None, "FILE.jsonl", 'one {"question": ..., "context": ...} per line'),
        ("--doc-stride", int, None, "N",
         "tokens shared by consecutive windows of a long context (default: the model's, else 128)")))
    qa.set_defaults(func=cmd_qa)

    rerank = subparsers.add_parser("rerank", help="order passages by relevance to a query (a cross-encoder)",
                                   description=cmd_rerank.__doc__)
    add_pipeline_options(rerank)
    rerank.add_argument("--query", required=True, metavar="TEXT", help="what the passages are ranked for")
    rerank.add_argument("--top-k", type=int, default=None, metavar="K", help="show the best K (default: all)")
    rerank.set_defaults(func=cmd_rerank)

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
