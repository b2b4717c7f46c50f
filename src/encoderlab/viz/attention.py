"""Attention maps: the softmax(QK^T / sqrt(d)) probabilities of every head, as tensors, heat-maps and JSON. They come
from the encoder's eager attention (`output_attentions=True`) in eval mode without autocast, so they match
transformers' with `attn_implementation="eager"` (tests/test_attention.py)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from encoderlab.choices import MAX_TOKENS_SHOWN
from encoderlab.engine import eval_mode, window
from encoderlab.errors import InputError
from encoderlab.io import atomic_write, require_text
from encoderlab.nn.encoder import Encoder
from encoderlab.tokenizer import Tokenizer

if TYPE_CHECKING:  # matplotlib is imported only when a picture is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass
class AttentionMaps:
    """The attention of one input: probs[i] is model layer layers[i], (heads, T, T), query rows x key columns."""

    tokens: list[str]  # T wordpieces, [CLS] and [SEP] included
    probs: torch.Tensor  # (len(layers), heads, T, T) float32 on the CPU; each row sums to 1
    layers: list[int]  # the model layer of each entry of probs, counted from 0
    num_layers: int  # layers in the model, for negative indexes
    truncated: bool = False  # the input was cut to the window (engine.window): the maps cover its first tokens

    @property
    def num_heads(self) -> int:
        """Heads per layer."""
        return self.probs.shape[1]

    def layer_index(self, layer: int) -> int:
        """The position in probs of model layer `layer` (negative counts from the last); InputError if absent."""
        resolved = _check_index(layer, self.num_layers, "layer")
        if resolved not in self.layers:
            raise InputError(f"layer {layer}: not among the layers computed ({self.layers})")
        return self.layers.index(resolved)

    def select(self, layer: int, head: int | None = None) -> torch.Tensor:
        """One layer's maps (heads, T, T), or one head's (T, T); negative indexes count from the end."""
        maps = self.probs[self.layer_index(layer)]
        return maps if head is None else maps[_check_index(head, self.num_heads, "head")]


def _check_index(index: int, size: int, what: str) -> int:
    """`index` made non-negative (Python style); InputError naming the valid range otherwise."""
    if not -size <= index < size:
        raise InputError(f"{what} {index} out of range: the model has {size} {what}s "
                         f"(valid: 0..{size - 1}, or -{size}..-1 from the last)")
    return index % size


def find_encoder(model: nn.Module) -> Encoder:
    """The Encoder itself, or the one inside any of our models (encoderlab.nn.model)."""
    if isinstance(model, Encoder):
        return model
    if isinstance(getattr(model, "encoder", None), Encoder):
        return model.encoder
    raise InputError(f"{type(model).__name__} holds no encoderlab Encoder, so it has no attention maps")


def attention_probs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    token_type_ids: torch.Tensor | None = None, layers: list[int] | None = None) -> torch.Tensor:
    """Attention probabilities (len(layers) or L, B, heads, T, T) float32 for a batch of ids (B, T)."""
    encoder = find_encoder(model)
    picked = _resolve_layers(layers, len(encoder.layers))
    device = next(encoder.parameters()).device
    # Eval mode: attention dropout off. No autocast: an fp32 model keeps its fp32 softmax under a caller's bf16.
    with eval_mode(encoder), torch.inference_mode(), torch.autocast(device.type, enabled=False):
        out = encoder(*(t if t is None else t.to(device) for t in (input_ids, attention_mask, token_type_ids)),
                      output_attentions=True)
    return torch.stack([out.attentions[i] for i in picked]).float().cpu()  # (layers, B, heads, T, T)


def _resolve_layers(layers: list[int] | None, num_layers: int) -> list[int]:
    """Layer indexes made non-negative (all layers for None); InputError for one out of range."""
    return list(range(num_layers)) if layers is None else [_check_index(layer, num_layers, "layer") for layer in layers]


def attention_maps(model: nn.Module, tokenizer: Tokenizer, text: str, pair: str | None = None,
                   layers: list[int] | None = None, max_length: int | None = None) -> AttentionMaps:
    """Run the model once on `text` (and `pair`) and return its tokens and attention (layers, heads, T, T); a text
    longer than the window (max_length, else all the model takes: engine.window) is truncated and says so."""
    require_text(text, pair)
    encoder = find_encoder(model)
    limit = window(encoder.config, tokenizer, max_length)
    batch = tokenizer.encode_batch([text], [pair] if pair is not None else None, max_length=limit)
    picked = _resolve_layers(layers, len(encoder.layers))
    probs = attention_probs(encoder, batch.input_ids, batch.attention_mask, batch.token_type_ids, picked)
    tokens = [tokenizer.id_to_token(i) for i in batch.input_ids[0].tolist()]
    return AttentionMaps(tokens, probs[:, 0], picked, len(encoder.layers), batch.num_truncated > 0)


def head_entropy(maps: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the query rows in nats: (..., T, T) -> (...); 0 = each query looks at one key, ln T = uniform."""
    return -(maps * maps.clamp_min(1e-30).log()).sum(-1).mean(-1)  # clamp: 0 * log 0 counts as 0


