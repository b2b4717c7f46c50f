"""`encoderlab serve`: one model behind an HTTP API (FastAPI), with concurrent requests batched together.

    encoderlab serve --model minilm --port 8000          # then open http://127.0.0.1:8000/docs
    curl -s localhost:8000/embed -H 'content-type: application/json' -d '{"texts": ["a cat", "a dog"]}'

A server holds one checkpoint and offers the endpoints whose pipeline that checkpoint loads as
(POST /embed, /classify, /fill-mask, /ner, /qa, /rerank); the others answer 404 with the reason. Where the checkpoint
has no masked-LM head, `serve` answers /fill-mask with the shipped default model (encoderlab-fill-mask), the
one second model it may load. GET /health reports the model behind each endpoint, the queue and how many
forward batches served how many requests. GET / is the playground page (infer/playground/); POST /attention gives
viz.attention's maps of a text cut to the endpoint's window (`"truncated": true` says it was cut). With an API key
(KeyCheck) every request but the page's files and /metrics needs it, in X-API-Key or as `Authorization: Bearer`.
The API's own pages, /docs (Swagger UI) and /redoc (ReDoc), load their scripts from this server, never a CDN.

Beside ours, the APIs users' tools speak (encoderlab.infer.compat): OpenAI's POST /v1/embeddings and GET /v1/models,
TEI's bodies on POST /embed and /rerank (told apart from ours by their keys), /predict, /tokenize and GET /info; and
GET /metrics for Prometheus (encoderlab.infer.metrics). A layer above may add routes (Routes): `serve --index DIR`'s
POST /search (encoderlab.retrieval.serving).

Each endpoint has a micro-batching worker: requests that arrive within `batch_wait_ms` of the first (or until
`max_batch` texts) go through the pipeline in one call, on one model thread, so the event loop keeps answering
(/health among others) while the model runs. Refusals: 413, 408 or 422 before parsing (BodyCheck); 422 naming the
field and index, or with a pipeline's InputError; 500 with one line (the traceback goes to the log only).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi_offline import FastAPIOffline
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

from encoderlab.errors import EncoderlabError, InputError, MissingHeadError
from encoderlab.infer import compat
from encoderlab.infer.batching import Batcher, submit
from encoderlab.infer.compat import APIError, answered, ours
from encoderlab.infer.limits import API_KEY_ENV, Limits
from encoderlab.infer.metrics import Measured, Metrics
from encoderlab.infer.pipelines import Pipeline, pipeline, pipeline_classes
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL
from encoderlab.viz.attention import attention_maps

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
PLAYGROUND = Path(__file__).parent / "playground"  # the page at /: plain HTML, CSS and JavaScript, no build step
# Swagger UI's and ReDoc's files for /docs and /redoc, from the fastapi-offline package (FastAPI's own pages load them
# from a CDN, blank offline); like the playground's files they hold no data, so they need no API key.
DOCS_ASSETS = "/docs-assets"
# ReDoc's script as /redoc loads it: fastapi-offline's copy less the one file it fetches from elsewhere, the Redocly
# logo of its "powered by" footer (an <img> with no src asks for nothing and hides itself, by the script's onError).
# Not under DOCS_ASSETS: that folder's mount would answer the path first, with a 404.
REDOC_SCRIPT = "/redoc.standalone.js"
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
# ... and the page forbids any request to another origin, should a later ReDoc ask for another one: the browser
# blocks it rather than sends it (inline scripts, styles and eval allowed: ReDoc's page and script need them).
REDOC_POLICY = "default-src 'self' 'unsafe-inline' 'unsafe-eval' data: blob:"


# ---- request and response models --------------------------------------------------------------------
def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("text is empty or whitespace only")
    return text


def request_model(pipeline: type[Pipeline], limits: Limits) -> type[BaseModel]:
    """A pipeline's request body model (its `request` fields), the limits written into its schema (and /docs)."""
    def many(description: str = "1 to {} non-blank texts") -> Any:
        return Field(description=description.format(limits.max_batch), min_length=1, max_length=limits.max_batch)

    return strict(f"{pipeline.__name__}Request", **pipeline.request(limited_text(limits), many, strict))


def limited_text(limits: Limits) -> Any:
    """A request's text: non-blank, at most max_text_chars characters."""
    return Annotated[str, Field(min_length=1, max_length=limits.max_text_chars), AfterValidator(_not_blank)]


