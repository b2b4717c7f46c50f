"""Inference precision: fp32, bf16, int8, or `auto` (the fastest this machine supports, measured).

- bf16: weights and activations in bfloat16, only where the hardware computes in it (x86 AVX512-BF16 or AMX, Arm
  BF16, a CUDA GPU that reports it); elsewhere it is emulated and slower, so a request falls back to fp32 with a
  warning. LayerNorm and softmax too: embeddings stay within cosine 0.999 of fp32 (tests/test_pipelines.py).
- int8: every nn.Linear of the encoder with int8 weights (one scale per output channel) and activations
  quantized on the fly with one scale per token. Per-token scales matter for BERT-style models, whose outlier
  dimensions vary by token (Dettmers et al. 2022, LLM.int8(), section 3): torch's `quantize_dynamic` (one scale
  per tensor, 7-bit activations on x86) drops MiniLM's embeddings to cosine 0.88 of fp32, per-token scales keep
  0.997 (STS-B dev; Spearman 0.2 points below fp32, `bench/inference.py`). The kernel follows the CPU
  (`int8_kernel`), as no one kernel is fast on every x86 CPU:
  - "int_mm" (VNNI or AMX): `torch._int_mm`, oneDNN's VNNI kernel, 2.7x fp32 compiled sentences/s with
    --compile on AVX-512 VNNI. Without VNNI it is a slow loop (60x slower than fp32 on a 2-core AVX2 EPYC).
  - "fbgemm" (AVX2 or AVX-512 without VNNI): fbgemm's dynamic linear, behind torch's `quantize_dynamic`,
    1.6-3.2x faster than fp32 for MiniLM's shapes on that EPYC. It quantizes its input per tensor, so each row
    is divided by its own maximum first and the output multiplied back: a per-token scale, the matmul being linear.
  - none elsewhere (Arm, x86 without AVX2): no kernel was measured faster than fp32; a request runs fp32.
  Around the matmuls, bf16 where the CPU has it (memory-bound ops, half the traffic), else fp32. With int_mm, the
  passes around each matmul (per-token scales and quantization before it; scales, bias and a feed-forward block's
  GELU after it) are compiled at load (`compile_int8_matmul`: 2-3 s, 5 to 15 s the first time on a machine, before
  inductor's disk cache holds them), and run eagerly where nothing compiles. Under --compile the model is
  traced whole instead, and the exact GELU is an op the compiler does not look into: fused into the next per-token
  quantization, erf ran twice per element (a quarter of MiniLM's time on SST-2).
- auto: times one forward pass of a representative batch in each supported mode and keeps the fastest.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.choices import INFERENCE_PRECISIONS as PRECISIONS
from encoderlab.errors import ConfigError
from encoderlab.nn.mlp import FeedForward

log = logging.getLogger(__name__)


@functools.cache
def cpuinfo(*names: str) -> str:
    """The value of the first /proc/cpuinfo line that starts with one of `names` ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith(names)), "")
    except OSError:
        return ""


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo (x86 "flags", Arm "Features"; empty where there is no such file)."""
    return frozenset(cpuinfo("flags", "Features").split())


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


# x86 flags of an int8 dot-product instruction that accumulates in int32 (AVX512-VNNI, AVX-VNNI, AMX-INT8):
# oneDNN's int8 kernels, behind torch._int_mm, need one of them to be fast.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def int8_kernel(device: torch.device | str = "cpu") -> str | None:
    """The int8 matmul kernel that beats fp32 on this device: "int_mm", "fbgemm", or None (int8 not offered)."""
    if torch.device(device).type != "cpu":
        return None
    flags = cpu_flags()
    if flags & VNNI_FLAGS and _int_mm_works():
        return "int_mm"
    return "fbgemm" if "avx2" in flags and "fbgemm" in torch.backends.quantized.supported_engines else None


def int8_supported(device: torch.device | str = "cpu") -> bool:
    """int8 runs where this device has an int8 kernel faster than fp32 (`int8_kernel`)."""
    return int8_kernel(device) is not None


def int8_matmul(x: torch.Tensor, weight_t: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                gelu: bool = False) -> torch.Tensor:
    """x (M, K) times int8 weights (K, N) with one scale per column (N,), plus the bias (N,), then the exact GELU if
    asked: (M, N) in x's dtype. x is quantized with one scale per row, its largest magnitude mapped to 126 (not 127:
    in bf16, x / scale can round up past 127.5 and wrap around in int8). In-place ops touch only tensors made here,
    so the function also runs compiled (compile_int8_matmul)."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-4).div_(126)  # (M, 1)
    acc = torch._int_mm(torch.div(x, scale).round_().to(torch.int8), weight_t)  # (M, N) int32
    # Cast first: `int32 * float` in one op runs a slow mixed-dtype loop on the CPU (32 ms for a 4096 x 1536 output
    # at 1 thread on an Ice Lake, as long as the fp32 matmul; cast, then scale in place: 8 ms).
    y = acc.to(scale.dtype).mul_(scale)
    y = y.mul_(weight_scale) if bias is None else torch.addcmul(bias, y, weight_scale, out=y)
    return F.gelu(y) if gelu else y


