"""`encoderlab info`, `embed`, `similarity`, `compare` and `merge`: a model's shape, its vectors, the family side by
side, and weight averages of models."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from encoderlab.choices import COMPARE_QUICK as QUICK
from encoderlab.choices import FAMILY_PRESETS, REFERENCE
from encoderlab.choices import CompareSettings as Settings
from encoderlab.cli.options import (PROGRESS, add_inference_options, add_json, add_model, add_options, add_overwrite,
                                    add_threads, add_window_options, load_pipeline)
from encoderlab.config import EncoderConfig
from encoderlab.errors import InputError
from encoderlab.io import atomic_write, atomic_write_text, check_out_folder, check_texts, read_lines
from encoderlab.cards import card
from encoderlab.cli.pipelines import run
from encoderlab.models import PRESETS

if TYPE_CHECKING:
    from encoderlab.tasks.pipeline import Pipeline


def _add_embedding_options(parser: argparse.ArgumentParser) -> None:
    """--pooling and the inference options."""
    parser.add_argument("--pooling", choices=("mean", "cls"), default=None,
                        help="how token vectors become one vector (default: what the folder declares, else mean)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="L2-normalize each vector, or not (default: as the folder says: a sentence-transformers "
                             "folder whose modules.json ends in Normalize, such as minilm, gives unit vectors)")
    parser.add_argument("--dimensions", type=int, default=None, metavar="N",
                        help="keep each vector's first N dimensions, normalised again where vectors are: for a model "
                             "trained with `finetune embed --matryoshka` (default: all)")
    add_inference_options(parser, progress=True)
    add_window_options(parser, combine=False)


# ---- info -----------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> None:
    """Print a config summary and the parameter count of a checkpoint or preset."""
    import torch

    from encoderlab.checkpoint import load_model, resolve_model_path
    from encoderlab.nn.model import EncoderModel

    if args.preset:
        config = EncoderConfig.from_preset(args.preset)
        with torch.device("meta"):
            model = EncoderModel(config)
        source = f"preset {args.preset}"
    else:
        model = load_model(args.model)
        config, source = model.config, str(resolve_model_path(args.model))
    summary = {
        "source": source, "model_type": config.model_type, "class": type(model).__name__,
        "num_layers": config.num_layers, "hidden_size": config.hidden_size, "num_heads": config.num_heads,
        "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings, "max_tokens": config.max_tokens,
        "hidden_act": config.hidden_act,
        "parameters": model.num_parameters(),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"{key:<{width}}  {value:,}" if isinstance(value, int) else f"{key:<{width}}  {value}")


# ---- embed ----------------------------------------------------------------------------------------
def _embedder(args: argparse.Namespace) -> Pipeline:
    """The embed pipeline the options ask for (pooling, normalisation and max length default to the folder's)."""
    return load_pipeline("embed", args, normalize=args.normalize, stride=args.stride, dimensions=args.dimensions,
                         **({"pooling": args.pooling} if args.pooling else {}))


def cmd_embed(args: argparse.Namespace) -> list[dict] | None:
    """Embed every line of a text file into an (N, H) float32 .npy array; with --sparse, print the weighted terms a
    SPLADE model gives each text (TEXT arguments or --input lines)."""
    if args.sparse:
        return cmd_embed_sparse(args)
    if args.texts or args.json or args.top_k is not None:
        raise InputError("TEXT arguments, --json and --top-k go with --sparse; dense vectors are written from "
                         "--input FILE to --out OUT.npy")
    if not (args.input and args.out):
        raise InputError("embed needs --input FILE and --out OUT.npy (or --sparse to print a SPLADE model's terms)")
    texts = read_lines(args.input)
    embedder = _embedder(args)
    vectors = embedder.embed(texts)
    import numpy as np  # loaded with the pipeline already
    out = Path(args.out)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.save(handle, vectors)

    atomic_write(out, write)
    print(f"wrote {out}: {vectors.shape[0]} x {vectors.shape[1]} float32 "
          f"({embedder.pooling} pooling{', normalized' if embedder.normalize else ''}, {embedder.precision}"
          f"{'' if embedder.engine_name == 'torch' else ' on ' + embedder.engine_name})")


def cmd_embed_sparse(args: argparse.Namespace) -> list[dict]:
    """Each text's non-zero terms, heaviest first (token and weight): what a SPLADE model expands it to (the
    `splade` command's run)."""
    if args.out or args.dimensions or args.pooling or args.normalize is not None:
        raise InputError("--sparse prints each text's terms: --out, --dimensions, --pooling and --normalize are for "
                         "dense vectors")
    args.card = card("splade")
    return run(args)


# ---- similarity -----------------------------------------------------------------------------------
def cmd_similarity(args: argparse.Namespace) -> None:
    """Cosine similarity of the first text with each of the others, most similar first."""
    if len(args.texts) < 2:
        raise InputError("similarity needs at least two texts: a query and one or more candidates")
    check_texts(args.texts)  # before the model loads
    vectors = _embedder(args).embed(args.texts)
    from encoderlab.engine import cosine_similarity

    scores = cosine_similarity(vectors[:1], vectors[1:])[0]
    ranked = sorted(zip(args.texts[1:], scores.tolist()), key=lambda pair: -pair[1])
    if args.json:
        print(json.dumps({"query": args.texts[0], "ranking": [{"text": t, "cosine": s} for t, s in ranked]}, indent=2))
        return
    print(f"query: {args.texts[0]}")
    for text, score in ranked:
        print(f"{score:7.4f}  {text}")


# ---- compare --------------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> None:
    """Measure the family side by side: size, CPU latency and throughput on the same inputs, SST-2 accuracy."""
    from encoderlab.compare import compare, render_json, render_markdown

    settings = replace(QUICK if args.quick else Settings(), threads=args.threads)
    if args.repeats is not None:
        settings = replace(settings, repeats=args.repeats)
    if args.sequences is not None:
        settings = replace(settings, sequences=args.sequences,
                           latency_sequences=min(settings.latency_sequences, args.sequences))
    rows = compare(args.presets, settings, args.reference, args.sst2_results, progress=not args.no_progress)
    text = render_json(rows, settings) if args.json else render_markdown(rows, settings)
    if args.out:
        atomic_write_text(Path(args.out), text)
    print(text, end="" if text.endswith("\n") else "\n")


# ---- merge ----------------------------------------------------------------------------------------
def cmd_merge(args: argparse.Namespace) -> None:
    """Average the weights of models of one architecture (a model soup, checkpoint averaging, or an interpolation
    between a model and the one it started from); the first model gives the class, head, config and tokenizer."""
    check_out_folder(args.out, args.overwrite, inputs=args.models)  # before torch loads
    from encoderlab.merge import MERGE_FILE, merge_to_folder

    report = merge_to_folder(args.models, args.out, args.weights, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return
    shares = ", ".join(f"{name} x {share:.3g}" for name, share in zip(report.models, report.weights))
    print(f"wrote {args.out}: the weighted average of {shares} ({report.tensors} tensors)")
    kept = [key for key, holders in report.partial.items() if holders == [0]]
    if kept:
        print(f"  kept from {report.models[0]} (no other model has them): {', '.join(kept)}")
    for key, holders in report.partial.items():
        if holders != [0]:
            print(f"  {key}: averaged over {', '.join(report.models[i] for i in holders)} only (the others lack it)")
    for i, names in report.left_out.items():
        print(f"  left out of {report.models[i]} (the first model has no such tensors): {', '.join(names)}")
    for i in report.unchecked_tokenizers:
        print(f"  {report.models[i]}: no tokenizer files, so its vocabulary was not compared with the first model's")
    print(f"  cosine of each model's weight matrices to the first's: "
          f"{', '.join(f'{name} {cosine:.3f}' for name, cosine in zip(report.models, report.cosines))}")
    for i in report.unrelated():
        print(f"warning: {report.models[i]} looks unrelated to {report.models[0]} (cosine {report.cosines[i]:.3f}): "
              f"models that did not start from one checkpoint average into noise", file=sys.stderr)
    print(f"wrote {Path(args.out) / MERGE_FILE} (the inputs, weights and the tensors above)")


# ---- parser ---------------------------------------------------------------------------------------
def add_commands(commands: argparse._SubParsersAction) -> None:
    """Register `info`, `embed`, `similarity`, `compare` and `merge` on the main parser's subparsers."""
    info = commands.add_parser("info", help="config summary and parameter count", description=cmd_info.__doc__)
    source = info.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="M", help="checkpoint folder or alias ('minilm')")
    source.add_argument("--preset", metavar="NAME", choices=list(PRESETS), help=f"a preset: {', '.join(PRESETS)}")
    add_json(info)
    info.set_defaults(func=cmd_info)

    emb = commands.add_parser("embed", help="embed one text per line into a .npy array (--sparse: print a SPLADE "
                              "model's terms)", description=cmd_embed.__doc__)
    add_model(emb)
    emb.add_argument("texts", nargs="*", metavar="TEXT", help="--sparse: texts to show the terms of (or --input)")
    emb.add_argument("--input", metavar="FILE", help="UTF-8 text file, one text per line")
    emb.add_argument("--out", metavar="OUT.npy", help="where to write the (N, H) float32 array")
    emb.add_argument("--sparse", action="store_true", help="print each text's weighted terms, heaviest first, by a "
                     "SPLADE model (encoderlab finetune splade): the words it expands the text to")
    emb.add_argument("--top-k", type=int, default=None, metavar="K", help="--sparse: the heaviest K terms (default: "
                     "all)")
    add_json(emb, "--sparse: print each text's terms as JSON (indices, values, tokens)")
    _add_embedding_options(emb)
    emb.set_defaults(func=cmd_embed)

    sim = commands.add_parser("similarity", help="cosine similarity of a query with other texts",
                              description=cmd_similarity.__doc__)
    add_model(sim)
    sim.add_argument("texts", nargs="+", metavar="TEXT", help="the query, then one or more candidates")
    add_json(sim)
    _add_embedding_options(sim)
    sim.set_defaults(func=cmd_similarity)

    parser = commands.add_parser("compare", help="the family side by side: size, CPU speed, SST-2 accuracy",
                                 description=cmd_compare.__doc__)
    parser.add_argument("--presets", nargs="+", metavar="NAME", default=None,
                        help=f"presets to compare (default: those of {', '.join(FAMILY_PRESETS)} that exist)")
    parser.add_argument("--reference", default=REFERENCE, metavar="NAME",
                        help=f"preset the ratios are to; always measured, as the first row (default: {REFERENCE})")
    add_threads(parser, default=Settings.threads)
    add_options(parser, (
        ("--sequences", int, None, "N",
         f"token-id sequences timed per pass (default: {Settings.sequences}; --quick: {QUICK.sequences})"),
        ("--repeats", int, None, "N",
         f"timed passes per model, median taken (default: {Settings.repeats}; --quick: {QUICK.repeats})"),
        ("--quick", bool, None, None, "fewer sequences and repeats: a rough table, fast"),
        ("--out", None, None, "FILE", "also write the output to FILE (atomically)"),
        PROGRESS))
    parser.add_argument("--sst2-results", nargs="+", metavar="FILE", default=None,
                        help="bench result JSON files, or `encoderlab benchmark`'s OUT/results.json (the median "
                             "over its seeds), to read SST-2 accuracy from (default: bench/results/*.json)")
    add_json(parser, "machine-readable rows instead of markdown")
    parser.set_defaults(func=cmd_compare)

    merge = commands.add_parser("merge", help="average the weights of models of one architecture (model soups)",
                                description=cmd_merge.__doc__)
    merge.add_argument("models", nargs="+", metavar="M",
                       help="two or more checkpoint folders or aliases that started from one checkpoint (a run's "
                            "checkpoints, fine-tunes of one model, a model and its start)")
    merge.add_argument("--out", required=True, metavar="DIR", help="the folder to write the merged model to")
    merge.add_argument("--weights", nargs="+", type=float, default=None, metavar="W",
                       help="one weight per model, >= 0, normalised to sum to 1 (default: equal)")
    add_overwrite(merge)
    add_json(merge, "print merge.json's report instead of the summary")
    merge.set_defaults(func=cmd_merge)
