"""Clip factors below float32's normal range.

An example whose gradient norm exceeds C 2^126 has a clip factor c = C / ||g|| below float32's
smallest normal number. Rounded to float32 such a factor keeps few significant bits (1.0e-45
becomes 2^-149 = 1.40e-45), and the clipped contribution grows with it past C. These tests
build such gradients from finite float32 inputs and check the released sum against the exact
bound: the example's contribution must stay within C (1 + 1e-6), measured as the difference
between the release with and without it.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402
from dpsharp.torch.layers.usages import weighted_sum  # noqa: E402

pytestmark = pytest.mark.torch


def _release(model: nn.Module, loss_of, *, reduction: str = "sum", **options) -> torch.Tensor:
    """The noiseless released gradient (float64, flattened) of one backward pass."""
    for p in model.parameters():
        p.grad = None
    clipper = PerSampleClipper(model, max_grad_norm=1.0, loss_reduction=reduction, **options)
    try:
        loss_of(model).backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        return torch.cat([p.grad.double().reshape(-1) for p in clipper.parameters])
    finally:
        clipper.remove()


def _identity_linear() -> nn.Linear:
    layer = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(2))
    return layer


@pytest.mark.parametrize("factor", [1.0e-45, 1.2e-45, 3.0e-45, 5.0e-43, 1.0e-40])
@pytest.mark.parametrize("sequence", [False, True])
def test_one_huge_example_stays_within_the_bound(factor: float, sequence: bool) -> None:
    # input a = (s, 0) and output gradient (s, 0): the weight's gradient is s^2 e1 e1^T, of
    # norm 1 / factor (with s^2 = 1 / factor, finite in float32), so c = factor exactly
    s = math.sqrt(1.0 / factor)
    a = torch.tensor([[s, 0.0]])
    g = torch.tensor([[s, 0.0]])
    if sequence:  # a sequence of one real position and a zero one: the Gram route
        a = torch.stack([a, torch.zeros_like(a)], dim=1)
        g = torch.stack([g, torch.zeros_like(g)], dim=1)
    released = _release(_identity_linear(), lambda m: (m(a) * g).sum())
    assert float(released.norm()) <= 1.0 + 1e-6


@pytest.mark.parametrize("per_layer", [False, True])
def test_conv_gram_route_and_per_layer_clipping(per_layer: bool, monkeypatch) -> None:
    from dpsharp.torch.layers import usages

    # the Gram route (the materialised one overflows float32 here and refuses the batch)
    monkeypatch.setattr(usages.ConvUsage, "_materialise_weight", lambda self: False)
    s = math.sqrt(1.0e45)
    conv = nn.Conv1d(1, 1, kernel_size=1, bias=False)
    with torch.no_grad():
        conv.weight.fill_(1.0)
    x = torch.zeros(1, 1, 4)
    x[0, 0, 0] = s
    g = torch.zeros(1, 1, 4)
    g[0, 0, 0] = s
    options = {"clipping": "per_layer"} if per_layer else {}
    released = _release(conv, lambda m: (m(x) * g).sum(), **options)
    assert float(released.norm()) <= 1.0 + 1e-6


def test_a_crafted_regression_record_cannot_exceed_the_bound() -> None:
    # A float32 MLP with a mean squared error loss, eight ordinary records and one record with
    # x = 1e15 and y = -1e25: every gradient entry is finite in float32, the record's gradient
    # norm is about 1e40, so its clip factor times the batch size is below 2^-126.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(8, 4)
    y = torch.randn(8, 1)
    worst = 0.0
    for exponent in (24.0, 24.5, 25.0, 25.5, 26.0):
        xa = torch.cat([x, torch.full((1, 4), 1e15)])
        ya = torch.cat([y, torch.full((1, 1), -(10.0**exponent))])
        with_record = _release(model, lambda m: nn.functional.mse_loss(m(xa), ya),
                               reduction="mean")
        without = _release(model, lambda m: nn.functional.mse_loss(m(x), y), reduction="mean")
        worst = max(worst, float((with_record - without).norm()))
    assert worst <= 1.0 + 1e-6


def test_factors_in_the_normal_range_are_kept() -> None:
    # c = 1e-36: c (and c times any scale used here) is a normal float32, so the example is
    # clipped to norm C, not dropped
    s = math.sqrt(1.0e36)
    a = torch.tensor([[s, 0.0]])
    released = _release(_identity_linear(), lambda m: (m(a) * a).sum())
    assert float(released.norm()) == pytest.approx(1.0, rel=1e-6)
    assert float(released.norm()) <= 1.0 + 1e-6


def test_float16_weighted_sum_never_rounds_a_factor_up() -> None:
    # float16 is normal only from 6.1e-5: a factor of 1e-6 rounded to float16 becomes
    # 1.013e-6; the sum must instead be the float32 product rounded once
    rows = torch.full((3, 5), 1000.0, dtype=torch.float16)
    weights = torch.tensor([1e-6, 3e-7, 2e-6], dtype=torch.float64)
    total = weighted_sum(rows, weights)
    exact = 1000.0 * float(weights.sum())
    assert total.dtype == torch.float16
    assert abs(float(total[0]) - exact) <= 2.0**-11 * exact
