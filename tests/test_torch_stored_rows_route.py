"""The clip step's stored-rows route: on a GPU, the parameters whose per-example gradients are
stored rows (materialised linear and convolution weights, biases, normalisation layers) are
measured and summed for all layers at once (``Usage.row_terms``,
``kernels.per_example_sq_norms_many``, ``kernels.weighted_rows_float32_many``).

The route runs on GPUs; here it is forced on the CPU, where the two kernels' fallbacks perform
the same arithmetic as the CUDA kernels (float64 sums of squares; float64 products of the
scaled weights and an in-order float64 sum rounded once to float32). References: the released
gradients of the layer-by-layer route, which the rest of the suite checks against
batch-size-1 autograd, and float64 sums of the same rows.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SIGMA = 0.8
C = 0.05


@pytest.fixture
def forced_route(monkeypatch):
    """A switch for the stored-rows route on the CPU, and a record of the rows it measured."""
    from dpsharp.torch import clipper, kernels

    measured: list[int] = []
    original = kernels.per_example_sq_norms_many

    def counted(rows):
        measured.append(len(rows))
        return original(rows)

    monkeypatch.setattr(kernels, "per_example_sq_norms_many", counted)

    def use(on: bool) -> None:
        monkeypatch.setattr(clipper, "_batches_rows", lambda params: on)

    return use, measured


class _SequenceModel(torch.nn.Module):
    """Linear layers on sequences of both kinds (one whose weight is materialised, one on the
    Gram path), a LayerNorm, and a convolution with a GroupNorm, so that a step holds stored
    rows and other terms together."""

    def __init__(self) -> None:
        super().__init__()
        # the CPU's cost rule (T = 24): materialised where T^2 (d + p) > 80 d p, else Gram
        self.narrow = torch.nn.Linear(6, 64)  # 40,320 > 30,720: materialised
        self.norm = torch.nn.LayerNorm(64)
        self.wide = torch.nn.Linear(64, 96)  # 92,160 < 491,520: Gram path
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.group = torch.nn.GroupNorm(2, 4)
        self.head = torch.nn.Linear(96 + 4 * 16, 3)

    def forward(self, seq: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        h = self.wide(torch.tanh(self.norm(self.narrow(seq)))).mean(dim=1)
        c = torch.relu(self.group(self.conv(image))).flatten(1)
        return self.head(torch.cat([h, c], dim=1))


def _released(route_on: bool, use, *, passes: int = 1, seed: int = 0) -> list[torch.Tensor]:
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    use(route_on)
    torch.manual_seed(seed)
    model = _SequenceModel()
    gen = torch.Generator().manual_seed(seed + 1)
    clipper = PerSampleClipper(model, max_grad_norm=C)
    batch = 6
    for _ in range(passes):
        seq = torch.randn(batch, 24, 6, generator=gen)
        image = torch.randn(batch, 2, 4, 4, generator=gen)
        y = torch.randint(0, 3, (batch,), generator=gen)
        torch.nn.functional.cross_entropy(model(seq, image), y).backward()
    clipper.release(noise_multiplier=SIGMA, expected_batch_size=float(batch * passes),
                    noise=NoiseGenerator(seed + 7))
    return [p.grad.detach().clone() for p in clipper.parameters]


@pytest.mark.parametrize("passes", [1, 2])  # two: the second pass adds layer by layer
def test_forced_route_releases_what_the_layer_by_layer_route_does(forced_route,
                                                                  passes: int) -> None:
    use, measured = forced_route
    by_layer = _released(False, use, passes=passes)
    assert measured == []
    together = _released(True, use, passes=passes)
    # every pass measured its stored rows in one call: narrow's weight and bias, the
    # LayerNorm's two, the convolution's two, the GroupNorm's two (the Gram-path layer and the
    # head, with one position per example, keep their own terms)
    assert measured == [8] * passes
    for a, b in zip(by_layer, together):
        # the same noise; the clipped sums differ only by the norms' float64 summation order
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-9)


def test_route_takes_only_rows_whose_norms_and_sums_are_exact(forced_route) -> None:
    """A linear layer on the Gram path has no stored rows (its norm carries a slack): it keeps
    its own term, and its bias goes with it."""
    from dpsharp.torch.layers.usages import LinearUsage

    weight = torch.nn.Parameter(torch.randn(96, 5))
    bias = torch.nn.Parameter(torch.zeros(96))
    a = torch.randn(4, 3, 5)
    g = torch.randn(4, 3, 96)
    gram = LinearUsage(weight, bias, a, g, 2.0)
    if gram._materialise_weight():
        pytest.skip("this build's cost rule materialises the layer")
    assert gram.row_terms([weight, bias]) is None
    assert gram.row_terms([bias]) is not None  # the bias alone is stored rows
    one_position = LinearUsage(weight, bias, a[:, :1], g[:, :1], 2.0)
    assert one_position.row_terms([weight, bias]) is None


def test_many_buffer_norms_match_each_buffer() -> None:
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(3)
    rows = [torch.randn(5, 7, generator=gen), torch.randn(5, 2, 3, generator=gen).double(),
            torch.randn(5, 160, generator=gen).to(torch.bfloat16), torch.zeros(5, 0)]
    got = kernels.per_example_sq_norms_many(rows)
    assert got.shape == (4, 5) and got.dtype == torch.float64
    for k, r in enumerate(rows):
        want = r.reshape(5, -1).double().square().sum(dim=1)
        torch.testing.assert_close(got[k], want, rtol=1e-14, atol=0)


def test_many_buffer_weighted_sums_round_an_exact_sum_once() -> None:
    """Each output is the float64 sum of (factor x scale) x row, rounded once to float32: checked
    against the exactly rounded sum of the exact products (math.fsum of exact binary values)."""
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(4)
    rows = [torch.randn(6, 3, 2, generator=gen), torch.randn(6, 9, generator=gen).to(torch.bfloat16)]
    factors = torch.rand(6, generator=gen, dtype=torch.float64)
    scales = [0.125, 3.0]
    outs = kernels.weighted_rows_float32_many(rows, factors, scales)
    assert [tuple(o.shape) for o in outs] == [(3, 2), (9,)]
    for r, scale, out in zip(rows, scales, outs):
        flat = r.reshape(6, -1).double()
        for j in range(flat.shape[1]):
            exact = math.fsum(float(factors[i]) * scale * float(flat[i, j]) for i in range(6))
            want = torch.tensor(exact, dtype=torch.float64).float()
            assert abs(float(out.reshape(-1)[j]) - float(want)) <= abs(float(want)) * 2.0**-23


def test_many_buffer_calls_refuse_bad_input() -> None:
    from dpsharp.torch import kernels

    with pytest.raises(ValueError, match="rows must hold at least one tensor"):
        kernels.per_example_sq_norms_many([])
    with pytest.raises(ValueError, match=r"rows\[1\] must have 3 rows"):
        kernels.per_example_sq_norms_many([torch.zeros(3, 2), torch.zeros(4, 2)])
    with pytest.raises(ValueError, match=r"rows\[0\] must be float32 or bfloat16"):
        kernels.weighted_rows_float32_many([torch.zeros(3, 2, dtype=torch.float64)],
                                           torch.ones(3, dtype=torch.float64), [1.0])
    with pytest.raises(ValueError, match="scales must have one entry per tensor"):
        kernels.weighted_rows_float32_many([torch.zeros(3, 2)],
                                           torch.ones(3, dtype=torch.float64), [])
    with pytest.raises(ValueError, match=r"factors must have shape \(3,\)"):
        kernels.weighted_rows_float32_many([torch.zeros(3, 2)],
                                           torch.ones(4, dtype=torch.float64), [1.0])


def test_bfloat16_materialised_rows_match_float64_clipping(forced_route, monkeypatch) -> None:
    """The GPU's bfloat16 route (materialised bfloat16 per-example gradients) through the
    stored-rows route, forced on the CPU under bf16 autocast: the released gradients equal
    float64 flat clipping of the per-example gradients the route measured (rebuilt by
    float64 autograd from the bfloat16 tensors, rounded to bfloat16 where they are stored),
    and the layer-by-layer route's to float32 rounding."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper
    from dpsharp.torch.layers import usages

    monkeypatch.setattr(usages, "_materialises_in_bfloat16", lambda device_type: True)
    monkeypatch.setattr(usages, "_vectorised_linear_norms", lambda: False)
    use, measured = forced_route
    x = torch.randn(6, 16, 32, generator=torch.Generator().manual_seed(5))
    target = torch.randn(6, 16, 24, generator=torch.Generator().manual_seed(6))
    released = []
    for route_on in (False, True):
        use(route_on)
        torch.manual_seed(0)
        model = torch.nn.Linear(32, 24)
        clipper = PerSampleClipper(model, max_grad_norm=1.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        ((out.float() - target) ** 2).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        released.append((model.weight.grad.double(), model.bias.grad.double()))
    assert measured == [2]  # the weight's bfloat16 rows and the bias's rows, together

    x16 = x.bfloat16().double()
    w16, b16 = model.weight.detach().bfloat16().double(), model.bias.detach().bfloat16().double()
    out16 = (x16 @ w16.t() + b16).bfloat16().double()
    gy = (2.0 * (out16 - target.double())).bfloat16().double()
    per_weight = torch.einsum("btp,btd->bpd", gy, x16).bfloat16().double()
    per_bias = gy.sum(dim=1)
    norms = (per_weight.pow(2).sum(dim=(1, 2)) + per_bias.pow(2).sum(dim=1)).sqrt()
    factors = (1.0 / norms).clamp(max=1.0)
    want_w = (factors[:, None, None] * per_weight).sum(dim=0)
    want_b = (factors[:, None] * per_bias).sum(dim=0)
    (by_layer_w, by_layer_b), (together_w, together_b) = released
    torch.testing.assert_close(together_w, want_w, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(together_b, want_b, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(together_w, by_layer_w, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(together_b, by_layer_b, rtol=1e-6, atol=1e-9)
