"""Micro-batching for `encoderlab serve`: requests that arrive within a few milliseconds of each other go through a
pipeline in one call, on the one model thread. Every route that runs a model (ours, OpenAI's, TEI's) submits here,
so requests of all three schemas share forward passes."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from encoderlab.errors import InputError

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One request's inputs and the future its results go to."""

    items: list[Any]
    key: Hashable  # only jobs with equal keys (same options, same input shape) share a pipeline call
    future: asyncio.Future


@dataclass
class Batcher:
    """Collects jobs for one pipeline and runs them together on the model thread."""

    pipe: Callable[..., list[dict[str, Any]]]  # (items, **options) -> one result per item
    executor: ThreadPoolExecutor
    max_items: int
    wait_s: float
    pending: deque[Job] = field(default_factory=deque)
    running: int = 0
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "texts": 0, "batches": 0, "errors": 0})
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    on_batch: Callable[[int], None] = lambda size: None  # told each forward batch's size (/metrics' histogram)

    async def submit(self, items: list[Any], key: Hashable) -> list[dict[str, Any]]:
        """The results for `items`, computed in a batch with whatever else arrives meanwhile."""
        job = Job(items, key, asyncio.get_running_loop().create_future())
        self.pending.append(job)
        self.arrived.set()
        return await job.future

    async def work(self) -> None:
        """Forever: wait for a job, gather company for up to wait_s, run the batch."""
        while True:
            while not self.pending:
                self.arrived.clear()
                await self.arrived.wait()
            await self._gather()
            jobs = self._take()
            self.running = len(jobs)
            try:
                await self._run(jobs)
            finally:
                self.running = 0

    async def _gather(self) -> None:
        """Wait until max_items are pending or wait_s has passed since now."""
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while sum(len(job.items) for job in self.pending) < self.max_items:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            self.arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self.arrived.wait()
            except TimeoutError:
                return

    def run(self, items: list[Any], key: Hashable) -> list[dict[str, Any]]:
        """The pipeline on the items, with the options of their key (request_items; those not given: its defaults)."""
        return self.pipe(items, **{name: value for name, value in key[0] if value is not None})

    def _take(self) -> list[Job]:
        """Pending jobs up to max_items texts (at least one job), skipping those whose client left."""
        jobs, count = [], 0
        while self.pending and (not jobs or count + len(self.pending[0].items) <= self.max_items):
            job = self.pending.popleft()
            if not job.future.done():
                jobs.append(job)
                count += len(job.items)
        return jobs

    async def _run(self, jobs: list[Job]) -> None:
        """One pipeline call per key; a failed call is retried job by job so each gets its own error."""
        groups: dict[Hashable, list[Job]] = {}
        for job in jobs:
            groups.setdefault(job.key, []).append(job)
        loop = asyncio.get_running_loop()
        for key, group in groups.items():  # a job whose client has gone (future done) is handed nothing
            self.stats["batches"] += 1
            items = [item for job in group for item in job.items]
            self.on_batch(len(items))
            try:
                results = await loop.run_in_executor(self.executor, self.run, items, key)
            except Exception as err:  # noqa: BLE001 -- settled on the jobs; their endpoints answer 422 or 500
                if len(group) > 1:
                    for job in group:
                        await self._run([job])
                elif not group[0].future.done():
                    group[0].future.set_exception(err)
                continue
            for job in group:
                if not job.future.done():
                    job.future.set_result(results[:len(job.items)])
                results = results[len(job.items):]
            self.stats["requests"] += len(group)
            self.stats["texts"] += sum(len(job.items) for job in group)


class Failed(Exception):
    """A pipeline call that failed for a reason other than its input: the log has the traceback."""


async def submit(batcher: Batcher, task: str, items: list[Any], key: Hashable) -> list[dict[str, Any]]:
    """The batcher's results for one request; an InputError passes through as it is, anything else is logged and
    raised again as Failed (one line for the client). Either counts in the batcher's errors."""
    try:
        return await batcher.submit(items, key)
    except Exception as err:
        batcher.stats["errors"] += 1
        if isinstance(err, InputError):
            raise
        log.error("%s failed on a request of %d input(s)", task, len(items), exc_info=err)
        raise Failed(f"internal error in {task} ({type(err).__name__}); see the server log") from err
