"""Short pretraining runs of every family's objective on the Wikipedia shards (issue 5): does each loss fall?

One run per recipe in configs/family (RoBERTa MLM, ALBERT MLM+SOP, ELECTRA replaced-token detection,
DistilBERT distillation from runs/bert-mini-cpu, DeBERTa-v3 MLM and RTD with GDES), all cut to the same few steps of 16
sequences of 128 tokens, on CPU. RoBERTa reads byte-level BPE shards when runs/wiki-bpe-data exists (its own
tokenizer kind); the others read the WordPiece shards. The curves go to docs/family-curves.png and the figures
to bench/results/family_pretrain.json: first and last logged loss, and the held-out figures at the end.

    python bench/family_pretrain.py            # 120 steps each; the README's figure used --steps 150
    python bench/family_pretrain.py --quick    # 4 steps each (about a minute)
    python bench/family_pretrain.py --smoke    # 2 steps each of 2 x 32 models on synthetic shards (make test)
"""

from __future__ import annotations

import csv
import shutil
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
from common import SMOKE_RECIPE, encoderlab, results_path, smoke_shards, training_precision, write_results  # noqa: E402

from encoderlab import EncoderConfig, MaskedLMModel, save_pretrained  # noqa: E402
from encoderlab.io import atomic_write  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# family: (recipe, the loss columns to draw, extra overrides)
RUNS = {
    "RoBERTa (MLM, packed sentences)": ("roberta-mini", ("mlm_loss",)),
    "ALBERT (MLM + SOP)": ("albert-mini", ("mlm_loss", "nsp_loss")),
    "ELECTRA (generator MLM + 50 x RTD)": ("electra-mini", ("mlm_loss", "rtd_loss")),
    "DistilBERT (distillation)": ("distilbert-mini", ("ce_loss", "mlm_loss", "cos_loss")),
    "DeBERTa-v3 (MLM, disentangled attention)": ("deberta-mini", ("mlm_loss",)),
    "DeBERTa-v3 (RTD + GDES)": ("deberta-rtd-mini", ("mlm_loss", "rtd_loss")),
}


def rows(run: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run / "metrics.csv").open(encoding="utf-8")))


def series(table: list[dict[str, str]], column: str) -> tuple[list[int], list[float]]:
    points = [(int(r["step"]), float(r[column])) for r in table if r.get(column)]
    return [p[0] for p in points], [p[1] for p in points]


def run_recipe(recipe: str, out: Path, steps: int, extra: list[str]) -> None:
    """One short run of configs/family/RECIPE.yaml into `out` (`extra`: further --set overrides)."""
    if recipe != "distilbert-mini":  # a teacher is distillation's option; another objective refuses one
        extra = [o for o in extra if not o.startswith("teacher=")]
    overrides = [f"max_steps={steps}", f"warmup_steps={max(1, steps // 10)}", "batch_size=16",
                 f"log_every={max(1, min(4, steps // 2))}", f"eval_every={steps}", "eval_batches=4", f"save_every={steps}"]
    if recipe == "roberta-mini" and (ROOT / "runs/wiki-bpe-data/meta.json").is_file() and "data=" not in str(extra):
        overrides.append("data=runs/wiki-bpe-data")
    encoderlab("pretrain", "--config", ROOT / f"configs/family/{recipe}.yaml", "--out", out,
               *[x for o in overrides + extra for x in ("--set", o)])


def smoke_setup(work: Path) -> list[str]:
    """Synthetic shards and a tiny random teacher in `work`; the overrides that point every recipe at them."""
    shards = smoke_shards(work)
    tokenizer = Tokenizer.from_pretrained(shards / "tokenizer")
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=tokenizer.vocab_size, hidden_size=32, num_heads=2,
                                       intermediate_size=64)
    save_pretrained(MaskedLMModel(config), work / "teacher")
    tokenizer.save(work / "teacher")
    return [*SMOKE_RECIPE, f"data={shards}", f"teacher={work / 'teacher'}", "eval_batches=1"]


def plot(results: dict[str, Path], out: Path) -> None:
    """One panel per family: its loss terms against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    fig, axes = plt.subplots(-(-len(results) // columns), columns, figsize=(13, 3.4 * -(-len(results) // columns)))
    axes = axes.ravel()
    for axis, (title, run) in zip(axes, results.items()):
        table = rows(run)
        for column in RUNS[title][1]:
            steps, values = series(table, column)
            axis.plot(steps, values, label=column.replace("nsp_loss", "sop_loss"))
        axis.set_yscale("log")  # terms of very different sizes (distillation's KL and cosine beside MLM) all show
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
    for axis in axes[::columns]:
        axis.set_ylabel("training loss")
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def main() -> None:
    parser = common.parser(__doc__, quick="4 steps per family")
    parser.add_argument("--steps", type=int, default=120, help="steps per family (default: 120)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs/family", help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    opts = parser.parse_args()
    if opts.smoke:
        with tempfile.TemporaryDirectory(prefix="encoderlab-family-") as work:
            opts.runs, opts.reuse = Path(work) / "runs", False
            run_all(opts, 2, smoke_setup(Path(work)))
        return
    if not (ROOT / "runs/wiki-data/meta.json").is_file() or not (ROOT / "runs/bert-mini-cpu/model").is_dir():
        print("skipped: needs the prepared Wikipedia shards (runs/wiki-data) and the teacher runs/bert-mini-cpu/model; "
              "configs/bert-mini-wiki-cpu.yaml says how to make both", file=sys.stderr)
        return
    run_all(opts, 4 if opts.quick else opts.steps, [f"precision={training_precision()}"])


def run_all(opts: Namespace, steps: int, extra: list[str]) -> None:
    """Run (or reuse) every family's recipe for `steps` steps; draw the curves; write the figures and goals."""
    folders, figures, goals = {}, {}, []
    suffix = {"smoke": "-smoke", "quick": "-quick", "full": ""}[common.size(opts)]
    for title, (recipe, columns) in RUNS.items():
        folders[title] = opts.runs / (recipe + suffix)
        if not (opts.reuse and (folders[title] / "model" / "config.json").is_file()):
            shutil.rmtree(folders[title], ignore_errors=True)
            run_recipe(recipe, folders[title], steps, extra)
        table = rows(folders[title])
        losses = series(table, "loss")[1]  # training rows; the held-out rows leave `loss` empty
        first, last = losses[0], losses[-1]
        evals = {k: round(float(v), 4) for k, v in table[-1].items() if k.startswith("eval_") and v}
        figures[recipe] = {"steps": steps, "first_loss": round(first, 4), "last_loss": round(last, 4),
                           "seconds": float(table[-1]["elapsed_s"]), **evals,
                           **{c + "_first_last": [round(v, 4) for v in (series(table, c)[1][0], series(table, c)[1][-1])]
                              for c in columns}}
        goals.append({"what": f"{title}: training loss falls over {steps} steps", "value": round(last - first, 4),
                      "target": "< 0", "met": last < first})
        print(title, figures[recipe], file=sys.stderr, flush=True)
    picture = {"smoke": results_path(opts, "family_pretrain").with_name("family-curves-smoke.png"),
               "quick": ROOT / "bench/results/family-curves-quick.png", "full": ROOT / "docs/family-curves.png"}
    picture = picture[common.size(opts)]
    plot(folders, picture)
    figures["recipe_overrides"] = extra
    figures["curves"] = str(picture.relative_to(ROOT) if picture.is_relative_to(ROOT) else picture)
    print(f"wrote {write_results(opts, 'family_pretrain', figures, goals)}")


if __name__ == "__main__":
    main()
