"""Multi-head self-attention with a padding mask; Q, K and V from one fused (H -> 3H) projection.

The fast path is torch's fused `scaled_dot_product_attention`. The eager path writes softmax(QK^T / sqrt(d)) out to
return the probabilities, and for CPU training with attention dropout: torch's CPU SDPA has no fused dropout (its math
path draws a slow serial `bernoulli_`). Under torch.compile on CPU, short sequences' attention is written out in fp32
batched matmuls (`_compiled_cpu`): the CPU flash kernel spends ~1 ms per layer on 32 x 25 tokens and inductor cannot
fuse into it (compiled int8 MiniLM on SST-2 dev: attention 200 ms so, 310 ms written out in bf16; keeping SDPA gained
nothing)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.nn.dropout import dropout as drop
from encoderlab.nn.packing import Packing
from encoderlab.nn.rotary import rotate
from encoderlab.nn.window import Band, banded_attention


# Up to this many tokens, compiled CPU attention is written out; longer, the flash kernel's tiling wins (the
# (B, heads, T, T) fp32 scores outgrow the caches: 256-token passages ran 1.6x slower written out in bf16 MiniLM).
SHORT = 64


class SelfAttention(nn.Module):
    """(B, T, H) -> (B, T, H), plus the probabilities (B, heads, T, T) on the eager path."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, bias: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.dropout = dropout
        self.export_for_openvino = False  # see _openvino_graph(); set by infer.onnx.export_encoder(for_openvino=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Band | None, return_probs: bool = False,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                packing: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """mask: boolean (B, 1, 1 or T, T), True where a key may be attended to, or None for no padding, or a local
        layer's Band (nn/window.py); rotary: the cos and sin tables (T, hd) that rotate queries and keys
        (nn/rotary.py), or None; packing: where x holds the real tokens only (N, H) (nn/packing.py), or None for
        x (B, T, H)."""
        q, k, v = self.split(x, packing)  # (B, nh, T, hd) each
        if rotary is not None:
            q, k = rotate(q, *rotary), rotate(k, *rotary)
        dropout = self.dropout if self.training else 0.0
        T = q.shape[2]
        if isinstance(mask, Band) and mask.banded(T) and not (return_probs or dropout):
            return self.merge(banded_attention(q, k, v, mask), packing), None
        if return_probs or (dropout and x.device.type == "cpu") or self._openvino_graph():
            context, probs = self._eager(q, k, v, mask.dense(T, q.device) if isinstance(mask, Band) else mask, dropout)
            return self.merge(context, packing), probs if return_probs else None
        empty = None  # a local layer's rows with no key: let through to SDPA, then zeroed (nn/window.py)
        if isinstance(mask, Band):
            mask, empty = mask.for_kernel(T, q.device)
        if x.device.type == "cpu" and torch.compiler.is_compiling() and q.shape[2] <= SHORT:
            context = self._compiled_cpu(q, k, v, mask).to(x.dtype)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return self.merge(context if empty is None else context.masked_fill(empty, 0), packing), None

    def split(self, x: torch.Tensor, packing: Packing | None) -> torch.Tensor:
        """x (B, T, H), or packed (N, H) -> q, k, v stacked (3, B, nh, T, hd) (a tuple of three when exported for
        OpenVINO). Packed, the projection runs on the real tokens only and its output is unpacked for attention (CPU
        has no variable-length attention kernel)."""
        if self._openvino_graph():
            return self._three_projections(x, packing)
        qkv = self.qkv(x) if packing is None else packing.unpack(self.qkv(x))  # (B, T, 3H)
        B, T, _ = qkv.shape
        return qkv.view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)

    def _openvino_graph(self) -> bool:
        """Whether this pass is being exported for OpenVINO, whose CPU plugin fuses attention into one op from the
        pattern it knows best: q, k and v from three projections, each reshaped and transposed
        (_three_projections), and attention written out (_eager). From our fused projection's 5-d permute and
        torch's SDPA export, it kept a separate fp32 Transpose and a Multiply on q per layer: on 16 x 256-token
        passages at 1 thread (the Ice Lake, OpenVINO's profiling counters) the Transposes took 42 ms of 432."""
        return self.export_for_openvino and torch.onnx.is_in_onnx_export()

    def _three_projections(self, x: torch.Tensor, packing: Packing | None) -> tuple[torch.Tensor, ...]:
        """split() for OpenVINO's graph: q, k and v each from its own third of the fused weight, then reshaped and
        transposed."""
        biases = self.qkv.bias.chunk(3) if self.qkv.bias is not None else (None,) * 3
        out = []
        for weight, bias in zip(self.qkv.weight.chunk(3), biases):
            t = F.linear(x, weight, bias)
            t = t if packing is None else packing.unpack(t)  # (B, T, H)
            B, T, _ = t.shape
            out.append(t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2))
        return tuple(out)

    def merge(self, context: torch.Tensor, packing: Packing | None) -> torch.Tensor:
        """context (B, nh, T, hd) -> the output projection (B, T, H), or of the real tokens only (N, H) packed."""
        B, nh, T, hd = context.shape
        context = context.transpose(1, 2).reshape(B, T, nh * hd)
        return self.out(context if packing is None else packing.pack(context))

    @staticmethod
    def _compiled_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(QK^T / sqrt(d) + mask) V in fp32 batched matmuls, the mask added by the first: (B, nh, T, hd)."""
        B, nh, T, hd = q.shape
        q, k, v = (t.float().reshape(B * nh, T, hd) for t in (q, k, v))
        if mask is None:
            scores = torch.bmm(q, k.transpose(1, 2)).mul_(1 / math.sqrt(hd))
        else:
            bias = torch.zeros(B, mask.shape[2], T, device=q.device)  # (B, 1 or T, T)
            bias.masked_fill_(~mask[:, 0], torch.finfo(torch.float32).min)
            scores = torch.baddbmm(bias.repeat_interleave(nh, dim=0), q, k.transpose(1, 2), alpha=1 / math.sqrt(hd))
        return torch.bmm(scores.softmax(dim=-1), v).view(B, nh, T, hd)

    @staticmethod
    def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled dot-product attention written out (Vaswani et al. 2017, eq. 1)."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        return drop(probs, dropout) @ v, probs
