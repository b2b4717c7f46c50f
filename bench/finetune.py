"""Fine-tuning quality: MiniLM (all-MiniLM-L6-v2) on SST-2, CoNLL-2003, SQuAD v1.1 and STS-B, plus a BiLSTM baseline.

Every run goes through the same `encoderlab finetune` / `encoderlab evaluate` commands a user types, with the
standard recipe (AdamW lr 2e-5, weight decay 0.01, 10% warmup then linear decay, batch 32 / 16 for QA,
best checkpoint by the eval metric). Scored on:
- SST-2 dev accuracy (MiniLM, and the BiLSTM baseline on the same tokenizer ids);
- CoNLL-2003 valid entity F1 (seqeval);
- SQuAD v1.1: dev-v1.1.part-a.json split by article, deterministically (articles ordered by the SHA-1 of
  their title; the first 80% train, the rest are scored), F1 of the official script;
- STS-B dev Spearman of cosine similarities, before and after fine-tuning with the CoSENT loss.

CPU time is scarce (the machine is shared), so every task takes a training subset and an epoch count:

    python bench/finetune.py --quick                              # tiny subsets, under a minute
    python bench/finetune.py --smoke                              # a tiny random model, synthetic data (make test)
    python bench/finetune.py --tasks stsb --epochs 1              # one task; others keep their last figures
    python bench/finetune.py --tasks sst2 --max-train sst2=20000 --epochs 1 --threads 2

Figures of tasks not run keep their previous values in bench/results/finetune.json, each with the command
that produced it; --quick writes finetune_quick.json instead (--smoke: finetune_smoke.json in a temporary folder).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
from common import goal, results_path, smoke_data, tiny_model, training_precision, write_results  # noqa: E402

from encoderlab.cli.finetune import add_commands  # noqa: E402

DATA = Path(os.environ.get("ENCODERLAB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
TASKS = ("stsb", "sst2", "bilstm", "conll", "squad")
TARGETS = {"sst2": ("SST-2 dev accuracy (MiniLM)", "accuracy", 0.89),
           "conll": ("CoNLL-2003 valid entity F1 (MiniLM)", "f1", 0.87),
           "squad": ("SQuAD v1.1 part-a held-out articles F1 (MiniLM)", "f1", 60.0),
           "stsb": ("STS-B dev Spearman after fine-tuning (MiniLM)", "spearman", 0.86)}
QUICK = {"max_train": {"sst2": 96, "bilstm": 256, "conll": 48, "squad": 16, "stsb": 96},
         "max_eval": {"sst2": 48, "bilstm": 64, "conll": 24, "squad": 8, "stsb": 48}, "epochs": 1.0}
SMOKE = {"max_train": {"*": 16}, "max_eval": {"*": 8}, "epochs": 1.0}


def per_task(value: str | None, cast) -> dict[str, Any]:
    """'N' (every task) or 'task=N,task=N' -> {task: N}; '*' holds the value for every task."""
    if not value:
        return {}
    out = {}
    for part in value.split(","):
        task, _, number = part.rpartition("=")
        out[task or "*"] = cast(number)
    return out


def pick(table: dict[str, Any], task: str) -> Any:
    return table.get(task, table.get("*"))


def cli(*argv: Any) -> dict[str, Any]:
    """Run an `encoderlab` sub-command in-process; returns what its handler returns."""
    parser = argparse.ArgumentParser(prog="encoderlab")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(a) for a in argv if a is not None])
    return args.func(args)


def split_squad(source: Path, folder: Path, train_fraction: float = 0.8) -> tuple[Path, Path, dict[str, int]]:
    """Train/eval files of whole articles, ordered by the SHA-1 of their title (no tuning to the file)."""
    data = json.loads(source.read_text(encoding="utf-8"))
    articles = sorted(data["data"], key=lambda a: hashlib.sha1(a["title"].encode("utf-8")).hexdigest())
    cut = round(train_fraction * len(articles))
    paths, counts = [], {}
    for name, part in (("train", articles[:cut]), ("eval", articles[cut:])):
        path = folder / f"squad-{name}.json"
        path.write_text(json.dumps({"version": data.get("version", "1.1"), "data": part}), encoding="utf-8")
        paths.append(path)
        counts[f"{name}_articles"] = len(part)
        counts[f"{name}_questions"] = sum(len(p["qas"]) for a in part for p in a["paragraphs"])
    return paths[0], paths[1], counts


def finetune(task: str, cli_task: str, train: Path, evaluation: Path, out: Path, opts: argparse.Namespace,
             *extra: Any) -> dict[str, Any]:
    """One `encoderlab finetune` run; the figures it reports."""
    model = "bilstm" if task == "bilstm" else opts.model
    argv = ["finetune", cli_task, "--model", model, "--train", train, "--eval", evaluation, "--out", out / task,
            "--epochs", pick(opts.epochs, task), "--precision", opts.precision, "--seed", opts.seed,
            *([] if opts.progress else ["--no-progress"]), *extra]
    for flag, table in (("--max-train", opts.max_train), ("--max-eval", opts.max_eval),
                        ("--threads", {"*": opts.threads} if opts.threads else {}),
                        ("--eval-every", opts.eval_every), ("--lr", opts.lr)):
        if pick(table, task):
            argv += [flag, pick(table, task)]
    started = time.time()
    summary = cli(*argv)
    figures = {k[5:]: round(v, 4) for k, v in (summary["best"] or {}).items() if k.startswith("eval_")}
    metric = f"eval_{summary['metric']}"
    curve = [[entry["step"], round(entry[metric], 4)] for entry in summary["history"]]
    return figures | {"best_epoch": summary["best"]["epoch"], "train_examples": summary["train_examples"],
                      "selected_by": summary["metric"], "curve": curve,
                      "eval_examples": summary["eval_examples"], "steps": summary["steps"],
                      "epochs": summary["options"]["epochs"], "dtype": opts.precision,
                      "seconds": round(time.time() - started, 1), "command": shown(argv, out)}


def shown(argv: list[Any], work: Path) -> str:
    """The command as typed from the repository root: the temporary folder as $WORK, the data as ../shared/data."""
    text = " ".join(str(a) for a in argv).replace(str(work), "$WORK").replace(str(DATA), "../shared/data")
    return f"encoderlab {text}"


def run_task(task: str, opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Figures of one benchmark task."""
    if task in ("sst2", "bilstm"):
        return finetune(task, "classify", opts.data / "sst2" / "train.tsv", opts.data / "sst2" / "dev.tsv", work, opts)
    if task == "conll":
        return finetune(task, "ner", opts.data / "conll2003" / "train.txt", opts.data / "conll2003" / "valid.txt",
                        work, opts)
    if task == "squad":
        train, evaluation, split = split_squad(opts.data / "squad_v1.1" / "dev-v1.1.part-a.json", work)
        return finetune(task, "qa", train, evaluation, work, opts, "--max-length", opts.qa_max_length,
                        "--doc-stride", opts.qa_doc_stride) | {"split": split}
    dev = opts.data / "stsb" / "dev.tsv"
    before = cli("evaluate", "embed", "--model", opts.model, "--data", dev,
                 *(["--threads", opts.threads] if opts.threads else []),
                 *(["--max-eval", pick(opts.max_eval, task)] if pick(opts.max_eval, task) else []))["metrics"]
    after = finetune(task, "embed", opts.data / "stsb" / "train.tsv", dev, work, opts)
    return after | {"before_spearman": round(before["spearman"], 4), "before_pearson": round(before["pearson"], 4)}


