"""`encoderlab index` scaled out with torchrun: one process with one thread against `torchrun --nproc-per-node 2`
with one thread a rank, on the same SQuAD paragraphs, the same model and the same shards; the two indexes must be
equal file for file (vectors, ids, documents, index.json).

Figures: each run's documents/s as the command reports it (the build: shards encoded and written, after the model
loaded), and its wall time (Python start, torch import and each rank's model load included); best of REPEATS (2) runs
of each, alternated, with the machine's load average before and after each (the machine is shared: a second core
busy with another job costs the two-rank run its speed-up, not the one-process run).
Goal: two ranks at 1.7x one process's documents/s or better, and the indexes equal.

    python bench/index_scale.py            # all of SQuAD part A: 1,545 paragraphs, minilm, best of 2 (~8 minutes, quiet)
    python bench/index_scale.py --quick    # 200 paragraphs, one run each (under a minute)
    python bench/index_scale.py --smoke    # a tiny random model on a synthetic corpus (make test)

Data: ../shared/data/squad_v1.1/dev-v1.1.part-a.json (scripts/squad_beir.py writes it as BEIR's corpus.jsonl).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from common import goal, parser, size, tiny_model, write_results  # noqa: E402
from rerank import SQUAD  # noqa: E402
from squad_beir import squad_to_beir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = {"full": None, "quick": 200, "smoke": 40}  # paragraphs indexed (None: all of part A)
SHARD_SIZE = {"full": 100, "quick": 25, "smoke": 5}  # an even number of shards, so both ranks get the same share
REPEATS = {"full": 2, "quick": 1, "smoke": 1}


def corpus_of(mode: str, scratch: Path) -> Path:
    """The corpus.jsonl indexed: SQuAD part A's first DOCUMENTS paragraphs, or random words (--smoke)."""
    out = scratch / "corpus.jsonl"
    if mode == "smoke":
        rng = random.Random(0)
        words = [f"w{i}" for i in range(300)]
        out.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(rng.choices(words, k=30))})
                               + "\n" for i in range(DOCUMENTS[mode])))
        return out
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} is absent: this bench needs SQuAD v1.1 part A (run --smoke for the synthetic check)")
    squad_to_beir(SQUAD, scratch / "squad")
    lines = (scratch / "squad" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:DOCUMENTS[mode]]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def load() -> float:
    """The 1-minute load average: how busy the machine's cores were."""
    return os.getloadavg()[0]


def index(model: str, corpus: Path, out: Path, shard_size: int, ranks: int) -> dict:
    """`encoderlab index` with one thread a process, alone (ranks 1) or under torchrun: its JSON summary, its wall
    seconds and the load average before and after."""
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else []
    command = [sys.executable, *launcher, "-m", "encoderlab", "index", "--model", model, "--corpus", str(corpus),
               "--out", str(out), "--shard-size", str(shard_size), "--threads", "1", "--json", "--no-progress"]
    before, started = load(), time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout)
    return {"documents_per_second": summary["documents_per_second"], "build_seconds": summary["seconds"],
            "wall_seconds": round(wall, 1), "load_before": round(before, 2), "load_after": round(load(), 2)}


def hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file of an index folder, by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def main() -> None:
    args = parser(__doc__, "200 paragraphs, one run each (under a minute)").parse_args()
    mode = size(args)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        model = str(tiny_model(scratch / "tiny")) if mode == "smoke" else "minilm"
        corpus = corpus_of(mode, scratch)
        documents = len(corpus.read_text(encoding="utf-8").splitlines())
        runs: dict[str, list[dict]] = {"one_process": [], "two_ranks": []}
        for attempt in range(REPEATS[mode]):
            for name, ranks in (("one_process", 1), ("two_ranks", 2)):
                runs[name].append(index(model, corpus, scratch / f"{name}{attempt}", SHARD_SIZE[mode], ranks))
                print(f"{name} run {attempt + 1}: {runs[name][-1]}", flush=True)
        equal = hashes(scratch / "one_process0") == hashes(scratch / "two_ranks0")
    best = {name: max(rows, key=lambda row: row["documents_per_second"]) for name, rows in runs.items()}
    speedup = best["two_ranks"]["documents_per_second"] / best["one_process"]["documents_per_second"]
    figures = {"model": model, "documents": documents,
               "data": "synthetic" if mode == "smoke" else "SQuAD v1.1 part A paragraphs (scripts/squad_beir.py)",
               "shard_size": SHARD_SIZE[mode], "threads_per_process": 1, "best": best, "runs": runs,
               "speedup": round(speedup, 3), "indexes_equal": equal}
    goals = [goal("two ranks' documents/s over one process's (one thread each)", speedup, 1.7),
             goal("the two indexes equal file for file (1 yes, 0 no)", float(equal), 1.0)]
    path = write_results(args, "index_scale", figures, goals)
    for row in goals:
        print(f"{'met ' if row['met'] else 'MISS'} {row['what']}: {row['value']} (target {row['target']})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
