"""Ship a pretrained run as a model of this repository: models/NAME, loadable as `--model NAME`.

Takes RUN/model (what `encoderlab pretrain` exports at the end), stores its weights in bf16 (half the bytes; bf16
keeps fp32's exponent range, so nothing overflows), copies the tokenizer and the run's metrics.csv and recipe.yaml,
and writes the model card README.md from the run's own records plus, when present, the measured figures of
bench/results/encoderlab_mini.json. The folder is built under a temporary name and renamed into place.
models/ is not tracked by git (the repository keeps no large files); the card is also written to
docs/NAME-card.md, which is.

    python scripts/ship_model.py runs/encoderlab-mini --name encoderlab-mini
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from encoderlab.checkpoint import load_model, save_pretrained  # noqa: E402
from encoderlab.data.shards import read_meta  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402

LIMIT_MB = 60


def run_record(run: Path) -> dict:
    """Steps, tokens seen, wall time and the held-out curve, from RUN/metrics.csv and RUN/recipe.yaml."""
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    rows = [row for row in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")) if row["step"] != "step"]
    curve = [(int(r["step"]), float(r["eval_mlm_loss"]), float(r["eval_mlm_accuracy"])) for r in rows
             if r.get("eval_mlm_accuracy")]
    # elapsed_s restarts at 0 when a run is resumed: add up each stretch's last value.
    wall, previous = 0.0, 0.0
    for row in rows:
        elapsed = float(row["elapsed_s"])
        if elapsed < previous:
            wall += previous
        previous = elapsed
    wall += previous
    steps = int(rows[-1]["step"])
    tokens = steps * recipe["batch_size"] * recipe.get("grad_accum", 1) * recipe["max_length"]
    splits = read_meta(ROOT / recipe["data"])["splits"]
    data = {split: {key: sum(shard[key] for shard in splits[split]["shards"]) for key in ("documents", "tokens")}
            for split in ("train", "valid")}
    return {"recipe": recipe, "steps": steps, "tokens": tokens, "wall_hours": wall / 3600, "curve": curve, "data": data}


def card(name: str, model, record: dict, bench: dict | None) -> str:
    """The model card: what it is, what it saw, what it cost, what it scores."""
    c, r, d = model.config, record["recipe"], record["data"]
    params = sum(p.numel() for p in model.parameters())
    last = record["curve"][-1]
    every = max(1, len(record["curve"]) // 8)
    points = record["curve"][::every] + ([last] if (len(record["curve"]) - 1) % every else [])
    lines = [
        f"# {name}",
        "",
        f"A BERT encoder pretrained from scratch by encoderlab (`encoderlab pretrain`, masked-language modelling) on the "
        f"English Wikipedia corpus in `../shared/data/wikipedia`, on the CPU. Load it with `--model {name}`, or in "
        f"transformers as `BertForMaskedLM.from_pretrained(\"models/{name}\")`.",
        "",
        "| | |",
        "|---|---|",
        f"| architecture | BERT, {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads} heads, FFN "
        f"{c.intermediate_size} (bert-mini), {params / 1e6:.1f}M parameters with the MLM head |",
        f"| tokenizer | WordPiece, uncased, {c.vocab_size:,} tokens, trained by `encoderlab tokenizer train` on the same corpus |",
        f"| objective | MLM, {r['mlm_probability']:.0%} of tokens (80% [MASK], 10% random, 10% kept), packed sentences up to "
        f"{r['max_length']} tokens |",
        f"| data | Wikipedia: {d['train']['documents']:,} documents, {d['train']['tokens'] / 1e6:.1f}M tokens for training; "
        f"{d['valid']['documents']:,} documents ({d['valid']['tokens'] / 1e3:.0f}k tokens) held out for evaluation |",
        f"| steps | {record['steps']:,} of batch {r['batch_size']} x {r['max_length']} tokens |",
        f"| tokens seen | {record['tokens'] / 1e6:.1f}M (steps x batch x length, sequences being packed) |",
        f"| compute | {record['wall_hours']:.1f} hours on 2 shared CPU cores (AMD EPYC, bf16 autocast); no GPU was available |",
        f"| held-out MLM accuracy (training-time eval, {r['eval_batches']} batches) | {last[2]:.3f} (loss {last[1]:.2f}) |",
        f"| weights | bf16 safetensors |",
        "",
        "Learning curve on the held-out documents (`metrics.csv` holds every row):",
        "",
        "| step | " + " | ".join(f"{s:,}" for s, _, _ in points) + " |",
        "|---|" + "---|" * len(points),
        "| MLM accuracy | " + " | ".join(f"{a:.3f}" for _, _, a in points) + " |",
        "",
    ]
    if bench:
        f = bench["figures"]
        lines += [f"Measured by `{bench['command']}` (bench/results/encoderlab_mini.json):", ""]
        if "heldout" in f:
            h = f["heldout"]
            lines.append(f"- held-out MLM accuracy over {h['sequences']:,} sequences of up to 128 tokens, 15% masked: "
                         f"**{h['eval_mlm_accuracy']:.3f}** (goal 0.50)")
        p = f["probes"]
        lines.append(f"- fill-mask probes (written before training, `configs/fill-mask-probes.json`): required "
                     f"{p['required_passed']}/{p['required_total']}, further {p['probes_passed']}/{p['probes_total']} "
                     f"(goal: both required, 8 of 10)")
        for probe in p["results"]:
            lines.append(f"  - `{probe['text']}` -> {' '.join(f'`{t}`' for t in probe['top5'])} "
                         f"({'pass' if probe['passed'] else 'miss'})")
        if "sst2" in f:
            lines.append(f"- fine-tuned on SST-2 (1 epoch, lr 1e-4): dev accuracy {f['sst2']['accuracy']:.3f}, next to "
                         f"minilm {f['sst2']['minilm']:.3f} and a BiLSTM from scratch {f['sst2']['bilstm']:.3f}")
        lines.append("")
    lines += [
        "It reproduces with these commands, after the repository README's `tokenizer train` and `prepare` steps "
        "(runs/wiki-tokenizer, runs/wiki-data):",
        "",
        "```bash",
        "encoderlab pretrain --config configs/bert-mini-wiki-cpu.yaml --out runs/encoderlab-mini            # steps 1-1000",
        f"encoderlab pretrain --config configs/bert-mini-wiki-cpu.yaml --out runs/encoderlab-mini --resume \\",
        f"    --set max_steps={r['max_steps']} --set save_every=200                                            # the rest",
        f"python scripts/ship_model.py runs/encoderlab-mini --name {name}",
        "```",
        "",
        "The second stage continues from step 1,000's checkpoint with a longer schedule, so its learning rate rises "
        "again from the end of the first stage's decay. This model is far from a useful encoder. Google's "
        "BERT-Mini (Turc et al. 2019) was trained under BERT-base's regime (1M steps of 256 sequences), over 1,000 "
        "times the tokens seen here. A GPU is what it needs next.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished `encoderlab pretrain` run folder (with model/)")
    parser.add_argument("--name", default="encoderlab-mini", help="the folder under models/ and the --model name")
    args = parser.parse_args()
    source = args.run / "model"
    model = load_model(source, kind="mlm", dtype=torch.float32)
    record = run_record(args.run)
    results = ROOT / "bench" / "results" / "encoderlab_mini.json"
    bench = json.loads(results.read_text(encoding="utf-8")) if results.is_file() else None
    target = ROOT / "models" / args.name
    target.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{args.name}.") as tmp:
        build = Path(tmp) / "build"
        build.mkdir()
        save_pretrained(model.to(torch.bfloat16), build)
        Tokenizer.from_pretrained(source).save(build)
        for name in ("metrics.csv", "recipe.yaml"):
            shutil.copyfile(args.run / name, build / name)
        (build / "README.md").write_text(card(args.name, model, record, bench), encoding="utf-8")
        size = sum(f.stat().st_size for f in build.iterdir()) / 1e6
        if size > LIMIT_MB:
            raise SystemExit(f"{args.name}: {size:.1f} MB, over the {LIMIT_MB} MB the repository allows")
        if target.exists():
            target.rename(Path(tmp) / "old")
        build.rename(target)
    (ROOT / "docs" / f"{args.name}-card.md").write_text((target / "README.md").read_text(encoding="utf-8"),
                                                         encoding="utf-8")
    print(f"wrote {target} ({size:.1f} MB) and docs/{args.name}-card.md")


if __name__ == "__main__":
    main()
