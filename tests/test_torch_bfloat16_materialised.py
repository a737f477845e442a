"""Materialised bfloat16 per-example gradients (linear layers on sequences under bf16 autocast on
a device with mixed-precision products): the toward-zero split of the clip factors, the float32
weighted sum that reads the bfloat16 gradients, and the whole clip step through that route.

The route runs on GPUs; here it is forced on the CPU (the same arithmetic: exact products of
bfloat16 values summed in float32, on float32 copies). References: the floor of a float64
value on bfloat16's grid (math.frexp), float64 sums of the exactly widened bfloat16 values,
and float64 batch-size-1 clipping of the same per-example gradients.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def _bfloat16_floor_reference(value: float) -> float:
    """The bfloat16 number of largest magnitude <= |value|, with value's sign: bfloat16 keeps 8
    significant bits (7 stored) with float32's exponent range, subnormals down to 2^-133."""
    if value == 0.0:
        return 0.0
    _, exponent = math.frexp(abs(value))  # |value| in [2^(e-1), 2^e)
    ulp = max(2.0 ** (exponent - 8), 2.0**-133)
    top = (2.0 - 2.0**-7) * 2.0**127  # the largest finite bfloat16
    magnitude = min(math.floor(abs(value) / ulp) * ulp, top)
    return math.copysign(magnitude, value)


def test_toward_zero_rounding_matches_the_bfloat16_floor() -> None:
    from dpsharp.torch.layers.usages import _bfloat16_toward_zero

    gen = torch.Generator().manual_seed(3)
    values = torch.cat([
        torch.randn(2000, generator=gen, dtype=torch.float64)
        * torch.exp2(torch.randint(-140, 128, (2000,), generator=gen).double()),
        torch.tensor([0.0, 1.0, -1.0, 1.0 + 2.0**-8, 1.0 + 2.0**-7 - 1e-15, 2.0**-133,
                      3.0 * 2.0**-134, 1e-45, 3.3e38, -3.3e38, 1.0 - 2.0**-60],
                     dtype=torch.float64),
    ])
    got = _bfloat16_toward_zero(values)
    assert got.dtype == torch.bfloat16
    want = torch.tensor([_bfloat16_floor_reference(float(v)) for v in values],
                        dtype=torch.float64)
    assert torch.equal(got.double(), want)
    assert bool((got.double().abs() <= values.abs()).all())


@pytest.mark.parametrize("seed", range(6))
def test_one_examples_weighted_sum_never_exceeds_its_weight(seed: int) -> None:
    """One example: the float32 sum is w r up to the split's 2^-15 below and one float32
    rounding above, whatever the magnitudes (weights from 1e-30 to 1e30)."""
    from dpsharp.torch.layers.usages import _bfloat16_weighted_sum

    gen = torch.Generator().manual_seed(seed)
    rows = (torch.randn(1, 33, 17, generator=gen) * 10.0 ** (seed - 3)).bfloat16()
    exact_norm = float(rows.double().norm())
    for exponent in (-30, -3, 0, 2, 30):
        weight = float(torch.rand(1, generator=gen, dtype=torch.float64)) * 10.0**exponent
        got = _bfloat16_weighted_sum(rows, torch.tensor([weight], dtype=torch.float64))
        assert got.dtype == torch.float32
        norm = float(got.double().norm())
        assert norm <= weight * exact_norm * (1.0 + 2.0**-24)
        assert norm >= weight * exact_norm * (1.0 - 2.0**-14)


def test_batch_weighted_sum_matches_float64() -> None:
    from dpsharp.torch.layers.usages import _bfloat16_weighted_sum

    gen = torch.Generator().manual_seed(11)
    rows = torch.randn(40, 9, 13, generator=gen).bfloat16()
    weights = torch.rand(40, generator=gen, dtype=torch.float64) * 3.0
    want = (weights[:, None, None] * rows.double()).sum(dim=0)
    got = _bfloat16_weighted_sum(rows, weights)
    # split 2^-15 relative per weight, float32 sums over 40 terms
    bound = (weights[:, None, None] * rows.double().abs()).sum(dim=0) * (2.0**-15 + 50 * 2.0**-24)
    assert bool(((got.double() - want).abs() <= bound).all())


