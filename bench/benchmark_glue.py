"""The evaluation harness on GLUE: `encoderlab benchmark glue` scores MiniLM on SST-2 and STS-B (the GLUE tasks in
../shared/data, laid out as a GLUE folder by symlinks) with 3 seeds, and its figures are checked against
`encoderlab finetune` + `encoderlab evaluate` typed by hand with the same recipe and seed.

The recipe is the harness's default, the BERT paper's (Devlin et al. 2019, section 4.1 and appendix A.3: batch 32,
max length 128, 3 epochs, lr 2e-5, 10% warmup). Goals: the harness's SST-2 and STS-B figures equal finetune +
evaluate exactly; the median and spread over 3 seeds are reported.

    python bench/benchmark_glue.py               # full: the whole of SST-2 and STS-B, 3 epochs, 3 seeds (hours on CPU)
    python bench/benchmark_glue.py --quick       # the harness's --quick: 500 train / 500 eval examples, one epoch
    python bench/benchmark_glue.py --smoke       # a tiny random model, synthetic data (make test)
    python bench/benchmark_glue.py --max-train 2000   # full dev sets, 3 epochs, on 2,000 training examples a task
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
from common import encoderlab, smoke_data, tiny_model, write_results  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TASKS = {"SST-2": ("sst2", [], "accuracy"), "STS-B": ("stsb", ["--task-type", "regression"], "pearson")}
SEEDS = 3


def glue_folder(data: Path, folder: Path) -> Path:
    """SST-2/ and STS-B/ of a GLUE folder, as symlinks to data/sst2 and data/stsb."""
    for task, (name, _, _) in TASKS.items():
        (folder / task).mkdir(parents=True, exist_ok=True)
        for split in ("train.tsv", "dev.tsv"):
            (folder / task / split).symlink_to((data / name / split).resolve())
    return folder


# (max train, max eval, epochs) of each size; --quick is the harness's own --quick (encoderlab.tasks.benchmark.QUICK).
SIZES = {"smoke": (32, 16, 1), "quick": (500, 500, 1), "full": None}


def limits(size: str, evaluate: bool = False, max_train: int | None = None) -> list[str]:
    """--max-train, --max-eval and --epochs of a size (evaluate: --max-eval alone); max_train: a full run's budget."""
    if SIZES[size] is None:
        return ["--max-train", max_train] if max_train and not evaluate else []
    train, held_out, epochs = SIZES[size]
    return ["--max-eval", held_out] if evaluate else ["--max-train", train, "--max-eval", held_out, "--epochs", epochs]


def by_hand(model: str, glue: Path, work: Path, size: str, task: str, max_train: int | None) -> dict[str, float]:
    """Seed 42 of a task through `encoderlab finetune` then `encoderlab evaluate --json`: its metrics."""
    name, extra, metric = TASKS[task]
    out = work / "by-hand" / name
    encoderlab("finetune", "classify", "--model", model, "--train", glue / task / "train.tsv", "--eval",
               glue / task / "dev.tsv", "--out", out, *extra, "--seed", "42", "--metric", metric, "--no-progress",
               "--threads", "1", *limits(size, max_train=max_train))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # evaluate --json prints its result
        encoderlab("evaluate", "classify", "--model", out, "--data", glue / task / "dev.tsv", "--batch-size", "32",
                   "--threads", "1", "--json", *limits(size, evaluate=True))
    return json.loads(printed.getvalue())["metrics"]


def main() -> None:
    args = common.parser(__doc__, quick="the harness's --quick: 500/500 examples, one epoch (minutes)")
    args.add_argument("--max-train", type=int, default=None, metavar="N",
                      help="a full run on N training examples a task (a fixed random subset; all dev examples)")
    opts = args.parse_args()
    size = common.size(opts)
    with tempfile.TemporaryDirectory(prefix="encoderlab-bench-") as tmp:
        work = Path(tmp)
        data = smoke_data(work / "data") if opts.smoke else DATA
        if not data.is_dir():
            raise SystemExit(f"{data}: the shared data folder is absent")
        model = str(tiny_model(work / "tiny")) if opts.smoke else "minilm"
        glue = glue_folder(data, work / "glue")
        encoderlab("benchmark", "glue", "--model", model, "--data", glue, "--out", work / "out", "--seeds", SEEDS,
                   "--no-progress", "--threads", "1",
                   *(["--quick"] if size == "quick" else limits(size, max_train=opts.max_train)))
        summary = json.loads((work / "out" / "results.json").read_text(encoding="utf-8"))
        hand = {task: by_hand(model, glue, work, size, task, opts.max_train) for task in TASKS}
        table = (work / "out" / "results.md").read_text(encoding="utf-8").replace(str(work), "$WORK")
        summary["command"] = summary["command"].replace(str(work), "$WORK")
    figures, goals = report(summary, hand, table)
    figures["training_examples_per_task"] = opts.max_train or "all"
    print(table)
    print(f"wrote {write_results(opts, 'benchmark_glue', figures, goals)}")


def report(summary: dict[str, Any], hand: dict[str, dict[str, float]], table: str) -> tuple[dict, list]:
    """Figures (per task: median, spread, seconds, seed 42's scores and the hand-typed ones) and goals."""
    tasks = {r["task"]: r for r in summary["tasks"]}
    figures: dict[str, Any] = {"glue_partial": summary["glue"], "table_markdown": table, "model": summary["model"],
                               "harness_command": summary["command"]}
    equal = True
    for task, (name, _, _) in TASKS.items():
        result = tasks[name]
        harness = {k: v for k, v in result["runs"][0]["scores"]["dev"].items() if k != "examples"}
        equal &= all(harness[k] == hand[task][k] for k in harness)
        figures[name] = {"metrics": result["metrics"], "seconds": result["seconds"], "seeds": result["seeds"],
                         "seed_42_harness": harness, "seed_42_finetune_evaluate": {k: hand[task][k] for k in harness}}
    seeds = min(len(tasks[name]["seeds"]) for name, _, _ in TASKS.values())
    return figures, [common.goal("harness SST-2 and STS-B figures equal finetune + evaluate (1 = exactly)",
                                 float(equal), 1.0),
                     common.goal("seeds behind each median and spread (SST-2, STS-B)", float(seeds), float(SEEDS))]


if __name__ == "__main__":
    main()
