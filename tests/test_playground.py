"""The playground behind `encoderlab serve`: the page and its files, /attention, and the API key that guards every
data endpoint (and the refusal to serve beyond loopback without one). The browser itself: test_playground_browser.py."""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from test_server import ROOT, WORDS, Stub, task_folders  # noqa: F401 (task_folders: a fixture)

from encoderlab import EncoderConfig, MaskedLMModel, save_pretrained
from encoderlab.cli import main
from encoderlab.errors import InputError
from encoderlab.cards import CARDS
from encoderlab.infer.server import (PLAYGROUND, REDOC_LOGO, REDOC_SCRIPT, Limits, check_exposure, create_app,
                                     load_pipelines)
from encoderlab.tokenizer import Tokenizer
from encoderlab.viz.attention import attention_maps

KEY = "s3cret-key-for-tests"
DATA_REQUESTS = [("GET", "/health", None), ("GET", "/openapi.json", None), ("GET", "/docs", None),
                 ("GET", "/redoc", None),
                 ("POST", "/embed", {"texts": ["a cat"]}), ("POST", "/attention", {"text": "a cat"}),
                 ("POST", "/ner", {"texts": ["a cat"]}), ("POST", "/nowhere", {})]


def test_page_and_its_files_are_served_and_request_nothing_from_elsewhere():
    with TestClient(create_app({"embed": Stub()}, Limits(), model="stub")) as client:
        page = client.get("/")
        files = {name: client.get(f"/playground/{name}") for name in ("playground.js", "playground.css")}
    assert page.status_code == 200 and "encoderlab playground" in page.text
    assert all(r.status_code == 200 for r in files.values())
    for path in PLAYGROUND.iterdir():  # no CDN, no web font: the only URL is SVG's namespace name, never fetched
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+", path.read_text()))
        assert urls <= {"http://www.w3.org"}, (path.name, urls)
        assert "@import" not in path.read_text() and "url(" not in path.read_text(), path.name


def test_every_endpoint_has_a_panel():
    """A task the server can serve (a reranker's /rerank among them) has its panel on the page, and its button a
    handler."""
    page, script = (PLAYGROUND / "index.html").read_text(), (PLAYGROUND / "playground.js").read_text()
    panels = re.findall(r'<section class="panel" id="(panel-[\w-]+)" data-task="([\w-]+)">', page)
    assert {card.name for card in CARDS.values() if card.pipeline} <= {task for _, task in panels}
    assert all(f'onSubmit("{panel}",' in script for panel, _ in panels)


def test_redoc_asks_nothing_of_another_machine():
    """fastapi-offline's ReDoc script fetches one file from elsewhere, its footer's logo from cdn.redoc.ly: /redoc
    loads a copy without that URL, under a Content-Security-Policy that would block any other (the browser's view:
    test_playground_browser.py)."""
    original = (importlib.resources.files("fastapi_offline") / "static" / "redoc.standalone.js").read_bytes()
    assert REDOC_LOGO.encode() in original  # else the copy fixes nothing: see what the new ReDoc fetches
    with TestClient(create_app({"embed": Stub()}, Limits(), model="stub", api_key=KEY)) as client:
        page = client.get("/redoc", headers={"x-api-key": KEY})
        script = client.get(REDOC_SCRIPT)  # holds no data: no key needed, as for /docs' scripts
        assert client.get("/redoc").status_code == 401
    assert page.status_code == 200 and f'<script src="{REDOC_SCRIPT}">' in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self' ")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert b"cdn.redoc.ly" not in script.content and len(script.content) == len(original) - len(REDOC_LOGO)


@pytest.mark.parametrize("head", [None, 1, -1])
def test_attention_endpoint_equals_viz_attention(task_folders, head):
    pipes, reasons = load_pipelines(str(task_folders["mlm"]))
    text = "anna lives in paris and john went to rome"
    pipe = pipes["fill-mask"]
    expected = attention_maps(pipe.model, pipe.tokenizer, text).select(-1, head)
    with TestClient(create_app(pipes, Limits(), model="mlm", unavailable=reasons)) as client:
        got = client.post("/attention", json={"text": text, "head": head, "task": "fill-mask"}).json()
    assert got["tokens"][0] == "[CLS]" and len(got["tokens"]) == expected.shape[-1]
    assert (got["layer"], got["num_layers"], got["num_heads"]) == (1, 2, 2)
    torch.testing.assert_close(torch.tensor(got["maps"]), expected if head is None else expected[None],
                               atol=6e-5, rtol=0)  # the endpoint rounds to 4 decimals


