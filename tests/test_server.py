"""`encoderlab serve`: real uvicorn servers on loopback, real HTTP requests; answers equal the pipelines' own."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st

from toy_capability import TOY_CARD, Shout

from encoderlab import EncoderConfig, EncoderModel, MaskedLMModel
from encoderlab.cards import CARDS
from encoderlab.cli import build_parser
from encoderlab.errors import InputError
from encoderlab.infer.pipelines import pipeline, pipeline_classes
from encoderlab.infer.server import Limits, create_app, load_pipelines, request_model
from encoderlab.tasks.rerank import Rerank
from encoderlab.checkpoint import save_pretrained
from encoderlab.nn.model import SequenceClassifier, SpanExtractor, TokenClassifier
from encoderlab.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("anna peter maria john paris rome oslo lima lives in where does is from the a movie was good bad "
         "very city of capital france italy and to he she it went saw").split()
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
SENTENCES = ["a cat sat on the mat", "the movie was very good", "stocks fell sharply on monday",
             "where does anna live?", "a long walk by the river at dusk", "tea", "he went to rome in may"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a busy 2-core machine two threads wait on each other far more than they compute."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@contextmanager
def running(app, **config) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread on a free loopback port; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # port 0: the OS picks a free one, and the socket holds it (no race)
    # Module-scoped clients keep connections open across tests: with uvicorn's default keep-alive (5 s) the server
    # may close an idle one just as the next test reuses it, and that request fails with "connection reset".
    config.setdefault("timeout_keep_alive", 600)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start within 30 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# ---- minilm: /embed ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_server(minilm_path) -> Iterator[str]:
    pipelines, reasons = load_pipelines(str(minilm_path))
    assert list(pipelines) == ["embed"] and set(reasons) == {"classify", "fill-mask", "ner", "qa", "rerank", "colbert",
                                                             "splade"}
    with running(create_app(pipelines, Limits(), model="minilm", unavailable=reasons)) as url:
        yield url


@pytest.fixture(scope="module")
def embedder(minilm_path):
    """The Embed pipeline itself, apart from the server's: the reference for every /embed answer."""
    return pipeline("embed", minilm_path)


@pytest.fixture(scope="module")
def client(minilm_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=minilm_server, timeout=60) as c:
        yield c


def embed(client: httpx.Client, texts: list[str]) -> np.ndarray:
    response = client.post("/embed", json={"texts": texts})
    assert response.status_code == 200, response.text
    return np.array([r["embedding"] for r in response.json()["results"]], dtype=np.float32)


