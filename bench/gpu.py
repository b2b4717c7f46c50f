"""The GPU check: pretraining throughput through the loop and of the model alone, GPU utilization, a fine-tuning,
GPU inference against sentence-transformers, and a stop by signal with its resume, in one run of a few minutes.

It needs the repository and a data folder of about 12 MB that `--prepare` makes from ../shared/data (the first 10
Wikipedia files as shards with minilm's WordPiece, 20,000 SST-2 training sentences and the dev set):

    python bench/gpu.py --prepare gpu-data     # on a machine with ../shared/data (no GPU needed), once
    python bench/gpu.py --data gpu-data        # on the GPU machine: writes bench/results/gpu.json (about 7 minutes)
    bash scripts/gpu_check.sh                  # both, whichever is needed
    python bench/gpu.py --smoke                # the same phases on CPU with tiny models (make test)

Phases, each timed and recorded (a phase that fails records its error and the others still run):
1. bert-small: configs/bert-small-wiki-gpu.yaml (1024 x 128, bf16, compile) through the loop, exported at the end;
   tokens/s over the log rows past the first quarter, MFU against the GPU's dense bf16 peak, GPU utilization sampled
   by nvidia-smi every 0.5 s while it trains;
2. bert-base at 256 x 128 and modernbert-base at 64 x 512 (bf16, compile): through the loop, then the same compiled
   objective stepped on 4 batches built beforehand on the GPU ("model alone"): the loop's share of the gap;
3. fine-tuning bert-small's export on the SST-2 sentences, 1 epoch, batch 32, bf16: steps/s and dev accuracy;
4. inference: 20,000 SST-2 sentences embedded at batch 256 by our pipeline (fp32, bf16) and sentence-transformers
   (fp32, bf16) on models/encoderlab-fill-mask, with the seconds spent tokenizing apart;
5. a stop: `timeout -s TERM` (the process, then its group) on a bert-small run, which must exit 124 having saved,
   then `--resume --stop-at` 20 steps further.
MFU counts the model FLOPs of encoderlab.train.flops (6N + 12LTH + the masked-only MLM head).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from common import SMOKE_RECIPE, goal, parser, size, smoke_data, smoke_shards, write_results  # noqa: E402

from encoderlab.data.prepare import prepare  # noqa: E402
from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.paths import resolve_model_path  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train import distributed  # noqa: E402
from encoderlab.train.config import PretrainConfig, load_recipe  # noqa: E402
from encoderlab.train.flops import gpu_peak, mlm_flops_per_token  # noqa: E402
from encoderlab.train.loop import device_step, to_device  # noqa: E402
from encoderlab.train.pretrain import build_objective, pretrain, training_data  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
FILL_MASK = ROOT / "models" / "encoderlab-fill-mask"
# Steps through the loop (then timed model-alone steps) of each pretraining shape, by run size.
STEPS = {"full": {"bert-small": 400, "bert-base": 160, "modernbert-base": 120, "alone": 30, "sentences": 20000},
         "quick": {"bert-small": 120, "bert-base": 60, "modernbert-base": 40, "alone": 10, "sentences": 5000},
         "smoke": {"bert-small": 6, "bert-base": 4, "modernbert-base": 4, "alone": 2, "sentences": 64}}
SHAPES = {"bert-base": ["preset=bert-base", "batch_size=256", "max_length=128", "lr=1e-4", "warmup_steps=20"],
          "modernbert-base": ["preset=modernbert-base", "batch_size=64", "max_length=512", "lr=1e-4",
                              "warmup_steps=20"]}


# ---- the data folder -------------------------------------------------------------------------------------------
def make_data(out: Path, wiki_files: int = 10, sentences: int = 20000, source: Path = SHARED) -> Path:
    """Shards of the first Wikipedia files (minilm's tokenizer, 20 documents held out) and an SST-2 subset in `out`."""
    files = sorted((source / "wikipedia").glob("*/wiki_*.gz"))[:wiki_files]
    if not files or not (source / "sst2" / "train.tsv").is_file():
        raise SystemExit(f"--prepare needs {source}/wikipedia and {source}/sst2 (the shared data)")
    prepare([str(f) for f in files], resolve_model_path("minilm"), out / "wiki", holdout=min(20, len(files) * 2),
            workers=1, progress=False)
    (out / "sst2").mkdir(parents=True, exist_ok=True)
    lines = (source / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (out / "sst2" / "train.tsv").write_text("\n".join(lines[:sentences + 1]) + "\n", encoding="utf-8")
    shutil.copy(source / "sst2" / "dev.tsv", out / "sst2" / "dev.tsv")
    megabytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
    print(f"wrote {out}: {len(files)} Wikipedia files as shards, {sentences:,} SST-2 sentences ({megabytes:.1f} MB)",
          file=sys.stderr)
    return out


def smoke_folder(folder: Path) -> Path:
    """The --smoke stand-in of make_data: synthetic text's shards and SST-2 rows."""
    shards = smoke_shards(folder / "build")
    shutil.copytree(shards, folder / "wiki")
    shutil.copytree(folder / "build" / "data" / "sst2", folder / "sst2")
    return folder


# ---- measuring -------------------------------------------------------------------------------------------------
class Utilization:
    """GPU utilization (%) sampled by nvidia-smi every `every` seconds while inside `with`; no samples without it."""

    def __init__(self, every: float = 0.5) -> None:
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Utilization:
        if torch.cuda.is_available() and shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        index = str(torch.cuda.current_device())
        while not self._stop.wait(self.every):
            out = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=utilization.gpu", "--format=csv,noheader,"
                                  "nounits"], capture_output=True, text=True, check=False).stdout.strip()
            if out.isdigit():
                self.samples.append(int(out))

    def summary(self) -> dict[str, Any]:
        s = self.samples[len(self.samples) // 4:]  # past the start and compilation
        return {"mean": round(statistics.mean(s), 1) if s else None, "samples": len(self.samples),
                "idle_fraction": round(sum(v < 10 for v in s) / len(s), 3) if s else None}


def steady_tokens_per_s(run: Path) -> float:
    """The median tokens/s of a run's log rows past its first quarter (warm-up, compilation)."""
    rows = [float(r["tokens_per_s"]) for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
            if r.get("tokens_per_s")]
    return statistics.median(rows[len(rows) // 4:]) if rows else 0.0


def mfu(cfg: PretrainConfig, tokens_per_s: float) -> float | None:
    """Model FLOPs per second over the GPU's dense bf16 peak (None off a GPU of the table)."""
    peak = gpu_peak(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    tokenizer = Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer")
    config = cfg.model.sized(tokenizer, cfg.max_length)  # as the model is sized
    flops = mlm_flops_per_token(config, cfg.max_length, cfg.mlm_probability)
    return tokens_per_s * flops / peak if peak else None


def recipe(data: Path, kind: str, shape: list[str], steps: int, device: str) -> PretrainConfig:
    """A pretraining recipe over the check's shards: the shape's settings, `steps` steps, logged every 10."""
    base = [] if kind != "smoke" else SMOKE_RECIPE
    sets = [f"data={data / 'wiki'}", *shape, f"max_steps={steps}", f"device={device}", "log_every=10",
            "eval_every=0", "save_every=0", *base]
    if kind == "smoke":
        sets += ["compile=false", "log_every=2", "batch_size=4", "max_length=32"]
    return load_recipe(None, sets)


def through_loop(cfg: PretrainConfig, run: Path) -> dict[str, Any]:
    """Pretrain `cfg` into `run`; tokens/s, MFU, utilization, final loss and seconds."""
    started = time.time()
    with Utilization() as usage:
        pretrain(cfg, run, progress=False)
    rate = steady_tokens_per_s(run)
    losses = [float(r["loss"]) for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")) if r["loss"]]
    return {"tokens_per_s": round(rate), "mfu": _round(mfu(cfg, rate)), "utilization": usage.summary(),
            "final_loss": losses[-1] if losses else None, "all_finite": all(map(_finite, losses)),
            "seconds": round(time.time() - started, 1), "steps": cfg.loop.max_steps}


def model_alone(cfg: PretrainConfig, steps: int) -> dict[str, Any]:
    """The recipe's objective, compiled as pretrain compiles it, stepped on 4 batches already on the device."""
    dist = distributed.Dist(device=torch.device(cfg.device if cfg.device != "auto" else "cpu"))
    tokenizer = Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer")
    torch.manual_seed(cfg.seed)
    objective = build_objective(cfg, tokenizer).to(dist.device)
    if cfg.loop.compile:
        objective.compile()
    optimizer = cfg.optim.optimizer(objective)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    cfg.data_workers = 0
    data = training_data(cfg, tokenizer, cfg.batch_size, dist)
    batches = [[to_device(b, dist.device) for b in data.next_step(0, 1, 1)] for _ in range(4)]
    for i in range(3):  # compilation and warm-up
        device_step(objective, batches[i % 4], optimizer, scheduler, cfg.loop.clip_norm, cfg.loop.precision, dist)
    _sync()
    started = time.perf_counter()
    tokens = 0.0
    for i in range(steps):
        stats = device_step(objective, batches[i % 4], optimizer, scheduler, cfg.loop.clip_norm, cfg.loop.precision,
                            dist)
        tokens += cfg.batch_size * cfg.max_length
    loss = float(stats.loss)
    _sync()
    rate = tokens / (time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
    syncs = host_syncs(lambda: device_step(objective, batches[0], optimizer, scheduler, cfg.loop.clip_norm,
                                           cfg.loop.precision, dist))
    return {"tokens_per_s": round(rate), "mfu": _round(mfu(cfg, rate)), "loss": loss, "finite": _finite(loss),
            "peak_memory_gb": _round(peak), "host_syncs_per_step": syncs}


def host_syncs(step: Any) -> int | None:
    """Synchronising CUDA calls in one step, counted by CUDA's sync debug mode (each one warns); None on CPU."""
    if not torch.cuda.is_available():
        return None
    _sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message).lower() for w in caught)


def finetune(data: Path, model: Path, out: Path, device: str, kind: str) -> dict[str, Any]:
    """`encoderlab finetune classify` of the exported bert-small on the SST-2 subset."""
    started = time.time()
    argv = ["finetune", "classify", "--model", str(model), "--train", str(data / "sst2" / "train.tsv"), "--eval",
            str(data / "sst2" / "dev.tsv"), "--epochs", "1", "--batch-size", "32", "--lr", "5e-5", "--out", str(out),
            "--device", device, "--no-progress"] + (["--precision", "bf16"] if kind != "smoke" else [])
    done = _encoderlab(argv)
    record = out / "training.json"
    report = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    return {"exit": done.returncode, "seconds": round(time.time() - started, 1), "stderr": done.stderr[-600:],
            "best": report.get("best")}


def inference(data: Path, count: int, device: str, reference: bool = True) -> dict[str, Any]:
    """Texts/s embedding SST-2 sentences with models/encoderlab-fill-mask: our pipeline and (with reference)
    sentence-transformers, fp32 and bf16, batch 256; the tokenizer's share timed apart."""
    texts = [line.split("\t")[0] for line in (data / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    texts = (texts * (count // max(len(texts), 1) + 1))[:count]
    out: dict[str, Any] = {"texts": len(texts)}
    started = time.perf_counter()
    Tokenizer.from_pretrained(FILL_MASK).encode_batch(texts)
    out["tokenize_s"] = round(time.perf_counter() - started, 3)
    for precision in ("fp32", "bf16"):
        embed = pipeline("embed", FILL_MASK, precision=precision, device=device, batch_size=256)
        embed(texts[:512])  # warm-up
        _sync()
        started = time.perf_counter()
        embed(texts)
        _sync()
        out[f"encoderlab_{precision}"] = round(len(texts) / (time.perf_counter() - started), 1)
    if not reference:  # --smoke: importing sentence-transformers alone takes longer than the rest of the phase
        out["sentence_transformers"] = "skipped (--smoke)"
        return out
    try:
        from sentence_transformers import SentenceTransformer  # the reference, where installed
    except ImportError:
        out["sentence_transformers"] = "not installed"
        return out
    for precision in ("fp32", "bf16"):
        model = SentenceTransformer(str(FILL_MASK), device=device)
        if precision == "bf16":
            model = model.to(torch.bfloat16)
        model.encode(texts[:512], batch_size=256)
        _sync()
        started = time.perf_counter()
        model.encode(texts, batch_size=256)
        _sync()
        out[f"sentence_transformers_{precision}"] = round(len(texts) / (time.perf_counter() - started), 1)
    return out


def stop_and_resume(data: Path, run: Path, device: str, kind: str, seconds: int) -> dict[str, Any]:
    """bert-small under `timeout -s TERM` (the process, then its whole group): exit 124 with a checkpoint at the
    step it stopped; then --resume --stop-at 20 steps later (2 in --smoke) finishes cleanly."""
    sets = [f"data={data / 'wiki'}", f"device={device}", "save_every=100000", "max_steps=100000", "log_every=10",
            "eval_every=0"] + (SMOKE_RECIPE + ["compile=false", "batch_size=4"] if kind == "smoke" else [])
    argv = ["pretrain", "--config", str(ROOT / "configs" / "bert-small-wiki-gpu.yaml"), "--out", str(run)]
    argv += [a for s in sets for a in ("--set", s)]
    stopped = _encoderlab(argv, timeout=seconds)
    pointer = run / "checkpoints" / "latest"
    step = int(pointer.read_text().strip().removeprefix("step-")) if pointer.is_file() else None
    result = {"exit": stopped.returncode, "saved_step": step, "terminated_line": "terminated" in stopped.stderr,
              "stderr": stopped.stderr[-400:]}
    if step is not None:
        resumed = _encoderlab([*argv, "--resume", "--stop-at", str(step + (2 if kind == "smoke" else 20))])
        result |= {"resume_exit": resumed.returncode, "resume_stderr": resumed.stderr[-400:]}
    return result


# ---- helpers ---------------------------------------------------------------------------------------------------
def _encoderlab(argv: list[str], timeout: int | None = None) -> subprocess.CompletedProcess:
    """`python -m encoderlab ARGV` from the repository, under `timeout -s TERM` when given."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "encoderlab", *argv]
    if timeout is not None:
        command = ["timeout", "-s", "TERM", str(timeout), *command]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _phase(figures: dict[str, Any], name: str, run: Any) -> None:
    """Run one phase into figures[name]; a failure is recorded and the check goes on."""
    started = time.time()
    print(f"[{name}] ...", file=sys.stderr, flush=True)
    try:
        figures[name] = run()
    except Exception as err:  # noqa: BLE001 (a phase's failure is a result to record)
        figures[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-1500:]}
    print(f"[{name}] {time.time() - started:.0f} s: {json.dumps(figures[name])[:300]}", file=sys.stderr, flush=True)


def goals_of(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 35's measured goals, from what was measured (a phase that failed counts as not met)."""
    def get(*keys: str) -> float:
        value: Any = figures
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return float(value) if isinstance(value, (int, float)) else 0.0

    reference = get("inference", "sentence_transformers_fp32")
    return [goal("bert-base at 128 through the loop: MFU", get("bert-base", "loop", "mfu"), 0.40),
            goal("bert-small recipe through the loop: MFU", get("bert-small", "mfu"), 0.25),
            goal("bert-small recipe: mean GPU utilization (%)", get("bert-small", "utilization", "mean"), 90),
            goal("modernbert-base at 512: every logged loss finite (1 = yes)",
                 float(bool(figures.get("modernbert-base", {}).get("loop", {}).get("all_finite"))), 1),
            goal("modernbert-base at 512 through the loop: MFU", get("modernbert-base", "loop", "mfu"), 0.35),
            goal("inference bf16 over sentence-transformers fp32",
                 get("inference", "encoderlab_bf16") / reference if reference else 0.0, 1.5),
            goal("a stop by timeout's double SIGTERM saved a checkpoint (1 = yes)",
                 float(figures.get("stop", {}).get("saved_step") is not None), 1)] + sync_goal(figures)


def sync_goal(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 45: no host synchronisation in bert-base's compiled step, where a GPU counted them (none on CPU)."""
    syncs = figures.get("bert-base", {}).get("alone", {}).get("host_syncs_per_step")
    if not isinstance(syncs, int):
        return []
    return [goal("bert-base at 128, the compiled step alone: host synchronisations per step", syncs, 0,
                 at_most=True)]


def main() -> None:
    options = parser(__doc__, "fewer steps and sentences (about 4 minutes on an H100)")
    options.add_argument("--data", type=Path, default=None, help="the folder --prepare made (default: prepare one)")
    options.add_argument("--prepare", type=Path, default=None, help="make the data folder here and stop")
    args = options.parse_args()
    if args.prepare is not None:
        make_data(args.prepare)
        return
    kind = size(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and kind != "smoke":
        raise SystemExit("bench/gpu.py measures a GPU and found none (torch.cuda.is_available() is False); "
                         "--smoke runs its phases on CPU")
    steps = STEPS[kind]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = smoke_folder(tmp / "data") if kind == "smoke" else args.data or make_data(tmp / "data")
        figures: dict[str, Any] = {"size": kind, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                   "torch": torch.__version__}
        small_cfg = load_recipe(ROOT / "configs" / "bert-small-wiki-gpu.yaml",
                                [f"data={data / 'wiki'}", f"max_steps={steps['bert-small']}", f"device={device}",
                                 "log_every=10", "eval_every=0", "save_every=100000"]
                                + (SMOKE_RECIPE + ["compile=false", "log_every=2"] if kind == "smoke" else []))
        _phase(figures, "bert-small", lambda: through_loop(small_cfg, tmp / "bert-small"))
        for name, shape in SHAPES.items():
            shaped = recipe(data, kind, shape, steps[name], device)
            figures[name] = {}
            _phase(figures[name], "loop", lambda: through_loop(shaped, tmp / name))
            _phase(figures[name], "alone", lambda: model_alone(shaped, steps["alone"]))
        _phase(figures, "finetune", lambda: finetune(data, tmp / "bert-small" / "model", tmp / "sst2", device, kind))
        _phase(figures, "inference", lambda: inference(data, steps["sentences"], device, kind != "smoke"))
        _phase(figures, "stop", lambda: stop_and_resume(data, tmp / "stop", device, kind, 10 if kind == "smoke"
                                                        else 150))
    print(f"wrote {write_results(args, 'gpu', figures, goals_of(figures))}", file=sys.stderr)


if __name__ == "__main__":
    main()
