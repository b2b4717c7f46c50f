"""torch.distributed set-up for torchrun: one process per device, gloo on CPU, NCCL on CUDA."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class Dist:
    """Where this process stands: rank, world size, and its device."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, evaluates and writes checkpoints."""
        return self.rank == 0

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of a tensor over all ranks (the tensor itself on one process)."""
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.world_size > 1:
            dist.barrier()


def world_size() -> int:
    """Processes torchrun started for this job (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(device: str = "auto", backend: str | None = None, timeout: timedelta | None = None) -> Dist:
    """Join the process group torchrun describes in the environment, or run alone; backend: None for NCCL on CUDA
    and gloo on the CPU; timeout: how long a collective waits for the slowest rank (None: torch's default)."""
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    ranks = world_size()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    target = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(target)
    if ranks > 1 and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if use_cuda else "gloo"), timeout=timeout)
    return Dist(rank, ranks, target)


def is_main_process() -> bool:
    """Whether this process is rank 0 (or runs alone): the one that writes a run's files."""
    return not dist.is_initialized() or dist.get_rank() == 0


def teardown() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_initialized():
        dist.destroy_process_group()
