"""`encoderlab finetune TASK` and `encoderlab evaluate TASK`: options turned into encoderlab.tasks.finetune's jobs."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from encoderlab.cards import Card, card, given as options_of, trainable
from encoderlab.choices import BILSTM, names_text
from encoderlab.cli import retrieval
from encoderlab.cli.options import (DEVICE, PROGRESS, MODEL_HELP, add_fields, add_json, add_model, add_options,
                                    add_overwrite, add_precision, add_threads, add_window_options, apply_threads)
from encoderlab.errors import InputError
from encoderlab.io import RESUMABLE, check_out_folder, count_text, number_text

if TYPE_CHECKING:
    from encoderlab.tasks.finetune import FinetuneJob, Reading

# ---- options -> jobs ------------------------------------------------------------------------------------------
def given(args: argparse.Namespace, job: type) -> dict[str, Any]:
    """The fields of a job dataclass that this command line has options for (a task's parser has only its own)."""
    return {f.name: getattr(args, f.name) for f in fields(job) if hasattr(args, f.name)}


def reading(args: argparse.Namespace) -> Reading:
    """The reader options of a finetune or evaluate command line."""
    from encoderlab.tasks.finetune import Reading

    return Reading(**given(args, Reading), header=not getattr(args, "no_header", False))


def finetuning(args: argparse.Namespace) -> FinetuneJob:
    """The FinetuneJob a `finetune TASK` command line asks for."""
    from encoderlab.tasks.finetune import FinetuneJob
    from encoderlab.tasks.objective import TrainOptions

    defaults = {"lr": args.lr or (1e-3 if args.model == BILSTM else 2e-5),
                "batch_size": args.batch_size or card(args.task).batch_size, "progress": not args.no_progress}
    options = TrainOptions(**given(args, TrainOptions) | defaults)
    head = options_of(card(args.task).options, vars(args))  # the task's own options, from its card's fields
    return FinetuneJob(**given(args, FinetuneJob), options=options, reading=reading(args), head=head)


# ---- the commands ---------------------------------------------------------------------------------------------
def cmd_finetune(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune a model on a task; keep the best checkpoint by the eval metric; print the results."""
    check_out_folder(args.out, args.overwrite, args.resume, RESUMABLE, [args.model])
    apply_threads(args.threads)
    from encoderlab.tasks.finetune import finetune
    from encoderlab.train import distributed

    summary = finetune(finetuning(args))
    if distributed.is_main_process():
        _print_summary(summary, args.json)
    distributed.teardown()
    return summary


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    if "metrics" in summary:  # several seeds
        print(f"{summary['task']}: {count_text(len(summary['seeds']), 'seed')} {summary['seeds']}{_f1_of(summary)}")
        for key, s in summary["metrics"].items():
            print(f"  {key[5:]:<12} median {number_text(s['median'])}  min {number_text(s['min'])}  "
                  f"max {number_text(s['max'])}  std {s['std']:.4f}")
        return
    best = summary.get("best")
    print(f"wrote {summary['out']}: {summary['task']}, {count_text(summary['steps'], 'step')} in "
          f"{summary['seconds']:.0f} s")
    if best:
        shown = ", ".join(f"{k[5:]} {number_text(v)}" for k, v in best.items() if k.startswith("eval_"))
        print(f"best at epoch {best['epoch']:g} (by {summary['metric']}): {shown}{_f1_of(summary)}")


def _f1_of(result: dict[str, Any]) -> str:
    """" (f1 of class '1')" where a result says which class its binary F1 is for."""
    return f" (f1 of {result['f1_of']})" if "f1_of" in result else ""


def cmd_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Score a fine-tuned model on a labelled data file (or an index on a BEIR folder); print the metrics."""
    if args.task == "retrieval":
        return retrieval.cmd_evaluate_retrieval(args)
    if args.model is None:
        raise InputError(f"evaluate {args.task} needs --model DIR (the fine-tuned folder to score)")
    apply_threads(args.threads)
    from encoderlab.tasks.finetune import EvaluateJob, evaluate

    result = evaluate(EvaluateJob(**given(args, EvaluateJob), reading=reading(args)))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.task} on {args.data} ({count_text(result['examples'], 'example')}): "
              + ", ".join(f"{k} {number_text(v)}" for k, v in result["metrics"].items()) + _f1_of(result))
    return result


# ---- parser --------------------------------------------------------------------------------------------------
KEEP_STATE = ("--keep-state", argparse.BooleanOptionalAction, True, None, "keep OUT/checkpoints, the resumable "
              "optimizer state (about 3x the model), once the run has finished (default: keep)")


def _reader_options(parser: argparse.ArgumentParser, reads: str | None) -> None:
    """Options that say how to read a data file of the reader `reads` (None: all of them, for evaluate)."""
    if reads in (None, "table"):
        add_options(parser, (
            ("--text-cols", None, None, "A[,B]", "text column(s) by header name or 0-based index (default: detected "
             "from names such as sentence, sentence1/sentence2, question/sentence, premise/hypothesis)"),
            ("--label-col", None, None, "COL",
             "label (or score) column by name or index (default: label, score, gold_label, ...)"),
            ("--no-header", bool, None, None, "the table has no header row: name columns by index")))
    if reads in (None, "conll"):
        add_options(parser, (
            ("--tag-col", int, None, "I", "column of the tags in a CoNLL file (default: -1, the last)"),
            ("--token-col", int, None, "I", "column of the words in a CoNLL file (default: 0)")))


