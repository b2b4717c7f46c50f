"""Reliability report: bad input through the CLI, SIGKILLed training runs resumed, a server under load and abuse.

Everything here is run, not read from test results:
  - bad inputs: every case of the table in tests/test_bad_input.py goes through `encoderlab.cli.main`
    in-process, against tiny checkpoint folders written by encoderlab itself; a case is handled when it exits
    with its expected code and one `error: ...` line on stderr, no traceback.
  - crashes: `encoderlab pretrain` (a tiny recipe) and `encoderlab finetune classify` (a tiny model) run in
    subprocesses and get SIGKILL at seeded random steps; after each kill the latest checkpoint must load, then
    --resume goes on; the final weights must equal an uninterrupted run's bit for bit.
  - server: `encoderlab serve --model minilm` (its own process, loopback, one torch thread) gets N concurrent
    clients for S seconds, a share of whose requests are abusive (malformed JSON, oversize, empty texts...)
    and must get their 4xx, while slow clients trickle bodies a byte at a time; every /embed answer is checked
    against the Embed pipeline run here.

    python bench/reliability.py            # 64 clients for 60 s; 3 kills per command
    python bench/reliability.py --quick    # 16 clients for 5 s; 1 kill of shorter runs; every 4th bad input
    python bench/reliability.py --smoke    # 2 clients for 1 s on a tiny model; 1 kill of shorter runs (make test)
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import random
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import goal, tiny_model, write_results  # noqa: E402
from serve_load import peak_rss_mib, sentences, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
SEED = 0


# ---- bad inputs ------------------------------------------------------------------------------------------------
def bad_input_folders(root: Path) -> Any:
    """The checkpoint folders the bad-input table runs against, written by encoderlab (the test has HF write them)."""
    from test_bad_input import TAGS, WORDS, Folders

    from encoderlab import (EncoderConfig, EncoderModel, MaskedLMModel, SequenceClassifier, SpanExtractor,
                            TokenClassifier, save_pretrained)
    from encoderlab.tokenizer import Tokenizer

    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=4, intermediate_size=37, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {"base": EncoderModel(config), "mlm": MaskedLMModel(config),
              "classify": SequenceClassifier(config.replace(labels=["neg", "pos"]), num_labels=2),
              "ner": TokenClassifier(config.replace(labels=TAGS), num_labels=len(TAGS)),
              "qa": SpanExtractor(config)}
    for name, model in models.items():
        save_pretrained(model.eval(), root / name, tokenizer)
    return Folders(**{name: root / name for name in models})


def run_case(make: Any, folders: Any, tmp: Path) -> tuple[int | None, str, list[str]]:
    """(exit code or None if an exception escaped, stderr, the fragments it should name) of one case."""
    from encoderlab.cli import main

    argv, fragments = make(tmp, folders)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 2
        except Exception as escaped:  # noqa: BLE001 -- the point is to count whatever escapes
            return None, f"{type(escaped).__name__}: {escaped}", fragments
    return code, err.getvalue(), fragments


def bad_inputs(every: int = 1) -> dict[str, Any]:
    """Run every case (every `every`-th in name order) of tests/test_bad_input.py's table; count the handled ones."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_bad_input import CASES, XFAIL

    started = time.perf_counter()
    handled, named, failures, vague = 0, 0, [], []
    with tempfile.TemporaryDirectory() as root:
        folders = bad_input_folders(Path(root))
        cases = sorted(CASES.items())[::every]
        for name, (make, expected) in cases:
            tmp = Path(root) / "cases" / name
            tmp.mkdir(parents=True)
            code, err, fragments = run_case(make, folders, tmp)
            one_line = err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
            handled += code == expected and one_line
            if not (code == expected and one_line):
                failures.append(f"{name}: exit {code}, stderr {err[-300:]!r}")
            elif all(f in err for f in fragments):
                named += 1
            else:
                vague.append(f"{name}: {err.strip()[:300]}")
    return {"cases": len(cases), "handled": handled, "handled_and_naming_the_fault": named,
            "unhandled": failures, "handled_without_naming_the_fault": vague, "known_failures_in_the_test_table": sorted(XFAIL),
            "seconds": round(time.perf_counter() - started, 1)}


# ---- crashes and resumes ---------------------------------------------------------------------------------------
CORPUS_WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "house", "river", "city",
                "paris", "france", "capital", "king", "queen"]
