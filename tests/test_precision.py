"""int8 kernels: the one chosen follows the CPU's flags, and each stays close to fp32, eager and compiled.

cpu_flags is patched to play other CPUs; both kernels run on any x86 CPU (int_mm slowly without VNNI, so the
models here are tiny). The real MiniLM on this machine's own kernel is checked in test_pipelines.py.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.infer import precision as precisions
from encoderlab.nn.mlp import FeedForward

VNNI = frozenset({"avx2", "avx512f", "avx512_vnni"})  # Ice Lake, Zen 4
AMX = frozenset({"avx2", "avx512f", "amx_int8", "amx_bf16", "avx512_bf16"})  # Sapphire Rapids
AVX2 = frozenset({"avx", "avx2", "fma"})  # Zen 1-3, Haswell to Skylake client
ARM = frozenset({"fp", "asimd"})
NO_FBGEMM = "fbgemm" not in torch.backends.quantized.supported_engines

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture
def cpu(monkeypatch):
    """Play a CPU with the given flags: `cpu(AVX2)`."""
    return lambda flags: monkeypatch.setattr(precisions, "cpu_flags", lambda: flags)


class TwoLayers(nn.Module):
    """Linear, GELU, Linear, as in a transformer's feed-forward block: (B, T, 64) -> (B, T, 64)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def tokens_with_an_outlier() -> torch.Tensor:
    """(2, 9, 64) random tokens, one of them 100x larger: one scale per tensor would flatten all the others."""
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(1))
    x[0, 0] *= 100
    return x


def token_cosines(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """(B * T,) cosine of each token's output to its fp32 output."""
    return F.cosine_similarity(got.flatten(0, -2), expected.flatten(0, -2), dim=-1)


@pytest.mark.parametrize(("flags", "kernel"), [(VNNI, "int_mm"), (AMX, "int_mm"), (AVX2, "fbgemm"), (ARM, None)])
def test_int8_kernel_follows_the_cpu_flags(cpu, flags, kernel):
    if kernel == "fbgemm" and NO_FBGEMM:
        pytest.skip("this torch build has no fbgemm")
    cpu(flags)
    assert precisions.int8_kernel() == kernel
    assert ("int8" in precisions.supported()) == (kernel is not None)
    assert precisions.int8_kernel("meta") is None


def test_int8_without_a_fast_kernel_runs_fp32_and_says_so(cpu, caplog):
    cpu(ARM)
    model = TwoLayers().eval()
    with caplog.at_level(logging.WARNING):
        converted, mode = precisions.resolve(model, "int8")
    assert mode == "fp32" and converted is model
    assert any("int8 is not supported" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("flags", "kernel"), [(VNNI, "int_mm"), (AVX2, "fbgemm")])
@pytest.mark.slow
def test_int8_runs_on_the_chosen_kernel_close_to_fp32(cpu, caplog, flags, kernel):
    if kernel == "fbgemm" and NO_FBGEMM:
        pytest.skip("this torch build has no fbgemm")
    cpu(flags)
    model, x = TwoLayers().eval(), tokens_with_an_outlier()
    with caplog.at_level(logging.INFO):
        converted, mode = precisions.resolve(model, "int8")
    assert mode == "int8" and any(kernel in r.getMessage() for r in caplog.records)
    assert {type(m) for m in converted.modules()} >= {precisions.INT8_LINEARS[kernel]}
    assert not any(isinstance(m, nn.Linear) for m in converted.modules())
    with torch.no_grad():
        cosines = token_cosines(converted(x), model(x))
    assert cosines.min() > 0.999, cosines.min()  # every token, the small ones beside the outlier too


def test_fbgemm_linear_keeps_per_token_scales():
    """Each token's output is its own: scaling one token up scales its output and leaves the others bit-equal."""
    if NO_FBGEMM:
        pytest.skip("this torch build has no fbgemm")
    linear = precisions.FbgemmInt8Linear(nn.Linear(64, 32, bias=False))
    x = tokens_with_an_outlier()
    louder = x.clone()
    louder[1, 4] *= 1024  # a power of two: x / scale is bit-equal
    with torch.no_grad():
        before, after = linear(x), linear(louder)
    assert torch.equal(after[1, 4], 1024 * before[1, 4])
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 4] = False
    assert torch.equal(after[mask], before[mask])


