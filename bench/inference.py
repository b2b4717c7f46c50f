"""Inference speed in the real field: encoderlab's embed modes against the engines users pick for CPU inference.

One run, all-MiniLM-L6-v2 (`minilm`), mean-pooled L2-normalised embeddings, tokenization included, the same texts
and the same thread count for every engine (bench/engines.py lists them and how each is set up): transformers eager
fp32 (the 1.00x baseline), sentence-transformers (torch; onnx and openvino backends where they run offline),
onnxruntime, CTranslate2 and OpenVINO in fp32 and int8, and every encoderlab mode (each precision this CPU runs,
compiled ones, our pipeline on onnxruntime, CTranslate2 and OpenVINO (`--engine`) in fp32 and int8, `--engine auto
--precision auto`, and encoderlab's own ONNX export on onnxruntime). An engine not installed is skipped with its
reason.

Workloads, each at 1 thread and at all cores (torch threads, ORT intra-op threads, CTranslate2 intra_threads,
OpenVINO INFERENCE_NUM_THREADS; tokenizers' own Rust pool is the same for all):
- sst2:     SST-2 dev sentences in file order (the full run: the first 320 of 872), batch 32;
- passages: Wikipedia passages of 205-256 tokens (consecutive sentences of one article joined; 24), batch 16;
- mix:      SST-2 sentences and passages shuffled together (96 + 12), batch 32: where padding costs.
Each workload records the padding fraction of encoderlab's batches (padded positions / all positions; and of
file-order batches, what transformers-fp32 pays). Each engine runs `--rounds` times, interleaved with the
others, and keeps its best round (the machine is shared). Accuracy: mean and minimum cosine of each engine's
vectors to transformers-fp32's on every workload and on the STS-B dev sentences, and STS-B dev Spearman (x100).
GFLOP/s counts the real tokens' matmul work; encoderlab fp32 is set against the fp32 matmul peak at the same
threads, measured in the same run. Goals: the issue's "Measured goals" (issue 18).

    python bench/inference.py            # the full run, about 10 minutes on 2 quiet cores
    python bench/inference.py --quick    # under a minute: all cores only, small subsets, one round (see SIZES)
    python bench/inference.py --smoke    # a tiny random model on synthetic text, --quick's engines less two (make test)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
import engines  # noqa: E402
from common import goal, matmul_peak, peak_rate, smoke_data, tiny_model, write_results  # noqa: E402

from encoderlab import EncoderConfig  # noqa: E402
from encoderlab.checkpoint import resolve_model_path  # noqa: E402
from encoderlab.engine import sorted_batches  # noqa: E402
from encoderlab.infer import precision as precisions  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402

DATA = Path(os.environ.get("ENCODERLAB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
BASELINE = "transformers-fp32"
BATCH_SIZES = {"sst2": 32, "passages": 16, "mix": 32}
# Compiled modes run by default only where compiling paid: with int8 on torch._int_mm (AVX-512 VNNI, 2 threads, SST-2
# sentences/s: int8 468 eager, 626 compiled; fp32 207, 229). On the AVX2-only EPYC neither gained (256 SST-2
# sentences, 1 thread: fp32 49.0 eager, 50.4 compiled; int8 68.4, 62.7) and each compile costs 10-40 s per thread count.
COMPILED = ["fp32", "int8"] if precisions.int8_kernel() == "int_mm" else []
# Texts per workload (sst2 None: all 872), mix as (sentences, passages), STS-B pairs (None: all 1500), rounds,
# thread counts ("all": os.cpu_count()), calibration texts (SST-2 train) for OpenVINO int8, engines left out.
# The mix is not a multiple of the batch: one batch holds both kinds. --quick leaves out 1 thread, compiling,
# OpenVINO (nncf's int8 calibration alone takes ~30 s on 2 cores; fp32 is never the fastest), the other fp32
# runtimes, encoderlab's ONNX export (each export and quantization takes seconds; onnxruntime runs the transformers
# model's export) and our pipeline on the runtimes except CTranslate2 int8 (auto stands for the rest: it is where
# encoderlab's best mode comes from), and keeps the --engine exports and auto's choice in the user's cache (a second
# --quick on a machine reuses them): 55 s on 2 busy cores (65 s the first time), 120 s with the earlier list.
# The full run's subsets kept it near 10 minutes on 2 quiet cores with 12 engines, 3 rounds, at 1 and 2 threads
# (estimated from the texts/s and from --quick under load: 8 to 10 minutes; measured: 533 s). The five
# `--engine` modes make 17: expect about 13 minutes (scaled by the engine count, not measured).
# --smoke shows that the bench runs end to end and writes its results: --quick's engines less OpenVINO's int8 (nncf's
# calibration) and auto (it times every candidate). tests/test_bench_engines.py checks every engine's vectors against
# transformers, and tests/test_engines_backend.py auto's choice, so the smoke need not load all 17 (48 CPU s; 2 cores).
QUICK_DROP = ("openvino-fp32", "openvino-int8", "onnxruntime-fp32", "ctranslate2-fp32", "sentence-transformers-onnx",
              "sentence-transformers-openvino", "encoderlab-onnx-fp32", "encoderlab-onnx-int8",
              "encoderlab-onnxruntime-fp32", "encoderlab-onnxruntime-int8", "encoderlab-ctranslate2-fp32",
              "encoderlab-openvino-fp32")
SMOKE_DROP = (*QUICK_DROP, "encoderlab-openvino-int8", "encoderlab-auto")
SIZES = {"full": {"sst2": 320, "passages": 24, "passage_tokens": 256, "mix": (96, 12), "pairs": 500,
                  "rounds": 3, "threads": "1,all", "calibration": 128, "drop": ()},
         "quick": {"sst2": 64, "passages": 8, "passage_tokens": 256, "mix": (12, 4), "pairs": 32,
                   "rounds": 1, "threads": "all", "calibration": 0, "drop": QUICK_DROP},
         "smoke": {"sst2": 16, "passages": 4, "passage_tokens": 64, "mix": (8, 2), "pairs": 16,
                   "rounds": 1, "threads": "1", "calibration": 8, "drop": SMOKE_DROP}}


# ---- texts ----------------------------------------------------------------------------------------------------
def sst2_sentences(data: Path, split: str = "dev") -> list[str]:
    """SST-2 sentences of `split` (dev, train) in file order (the first column after the header)."""
    path = data / "sst2" / f"{split}.tsv"
    if not path.is_file():
        raise SystemExit(f"{path}: absent (set ENCODERLAB_DATA to the shared data folder)")
    return [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]


def passages(data: Path, count: int, tokens: int = 256) -> list[str]:
    """`count` texts of 80-100% of `tokens` wordpieces: consecutive sentences of one Wikipedia article joined."""
    from encoderlab.data.corpus import corpus_files, iter_documents
    from encoderlab.data.sentences import split_sentences

    tokenizer = Tokenizer.from_pretrained("minilm")
    out: list[str] = []
    for path in corpus_files([data / "wikipedia"]):
        for document in iter_documents(path):
            current, length = [], 0  # a passage never spans two documents
            for sentence in (s for paragraph in document for s in split_sentences(paragraph)):
                n = len(tokenizer.encode(sentence, max_length=None, add_special_tokens=False))
                if length + n > tokens - 2:  # room for [CLS] and [SEP]
                    if length >= 0.8 * tokens:
                        out.append(" ".join(current))
                        if len(out) == count:
                            return out
                    current, length = [], 0
                current.append(sentence)
                length += n
    raise SystemExit(f"only {len(out)} passages of {tokens} tokens in {data / 'wikipedia'}")


def workloads(args: argparse.Namespace) -> dict[str, list[str]]:
    """The texts of each workload in --setups: sst2, passages, and the two shuffled together (mix)."""
    sizes, wanted = args.sizes, args.setups
    sentences = sst2_sentences(args.data)
    texts = passages(args.data, max(sizes["passages"], sizes["mix"][1]), sizes["passage_tokens"])
    mixed = sentences[:sizes["mix"][0]] + texts[:sizes["mix"][1]]
    random.Random(0).shuffle(mixed)
    out = {"sst2": sentences[:sizes["sst2"]], "passages": texts[:sizes["passages"]], "mix": mixed}
    return {name: out[name] for name in BATCH_SIZES if name in wanted}


def stsb_pairs(data: Path) -> tuple[list[str], list[str], list[float]]:
    """STS-B dev: first sentences, second sentences and gold scores (columns named in the header)."""
    path = data / "stsb" / "dev.tsv"
    if not path.is_file():
        raise SystemExit(f"{path}: absent (set ENCODERLAB_DATA to the shared data folder)")
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    first, second, score = (header.index(c) for c in ("sentence1", "sentence2", "score"))
    return [r[first] for r in rows], [r[second] for r in rows], [float(r[score]) for r in rows]


def padding(folder: Path, texts: list[str], batch_size: int) -> dict[str, Any]:
    """Real tokens, and padded positions / all positions of encoderlab's length-sorted batches and of file order."""
    lengths = [int(n) for n in Tokenizer.from_pretrained(folder).encode_batch(texts).attention_mask.sum(1)]

    def fraction(batches: list[list[int]]) -> float:
        positions = sum(len(b) * max(lengths[i] for i in b) for b in batches)
        return round(1 - sum(lengths) / positions, 4)

    file_order = [list(range(s, min(s + batch_size, len(texts)))) for s in range(0, len(texts), batch_size)]
    return {"texts": len(texts), "batch_size": batch_size, "real_tokens": sum(lengths),
            "padding_fraction": fraction(sorted_batches(lengths, batch_size)),
            "padding_fraction_file_order": fraction(file_order)}


