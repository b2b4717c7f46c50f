"""`encoderlab finetune TASK` and `encoderlab evaluate TASK`: registered on the main parser by add_commands.

Handlers raise encoderlab.errors exceptions for bad input; the main CLI prints them as one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from encoderlab.engine import settings
from encoderlab.errors import ConfigError, InputError

TASKS = ("classify", "ner", "qa", "embed")
MAX_LENGTH = {"classify": 128, "ner": 256, "qa": 384, "embed": 128}
BATCH_SIZE = {"classify": 32, "ner": 32, "qa": 16, "embed": 32}
BILSTM = "bilstm"
DATA_HELP = {
    "classify": "GLUE-style TSV/CSV with a header row (or --no-header), or JSONL",
    "ner": "CoNLL column file (blank line between sentences; IOB1/IOB2/BIOES tags), or JSONL with tokens/tags",
    "qa": "SQuAD v1.1 or v2.0 JSON",
    "embed": "TSV/CSV/JSONL of text pairs (anchor, positive[, negative]) or scored pairs (sentence1, sentence2, score)",
}


# ---- reading data ---------------------------------------------------------------------------------------------
def _split(value: str | None) -> list[str] | None:
    return [part.strip() for part in value.split(",")] if value else None


def read_examples(task: str, path: str, args: argparse.Namespace, info: dict | None = None,
                  regression: bool = False) -> list:
    """The examples of a data file for a task; reader options from args, else from the model's task.json."""
    from encoderlab.tasks import readers

    info = info or {}

    def option(name: str, default: Any = None) -> Any:
        value = getattr(args, name, None)
        return value if value is not None else info.get(name, default)

    if task == "ner":
        return readers.read_conll(path, tag_col=option("tag_col", -1), token_col=option("token_col", 0))
    if task == "qa":
        return readers.read_squad(path)
    header = not getattr(args, "no_header", False) and info.get("header", True)
    text_cols, label_col = _split(option("text_cols")), option("label_col")
    if task == "embed":
        return readers.read_texts(path, text_cols, label_col, regression=True, header=header, need_label=False)
    return readers.read_texts(path, text_cols, label_col, regression=regression, header=header)


def subsample(examples: list, limit: int | None) -> list:
    """At most `limit` examples, drawn with a fixed seed (independent of --seed) and kept in file order."""
    if not limit or limit >= len(examples):
        return examples
    keep = sorted(random.Random(0).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def reader_info(args: argparse.Namespace) -> dict[str, Any]:
    """The reader options to record in task.json."""
    names = ("text_cols", "label_col", "tag_col", "token_col")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None} | {
        "header": not getattr(args, "no_header", False)}


# ---- building tasks and models ------------------------------------------------------------------------------
def build_task(name: str, args: argparse.Namespace, tokenizer, train: list, max_length: int, batch_size: int):
    """The Task for `name`, its label set learned from the training examples."""
    from encoderlab.tasks.classify import ClassifyTask, label_set
    from encoderlab.tasks.embedding import EmbedTask
    from encoderlab.tasks.qa import QATask
    from encoderlab.tasks.tagging import TagTask, tag_set

    common = {"batch_size": batch_size, "precision": args.precision}
    if name == "classify":
        regression = args.task_type == "regression"
        labels = None if regression else (_split(args.labels) or label_set(train))
        return ClassifyTask(tokenizer, max_length, labels, regression, **common)
    if name == "ner":
        return TagTask(tokenizer, max_length, tag_set(train), **common)
    if name == "qa":
        return QATask(tokenizer, max_length, args.doc_stride, args.max_query_length, args.max_answer_length,
                      args.n_best, allow_null=any(e.is_impossible for e in train), **common)
    loss = args.loss or ("cosent" if all(isinstance(e.label, float) for e in train) else "mnrl")
    return EmbedTask(tokenizer, max_length, loss, args.scale, **common)


