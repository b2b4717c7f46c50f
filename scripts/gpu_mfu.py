"""Tokens/s and MFU of a pretraining run on a GPU, from its metrics.csv and recipe.yaml.

MFU = model FLOPs per second / the GPU's dense bf16 peak, with the model FLOPs of encoderlab.train.flops
(6N + 12LTH + the masked-only MLM head). Writes RUN/mfu.json and prints one line.

    python scripts/gpu_mfu.py runs/bert-small-gpu
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from encoderlab.train.config import load_recipe  # noqa: E402
from encoderlab.train.flops import gpu_peak, mlm_flops_per_token  # noqa: E402


def main(run: Path) -> None:
    recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    rows = [float(r["tokens_per_s"]) for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
            if r.get("tokens_per_s") not in (None, "", "tokens_per_s")]
    steady = statistics.median(rows[len(rows) // 10:]) if rows else 0.0  # past warm-up and compilation
    config = load_recipe(run / "recipe.yaml").model.encoder_config()  # the preset's, or init_from's architecture
    flops = mlm_flops_per_token(config, recipe["max_length"], recipe["mlm_probability"])
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = gpu_peak(name)
    result = {"device": name, "tokens_per_s": steady, "flops_per_token": flops, "peak_bf16_flops": peak,
              "mfu": steady * flops / peak if peak else None, "goal": 0.45}
    (run / "mfu.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    mfu = f"{result['mfu']:.1%}" if peak else "unknown peak"
    print(f"{name}: {steady:,.0f} tokens/s, {flops / 1e6:.0f} MFLOP/token, MFU {mfu} (goal 45%)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