def test_attention_endpoint_truncates_a_long_text_to_a_roberta_window(roberta_window_path, long_text):
    """Issue 36: /attention passed no window, so a 2,000-word text on a RoBERTa-family model (514 positions, 512
    usable) answered 500; it is cut to the endpoint's window, as the pipelines cut it, and says so."""
    pipes, reasons = load_pipelines(str(roberta_window_path), tasks=["fill-mask"])
    assert pipes["fill-mask"].max_length == 512
    with TestClient(create_app(pipes, Limits(), model="roberta", unavailable=reasons)) as client:
        long = client.post("/attention", json={"text": long_text, "head": 0})
        short = client.post("/attention", json={"text": "anna lives in paris", "head": 0})
    assert long.status_code == 200, long.text
    assert long.json()["truncated"] is True and len(long.json()["tokens"]) == 512
    assert torch.tensor(long.json()["maps"]).shape == (1, 512, 512)
    assert short.json()["truncated"] is False


@pytest.mark.parametrize("body, needle", [({"text": "anna", "layer": 2}, "layer 2 out of range"),
                                          ({"text": "anna", "head": 5}, "head 5 out of range"),
                                          ({"text": "anna", "task": "qa"}, "task 'qa' is not served"),
                                          ({"text": "  "}, "text")])
def test_attention_refuses_bad_requests_with_422(task_folders, body, needle):
    pipes, _ = load_pipelines(str(task_folders["mlm"]))
    with TestClient(create_app(pipes, Limits(), model="mlm")) as client:
        response = client.post("/attention", json=body)
    assert response.status_code == 422 and needle in str(response.json()["detail"]), response.text


def test_api_key_guards_every_data_endpoint_but_not_the_page():
    stub = Stub()
    with TestClient(create_app({"embed": stub}, Limits(), model="stub", api_key=KEY)) as client:
        for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": KEY[:-1]}, {"x-api-key": KEY + "x"}):
            for method, path, body in DATA_REQUESTS:
                response = client.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (path, headers, response.text)
                assert "API key" in response.json()["detail"]
        assert stub.calls == []  # refused before the model was touched
        assert client.get("/").status_code == 200 and client.get("/playground/playground.js").status_code == 200
        good = {"x-api-key": KEY}
        assert client.get("/health", headers=good).status_code == 200
        answer = client.post("/embed", json={"texts": ["abc"]}, headers=good).json()
        assert answer == {"results": [{"embedding": [3.0]}]}
        assert client.post("/ner", json={"texts": ["a"]}, headers=good).status_code == 404  # past the key: the route
    assert stub.calls == [["abc"]]


def test_without_a_key_nothing_is_asked():
    with TestClient(create_app({"embed": Stub()}, Limits(), model="stub")) as client:
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_loopback_needs_no_key(host):
    check_exposure(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_other_addresses_need_a_key(host):
    with pytest.raises(InputError, match=f"--host {re.escape(host)}: serving beyond this machine needs an API key"):
        check_exposure(host, None)
    with pytest.raises(InputError):
        check_exposure(host, "")
    check_exposure(host, KEY)


def serve_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "encoderlab", "serve", "--model", "minilm", "--threads", "1", "--tasks", "embed",
            *extra]


