"""Unpadding (nn/packing.py): the packed path gives the padded path's outputs and gradients on the real tokens, for
every family, and is chosen only where it pays (CPU, enough padding, a batch big enough)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from hf_oracle import TOL, randomize
from test_family import HF_CONFIGS, family_batch, tiny_config

from encoderlab.nn import packing
from encoderlab.nn.model import EncoderModel

LENGTHS = (23, 9, 4, 16)  # 52 of 92 positions real


def run(model: torch.nn.Module, batch: dict, packed: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Hidden states (each layer) with unpadding forced on or off, and every parameter's gradient."""
    monkeypatch.setattr(packing, "MIN_TOKENS", 0 if packed else 10**9)
    monkeypatch.setattr(packing, "MAX_REAL", 1.0)
    model.zero_grad()
    out = model(**batch, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    (out.last_hidden_state[real] * torch.linspace(-1, 1, out.last_hidden_state.shape[-1])).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return [h[real].detach() for h in out.hidden_states], grads


@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_packed_path_gives_the_padded_outputs_and_gradients(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(family).replace(hidden_dropout=0.0, attention_dropout=0.0)
    model = EncoderModel(config).train()
    randomize(model, seed=1)
    batch = family_batch(config, lengths=LENGTHS)
    (padded_states, padded_grads), (states, grads) = (run(model, batch, packed, monkeypatch) for packed in (False, True))
    for mine, theirs in zip(states, padded_states, strict=True):
        assert_close(mine, theirs, **TOL)
    assert grads.keys() == padded_grads.keys() and len(grads) > 5
    for name in grads:
        assert_close(grads[name], padded_grads[name], **TOL, msg=name)


def test_pack_and_unpack_keep_the_real_tokens_and_zero_the_padding() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1]])  # left padding too
    x = torch.arange(12.0).view(3, 4, 1).expand(3, 4, 2)
    found = packing.Packing(mask.flatten().nonzero().squeeze(1), (3, 4))
    assert found.pack(x)[:, 0].tolist() == [0, 1, 2, 4, 9, 10, 11]
    assert torch.equal(found.unpack(found.pack(x)), x * mask[..., None])


def test_unpadding_is_chosen_only_where_it_pays() -> None:
    B, T = 16, packing.MIN_TOKENS // 16
    half = (torch.arange(T) < T // 2).long().expand(B, T)
    assert packing.packing(half, torch.device("cpu")) is not None
    assert packing.packing(None, torch.device("cpu")) is None  # no padding
    assert packing.packing(torch.ones(B, T, dtype=torch.long), torch.device("cpu")) is None  # nothing to skip
    assert packing.packing(half[:2], torch.device("cpu")) is None  # too small to gain
    assert packing.packing(half, torch.device("meta")) is None  # only on CPU
