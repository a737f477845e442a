"""The Gram route's clipped sum of a float32 linear layer on sequences on the CPU: one float32
product per example (T terms per entry), the examples' weighted parts summed in float64
(LinearUsage._per_example_product_sum), not a float64 product over all examples' rows.
Checked against the float64 batch-size-1 autograd reference (Abadi et al. 2016, Algorithm 1)
and, for sensitivity, against the definition: the change of the noiseless release when one
example is removed is at most C (1 + 1e-6), with other examples' positions cancelling."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402
from dpsharp.torch.layers import usages  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def gram_route_only(monkeypatch):
    """Every linear layer on sequences takes the Gram route, and its clipped sum may not fall
    back to the float64 product over all rows."""
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: False)

    def refuse(*args, **kwargs):
        raise AssertionError("the float64 product over all rows was used")

    monkeypatch.setattr(usages, "_wide_blocked_product", refuse)


def _loss(out, i):
    return (out ** 2).sum() + out.sum()


@pytest.mark.parametrize("batch, width", [(5, 6), (7, 400)])
def test_float32_gram_route_sums_match_the_float64_reference(gram_route_only, batch, width):
    """Chunks of one or several examples (width 400: three per chunk, the last one alone).
    Unclipped (C large), the clipper's float32 sums err from the float64 reference by at most
    8 times plain float32 autograd's own error; clipped (every example), they agree with it
    to 2e-6 of the largest entry (each clip factor is lowered by its norm's round-off
    slack, about (T + 3) 2^-24 relative here)."""
    from _clip_reference import clipped_sums, float32_error_ratio, per_example_grads

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                          nn.Linear(width, 2)).double()
    x = torch.randn(batch, 9, 3, dtype=torch.float64)
    ours, plain = float32_error_ratio(model, x, batch, _loss, bound=1e3)
    assert ours <= 8 * plain, (ours, plain)
    _, want = clipped_sums(per_example_grads(model, x, batch, _loss), 0.05)
    model32 = model.float()
    clipper = PerSampleClipper(model32, max_grad_norm=0.05, loss_reduction="sum")
    _loss(model32(x.float()), slice(None)).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    scale = max(float(w.abs().max()) for w in want)
    for p, w in zip(clipper.parameters, want):
        assert float((p.grad.double() - w).abs().max()) <= 2e-6 * scale


def test_accumulated_passes_sum_in_float64(gram_route_only):
    """Two backward passes of one release: the second adds into the first's sum (one
    rounding); equal to the reference summed over both batches."""
    from _clip_reference import clipped_sums, per_example_grads

    torch.manual_seed(1)
    model64 = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 3)).double()
    batches = [torch.randn(6, 5, 4, dtype=torch.float64) for _ in range(2)]
    want = None
    for x in batches:
        _, sums = clipped_sums(per_example_grads(model64, x, 6, _loss), 0.1)
        want = sums if want is None else [a + b for a, b in zip(want, sums)]
    model = model64.float()
    clipper = PerSampleClipper(model, max_grad_norm=0.1, loss_reduction="sum")
    for x in batches:
        _loss(model(x.float()), slice(None)).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    for p, w in zip(clipper.parameters, want):
        assert torch.allclose(p.grad.double(), w, rtol=1e-5, atol=1e-6), (p.grad - w).abs().max()


@pytest.mark.parametrize("width", [8, 512])
def test_removing_one_example_moves_the_release_by_at_most_c(gram_route_only, width):
    """Three examples, two of them with positions cancelling (a_1 g_1^T = -a_2 g_2^T) at
    magnitudes up to 10^8, whose clip factors come from their norms' round-off slack: the
    noiseless release with and without the ordinary example differs by at most C (1 + 1e-6),
    and by about C (the example is clipped)."""
    layer = nn.Linear(width, width, bias=False)

    def release(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        layer.weight.grad = None
        clipper = PerSampleClipper(layer, max_grad_norm=1.0, loss_reduction="sum")
        try:
            (layer(a) * g).sum().backward()
            clipper.release(noise_multiplier=0.0, expected_batch_size=1.0,
                            noise=NoiseGenerator(0))
            return layer.weight.grad.double().clone()
        finally:
            clipper.remove()

    worst = 0.0
    for k in range(32, 129, 8):
        magnitude = 10.0 ** (k / 16)
        a = torch.zeros(3, 4, width)
        g = torch.zeros(3, 4, width)
        a[0, 0, 0], g[0, 0, 0] = 1.0, 3 * 0.95
        a[0, 1, 1], g[0, 1, 1] = 1.0, 3 * math.sqrt(1 - 0.95**2)
        for e, sign in ((1, 1.0), (2, -1.0)):
            a[e, 0, 0], g[e, 0, 0] = magnitude, sign * magnitude
            a[e, 1, 0], g[e, 1, 0] = magnitude, -sign * magnitude
            a[e, 2, 1], g[e, 2, 1] = 0.5, 0.25
        both = release(a, g)
        without = release(a[1:], g[1:])
        worst = max(worst, float((both - without).norm()))
    assert 0.99 < worst <= 1.0 + 1e-6