# ---- plotting -----------------------------------------------------------------------------------------------
def plot_attention(maps: AttentionMaps, out_path: str | Path, layer: int = -1, head: int | None = None,
                   max_tokens: int = MAX_TOKENS_SHOWN, dpi: int = 110) -> Path:
    """Heat-map PNG of one head (or, with head=None, a grid of every head) of one layer; queries are rows."""
    selected = maps.select(layer, head)  # (T, T) or (heads, T, T)
    grid = selected if head is None else selected[None]  # (n, T, T)
    shown = min(len(maps.tokens), max_tokens)
    fig, axes = _figure(len(grid), shown, single=head is not None)
    layer_number = maps.layers[maps.layer_index(layer)]
    vmax = float(grid[..., :shown, :shown].max())  # one colour scale for every panel, so heads compare
    for n, (axis, probs) in enumerate(zip(axes, grid)):
        image = axis.imshow(probs[:shown, :shown].numpy(), cmap="viridis", vmin=0.0, vmax=vmax)
        _label_axes(axis, maps.tokens[:shown], 7 if head is not None else 5)
        axis.set_title(f"head {head % maps.num_heads if head is not None else n}", fontsize=9)
    for axis in axes[len(grid):]:
        axis.set_visible(False)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention probability")
    fig.suptitle(_title(maps, layer_number, shown), fontsize=10)
    out_path = Path(out_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing")  # a wordpiece the font cannot draw
        atomic_write(out_path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    return out_path


def _figure(panels: int, tokens: int, single: bool) -> tuple[Figure, list[Axes]]:
    """A figure with `panels` square axes (a near-square grid), sized so `tokens` labels stay legible. A bare
    matplotlib Figure, not pyplot's: no backend is switched (a notebook keeps its inline plots) and no global
    figure list grows (a server draws from several threads)."""
    from matplotlib.figure import Figure  # matplotlib is imported only when a picture is drawn

    cols = 1 if single else math.ceil(math.sqrt(panels))
    rows = math.ceil(panels / cols)
    side = min(max(0.16 * tokens + 1.5, 4.0), 12.0) if single else min(max(0.09 * tokens + 1.2, 2.5), 6.0)
    fig = Figure(figsize=(cols * side + 1.2, rows * side + 0.6), layout="constrained")
    return fig, list(fig.subplots(rows, cols, squeeze=False).flat)


def _label_axes(axis: Axes, tokens: list[str], fontsize: int) -> None:
    """Tokens on both axes: keys along x (columns), queries down y (rows), as probs[query, key]."""
    ticks = range(len(tokens))
    # parse_math=False: a token such as "$" must not start matplotlib's mathtext.
    axis.set_xticks(ticks, tokens, rotation=90, fontsize=fontsize, parse_math=False)
    axis.set_yticks(ticks, tokens, fontsize=fontsize, parse_math=False)
    axis.set_xlabel("key", fontsize=fontsize + 1)
    axis.set_ylabel("query", fontsize=fontsize + 1)


def _title(maps: AttentionMaps, layer: int, shown: int) -> str:
    """Which layer is drawn, and a note when the input was cut for the picture or by the model's limit."""
    title = f"attention at layer {layer} (layers 0..{maps.num_layers - 1})"
    if shown < len(maps.tokens):
        title += f" (first {shown} of {len(maps.tokens)} tokens shown)"
    if maps.truncated:
        title += " (input truncated to the model's maximum length)"
    return title
