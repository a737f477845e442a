"""One example's cancelling positions must not round another example's contribution.

A linear layer's clipped sum on sequences is one matrix product over the rows of every
example. An example whose two positions cancel (a_1 g_1^T = -a_2 g_2^T, large) has a small
gradient but large rows: its clip factor is set by the round-off slack of its norm, and its
scaled rows reach about C / kappa. Accumulated in float32, every other example's part added to
running sums of that size was rounded to their spacing: one ordinary example moved the release
by 1.010 C. The sensitivity is measured against the definition: the change of the noiseless
release when the ordinary example is removed.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402
from dpsharp.torch.layers import usages  # noqa: E402

pytestmark = pytest.mark.torch


def _release(layer: nn.Linear, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    layer.weight.grad = None
    clipper = PerSampleClipper(layer, max_grad_norm=1.0, loss_reduction="sum")
    try:
        (layer(a) * g).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        return layer.weight.grad.double().clone()
    finally:
        clipper.remove()


@pytest.mark.parametrize("width", [8, 256])
def test_a_cancelling_example_does_not_round_an_ordinary_one(width: int, monkeypatch) -> None:
    # the Gram route (a product over all rows), whatever the cost rule would choose
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: False)
    layer = nn.Linear(width, width, bias=False)
    worst = 0.0
    for k in range(32, 128):
        magnitude = 10.0 ** (k / 16)
        a = torch.zeros(2, 2, width)
        g = torch.zeros(2, 2, width)
        # the ordinary example: gradient 3 (0.95 e0 e0^T + 0.312 e1 e1^T), clipped to C = 1
        a[0, 0, 0], g[0, 0, 0] = 1.0, 3 * 0.95
        a[0, 1, 1], g[0, 1, 1] = 1.0, 3 * math.sqrt(1 - 0.95**2)
        # the cancelling one: two positions whose products cancel exactly
        a[1, 0, 0], g[1, 0, 0] = magnitude, magnitude
        a[1, 1, 0], g[1, 1, 0] = magnitude, -magnitude
        both = _release(layer, a, g)
        alone = _release(layer, a[1:], g[1:])
        worst = max(worst, float((both - alone).norm()))
    assert worst <= 1.0 + 1e-6
    assert worst > 0.99  # the ordinary example is clipped to C: that is what is measured