RECIPE = {"preset": "bert-tiny", "max_length": 32, "batch_size": 8, "warmup_steps": 2, "lr": 0.003,
          "precision": "fp32", "log_every": 1, "eval_every": 0, "eval_batches": 1, "save_every": 1,
          "keep_checkpoints": 2, "max_steps": 40,
          "model": {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "num_layers": 2,
                    "max_position_embeddings": 64, "hidden_dropout": 0.0, "attention_dropout": 0.0}}
POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "dire"]
FILLER = ["the", "movie", "was", "a", "film", "plot", "very", "quite", "and", "it"]


def pretrain_argv(root: Path, steps: int) -> tuple[list[str], int]:
    """`encoderlab pretrain` arguments over a tiny prepared corpus (`steps` steps, a checkpoint each), and `steps`."""
    from encoderlab.data.prepare import prepare
    from encoderlab.tokenizer import Tokenizer

    rng = random.Random(SEED)
    docs = ["\n".join(" ".join(rng.choices(CORPUS_WORDS, k=rng.randint(4, 12))).capitalize() + "."
                      for _ in range(rng.randint(3, 8))) for _ in range(30)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    Tokenizer.train("wordpiece", [root / "corpus.txt"], vocab_size=100).save(root / "tokenizer")
    prepare([str(root / "corpus.txt")], root / "tokenizer", root / "data", holdout=0.1, workers=1)
    recipe = {"data": str(root / "data"), **RECIPE, "max_steps": steps}
    (root / "tiny.yaml").write_text(json.dumps(recipe), encoding="utf-8")
    return ["pretrain", "--config", str(root / "tiny.yaml")], steps


def finetune_argv(root: Path, train_rows: int) -> tuple[list[str], int]:
    """`encoderlab finetune classify` arguments for a tiny random model on synthetic sentiment (3 epochs of batches
    of 8), and its steps."""
    from encoderlab import EncoderConfig, EncoderModel, save_pretrained
    from encoderlab.tokenizer import Tokenizer

    words = POSITIVE + NEGATIVE + FILLER
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(words)] * 3, vocab_size=80, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(SEED)
    save_pretrained(EncoderModel(config), root / "model")
    tokenizer.save(root / "model")
    rng = random.Random(SEED)
    for name, count in (("train", train_rows), ("dev", 32)):
        rows = []
        for i in range(count):
            words = rng.choices(FILLER, k=rng.randint(3, 6)) + [rng.choice(POSITIVE if i % 2 else NEGATIVE)]
            rows.append(f"{' '.join(rng.sample(words, len(words)))}\t{'pos' if i % 2 else 'neg'}\n")
        (root / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(rows), encoding="utf-8")
    return ["finetune", "classify", "--model", str(root / "model"), "--train", str(root / "train.tsv"),
            "--eval", str(root / "dev.tsv"), "--lr", "3e-3", "--epochs", "3", "--batch-size", "8",
            "--threads", "1", "--no-progress", "--save-every", "2"], 3 * -(-train_rows // 8)


def spawn(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "encoderlab", *argv], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def latest_step(run: Path) -> int:
    """The step of the checkpoint `latest` names (0 when there is none yet)."""
    pointer = run / "checkpoints" / "latest"
    try:
        return int(pointer.read_text().strip().removeprefix("step-"))
    except (OSError, ValueError):
        return 0


def checkpoint_loads(run: Path) -> bool:
    """Whether the checkpoint `latest` names loads in full: config, weights and a trainer state of its step."""
    from encoderlab.train.state import STATE_FILE

    try:
        folder = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
        json.loads((folder / "config.json").read_text(encoding="utf-8"))
        assert load_file(folder / "model.safetensors")
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
        return state["step"] == int(folder.name.removeprefix("step-"))
    except Exception:  # noqa: BLE001 -- any failure to load is what is counted
        return False


def final_weights(run: Path, command: str) -> dict[str, torch.Tensor]:
    return load_file(run / ("model" if command == "pretrain" else ".") / "model.safetensors")


def identical(run: Path, reference: Path, command: str) -> bool:
    a, b = final_weights(run, command), final_weights(reference, command)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def kill_and_resume(argv: list[str], run: Path, kill_steps: list[int]) -> dict[str, Any]:
    """SIGKILL the command once it has saved each of `kill_steps` (plus a random few ms), check, resume."""
    rng = random.Random(SEED)
    kills, loadable, missed = 0, 0, 0
    process = spawn([*argv, "--out", str(run)])
    for step in kill_steps:
        while process.poll() is None and latest_step(run) < step:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.05))  # into the next step or its checkpoint write
        if process.poll() is not None:  # it finished first: no kill to count
            missed += 1
            break
        process.kill()
        process.communicate(timeout=60)
        kills += 1
        loadable += checkpoint_loads(run)
        process = spawn([*argv, "--out", str(run), "--resume"])
    _, err = process.communicate(timeout=600)
    return {"kills": kills, "loadable": loadable, "missed": missed, "resumed_to_the_end": process.returncode == 0,
            "stderr_tail": err[-500:] if process.returncode else ""}


