"""Pretraining's data pipeline: how fast the host builds masked batches, and whether the loop hides that time.

Three measurements on Wikipedia prepared with minilm's WordPiece (../shared/data/wikipedia; the first files only):
- old against new, in one process: the path before 2026-11-26 (each example collated alone with its own
  generator, then the rows padded) against `PretrainingData.build` (each example's draws from its own generator,
  then padding and masking over the whole batch at once), on the same 1024 x 128 steps; the batches are checked
  equal, bit for bit, before anything is timed;
- W worker processes (`PrefetchedSteps`, the recipe's `data_workers`), W = 1 up to the core count: steps handed to
  the loop per second once the workers are running;
- overlap: the one training loop (`run_loop`) with a stand-in objective whose step takes as long as building a
  batch, without workers and with one. The stand-in sleeps: the host is free while a GPU computes, and what is
  measured is whether the loop builds the next batch in that time instead of after it.

    python bench/data_pipeline.py            # 6 Wikipedia files, 1024 x 128 (about 2 minutes on 2 cores)
    python bench/data_pipeline.py --quick    # 2 files, fewer steps (under a minute)
    python bench/data_pipeline.py --smoke    # synthetic text, 16 x 32 (seconds; make test)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import goal, parser, size, smoke_shards, write_results  # noqa: E402

from encoderlab.data.prepare import prepare  # noqa: E402
from encoderlab.engine import pad  # noqa: E402
from encoderlab.nn.model import IGNORE_INDEX  # noqa: E402
from encoderlab.objectives.base import Objective  # noqa: E402
from encoderlab.paths import resolve_model_path  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train import distributed  # noqa: E402
from encoderlab.train.config import PretrainConfig, load_recipe  # noqa: E402
from encoderlab.train.loop import LoopOptions, RunSetup, run_loop  # noqa: E402
from encoderlab.train.prefetch import PREFETCH_STEPS, PrefetchedSteps  # noqa: E402
from encoderlab.train.pretrain import Batches, PretrainingData, _mix, training_data  # noqa: E402

WIKI = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "wikipedia" / "AA"
SIZES = {"full": {"files": 6, "batch": 1024, "length": 128, "old": 4, "new": 12, "steps": 40, "loop": 24},
         "quick": {"files": 2, "batch": 1024, "length": 128, "old": 2, "new": 6, "steps": 16, "loop": 10},
         "smoke": {"files": 0, "batch": 16, "length": 32, "old": 2, "new": 2, "steps": 4, "loop": 4}}


# ---- data --------------------------------------------------------------------------------------------------------
def prepared(folder: Path, files: int) -> Path:
    """The first `files` Wikipedia files prepared with minilm's tokenizer (synthetic text for --smoke)."""
    if not files:
        return smoke_shards(folder)
    sources = sorted(WIKI.glob("wiki_*.gz"))[:files]
    if len(sources) < files:
        raise SystemExit(f"needs {files} files of {WIKI} (the shared data); found {len(sources)}: use --smoke")
    prepare([str(p) for p in sources], resolve_model_path("minilm"), folder / "shards", holdout=0, workers=1,
            progress=False)
    return folder / "shards"


def recipe(shards: Path, sized: dict, workers: int = 0) -> PretrainConfig:
    return load_recipe(None, [f"data={shards}", "preset=bert-mini", f"batch_size={sized['batch']}",
                              f"max_length={sized['length']}", f"data_workers={workers}", "precision=fp32"])


def steps_of(cfg: PretrainConfig, workers: int | None = None) -> PretrainingData | PrefetchedSteps:
    """The recipe's training steps (one micro-batch a step), built ahead by `workers` processes if given."""
    cfg.data_workers = cfg.data_workers if workers is None else workers
    tokenizer = Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer")
    return training_data(cfg, tokenizer, cfg.batch_size, distributed.Dist())


def old_build(batches: Batches, positions: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """The path before: each example masked alone by the collator with its own generator, the rows then padded."""
    generator, rows = torch.Generator(), []
    for epoch, index in positions:
        generator.manual_seed(_mix(batches.seed, epoch, index))
        rows.append(batches.collator([batches.examples.get(epoch, index)], generator))
    fill = {"input_ids": batches.collator.pad_id, "labels": IGNORE_INDEX}
    return {key: pad([r[key][0].tolist() for r in rows], fill.get(key, 0), multiple_of=8) if rows[0][key].ndim == 2
            else torch.cat([r[key] for r in rows]) for key in rows[0]}


# ---- measurements ------------------------------------------------------------------------------------------------
def old_against_new(cfg: PretrainConfig, sized: dict) -> dict:
    """Seconds per step of both builders on the same steps, after checking that their batches are equal."""
    data = steps_of(cfg, 0)
    plans = [data.plan(0, 1, 1) for _ in range(max(sized["old"], sized["new"]))]
    for plan in plans[:2]:
        old, new = old_build(data.batches, plan[0]), data.build(plan)[0]
        assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old), "the batches differ"
    times = {}
    for name, count, build in (("old", sized["old"], lambda p: old_build(data.batches, p[0])),
                               ("new", sized["new"], data.build)):
        seconds = []
        for plan in plans[:count]:
            started = time.perf_counter()
            build(plan)
            seconds.append(time.perf_counter() - started)
        times[name] = statistics.median(seconds)
    tokens = sized["batch"] * sized["length"]
    return {"seconds_per_step": {k: round(v, 4) for k, v in times.items()},
            "tokens_per_s": {k: round(tokens / v) for k, v in times.items()},
            "speedup": round(times["old"] / times["new"], 2), "equal_batches": True}