def test_blocks_of_many_examples_are_summed_in_float64(monkeypatch) -> None:
    from dpsharp.torch.layers import usages

    monkeypatch.setattr(usages, "_SUM_BLOCK_ROWS", 8)
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(29, 6, generator=gen).bfloat16()
    weights = torch.rand(29, generator=gen, dtype=torch.float64)
    want = (weights[:, None] * rows.double()).sum(dim=0)
    got = usages._bfloat16_weighted_sum(rows, weights)
    bound = (weights[:, None] * rows.double().abs()).sum(dim=0) * (2.0**-15 + 20 * 2.0**-24)
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.fixture
def bfloat16_route(monkeypatch):
    """The GPU route forced on the CPU: bfloat16 per-example gradients for linear layers on
    sequences (the fused CPU Gram kernel off), with a count of the weighted sums that read
    them."""
    from dpsharp.torch.layers import usages

    calls = []
    original = usages._bfloat16_weighted_sum

    def counted(rows, weights):
        calls.append(rows.dtype)
        return original(rows, weights)

    monkeypatch.setattr(usages, "_materialises_in_bfloat16", lambda device_type: True)
    monkeypatch.setattr(usages, "_vectorised_linear_norms", lambda: False)
    monkeypatch.setattr(usages, "_bfloat16_weighted_sum", counted)
    return calls


def test_the_rule_materialises_within_its_memory_ratio(bfloat16_route) -> None:
    from dpsharp.torch.layers.usages import _HALF_MATERIALISED_PER_STORED, LinearUsage

    weight = torch.nn.Parameter(torch.zeros(48, 64))
    for seq, d, p in ((16, 64, 48), (2, 64, 48), (256, 768, 2304), (4, 768, 2304)):
        a = torch.zeros(2, seq, d, dtype=torch.bfloat16)
        g = torch.zeros(2, seq, p, dtype=torch.bfloat16)
        usage = LinearUsage(weight, None, a, g)
        assert usage._half_per_example()
        assert usage._materialise_weight() == (d * p <= _HALF_MATERIALISED_PER_STORED
                                               * seq * (d + p))
    usage = LinearUsage(weight, None, torch.zeros(2, 16, 64), torch.zeros(2, 16, 48))
    assert not usage._half_per_example()  # float32 stored tensors keep their route


def _cancelling_batch(batch: int, seq: int, d: int, seed: int) -> torch.Tensor:
    """Inputs whose positions nearly cancel within an example (pairs x, -x + small)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, d, generator=gen)
    x[:, 1::2] = -x[:, 0::2] + 1e-3 * torch.randn(batch, seq // 2, d, generator=gen)
    return x


@pytest.mark.parametrize("seed", range(8))
def test_one_examples_contribution_stays_within_the_bound(bfloat16_route, seed: int) -> None:
    """One example, noise 0, positions that cancel: the released gradient's float64 norm stays
    within C (1 + 1e-6), through bfloat16 per-example gradients."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(seed)
    model = torch.nn.Linear(32, 24)
    x = _cancelling_batch(1, 16, 32, seed) * 10.0 ** (seed % 4 - 1)
    target = torch.randn(1, 16, 24)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    ((out.float() - target) ** 2).sum().backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    assert torch.bfloat16 in bfloat16_route  # the weight took the bfloat16 route
    norm = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in clipper.parameters)))
    assert 0.99 < norm <= 1.0 + 1e-6