def reference_run(command: str, argv: list[str], out: Path) -> None:
    """The uninterrupted run, in this process: one torch thread as in the killed ones, so the same bits (as
    tests/test_crash.py's references), without a second interpreter's imports (~6 CPU s of a --smoke run)."""
    from encoderlab.cli import main as cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli([*argv, "--out", str(out)])
    if code:
        raise SystemExit(f"{command} reference run failed: {err.getvalue()[-2000:]}")


def crashes(kills_per_command: int, size: str) -> dict[str, Any]:
    """Kill-and-resume runs of pretrain and finetune (shorter for --quick and --smoke) against uninterrupted
    references."""
    started = time.perf_counter()
    rng = random.Random(SEED)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for command, make, length in (("pretrain", pretrain_argv, {"smoke": 8, "quick": 16, "full": 40}[size]),
                                      ("finetune", finetune_argv, {"smoke": 16, "quick": 48, "full": 160}[size])):
            root = Path(tmp) / command
            root.mkdir()
            argv, steps = make(root, length)
            reference_run(command, argv, root / "reference")
            kill_steps = sorted(rng.sample(range(2, steps - 2), kills_per_command))
            result = kill_and_resume(argv, root / "run", kill_steps)
            result |= {"kill_steps": kill_steps,
                       "identical_to_uninterrupted": result["resumed_to_the_end"]
                       and identical(root / "run", root / "reference", command)}
            figures[command] = result
    figures["seconds"] = round(time.perf_counter() - started, 1)
    return figures


# ---- server under load and abuse -------------------------------------------------------------------------------
ABUSE: list[tuple[str, bytes, int]] = [  # (what, body, the status it must get)
    ("malformed JSON", b'{"texts": ["a cat", ', 422),
    ("not JSON at all", b"hello", 422),
    ("empty body", b"", 422),
    ("empty texts", b'{"texts": []}', 422),
    ("blank text", b'{"texts": ["a cat", "   "]}', 422),
    ("wrong field", b'{"text": ["a cat"]}', 422),
    ("too many texts", json.dumps({"texts": ["x"] * 65}).encode(), 422),
    ("not UTF-8", b'{"texts": ["caf\xe9"]}', 422),
    ("nested 100000 deep", b"[" * 100_000, 422),
    ("oversize body", json.dumps({"texts": ["word " * 1000] * 300}).encode(), 413),
]


class Tally:
    """What the clients saw."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.abuse_latencies: list[float] = []
        self.normal = self.served = self.abusive = self.refused_as_expected = 0
        self.errors: list[str] = []


async def normal_request(http: httpx.AsyncClient, batch: list[str], expected: dict[str, np.ndarray],
                         tally: Tally) -> None:
    """One /embed request; an error unless 200 with vectors equal to the pipeline's."""
    started = time.perf_counter()
    tally.normal += 1
    try:
        response = await http.post("/embed", json={"texts": batch})
        vectors = [r["embedding"] for r in response.json()["results"]] if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError) as err:
        tally.errors.append(f"{type(err).__name__}: {err}")
        return
    tally.latencies.append(time.perf_counter() - started)
    if response.status_code != 200:
        tally.errors.append(f"{response.status_code}: {response.text[:200]}")
    elif len(vectors) != len(batch) or not all(np.allclose(v, expected[t], atol=1e-4) for v, t in zip(vectors, batch)):
        tally.errors.append(f"wrong answer for {batch[:2]}")
    else:
        tally.served += 1


async def abusive_request(http: httpx.AsyncClient, what: str, body: bytes, status: int, tally: Tally) -> None:
    """One abusive request; an error unless it gets `status`."""
    started = time.perf_counter()
    tally.abusive += 1
    try:
        response = await http.post("/embed", content=body, headers={"content-type": "application/json"})
    except httpx.HTTPError as err:
        tally.errors.append(f"{what}: {type(err).__name__}: {err}")
        return
    tally.abuse_latencies.append(time.perf_counter() - started)
    if response.status_code == status:
        tally.refused_as_expected += 1
    else:
        tally.errors.append(f"{what}: {response.status_code} (expected {status}): {response.text[:200]}")