def strict(name: str, **fields: Any) -> type[BaseModel]:
    """A request model that refuses keys it does not name."""
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


def attention_request(limits: Limits) -> type[BaseModel]:
    """POST /attention's body."""
    return strict("AttentionRequest", text=(limited_text(limits), ...), layer=(int, -1), head=(int | None, Field(
        None, description="one head, or every head of the layer")), task=(str | None, Field(
        None, description="the endpoint whose model to look into (default: the first served)")))


def response_model(pipeline: type[Pipeline]) -> type[BaseModel]:
    """{"results": [one result per input, in input order]} for the pipeline."""
    return create_model(f"{pipeline.result.__name__}s", results=list[pipeline.result])


class Health(BaseModel):
    status: str
    model: str = Field(description="the checkpoint folder or alias served")
    models: dict[str, str] = Field(description="the model behind each endpoint (/fill-mask may be the shipped "
                                               "default where the model has no masked-LM head)")
    tasks: list[str] = Field(description="the endpoints this model offers")
    unavailable: dict[str, str] = Field(description="endpoints it does not offer, and why")
    precision: dict[str, str] = Field(description="precision each pipeline runs in")
    engine: dict[str, str] = Field(description="what runs each pipeline's encoder: torch, onnxruntime, ctranslate2")
    queue: int = Field(description="requests waiting or running")
    uptime_s: float
    stats: dict[str, dict[str, int]] = Field(description="per task: requests, texts, forward batches, errors")
    limits: dict[str, int | float]
    index: dict[str, Any] | None = Field(None, description="the index POST /search searches (serve --index): "
                                                          "documents, dimensions, BM25, its model, the reranker")


class Routes(Protocol):
    """Routes a layer above adds to the app, with what /health and /info say of them: the retrieval layer's
    POST /search (encoderlab.retrieval.serving.IndexRoutes, serve --index)."""

    def add_routes(self, app: FastAPI, batchers: dict[str, Batcher], text: Any, limits: Limits) -> None: ...
    def start(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def stop(self) -> None: ...
    def info(self) -> dict[str, Any]: ...


# ---- the app ----------------------------------------------------------------------------------------
DRAIN_BYTES = 64 * 2**20  # an oversize body up to this is read and dropped before the 413: closing a socket
# with unread data resets it, and the client, still sending, would see the reset instead of the answer
DRAIN_IDLE_S = 0.3  # ... but a client that declared a huge body and sends none of it is answered after this pause


class BodyCheck:
    """ASGI middleware: 413 for a body over max_bytes (by Content-Length, or by the bytes actually sent),
    408 for one not sent in full within timeout_s, 422 for one that is not UTF-8 (JSON's encoding, RFC 8259
    section 8.1), before any parsing."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            if headers.get(b"expect", b"").lower() != b"100-continue":  # else the client has not sent it yet
                await _drain(receive, self.timeout_s)
            return await _refuse(send, scope, 413, f"request body too large: Content-Length "
                                            f"{declared.decode(errors='replace')!r}; the limit is {self.max_bytes} "
                                            f"bytes (--max-body-bytes)")
        try:
            async with asyncio.timeout(self.timeout_s):
                body, more = await self._read(receive)
        except TimeoutError:
            return await _refuse(send, scope, 408, f"request body not received within {self.timeout_s:g} s "
                                            f"(--body-timeout-s)")
        if len(body) > self.max_bytes:
            if more:
                await _drain(receive, self.timeout_s)
            return await _refuse(send, scope, 413, f"request body too large: more than {self.max_bytes} bytes sent; "
                                            f"the limit is {self.max_bytes} bytes (--max-body-bytes)")
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as err:
            return await _refuse(send, scope, 422, [{"loc": ["body", err.start], "msg": f"body is not UTF-8 ({err.reason})",
                                              "type": "json_invalid"}])
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Callable) -> tuple[bytes, bool]:
        """The body, or its first bytes once they pass max_bytes (a chunked body has no Content-Length to go
        by); and whether more of it is still to come."""
        body, more = bytearray(), True
        while more and len(body) <= self.max_bytes:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False) and message["type"] == "http.request"
        return bytes(body), more


PUBLIC = ("/playground/", DOCS_ASSETS + "/", REDOC_SCRIPT)  # files that hold no data: the playground's, the API
# docs' scripts
OPEN_PATHS = ("/", "/metrics")  # the page, and counts for a scraper that has no key (encoderlab.infer.metrics)


class KeyCheck:
    """ASGI middleware: 401 for a request without the API key, in its X-API-Key header or as `Authorization: Bearer
    KEY` (what OpenAI's and TEI's clients send), before its body is read (the playground's own files, the docs pages'
    scripts and /metrics, which hold no data, excepted)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not scope["path"].startswith(PUBLIC):
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"")
            bearer = bearer[7:].strip() if bearer[:7].lower() == b"bearer " else b""
            # both compared, in constant time: no guessing the key byte by byte
            if not (hmac.compare_digest(headers.get(b"x-api-key", b""), self.key) | hmac.compare_digest(bearer, self.key)):
                return await _refuse(send, scope, 401, "missing or wrong API key: send it in the X-API-Key header "
                                                       "or as Authorization: Bearer KEY")
        await self.app(scope, receive, send)


