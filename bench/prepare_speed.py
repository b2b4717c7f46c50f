"""Data preparation throughput and memory: `encoderlab prepare` on the Wikipedia files, side by side with the
raw ceiling (one process batch-encoding the same documents with the `tokenizers` library, nothing written).

Memory must stay flat however large the corpus is: the goal compares the peak resident memory of a run on
10x more files with that of a small run (each run in a fresh process, its workers included).

    python bench/prepare_speed.py            # 10 files, then 100 files (AA)
    python bench/prepare_speed.py --quick    # 2 files, then 8 files
    python bench/prepare_speed.py --smoke    # 1 file, then 2, of synthetic text (make test)
"""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import smoke_data, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT.parent / "shared" / "data" / "wikipedia" / "AA"
FILES = {"smoke": (1, 2), "quick": (2, 8), "full": (10, 100)}  # files of the small and the large run

_RUN = """
import json, resource, sys
from encoderlab.data.prepare import prepare
stats = prepare(sys.argv[1].split(","), sys.argv[2], sys.argv[3], holdout=0.005, progress=False)
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
stats["peak_rss_mb"] = round((own + children) / 1024, 1)  # ru_maxrss is in KiB on Linux
print(json.dumps(stats))
"""


def run_prepare(files: list[Path], tokenizer: Path, out: Path) -> dict:
    """`prepare` in a fresh process; its statistics plus peak memory (main process + largest worker)."""
    done = subprocess.run([sys.executable, "-c", _RUN, ",".join(map(str, files)), str(tokenizer), str(out)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def raw_ceiling(files: list[Path], tokenizer: Path) -> dict:
    """Read and batch-encode the same text in one process with the Rust tokenizer: no splitting, no writing."""
    from tokenizers import Tokenizer as RustTokenizer

    rust = RustTokenizer.from_file(str(tokenizer / "tokenizer.json"))
    rust.no_truncation()
    rust.no_padding()
    started, size, tokens = time.perf_counter(), 0, 0
    for path in files:
        text = gzip.open(path, "rt", encoding="utf-8").read()
        size += len(text.encode("utf-8"))
        lines = [line for line in text.splitlines() if line and not line.startswith(("<doc", "</doc"))]
        tokens += sum(len(e.ids) for e in rust.encode_batch(lines, add_special_tokens=False))
    seconds = time.perf_counter() - started
    return {"bytes": size, "tokens": tokens, "seconds": round(seconds, 2), "mb_per_s": round(size / 1e6 / seconds, 2)}


def main() -> None:
    args = common.parser(__doc__, quick="2 and 8 files (well under a minute)").parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wiki = smoke_data(Path(tmp) / "data") / "wikipedia" / "AA" if args.smoke else WIKI
        if not wiki.is_dir():
            sys.exit(f"skipped: {wiki} is absent (the Wikipedia corpus lives in ../shared/data)")
        files = sorted(wiki.glob("wiki_*.gz"))
        small, large = (files[:n] for n in FILES[common.size(args)])
        tokenizer = Path(tmp) / "tokenizer"
        from encoderlab.data.tokenizer_training import train_tokenizer

        train_tokenizer([str(f) for f in files[:2]], vocab_size=8000, out_dir=tokenizer)
        small_run = run_prepare(small, tokenizer, Path(tmp) / "small")
        large_run = run_prepare(large, tokenizer, Path(tmp) / "large")
        ceiling = raw_ceiling(large, tokenizer)
    growth = large_run["peak_rss_mb"] / small_run["peak_rss_mb"]
    figures = {"small": {"files": len(small), **small_run}, "large": {"files": len(large), **large_run},
               "raw_tokenizer_one_process": ceiling,
               "prepare_vs_raw_tokenizer": round(large_run["mb_per_s"] / ceiling["mb_per_s"], 2),
               "peak_rss_growth_for_10x_more_files": round(growth, 2),
               "self_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    goals = [{"what": f"memory stays flat: peak RSS on {len(large)} files / on {len(small)} files",
              "value": round(growth, 2), "target": "<= 1.5", "met": bool(growth <= 1.5)}]
    path = write_results(args, "prepare_speed", figures, goals)
    print(json.dumps({"figures": figures, "goals": goals}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