def build_model(name: str, args: argparse.Namespace, task, tokenizer):
    """A fresh task model: the backbone from --model (or a BiLSTM), a newly initialised head."""
    from encoderlab.tasks import models

    if args.model == BILSTM:
        if name != "classify":
            raise ConfigError(f"--model {BILSTM} is a text-classification baseline; it cannot do {name}")
        return models.BiLSTMClassifier(tokenizer.vocab_size, task.num_outputs, tokenizer.pad_id,
                                       args.embed_dim, args.lstm_hidden, labels=task.labels, regression=task.regression)
    backbone = models.load_backbone(args.model)
    if backbone.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
                          f"{backbone.config.vocab_size}")
    if name == "classify":
        backbone.config.labels = task.labels
        return models.SequenceClassifier(backbone, task.num_outputs, regression=task.regression)
    if name == "ner":
        backbone.config.labels = task.labels
        return models.TokenClassifier(backbone, len(task.labels))
    backbone.config.labels = None
    if name == "qa":
        return models.SpanExtractor(backbone)
    return models.SentenceEmbedder(backbone, args.pooling)


# ---- finetune ------------------------------------------------------------------------------------------------
def cmd_finetune(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune a model on a task; keep the best checkpoint by the eval metric; print the results."""
    from encoderlab.tasks.objective import TrainOptions
    from encoderlab.tokenizer import Tokenizer
    from encoderlab.train import distributed

    name, out = args.task, Path(args.out)
    _set_threads(args.threads)
    if args.model == BILSTM and args.tokenizer is None:
        args.tokenizer = "minilm"
    batch_size = args.batch_size or BATCH_SIZE[name]
    options = TrainOptions(lr=args.lr or (1e-3 if args.model == BILSTM else 2e-5), weight_decay=args.weight_decay,
                           warmup_ratio=args.warmup_ratio, epochs=args.epochs, batch_size=batch_size,
                           grad_accum=args.grad_accum, seed=args.seed,
                           precision=args.precision, eval_every=args.eval_every, save_every=args.save_every,
                           progress=not args.no_progress)
    options.validate()
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: expected a positive number")
    tokenizer = Tokenizer.from_pretrained(args.tokenizer or args.model)
    regression = getattr(args, "task_type", None) == "regression"
    train = subsample(read_examples(name, args.train, args, regression=regression), args.max_train)
    evaluation = None
    if args.eval:
        evaluation = subsample(read_examples(name, args.eval, args, regression=regression), args.max_eval)
    task = build_task(name, args, tokenizer, train, args.max_length or MAX_LENGTH[name], batch_size)
    _check_metric(args.metric, task, evaluation)
    features = task.features(train)
    if evaluation is not None:
        task.validate(evaluation)  # an unknown label in the eval file fails now, not after the first epoch
    seeds = [args.seed + k for k in range(args.seeds)]
    runs = [_one_run(name, args, task, tokenizer, features, evaluation, options, seed,
                     out if len(seeds) == 1 else out / f"seed-{seed}", len(train)) for seed in seeds]
    summary = runs[0] if len(runs) == 1 else _summarize(runs, out)
    if distributed.is_main_process():
        _print_summary(summary, args.json)
    distributed.teardown()
    return summary


def _device(name: str | None):
    """--device, or CUDA when there is one, else the CPU; under torchrun, this rank's device."""
    import torch

    from encoderlab.train import distributed

    if distributed.world_size() > 1:
        return distributed.setup(name or "auto").device

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"--device {name!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return device


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads {threads}: expected a positive number")
        import torch

        torch.set_num_threads(threads)


def _check_metric(metric: str | None, task, evaluation: list | None) -> None:
    """--metric must be one the task reports (and needs an eval set)."""
    if metric is None:
        return
    if evaluation is None:
        raise ConfigError("--metric needs --eval: the best checkpoint is chosen on the eval set")
    allowed = task.metrics + (("recall_at_1", "mrr") if task.name == "embed" else ())
    if metric not in allowed:
        raise ConfigError(f"--metric {metric!r}: {task.name} reports {', '.join(allowed)}")


def _one_run(name: str, args: argparse.Namespace, task, tokenizer, features: list, evaluation: list | None,
             options, seed: int, out: Path, num_train: int) -> dict[str, Any]:
    """Train one seed into `out`; returns what training.json records."""
    from dataclasses import asdict, replace

    from encoderlab.io import atomic_write_text
    from encoderlab.tasks.models import save_task_model
    from encoderlab.tasks.objective import train
    from encoderlab.train import distributed
    from encoderlab.train.state import seed_everything

    seed_everything(seed)
    model = build_model(name, args, task, tokenizer).to(_device(args.device))
    options = replace(options, seed=seed)
    info = task.info() | reader_info(args) | ({"pooling": args.pooling} if name == "embed" else {})
    record: dict[str, Any] = {"task": name, "model": args.model, "train": args.train, "eval": args.eval,
                              "train_examples": num_train, "train_features": len(features),
                              "eval_examples": len(evaluation) if evaluation else 0,
                              "options": asdict(options), "info": info}

    def write_log(result) -> None:
        atomic_write_text(out / "training.json", json.dumps(record | result.as_dict(), indent=2) + "\n")

    result = train(model, task, features, options,
                   evaluate=(lambda m: task.evaluate(m, evaluation)) if evaluation else None, metric=args.metric,
                   save=lambda m: save_task_model(m, out, tokenizer, info), on_eval=write_log,
                   run_dir=out, resume=args.resume)
    if distributed.is_main_process():
        write_log(result)
    return record | result.as_dict() | {"out": str(out)}


def _summarize(runs: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Median, min, max and standard deviation of each best eval metric over the seeds; written to seeds.json."""
    from encoderlab.io import atomic_write_text
    from encoderlab.train.distributed import is_main_process

    keys = [k for k in (runs[0].get("best") or {}) if k.startswith("eval_")]
    spread = {}
    for key in keys:
        values = [run["best"][key] for run in runs]
        spread[key] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                       "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}
    summary = {"task": runs[0]["task"], "seeds": [run["options"]["seed"] for run in runs], "metrics": spread,
               "runs": [{"seed": run["options"]["seed"], "out": run["out"], "best": run["best"]} for run in runs]}
    if is_main_process():
        atomic_write_text(out / "seeds.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    if "metrics" in summary:  # several seeds
        print(f"{summary['task']}: {len(summary['seeds'])} seeds {summary['seeds']}")
        for key, s in summary["metrics"].items():
            print(f"  {key[5:]:<12} median {s['median']:.4f}  min {s['min']:.4f}  max {s['max']:.4f}  "
                  f"std {s['std']:.4f}")
        return
    best = summary.get("best")
    print(f"wrote {summary['out']}: {summary['task']}, {summary['steps']} steps in {summary['seconds']:.0f} s")
    if best:
        shown = ", ".join(f"{k[5:]} {v:.4f}" for k, v in best.items() if k.startswith("eval_"))
        print(f"best at epoch {best['epoch']:g} (by {summary['metric']}): {shown}")


# ---- evaluate ------------------------------------------------------------------------------------------------
def task_for_model(name: str, model, info: dict, tokenizer, args: argparse.Namespace):
    """The Task that scores a loaded model, refusing a model without the head the task needs."""
    from encoderlab.tasks import models
    from encoderlab.tasks.classify import ClassifyTask
    from encoderlab.tasks.embedding import EmbedTask
    from encoderlab.tasks.qa import QATask
    from encoderlab.tasks.tagging import TagTask

    needs = {"classify": (models.SequenceClassifier, models.BiLSTMClassifier), "ner": (models.TokenClassifier,),
             "qa": (models.SpanExtractor,), "embed": (models.TaskModel,)}[name]
    if not isinstance(model, needs):
        raise InputError(f"{args.model}: a {type(model).__name__} cannot be evaluated on {name} "
                         f"(expected {' or '.join(c.__name__ for c in needs)})")
    given = settings(args.model)  # the folder's window and QA decoding, as every pipeline reads them
    max_length = args.max_length or given.max_length or MAX_LENGTH[name]
    common = {"batch_size": args.batch_size or BATCH_SIZE[name], "precision": args.precision}
    if name == "classify":
        labels = None if model.regression else model.labels or _numbered(model)
        return ClassifyTask(tokenizer, max_length, labels, model.regression, **common)
    if name == "ner":
        return TagTask(tokenizer, max_length, model.labels or _numbered(model), **common)
    if name == "qa":
        return QATask(tokenizer, max_length, given.doc_stride, given.max_query_length, given.max_answer_length,
                      given.n_best, given.allow_null, **common)
    return EmbedTask(tokenizer, max_length, info.get("loss") or "cosent", **common)


def _numbered(model) -> list[str]:
    """Class names "0", "1", ... for a head saved without id2label."""
    count = model.num_outputs if hasattr(model, "num_outputs") else model.classifier.out_features
    return [str(i) for i in range(count)]


def cmd_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Score a fine-tuned model on a labelled data file; print the metrics."""
    from encoderlab.tasks import models
    from encoderlab.tokenizer import Tokenizer

    _set_threads(args.threads)
    model = models.load_task_model(args.model)
    if args.task == "embed" and not isinstance(model, models.SentenceEmbedder) and isinstance(model, models.TaskModel):
        model = models.SentenceEmbedder(model.backbone, args.pooling or "mean")  # the encoder under any head
    elif isinstance(model, models.SentenceEmbedder) and args.pooling:
        model.pooling = args.pooling
    model = model.to(_device(args.device))
    info = models.read_task_info(args.model)
    tokenizer = Tokenizer.from_pretrained(args.model)
    task = task_for_model(args.task, model, info, tokenizer, args)
    regression = args.task == "classify" and model.regression
    examples = subsample(read_examples(args.task, args.data, args, info, regression), args.max_eval)
    task.validate(examples)  # a label or tag the model does not know is an error, not a silent miss
    if args.task == "embed" and not all(isinstance(e.label, float) for e in examples):
        predictions, metrics = None, task.retrieval(model, examples)  # unscored pairs: retrieval
    else:
        predictions = task.predict(model, examples)
        metrics = task.score(examples, predictions)
    if args.predictions and predictions is not None:
        _write_predictions(Path(args.predictions), args.task, examples, predictions)
    result = {"task": args.task, "model": args.model, "data": args.data, "examples": len(examples), "metrics": metrics}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.task} on {args.data} ({len(examples)} examples): "
              + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return result


def _write_predictions(path: Path, task: str, examples: list, predictions: list) -> None:
    """SQuAD's {id: answer} for qa; one JSON value per line (label, score or tag list) otherwise."""
    from encoderlab.io import atomic_write_text

    if task == "qa":
        text = json.dumps({e.id: p for e, p in zip(examples, predictions)}, indent=2) + "\n"
    else:
        text = "".join(json.dumps(p) + "\n" for p in predictions)
    atomic_write_text(path, text)


# ---- parser --------------------------------------------------------------------------------------------------
def _reader_options(parser: argparse.ArgumentParser, task: str | None) -> None:
    """Options that say how to read a data file (task None: all of them, for evaluate)."""
    if task in (None, "classify", "embed"):
        parser.add_argument("--text-cols", metavar="A[,B]",
                            help="text column(s) by header name or 0-based index (default: detected from names such "
                                 "as sentence, sentence1/sentence2, question/sentence, premise/hypothesis)")
        parser.add_argument("--label-col", metavar="COL",
                            help="label (or score) column by name or index (default: label, score, gold_label, ...)")
        parser.add_argument("--no-header", action="store_true",
                            help="the table has no header row: name columns by index")
    if task in (None, "ner"):
        parser.add_argument("--tag-col", type=int, default=None, metavar="I",
                            help="column of the tags in a CoNLL file (default: -1, the last)")
        parser.add_argument("--token-col", type=int, default=None, metavar="I",
                            help="column of the words in a CoNLL file (default: 0)")


def _training_options(parser: argparse.ArgumentParser, task: str) -> None:
    """The recipe: optimizer, schedule, epochs, batch, seeds, precision."""
    parser.add_argument("--lr", type=float, default=None, metavar="LR",
                        help="peak learning rate (default: 2e-5; 1e-3 for --model bilstm)")
    parser.add_argument("--weight-decay", type=float, default=0.01, metavar="WD",
                        help="AdamW weight decay, not on biases and LayerNorm (default: 0.01)")
    parser.add_argument("--warmup-ratio", type=float, default=0.1, metavar="F",
                        help="fraction of steps of linear warmup before the linear decay to 0 (default: 0.1)")
    parser.add_argument("--epochs", type=float, default=3.0, metavar="E",
                        help="passes over the training data; fractions allowed (default: 3)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help=f"examples per step (default: {BATCH_SIZE[task]})")
    parser.add_argument("--max-length", type=int, default=None, metavar="T",
                        help=f"tokens per input; longer ones are truncated (default: {MAX_LENGTH[task]})")
    parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
    parser.add_argument("--seeds", type=int, default=1, metavar="K",
                        help="train K runs with seeds S, S+1, ... into OUT/seed-S and report the median and spread "
                             "of the best eval metrics (default: 1)")
    parser.add_argument("--grad-accum", type=int, default=1, metavar="K",
                        help="split each step's batch into K micro-batches (per rank): the same step in less "
                             "memory (default: 1)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="fp32, or bf16 autocast for the forward pass (default: fp32)")
    parser.add_argument("--metric", default=None, metavar="NAME",
                        help="eval metric that selects the best checkpoint (default: accuracy for classes, "
                             "spearman for scores, f1 for ner and qa)")
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="also evaluate (and keep the best) every N steps (default: only after each epoch)")
    parser.add_argument("--save-every", type=int, default=0, metavar="N",
                        help="save the resumable training state (OUT/checkpoints) every N steps as well as after "
                             "each epoch; Ctrl-C saves it too (default: after each epoch)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/checkpoints to the result an uninterrupted run gives")
    parser.add_argument("--max-train", type=int, default=None, metavar="N",
                        help="train on a fixed random subset of N examples (default: all)")
    parser.add_argument("--max-eval", type=int, default=None, metavar="N",
                        help="evaluate on a fixed random subset of N examples (default: all)")
    parser.add_argument("--device", default=None, metavar="D", help="cpu, cuda or cuda:N (default: cuda if present)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch (default: torch's choice; 1 is fastest on a busy machine)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def _task_options(parser: argparse.ArgumentParser, task: str) -> None:
    """Options of one task."""
    if task == "classify":
        parser.add_argument("--task-type", choices=("classification", "regression"), default="classification",
                            help="classes (cross-entropy) or a score (MSE, e.g. STS-B) (default: classification)")
        parser.add_argument("--labels", metavar="A,B,...",
                            help="class names in id order (default: those of the training file, numeric or sorted)")
        parser.add_argument("--tokenizer", metavar="T",
                            help="tokenizer folder or alias (default: the model's; minilm for --model bilstm)")
        parser.add_argument("--embed-dim", type=int, default=300, metavar="N",
                            help="BiLSTM baseline: embedding width (default: 300)")
        parser.add_argument("--lstm-hidden", type=int, default=256, metavar="N",
                            help="BiLSTM baseline: hidden width per direction (default: 256)")
    else:
        parser.set_defaults(tokenizer=None)
    if task == "qa":
        parser.add_argument("--doc-stride", type=int, default=128, metavar="N",
                            help="tokens shared by neighbouring windows of a long context (default: 128)")
        parser.add_argument("--max-query-length", type=int, default=64, metavar="N",
                            help="questions are cut to N tokens (default: 64)")
        parser.add_argument("--max-answer-length", type=int, default=30, metavar="N",
                            help="longest answer considered, in tokens (default: 30)")
        parser.add_argument("--n-best", type=int, default=20, metavar="N",
                            help="start and end candidates per window in decoding (default: 20)")
    if task == "embed":
        parser.add_argument("--pooling", choices=("mean", "cls"), default="mean",
                            help="token vectors -> sentence vector (default: mean)")
        parser.add_argument("--loss", choices=("mnrl", "cosent", "cosine"), default=None,
                            help="mnrl (in-batch negatives, for pairs), cosent or cosine (for scored pairs) "
                                 "(default: cosent when every pair has a score, else mnrl)")
        parser.add_argument("--scale", type=float, default=20.0, metavar="S",
                            help="similarity scale of mnrl and cosent (default: 20)")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `finetune` (with one sub-command per task) and `evaluate` on the main parser's subparsers."""
    finetune = subparsers.add_parser("finetune", help="fine-tune on classify, ner, qa or embed",
                                     description="Fine-tune an encoder (or the BiLSTM baseline) on a task.")
    tasks = finetune.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in TASKS:
        sub = tasks.add_parser(task, help=DATA_HELP[task],
                               description=f"{cmd_finetune.__doc__} Data: {DATA_HELP[task]}.")
        sub.add_argument("--model", required=True, metavar="M",
                         help="checkpoint folder or alias ('minilm')" + (", or 'bilstm' for the baseline trained "
                                                                          "from scratch" if task == "classify" else ""))
        sub.add_argument("--train", required=True, metavar="FILE", help=f"training data: {DATA_HELP[task]}")
        sub.add_argument("--eval", metavar="FILE", help="eval data in the same format: scored after each epoch")
        sub.add_argument("--out", required=True, metavar="DIR",
                         help="folder for the best checkpoint (Hugging Face layout), task.json, training.json and "
                              "checkpoints/ (the training state --resume continues from)")
        _reader_options(sub, task)
        _task_options(sub, task)
        _training_options(sub, task)
        sub.set_defaults(func=cmd_finetune)

    evaluate = subparsers.add_parser("evaluate", help="score a fine-tuned model on labelled data",
                                     description=cmd_evaluate.__doc__)
    evaluate.add_argument("task", choices=TASKS, help="the task the data is for")
    evaluate.add_argument("--model", required=True, metavar="DIR",
                          help="fine-tuned folder (for embed: any checkpoint or alias)")
    evaluate.add_argument("--data", required=True, metavar="FILE", help="labelled data in the task's format")
    _reader_options(evaluate, None)
    evaluate.add_argument("--pooling", choices=("mean", "cls"), default=None,
                          help="embed: pooling (default: the model's, else mean)")
    evaluate.add_argument("--batch-size", type=int, default=None, metavar="N", help="inputs per forward pass")
    evaluate.add_argument("--max-length", type=int, default=None, metavar="T",
                          help="tokens per input (default: what the model was trained with)")
    evaluate.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="fp32 or bf16 autocast")
    evaluate.add_argument("--max-eval", type=int, default=None, metavar="N",
                          help="score a fixed random subset of N examples (default: all)")
    evaluate.add_argument("--predictions", metavar="FILE",
                          help="also write the predictions (qa: SQuAD's {id: answer} JSON; else one JSON value a line)")
    evaluate.add_argument("--device", default=None, metavar="D", help="cpu, cuda or cuda:N (default: cuda if present)")
    evaluate.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.set_defaults(func=cmd_evaluate)