# ---- measuring ---------------------------------------------------------------------------------------------
def row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of a with the same row of b: (N, D), (N, D) -> (N,)."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def load(names: list[str], setting: engines.Setting, catalog: dict[str, Callable],
         skipped: dict[str, str]) -> tuple[dict[str, engines.Embedder], dict[str, float]]:
    """The engines of `names` that load, and the seconds each took (conversion and compiling included); the
    others' reasons go into `skipped`."""
    runs, seconds = {}, {}
    for name in names:
        started = time.perf_counter()
        try:
            runs[name] = catalog[name](setting)
        except engines.Skipped as err:
            skipped[name] = str(err)
            print(f"  {name}: skipped ({err})", file=sys.stderr)
            continue
        seconds[name] = round(time.perf_counter() - started, 1)
    return runs, seconds


def measure(runs: dict[str, engines.Embedder], texts: list[str], batch_size: int,
            rounds: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Best seconds of each engine over interleaved rounds (after one warm-up on a few texts), and its vectors."""
    best = {name: float("inf") for name in runs}
    vectors = {}
    for run in runs.values():
        run(texts[:8], batch_size)
    for _ in range(rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            vectors[name] = run(texts, batch_size)
            best[name] = min(best[name], time.perf_counter() - started)
    return best, vectors


def flops(folder: Path, texts: list[str]) -> float:
    """Matmul FLOPs of the real tokens: 2 x (layer weights) per token, plus QK^T and PV per layer."""
    config = EncoderConfig.from_json(folder / "config.json")
    lengths = [int(n) for n in Tokenizer.from_pretrained(folder).encode_batch(texts).attention_mask.sum(1)]
    H, I, L = config.hidden_size, config.intermediate_size, config.num_layers
    per_token = 2 * L * (4 * H * H + 2 * H * I)
    return float(sum(per_token * n + 2 * 2 * L * H * n * n for n in lengths))


def int8_peak(n: int = 2048, reps: int = 5) -> float:
    """Best op/s of a square int8 matmul (torch._int_mm, int32 accumulate; see peak_rate)."""

    def product(size: int) -> Callable[[], object]:
        a = torch.randint(-127, 128, (size, size), dtype=torch.int8)
        return lambda: torch._int_mm(a, a)

    return peak_rate(product, n, reps)


def peaks(smoke: bool) -> dict[str, float]:
    """Matmul peaks (FLOP/s) at the current torch threads: fp32, bf16 where the CPU has it, int8 where encoderlab's
    int8 runs on torch._int_mm (VNNI/AMX; fbgemm's AVX2 kernel takes no plain int8 matmul to time)."""
    size = 256 if smoke else 2048
    out = {"fp32": matmul_peak(torch.float32, size)}
    if precisions.bf16_supported():
        out["bf16"] = matmul_peak(torch.bfloat16, size)
    return out | ({"int8": int8_peak(size)} if precisions.int8_kernel() == "int_mm" else {})


def workload_figures(seconds: dict[str, float], vectors: dict[str, np.ndarray], work: float,
                     fp32_peak: float) -> dict[str, Any]:
    """texts/s of each engine, its ratio to transformers-fp32, cosine to it, GFLOP/s (encoderlab fp32: of peak)."""
    texts, reference = len(vectors[BASELINE]), vectors[BASELINE]
    out = {}
    for name, took in seconds.items():
        cosine = row_cosine(vectors[name], reference)
        out[name] = {"texts_per_s": round(texts / took, 1), "seconds": round(took, 3),
                     "vs_transformers": round(seconds[BASELINE] / took, 2),
                     "cosine_to_transformers_mean": round(float(cosine.mean()), 5),
                     "cosine_to_transformers_min": round(float(cosine.min()), 5),
                     "gflops": round(work / took / 1e9, 1)}
        if name.startswith("encoderlab-fp32"):
            out[name]["fraction_of_fp32_peak"] = round(work / took / fp32_peak, 3)
        print(f"  {name:<32} {texts / took:8.1f} texts/s  x{seconds[BASELINE] / took:5.2f}  "
              f"cos {cosine.mean():.4f} min {cosine.min():.4f}", file=sys.stderr)
    return out


def accuracy(runs: dict[str, engines.Embedder], data: Path, pairs: int | None) -> dict[str, Any]:
    """STS-B dev Spearman (x100) of each engine's cosine similarities, its points below transformers-fp32, and
    the cosine of its vectors to transformers-fp32's on the same sentences."""
    from scipy.stats import spearmanr

    first, second, gold = (column[:pairs] for column in stsb_pairs(data))
    print(f"== accuracy: STS-B dev, {len(gold)} pairs", file=sys.stderr)
    vectors, spearman = {}, {}
    for name, run in runs.items():
        a, b = run(first, 32), run(second, 32)
        vectors[name], spearman[name] = np.concatenate([a, b]), 100 * float(spearmanr(row_cosine(a, b), gold)[0])
    out = {}
    for name, v in vectors.items():
        cosine = row_cosine(v, vectors[BASELINE])
        out[name] = {"stsb_spearman": round(spearman[name], 2),
                     "points_below_transformers": round(spearman[BASELINE] - spearman[name], 2),
                     "cosine_to_transformers_mean": round(float(cosine.mean()), 5),
                     "cosine_to_transformers_min": round(float(cosine.min()), 5)}
        print(f"  {name:<32} Spearman {spearman[name]:.2f}  cos {cosine.mean():.5f} min {cosine.min():.5f}",
              file=sys.stderr)
    return {"pairs": len(gold), "sentences": 2 * len(gold), "engines": out}


def at_threads(threads: int, texts: dict[str, list[str]], args: argparse.Namespace,
               figures: dict[str, Any]) -> dict[str, engines.Embedder]:
    """Every engine at `threads` on every workload, into figures["speed"][f"threads_{threads}"]; the engines."""
    torch.set_num_threads(threads)
    torch._dynamo.reset()  # the other thread count's compiled code must not count against dynamo's recompile limit
    key = f"threads_{threads}"
    peak = peaks(args.smoke)
    figures["matmul_peak_gflops"][key] = {k: round(v / 1e9, 1) for k, v in peak.items()}
    print(f"== {threads} thread(s): loading {len(args.engines)} engines", file=sys.stderr)
    setting = engines.Setting(args.model, args.work, threads, args.calibration, user_cache=args.quick)
    runs, figures["load_seconds"][key] = load(args.engines, setting, args.catalog, figures["skipped"])
    figures["speed"][key] = {}
    for workload, batch in texts.items():
        print(f"== {workload}, {threads} thread(s): {len(batch)} texts, batch {BATCH_SIZES[workload]}",
              file=sys.stderr)
        seconds, vectors = measure(runs, batch, BATCH_SIZES[workload], args.rounds)
        figures["speed"][key][workload] = workload_figures(seconds, vectors, args.flops[workload], peak["fp32"])
    return runs


# ---- goals -------------------------------------------------------------------------------------------------
def accurate(name: str, accuracy_figures: dict[str, Any]) -> bool:
    """Whether an engine keeps mean cosine >= 0.99 to transformers-fp32 and loses at most 1 STS-B point (True
    where accuracy was not measured)."""
    got = accuracy_figures.get("engines", {}).get(name)
    return got is None or (got["cosine_to_transformers_mean"] >= 0.99 and got["points_below_transformers"] <= 1.0)


def speed_goals(where: str, runs: dict[str, dict[str, Any]], accuracy_figures: dict[str, Any]) -> list[dict]:
    """One workload at one thread count: best accurate encoderlab mode vs the fastest other engine (and vs
    sentence-transformers where the CPU has VNNI), int8 vs fp32, and fp32 against the matmul peak."""
    speed = {name: got["texts_per_s"] for name, got in runs.items()}
    ours = {n: v for n, v in speed.items() if n.startswith("encoderlab-") and accurate(n, accuracy_figures)}
    others = {n: v for n, v in speed.items() if not n.startswith("encoderlab-")}
    goals = []
    if ours and others:
        best, fastest = max(ours, key=ours.get), max(others, key=others.get)
        goals.append(goal(f"{where}: best encoderlab mode ({best}) vs the fastest other engine ({fastest}), texts/s",
                          ours[best] / others[fastest], 1.0))
        if precisions.cpu_flags() & precisions.VNNI_FLAGS and "sentence-transformers" in speed:
            goals.append(goal(f"{where}: best encoderlab mode ({best}) vs sentence-transformers (VNNI CPU)",
                              ours[best] / speed["sentence-transformers"], 3.0))
    if "encoderlab-int8" in speed and "encoderlab-fp32" in speed:
        goals.append(goal(f"{where}: encoderlab --precision int8 vs fp32, texts/s",
                          speed["encoderlab-int8"] / speed["encoderlab-fp32"], 1.3))
    fp32 = [got["fraction_of_fp32_peak"] for name, got in runs.items() if "fraction_of_fp32_peak" in got]
    if fp32:
        goals.append(goal(f"{where}: encoderlab fp32 (best of eager, compiled) GFLOP/s / fp32 matmul peak",
                          max(fp32), 0.85))
    return goals


def all_goals(figures: dict[str, Any], args: argparse.Namespace, seconds: float) -> list[dict[str, Any]]:
    """The issue's measured goals from this run's figures."""
    goals, accuracy_figures = [], figures.get("accuracy", {})
    for threads, workloads_run in figures["speed"].items():
        for workload, runs in workloads_run.items():
            goals += speed_goals(f"{workload}, {threads.split('_')[1]} thread(s)", runs, accuracy_figures)
    for workload, got in figures["workloads"].items():  # issue 18, item 4: batches should not pay for padding
        goals.append({"what": f"{workload}: padded positions / all positions in encoderlab's batches",
                      "value": got["padding_fraction"], "target": "<= 0.05",
                      "met": bool(got["padding_fraction"] <= 0.05)})
    for name, got in accuracy_figures.get("engines", {}).items():
        if name.startswith("encoderlab-") and name != "encoderlab-fp32":
            goals.append(goal(f"{name}: mean cosine to transformers-fp32 on STS-B dev sentences",
                              got["cosine_to_transformers_mean"], 0.99))
            goals.append({"what": f"{name}: STS-B dev Spearman points below transformers-fp32",
                          "value": got["points_below_transformers"], "target": "<= 1.0",
                          "met": bool(got["points_below_transformers"] <= 1.0)})
    if args.quick:
        goals.append({"what": "bench/inference.py --quick wall-clock seconds (process start to results)",
                      "value": round(seconds, 1), "target": "<= 60", "met": bool(seconds <= 60)})
    return goals


# ---- main -------------------------------------------------------------------------------------------------
def process_seconds(fallback: float) -> float:
    """Wall-clock seconds since this process started (Linux /proc; elsewhere since `fallback`, a perf_counter)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - fallback


def options() -> argparse.Namespace:
    """The command line, with its sizes, thread counts and engine names resolved."""
    parser = common.parser(__doc__, quick="all cores only, small subsets, one round, no compile: under a minute")
    parser.add_argument("--threads", help="thread counts, comma-separated, 'all' for every core (default: 1,all)")
    parser.add_argument("--rounds", type=int, help="timed rounds per engine; the best counts (default: 3)")
    parser.add_argument("--setups", default="sst2,passages,mix,accuracy",
                        help="comma-separated: sst2, passages, mix, accuracy (STS-B dev)")
    parser.add_argument("--engines", default="", help="engines to run, comma-separated (default: every one "
                        f"installed; {BASELINE} always runs, the baseline)")
    parser.add_argument("--compiled", default=None,
                        help="encoderlab precisions also run with compile=True, comma-separated (default: int8 where "
                             "int8 runs on torch._int_mm, VNNI/AMX, fp32,int8, else none; see COMPILED)")
    args = parser.parse_args()
    args.sizes = SIZES[common.size(args)]
    args.rounds = args.rounds or args.sizes["rounds"]
    args.setups = args.setups.split(",")
    threads = (args.threads or args.sizes["threads"]).replace("all", str(os.cpu_count() or 1))
    args.threads = sorted({int(t) for t in threads.split(",")})
    compiled = COMPILED if args.compiled is None else [m for m in args.compiled.split(",") if m]
    compiled = [] if args.quick or args.smoke else compiled
    args.catalog = engines.catalog(precisions.supported(), compiled)
    wanted = set(args.engines.split(",")) | {BASELINE} if args.engines else set(args.catalog)
    unknown = wanted - set(args.catalog)
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(args.catalog)}")
    args.engines = [n for n in args.catalog if n in wanted and n not in args.sizes["drop"]]
    return args


def main() -> None:
    started = time.perf_counter()
    args = options()
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) < max(args.threads):  # CTranslate2's OpenMP pool may follow it, not intra_threads
        print(f"note: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} is set; unset it for the thread counts "
              f"{args.threads} to hold for every engine", file=sys.stderr)
    figures: dict[str, Any] = {"threads": args.threads, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                               "rounds": args.rounds, "matmul_peak_gflops": {},
                               "int8_kernel": precisions.int8_kernel(), "engines": args.engines,
                               "left_out": {n: f"--{common.size(args)} leaves it out" for n in args.sizes["drop"]},
                               "skipped": {}, "load_seconds": {}, "workloads": {}, "speed": {}}
    with tempfile.TemporaryDirectory(prefix="encoderlab-inference-") as work:
        args.work = Path(work)
        args.data = smoke_data(args.work / "data") if args.smoke else DATA
        args.model = tiny_model(args.work / "tiny") if args.smoke else resolve_model_path("minilm")
        args.calibration = tuple(sst2_sentences(args.data, "train")[:args.sizes["calibration"]])
        texts = workloads(args)
        args.flops = {name: flops(args.model, batch) for name, batch in texts.items()}
        figures["workloads"] = {name: padding(args.model, batch, BATCH_SIZES[name]) for name, batch in texts.items()}
        for threads in args.threads:
            runs = at_threads(threads, texts, args, figures)
        if "accuracy" in args.setups:  # at the last (largest) thread count, with its engines
            figures["accuracy"] = accuracy(runs, args.data, args.sizes["pairs"])
    figures["wall_seconds"] = round(process_seconds(started), 1)
    path = write_results(args, "inference", figures, all_goals(figures, args, figures["wall_seconds"]))
    print(f"wrote {path} ({figures['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