@pytest.mark.parametrize(("flags", "kernel"), [(VNNI, "int_mm"), (AVX2, "fbgemm")])
@pytest.mark.slow
def test_int8_kernels_compile(cpu, flags, kernel):
    """Under torch.compile (--compile) each kernel gives its eager results, on two shapes (dynamic axes)."""
    if kernel == "fbgemm" and NO_FBGEMM:
        pytest.skip("this torch build has no fbgemm")
    cpu(flags)
    converted = precisions.convert(TwoLayers().eval(), "int8")
    compiled = torch.compile(converted, dynamic=True)
    with torch.no_grad():
        for x in (tokens_with_an_outlier(), torch.randn(3, 5, 64)):
            torch.testing.assert_close(compiled(x), converted(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compiled_int8_matmul_gives_the_eager_results():
    """int8_matmul compiled (compile_int8_matmul) equals the plain function, with and without bias and GELU: one int8
    linear's output each way, on tokens with an outlier."""
    assert precisions.compile_int8_matmul(torch.float32, [(True, False), (False, False), (True, True)]), \
        "this machine compiles (it has a C++ compiler)"
    x = tokens_with_an_outlier()
    for bias, gelu in ((True, False), (False, False), (True, True)):
        torch.manual_seed(2)
        linear = precisions.Int8Linear(nn.Linear(64, 48, bias=bias))
        linear.gelu = gelu
        with torch.no_grad():
            compiled = linear(x)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(precisions, "_compiled_matmul", {})
                eager = linear(x)
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert torch.float32 in precisions._compiled_matmul


def test_int8_that_cannot_compile_runs_eagerly_and_says_so(cpu, caplog, monkeypatch):
    """Without a C++ compiler int8 still runs, the passes around its matmuls eager, with a warning that it is slower."""
    import torch._inductor.config as inductor

    cpu(VNNI)
    monkeypatch.setattr(precisions, "_compiled_matmul", {})
    torch._dynamo.reset()
    model, x = TwoLayers().eval(), tokens_with_an_outlier()
    with (inductor.patch({"cpp.cxx": (None, "no-such-c++-compiler"), "fx_graph_cache": False}),
          torch.compiler.config.patch(force_disable_caches=True), caplog.at_level(logging.WARNING)):
        converted, mode = precisions.resolve(model, "int8")
    torch._dynamo.reset()
    assert mode == "int8" and precisions._compiled_matmul == {}
    assert any("running them eagerly" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert token_cosines(converted(x), model(x)).min() > 0.999


@pytest.mark.parametrize(("flags", "kernel"), [(VNNI, "int_mm"), (AVX2, "fbgemm")])
@pytest.mark.slow
def test_feed_forward_gelu_moves_into_the_up_projection(cpu, flags, kernel):
    """A feed-forward block's exact GELU runs in its int8 up-projection's last pass: the block's output stays close
    to fp32, and equals itself with eager passes and with the block compiled whole (where the GELU stays opaque)."""
    if kernel == "fbgemm" and NO_FBGEMM:
        pytest.skip("this torch build has no fbgemm")
    cpu(flags)
    torch.manual_seed(3)
    block = FeedForward(64, 256, "gelu").eval()
    converted = precisions.convert(block, "int8")
    assert converted.up.gelu and converted.act is precisions.no_activation and not converted.down.gelu
    x = tokens_with_an_outlier()
    with torch.no_grad():
        fused = converted(x)
        assert token_cosines(fused, block(x)).min() > 0.999
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(precisions, "_compiled_matmul", {})
            torch.testing.assert_close(converted(x), fused, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.compile(converted, dynamic=True)(x), fused, rtol=1e-4, atol=1e-4)