_compiled_matmul: dict[torch.dtype, Callable[..., torch.Tensor]] = {}  # dtype -> int8_matmul compiled, warmed up


def compile_int8_matmul(dtype: torch.dtype, variants: Iterable[tuple[bool, bool]]) -> bool:
    """Compile `int8_matmul` and run it once in `dtype` for each (bias, GELU) variant a model has; False (and the
    eager function, logged) where this machine cannot compile. Eager, the passes around the int8 matmul (scales,
    quantization, then cast, scales, bias, GELU) are each a pass over memory into a fresh tensor (page faults) and
    cost as much as the matmul itself; compiled, they are two generated loops, and the call is one guard check.
    On int8 MiniLM that took 256-token passages from 1.14x to 1.63x fp32 at 1 thread on an AVX-512 VNNI Ice Lake
    (bench/results/icelake-avx512-vnni/inference.json, docs/inference.md). fbgemm's linear (AVX2) quantizes inside its kernel and gained nothing compiled here."""
    matmul = _compiled_matmul.get(dtype) or torch.compile(int8_matmul, dynamic=True)
    x, weight, bias = torch.randn(4, 8, dtype=dtype), torch.ones(8, 6, dtype=torch.int8), torch.randn(6, dtype=dtype)
    started = time.perf_counter()
    try:
        for with_bias, gelu in sorted(set(variants)):  # each compiles now, not in the first request
            matmul(x, weight, bias.abs(), bias if with_bias else None, gelu)
    except Exception as err:  # noqa: BLE001 - any failure to compile (no C++ compiler, an old torch) means eager
        log.warning("int8: could not compile the passes around the int8 matmuls (%s); running them eagerly, slower",
                    str(err).splitlines()[0] if str(err) else type(err).__name__)
        _compiled_matmul.pop(dtype, None)
        return False
    _compiled_matmul[dtype] = matmul
    log.info("int8: compiled the passes around the int8 matmuls in %.1f s", time.perf_counter() - started)
    return True


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 per output channel and x quantized per token at run time: (..., K) -> (..., N)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.gelu = False  # the exact GELU applied to the output, in its last pass (_convert_int8 sets it)
        weight = linear.weight.detach().float()  # (N, K)
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127  # (N,)
        self.register_buffer("weight_t", (weight / scale[:, None]).round().to(torch.int8).t().contiguous())  # (K, N)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        args = (x.reshape(-1, shape[-1]), self.weight_t, self.weight_scale.to(x.dtype),
                None if self.bias is None else self.bias.to(x.dtype))
        if torch.compiler.is_compiling():
            # In a model compiled whole (--compile): the plain function, which inductor fuses with its neighbours,
            # and the GELU one opaque op (see opaque_gelu).
            y = int8_matmul(*args)
            y = opaque_gelu(y) if self.gelu else y
        else:
            y = _compiled_matmul.get(x.dtype, int8_matmul)(*args, self.gelu)
        return y.reshape(*shape[:-1], -1)