def test_clipped_sum_matches_float64_clipping_of_the_same_gradients(bfloat16_route) -> None:
    """A batch of 6 through the clip step: the released weight gradient equals float64 clipping
    (flat, C = 1) of the per-example gradients the route measured, rebuilt here from the
    autocast tensors by batch-size-1 autograd in float64 and rounded to bfloat16, to within the
    split's 2^-15 and float32 sums."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 24)
    x = torch.randn(6, 16, 32)
    target = torch.randn(6, 16, 24)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    loss = ((out.float() - target) ** 2).sum()
    loss.backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    assert bfloat16_route

    # the reference: each example's gradient from its bfloat16 input and output gradient
    x16 = x.bfloat16().double()
    w16, b16 = model.weight.detach().bfloat16().double(), model.bias.detach().bfloat16().double()
    out16 = (x16 @ w16.t() + b16).bfloat16().double()
    gy = (2.0 * (out16 - target.double())).bfloat16().double()
    per_weight = torch.einsum("btp,btd->bpd", gy, x16).bfloat16().double()  # stored as measured
    per_bias = gy.sum(dim=1)
    norms = (per_weight.pow(2).sum(dim=(1, 2)) + per_bias.pow(2).sum(dim=1)).sqrt()
    factors = (1.0 / norms).clamp(max=1.0)
    want_w = (factors[:, None, None] * per_weight).sum(dim=0)
    want_b = (factors[:, None] * per_bias).sum(dim=0)
    torch.testing.assert_close(model.weight.grad.double(), want_w, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(model.bias.grad.double(), want_b, rtol=1e-3, atol=1e-4)


def test_released_usage_sums_what_it_measured(bfloat16_route) -> None:
    """Once the norms are taken the usage drops its stored input and output gradient; its
    clipped sums (weight and bias) still equal float64 sums of the gradients it measured."""
    from dpsharp.torch.layers.usages import LinearUsage

    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.nn.Parameter(torch.zeros(24, 32)), torch.nn.Parameter(torch.zeros(24))
    a = torch.randn(5, 16, 32, generator=gen).bfloat16()
    g = torch.randn(5, 16, 24, generator=gen).bfloat16()
    usage = LinearUsage(weight, bias, a, g, scale=0.5)
    usage.flat_sq_norm_term([weight, bias])
    usage.release_stored()
    assert usage.a is None and usage.g is None
    factors = torch.rand(5, generator=gen, dtype=torch.float64)
    per_weight = usage._weight_per_example().double()  # what the norm measured
    assert usage._weight_per_example().dtype == torch.bfloat16
    exact = torch.einsum("btp,btd->bpd", g.double(), a.double())
    magnitude = torch.einsum("btp,btd->bpd", g.double().abs(), a.double().abs())
    assert bool(((per_weight - exact).abs() <= 2.0**-8 * exact.abs()
                 + 16 * 2.0**-23 * magnitude).all())
    want_w = 0.5 * (factors[:, None, None] * per_weight).sum(dim=0)
    want_b = 0.5 * (factors[:, None] * g.double().sum(dim=1)).sum(dim=0)
    # the split factors (2^-15 relative) and float32 sums over 5 examples
    bound = 0.5 * (factors[:, None, None] * per_weight.abs()).sum(dim=0) * (2.0**-15 + 2.0**-21)
    got_w = usage.clipped_sum(weight, factors).double()
    assert bool(((got_w - want_w).abs() <= bound).all())
    torch.testing.assert_close(usage.clipped_sum(bias, factors).double(), want_b,
                               rtol=1e-6, atol=1e-6)
    out = torch.ones(24, 32)
    usage.add_clipped_sum(weight, factors, out)
    assert bool(((out.double() - 1.0 - want_w).abs() <= bound + 2.0**-23).all())


def test_two_backward_passes_of_one_release_accumulate(bfloat16_route) -> None:
    """Gradient accumulation through the bfloat16 route: two backward passes, one release,
    equal to the float64 clipped sums of both micro-batches' per-example gradients."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(4)
    model = torch.nn.Linear(32, 24, bias=False)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    want = torch.zeros(24, 32, dtype=torch.float64)
    for _ in range(2):
        x, target = torch.randn(3, 16, 32), torch.randn(3, 16, 24)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        ((out.float() - target) ** 2).sum().backward()
        out16 = out.detach().double()
        gy = (2.0 * (out16 - target.double())).bfloat16().double()
        per = torch.einsum("btp,btd->bpd", gy, x.bfloat16().double()).bfloat16().double()
        factors = (1.0 / per.pow(2).sum(dim=(1, 2)).sqrt()).clamp(max=1.0)
        want += (factors[:, None, None] * per).sum(dim=0)
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    assert len(bfloat16_route) == 2
    torch.testing.assert_close(model.weight.grad.double(), want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("d", "p"), [(13, 37), (37, 13), (9, 9), (16, 24)])
