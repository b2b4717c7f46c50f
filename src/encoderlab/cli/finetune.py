"""`encoderlab finetune TASK` and `encoderlab evaluate TASK`: options turned into encoderlab.tasks.finetune's jobs."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from encoderlab.choices import (BATCH_SIZE, BILSTM, CLASSIFY_TYPES, DATA_HELP, DOCUMENT_FLOPS, MAX_LENGTH, QUERY_FLOPS,
                                READS, names_text, split_names)
from encoderlab.choices import FINETUNE_TASKS as TASKS
from encoderlab.cli import retrieval
from encoderlab.cli.options import (DEVICE, MODEL_HELP, add_json, add_model, add_options, add_overwrite, add_precision,
                                    add_threads, add_window_options, apply_threads)
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
    from encoderlab.tasks.finetune import FinetuneJob, Head
    from encoderlab.tasks.objective import TrainOptions

    defaults = {"lr": args.lr or (1e-3 if args.model == BILSTM else 2e-5),
                "batch_size": args.batch_size or BATCH_SIZE[args.task], "progress": not args.no_progress}
    options = TrainOptions(**given(args, TrainOptions) | defaults)
    # The head: defaults for the options its task has none for.
    head = Head(**given(args, Head))
    return FinetuneJob(**given(args, FinetuneJob), options=options, reading=reading(args), head=head)


def dimension_list(text: str) -> tuple[int, ...]:
    """"384,256,128" -> (384, 256, 128); argparse reports a part that is not a whole number."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers separated by commas") from None


