"""How fast the `encoderlab` command answers: --help, an argument error and an empty text (none of which should load
torch), and a one-sentence fill-mask and a six-line embed end to end, each a fresh process as a user starts it; and
what a Hub name found in a warm cache adds (issue 42): the seconds resolve_model_path takes for it in a fresh process,
huggingface_hub not imported, goal <= 0.1 s (`fill_mask_hub_warm` runs the same fill-mask by that name, end to end).

    python bench/startup.py            # 5 runs of each, the median kept
    python bench/startup.py --quick    # 3 runs of each
    python bench/startup.py --smoke    # 1 run of each on a tiny random model (make test)

Also `python -X importtime -c "import encoderlab.cli"`: how long importing the CLI takes, whether torch comes with it,
and the slowest imports (docs/reliability.md#fast-start shows them). Times are wall-clock on a machine that may be
shared: the machine and its load average are recorded with them.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import goal, parser, size, tiny_model, write_results  # noqa: E402

from encoderlab.paths import resolve_model_path  # noqa: E402  (light: no torch)

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "examples" / "sentences.txt"  # 6 lines
LIGHT, HEAVY = 0.5, 3.0  # the goals, in seconds (issue 37; 2 cores)
HUB_ADDS = 0.1  # a Hub name from a warm cache adds at most this to a command (issue 42)
HUB_NAME = "encoderlab/bench-fill-mask"  # the fill-mask model, put in a temporary Hub cache under this name
RUNS = {"smoke": 1, "quick": 3, "full": 5}


def encoderlab_command() -> list[str]:
    """The `encoderlab` script beside this python (what `make demo` installs), else `python -m encoderlab`."""
    script = Path(sys.executable).with_name("encoderlab")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "encoderlab"]


def cases(fill_model: str, embed_model: str, out: Path) -> dict[str, tuple[list[str], int, float]]:
    """name -> (arguments, expected exit code, goal in seconds)."""
    return {
        "help": (["--help"], 0, LIGHT),
        "argument_error": (["fill-mask", "--precision", "fp64", "Paris is the [MASK] of France."], 2, LIGHT),
        "empty_text": (["fill-mask", "--model", fill_model, ""], 2, LIGHT),
        # neither a folder, an alias nor a Hub name: refused before torch loads
        "bad_model_name": (["fill-mask", "--model", "no such/model!", "Paris is the [MASK] of France."], 2, LIGHT),
        "fill_mask": (["fill-mask", "--model", fill_model, "Paris is the [MASK] of France."], 0, HEAVY),
        "embed_6_lines": (["embed", "--model", embed_model, "--input", str(SENTENCES), "--out", str(out / "x.npy")], 0,
                          HEAVY),
        "fill_mask_hub_warm": (["fill-mask", "--model", HUB_NAME, "Paris is the [MASK] of France."], 0, HEAVY),
    }


def warm_hub_cache(model: str, cache: Path) -> dict[str, str]:
    """A Hub cache (huggingface_hub's layout) holding `model` as HUB_NAME; the environment that points at it, offline."""
    storage, commit = cache / f"models--{HUB_NAME.replace('/', '--')}", "0" * 40
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(commit)
    shutil.copytree(resolve_model_path(model), storage / "snapshots" / commit)
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def hub_resolve_time(env: dict[str, str], runs: int) -> dict[str, Any]:
    """Median seconds resolve_model_path(HUB_NAME) takes in a fresh process, and whether huggingface_hub came along."""
    code = ("import sys, time\nfrom encoderlab.paths import resolve_model_path\nstart = time.perf_counter()\n"
            f"resolve_model_path({HUB_NAME!r})\nprint(time.perf_counter() - start, 'huggingface_hub' in sys.modules)")
    seconds, imported = [], False
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT,
                              check=True)
        value, flag = done.stdout.split()
        seconds.append(float(value))
        imported = imported or flag == "True"
    return {"command": f"resolve_model_path({HUB_NAME!r}) from a warm cache, in a fresh process",
            "median_s": round(statistics.median(seconds), 4), "huggingface_hub_imported": imported}


def timed(argv: list[str], code: int, runs: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Median and every wall-clock time of `encoderlab ARGV` over `runs` fresh processes; exits on a wrong code."""
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([*encoderlab_command(), *argv], capture_output=True, text=True, cwd=ROOT, check=False,
                              env=env)
        seconds.append(time.perf_counter() - started)
        if done.returncode != code:
            raise SystemExit(f"encoderlab {' '.join(argv)} exited {done.returncode}, expected {code}:\n{done.stderr}")
    return {"command": " ".join(["encoderlab", *argv]), "median_s": round(statistics.median(seconds), 3),
            "runs_s": [round(s, 3) for s in seconds], "last_stderr": done.stderr.strip()[-300:]}


def import_time() -> dict[str, Any]:
    """`python -X importtime -c "import encoderlab.cli"`: the total, whether torch came along, the slowest imports."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import encoderlab.cli"], capture_output=True,
                          text=True, cwd=ROOT, check=True)
    rows = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip(), len(parts[2]) - len(parts[2].lstrip())))
    top = [r for r in rows if r[2] == 1]  # imported by the statement itself
    return {"command": 'python -X importtime -c "import encoderlab.cli"',
            "total_ms": round(sum(us for us, _, _ in top) / 1e3, 1),
            "torch_imported": any(name.strip() == "torch" for _, name, _ in rows),
            "slowest_ms": {name.strip(): round(us / 1e3, 1) for us, name, _ in sorted(rows, reverse=True)[:8]}}


def main() -> None:
    args = parser(__doc__, "3 runs of each command").parse_args()
    work = Path(tempfile.mkdtemp(prefix="encoderlab-startup-"))
    try:
        fill_model, embed_model = "encoderlab-fill-mask", "minilm"
        if args.smoke:
            fill_model, embed_model = str(tiny_model(work / "mlm", masked_lm=True)), str(tiny_model(work / "base"))
        figures: dict[str, Any] = {"size": size(args), "load_average": os.getloadavg(),
                                   "encoderlab": " ".join(encoderlab_command())}
        goals = []
        env = warm_hub_cache(fill_model, work / "hub")
        for name, (argv, code, target) in cases(fill_model, embed_model, work).items():
            figures[name] = timed(argv, code, RUNS[size(args)], env if "hub" in name else None)
            print(f"{name:>15}: {figures[name]['median_s']:.2f} s  ({figures[name]['command']})", file=sys.stderr)
            goals.append(goal(f"{name.replace('_', ' ')}: median wall-clock seconds of a fresh `encoderlab` process",
                              figures[name]["median_s"], target, at_most=True))
        figures["import"] = import_time()
        goals.append(goal("importing encoderlab.cli loads torch (1 = yes)", float(figures["import"]["torch_imported"]),
                          0.0, at_most=True))
        figures["hub_warm_resolve"] = hub_resolve_time(env, RUNS[size(args)])
        print(f"hub warm resolve: {figures['hub_warm_resolve']['median_s']:.3f} s", file=sys.stderr)
        goals.append(goal("Hub name from a warm cache adds <= 0.1 s: seconds resolve_model_path takes for it",
                          figures["hub_warm_resolve"]["median_s"], HUB_ADDS, at_most=True))
        goals.append(goal("a warm-cache Hub name imports huggingface_hub (1 = yes)",
                          float(figures["hub_warm_resolve"]["huggingface_hub_imported"]), 0.0, at_most=True))
        path = write_results(args, "startup", figures, goals)
        print(f"wrote {path}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
