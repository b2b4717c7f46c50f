"""Helpers shared by every bench script: what machine and versions a figure came from, the matmul peak,
and one results format (bench/results/NAME.json with machine, versions, command, figures, goals).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from encoderlab.compare import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"


def _cpu_flags() -> list[str]:
    """The vector-ISA flags that decide matmul speed on x86 (AVX2, AVX-512, bf16, AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return [flag for flag in wanted if flag in flags]


def _memory_gib() -> float | None:
    """Total RAM in GiB (Linux), or None where /proc/meminfo is unavailable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """CPU model, cores, threads torch uses, memory, and the GPU if there is one."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_name(), "cpu_flags": _cpu_flags(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "memory_gib": _memory_gib(), "gpu": gpu,
            "platform": platform.platform()}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of python and of the packages a figure depends on (None where one is not installed)."""
    import encoderlab

    return {"python": platform.python_version(), "torch": torch.__version__, "encoderlab": encoderlab.__version__,
            "transformers": _version("transformers"), "tokenizers": _version("tokenizers"),
            "numpy": _version("numpy")}


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of an (n, n) @ (n, n) torch.matmul in `dtype` over `reps` timed runs after one warm-up."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best


def goal(what: str, value: float, target: float) -> dict[str, Any]:
    """One goal line: met when value >= target."""
    return {"what": what, "value": round(value, 3), "target": target, "met": bool(value >= target)}


def write_results(name: str, command: str, figures: dict[str, Any], goals: list[dict[str, Any]]) -> Path:
    """Write bench/results/NAME.json (machine, versions, command, figures, goals) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"machine": machine(), "versions": versions(), "command": command, "figures": figures, "goals": goals}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path


def command_line() -> str:
    """The command that ran this script, as it could be typed again from the repository root."""
    return " ".join(["python", *sys.argv])