def _training_options(parser: argparse.ArgumentParser, task: Card) -> None:
    """The recipe: optimizer, schedule, epochs, batch, seeds, precision."""
    add_options(parser, (
        ("--lr", float, None, "LR", "peak learning rate (default: 2e-5; 1e-3 for --model bilstm)"),
        ("--weight-decay", float, 0.01, "WD", "AdamW weight decay, not on biases and LayerNorm (default: 0.01)"),
        ("--warmup-ratio", float, 0.1, "F",
         "fraction of steps of linear warmup before the linear decay to 0 (default: 0.1)"),
        ("--epochs", float, 3.0, "E", "passes over the training data; fractions allowed (default: 3)"),
        ("--batch-size", int, None, "N", f"examples per step (default: {task.batch_size})"),
        ("--max-length", int, None, "T", f"tokens per input; longer ones are truncated (default: {task.max_length})"),
        ("--seed", int, 42, "S", "random seed (default: 42)"),
        ("--seeds", int, 1, "K", "train K runs with seeds S, S+1, ... into OUT/seed-S and report the median and "
         "spread of the best eval metrics (default: 1)"),
        ("--grad-accum", int, 1, "K",
         "split each step's batch into K micro-batches (per rank): the same step in less memory (default: 1)")))
    add_precision(parser, training=True)
    add_options(parser, (
        ("--metric", None, None, "NAME", "eval metric that selects the best checkpoint (default: accuracy for "
         "classes, spearman for scores, f1 for ner and qa)"),
        ("--eval-every", int, 0, "N", "also evaluate (and keep the best) every N steps (default: only after each "
         "epoch)"),
        ("--save-every", int, 0, "N", "save the resumable training state (OUT/checkpoints) every N steps as well "
         "as after each epoch; Ctrl-C saves it too (default: after each epoch)"),
        ("--resume", bool, None, None, "continue from OUT/checkpoints to the result an uninterrupted run gives"),
        KEEP_STATE,
        ("--max-train", int, None, "N", "train on a fixed random subset of N examples (default: all)"),
        ("--max-eval", int, None, "N", "evaluate on a fixed random subset of N examples (default: all)"), DEVICE))
    add_overwrite(parser)
    add_threads(parser)
    add_options(parser, (PROGRESS,))
    add_json(parser, "print the results as JSON")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `finetune` (with one sub-command per task) and `evaluate` on the main parser's subparsers."""
    names = [task.name for task in trainable()]
    finetune = subparsers.add_parser("finetune", help=f"fine-tune on {names_text(names)}",
                                     description="Fine-tune an encoder (or the BiLSTM baseline) on a task.")
    tasks = finetune.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in trainable():
        sub = tasks.add_parser(task.name, help=task.data, description=f"{cmd_finetune.__doc__} Data: {task.data}.")
        baseline = "embed_dim" in {f.name for f in fields(task.options)}  # the BiLSTM's widths: it trains one
        bilstm = ", or 'bilstm' for the baseline trained from scratch" if baseline else ""
        add_model(sub, MODEL_HELP + bilstm)
        sub.add_argument("--tokenizer", default=None, metavar="T",
                         help="tokenizer folder or alias (default: the model's; minilm for --model bilstm)")
        sub.add_argument("--train", required=True, metavar="FILE", help=f"training data: {task.data}; or a Hub "
                         f"dataset hf:NAME[/CONFIG][:SPLIT] (split default: train)")
        sub.add_argument("--eval", metavar="FILE", help="eval data in the same format, or hf:NAME[/CONFIG][:SPLIT] "
                         "(split default: validation): scored after each epoch")
        sub.add_argument("--out", required=True, metavar="DIR",
                         help="folder for the best checkpoint (Hugging Face layout), task.json, training.json and "
                              "checkpoints/ (the training state --resume continues from)")
        _reader_options(sub, task.reads)
        add_fields(sub, task.options)
        _training_options(sub, task)
        sub.set_defaults(func=cmd_finetune)

    evaluate = subparsers.add_parser("evaluate", help="score a fine-tuned model on labelled data",
                                     description=cmd_evaluate.__doc__)
    evaluate.add_argument("task", choices=(*names, "retrieval"), help="the task the data is for (retrieval: a BEIR "
                          "folder, docs/retrieval.md)")
    evaluate.add_argument("--model", default=None, metavar="DIR", help="fine-tuned folder (for embed: any checkpoint "
                          "or alias; for retrieval: an embedder, indexing --data's corpus on the fly)")
    evaluate.add_argument("--data", required=True, metavar="FILE", help="labelled data in the task's format, or a Hub "
                          "dataset hf:NAME[/CONFIG][:SPLIT] (split default: validation; retrieval: a BEIR folder)")
    _reader_options(evaluate, None)
    add_window_options(evaluate)
    evaluate.add_argument("--pooling", choices=("mean", "cls"), default=None,
                          help="embed: pooling (default: the model's, else mean)")
    add_options(evaluate, (
        ("--batch-size", int, None, "N", "inputs per forward pass"),
        ("--max-length", int, None, "T", "tokens per input (default: what the model was trained with)")))
    add_precision(evaluate, scoring=True)
    add_options(evaluate, (
        ("--max-eval", int, None, "N", "score a fixed random subset of N examples (default: all)"),
        ("--predictions", None, None, "FILE",
         "also write the predictions (qa: SQuAD's {id: answer} JSON; else one JSON value a line)"), DEVICE))
    add_threads(evaluate)
    add_json(evaluate, "print the metrics as JSON")
    retrieval.add_evaluate_options(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)