async def client(http: httpx.AsyncClient, n: int, texts: list[str], expected: dict[str, np.ndarray],
                 abuse_share: float, until: float, tally: Tally) -> None:
    """Requests one after another until `until`: abusive with probability `abuse_share`, else 1-8 texts."""
    rng = random.Random(SEED + n)
    while time.perf_counter() < until:
        if rng.random() < abuse_share:
            await abusive_request(http, *rng.choice(ABUSE), tally)
        else:
            await normal_request(http, rng.sample(texts, rng.randint(1, 8)), expected, tally)


def rss_mib(pid: int) -> float:
    """The process's resident set now (VmRSS) in MiB."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return round(int(line.split()[1]) / 1024, 1)


async def watch(http: httpx.AsyncClient, pid: int, done: asyncio.Event, samples: dict[str, list[float]]) -> None:
    """Every half second: /health's latency and the server's RSS."""
    while not done.is_set():
        started = time.perf_counter()
        try:
            ok = (await http.get("/health", timeout=10)).status_code == 200
        except httpx.HTTPError:
            ok = False
        samples["health_s"].append(time.perf_counter() - started if ok else float("inf"))
        samples["rss_mib"].append(rss_mib(pid))
        await asyncio.sleep(0.5)


def slow_clients(url: str, count: int, stop: threading.Event, answers: list[bytes]) -> list[threading.Thread]:
    """`count` sockets that send the headers of a 10 kB body, then one byte of it every 0.2 s; each one's
    status line, if the server answers (408 after --body-timeout-s), goes to `answers`."""
    host, port = url.removeprefix("http://").split(":")

    def trickle() -> None:
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"POST /embed HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                         f"content-length: 10000\r\n\r\n".encode())
            with contextlib.suppress(OSError):
                while not stop.wait(0.2):
                    if select.select([sock], [], [], 0)[0]:
                        answers.append(sock.recv(4096).split(b"\r\n")[0])
                        return
                    sock.sendall(b" ")

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


async def load(url: str, pid: int, texts: list[str], expected: dict[str, np.ndarray], clients: int, seconds: float,
               abuse_share: float) -> dict[str, Any]:
    """N clients for S seconds (after a warm-up), with slow clients and the watcher alongside."""
    tally, samples = Tally(), {"health_s": [], "rss_mib": []}
    limits = httpx.Limits(max_connections=clients + 1, max_keepalive_connections=clients + 1)
    stop = threading.Event()
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        warm, rng = Tally(), random.Random(SEED)
        for _ in range(3):  # warm-up at full micro-batch size: first-call and largest-batch allocations are not growth
            await asyncio.gather(*(normal_request(http, rng.sample(texts, 8), expected, warm) for _ in range(clients)))
        rss_after_warmup = rss_mib(pid)
        slow_answers: list[bytes] = []
        slow = slow_clients(url, 4, stop, slow_answers)
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(http, pid, done, samples))
        started = time.perf_counter()
        await asyncio.gather(*(client(http, n, texts, expected, abuse_share, started + seconds, tally)
                               for n in range(clients)))
        wall = time.perf_counter() - started
        done.set()
        await watcher
        stop.set()
        for thread in slow:
            thread.join(5)
    return {"tally": tally, "wall_s": wall, "slow_answers": [a.decode(errors="replace") for a in slow_answers],
            "rss_after_warmup": rss_after_warmup, "rss_end": rss_mib(pid),
            "samples": samples}


def percentiles_ms(values: list[float]) -> dict[str, float | None]:
    if len(values) < 2:
        return {"p50": None, "p99": None, "max": None}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49] * 1e3, 1), "p99": round(cuts[98] * 1e3, 1), "max": round(max(values) * 1e3, 1)}


def server(clients: int, seconds: float, abuse_share: float, model: str) -> dict[str, Any]:
    """Start `encoderlab serve --model MODEL` and run the load against it."""
    from encoderlab.infer.pipelines import pipeline

    pool, source = sentences()
    texts = random.Random(SEED).sample(pool, 64)
    expected = dict(zip(texts, pipeline("embed", model).embed(texts)))  # the reference every answer must equal
    process, port = start_server(threads=1, max_batch=64, model=model)
    try:
        result = asyncio.run(load(f"http://127.0.0.1:{port}", process.pid, texts, expected, clients, seconds,
                                  abuse_share))
        peak = peak_rss_mib(process.pid)
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
    finally:
        process.terminate()
        process.wait(30)
    tally, samples = result["tally"], result["samples"]
    mid_run_rss = samples["rss_mib"][len(samples["rss_mib"]) // 2]
    requests = tally.normal + tally.abusive
    return {"clients": clients, "seconds": round(result["wall_s"], 1), "abusive_share": abuse_share,
            "slow_clients": 4, "slow_clients_answered": result["slow_answers"], "data": source, "requests": requests, "served": tally.served,
            "abusive": tally.abusive, "abusive_refused_as_expected": tally.refused_as_expected,
            "errors": len(tally.errors), "first_errors": tally.errors[:5],
            "requests_per_s": round(requests / result["wall_s"], 1),
            "latency_ms": percentiles_ms(tally.latencies), "abusive_latency_ms": percentiles_ms(tally.abuse_latencies),
            "health_latency_ms_max": round(max(samples["health_s"], default=0) * 1e3, 1),
            "server_peak_rss_mib": peak, "server_rss_mib_after_warmup": result["rss_after_warmup"],
            "server_rss_mib_end": result["rss_end"], "server_rss_mib_max_sampled": max(samples["rss_mib"], default=None),
            "server_rss_growth_mib": round(result["rss_end"] - result["rss_after_warmup"], 1),
            "server_rss_growth_mib_second_half": round(result["rss_end"] - mid_run_rss, 1),
            "server_forward_batches": health["stats"]["embed"]["batches"]}


# ---- the report ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = common.parser(__doc__, quick="16 clients for 5 s, 1 kill of shorter runs, every 4th bad input")
    parser.add_argument("--clients", type=int, help="concurrent clients (default: 64; --quick 16; --smoke 2)")
    parser.add_argument("--seconds", type=float, help="how long the clients send (default: 60; --quick 5; --smoke 1)")
    parser.add_argument("--kills", type=int, help="SIGKILLs per command (default: 3; --quick and --smoke 1)")
    parser.add_argument("--abuse-share", type=float, default=0.1, help="fraction of abusive requests (default: 0.1)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the other core is the server's (or a background job's)
    size = common.size(args)
    clients = args.clients or {"smoke": 2, "quick": 16, "full": 64}[size]
    seconds = args.seconds or {"smoke": 1, "quick": 5, "full": 60}[size]
    load_before = os.getloadavg()
    figures = {"bad_inputs": bad_inputs({"smoke": 16, "quick": 4, "full": 1}[size])}  # tests run every case
    print("bad inputs:", json.dumps({k: v for k, v in figures["bad_inputs"].items() if k != "unhandled"}))
    figures["crashes"] = crashes(args.kills or {"smoke": 1, "quick": 1, "full": 3}[size], size)
    print("crashes:", json.dumps(figures["crashes"]))
    with tempfile.TemporaryDirectory(prefix="encoderlab-reliability-") as work:
        model = str(tiny_model(Path(work) / "tiny")) if args.smoke else "minilm"
        figures["server"] = server(clients, seconds, args.abuse_share, model)
    print("server:", json.dumps(figures["server"]))
    figures["load_average_1_5_15_min_before"] = [round(v, 2) for v in load_before]
    figures["load_average_1_5_15_min_after"] = [round(v, 2) for v in os.getloadavg()]
    report(figures, args, clients, seconds)


def report(figures: dict[str, Any], args: Namespace, clients: int, seconds: float) -> None:
    """The goals; write bench/results/reliability.json (reliability_quick.json with --quick)."""
    bad, runs, served = figures["bad_inputs"], [figures["crashes"][c] for c in ("pretrain", "finetune")], figures["server"]
    kills = sum(r["kills"] for r in runs)
    goals = [
        goal("fraction of bad CLI inputs handled (expected exit code, one 'error:' line, no traceback)",
             bad["handled"] / bad["cases"], 1.0),
        goal("fraction of SIGKILLs that left a loadable latest checkpoint", sum(r["loadable"] for r in runs)
             / max(kills, 1), 1.0),
        goal("fraction of killed runs whose resume ends bit-identical to an uninterrupted run",
             sum(r["identical_to_uninterrupted"] for r in runs) / len(runs), 1.0),
        goal(f"fraction of requests without an error (5xx, timeout, wrong answer or status) under {clients} clients "
             f"for {seconds:g} s", 1 - served["errors"] / max(served["requests"], 1), 1.0),
    ]
    path = write_results(args, "reliability", figures, goals)
    for line in goals:
        print(f"{'met' if line['met'] else 'NOT MET'}: {line['what']}: {line['value']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
