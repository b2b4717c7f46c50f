"""Load test of `encoderlab serve`: N concurrent clients post /embed requests, then OpenAI's /v1/embeddings on the same
texts, to a MiniLM server on loopback.

The server runs as its own process (`python -m encoderlab serve --model minilm`), so its peak RSS is its own
and the clients' CPU is not counted as its memory. Each client sends, one after another, batches of 1-8
SST-2 dev sentences (synthetic text when ../shared/data/sst2/dev.tsv is absent) for a fixed time, and every
answer is checked: status 200 and one vector per text. Latency is per request, as the client sees it. Each server
takes the load on /embed, then the same load (same seeds, same texts) on /v1/embeddings ({"input": texts,
"encoding_format": "float"}: the same JSON floats as /embed): the goals are 0 errors on both and /v1/embeddings at
0.95x /embed's texts/s or better.

Each server set-up in --servers gets the same load in turn, one server at a time. A set-up is ENGINE:PRECISION
(`serve --engine ENGINE --precision PRECISION`), with "+compile" for `serve --compile`; a bare PRECISION means
torch. By default fp32 on torch against auto:auto, the best mode as bench/inference.py defines it (`--engine auto
--precision auto`: measured at start-up, so the bench follows the machine); what auto picked is read from the
server's /health and recorded.

    python bench/serve_load.py            # 32 clients for 60 s a route, against torch:fp32 then auto:auto
    python bench/serve_load.py --quick    # 32 clients for 10 s a route against each: about two minutes
    python bench/serve_load.py --smoke    # 2 clients for 1 s against a tiny random model, torch fp32 then int8 (make test)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import goal, tiny_model, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SST2_DEV = ROOT / ".." / "shared" / "data" / "sst2" / "dev.tsv"
SEED = 0


def sentences() -> tuple[list[str], str]:
    """SST-2 dev sentences, or synthetic ones when the file is absent; plus where they came from."""
    if SST2_DEV.is_file():
        lines = SST2_DEV.read_text(encoding="utf-8").splitlines()[1:]
        return [line.split("\t")[0] for line in lines if line.strip()], f"sst2 dev {SST2_DEV.resolve()}"
    rng = random.Random(SEED)
    words = "the a movie film was is very quite good bad plot acting story long short funny dull and but".split()
    return [" ".join(rng.choices(words, k=rng.randint(4, 30))) for _ in range(872)], f"SYNTHETIC: {SST2_DEV} absent"


def start_server(threads: int, max_batch: int, options: tuple[str, ...] = (),
                 model: str = "minilm") -> tuple[subprocess.Popen, int]:
    """`encoderlab serve --model MODEL --tasks embed` (plus `options`) on a free loopback port in its own process;
    returns it and its port once /health answers. Only /embed is loaded: the load is /embed, and serve would
    otherwise load the default fill-mask model beside a model with no masked-LM head (minilm), adding to the start-up
    and memory measured. A port taken by another process between free_port() and serve binding it (a busy machine)
    is tried again with another port, up to PORT_TRIES times."""
    for _ in range(PORT_TRIES):
        port = free_port()
        process, log = launch(port, threads, max_batch, options, model)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log.seek(0)
                output = log.read()
                if "address already in use" in output.lower():
                    break  # another port
                raise SystemExit(f"serve exited {process.returncode}: {output[-2000:]}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).raise_for_status()
                return process, port
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            process.kill()
            raise SystemExit("serve did not answer /health within 120 s")
    raise SystemExit(f"serve found its port taken {PORT_TRIES} times")


def launch(port: int, threads: int, max_batch: int, options: tuple[str, ...], model: str):
    """The serve process on `port`, and the file its output goes to."""
    command = [sys.executable, "-m", "encoderlab", "serve", "--model", model, "--port", str(port),
               "--threads", str(threads), "--max-batch", str(max_batch), "--tasks", "embed", *options]
    # a file, not a pipe: an unread pipe fills up with access-log lines and blocks the server
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- it lives as long as the server
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"PYTHONPATH": str(ROOT / "src")})
    return process, log


def peak_rss_mib(pid: int) -> float | None:
    """The process's peak resident set (VmHWM) in MiB, from /proc (Linux); None elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


# route: (its body for a batch of texts, how many vectors its answer holds)
ROUTES = {"/embed": (lambda batch: {"texts": batch}, lambda answer: len(answer["results"])),
          "/v1/embeddings": (lambda batch: {"input": batch, "model": "minilm", "encoding_format": "float"},
                             lambda answer: len(answer["data"]))}