def goals(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """One goal per target; a task never run is listed as not met, with no value."""
    out = []
    for task, (what, key, target) in TARGETS.items():
        if task in figures and key in figures[task]:
            out.append(goal(what, figures[task][key], target))
        else:
            out.append({"what": what, "value": None, "target": target, "met": False, "note": "not run"})
    return out


def parse_args() -> argparse.Namespace:
    parser = common.parser(__doc__, quick="tiny subsets, one epoch: under a minute")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {', '.join(TASKS)}")
    parser.add_argument("--model", default="minilm", help="checkpoint folder or alias (default: minilm)")
    parser.add_argument("--max-train", default=None, help="training examples: N, or task=N,task=N (default: all)")
    parser.add_argument("--max-eval", default=None, help="eval examples: N, or task=N,... (default: all)")
    parser.add_argument("--epochs", default="3", help="epochs: E, or task=E,... (default: 3)")
    parser.add_argument("--eval-every", default=None, help="also evaluate every N steps: N or task=N,...")
    parser.add_argument("--lr", default="squad=5e-5",
                        help="peak learning rate: LR or task=LR,... (default: squad=5e-5, the BERT paper's SQuAD "
                             "recipe, section 4.2; the others take the CLI default, 2e-5; bilstm 1e-3)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default=training_precision(),
                        help="bf16 autocast (~2x faster on CPUs with AVX512-BF16) or fp32 (default: bf16 where the "
                             "CPU has it natively, else fp32)")
    parser.add_argument("--qa-max-length", type=int, default=384, help="SQuAD window length (default: 384)")
    parser.add_argument("--qa-doc-stride", type=int, default=128, help="tokens shared by SQuAD windows (default: 128)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
    parser.add_argument("--progress", action="store_true", help="show the training progress bars")
    parser.add_argument("--as", dest="label", default=None,
                        help="store the figures of the (single) task under this name, e.g. sst2-encoderlab-mini "
                             "for another --model; the goals read only the default names")
    opts = parser.parse_args()
    opts.max_train = per_task(opts.max_train, int)
    opts.max_eval = per_task(opts.max_eval, int)
    opts.epochs = per_task(opts.epochs, float)
    opts.eval_every = per_task(opts.eval_every, int)
    opts.lr = per_task(opts.lr, float)
    if opts.quick or opts.smoke:
        small = SMOKE if opts.smoke else QUICK
        opts.max_train = small["max_train"] | opts.max_train
        opts.max_eval = small["max_eval"] | opts.max_eval
        opts.epochs = {"*": small["epochs"]}
        opts.qa_max_length, opts.qa_doc_stride = min(opts.qa_max_length, 192), min(opts.qa_doc_stride, 64)
    unknown = set(opts.tasks.split(",")) - set(TASKS)
    if unknown:
        parser.error(f"unknown task(s) {sorted(unknown)}; known: {', '.join(TASKS)}")
    if opts.label and "," in opts.tasks:
        parser.error("--as names the figures of a single task")
    return opts


def main() -> None:
    opts = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a line per evaluation
    previous = results_path(opts, "finetune")
    figures = json.loads(previous.read_text())["figures"] if previous.is_file() and common.size(opts) == "full" else {}
    with tempfile.TemporaryDirectory(prefix="encoderlab-bench-") as work:
        opts.data = smoke_data(Path(work) / "data") if opts.smoke else DATA
        if opts.smoke:
            opts.model = str(tiny_model(Path(work) / "tiny"))
        if not opts.data.is_dir():
            raise SystemExit(f"{opts.data}: the shared data folder is absent (set ENCODERLAB_DATA)")
        for task in opts.tasks.split(","):
            print(f"== {task}", file=sys.stderr)
            key = opts.label or task
            figures[key] = run_task(task, opts, Path(work)) | {"model": opts.model}
            print(json.dumps({key: figures[key]}, indent=2))
    figures["torch_threads"] = torch.get_num_threads()
    path = write_results(opts, "finetune", figures, goals(figures))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