class HostCheck:
    """ASGI middleware: 400 for a request whose Host header names anything but this machine's loopback. A keyless
    server on 127.0.0.1 is otherwise open to any web page the user visits, by DNS rebinding (a page's own host name
    re-pointed at 127.0.0.1 gets past the browser's same-origin rule; the Host header still carries that name)."""

    NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") and "]:" in host else host
            if name not in self.NAMES:
                return await _refuse(send, scope, 400, f"Host {host or '(none)'} is not this machine's loopback: a server "
                                                f"without an API key answers only localhost, 127.0.0.1 and [::1]")
        await self.app(scope, receive, send)


async def _drain(receive: Callable, seconds: float) -> None:
    """Read and drop the rest of a request body: up to DRAIN_BYTES, for up to `seconds`, until a DRAIN_IDLE_S pause."""
    loop = asyncio.get_running_loop()
    deadline, budget, more = loop.time() + seconds, DRAIN_BYTES, True
    while more and budget > 0:
        wait = min(DRAIN_IDLE_S, deadline - loop.time())
        try:
            async with asyncio.timeout(wait):
                message = await receive()
        except TimeoutError:
            return
        budget -= len(message.get("body", b""))
        more = message.get("more_body", False) and message["type"] == "http.request"


async def _refuse(send: Callable, scope: dict, status: int, detail: Any) -> None:
    """Answer {"detail": ...} (OpenAI's error body under /v1/) with `status` and close the connection (the rest of
    the body is not read)."""
    body = compat.openai_body(status, detail) if scope["path"].startswith(compat.OPENAI) else {"detail": detail}
    response = JSONResponse(body, status_code=status, headers={"connection": "close"})
    await response({"type": "http"}, None, send)


