"""Inference precision: fp32, bf16, int8, or `auto` (the fastest this machine supports, measured).

- bf16: weights and activations in bfloat16. Used only where the hardware has bf16 arithmetic (x86 AVX512-BF16
  or AMX, Arm BF16, or a CUDA GPU that reports it); elsewhere bf16 is emulated and slower than fp32, so a
  request for it falls back to fp32 with a warning. LayerNorm and softmax run in bf16 too: for inference the
  embeddings stay within cosine 0.999 of fp32 (tests/test_pipelines.py checks ≥ 0.99 as the issue asks).
- int8: dynamic quantization of every nn.Linear of the encoder: weights int8 with one scale per output channel,
  activations quantized on the fly with one scale per token, an int8 x int8 -> int32 matmul (`torch._int_mm`,
  oneDNN with VNNI on x86), then rescaled. Per-token scales matter for BERT-style models: a few hidden
  dimensions carry outliers that vary by token (Dettmers et al. 2022, LLM.int8(), section 3), and torch's
  stock `quantize_dynamic` (one scale per tensor, 7-bit activations on x86) drops MiniLM's embeddings to
  cosine 0.88 of fp32 where this keeps them at 0.997 (mean over STS-B dev sentences; STS-B Spearman 0.2 points
  below fp32, `bench/inference.py`). Embeddings, LayerNorm, GELU and attention run in bf16 where the CPU has
  it (they are memory-bound, and bf16 halves their traffic), in fp32 elsewhere.
  Under torch.compile (`--compile`) the exact GELU runs as an op the compiler does not look into: fused into
  the next layer's per-token quantization, erf would be evaluated twice per element, once for the row's
  maximum and once for the values (that one kernel took a quarter of MiniLM's time on SST-2).
- auto: times one forward pass of a representative batch in each supported mode and keeps the fastest.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.errors import ConfigError
from encoderlab.nn.mlp import FeedForward

log = logging.getLogger(__name__)
PRECISIONS = ("fp32", "bf16", "int8", "auto")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether the device computes in bf16 natively (not emulated)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    flags = cpu_flags()
    # x86: AVX512-BF16 (Cooper Lake, Zen 4) or AMX-BF16 (Sapphire Rapids); Arm: the BF16 extension.
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def _int_mm_works() -> bool:
    """Whether this torch build has a CPU int8 matmul (torch._int_mm)."""
    try:
        a = torch.ones(32, 32, dtype=torch.int8)
        return bool(torch._int_mm(a, a)[0, 0] == 32)
    except (RuntimeError, AttributeError):
        return False


def int8_supported(device: torch.device | str = "cpu") -> bool:
    """int8 runs on the CPU where torch has an int8 matmul."""
    return torch.device(device).type == "cpu" and _int_mm_works()


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 per output channel and x quantized per token at run time: (..., K) -> (..., N)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # (N, K)
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127  # (N,)
        self.register_buffer("weight_t", (weight / scale[:, None]).round().to(torch.int8).t().contiguous())  # (K, N)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1])  # (M, K)
        # One scale per token; each step below is one pass over memory (around the int8 kernel these passes
        # cost as much as the matmul, so they are few, and in bf16 when the model runs in bf16).
        # 126, not 127: in bf16, x / scale can round up past 127.5 and wrap around in int8.
        scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-4).div_(126)  # (M, 1)
        quantized = torch.div(x, scale).round_().to(torch.int8)
        y = torch._int_mm(quantized, self.weight_t) * scale  # int32 (M, N) * (M, 1) -> x's dtype, one pass
        scale_out = self.weight_scale.to(dtype)
        y = torch.addcmul(self.bias.to(dtype), y, scale_out) if self.bias is not None else y.mul_(scale_out)
        return y.reshape(*shape[:-1], -1)


@torch.library.custom_op("encoderlab::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


@_gelu_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def opaque_gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU as one op that torch.compile calls rather than fuses (a plain function, so models deep-copy)."""
    return _gelu_op(x)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Every nn.Linear replaced by an Int8Linear, in place; returns the model."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize_int8(child)
    return model


def supported(device: torch.device | str = "cpu") -> list[str]:
    """The concrete modes this device runs, fp32 first."""
    modes = ["fp32"]
    if bf16_supported(device):
        modes.append("bf16")
    if int8_supported(device):
        modes.append("int8")
    return modes


def convert(model: nn.Module, precision: str) -> nn.Module:
    """A copy of an eval-mode model in `precision` (fp32 returns the model itself)."""
    if precision == "fp32":
        return model
    if precision == "bf16":
        return copy.deepcopy(model).to(torch.bfloat16)
    if precision == "int8":
        # Around the int8 matmuls (LayerNorm, GELU, attention, the (de)quantization passes) bf16 halves the
        # memory traffic where the CPU has bf16 arithmetic; elsewhere those parts stay in fp32.
        model = quantize_int8(copy.deepcopy(model))  # weights quantized from fp32
        for module in model.modules():
            if isinstance(module, FeedForward) and module.act is F.gelu:
                module.act = opaque_gelu
        return model.to(torch.bfloat16) if bf16_supported() else model
    raise ConfigError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")


def resolve(model: nn.Module, precision: str, probe: Callable[[nn.Module], object] | None = None,
            device: torch.device | str = "cpu") -> tuple[nn.Module, str]:
    """The model converted to `precision` and the concrete mode chosen (auto → the fastest by `probe`)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    modes = supported(device)
    if precision != "auto":
        if precision not in modes:
            log.warning("precision %s is not supported on this %s (supported: %s); using fp32",
                        precision, torch.device(device).type, ", ".join(modes))
            precision = "fp32"
        return convert(model, precision), precision
    if probe is None or len(modes) == 1:
        return convert(model, modes[-1]), modes[-1]
    timings = {}
    for mode in modes:
        candidate = convert(model, mode)
        timings[mode] = _time(lambda: probe(candidate))
        if mode != "fp32":
            del candidate
    best = min(timings, key=timings.get)
    log.info("precision auto: %s", ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in timings.items()))
    return convert(model, best), best


def _time(run: Callable[[], object], repeats: int = 3) -> float:
    """The fastest of `repeats` timed runs after one warm-up, in seconds."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