def test_health(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "minilm" and health["tasks"] == ["embed"]
    assert health["precision"] == {"embed": "fp32"} and health["engine"] == {"embed": "torch"}
    assert health["queue"] == 0 and health["uptime_s"] > 0
    assert "minilm" in health["models"]["embed"]  # the fixture loads it by its folder
    assert "no masked-LM head" in health["unavailable"]["fill-mask"]  # load_pipelines alone adds no fallback
    assert "--model encoderlab-fill-mask (the default)" in health["unavailable"]["fill-mask"]
    assert health["limits"]["max_batch"] == 64


def test_embed_equals_the_pipeline_in_order(client, embedder):
    got = embed(client, SENTENCES)
    np.testing.assert_allclose(got, embedder.embed(SENTENCES), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(embed(client, SENTENCES[::-1]), got[::-1], atol=1e-5, rtol=1e-4)


def test_concurrent_burst_is_answered_correctly_and_batched(client, minilm_server, embedder):
    expected = dict(zip(SENTENCES, embedder.embed(SENTENCES)))
    before = client.get("/health").json()["stats"]["embed"]

    def worker(n: int) -> list[bool]:
        with httpx.Client(base_url=minilm_server, timeout=60) as own:
            outcomes = []
            for k in range(3):
                texts = [SENTENCES[(n + k + j) % len(SENTENCES)] for j in range(1 + (n + k) % 3)]
                got = embed(own, texts)
                outcomes.append(all(np.allclose(v, expected[t], atol=1e-5) for v, t in zip(got, texts)))
            return outcomes

    with ThreadPoolExecutor(16) as pool:
        outcomes = [ok for result in pool.map(worker, range(16)) for ok in result]
    assert len(outcomes) == 48 and all(outcomes)
    after = client.get("/health").json()["stats"]["embed"]
    requests, batches = after["requests"] - before["requests"], after["batches"] - before["batches"]
    assert requests == 48 and batches < requests, (requests, batches)


@pytest.mark.parametrize(("body", "where"), [
    (b'{"texts": ["a cat", ', "json_invalid"),
    (b'{"texts": ["a cat", "   "]}', "texts.1"),
    (b'{"texts": ["a cat", ""]}', "texts.1"),
    (b'{"texts": []}', "texts"),
    (json.dumps({"texts": ["x"] * 65}).encode(), "texts"),
    (json.dumps({"texts": ["x" * 10_001]}).encode(), "texts.0"),
    (b'{"texts": "a cat"}', "texts"),
    (b'{"texts": ["a cat", 3]}', "texts.1"),
    (b'{"text": ["a cat"]}', "text"),
    (b'[1, 2]', "body"),
])
def test_invalid_requests_get_422_naming_the_field(client, body, where):
    response = client.post("/embed", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(where in ".".join(map(str, e["loc"])) or where == e["type"] for e in errors), errors
    assert len(response.text) < 2000  # reasons only: the offending input is not echoed back


def test_oversize_body_gets_413_by_header_and_by_bytes_read(client):
    big = json.dumps({"texts": ["word " * 1000] * 250}).encode()  # 1.25 MB: over the 1 MB default
    assert client.post("/embed", content=big, headers={"content-type": "application/json"}).status_code == 413
    chunks = (big[i:i + 65536] for i in range(0, len(big), 65536))  # chunked: no Content-Length to go by
    response = client.post("/embed", content=chunks, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "1000000 bytes" in response.json()["detail"]
    assert client.get("/health").status_code == 200


def test_endpoint_the_model_lacks_gets_404_with_the_reason(client):
    response = client.post("/fill-mask", json={"texts": ["a [MASK]"]})
    assert response.status_code == 404 and "no fill-mask endpoint" in response.json()["detail"]
    assert "has no masked-LM head" in response.json()["detail"]
    assert client.post("/nonsense", json={}).status_code == 404
    paths = client.get("/openapi.json").json()["paths"]
    ours = {"/health", "/embed", "/attention"}  # /attention: every served model has one; /fill-mask is not there
    compatible = {"/v1/embeddings", "/v1/models", "/predict", "/tokenize", "/info", "/metrics"}
    assert set(paths) == ours | compatible
    assert client.get("/docs").status_code == 200


@pytest.mark.slow
def test_health_answers_while_a_big_batch_runs(client, minilm_server):
    texts = [" ".join(SENTENCES * 6) + f" {i}" for i in range(48)]  # 48 texts of ~230 tokens: seconds of work
    done: list[float] = []

    def big() -> None:
        with httpx.Client(base_url=minilm_server, timeout=120) as own:
            assert own.post("/embed", json={"texts": texts}).status_code == 200
        done.append(time.monotonic())

    thread = threading.Thread(target=big)
    thread.start()
    deadline = time.monotonic() + 10
    while client.get("/health").json()["queue"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # until the batch is running
    health = client.get("/health")
    answered = time.monotonic()
    thread.join(120)
    # /health came back while the batch was still running (its queue counted it) and before the batch was over; no
    # bound in seconds: on a busy 2-core machine the event loop waits for the GIL (a run once took 1.5 s)
    assert health.status_code == 200 and health.json()["queue"] >= 1
    assert done and done[0] > answered


@pytest.mark.slow
def test_load_32_clients_zero_errors(minilm_server):
    async def client_loop(http: httpx.AsyncClient, n: int, counter: list[int]) -> list[int]:
        codes = []
        while counter[0] < 100:
            counter[0] += 1
            texts = [SENTENCES[(n + j) % len(SENTENCES)] for j in range(1 + n % 4)]
            response = await http.post("/embed", json={"texts": texts})
            codes.append(response.status_code if len(response.json().get("results", [])) == len(texts) else -1)
        return codes

    async def main() -> list[int]:
        counter = [0]
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=minilm_server, timeout=60, limits=limits) as http:
            results = await asyncio.gather(*(client_loop(http, n, counter) for n in range(32)))
        return [code for codes in results for code in codes]

    started = time.monotonic()
    codes = asyncio.run(main())
    assert len(codes) >= 100 and set(codes) == {200}
    assert time.monotonic() - started < 15


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
BODIES = st.one_of(
    JSON.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries({"texts": JSON}).map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries({"texts": st.lists(st.text(max_size=40), max_size=6)}).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
)


@settings(max_examples=50, deadline=None)
@given(body=BODIES)
def test_fuzzed_bodies_never_get_500(client, body):
    response = client.post("/embed", content=body, headers={"content-type": "application/json"})
    assert response.status_code in (200, 413, 422), (response.status_code, response.text)


@pytest.mark.slow
def test_cli_serves_over_a_subprocess(minilm_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "encoderlab", "serve", "--model", str(minilm_path), "--port", str(port),
               "--threads", "1", "--max-batch", "8", "--tasks", "embed"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"PYTHONPATH": str(ROOT / "src")})
    try:
        health = wait_for_health(f"http://127.0.0.1:{port}", process)
        assert health["tasks"] == ["embed"] and health["limits"]["max_batch"] == 8
        response = httpx.post(f"http://127.0.0.1:{port}/embed", json={"texts": ["x"] * 9})
        assert response.status_code == 422
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert f"API docs: http://127.0.0.1:{port}/docs" in output


def wait_for_health(url: str, process: subprocess.Popen) -> dict:
    """/health of a server starting in a subprocess, polled for up to 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}: {process.communicate()[0]}")
        try:
            return httpx.get(f"{url}/health", timeout=2).json()
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("serve did not answer /health within 60 s")


# ---- errors and batching, with stand-in pipelines ---------------------------------------------------
class Stub:
    """A stand-in embed pipeline: 'bad' texts raise InputError, 'boom' a RuntimeError; records its calls."""

    task, precision, model_name, engine_name = "embed", "fp32", "", "torch"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[dict]:
        self.calls.append(list(texts))
        time.sleep(0.05)
        if "boom" in texts:
            raise RuntimeError("secret internals /path/to/file.py line 3")
        if "bad" in texts:
            raise InputError(f"text {texts.index('bad')} is bad")
        return [{"embedding": [float(len(t))]} for t in texts]


def test_one_bad_request_fails_alone_and_crashes_give_short_500():
    stub = Stub()
    app = create_app({"embed": stub}, Limits(batch_wait_ms=1000), model="stub")
    with running(app) as url, ThreadPoolExecutor(4) as pool:
        bodies = [["aa"], ["bad"], ["bbb", "c"], ["boom"]]
        responses = list(pool.map(lambda texts: httpx.post(f"{url}/embed", json={"texts": texts}, timeout=30), bodies))
        health = httpx.get(f"{url}/health").json()
    assert [r.status_code for r in responses] == [200, 422, 200, 500]
    assert responses[0].json() == {"results": [{"embedding": [2.0]}]}
    assert responses[2].json() == {"results": [{"embedding": [3.0]}, {"embedding": [1.0]}]}
    assert responses[1].json() == {"detail": "text 0 is bad"}
    assert "RuntimeError" in responses[3].text and "secret" not in responses[3].text
    assert len(stub.calls[0]) == 5  # all four requests went to the model as one batch first
    assert health["stats"]["embed"]["errors"] == 2


# ---- the cards: a capability's inference side is its Pipeline class plus one card row ----------------------
def test_a_registered_pipeline_gets_its_endpoint_and_schema_from_its_class(monkeypatch):
    monkeypatch.setitem(CARDS, "shout", TOY_CARD)
    with running(create_app({"shout": Shout()}, Limits(max_batch=4, batch_wait_ms=1), model="stub")) as url:
        answer = httpx.post(f"{url}/shout", json={"texts": ["hi", "yo"], "marks": 2}, timeout=30)
        refused = httpx.post(f"{url}/shout", json={"texts": ["a"] * 5}, timeout=30)
        unknown = httpx.post(f"{url}/shout", json={"texts": ["a"], "loud": True}, timeout=30)
        schema = httpx.get(f"{url}/openapi.json").json()
        missing = httpx.post(f"{url}/qa", json={"items": []}, timeout=30)
    assert answer.json() == {"results": [{"text": "HI!!"}, {"text": "YO!!"}]}
    assert refused.status_code == 422 and unknown.status_code == 422  # the limits and the fields, from the class
    assert schema["components"]["schemas"]["ShoutRequest"]["properties"]["texts"]["maxItems"] == 4
    assert "ShoutResults" in schema["components"]["schemas"] and missing.status_code == 404


def test_every_endpoint_serve_offers_is_a_card_with_a_pipeline():
    kinds = pipeline_classes()
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001 (no public getter)
    assert sorted(next(a.choices for a in serve._actions if a.dest == "tasks")) == sorted(kinds)  # noqa: SLF001
    assert kinds["rerank"] is Rerank  # declared with its task, named by its card
    for kind in kinds.values():
        assert kind.result.model_fields and request_model(kind, Limits()).model_fields


# ---- tiny task models: /fill-mask, /classify, /ner, /qa ---------------------------------------------
@pytest.fixture(scope="module")
def task_folders(tmp_path_factory) -> dict[str, Path]:
    """Random 2-layer, 32-wide models of every task kind, each saved with a tiny WordPiece vocabulary."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=120, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {"mlm": MaskedLMModel(config),
              "classify": SequenceClassifier(config.replace(labels=["neg", "pos"]), num_labels=2),
              "ner": TokenClassifier(config.replace(labels=TAGS), num_labels=len(TAGS)),
              "qa": SpanExtractor(config)}
    folders = {}
    for name, model in models.items():
        folders[name] = tmp_path_factory.mktemp(name)
        if name == "mlm":
            save_pretrained(model, folders[name])
            tokenizer.save(folders[name])
        else:
            save_pretrained(model.eval(), folders[name], tokenizer)
    return folders


TASK_CASES = {  # folder: (endpoints it offers, the endpoint tried, request body, pipeline inputs, options)
    "mlm": (["embed", "fill-mask"], "fill-mask", {"texts": ["anna lives in [MASK] .", "[MASK] went to <mask>"],
                                                  "top_k": 3}, ["anna lives in [MASK] .", "[MASK] went to <mask>"],
            {"top_k": 3}),
    "classify": (["classify"], "classify", {"texts": [["anna lives in paris", "where does anna live"],
                                                      ["the movie", "was good"]]},
                 [["anna lives in paris", "where does anna live"], ["the movie", "was good"]], {}),
    "ner": (["ner"], "ner", {"texts": ["Anna lives in Paris .", "john went to rome"]},
            ["Anna lives in Paris .", "john went to rome"], {}),
    "qa": (["qa"], "qa", {"items": [{"question": "where does anna live ?", "context": "anna lives in paris ."}]},
           [{"question": "where does anna live ?", "context": "anna lives in paris ."}], {}),
}


@pytest.mark.parametrize("kind", list(TASK_CASES))
def test_task_endpoints_equal_the_pipelines(task_folders, kind):
    offered, task, body, inputs, options = TASK_CASES[kind]
    pipelines, reasons = load_pipelines(str(task_folders[kind]))
    assert sorted(pipelines) == offered
    expected = pipeline(task, task_folders[kind])(inputs, **options)
    with running(create_app(pipelines, Limits(), model=kind, unavailable=reasons)) as url:
        response = httpx.post(f"{url}/{task}", json=body, timeout=30)
        missing = next(t for t in ("embed", "classify", "fill-mask", "ner", "qa") if t not in offered)
        assert httpx.post(f"{url}/{missing}", json=body).status_code == 404
        if task == "fill-mask":  # a text without a mask: the pipeline's InputError, as 422 with its message
            refused = httpx.post(f"{url}/fill-mask", json={"texts": ["anna lives in paris"]})
            assert refused.status_code == 422 and "no [MASK] token" in refused.json()["detail"]
    assert response.status_code == 200, response.text
    assert response.json()["results"] == json.loads(json.dumps(expected))  # exactly: same model, same batch


@pytest.mark.slow
def test_compiled_server_equals_the_eager_pipeline(task_folders):
    """serve --compile: the encoder compiled at load (main thread), run on the model thread for batched requests."""
    pipelines, reasons = load_pipelines(str(task_folders["mlm"]), tasks=["embed"], compile=True)
    assert pipelines["embed"].info()["compiled"]
    texts = [" ".join(WORDS[k:k + n]) for k, n in [(0, 1), (3, 7), (5, 30), (2, 12), (9, 4), (1, 20)]]
    expected = pipeline("embed", task_folders["mlm"])(texts)
    with running(create_app(pipelines, Limits(), model="mlm", unavailable=reasons)) as url:
        with ThreadPoolExecutor(len(texts)) as pool:  # at once, so the server batches texts of several lengths
            responses = list(pool.map(lambda t: httpx.post(f"{url}/embed", json={"texts": [t]}, timeout=60), texts))
        health = httpx.get(f"{url}/health").json()
    assert [r.status_code for r in responses] == [200] * len(texts)
    got = np.array([r.json()["results"][0]["embedding"] for r in responses])
    np.testing.assert_allclose(got, np.array([e["embedding"] for e in expected]), atol=1e-5, rtol=0)
    assert health["stats"]["embed"]["requests"] == len(texts)
