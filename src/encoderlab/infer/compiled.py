"""torch.compile for inference (`--compile`): each chain of small ops in the encoder fused into one C++ loop.

In eager mode every elementwise step (int8 (de)quantize, bias, GELU, residual, LayerNorm, mask, softmax) is its
own pass over memory and Python dispatch; at SST-2 lengths (~25 tokens) they cost as much as the matmuls (int8
MiniLM: matmuls 45% of the time). Inductor fuses each chain into one generated loop.
- Only the encoder is compiled, in place, with dynamic batch and sequence axes: a new length reuses the code.
- The first call compiles (10 to 40 s on 2 cores); later processes reuse inductor's disk cache. It needs a C++
  compiler at run time: where compiling fails, loading stops with a ConfigError that says so.
- Dynamo keeps at most 8 compiled variants per process (`recompile_limit`), then warns and runs eagerly; one or a
  few compiled pipelines per process are well inside it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from torch import nn

from encoderlab.errors import ConfigError
from encoderlab.nn.encoder import Encoder

log = logging.getLogger(__name__)


def compile_encoders(model: nn.Module, warm_up: Callable[[nn.Module], object]) -> None:
    """Compile every Encoder inside `model` in place and run `warm_up(model)` once (the compiling: logged)."""
    encoders = [module for module in model.modules() if isinstance(module, Encoder)]
    if not encoders:
        raise ConfigError(f"--compile: {type(model).__name__} holds no encoder to compile")
    for encoder in encoders:
        encoder.compile(dynamic=True)
    started = time.perf_counter()
    try:
        warm_up(model)
    except RuntimeError as err:  # torch._dynamo's errors (no C++ compiler, an op it cannot trace) are RuntimeErrors
        for encoder in encoders:
            encoder._compiled_call_impl = None  # nn.Module.compile's hook: back to eager for anyone holding the model
        raise ConfigError(f"--compile: torch.compile failed on this machine ({_reason(err)}); "
                          f"run without --compile") from err
    log.info("compiled the encoder in %.1f s", time.perf_counter() - started)


def _reason(err: RuntimeError) -> str:
    """One line on why compiling failed: the backend's own error where dynamo wrapped one (its message's first
    line is only "backend='inductor' raised:")."""
    inner = getattr(err, "inner_exception", None)  # torch._dynamo.exc.BackendCompilerFailed
    cause = inner if isinstance(inner, BaseException) else err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