def worker_rate(cfg: PretrainConfig, workers: int, steps: int) -> float:
    """Steps per second handed to a loop that waits for nothing, once the workers have filled their queue."""
    data = steps_of(cfg, workers)
    try:
        for _ in range(workers * PREFETCH_STEPS):  # the start: forks and the first builds
            data.next_step(0, 1, 1)
        started = time.perf_counter()
        for _ in range(steps):
            data.next_step(0, 1, 1)
        return steps / (time.perf_counter() - started)
    finally:
        data.close()


class StandIn(Objective):
    """A model whose step takes `seconds` of the device's time and none of the host's (it sleeps); it notes when each
    step starts."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.weight, self.starts = seconds, nn.Parameter(torch.zeros(())), []

    def forward(self, batch: dict[str, torch.Tensor], counts: dict) -> tuple[torch.Tensor, dict]:
        self.starts.append(time.perf_counter())
        time.sleep(self.seconds)
        loss = self.weight * 0 + (batch["labels"] != IGNORE_INDEX).sum() / counts["masked"]
        return loss, {"mlm_loss": loss.detach()}

    def metrics(self, sums: dict, counts: dict) -> dict:
        return {"loss": sums["mlm_loss"]}


def loop_step(cfg: PretrainConfig, workers: int, seconds: float, steps: int) -> float:
    """Median seconds from one step's start to the next's in run_loop over the stand-in, after the first two."""
    data, objective = steps_of(cfg, workers), StandIn(seconds)
    optimizer = torch.optim.SGD(objective.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    options = LoopOptions(max_steps=2 + steps, precision="fp32", log_every=1000, eval_every=0, save_every=0)
    try:
        run_loop(objective, data, optimizer, scheduler, options, None, distributed.Dist(),
                 setup=RunSetup(progress=False, visuals=False))
    finally:
        if isinstance(data, PrefetchedSteps):
            data.close()
    return statistics.median(b - a for a, b in zip(objective.starts[2:], objective.starts[3:]))


def main() -> None:
    args = parser(__doc__, "2 Wikipedia files, fewer steps: under a minute on 2 cores").parse_args()
    kind = size(args)
    sized = SIZES[kind]
    torch.set_num_threads(1)  # one process builds; the workers are the other cores
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        cfg = recipe(prepared(Path(tmp), sized["files"]), sized)
        print(f"{kind}: batches of {sized['batch']} x {sized['length']}, {cores} cores", file=sys.stderr)
        builders = old_against_new(cfg, sized)
        print(f"one process: old {builders['tokens_per_s']['old']:,} tokens/s, new "
              f"{builders['tokens_per_s']['new']:,} ({builders['speedup']}x)", file=sys.stderr)
        rates = {w: worker_rate(cfg, w, sized["steps"]) for w in range(1, max(cores, 1) + 1)}
        tokens = sized["batch"] * sized["length"]
        for w, rate in rates.items():
            print(f"{w} worker(s): {rate * tokens:,.0f} tokens/s ({rate / rates[1]:.2f}x one)", file=sys.stderr)
        build = builders["seconds_per_step"]["new"]
        loop = {w: loop_step(cfg, w, build, sized["loop"]) for w in (0, 1)}
        print(f"loop with a {build * 1000:.0f} ms stand-in step: {loop[0] * 1000:.0f} ms a step without workers, "
              f"{loop[1] * 1000:.0f} ms with one", file=sys.stderr)
    # One worker hands over a step every 1 / rates[1] seconds (its build plus the copy to the main process): with
    # workers, that is the build the step has to hide.
    longer = max(build, 1 / rates[1])
    figures = {"size": kind, "batch": [sized["batch"], sized["length"]], "cores": cores, "builders": builders,
               "workers_tokens_per_s": {str(w): round(r * tokens) for w, r in rates.items()},
               "workers_scaling": {str(w): round(r / rates[1], 3) for w, r in rates.items()},
               "overlap": {"stand_in_step_s": round(build, 4), "one_worker_step_s": round(1 / rates[1], 4),
                           "loop_step_s_no_workers": round(loop[0], 4), "loop_step_s_one_worker": round(loop[1], 4),
                           "no_workers_over_the_sum": round(loop[0] / (build + 1 / rates[1]), 3),
                           "one_worker_over_the_longer": round(loop[1] / longer, 3)}}
    goals = [goal("new builder tokens/s over the old one, one process", builders["speedup"], 3.0)]
    goals += [goal(f"{w} workers over one worker, at least 0.8 x {w}", rates[w] / rates[1], round(0.8 * w, 2))
              for w in rates if w > 1]
    goals.append(goal("loop step with one worker over the longer of the step and one worker's build", loop[1] / longer,
                      1.2, at_most=True))
    print(f"wrote {write_results(args, 'data_pipeline', figures, goals)}", file=sys.stderr)


if __name__ == "__main__":
    main()
