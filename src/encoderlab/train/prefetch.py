"""Steps built ahead in worker processes, so an accelerator never waits for the host to build its next batch.

A step's data is planned in the main process (which examples: a cursor moving through a deterministic order, a
few microseconds) and built in a worker (reading tokens, masking, padding: most of the host's time). torch's
DataLoader runs the builds: its sampler yields the plans in order, each worker builds the steps it is handed,
and the loader returns them in plan order; `pin_memory` makes the copy to a GPU asynchronous. A plan carries the
data position after its step, and the position this object reports (and a checkpoint saves) is the one after the
last step handed to the loop, never one the workers have reached: a step's batches are a function of its plan
alone, so they are the same with 0, 1 or 8 workers, and a resumed run equals an uninterrupted one. A step travels
as one int32 tensor (`pack`), cut back into its batches' tensors where it lands and widened to int64 on the device
(encoderlab.train.loop.to_device).

Workers ignore SIGINT and SIGTERM: Ctrl-C, `timeout` and Slurm signal the whole process group, and a worker killed
by such a signal would make the loader raise in the main process before it could save. The main process alone
handles the signal (encoderlab.train.state.DeferredInterrupt) and shuts its workers down when the run ends.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

PREFETCH_STEPS = 4  # steps each worker builds ahead of the loop (DataLoader's prefetch_factor)
# Workers start as forks where the platform has them: they share the memory-mapped shards and the epoch's plan,
# built before, instead of unpickling them (they never touch CUDA, so a fork after CUDA's start is safe).
_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


class Plannable(Protocol):
    """StepData whose steps are planned (cheap, in order) and built (costly, anywhere) apart."""

    def plan(self, rank: int, world_size: int, grad_accum: int) -> Any:
        """The next step's plan (plain data); moves the position past it."""

    def build(self, plan: Any) -> list[dict[str, Any]]:
        """The micro-batches of a plan."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def default_workers(device: torch.device, world_size: int = 1) -> int:
    """Data workers per rank when the recipe says auto (-1): on CUDA up to 4, leaving a core to the main process;
    on CPU none, since the model's own threads use every core and a worker would take one from them."""
    if device.type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores // max(world_size, 1) - 1))


def _ignore_stop_signals(worker_id: int) -> None:
    """In a worker: leave SIGINT and SIGTERM to the main process (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _Plans(Sampler):
    """The plans of the steps from the data's current position on, each with the position after it."""

    def __init__(self, data: Plannable, rank: int, world_size: int, grad_accum: int) -> None:
        self.data, self.shape = data, (rank, world_size, grad_accum)

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        while True:
            plan = self.data.plan(*self.shape)
            yield plan, self.data.state_dict()


class _Builds(Dataset):
    """A plan in, its micro-batches (and the position after them) out; runs in the workers."""

    def __init__(self, data: Plannable) -> None:
        self.data = data

    def __getitem__(self, item: tuple[Any, dict[str, Any]]) -> tuple[Packed, dict[str, Any]]:
        plan, after = item
        return pack(self.data.build(plan)), after


Packed = tuple[torch.Tensor, list[tuple[int, str, tuple[int, ...]]], list[dict[str, Any]]]


def pack(batches: list[dict[str, Any]]) -> Packed:
    """A step's micro-batches as one flat int32 tensor (their integer tensors, each a slice), the layout that cuts
    it back, and whatever else they hold. Sent from a worker, each tensor costs a shared-memory segment and a file
    descriptor passed over a socket: five tensors of a 1024 x 128 batch took 23-35 ms to arrive, one takes a few.
    Token ids, labels (-100) and masks all fit int32, half the bytes of int64."""
    parts, layout, rest = [], [], []
    for i, batch in enumerate(batches):
        rest.append({})
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dtype in (torch.int64, torch.int32):
                parts.append(value.reshape(-1))
                layout.append((i, key, tuple(value.shape)))
            else:
                rest[i][key] = value
    flat, at = torch.empty(sum(len(part) for part in parts), dtype=torch.int32), 0
    for part in parts:  # one copy each, narrowed on the way
        flat[at:at + len(part)].copy_(part)
        at += len(part)
    return flat, layout, rest


def unpack(packed: Packed) -> list[dict[str, Any]]:
    """The micro-batches pack() flattened: views of the one tensor (pinned if it was), int32; to_device widens them."""
    flat, layout, rest = packed
    batches, at = [dict(r) for r in rest], 0
    for i, key, shape in layout:
        count = math.prod(shape)
        batches[i][key] = flat[at:at + count].view(shape)
        at += count
    return [{k: b[k] for k in sorted(b)} for b in batches]


class PrefetchedSteps:
    """StepData (encoderlab.train.loop) that builds `workers` x PREFETCH_STEPS steps ahead in worker processes."""

    def __init__(self, data: Plannable, workers: int, pin_memory: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"workers={workers}: PrefetchedSteps needs at least one worker")
        self.data, self.workers, self.pin_memory = data, workers, pin_memory
        self.position = data.state_dict()  # after the last step handed out
        self._loader: DataLoader | None = None
        self._iterator: Iterator | None = None
        self._shape: tuple[int, int, int] | None = None

    def next_step(self, rank: int, world_size: int, grad_accum: int) -> list[dict[str, Any]]:
        if self._iterator is None or self._shape != (rank, world_size, grad_accum):
            self._start(rank, world_size, grad_accum)
        packed, self.position = next(self._iterator)
        return unpack(packed)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go back (or forward) to `state`: the steps built ahead are dropped and planned again from there."""
        self.close()
        self.data.load_state_dict(state)
        self.position = dict(state)

    def close(self) -> None:
        """Stop the workers (they are started again by the next next_step)."""
        self._iterator = self._loader = None  # the iterator's finaliser shuts its workers down

    def _start(self, rank: int, world_size: int, grad_accum: int) -> None:
        self.close()
        self.data.load_state_dict(self.position)  # the sampler plans on from the last step handed out
        self._shape = (rank, world_size, grad_accum)
        self._loader = DataLoader(_Builds(self.data), sampler=_Plans(self.data, rank, world_size, grad_accum),
                                  batch_size=None, num_workers=self.workers, prefetch_factor=PREFETCH_STEPS,
                                  pin_memory=self.pin_memory, worker_init_fn=_ignore_stop_signals,
                                  persistent_workers=False, multiprocessing_context=_CONTEXT,
                                  generator=torch.Generator().manual_seed(0))  # not the global RNG: dropout's
        self._iterator = iter(self._loader)