async def client(http: httpx.AsyncClient, route: str, texts: list[str], seed: int, until: float,
                 latencies: list[float], errors: list[str]) -> int:
    """Post batches of 1-8 texts to `route` until `until` (a perf_counter time); returns how many texts were sent."""
    rng, sent = random.Random(seed), 0
    body, count = ROUTES[route]
    while time.perf_counter() < until:
        batch = rng.sample(texts, rng.randint(1, 8))
        started = time.perf_counter()
        try:
            response = await http.post(route, json=body(batch))
            ok = response.status_code == 200 and count(response.json()) == len(batch)
            if not ok:
                errors.append(f"{response.status_code}: {response.text[:200]}")
        except httpx.HTTPError as err:
            errors.append(f"{type(err).__name__}: {err}")
        latencies.append(time.perf_counter() - started)
        sent += len(batch)
    return sent


async def load(url: str, route: str, texts: list[str], clients: int, seconds: float) -> dict[str, object]:
    """Run the clients on `route` for `seconds`; requests, texts, rates, latency percentiles and errors."""
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        for _ in range(3):  # warm-up: first-call costs are not the server's steady state
            await http.post(route, json=ROUTES[route][0](texts[:8]))
        started = time.perf_counter()
        sent = await asyncio.gather(*(client(http, route, texts, SEED + n, started + seconds, latencies, errors)
                                      for n in range(clients)))
        wall = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100)
    return {"clients": clients, "seconds": round(wall, 2), "requests": len(latencies), "texts": sum(sent),
            "requests_per_s": round(len(latencies) / wall, 1), "texts_per_s": round(sum(sent) / wall, 1),
            "latency_ms": {"p50": round(cuts[49] * 1e3, 1), "p90": round(cuts[89] * 1e3, 1),
                           "p99": round(cuts[98] * 1e3, 1), "max": round(max(latencies) * 1e3, 1)},
            "errors": len(errors), "first_errors": errors[:5]}


PORT_TRIES = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ENGINES = ("torch", "onnxruntime", "ctranslate2", "openvino", "auto")  # encoderlab.infer.backends.ENGINES
PRECISIONS = ("fp32", "bf16", "int8", "auto")
DEFAULT_SERVERS = "torch:fp32,auto:auto"
# --smoke's second server is torch int8, not auto: auto times every engine at start-up (OpenVINO's export among them,
# ~20 CPU s on 2 cores), which tests/test_engines_backend.py checks; the smoke shows the bench runs end to end.
SMOKE_SERVERS = "torch:fp32,torch:int8"


def serve_options(spec: str, cache: str) -> tuple[str, ...]:
    """`serve` options for a set-up such as "fp32", "int8+compile" or "auto:auto"; cache: --engine-cache."""
    setup, _, extra = spec.partition("+")
    engine, _, precision = setup.rpartition(":")
    engine = engine or "torch"
    if engine not in ENGINES or precision not in PRECISIONS or extra not in ("", "compile"):
        raise SystemExit(f"--servers: {spec!r} is not [ENGINE:]PRECISION[+compile] (engines: {', '.join(ENGINES)}; "
                         f"precisions: {', '.join(PRECISIONS)})")
    return (("--engine", engine, "--precision", precision) + (("--engine-cache", cache) if cache else ())
            + (("--compile",) if extra else ()))


def run_server(spec: str, texts: list[str], args: argparse.Namespace, seconds: float) -> dict[str, object]:
    """Start one server set-up, load it for `seconds`, stop it; its figures."""
    started = time.perf_counter()
    server, port = start_server(args.threads, args.max_batch, serve_options(spec, args.engine_cache), args.model)
    startup_s = time.perf_counter() - started
    try:
        routes = {route: asyncio.run(load(f"http://127.0.0.1:{port}", route, texts, args.clients, seconds))
                  for route in ROUTES}
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
        rss = peak_rss_mib(server.pid)
    finally:
        server.terminate()
        server.wait(30)
    stats = health["stats"]["embed"]  # both routes' batches: they share the embed batcher
    figures, openai = routes["/embed"], routes["/v1/embeddings"]
    openai["texts_per_s_against_embed"] = round(openai["texts_per_s"] / max(figures["texts_per_s"], 1e-9), 3)
    return figures | {"v1_embeddings": openai, "server_startup_s": round(startup_s, 1), "server_peak_rss_mib": rss,
                      "server_precision": health["precision"]["embed"],
                      "server_engine": health["engine"]["embed"], "server_requests": stats["requests"],
                      "server_forward_batches": stats["batches"],
                      "texts_per_forward_batch": round(stats["texts"] / max(stats["batches"], 1), 1)}


