"""Flat clipping's norms and clip factors from per-layer squared-norm terms
(kernels.flat_clip_factors, cpp/src/clip_factors.cpp).

References: mpmath at 50 digits for the norms and factors (the exact values of
||g_i|| = sqrt(sum_k coef_k x_k (y_k + off_k)) and min(1, C / ||g_i||) for the given doubles),
the pure-torch reference (same operations, to the last bit), and the clipper's end-to-end
norms against per-example autograd on a model whose layers give every kind of term.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
mpmath = pytest.importorskip("mpmath")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from dpsharp.torch import PerSampleClipper, kernels  # noqa: E402

pytestmark = pytest.mark.torch


def random_terms(batch: int, kinds: list[str], seed: int) -> list[kernels.SqNormTerm]:
    """kinds: 'plain' (coef x), 'product' (coef x y), 'product+1' (coef x (y + 1))."""
    g = torch.Generator().manual_seed(seed)
    terms: list[kernels.SqNormTerm] = []
    for kind in kinds:
        x = torch.rand(batch, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(
            -6, 6, (batch,), generator=g).double()
        coef = float(torch.rand((), generator=g, dtype=torch.float64) * 300.0)
        if kind == "plain":
            terms.append((x, None, 0.0, coef))
        else:
            y = torch.rand(batch, generator=g, dtype=torch.float64) * 50.0
            terms.append((x, y, 1.0 if kind == "product+1" else 0.0, coef))
    return terms


def mp_norms_and_factors(terms: list[kernels.SqNormTerm], bound: float,
                         batch: int) -> tuple[list, list]:
    norms, factors = [], []
    with mpmath.workdps(50):
        for i in range(batch):
            total = mpmath.mpf(0)
            for x, y, offset, coef in terms:
                xi = mpmath.mpf(float(x[i]))
                yi = mpmath.mpf(float(y[i])) + mpmath.mpf(offset) if y is not None else 1
                total += mpmath.mpf(coef) * xi * yi
            norm = mpmath.sqrt(total)
            norms.append(norm)
            factors.append(mpmath.mpf(1) if norm == 0 else min(mpmath.mpf(1), bound / norm))
    return norms, factors


@pytest.mark.parametrize("kinds", [["plain"], ["product+1"], ["product", "plain"],
                                   ["product+1", "product+1", "plain", "product"]])
@pytest.mark.parametrize("batch", [1, 7, 256])
def test_norms_and_factors_against_mpmath(kinds, batch):
    terms = random_terms(batch, kinds, seed=batch + len(kinds))
    bound = 3.0
    result = kernels.flat_clip_factors(terms, bound, batch)
    assert result is not None
    norms, factors = result
    assert norms.dtype == factors.dtype == torch.float64
    want_norms, want_factors = mp_norms_and_factors(terms, bound, batch)
    for i in range(batch):
        # a few roundings per term, then a square root: a few ulp
        assert abs(float(norms[i]) - want_norms[i]) <= 1e-14 * want_norms[i]
        assert abs(float(factors[i]) - want_factors[i]) <= 1e-14 * want_factors[i]
        assert float(factors[i]) <= 1.0


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(0, 40), kinds=st.lists(st.sampled_from(["plain", "product",
                                                                  "product+1"]),
                                                min_size=1, max_size=5),
       seed=st.integers(0, 2**31 - 1), bound=st.floats(1e-3, 1e3))
def test_kernel_equals_torch_reference_to_the_last_bit(batch, kinds, seed, bound):
    # The same IEEE operations in the same order; only the square root may differ by one unit
    # in the last place (torch's CPU sqrt is not correctly rounded on every element, while the
    # kernel's is: the mpmath test above checks the kernel), and the factor by one more.
    terms = random_terms(batch, kinds, seed)
    got = kernels.flat_clip_factors(terms, bound, batch)
    want = kernels.reference_flat_clip_factors(terms, bound, batch)
    assert got is not None and want is not None
    assert torch.allclose(got[0], want[0], rtol=2.0**-52, atol=0.0)
    assert torch.allclose(got[1], want[1], rtol=2.0**-51, atol=0.0)


def test_zero_norm_gives_factor_one_and_bound_is_not_exceeded():
    x = torch.tensor([0.0, 4.0, 9.0, 16.0], dtype=torch.float64)
    norms, factors = kernels.flat_clip_factors([(x, None, 0.0, 1.0)], 3.0, 4)
    assert norms.tolist() == [0.0, 2.0, 3.0, 4.0]
    assert factors.tolist() == [1.0, 1.0, 1.0, 0.75]
    # clipped norms: factor * norm <= C
    assert bool(((factors * norms) <= 3.0).all())


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 1e300])
def test_non_finite_squared_norms_give_none(bad):
    x = torch.tensor([1.0, bad], dtype=torch.float64)
    y = torch.tensor([1.0, 1e300], dtype=torch.float64)
    # 1e300 * (1e300 + 1) overflows to inf: not finite either
    assert kernels.flat_clip_factors([(x, y, 1.0, 1.0)], 1.0, 2) is None
    assert kernels.reference_flat_clip_factors([(x, y, 1.0, 1.0)], 1.0, 2) is None


def test_zero_times_infinite_input_norm_is_not_finite():
    # a zero output gradient against an infinite input norm: 0 * inf = NaN, refused (the
    # gradient really is undefined), not taken as a zero norm
    g_sq = torch.tensor([0.0], dtype=torch.float64)
    a_sq = torch.tensor([math.inf], dtype=torch.float64)
    assert kernels.flat_clip_factors([(g_sq, a_sq, 1.0, 1.0)], 1.0, 1) is None


def test_empty_batch():
    empty = torch.empty(0, dtype=torch.float64)
    norms, factors = kernels.flat_clip_factors([(empty, empty, 1.0, 4.0)], 1.0, 0)
    assert norms.shape == factors.shape == (0,)


def test_other_layouts_take_the_reference_path():
    # float32, strided: not the kernel's input; same values through the reference
    x64 = torch.tensor([1.0, 4.0, 100.0], dtype=torch.float64)
    strided = torch.stack([x64, x64], dim=1)[:, 0]
    assert not strided.is_contiguous()
    norms, factors = kernels.flat_clip_factors([(strided, None, 0.0, 1.0)], 5.0, 3)
    assert norms.tolist() == [1.0, 2.0, 10.0] and factors.tolist() == [1.0, 1.0, 0.5]
    norms32, _ = kernels.flat_clip_factors([(x64.float(), None, 0.0, 1.0)], 5.0, 3)
    assert norms32.dtype == torch.float64 and norms32.tolist() == [1.0, 2.0, 10.0]


@pytest.mark.parametrize("bound", [0.0, -1.0, math.inf, math.nan])
def test_bad_bound_names_the_argument(bound):
    x = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="bound must be positive and finite"):
        kernels.flat_clip_factors([(x, None, 0.0, 1.0)], bound, 2)


def test_clipper_norms_equal_per_example_autograd_with_every_term_kind():
    """End to end: 2-D linear layers with and without bias and with a frozen weight (the three
    linear terms), a sequence linear layer and a layer norm (plain terms), mean loss."""
    torch.manual_seed(3)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = nn.Linear(5, 6)
            self.norm = nn.LayerNorm(6)
            self.with_bias = nn.Linear(6, 7)
            self.no_bias = nn.Linear(7, 4, bias=False)
            self.frozen_weight = nn.Linear(4, 3)
            self.frozen_weight.weight.requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.norm(torch.tanh(self.seq(x))).mean(dim=1)
            return self.frozen_weight(torch.tanh(self.no_bias(torch.tanh(self.with_bias(h)))))

    model = Model().double()
    x = torch.randn(9, 3, 5, dtype=torch.float64)
    y = torch.randn(9, 3, dtype=torch.float64)
    trainable = [p for p in model.parameters() if p.requires_grad]
    want = []
    for i in range(9):
        grads = torch.autograd.grad(((model(x[i:i + 1]) - y[i:i + 1]) ** 2).sum(), trainable)
        want.append(math.sqrt(math.fsum(float((g * g).sum()) for g in grads)))
    clipper = PerSampleClipper(model, max_grad_norm=0.5)
    ((model(x) - y) ** 2).sum(dim=1).mean().backward()
    norms = clipper.last_per_example_norms
    assert norms is not None
    for got, expected in zip(norms.tolist(), want):
        assert got == pytest.approx(expected, rel=1e-12)
