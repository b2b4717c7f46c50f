"""ELECTRA against MLM at equal training compute (issue 5), side by side in one run.

Both sides pretrain the same body (4 layers x 256, bert-mini's) on the same Wikipedia shards, batches and
schedule shape: the reference with BERT's MLM, ELECTRA as a replaced-token-detection discriminator with a
quarter-width generator and 128-wide shared embeddings (ELECTRA-Small's recipe, Clark et al. 2020, table 6).
ELECTRA's step count is set so that both spend the same training FLOPs (encoderlab.train.flops). Both are then
fine-tuned on SST-2 with the same settings and scored on the dev set. The paper's claim (section 3.3, table 1):
at equal compute ELECTRA's discriminator fine-tunes better than an MLM-trained model.

    python bench/electra_vs_mlm.py            # both pretraining runs, then SST-2 (about 40 minutes on 2 quiet cores)
    python bench/electra_vs_mlm.py --reuse    # use runs that already finished
    python bench/electra_vs_mlm.py --quick    # 6 MLM steps (ELECTRA: the same FLOPs), 128 SST-2 sentences
    python bench/electra_vs_mlm.py --smoke    # 2 x 32 models, 2 steps, synthetic shards and SST-2 (make test)
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
from common import SMOKE_RECIPE, encoderlab, goal, smoke_shards, training_precision, write_results  # noqa: E402
from finetune import DATA, cli  # noqa: E402

from encoderlab.config import EncoderConfig  # noqa: E402
from encoderlab.objectives.rtd import generator_config  # noqa: E402
from encoderlab.train.config import load_recipe  # noqa: E402
from encoderlab.train.flops import mlm_flops_per_token, rtd_flops_per_token  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"mlm": ROOT / "configs/family/compare-bert-mini.yaml", "electra": ROOT / "configs/family/compare-electra-mini.yaml"}


def step_flops(recipe) -> float:
    """Training FLOPs of one optimizer step of a recipe (full packed sequences)."""
    config = EncoderConfig.from_preset(recipe.model.preset, **recipe.model.overrides)
    per_token = (rtd_flops_per_token(config, generator_config(config, recipe.options.generator_size), recipe.max_length,
                                     recipe.mlm_probability)
                 if recipe.objective == "rtd" else mlm_flops_per_token(config, recipe.max_length, recipe.mlm_probability))
    return per_token * recipe.batch_size * recipe.max_length


def pretrain(name: str, run: Path, overrides: list[str], reuse: bool) -> float:
    """Run (or reuse) one pretraining run; its wall-clock seconds (from metrics.csv when reused)."""
    if not (reuse and (run / "model" / "config.json").is_file()):
        encoderlab("pretrain", "--config", RECIPES[name], "--out", run, *[x for o in overrides for x in ("--set", o)])
    rows = list(csv.DictReader((run / "metrics.csv").open(encoding="utf-8")))
    return float(rows[-1]["elapsed_s"])


def last(run: Path, column: str) -> float | None:
    """The last logged value of a metrics.csv column."""
    values = [r[column] for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")) if r.get(column)]
    return round(float(values[-1]), 4) if values else None


def sst2(model: Path, opts: argparse.Namespace, work: Path) -> dict:
    """SST-2 dev accuracy after fine-tuning `model` (same settings for both sides)."""
    argv = ["finetune", "classify", "--model", model, "--train", opts.data / "sst2/train.tsv",
            "--eval", opts.data / "sst2/dev.tsv",
            "--out", work / model.parent.name, "--epochs", 1, "--lr", opts.lr, "--seed", 42, "--precision", training_precision(),
            "--no-progress", *(["--max-train", opts.max_train] if opts.max_train else []),
            *(["--max-eval", 96] if opts.quick or opts.smoke else []),
            *(["--threads", opts.threads] if opts.threads else [])]
    summary = cli(*argv)
    return {"accuracy": round(summary["best"]["eval_accuracy"], 4), "train_examples": summary["train_examples"],
            "eval_examples": summary["eval_examples"]}


@torch.no_grad()
def replaced_token_auc(run: Path, data: Path, sentences: int = 200, seed: int = 0) -> dict[str, float]:
    """ROC AUC of the exported discriminator's scores for replaced tokens: 15% of the (non-special) tokens of
    SST-2 dev sentences replaced by random ids, or by samples of the exported generator. 0.5 is chance."""
    from sklearn.metrics import roc_auc_score

    from encoderlab import load_model
    from encoderlab.tokenizer import Tokenizer

    torch.manual_seed(seed)
    discriminator, generator = load_model(run / "model"), load_model(run / "model" / "generator")
    tokenizer = Tokenizer.from_pretrained(run / "model")
    lines = (data / "sst2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:sentences + 1]
    batch = tokenizer.encode_batch([line.split("\t")[0] for line in lines], max_length=64)
    ids, mask = batch.input_ids, batch.attention_mask
    scored = mask.bool() & ~torch.isin(ids, torch.tensor(sorted(tokenizer.special_ids)))
    chosen = scored & (torch.rand(ids.shape) < 0.15)
    masked = torch.where(chosen, tokenizer.mask_id, ids)
    samples = {"random": torch.randint(0, tokenizer.vocab_size, ids.shape)[chosen],
               "generator": torch.multinomial(generator(masked, mask).logits[chosen].softmax(-1), 1).squeeze(1)}
    out = {}
    for name, sample in samples.items():
        corrupted = ids.clone()
        corrupted[chosen] = sample
        logits = discriminator(corrupted, mask).logits
        out[f"rtd_auc_{name}"] = round(float(roc_auc_score((corrupted != ids)[scored].numpy(), logits[scored].numpy())), 3)
    return out


def main() -> None:
    parser = common.parser(__doc__, quick="6 MLM steps and tiny SST-2 subsets: about a minute")
    parser.add_argument("--reuse", action="store_true", help="reuse finished runs instead of pretraining again")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs", help="folder of the two runs (default: runs/)")
    parser.add_argument("--max-train", type=int, default=0, help="SST-2 training sentences (default 0: all 67,349)")
    parser.add_argument("--lr", type=float, default=1e-4, help="fine-tuning learning rate (default: 1e-4)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    opts = parser.parse_args()
    if opts.smoke:
        with tempfile.TemporaryDirectory(prefix="encoderlab-electra-") as work:
            opts.max_train, opts.reuse, opts.runs = 16, False, Path(work) / "runs"
            shards = smoke_shards(Path(work))
            opts.data = Path(work) / "data"
            compare(opts, [*SMOKE_RECIPE, f"data={shards}"], Path(work))
        return
    opts.data = DATA
    if not (DATA / "sst2").is_dir() or not (ROOT / "runs/wiki-data/meta.json").is_file():
        print("skipped: needs ../shared/data/sst2 and the prepared Wikipedia shards in runs/wiki-data "
              "(configs/bert-mini-wiki.yaml says how to make them)", file=sys.stderr)
        return
    if opts.quick:
        opts.max_train, opts.reuse = 128, False
    with tempfile.TemporaryDirectory(prefix="encoderlab-bench-") as work:
        compare(opts, [f"precision={training_precision()}"], Path(work))


def compare(opts: argparse.Namespace, extra: list[str], work: Path) -> None:
    """Pretrain both sides at equal FLOPs (`extra`: further --set overrides), fine-tune each on SST-2, report."""
    recipes = {name: load_recipe(path, extra) for name, path in RECIPES.items()}
    mlm_steps = {"smoke": 2, "quick": 6, "full": recipes["mlm"].loop.max_steps}[common.size(opts)]
    budget = mlm_steps * step_flops(recipes["mlm"])
    electra_steps = max(1, round(budget / step_flops(recipes["electra"])))
    warmup = {name: max(1, round(r.optim.warmup_steps / r.loop.max_steps * steps))
              for (name, r), steps in zip(recipes.items(), (mlm_steps, electra_steps))}
    suffix = {"smoke": "-smoke", "quick": "-quick", "full": ""}[common.size(opts)]
    runs = {name: opts.runs / f"compare-{'bert' if name == 'mlm' else 'electra'}-mini{suffix}" for name in RECIPES}
    figures: dict = {"training_flops_budget": budget, "threads": torch.get_num_threads(), "recipe_overrides": extra}
    for name, steps in (("mlm", mlm_steps), ("electra", electra_steps)):
        overrides = [*extra, f"max_steps={steps}", f"warmup_steps={warmup[name]}"]
        if opts.quick or opts.smoke:
            overrides += ["eval_every=0", "save_every=0", "eval_batches=2", f"log_every={min(4, steps)}"]
        seconds = pretrain(name, runs[name], overrides, opts.reuse)
        started = time.time()
        figures[name] = {"run": str(runs[name].relative_to(ROOT)) if runs[name].is_relative_to(ROOT) else str(runs[name]),
                         "steps": steps, "flops_per_step": step_flops(recipes[name]),
                         "training_flops": steps * step_flops(recipes[name]), "pretrain_seconds": seconds,
                         "final_train_loss": last(runs[name], "loss"),
                         "heldout_mlm_accuracy": last(runs[name], "eval_mlm_accuracy"),
                         "heldout_rtd_accuracy": last(runs[name], "eval_rtd_accuracy"),
                         "sst2": sst2(runs[name] / "model", opts, work)}
        figures[name]["sst2"]["seconds"] = round(time.time() - started, 1)
        if name == "electra":
            figures[name].update(replaced_token_auc(runs[name], opts.data))
        print(name, figures[name], file=sys.stderr, flush=True)
    gap = figures["electra"]["sst2"]["accuracy"] - figures["mlm"]["sst2"]["accuracy"]
    figures["electra_minus_mlm_sst2"] = round(gap, 4)
    goals = [goal("ELECTRA SST-2 dev accuracy minus MLM's at equal training FLOPs (paper: > 0)", gap, 0.0)]
    path = write_results(opts, "electra_vs_mlm", figures, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
