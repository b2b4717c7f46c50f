"""The cheap CPU dropout: right drop rate, unbiased, reproducible, identity in eval, gradient masked like the output."""

from __future__ import annotations

import pytest
import torch

from encoderlab.nn.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drop_rate_and_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = dropout(x, p)
    assert (y == 0).float().mean().item() == pytest.approx(p, abs=0.003)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)


def test_reproducible_under_manual_seed_and_different_across_calls():
    torch.manual_seed(1)
    a, b = dropout(torch.ones(1000), 0.1), dropout(torch.ones(1000), 0.1)
    torch.manual_seed(1)
    assert torch.equal(dropout(torch.ones(1000), 0.1), a)
    assert not torch.equal(a, b)


def test_identity_when_not_training_or_p_zero():
    x = torch.randn(64)
    layer = Dropout(0.1).eval()
    assert torch.equal(layer(x), x) and torch.equal(dropout(x, 0.0), x)


def test_gradient_follows_the_mask():
    x = torch.ones(5000, requires_grad=True)
    y = dropout(x, 0.2)
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d(x * mask * scale)/dx = mask * scale, and x == 1
