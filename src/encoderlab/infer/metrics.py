"""GET /metrics for `encoderlab serve`, in Prometheus' text format (prometheus_client): requests by route and status,
latency by route, inputs per forward batch and the queue by task. Each app has a registry of its own, so several
apps in one process (the tests) never share a count.

/metrics needs no API key: it holds counts and timings, no text or vector, and Prometheus scrapes without the
app's key (TEI serves it on a port of its own, likewise open). A server beyond loopback that must hide even its
traffic should sit behind a proxy that guards the path."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# seconds: a request on one CPU thread takes milliseconds alone and seconds queued behind 32 clients
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # inputs per forward batch: up to --max-batch (64 by default)


class Metrics:
    """The app's own registry and what it counts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("encoderlab_requests", "HTTP requests answered, by route and status (errors: status "
                                ">= 400)", ["route", "status"], registry=self.registry)
        self.latency = Histogram("encoderlab_request_seconds", "time to the response's status line, by route",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("encoderlab_batch_size", "inputs (texts, pairs or items) per forward batch, by "
                                    "task", ["task"], buckets=BATCH_BUCKETS, registry=self.registry)
        self.queue = Gauge("encoderlab_queue_depth", "requests waiting or running, by task", ["task"],
                           registry=self.registry)

    def watch_queue(self, task: str, depth: Callable[[], float]) -> None:
        """Read the task's queue depth at each scrape."""
        self.queue.labels(task).set_function(depth)

    def add_route(self, app: FastAPI) -> None:
        """GET /metrics: Prometheus' text format, for a scraper."""
        app.get("/metrics", tags=["Monitoring"], summary="Prometheus metrics (text format)",
                response_class=Response)(
            lambda: Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST))


class Measured:
    """ASGI middleware, outermost: counts every answer, refusals by the other middleware included, under its route
    (the path of a route the app has; any other path is "other", so stray URLs add no series)."""

    def __init__(self, app: object, metrics: Metrics, routes: Callable[[], set[str]]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), []

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                self._count(scope["path"], message["status"], started)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not status:  # an exception past every handler: the server answers 500
                self._count(scope["path"], 500, started)

    def _count(self, path: str, status: int, started: float) -> None:
        route = path if path in self.routes() else "other"
        self.metrics.requests.labels(route, str(status)).inc()
        self.metrics.latency.labels(route).observe(time.perf_counter() - started)
