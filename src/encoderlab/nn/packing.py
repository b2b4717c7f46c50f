"""Unpadding (MosaicBERT, ModernBERT: Warner et al. 2024, arXiv:2412.13663, section 2.1.3): the real tokens of a
padded batch are packed into one (N, H) tensor once, so that every token-wise layer (projections, feed-forward,
norms, and attention's q/k/v and output projections) skips the padding; only attention's core (softmax(QK^T)V) works
on the padded layout, the q/k/v unpacked before it and its output packed after, as CPU has no variable-length
attention kernel. Outputs on real tokens equal the padded path's; padding positions come back as zeros.

Chosen where it is faster: with at most MAX_REAL of the batch real and at least MIN_TOKENS positions; never on
GPU, in a traced or compiled graph (its shapes must not depend on the data), or without padding. Measured by
bench/unpadding.py --quick (CPU, one thread, 4-layer base models, batches of 32 SST-2 sentences): 31% real,
packed 2.1x (bert-base) and 1.6x (modernbert-base) the padded speed; 65% real, 1.3x. Near-full batches gain too:
MiniLM fp32 embed, 1 thread (issue 18), 16 Wikipedia passages of 205-256 tokens (92.5% real) 1.07x, 320
length-sorted SST-2 dev sentences in batches of 32 (91% real in all) 1.04x to 1.08x, with MAX_REAL 0.95 against 0.7."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_REAL = 0.95  # above this share of real tokens, the copies (2 of H and 3H a token, a layer) cost about what
# the skipped padding saves (its 4H^2 + 2HI multiply-adds a token, a layer)
MIN_TOKENS = 256  # B x T below this: each layer's gather and scatter weigh as much as the small matmuls


@dataclass
class Packing:
    """Where the real tokens of a (B, T) batch sit once packed."""

    index: torch.Tensor  # (N,) long: flat position b * T + t of each real token, in row-major order
    shape: tuple[int, int]  # (B, T)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...), the real tokens only."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padding."""
        out = x.new_zeros(self.shape[0] * self.shape[1], *x.shape[1:])
        return out.index_copy_(0, self.index, x).view(*self.shape, *x.shape[1:])  # in place: no second copy


def packing(attention_mask: torch.Tensor | None, device: torch.device) -> Packing | None:
    """The packing of a padded batch (mask (B, T)) where unpadding is faster, else None."""
    if (attention_mask is None or device.type != "cpu" or torch.jit.is_tracing() or torch.compiler.is_compiling()
            or torch.onnx.is_in_onnx_export() or attention_mask.numel() < MIN_TOKENS):
        return None
    real = attention_mask.bool().flatten()
    if int(real.sum()) > MAX_REAL * real.numel():
        return None
    return Packing(real.nonzero().squeeze(1), tuple(attention_mask.shape))