# ---- the commands ---------------------------------------------------------------------------------------------
def cmd_finetune(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune a model on a task; keep the best checkpoint by the eval metric; print the results."""
    if getattr(args, "inference_free", False) and args.resume:
        raise InputError("--resume: the training state of an --inference-free run does not hold its query table "
                         "(saved beside each best checkpoint only): start the run again")
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


def _reader_options(parser: argparse.ArgumentParser, task: str | None) -> None:
    """Options that say how to read a data file (task None: all of them, for evaluate)."""
    if task is None or READS[task] == "table":
        add_options(parser, (
            ("--text-cols", None, None, "A[,B]", "text column(s) by header name or 0-based index (default: detected "
             "from names such as sentence, sentence1/sentence2, question/sentence, premise/hypothesis)"),
            ("--label-col", None, None, "COL",
             "label (or score) column by name or index (default: label, score, gold_label, ...)"),
            ("--no-header", bool, None, None, "the table has no header row: name columns by index")))
    if task is None or READS[task] == "conll":
        add_options(parser, (
            ("--tag-col", int, None, "I", "column of the tags in a CoNLL file (default: -1, the last)"),
            ("--token-col", int, None, "I", "column of the words in a CoNLL file (default: 0)")))


def _training_options(parser: argparse.ArgumentParser, task: str) -> None:
    """The recipe: optimizer, schedule, epochs, batch, seeds, precision."""
    add_options(parser, (
        ("--lr", float, None, "LR", "peak learning rate (default: 2e-5; 1e-3 for --model bilstm)"),
        ("--weight-decay", float, 0.01, "WD", "AdamW weight decay, not on biases and LayerNorm (default: 0.01)"),
        ("--warmup-ratio", float, 0.1, "F",
         "fraction of steps of linear warmup before the linear decay to 0 (default: 0.1)"),
        ("--epochs", float, 3.0, "E", "passes over the training data; fractions allowed (default: 3)"),
        ("--batch-size", int, None, "N", f"examples per step (default: {BATCH_SIZE[task]})"),
        ("--max-length", int, None, "T", f"tokens per input; longer ones are truncated (default: {MAX_LENGTH[task]})"),
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
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json(parser, "print the results as JSON")


def _task_options(parser: argparse.ArgumentParser, task: str) -> None:
    """Options of one task."""
    if task == "classify":
        parser.add_argument("--task-type", choices=CLASSIFY_TYPES, default="classification",
                            help="one class (cross-entropy), a score (MSE, e.g. STS-B) or a set of classes per row "
                                 "(multilabel: labels separated by '|', sigmoid and binary cross-entropy) "
                                 "(default: classification)")
        add_options(parser, (
            ("--labels", split_names, None, "A,B,...",
             "class names in id order (default: those of the training file, numeric or sorted)"),
            ("--tokenizer", None, None, "T",
             "tokenizer folder or alias (default: the model's; minilm for --model bilstm)"),
            ("--embed-dim", int, 300, "N", "BiLSTM baseline: embedding width (default: 300)"),
            ("--lstm-hidden", int, 256, "N", "BiLSTM baseline: hidden width per direction (default: 256)")))
        add_window_options(parser, combine="logits", follows="truncate it")
    else:
        parser.set_defaults(tokenizer=None)
    if task == "qa":
        add_options(parser, (
            ("--doc-stride", int, 128, "N", "tokens shared by neighbouring windows of a long context (default: 128)"),
            ("--max-query-length", int, 64, "N", "questions are cut to N tokens (default: 64)"),
            ("--max-answer-length", int, 30, "N", "longest answer considered, in tokens (default: 30)"),
            ("--n-best", int, 20, "N", "start and end candidates per window in decoding (default: 20)")))
    if task == "colbert":
        parser.add_argument("--dim", type=int, default=128, metavar="D",
                            help="dimensions of each token vector, the projection's width (default: 128)")
        parser.add_argument("--teacher", default=None, metavar="DIR", help="also distil from this cross-encoder "
                            "(a `finetune rerank` folder): KL from its scores of each row's positive and negative")
    if task == "splade":
        add_options(parser, (
            ("--query-flops", float, None, "W", f"peak weight of the queries' FLOPS regulariser (default: "
             f"{QUERY_FLOPS:g})"),
            ("--document-flops", float, None, "W", f"peak weight of the documents' FLOPS regulariser (default: "
             f"{DOCUMENT_FLOPS:g})"),
            ("--flops-warmup", int, None, "N", "steps over which the FLOPS weights rise quadratically from 0 "
             "(default: a third of the first epoch's steps)"),
            ("--inference-free", bool, None, None, "queries are a lookup of learned per-token weights (initialised "
             "to the training documents' IDF), documents go through the model: no model pass per query")))
    if task == "embed":
        parser.add_argument("--pooling", choices=("mean", "cls"), default="mean",
                            help="token vectors -> sentence vector (default: mean)")
        parser.add_argument("--loss", choices=("mnrl", "cosent", "cosine"), default=None,
                            help="mnrl (in-batch negatives, for pairs), cosent or cosine (for scored pairs) "
                                 "(default: cosent when every pair has a score, else mnrl)")
        parser.add_argument("--scale", type=float, default=20.0, metavar="S",
                            help="similarity scale of mnrl and cosent (default: 20)")
        parser.add_argument("--matryoshka", type=dimension_list, default=None, metavar="D,D,...",
                            help="Matryoshka embeddings: sum the loss over the vectors cut to their first D "
                                 "dimensions, for each D (e.g. 384,256,128,64, the full width included); then "
                                 "`embed --dimensions D` gives short vectors that keep most of the quality")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `finetune` (with one sub-command per task) and `evaluate` on the main parser's subparsers."""
    finetune = subparsers.add_parser("finetune", help=f"fine-tune on {names_text(TASKS)}",
                                     description="Fine-tune an encoder (or the BiLSTM baseline) on a task.")
    tasks = finetune.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in TASKS:
        sub = tasks.add_parser(task, help=DATA_HELP[task],
                               description=f"{cmd_finetune.__doc__} Data: {DATA_HELP[task]}.")
        bilstm = ", or 'bilstm' for the baseline trained from scratch" if task == "classify" else ""
        add_model(sub, MODEL_HELP + bilstm)
        sub.add_argument("--train", required=True, metavar="FILE", help=f"training data: {DATA_HELP[task]}; or a Hub "
                         f"dataset hf:NAME[/CONFIG][:SPLIT] (split default: train)")
        sub.add_argument("--eval", metavar="FILE", help="eval data in the same format, or hf:NAME[/CONFIG][:SPLIT] "
                         "(split default: validation): scored after each epoch")
        sub.add_argument("--out", required=True, metavar="DIR",
                         help="folder for the best checkpoint (Hugging Face layout), task.json, training.json and "
                              "checkpoints/ (the training state --resume continues from)")
        _reader_options(sub, task)
        _task_options(sub, task)
        _training_options(sub, task)
        sub.set_defaults(func=cmd_finetune)

    evaluate = subparsers.add_parser("evaluate", help="score a fine-tuned model on labelled data",
                                     description=cmd_evaluate.__doc__)
    evaluate.add_argument("task", choices=(*TASKS, "retrieval"), help="the task the data is for (retrieval: a BEIR "
                          "folder, docs/retrieval.md)")
    evaluate.add_argument("--model", default=None, metavar="DIR", help="fine-tuned folder (for embed: any checkpoint "
                          "or alias; for retrieval: an embedder, indexing --data's corpus on the fly)")
    evaluate.add_argument("--data", required=True, metavar="FILE", help="labelled data in the task's format, or a Hub "
                          "dataset hf:NAME[/CONFIG][:SPLIT] (split default: validation; retrieval: a BEIR folder)")
    _reader_options(evaluate, None)
    add_window_options(evaluate, follows="what the model was trained with")
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
