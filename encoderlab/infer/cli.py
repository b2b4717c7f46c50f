"""The pipeline commands: fill-mask, classify, ner and qa (embed and similarity live in encoderlab.cli).

Inputs come as arguments or from a file (--input: one text per line; for qa, JSONL with question and
context). Output is a short human-readable listing, or one JSON document with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from encoderlab.errors import InputError

PRECISION_HELP = ("fp32, bf16 (where the CPU has bf16 arithmetic), int8 (dynamic per-token quantization of the "
                  "linear layers), or auto: the fastest of those, timed at load (default: fp32)")
COMPILE_HELP = ("torch.compile the encoder: faster on many texts (int8 MiniLM on SST-2: about 1.3x), but the "
                "first load compiles for 10-40 s; needs a C++ compiler")


def add_pipeline_options(parser: argparse.ArgumentParser, inputs: bool = True) -> None:
    """--model, --precision, --compile, --batch-size, --max-length, --threads, --json (and TEXT.../--input)."""
    parser.add_argument("--model", required=True, metavar="M", help="checkpoint folder (or the alias 'minilm')")
    if inputs:
        parser.add_argument("texts", nargs="*", metavar="TEXT", help="input texts (or use --input)")
        parser.add_argument("--input", metavar="FILE", help="UTF-8 file with one input text per line")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8", "auto"), default="fp32", help=PRECISION_HELP)
    parser.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="inputs per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, metavar="T",
                        help="tokens per input window (default: the model's limit, or what it was fine-tuned with)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def load(task: str, args: argparse.Namespace, **options: Any):
    """The pipeline the arguments ask for."""
    import torch

    from encoderlab.infer.pipelines import pipeline

    if args.threads is not None:
        if args.threads < 1:
            raise InputError(f"--threads {args.threads}: expected a positive number")
        torch.set_num_threads(args.threads)
    if args.max_length is not None:
        options["max_length"] = args.max_length
    return pipeline(task, args.model, args.precision, batch_size=args.batch_size, compile=args.compile, **options)


def read_inputs(args: argparse.Namespace) -> list[str]:
    """TEXT arguments, or the lines of --input (blank lines skipped); InputError when there are none."""
    from encoderlab.io import read_lines

    if args.texts and args.input:
        raise InputError("give texts as arguments or with --input, not both")
    texts = read_lines(args.input) if args.input else list(args.texts)
    if not texts:
        raise InputError("no input texts: pass them as arguments or with --input FILE")
    return texts


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
    results = load("fill-mask", args)(read_inputs(args), top_k=args.top_k)

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
        inputs = [[a, b] for a, b in zip(texts, args.pair)]
    results = load("classify", args)(inputs)

    def show(result: dict[str, Any]) -> None:
        print(f"{result['score']:.4f}" if "label" not in result else f"{result['label']}\t{result['score']:.4f}")

    return emit(args, results, show)


def cmd_ner(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Find named entities: type, text, character offsets and score."""
    results = load("ner", args)(read_inputs(args))

    def show(result: dict[str, Any]) -> None:
        print(result["text"])
        for entity in result["entities"]:
            print(f"  {entity['entity']:<6} {entity['text']!r} [{entity['start']}:{entity['end']}] "
                  f"{entity['score']:.3f}")

    return emit(args, results, show)


def cmd_qa(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Answer questions from a context; contexts longer than the window are read in overlapping windows."""
    from encoderlab.io import read_text

    if args.input:
        items = read_questions(args.input)
    else:
        if not args.question or not (args.context or args.context_file):
            raise InputError("qa needs --question and --context (or --context-file), or --input FILE.jsonl")
        context = read_text(args.context_file) if args.context_file else args.context
        if args.context_file and not context.strip():
            raise InputError(f"{args.context_file}: the context file is empty")
        items = [{"question": question, "context": context} for question in args.question]
    results = load("qa", args, doc_stride=args.doc_stride)(items)

    def show(result: dict[str, Any]) -> None:
        print(f"{result['answer']!r} [{result['start']}:{result['end']}] {result['score']:.3f}")

    return emit(args, results, show)


def read_questions(path: str) -> list[dict[str, str]]:
    """The {"question", "context"} objects of a JSONL file; InputError naming the file and line of a bad one."""
    from encoderlab.infer.pipelines import qa_inputs
    from encoderlab.io import read_lines

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


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """fill-mask, classify, ner, qa."""
    fill = subparsers.add_parser("fill-mask", help="top-k tokens for each [MASK]", description=cmd_fill_mask.__doc__)
    add_pipeline_options(fill)
    fill.add_argument("--top-k", type=int, default=5, metavar="K", help="predictions per mask (default: 5)")
    fill.set_defaults(func=cmd_fill_mask)

    classify = subparsers.add_parser("classify", help="label texts with a fine-tuned classifier",
                                     description=cmd_classify.__doc__)
    add_pipeline_options(classify)
    classify.add_argument("--pair", nargs="+", metavar="TEXT", help="second texts of pairs, one per input text")
    classify.set_defaults(func=cmd_classify)

    ner = subparsers.add_parser("ner", help="named entities with character offsets", description=cmd_ner.__doc__)
    add_pipeline_options(ner)
    ner.set_defaults(func=cmd_ner)

    qa = subparsers.add_parser("qa", help="extractive question answering", description=cmd_qa.__doc__)
    add_pipeline_options(qa, inputs=False)
    qa.add_argument("--question", nargs="+", metavar="Q", help="one or more questions about the context")
    qa.add_argument("--context", metavar="TEXT", help="the passage to answer from")
    qa.add_argument("--context-file", metavar="FILE", help="read the passage from a UTF-8 file")
    qa.add_argument("--input", metavar="FILE.jsonl", help='one {"question": ..., "context": ...} per line')
    qa.add_argument("--doc-stride", type=int, default=None, metavar="N",
                    help="tokens shared by consecutive windows of a long context (default: the model's, else 128)")
    qa.set_defaults(func=cmd_qa)