def _replay(body: bytes, receive: Callable) -> Callable:
    """An ASGI receive that gives the already-read body once, then defers to the real one (for disconnects)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def request_items(body: BaseModel) -> tuple[list[Any], Hashable]:
    """A request's inputs (its first field) and what must match for two requests to share a pipeline call: the
    options (its other fields) and the kinds of input (classify refuses texts and pairs mixed in one call)."""
    field, *options = type(body).model_fields
    items = [item.model_dump() if isinstance(item, BaseModel) else item for item in getattr(body, field)]
    kinds = tuple(sorted({type(item).__name__ for item in items}))
    return items, (tuple((name, getattr(body, name)) for name in options), kinds)


def create_app(pipelines: dict[str, Pipeline], limits: Limits, model: str = "",
               unavailable: dict[str, str] | None = None, api_key: str | None = None,
               loopback_only: bool = False, index: Routes | None = None) -> FastAPI:
    """The FastAPI app serving these pipelines (task -> pipeline) and the playground page at /; `unavailable`
    says why others are missing; with an api_key, every other request must carry it (KeyCheck); loopback_only:
    answer only requests addressed to localhost (HostCheck); index: POST /search (serve --index)."""
    kinds = pipeline_classes()
    unknown = sorted(set(pipelines) - set(kinds))
    if unknown:
        raise InputError(f"no endpoint for task(s) {', '.join(unknown)}; expected some of {', '.join(kinds)}")
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")  # one model, one thread: no contention
    batchers: dict[str, Batcher] = {}
    started, metrics = time.monotonic(), Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for task, pipe in pipelines.items():
            batchers[task] = batcher = Batcher(pipe, executor, limits.max_batch, limits.batch_wait_ms / 1e3,
                                               on_batch=metrics.batch_size.labels(task).observe)
            metrics.watch_queue(task, lambda b=batcher: len(b.pending) + b.running)
        workers = [asyncio.create_task(b.work(), name=f"batch-{t}") for t, b in batchers.items()]
        if index:
            index.start(asyncio.get_running_loop())
        yield
        if index:
            index.stop()
        for worker in workers:
            worker.cancel()
        executor.shutdown(wait=False, cancel_futures=True)

    endpoints = ", ".join(f"{task} (by {pipe.model_name})" if pipe.model_name and pipe.model_name != model else task
                          for task, pipe in pipelines.items())  # the model behind a task where it is not the server's
    app = FastAPIOffline(title="encoderlab", lifespan=lifespan, static_url=DOCS_ASSETS, redoc_url=None,  # _add_redoc
                  description=f"Model **{model or '?'}**: {endpoints}. Limits: {limits.max_batch} texts "
                              f"a request, {limits.max_text_chars} characters a text, {limits.max_body_bytes} bytes "
                              f"a body.")
    app.state.batchers = batchers
    app.add_middleware(BodyCheck, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    if api_key:
        app.add_middleware(KeyCheck, key=api_key)  # added last, so it runs first: a refused body is never read
    if loopback_only:
        app.add_middleware(HostCheck)
    routes: set[str] = set()  # filled below, once every route is added
    app.add_middleware(Measured, metrics=metrics, routes=lambda: routes)  # outermost: refusals are counted too
    _add_error_handlers(app)
    app.mount("/playground", StaticFiles(directory=PLAYGROUND), name="playground")
    app.get("/", include_in_schema=False)(lambda: FileResponse(PLAYGROUND / "index.html"))
    _add_redoc(app)

    @app.get("/health", response_model=Health, summary="status, model, endpoints, queue and batch counters")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model, "models": {t: p.model_name or model for t, p in pipelines.items()},
                "tasks": list(pipelines), "unavailable": unavailable or {},
                "precision": {t: p.precision for t, p in pipelines.items()},
                "engine": {t: p.engine_name for t, p in pipelines.items()},
                "queue": sum(len(b.pending) + b.running for b in batchers.values()),
                "uptime_s": round(time.monotonic() - started, 3),
                "stats": {t: dict(b.stats) for t, b in batchers.items()}, "limits": asdict(limits),
                "index": index.info() if index else None}

    for task, kind in kinds.items():
        if task in pipelines:
            _add_endpoint(app, task, request_model(kind, limits), batchers, pipelines[task], limits)
        else:
            _add_missing(app, task, (unavailable or {}).get(task, "not loaded"), model)
    _add_attention(app, attention_request(limits), pipelines, executor)
    compat.add_openai_routes(app, batchers, pipelines, model, limited_text(limits), limits)
    compat.add_tei_routes(app, batchers, pipelines, model, limited_text(limits), limits,
                          {"index": index.info()} if index else {})
    if index:
        index.add_routes(app, batchers, limited_text(limits), limits)
    metrics.add_route(app)
    routes.update(route.path for route in app.routes)
    return app


@cache
def redoc_script() -> bytes:
    """fastapi-offline's redoc.standalone.js with REDOC_LOGO's URL emptied (read once: a megabyte)."""
    script = (Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js").read_text(encoding="utf-8")
    return script.replace(f'"{REDOC_LOGO}"', '""').encode()  # test_playground pins that it was there


def _add_redoc(app: FastAPI) -> None:
    """GET /redoc, ReDoc's page of the API, as fastapi-offline's but with redoc_script and REDOC_POLICY: it asks
    nothing of any other machine."""
    @app.get(REDOC_SCRIPT, include_in_schema=False)
    async def script() -> Response:
        return Response(redoc_script(), media_type="text/javascript")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{REDOC_SCRIPT}", with_google_fonts=False,
                              redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png")
        page.headers["Content-Security-Policy"] = REDOC_POLICY
        return page


def _add_attention(app: FastAPI, request: type[BaseModel], pipelines: dict[str, Pipeline],
                   executor: ThreadPoolExecutor) -> None:
    """POST /attention: one layer's attention (heads, T, T) of the model behind an endpoint (viz.attention)."""
    async def attention(body: BaseModel) -> dict[str, Any]:
        task = body.task or next(iter(pipelines))
        if task not in pipelines:
            raise InputError(f"task {task!r} is not served here; expected one of {', '.join(pipelines)}")
        pipe = pipelines[task]
        maps = await asyncio.get_running_loop().run_in_executor(  # on the model thread, as the batches run
            executor, lambda: attention_maps(pipe.model, pipe.tokenizer, body.text, layers=[body.layer],
                                             max_length=pipe.max_length))
        probs = maps.probs[0] if body.head is None else maps.select(body.layer, body.head)[None]
        return {"tokens": maps.tokens, "layer": maps.layers[0], "num_layers": maps.num_layers, "num_heads":
                maps.num_heads, "maps": probs.double().round(decimals=4).tolist(), "truncated": maps.truncated}

    attention.__annotations__["body"] = request
    app.post("/attention", summary="attention maps of one layer: every head, or one")(attention)