def main() -> None:
    parser = common.parser(__doc__, quick="10 s of load instead of 60 (under a minute in all)")
    parser.add_argument("--clients", type=int, help="concurrent clients (default: 32; 2 with --smoke)")
    parser.add_argument("--seconds", type=float,
                        help="how long the clients send (default: 60, or 10 with --quick, 1 with --smoke)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server (default: 1)")
    parser.add_argument("--max-batch", type=int, default=64, help="the server's --max-batch (default: 64)")
    parser.add_argument("--servers", help="comma-separated server set-ups, each [ENGINE:]PRECISION[+compile], e.g. "
                        f"torch:fp32, ctranslate2:int8, int8+compile (default: {DEFAULT_SERVERS}; --smoke "
                        f"{SMOKE_SERVERS})")
    parser.add_argument("--engine-cache", help="the servers' --engine-cache (default: serve's; a fresh folder with "
                        "--smoke)")
    args = parser.parse_args()
    specs = (args.servers or (SMOKE_SERVERS if args.smoke else DEFAULT_SERVERS)).split(",")
    for spec in specs:
        serve_options(spec, "")  # a typo fails now, not after the first server's minute of load
    texts, source = sentences()
    load_before = os.getloadavg()
    seconds = args.seconds or {"smoke": 1, "quick": 10, "full": 60}[common.size(args)]
    args.clients = args.clients or (2 if args.smoke else 32)
    with tempfile.TemporaryDirectory(prefix="encoderlab-serve-load-") as work:
        args.model = str(tiny_model(Path(work) / "tiny")) if args.smoke else "minilm"
        args.engine_cache = args.engine_cache or (str(Path(work) / "engines") if args.smoke else "")
        servers = {spec: run_server(spec, texts, args, seconds) for spec in specs}
    report(servers, source, args, load_before)


def against_first(servers: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each later set-up's texts/s and p99 latency as multiples of the first set-up's (the fp32 server)."""
    first = servers[next(iter(servers))]
    return {spec: {"texts_per_s": round(one["texts_per_s"] / max(first["texts_per_s"], 1e-9), 2),
                   "p99": round(one["latency_ms"]["p99"] / max(first["latency_ms"]["p99"], 1e-9), 2)}
            for spec, one in list(servers.items())[1:]}


def openai_goals(spec: str, openai: dict, clients: int) -> list[dict]:
    """/v1/embeddings: every request answered, at 0.95x /embed's texts/s or better."""
    answered = (openai["requests"] - openai["errors"]) / max(openai["requests"], 1)
    return [goal(f"{spec}: fraction of /v1/embeddings requests answered correctly under {clients} concurrent clients",
                 answered, 1.0),
            goal(f"{spec}: /v1/embeddings texts/s over /embed's", openai["texts_per_s_against_embed"], 0.95)]


def report(servers: dict[str, dict], source: str, args: argparse.Namespace,
           load_before: tuple[float, float, float]) -> None:
    """Print the figures; write bench/results/serve_load.json (serve_load_quick.json with --quick)."""
    figures = {"clients": args.clients, "data": source, "model": args.model, "server_threads": args.threads,
               "max_batch": args.max_batch,
               "servers": servers,
               "load_average_1_5_15_min_before": [round(v, 2) for v in load_before],
               "load_average_1_5_15_min_after": [round(v, 2) for v in os.getloadavg()],
               "note": "clients (httpx, asyncio) run in this process on the same machine as the server; "
                       "server_startup_s includes compiling for +compile set-ups"}
    goals = []
    for spec, one in servers.items():
        answered = (one["requests"] - one["errors"]) / max(one["requests"], 1)
        goals.append(goal(f"{spec}: fraction of requests answered correctly under {args.clients} concurrent "
                          "clients", answered, 1.0))
        goals += openai_goals(spec, one["v1_embeddings"], args.clients)
        latency = one["latency_ms"]
        print(f"{spec}: {one['requests']} requests ({one['texts']} texts) in {one['seconds']} s from "
              f"{args.clients} clients: {one['requests_per_s']} requests/s, {one['texts_per_s']} texts/s; "
              f"latency p50 {latency['p50']} ms, p99 {latency['p99']} ms; {one['errors']} errors; "
              f"{one['texts_per_forward_batch']} texts a forward batch; started in {one['server_startup_s']} s; "
              f"server peak RSS {one['server_peak_rss_mib']} MiB; ran {one['server_engine']} "
              f"{one['server_precision']}")
        openai = one["v1_embeddings"]
        print(f"{spec} /v1/embeddings: {openai['requests']} requests, {openai['texts_per_s']} texts/s "
              f"({openai['texts_per_s_against_embed']}x /embed's); latency p50 {openai['latency_ms']['p50']} ms, "
              f"p99 {openai['latency_ms']['p99']} ms; {openai['errors']} errors")
    figures["against_first"] = against_first(servers)
    for spec, ratio in figures["against_first"].items():
        print(f"{spec} against {next(iter(servers))}: {ratio['texts_per_s']}x the texts/s, "
              f"{ratio['p99']}x the p99 latency")
    path = write_results(args, "serve_load", figures, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
