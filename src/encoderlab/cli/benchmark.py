"""`encoderlab benchmark SUITE`: a model scored on GLUE, CoNLL-2003, SQuAD, STS-B or IMDB (tasks.benchmark), or an
embedder on every BEIR set of a folder (`benchmark beir`, retrieval.beir)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from encoderlab.choices import BENCHMARK_QUICK as QUICK
from encoderlab.choices import SEARCH_MODES, split_names
from encoderlab.cli.finetune import given
from encoderlab.cli.options import (DEVICE, PROGRESS, add_inference_options, add_json, add_model, add_options,
                                    add_overwrite, add_precision, add_threads, apply_threads, load_pipeline,
                                    resolve_device)
from encoderlab.cli.retrieval import add_fusion_options, fusion_options
from encoderlab.errors import InputError
from encoderlab.io import check_out_folder

LAYOUTS = {
    "glue": "the GLUE folder layout: CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/, RTE/, WNLI/, each with "
            "train.tsv and dev.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv) in the task's official format; "
            "absent tasks are skipped and listed",
    "conll": "CoNLL-2003: train.txt, valid.txt and test.txt (or eng.train, eng.testa, eng.testb); entity F1",
    "squad": "SQuAD: train-v1.1.json and dev-v1.1.json, train-v2.0.json and dev-v2.0.json, or train.json and "
             "dev.json; F1 and exact match",
    "sts": "STS-B: GLUE's train.tsv and dev.tsv, or the SemEval STS benchmark's sts-train.csv, sts-dev.csv and "
           "sts-test.csv; Pearson and Spearman",
    "imdb": "IMDB: aclImdb's train/ and test/ folders (pos/, neg/, one review per .txt file), or train.tsv and "
            "test.tsv with text and label columns; accuracy",
}
HUB_EXAMPLES = {"glue": "hf:nyu-mll/glue", "conll": "a Parquet CoNLL-2003 with tokens and ner_tags",
                "squad": "hf:rajpurkar/squad", "sts": "hf:sentence-transformers/stsb", "imdb": "hf:stanfordnlp/imdb"}
RECIPE = ("Default recipe, the BERT paper's (Devlin et al. 2019, section 4.1 and appendix A.3): batch 32, max length "
          "128, 3 epochs, AdamW lr 2e-5 (from its grid 5e-5/3e-5/2e-5) with 10% linear warmup and weight decay "
          "0.01, the best epoch on the first eval split kept; CoNLL-2003 and SQuAD take lr 5e-5 and lengths 256 and "
          "384 (section 4.2; SQuAD v2.0: 2 epochs, batch 48). Every figure is the median over the seeds, with the "
          "spread; OUT gets results.md and results.json. A rerun skips finished tasks and resumes an interrupted one.")


def cmd_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune and score a model on every task of a suite; print the table."""
    resolve_device(args.device)  # a CUDA device this machine lacks: refused before any data is read
    apply_threads(args.threads)
    from encoderlab.tasks.benchmark import BenchJob, benchmark, markdown

    job = BenchJob(**given(args, BenchJob), progress=not args.no_progress, machine=machine_line(),
                   command_line=shlex.join(["encoderlab", *args.argv]))
    summary = benchmark(job)
    # The table, without the commands' list that results.md ends with.
    print(json.dumps(summary, indent=2) if args.json else markdown(summary).split("\n## Commands")[0].rstrip())
    return summary


def machine_line() -> str:
    """The CPU, its count, torch's threads and the GPU if any: what a result records it ran on."""
    import torch

    from encoderlab.compare import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads" + (
        f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "")


def beir_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a set's figures depend on, checked before torch loads: a finished set is reused only under the same."""
    modes = args.modes or list(SEARCH_MODES)
    unknown = [m for m in modes if m not in SEARCH_MODES]
    if unknown or not modes:
        raise InputError(f"--modes {','.join(modes)}: expected some of {','.join(SEARCH_MODES)}")
    return {"model": args.model, "split": args.split, "modes": modes, "max_length": args.max_length} | \
        fusion_options(args)


def cmd_benchmark_beir(args: argparse.Namespace) -> dict[str, Any]:
    """Score an embedder on every BEIR set under --data (dense, BM25, hybrid); print the table with the means."""
    from encoderlab.retrieval import beir  # torch: after the parser, as every command's model code

    settings = beir_settings(args)
    sets = beir.find_sets(args.data, args.split)
    own = [*beir.SUMMARY, beir.RESULT, *{name.split("/")[0] for name in sets}]
    check_out_folder(args.out, args.overwrite, own=own, inputs=[args.data])
    beir.check_sets(sets)  # every set read once: a bad line is refused before the model loads
    embedder = load_pipeline("embed", args)
    out = Path(args.out)
    if args.overwrite and out.is_dir():
        shutil.rmtree(out)
    search = fusion_options(args)
    results = beir.run_sets(sets, out, settings, lambda files: beir.score_set(
        args.model, embedder, files, settings["modes"], search, not args.no_progress), redo=False)
    header = {"suite": "beir", "data": str(args.data), "command": shlex.join(["encoderlab", *args.argv]),
              "machine": machine_line()}
    summary = beir.summarise(results, settings, out, header)
    print(json.dumps(summary, indent=2) if args.json else beir.table(summary))
    return summary