@pytest.mark.slow
def test_cli_refuses_a_public_address_without_a_key():
    env = {k: v for k, v in os.environ.items() if k != "ENCODERLAB_API_KEY"} | {"PYTHONPATH": str(ROOT / "src")}
    started = time.monotonic()
    done = subprocess.run(serve_command("--host", "0.0.0.0"), cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs an API key; set ENCODERLAB_API_KEY or pass --api-key-file" in done.stderr
    assert time.monotonic() - started < 60  # refused before the model is loaded


def test_cli_refuses_an_empty_key_file(tmp_path, capsys):
    (tmp_path / "key").write_text("  \n")
    assert main(["serve", "--model", "minilm", "--api-key-file", str(tmp_path / "key")]) == 2
    assert "the file is empty (expected the key)" in capsys.readouterr().err


@contextlib.contextmanager
def served(env: dict[str, str], *extra: str) -> Iterator[str]:
    """`encoderlab serve` (minilm, /embed) in a subprocess on a free port, as test_server does: its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(serve_command("--port", str(port), *extra), cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=os.environ | {"PYTHONPATH": str(ROOT / "src"),
                                                                           "OMP_NUM_THREADS": "1"} | env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None, "serve did not start"
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.parametrize("source", ["env", "file"])
@pytest.mark.slow
def test_cli_reads_the_key_from_the_environment_or_a_file(tmp_path, source):
    (tmp_path / "key").write_text(KEY + "\n")
    extra = ("--api-key-file", str(tmp_path / "key")) if source == "file" else ()
    with served({"ENCODERLAB_API_KEY": KEY if source == "env" else "not-this-one"}, *extra) as url:
        assert httpx.get(f"{url}/health").status_code == 401
        assert httpx.post(f"{url}/embed", json={"texts": ["a"]}).status_code == 401
        assert httpx.get(f"{url}/health", headers={"x-api-key": KEY}).status_code == 200
        assert httpx.get(f"{url}/").status_code == 200
        # the key guards it, so any Host may ask (a name behind a proxy, say)
        assert httpx.get(f"{url}/health", headers={"x-api-key": KEY, "host": "encoder.example"}).status_code == 200


@pytest.mark.slow
def test_cli_without_a_key_answers_only_requests_addressed_to_loopback():
    """DNS rebinding: a web page whose host name now points at 127.0.0.1 sends its own name in Host."""
    with served({"ENCODERLAB_API_KEY": ""}) as url:
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "[::1]"):
            assert httpx.get(f"{url}/health", headers={"host": host}).status_code == 200, host
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.attacker.example:{port}",
                     f"192.168.1.20:{port}", f"[::2]:{port}"):
            refused = httpx.post(f"{url}/embed", json={"texts": ["a"]}, headers={"host": host})
            assert refused.status_code == 400, host
            assert f"Host {host.lower()} is not this machine's loopback" in refused.json()["detail"]


def test_app_answers_any_host_unless_told_loopback_only():
    with TestClient(create_app({"embed": Stub()}, Limits(), model="stub")) as client:
        assert client.get("/health", headers={"host": "attacker.example"}).status_code == 200
    with TestClient(create_app({"embed": Stub()}, Limits(), model="stub", loopback_only=True)) as client:
        assert client.get("/health", headers={"host": "attacker.example"}).status_code == 400
        assert client.get("/", headers={"host": "attacker.example"}).status_code == 400  # the page too
        assert client.get("/health", headers={"host": "localhost:8000"}).status_code == 200


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-mini", "distilbert-mini", "albert-mini", "electra-mini",
                                    "deberta-v3-mini", "modernbert-mini"])
def test_attention_endpoint_serves_every_family(tmp_path, preset):
    """Whatever the family (DeBERTa's relative attention among them), /attention gives viz.attention's maps."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=120, min_frequency=1)
    config = EncoderConfig.from_preset(preset, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64,
                                       **({"pad_token_id": tokenizer.pad_id} if preset == "modernbert-mini" else {}))
    torch.manual_seed(0)
    model = MaskedLMModel(config)
    save_pretrained(model, tmp_path)
    tokenizer.save(tmp_path)
    pipes, _ = load_pipelines(str(tmp_path), tasks=["fill-mask"])
    text = "anna lives in paris and john went to rome"
    expected = attention_maps(pipes["fill-mask"].model, tokenizer, text, layers=[0]).probs[0]
    with TestClient(create_app(pipes, Limits(), model=preset)) as client:
        got = client.post("/attention", json={"text": text, "layer": 0}).json()
    torch.testing.assert_close(torch.tensor(got["maps"]), expected, atol=6e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(got["maps"]).sum(-1), torch.ones(2, len(got["tokens"])), atol=1e-3,
                               rtol=0)


def test_local_layers_attend_within_their_window_and_global_ones_beyond():
    """ModernBERT's alternating attention shows in the maps: a local layer's are banded, zero beyond
    local_attention // 2 tokens either side (and not merely small), a global layer's reach past it."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=120, min_frequency=1)
    config = EncoderConfig.from_preset("modernbert-mini", hidden_size=32, num_heads=2, intermediate_size=64,
                                       num_layers=3, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                                       local_attention=4, global_attn_every_n_layers=3)
    torch.manual_seed(0)
    maps = attention_maps(MaskedLMModel(config), tokenizer, "anna lives in paris and john went to rome")
    distance = torch.arange(len(maps.tokens))
    outside = (distance[:, None] - distance[None, :]).abs() > 2  # (T, T) beyond the half-window of 2
    assert [config.is_local(i) for i in range(3)] == [False, True, True]
    for layer in (1, 2):
        assert maps.select(layer)[:, outside].abs().max() == 0, layer
        assert maps.select(layer)[:, ~outside].min() > 0, layer
    assert maps.select(0)[:, outside].min() > 0  # global: every key, near or far