@pytest.mark.parametrize("transposed_weight", [False, True])
def test_odd_widths_are_padded_without_changing_norms_or_sums(bfloat16_route, d, p,
                                                              transposed_weight) -> None:
    """Rows that are not a multiple of 8 long are formed zero-padded (aligned tensor-core
    kernels): the per-example gradients, their norms and the clipped sum equal float64
    references built from the unpadded einsum (rounded to bfloat16 as stored), for nn.Linear's
    (p, d) weight and a transposed (d, p) one (GPT-2's Conv1D)."""
    from dpsharp.torch.layers.usages import LinearUsage, TransposedLinearUsage

    gen = torch.Generator().manual_seed(d * 100 + p)
    shape = (d, p) if transposed_weight else (p, d)
    weight = torch.nn.Parameter(torch.zeros(shape))
    a = torch.randn(4, 12, d, generator=gen).bfloat16()
    g = torch.randn(4, 12, p, generator=gen).bfloat16()
    kind = TransposedLinearUsage if transposed_weight else LinearUsage
    usage = kind(weight, None, a, g)
    assert usage._materialise_weight()
    per = usage._weight_per_example()
    assert per.shape == (4, *shape)
    if max(d, p) % 8:
        assert usage._per_example_base.shape[-1] == max(d, p) + (-max(d, p) % 8)
    exact = torch.einsum("btp,btd->bpd", g.double(), a.double())
    if transposed_weight:
        exact = exact.transpose(1, 2)
    magnitude = torch.einsum("btp,btd->bpd", g.double().abs(), a.double().abs())
    if transposed_weight:
        magnitude = magnitude.transpose(1, 2)
    assert bool(((per.double() - exact).abs() <= 2.0**-8 * exact.abs()
                 + 12 * 2.0**-23 * magnitude).all())
    stored = per.double()
    torch.testing.assert_close(usage.sq_norm(weight), stored.pow(2).sum(dim=(1, 2)),
                               rtol=1e-12, atol=0)
    factors = torch.rand(4, generator=gen, dtype=torch.float64)
    got = usage.clipped_sum(weight, factors)
    assert got.shape == weight.shape and got.is_contiguous()
    want = (factors[:, None, None] * stored).sum(dim=0)
    bound = (factors[:, None, None] * stored.abs()).sum(dim=0) * (2.0**-15 + 2.0**-21)
    assert bool(((got.double() - want).abs() <= bound).all())


class _TiedLanguageModel(torch.nn.Module):
    """An embedding whose weight is also the output projection (a tied language model head)."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(idx)))


@pytest.mark.parametrize("seed", range(4))
def test_tied_head_on_the_bfloat16_route_stays_within_the_bound(bfloat16_route, seed) -> None:
    """A tied embedding and head (vocab 37: rows padded to 40), the head's gradients
    materialised in bfloat16 and its cross term with the embedding read from them: one
    example's released gradient stays within C (1 + 1e-6)."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(seed)
    model = _TiedLanguageModel(37, 16)
    idx = torch.randint(0, 37, (1, 24))
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx)
    torch.nn.functional.cross_entropy(out.float().reshape(-1, 37), idx.reshape(-1),
                                      reduction="sum").backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    assert bfloat16_route  # the head took the bfloat16 route
    norm = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in clipper.parameters)))
    assert 0.99 < norm <= 1.0 + 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_convolution_on_the_bfloat16_route(bfloat16_route, monkeypatch, seed) -> None:
    """A convolution whose per-example gradients are materialised (few channels, many
    positions), its device route forced on the CPU: under bf16 autocast they are kept in
    bfloat16, one example's released gradient stays within C (1 + 1e-6), and a batch's released
    weight gradient equals float64 clipping of the stored per-example gradients."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper
    from dpsharp.torch.layers.usages import ConvUsage

    monkeypatch.setattr(ConvUsage, "_fused_kernel", lambda self: False)
    stored = []
    original = ConvUsage._weight_per_example

    def keep(self):  # type: ignore[no-untyped-def]
        out = original(self)
        stored.append(out)
        return out

    monkeypatch.setattr(ConvUsage, "_weight_per_example", keep)
    torch.manual_seed(seed)
    model = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
    for batch in (1, 5):
        model.weight.grad = None
        x = torch.randn(batch, 3, 8, 8) * 10.0 ** (seed - 2)
        target = torch.randn(batch, 4, 8, 8)
        clipper = PerSampleClipper(model, max_grad_norm=1.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        ((out.float() - target) ** 2).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        clipper.remove()
        per = stored[-1]
        assert per.dtype == torch.bfloat16 and bfloat16_route
        got = model.weight.grad.double().reshape(-1)
        if batch == 1:
            assert 0.99 < float(got.norm()) <= 1.0 + 1e-6
        else:
            rows = per.double().reshape(batch, -1)
            factors = (1.0 / rows.norm(dim=1)).clamp(max=1.0)
            want = (factors[:, None] * rows).sum(dim=0)
            bound = (factors[:, None] * rows.abs()).sum(dim=0) * (2.0**-15 + 2.0**-21)
            assert bool(((got - want).abs() <= bound).all())