def _add_endpoint(app: FastAPI, task: str, request: type[BaseModel], batchers: dict[str, Batcher],
                  pipe: Pipeline, limits: Limits) -> None:
    """POST /{task}: validate, queue for the batcher, answer the results or a short error. Where TEI has a route of
    the same path (compat.TEI_BODIES), its body is accepted too and answered as TEI does."""
    foreign = compat.TEI_BODIES.get(task)

    async def endpoint(body: BaseModel) -> Any:
        if foreign and not isinstance(body, request):
            return JSONResponse(await foreign[2](body, batchers[task], pipe))  # TEI's answer: not our results model
        items, key = request_items(body)
        return {"results": await answered(submit(batchers[task], task, items, key), ours)}

    # the real model: FastAPI reads it to parse and document the body
    endpoint.__annotations__["body"] = compat.either(task, request, limited_text(limits), limits, pipe) \
        if foreign else request
    doc = type(pipe).__doc__.splitlines()[0] if type(pipe).__doc__ else task
    app.post(f"/{task}", response_model=response_model(pipeline_classes()[task]), summary=doc, name=task,
             response_model_exclude_unset=True,  # a result has the fields its pipeline gives (multilabel: labels)
             responses={413: {"description": "body too large"}, 422: {"description": "invalid request"}})(endpoint)


def _add_missing(app: FastAPI, task: str, reason: str, model: str) -> None:
    """POST /{task} that answers 404 with why this model has no such endpoint (hidden from /docs)."""
    async def missing() -> JSONResponse:
        return JSONResponse({"detail": f"this server's model ({model}) has no {task} endpoint: {reason}"},
                            status_code=404)

    app.post(f"/{task}", include_in_schema=False, name=f"{task}-missing")(missing)


