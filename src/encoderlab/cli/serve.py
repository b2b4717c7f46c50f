"""`encoderlab serve`: one model behind an HTTP API (see encoderlab.infer.server)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from typing import Any

from encoderlab.cli.options import MODEL_HELP, add_inference_options, add_options, apply_threads, resolve_device
from encoderlab.cards import served
from encoderlab.errors import InputError
from encoderlab.infer.limits import API_KEY_ENV, Limits
from encoderlab.retrieval.meta import (PIPELINE_OF_KIND, check_model, index_kind, own_model, read_meta,
                                       require_complete)



def cmd_serve(args: argparse.Namespace) -> None:
    """Serve one model over HTTP: /embed, /classify, /fill-mask, /ner, /qa, /rerank (whichever it supports), /health,
    /docs; OpenAI's /v1/embeddings, TEI's routes and /metrics beside them.
    /fill-mask, where the model has no masked-LM head, is answered by the shipped encoderlab-fill-mask.
    With --index DIR, also POST /search over that index (docs/retrieval.md)."""
    key = api_key(args.api_key_file)  # --batch-size and --max-length: checked before any command runs (main)
    meta = check_index(args)
    device = resolve_device(args.device)
    from encoderlab.infer import server  # FastAPI, uvicorn and torch: imported to serve, after the options are checked

    server.log.setLevel(logging.DEBUG if args.verbose else logging.INFO)  # which endpoints are up, the docs URL
    apply_threads(args.threads)
    limits = Limits(args.max_batch, args.max_text_chars, args.max_body_bytes, args.batch_wait_ms, args.body_timeout_s)
    server.serve(args.model or meta["model"]["path"], args.host, args.port, args.tasks, args.precision, limits,
                 args.batch_size, args.max_length, "debug" if args.verbose else "info", args.compile, api_key=key,
                 engine=args.engine, engine_cache=args.engine_cache, device=device, **index_options(args, meta))


def check_index(args: argparse.Namespace) -> dict[str, Any]:
    """--index's index.json (empty without --index): a finished index, served with its own model (--model, where
    given, must be that model), with the embed endpoint; --model or --index given, --rerank only with --index.
    Checked before torch loads."""
    if not args.index:
        if not args.model:
            raise InputError("serve needs --model M, or --index DIR (an index, served with its own model)")
        if args.rerank:
            raise InputError("--rerank M reranks POST /search's hits: it needs --index DIR")
        return {}
    meta = read_meta(args.index)
    require_complete(args.index, meta)
    check_model(args.index, meta, args.model)
    if not args.model:
        own_model(args.index, meta)  # served with the model at its recorded path: unchanged since the build
    encoder = PIPELINE_OF_KIND[index_kind(meta)]  # embed, splade or colbert: what encodes the index's queries
    if args.tasks and encoder not in args.tasks:
        raise InputError(f"--tasks {' '.join(args.tasks)}: --index {args.index} ({index_kind(meta)}) needs "
                         f"{encoder} (its queries' encoder)")
    return meta


def index_options(args: argparse.Namespace, meta: dict[str, Any]) -> dict[str, Any]:
    """server.serve's options for --index and --rerank: the embed pipeline as the index was built, the routes."""
    if not args.index:
        return {}
    from encoderlab.retrieval.meta import query_settings
    from encoderlab.retrieval.serving import IndexRoutes  # torch: after the checks

    kind = index_kind(meta)
    settings = query_settings(meta) if kind == "dense" else {"max_length": meta["max_length"]}
    return {"task_options": {PIPELINE_OF_KIND[kind]: settings}, "rerank_model": args.rerank,
            "index": lambda pipelines: IndexRoutes(args.index, pipelines)}


def api_key(path: Path | None) -> str | None:
    """The key in --api-key-file, else in $ENCODERLAB_API_KEY (either stripped); None when neither gives one."""
    key = (path.read_text(encoding="utf-8") if path else os.environ.get(API_KEY_ENV, "")).strip()
    if path and not key:
        raise InputError(f"--api-key-file {path}: the file is empty (expected the key)")
    return key or None


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """serve."""
    p = subparsers.add_parser("serve", help="serve a model over HTTP (FastAPI; docs at /docs)",
                              description=cmd_serve.__doc__)
    p.add_argument("--model", default=None, metavar="M", help=f"{MODEL_HELP}; with --index, the index's own model "
                   f"unless given (it must be that model)")
    p.add_argument("--index", default=None, metavar="DIR", help="also serve POST /search over this index folder "
                   "(encoderlab index: dense, sparse or multi-vector), its queries encoded by its own model")
    p.add_argument("--rerank", default=None, metavar="M", help="--index: a cross-encoder that /search requests may "
                   "ask to rerank their hits (\"rerank\": true); it serves /rerank too")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--api-key-file", type=Path, metavar="FILE", help=f"require the key in this file "
                   f"in every request's X-API-Key header, or as Authorization: Bearer KEY (OpenAI's and TEI's "
                   f"clients; default: ${API_KEY_ENV} if set); needed for a --host "
                   f"other than loopback. Never on the command line: other users can read it in the process list")
    tasks = [card.name for card in served()]  # before torch loads: every card with a pipeline
    p.add_argument("--tasks", nargs="+", choices=tasks, metavar="TASK",
                   help=f"endpoints to offer, of {', '.join(tasks)} (default: every one the model supports)")
    add_inference_options(p)
    add_options(p, (
        ("--max-batch", int, Limits.max_batch, "N",
         f"most texts in one request, and in one micro-batch (default: {Limits.max_batch})"),
        ("--max-text-chars", int, Limits.max_text_chars, "N",
         f"most characters in one text (default: {Limits.max_text_chars})"),
        ("--max-body-bytes", int, Limits.max_body_bytes, "N",
         f"largest request body; larger gets 413 (default: {Limits.max_body_bytes})"),
        ("--batch-wait-ms", float, Limits.batch_wait_ms, "MS",
         f"how long a request waits for others to batch with (default: {Limits.batch_wait_ms})"),
        ("--body-timeout-s", float, Limits.body_timeout_s, "S",
         f"most seconds a client may take to send its body; slower gets 408 (default: {Limits.body_timeout_s:g})")))
    p.set_defaults(func=cmd_serve)
