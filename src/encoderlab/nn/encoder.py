"""The encoder stack: embeddings, then N transformer blocks; weight init lives here, in one place. With
`relative_attention` (DeBERTa) it also holds the relative-position table, computed once per forward for all layers;
with `rope_theta` and `local_attention` (ModernBERT) it makes the rotary tables and the local window (nn/window.py)
once per forward, and ends in a final LayerNorm with `pre_norm`."""

from __future__ import annotations

import math

import torch
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.nn.block import Block, layer_norm
from encoderlab.nn.disentangled import RelativeEmbeddings
from encoderlab.nn.embeddings import Embeddings
from encoderlab.nn.output import ModelOutput
from encoderlab.nn.packing import packing
from encoderlab.nn.rotary import rotary_tables
from encoderlab.nn.window import Band


class Encoder(nn.Module):
    """Token ids (B, T) -> contextual vectors (B, T, H)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        # A factorized model projects embeddings to the hidden width; equal widths need none, unless always_project.
        widths_differ = config.embedding_width != config.hidden_size or config.always_project
        self.project = nn.Linear(config.embedding_width, config.hidden_size) if widths_differ else None
        # ALBERT shares one block among all layers (Lan et al. 2019, section 3.1): it is applied num_layers times.
        self.layers = nn.ModuleList(Block(config, i) for i in range(1 if config.shared_layers else config.num_layers))
        self.relative = RelativeEmbeddings(config) if config.relative_attention else None
        self.final_norm = layer_norm(config) if config.pre_norm else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> ModelOutput:
        """attention_mask (B, T): 1 for real tokens, 0 for padding; None means no padding."""
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        x = self.embeddings(input_ids, token_type_ids)
        if self.project is not None:
            x = self.project(x)  # (B, T, E) -> (B, T, H)
        positions = None
        if self.relative is not None:
            positions = self.relative(input_ids.shape[1], input_ids.device)
            if mask is not None:  # as DeBERTa's code does: padding is zeroed and attends to nothing either
                x = x.masked_fill(~mask[:, 0, 0, :, None], 0.0)
                mask = mask & mask.transpose(-1, -2)  # (B, 1, T, T)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        layer_inputs = self.layer_inputs(mask, input_ids.shape[1], x.device)
        packed = packing(attention_mask, x.device)  # None: the padded path
        x = x if packed is None else packed.pack(x)  # (N, H)
        for i in range(self.config.num_layers):
            layer_mask, rotary = layer_inputs[self.config.is_local(i)]
            x, probs = self.layers[i % len(self.layers)](x, layer_mask, output_attentions,
                                                         positions if rotary is None else rotary, packed)
            if hidden_states is not None:
                hidden_states.append(x if packed is None else packed.unpack(x))
            if attentions is not None:
                attentions.append(probs)
        x = x if self.final_norm is None else self.final_norm(x)
        x = x if packed is None else packed.unpack(x)
        if hidden_states is not None:  # the last entry is the output (after the final norm), as in transformers
            hidden_states[-1] = x
        return ModelOutput(last_hidden_state=x, hidden_states=hidden_states, attentions=attentions)

    def layer_inputs(self, mask: torch.Tensor | None, T: int, device: torch.device) -> dict[bool, tuple]:
        """The mask and the rotary tables (or None) of global (False) and local (True) layers."""
        config = self.config
        window = Band(config.local_attention // 2, mask) if config.local_attention else mask
        thetas = (config.rope_theta, config.local_rope_theta or config.rope_theta)
        rotary = [theta and rotary_tables(T, config.head_dim, theta, device) for theta in thetas]
        return {False: (mask, rotary[0]), True: (window, rotary[1])}


def init_weights(module: nn.Module, config: EncoderConfig) -> None:
    """BERT's initialization: N(0, initializer_range) weights, zero biases, unit LayerNorm (BERT repo, modeling.py).
    With initializer_cutoff_factor c > 0, ModernBERT's (transformers' ModernBertPreTrainedModel._init_weights):
    normals truncated at c standard deviations, and each block's attention output and feed-forward down
    projections at initializer_range / sqrt(2 num_layers), GPT-2's scaling of the residual branches (Radford et
    al. 2019, section 2.3)."""
    std, cutoff = config.initializer_range, config.initializer_cutoff_factor
    residual = {id(m) for b in module.modules() if isinstance(b, Block) for m in (b.attn.out, b.mlp.down)}
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            scaled = std / math.sqrt(2 * config.num_layers) if cutoff and id(sub) in residual else std
            _normal(sub.weight, scaled, cutoff)
        if isinstance(sub, nn.Embedding) and sub.padding_idx is not None:
            with torch.no_grad():
                sub.weight[sub.padding_idx].zero_()
        if isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
        if isinstance(sub, (nn.Linear, nn.LayerNorm)) and sub.bias is not None:
            nn.init.zeros_(sub.bias)


def _normal(weight: torch.Tensor, std: float, cutoff: float) -> None:
    """N(0, std) in place, truncated at cutoff standard deviations when cutoff > 0."""
    if cutoff:
        nn.init.trunc_normal_(weight, std=std, a=-cutoff * std, b=cutoff * std)
    else:
        nn.init.normal_(weight, std=std)