"""DeBERTa's disentangled self-attention over relative positions (He et al. 2021, arXiv:2006.03654).

Departures from BERT's attention (section 3.1, eq. 4), as DeBERTa-v2/v3 ship them:
- besides content-to-content Qc_i . Kc_j, the score of query i for key j adds content-to-position
  Qc_i . Kr_d (c2p) and position-to-content Kc_j . Qr_d (p2c), where Kr, Qr are relative-position embeddings
  P (2k x H) projected by the content's own key and query matrices (shared projections, new in DeBERTa-v2), and
  d = delta(i, j) is the clamped, bucketed distance i - j shifted into [0, 2k) (eq. 3);
- the three terms are scaled together by 1 / sqrt(3d) (eq. 4: d, the head width, once per term);
- P is LayerNorm-ed once per forward (norm_rel_ebd "layer_norm") and dropped out in each layer;
- distances beyond k/2 are bucketed logarithmically up to max_relative_positions (`log_bucket`, new in v2), so
  k = position_buckets (256 in DeBERTa-v3, arXiv:2111.09543) covers 512 tokens.
("New in v2": the microsoft/DeBERTa README's list.) The p2c term is indexed with delta(i, j), as in the released
code that trained the checkpoints (and transformers); eq. 4 writes delta(j, i). The parity tests pin this down.
Fast path: torch's SDPA with c2p + p2c (and the padding) as an additive float mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.errors import ConfigError
from encoderlab.nn.attention import SelfAttention
from encoderlab.nn.dropout import dropout as drop
from encoderlab.nn.packing import Packing

_TERMS = 3  # content-to-content, content-to-position, position-to-content


def log_bucket(distance: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Relative distances (long, any shape) -> buckets within +-(buckets - 1): exact within half the buckets, then
    geometrically wider up to max_position (DeBERTa's make_log_bucket_position; in float32 as there, so a distance
    lands in the same bucket as in the trained checkpoints)."""
    mid = buckets // 2
    size = distance.abs().clamp(min=mid).float()  # below mid the log is never used
    ratio = torch.log(size / mid) / torch.log(torch.tensor((max_position - 1) / mid))  # 0 at mid, 1 at max_position - 1
    far = torch.ceil(ratio * (mid - 1)).long() + mid
    return torch.where(distance.abs() <= mid, distance, far * distance.sign())


@dataclass
class RelativePositions:
    """What every layer needs, computed once per forward: the embedding rows and which row each (i, j) reads."""

    embeddings: torch.Tensor  # (R, H): the rows of the normalized relative-position embeddings P in use
    index: torch.Tensor  # (T, T) long: the row for query i and key j, delta(i, j) minus the first row used


class RelativeEmbeddings(nn.Module):
    """The relative-position table P (2k, H) and its LayerNorm; builds RelativePositions for a length T."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.max_distance = (config.max_relative_positions if config.max_relative_positions > 0
                             else config.max_position_embeddings)
        self.buckets = config.position_buckets
        if self.buckets == 1:  # half of one bucket is none: the log spacing would divide by zero
            raise ConfigError("position_buckets must be 0 (no buckets) or at least 2, got 1")
        self.span = self.buckets or self.max_distance  # k: rows per side
        self.table = nn.Embedding(2 * self.span, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, T: int, device: torch.device) -> RelativePositions:
        """The rows of the normalized table that T tokens use, and the (T, T) index delta(i, j) into them."""
        distance = torch.arange(1 - T, T)  # every i - j, from -(T-1) to T-1 (on the CPU: 2T - 1 numbers)
        if self.buckets:
            distance = log_bucket(distance, self.buckets, self.max_distance)
        rows = (distance + self.span).clamp(0, 2 * self.span - 1)  # eq. 3: clamp to [0, 2k)
        # Rows grow with the distance: a short sequence needs only rows[0]..rows[-1], and the c2p and p2c
        # products then skip the rest (128 tokens use 255 of DeBERTa-v3's 512 rows).
        first, last = int(rows[0]), int(rows[-1])
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():  # a traced graph must serve every length
            first, last = 0, 2 * self.span - 1
        rows = (rows - first).to(device)
        i = torch.arange(T, device=device)
        index = rows[i[:, None] - i[None, :] + T - 1]  # (T, T)
        return RelativePositions(self.norm(self.table.weight[first:last + 1]), index)


class DisentangledAttention(SelfAttention):
    """SelfAttention whose `qkv` query and key parts also project the relative embeddings (shared keys, v2 notes)."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, position_dropout: float) -> None:
        super().__init__(hidden_size, num_heads, dropout)
        self.position_dropout = position_dropout
        self.scale = 1 / math.sqrt(self.head_dim * _TERMS)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, return_probs: bool,
                positions: RelativePositions, packing: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """mask: boolean, broadcastable to (B, 1, T, T), True where query i may attend to key j, or None;
        packing: as in SelfAttention.forward."""
        q, k, v = self.split(x, packing)  # (B, nh, T, hd) each
        bias = self.position_bias(q, k, positions)  # (B, nh, T, T)
        if mask is not None:
            bias = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
        dropout = self.dropout if self.training else 0.0
        if return_probs or (dropout and x.device.type == "cpu"):  # see attention.py on CPU dropout
            scores = q @ k.transpose(-1, -2) * self.scale + bias  # (B, nh, T, T)
            probs = scores.softmax(dim=-1)
            context = drop(probs, dropout) @ v
            probs = probs if return_probs else None
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=self.scale)
            probs = None
        return self.merge(context, packing), probs

    def position_bias(self, q: torch.Tensor, k: torch.Tensor, positions: RelativePositions) -> torch.Tensor:
        """c2p + p2c, scaled: queries and keys (B, nh, T, hd) -> (B, nh, T, T) (eq. 4, last two terms)."""
        B, nh, T, hd = q.shape
        table = drop(positions.embeddings, self.position_dropout, self.training)  # (R, H)
        # Through qkv itself, value part dropped: an int8 qkv (infer/precision.py) holds no `.weight` to slice.
        pos_q, pos_k = self.qkv(table)[:, :2 * nh * hd].chunk(2, dim=-1)  # (R, nh * hd) each
        pos_q = pos_q.view(-1, nh, hd).transpose(0, 1)  # (nh, R, hd)
        pos_k = pos_k.view(-1, nh, hd).transpose(0, 1)
        index = positions.index.expand(B, nh, T, T)
        c2p = torch.gather(q @ pos_k.transpose(-1, -2), -1, index)  # [i, j] = Qc_i . Kr_delta(i,j)
        p2c = torch.gather(k @ pos_q.transpose(-1, -2), -1, index.transpose(-1, -2))  # [j, i] = Kc_j . Qr_delta(i,j)
        return (c2p + p2c.transpose(-1, -2)) * self.scale