def add_beir(suites: argparse._SubParsersAction) -> None:
    """`benchmark beir`: its own options (an embedder indexed per set, nothing fine-tuned)."""
    sub = suites.add_parser("beir", help="every BEIR set of a folder: dense, BM25 and hybrid retrieval",
                            description=f"{cmd_benchmark_beir.__doc__} Each set is indexed on the fly and scored as "
                            "`evaluate retrieval` scores it: nDCG@10, MRR@10, Recall@100 per set and mode, and their "
                            "mean over the sets. OUT gets SET/result.json per set, results.json and results.md; a "
                            "rerun with the same settings skips finished sets. See docs/retrieval.md.")
    add_model(sub, help="the embedder (a checkpoint folder, minilm, or a Hub name)")
    sub.add_argument("--data", required=True, metavar="DIR", help="a BEIR set (corpus.jsonl, queries.jsonl, "
                     "qrels/SPLIT.tsv) or a folder of them, at any depth")
    sub.add_argument("--out", required=True, metavar="DIR", help="folder for OUT/SET/result.json, OUT/results.json "
                     "and OUT/results.md")
    add_options(sub, (
        ("--modes", split_names, None, "A,B", f"retrieval modes, some of {','.join(SEARCH_MODES)} (default: all)"),
        ("--split", None, "test", "NAME", "the qrels file, qrels/NAME.tsv (default: test)"),
        PROGRESS))
    add_fusion_options(sub)
    add_overwrite(sub)
    add_inference_options(sub)
    add_json(sub, "print the results as JSON")
    sub.set_defaults(func=cmd_benchmark_beir)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `benchmark` with one sub-command per suite."""
    parser = subparsers.add_parser("benchmark", help="score a model on GLUE, CoNLL-2003, SQuAD, STS-B, IMDB or BEIR",
                                   description="Fine-tune and score a model on a standard suite. " + RECIPE)
    suites = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for suite, layout in LAYOUTS.items():
        sub = suites.add_parser(suite, help=layout.split(":")[0], description=f"{cmd_benchmark.__doc__} "
                                f"--data: {layout}. {RECIPE}")
        add_model(sub)
        sub.add_argument("--data", required=True, metavar="DIR", help=f"{layout}; or a Hub dataset hf:NAME[/CONFIG] "
                         f"(e.g. {HUB_EXAMPLES[suite]}), each task reading its own splits")
        sub.add_argument("--out", required=True, metavar="DIR", help="folder for OUT/TASK/seed-S (model, "
                         "training.json, result.json), OUT/TASK/result.json, OUT/results.md and OUT/results.json")
        add_options(sub, (
            ("--tasks", split_names, None, "A,B", "only these tasks, by name (default: all that are there; an "
             "unknown name is refused with the list)"),
            ("--seeds", int, 1, "K", "runs with seeds S, S+1, ...: each figure is their median (default: 1)"),
            ("--seed", int, 42, "S", "first seed (default: 42)"),
            ("--lr", float, None, "LR", "peak learning rate (default: 2e-5; CoNLL, SQuAD: 5e-5)"),
            ("--epochs", float, None, "E", "passes over the training data (default: 3; --quick: 1)"),
            ("--batch-size", int, None, "N", "examples per step (default: 32)"),
            ("--max-length", int, None, "T", "tokens per input (default: 128; CoNLL 256, SQuAD 384)"),
            ("--max-train", int, None, "N", "train on a fixed random subset of N examples (default: all)"),
            ("--max-eval", int, None, "N", "score a fixed random subset of N examples (default: all)"),
            ("--quick", bool, None, None, f"a smoke run: {QUICK['max_train']} training and {QUICK['max_eval']} "
             "eval examples, one epoch"),
            ("--keep-state", argparse.BooleanOptionalAction, False, None, "keep each run's OUT/TASK/seed-S/"
             "checkpoints (resumable optimizer state, about 3x the model) once it has finished (default: drop)"),
            ("--plot", bool, None, None, "also draw OUT/spread.png: each seed's figure (needs matplotlib)"), DEVICE))
        add_precision(sub, training=True)
        add_threads(sub)
        add_options(sub, (PROGRESS,))
        add_json(sub, "print the results as JSON")
        sub.set_defaults(func=cmd_benchmark)
    add_beir(suites)
