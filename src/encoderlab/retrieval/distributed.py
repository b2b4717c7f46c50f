"""`index` under torchrun: shards are the unit of work. Shard k goes to rank k % world_size, so every shard holds the
documents, embedded in the batches, of a one-process build, and the index is the same file for file. Each rank
writes its own finished shards into the one folder (a filesystem every node shares), then rank 0 builds BM25 and
marks the index complete.

    every rank:  read-only checks (folder, corpus, model, resume)      the same files, so the same verdict
    barrier      START: a rank that failed its checks has exited; torchrun stops the others
    rank 0:      empties the folder (--overwrite), writes index.json (incomplete)
    barrier      START
    every rank:  its unfinished shards, on its device (cuda:LOCAL_RANK under CUDA, else the CPU)
    barrier      WAIT: the slowest rank's shards
    rank 0:      BM25, index.json complete; the other ranks leave (the index is rank 0's to open)

The only collectives are barriers, so the process group is gloo on CUDA too (no tensor crosses ranks; gloo's
monitored_barrier names a rank that never arrives instead of hanging).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist

from encoderlab.engine import resolve_device
from encoderlab.errors import InputError
from encoderlab.train import distributed
from encoderlab.train.distributed import Dist

START = timedelta(minutes=10)  # every rank's checks and model load: a rank slower than this is lost
WAIT = timedelta(hours=12)  # ranks' shares differ by one shard at most, but nodes may differ in speed


def rank_device(device: str | None, local_rank: int, cuda: bool) -> str:
    """The device a rank encodes on under torchrun: cuda:LOCAL_RANK where CUDA is asked for or present (--device
    cuda or none given), else the CPU; InputError for --device cuda:N (one device per rank, chosen by torchrun)."""
    if device not in (None, "cpu", "cuda"):
        raise InputError(f"--device {device}: under torchrun each rank uses cuda:LOCAL_RANK (pass --device cuda, or "
                         f"none)")
    if device == "cuda" and not cuda:
        raise InputError("--device cuda: CUDA is not available on this machine (use --device cpu)")
    return f"cuda:{local_rank}" if device != "cpu" and cuda else "cpu"


def join(device: str | None = None) -> Dist:
    """This process's rank and device: alone without torchrun (--device resolved as every command does), else the
    process group torchrun describes, joined (gloo; a collective waits up to WAIT) after the caller's checks."""
    if distributed.world_size() == 1:
        return Dist(0, 1, resolve_device(device))
    name = rank_device(device, int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.is_available())
    return distributed.setup(name, backend="gloo", timeout=WAIT)


def owns(ranks: Dist, shard: int) -> bool:
    """Whether shard number `shard` is this rank's to encode."""
    return shard % ranks.world_size == ranks.rank


def own_documents(meta: dict[str, Any], ranks: Dist) -> int:
    """Documents in this rank's shards of every source (its progress bar's total)."""
    size, total = meta["shard_size"], 0
    for source in meta["sources"]:
        for k in range(math.ceil(source["documents"] / size)):
            if owns(ranks, source["first_shard"] + k):
                total += min(size, source["documents"] - k * size)
    return total


def wait(ranks: Dist, timeout: timedelta) -> None:
    """Every rank reaches this point, or RuntimeError naming the ranks that did not within `timeout`."""
    if ranks.world_size > 1:
        torch_dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)


def main_then_all(ranks: Dist, write: Callable[[], None]) -> None:
    """Rank 0 writes once every rank has checked its inputs (nothing changes under a rank still reading); every
    rank goes on once it has."""
    wait(ranks, START)
    if ranks.is_main:
        write()
    wait(ranks, START)