def _add_error_handlers(app: FastAPI) -> None:
    """422 with brief reasons for invalid requests; 500 with one line for anything unforeseen; under /v1/ each in
    OpenAI's error shape (400 for an invalid request); a route's own refusal (APIError) as it is."""
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        brief = [{"loc": _located(e.get("loc", ()))} | {k: e.get(k, "") for k in ("msg", "type")} for e in err.errors()]
        return _shaped(request, 422, brief)  # without the echoed input: it may be a megabyte

    @app.exception_handler(InputError)
    async def refused(request: Request, err: InputError) -> JSONResponse:
        return _shaped(request, 422, str(err))

    @app.exception_handler(APIError)
    async def answered_so(request: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body, status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def unparsable(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 400:  # FastAPI's answer to a body json.loads fails on other than by JSONDecodeError
            return _shaped(request, 422, [{"loc": ["body"], "msg": "body is not valid JSON (nested too deeply?)",
                                           "type": "json_invalid"}])
        if request.url.path.startswith(compat.OPENAI):
            return _shaped(request, err.status_code, str(err.detail))
        return await http_exception_handler(request, err)

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=err)
        return _shaped(request, 500, f"internal error ({type(err).__name__}); see the server log")


def _shaped(request: Request, status: int, detail: Any) -> JSONResponse:
    """{"detail": ...} with `status`; under /v1/, OpenAI's error body, a 422 as its 400."""
    if request.url.path.startswith(compat.OPENAI):
        status = 400 if status == 422 else status
        return JSONResponse(compat.openai_body(status, detail), status_code=status)
    return JSONResponse({"detail": detail}, status_code=status)


def _located(loc: tuple) -> list:
    """A validation error's location without the tag of the schema it was read as (compat.either): as before."""
    return [part for i, part in enumerate(loc) if not (i == 1 and part in compat.SCHEMA_TAGS)]


# ---- loading and serving ----------------------------------------------------------------------------
def load_pipelines(model: str, tasks: list[str] | None = None, precision: str = "fp32",
                   fill_mask_model: str | None = None, task_options: dict[str, dict[str, Any]] | None = None,
                   **options: Any) -> tuple[dict[str, Pipeline], dict[str, str]]:
    """The pipelines this checkpoint loads as (of `tasks`, default all), and why each other one does not.
    fill_mask_model: serves /fill-mask where `model` has no masked-LM head (serve: the shipped default);
    task_options: one task's own options over `options` (serve --index: embed encodes as the index was built)."""
    names = list(pipeline_classes())
    wanted = list(tasks or names)
    unknown = [t for t in wanted if t not in names]
    if unknown:
        raise InputError(f"--tasks {', '.join(unknown)}: expected some of {', '.join(names)}")
    loaded, reasons = {}, {t: "not asked for (--tasks)" for t in names if t not in wanted}
    for task in wanted:
        try:
            loaded[task] = pipeline(task, model, precision, **options | (task_options or {}).get(task, {}))
        except MissingHeadError as err:
            reasons[task] = str(err)
            if task == "fill-mask" and fill_mask_model:  # only then: a second model costs memory and start-up
                _load_fill_mask_fallback(loaded, reasons, model, fill_mask_model, precision, **options)
        except EncoderlabError as err:  # InputError: wrong kind of model; CheckpointError: weights missing
            reasons[task] = str(err)
    if not loaded:
        raise InputError(f"{model}: no endpoint can be served: " + "; ".join(f"{t}: {r}" for t, r in reasons.items()))
    log.info("serving %s: %s", model, ", ".join(f"/{t}" for t in loaded))
    for task, reason in reasons.items():
        log.info("no /%s: %s", task, reason)
    return loaded, reasons


def _load_fill_mask_fallback(loaded: dict[str, Pipeline], reasons: dict[str, str], model: str, fallback: str,
                             precision: str, **options: Any) -> None:
    """Serve /fill-mask by `fallback` (moved from reasons to loaded), or add why that failed too to its reason."""
    try:
        loaded["fill-mask"] = pipeline("fill-mask", fallback, precision, **options)
    except EncoderlabError as err:
        reasons["fill-mask"] += f"; and {fallback} could not serve it either: {err}"
        return
    del reasons["fill-mask"]
    log.info("/fill-mask by %s: %s has no masked-LM head", fallback, model)


def check_exposure(host: str, api_key: str | None) -> None:
    """InputError when `host` is reachable from other machines (not loopback) and no API key guards it."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may well resolve to a public address
        loopback = False
    if not loopback and not api_key:
        raise InputError(f"--host {host}: serving beyond this machine needs an API key; set {API_KEY_ENV} or "
                         f"pass --api-key-file FILE (or serve on 127.0.0.1)")


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, tasks: list[str] | None = None,
          precision: str = "fp32", limits: Limits | None = None, batch_size: int = 32,
          max_length: int | None = None, log_level: str = "info", compile: bool = False,
          fill_mask_model: str | None = DEFAULT_FILL_MASK_MODEL, api_key: str | None = None, engine: str = "torch",
          engine_cache: str | None = None, device: str | torch.device = "cpu",
          task_options: dict[str, dict[str, Any]] | None = None, rerank_model: str | None = None,
          index: Callable[[dict[str, Pipeline]], Routes] | None = None) -> None:
    """Load the model's pipelines (/fill-mask by fill_mask_model where the model has no masked-LM head) on `device`
    and serve them with uvicorn until interrupted; a host other than loopback needs an api_key (check_exposure);
    engine: what runs the encoder (encoderlab.infer.backends); task_options: load_pipelines'; rerank_model: /rerank
    by this cross-encoder; index: the routes of an index, made from the loaded pipelines (serve --index)."""
    import uvicorn

    check_exposure(host, api_key)
    options = {"batch_size": batch_size, "compile": compile, "engine": engine, "engine_cache": engine_cache,
               "device": device} | ({"max_length": max_length} if max_length else {})
    pipelines, reasons = load_pipelines(model, tasks, precision, fill_mask_model, task_options, **options)
    if rerank_model:
        pipelines["rerank"] = pipeline("rerank", rerank_model, precision, **options)
        reasons.pop("rerank", None)
    app = create_app(pipelines, limits or Limits(), model=str(model), unavailable=reasons, api_key=api_key,
                     loopback_only=not api_key,  # check_exposure: no key means a loopback host
                     index=index(pipelines) if index else None)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    log.info("encoderlab serve: %s on http://%s:%d/ (the playground; API docs: http://%s:%d/docs)%s", model, shown,
             port, shown, port, ", API key required" if api_key else "")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
