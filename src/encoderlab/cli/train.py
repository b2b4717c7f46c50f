"""`encoderlab tokenizer train`, `prepare` and `pretrain`: from raw text to a pretrained encoder."""

from __future__ import annotations

import argparse
import json

from encoderlab.choices import OBJECTIVE_CARDS, PRETRAIN_OBJECTIVES, TOKENIZER_KINDS, names_text
from encoderlab.cli.options import add_json, add_overwrite
from encoderlab.errors import InputError
from encoderlab.io import RESUMABLE, check_out_folder


def cmd_tokenizer_train(args: argparse.Namespace) -> None:
    """Train a tokenizer on raw text (plain, JSONL, WikiExtractor; .gz too) and save it to a folder."""
    from encoderlab.data.tokenizer_training import train_tokenizer  # torch: loaded to run, not for --help

    tokenizer = train_tokenizer(args.corpus, kind=args.kind, vocab_size=args.vocab_size, out_dir=args.out,
                                lowercase=args.lowercase, progress=True)
    print(f"wrote {args.out}: {args.kind} vocabulary of {tokenizer.vocab_size:,} tokens")


def cmd_prepare(args: argparse.Namespace) -> None:
    """Tokenize a raw-text corpus into memory-mapped token shards with sentence and document boundaries."""
    from encoderlab.data.prepare import prepare  # torch: loaded to run, not for --help

    stats = prepare(args.corpus, args.tokenizer, args.out, holdout=args.holdout, workers=args.workers)
    print(json.dumps(stats, indent=2) if args.json else
          f"wrote {args.out}: {stats['documents']:,} documents, {stats['sentences']:,} sentences, "
          f"{stats['tokens']:,} tokens from {stats['bytes'] / 1e6:,.1f} MB in {stats['seconds']:.1f} s "
          f"({stats['mb_per_s']:.2f} MB/s)")


def cmd_pretrain(args: argparse.Namespace) -> None:
    """Pretrain an encoder from prepared shards, from scratch or from a checkpoint (--init-from); resumable; DDP
    under torchrun."""
    check_out_folder(args.out, args.overwrite, args.resume, RESUMABLE, [args.init_from] if args.init_from else [])
    from encoderlab.train.config import load_recipe  # torch: loaded to run, not for --help
    from encoderlab.train.pretrain import pretrain

    cfg = load_recipe(args.config, (args.set or []) + ([f"init_from={args.init_from}"] if args.init_from else []))
    if args.stop_at is not None and args.stop_at < 1:
        raise InputError(f"--stop-at {args.stop_at}: give a step of 1 or more")
    result = pretrain(cfg, args.out, resume=args.resume, stop_after=args.stop_at, overwrite=args.overwrite)
    if result:
        print(json.dumps(result, indent=2))


# ---- parser ---------------------------------------------------------------------------------------
def add_commands(commands: argparse._SubParsersAction) -> None:
    """Register `tokenizer train`, `prepare` and `pretrain` on the main parser's subparsers."""
    tok = commands.add_parser("tokenizer", help="tokenizer tools", description="Tokenizer tools.")
    tok_commands = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    train = tok_commands.add_parser("train", help="train a vocabulary on raw text", description=cmd_tokenizer_train.__doc__)
    train.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help="text files or folders (.gz too), or a Hub dataset hf:NAME[/CONFIG][:SPLIT]")
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
                           "WikiExtractor output; .gz allowed; or a Hub dataset hf:NAME[/CONFIG][:SPLIT] (its "
                           "text column, one document a row; split default: train)")
    prep.add_argument("--tokenizer", required=True, metavar="DIR",
                      help="tokenizer folder, or a model folder, alias or Hub name (org/name)")
    prep.add_argument("--out", required=True, metavar="DIR", help="output folder for shards and meta.json")
    prep.add_argument("--holdout", type=float, default=0.005, metavar="F",
                      help="fraction (<1) or number (>=1) of whole documents held out for evaluation (default: 0.005)")
    prep.add_argument("--workers", type=int, default=None, metavar="N", help="processes (default: all cores)")
    add_json(prep, "print the statistics as JSON")
    prep.set_defaults(func=cmd_prepare)

    objectives = "; ".join(f"{name}: {what}" for name, what in OBJECTIVE_CARDS.items())
    pre = commands.add_parser("pretrain", help=f"pretrain an encoder: {names_text(PRETRAIN_OBJECTIVES)}",
                              description=f"{cmd_pretrain.__doc__} The recipe's objective is one of {objectives}.",
                              epilog="Multi-process: torchrun --nproc_per_node=N -m encoderlab pretrain ...")
    pre.add_argument("--config", metavar="RECIPE.yaml", help="YAML recipe (see configs/)")
    pre.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a recipe key, e.g. --set max_steps=100 --set model.hidden_dropout=0 (repeatable)")
    pre.add_argument("--init-from", metavar="MODEL", help="continued pretraining: start from this checkpoint "
                                                          "folder or alias (the data prepared with its tokenizer)")
    pre.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder: checkpoints, metrics.csv, curves.png")
    pre.add_argument("--resume", action="store_true", help="continue from RUN_DIR's latest checkpoint")
    add_overwrite(pre)
    pre.add_argument("--stop-at", type=int, metavar="STEP",
                     help="leave at this step with a checkpoint, the schedule left as max_steps sets it (the "
                          "checkpoint is that of a longer run stopped there; --resume continues it)")
    pre.set_defaults(func=cmd_pretrain)
