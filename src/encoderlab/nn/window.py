"""Sliding-window attention for ModernBERT's local layers (Warner et al. 2024, arXiv:2412.13663, "Alternating
Attention": each token attends to the tokens within local_attention / 2 positions of it, as in transformers' ModernBertModel).

Dense, the window is a (T, T) band mask over full attention: T^2 scores a head, most of them thrown away. Banded,
the queries go in blocks of `half` positions and each block meets only the 3 x half keys its window can reach, so a
head computes 3 x half x T scores and the cost grows linearly in T (Longformer's banded attention, Beltagy et al.
2020, arXiv:2004.05150, section 3.1, done with blocks instead of a custom kernel). The blocks are folded into the
batch and run through the same fused scaled_dot_product_attention as global layers. Outputs equal the dense path's.

A padding query more than `half` positions past its row's last real token has no real key in its window, and a
row of the mask with no True at all is 0/0 in softmax: torch's CPU kernels return zeros for it, but CUDA's
memory-efficient kernel returns NaN (pytorch/pytorch#103963, #110213), whose gradient then poisons every key and
value (modernbert-base, 64 x 512 tokens, bf16 on an H100: loss NaN from the first steps). So SDPA gets such a row
with the query's own key let through, and its output is then zeroed (`let_through`): every device computes what
the CPU kernels did (the outputs at padding match transformers'), finite, and no real query's row changes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

BANDED_FROM = 8  # banded from T >= 8 x half (four windows). `python bench/local_attention.py --quick` (6-layer
# modernbert-base, one thread, AVX2 EPYC, full rows): dense / banded time 0.92 at 256 tokens, 1.00 at 512, 1.17 at
# 1,024 and 1.36 at 2,048; below 512 the blocks' copies cost more than the skipped scores save


@dataclass
class Band:
    """A local layer's window: keys within `half` positions of the query that are not padding."""

    half: int
    key_mask: torch.Tensor | None  # (B, 1, 1, T) bool, True at real tokens; None: no padding
    _dense: dict = field(default_factory=dict, repr=False)  # T -> (B or 1, 1, T, T); (T, "kernel") -> for_kernel's

    def dense(self, T: int, device: torch.device) -> torch.Tensor:
        """The window as a boolean mask (B or 1, 1, T, T) for full attention."""
        if T not in self._dense:
            i = torch.arange(T, device=device)
            band = ((i[:, None] - i[None, :]).abs() <= self.half)[None, None]  # (1, 1, T, T)
            self._dense[T] = band if self.key_mask is None else self.key_mask & band
        return self._dense[T]

    def for_kernel(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """dense() safe for SDPA on any device: (the mask with each empty row's own key let through, the empty rows
        (B or 1, 1, T, 1)), whose outputs the caller zeroes (see the module docstring)."""
        if (T, "kernel") not in self._dense:  # made once per forward, like dense(), for all local layers
            i = torch.arange(T, device=device)
            self._dense[T, "kernel"] = let_through(self.dense(T, device), i[:, None] == i[None, :])
        return self._dense[T, "kernel"]

    def banded(self, T: int) -> bool:
        """Whether blocks beat the dense mask at length T (never while tracing: the export keeps one graph)."""
        return T >= BANDED_FROM * self.half and not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export())


def let_through(mask: torch.Tensor, own: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A boolean mask (..., Q, K) whose all-False rows let through the query's own key (own: (Q, K), True there),
    and those rows (..., Q, 1): their outputs are then zeroed, as torch's CPU kernels compute an empty row."""
    empty = ~mask.any(-1, keepdim=True)
    return mask | (empty & own), empty


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Band) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V within the window, for q, k, v (B, nh, T, hd): (B, nh, T, hd)."""
    B, nh, T, hd = q.shape
    b = band.half  # queries per block; a block's keys run from half before its first query to half after its last
    nb = -(-T // b)
    after = nb * b - T  # the last block's positions beyond T
    blocks = F.pad(q, (0, 0, 0, after)).view(B, nh, nb, b, hd)
    keys, values = (F.pad(t, (0, 0, b, after + b)).unfold(2, 3 * b, b).transpose(-1, -2) for t in (k, v))
    offsets = torch.arange(3 * b, device=q.device)[None, :] - torch.arange(b, device=q.device)[:, None]
    window = (offsets >= 0) & (offsets <= 2 * b)  # (b, 3b): key j of a block is within half of query i
    real = torch.ones(B, T, dtype=torch.bool, device=q.device) if band.key_mask is None else band.key_mask[:, 0, 0]
    real = F.pad(real, (b, after + b)).unfold(1, 3 * b, b)  # (B, nb, 3b), False beyond the sequence
    mask, empty = let_through((window[None, None] & real[:, :, None, :]).view(B * nb, 1, b, 3 * b),
                              offsets == b)  # offset b: the query's own position

    def fold(t: torch.Tensor) -> torch.Tensor:  # (B, nh, nb, rows, hd) -> (B * nb, nh, rows, hd)
        return t.transpose(1, 2).reshape(B * nb, nh, *t.shape[-2:])

    out = F.scaled_dot_product_attention(fold(blocks), fold(keys), fold(values), attn_mask=mask).masked_fill(empty, 0)
    return out.view(B, nb, nh, b, hd).transpose(1, 2).reshape(B, nh, nb * b, hd)[:, :, :T]