class FbgemmInt8Linear(nn.Module):
    """y = x W^T + b by fbgemm's dynamic int8 linear, W int8 per output channel, x per token: (..., K) -> (..., N).
    Weights in 7 bits, activations in 8: AVX2's vpmaddubsw adds pairs of u8 x s8 products into a saturating int16
    (Intel SDM vol. 2, PMADDUBSW) and 255 * 63 * 2 < 32768. torch's reduce_range (7-bit activations) cost more on
    MiniLM (SST-2 cosine to fp32 0.9942 mean, 0.964 min, against 0.9955, 0.983); 8-bit weights saturated (0.977)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.gelu = False  # the exact GELU applied to the output, in its last pass (_convert_int8 sets it)
        weight = linear.weight.detach().float()  # (N, K)
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 63  # (N,)
        with warnings.catch_warnings(), _quantized_engine("fbgemm"):
            # Creating quantized tensors is deprecated (pytorch/pytorch#184982) but is still the only way into
            # fbgemm's prepacked weights; it runs once per layer, here.
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scale.double(), torch.zeros_like(scale, dtype=torch.long),
                                                 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (M, K)
        # fbgemm quantizes its input with one scale per tensor: rows brought to a maximum of 1 first make that
        # scale one per token (reduce_range=False: the full 8 bits, see the class docstring).
        scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-4)  # (M, 1)
        y = torch.ops.quantized.linear_dynamic(x / scale, self.packed, False)  # (M, N) fp32
        # In place: a fresh (M, N) tensor per layer (addcmul) cost page faults, 9% of 256-token passages' time.
        y = y.mul_(scale).add_(self.bias) if self.bias is not None else y.mul_(scale)
        y = opaque_gelu(y) if self.gelu else y  # F.gelu eagerly; one op a model compiled whole does not fuse
        return y.reshape(*shape[:-1], -1)


@contextlib.contextmanager
def _quantized_engine(engine: str) -> Iterator[None]:
    """torch's quantized engine set to `engine` inside the block (prepacking reads this global)."""
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


INT8_LINEARS: dict[str, type[nn.Module]] = {"int_mm": Int8Linear, "fbgemm": FbgemmInt8Linear}


@torch.library.custom_op("encoderlab::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


@_gelu_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def opaque_gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU as one op that torch.compile calls rather than fuses (a plain function, so models deep-copy)."""
    return _gelu_op(x)


def no_activation(x: torch.Tensor) -> torch.Tensor:
    """x itself: a feed-forward block's activation once its up-projection applies it."""
    return x


def quantize_int8(model: nn.Module, kernel: str = "int_mm") -> nn.Module:
    """Every nn.Linear replaced by the int8 linear of `kernel` (a key of INT8_LINEARS), in place; returns the model."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, INT8_LINEARS[kernel](child))
        else:
            quantize_int8(child, kernel)
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
        return _convert_int8(model)
    raise ConfigError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")


def _convert_int8(model: nn.Module) -> nn.Module:
    """A copy of the model with int8 linears on this CPU's fast kernel (ConfigError where it has none)."""
    kernel = int8_kernel()
    if kernel is None:
        raise ConfigError("precision int8: this CPU has no int8 kernel faster than fp32 (needs x86 AVX2)")
    log.info("int8 matmuls by %s", kernel)
    model = quantize_int8(copy.deepcopy(model), kernel)  # weights quantized from fp32
    for module in model.modules():
        if isinstance(module, FeedForward) and module.act is F.gelu:
            if module.gated:
                module.act = opaque_gelu
            else:  # the up-projection's last pass applies it: one pass over (B, T, I) fewer (1.1x on passages)
                module.up.gelu, module.act = True, no_activation
    # Around the int8 matmuls (LayerNorm, GELU, attention, the (de)quantization passes) bf16 halves the memory
    # traffic where the CPU has bf16 arithmetic; fbgemm's linear takes fp32 only.
    dtype = torch.bfloat16 if kernel == "int_mm" and bf16_supported() else torch.float32
    if kernel == "int_mm":
        linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
        compile_int8_matmul(dtype, {(linear.bias is not None, linear.gelu) for linear in linears})
    return model.to(dtype)


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
        timings[mode] = best_time(lambda: probe(candidate))
        if mode != "fp32":
            del candidate
    best = min(timings, key=timings.get)
    log.info("precision auto: %s", ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in timings.items()))
    return convert(model, best), best


def best_time(run: Callable[[], object], repeats: int = 3) -> float:
    """The fastest of `repeats` timed runs after one warm-up, in seconds."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
