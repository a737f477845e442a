"""The round-off bound of a product of spectra (part 2 of the module docstring of
``dpsharp.accountants._pld_numerics``), ``prod (a_i + E_i)^c_i - prod a_i^c_i + g_T prod
a_i^c_i``, as the accountant evaluates it from floating-point sums of logarithms, against the
same formula in 50-digit mpmath on the same a_i and E_i; and the compiled kernel that forms the
products and the sums (``pld_multiply_factor``), against NumPy and mpmath.

The sums of logarithms differ by about T E / a, at low frequencies a few hundred ulps of the
sums themselves: evaluated without the sums' own rounding error (:meth:`_LogModuli.slacks`) the
bound came out up to 0.5% below the formula, which the first test shows."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpsharp._native import core
from dpsharp.accountants import _pld_numerics as numerics
from dpsharp.accountants._pld_numerics import DiscretePLD

_REMOVE = 2  # the core's code of the remove direction of a Poisson-sampled Gaussian


def sampled_gaussian_leaves(
    sigmas: tuple[float, ...], rate: float, step: float
) -> list[DiscretePLD]:
    leaves = []
    for sigma in sigmas:
        offset, mass, infinity = core.pld_discretize(
            _REMOVE, sigma, rate, step, 1e-15, 1e-15, True
        )
        leaves.append(DiscretePLD(int(offset), np.asarray(mass), float(infinity), step))
    return leaves


def log_moduli_by_kernel(
    transforms: list[np.ndarray], errors: list[float], counts: list[int]
) -> numerics._LogModuli:
    """The sums as the products route forms them (the compiled kernel, nothing dropped)."""
    half = transforms[0].size
    product = np.ones(half, dtype=complex)
    upper, lower = np.zeros(half), np.zeros(half)
    positive = 0.0
    live = half
    for transform, error, count in zip(transforms, errors, counts):
        live = core.pld_multiply_factor(product, upper, lower, transform, live, count, error,
                                        math.nan)
        positive += count * numerics._positive_log_bound(transform[0], error)
    return numerics._LogModuli(upper, lower, sum(counts), len(counts), positive)


def exact_bounds(
    transforms: list[np.ndarray], errors: list[float], counts: list[int], frequencies: np.ndarray
) -> list[mpmath.mpf]:
    """The formula at each frequency in 50-digit arithmetic, with the margin the code applies."""
    share = mpmath.mpf(numerics.power_rounding(sum(counts)))
    out = []
    with mpmath.workdps(50):
        for f in frequencies.tolist():
            raised, plain = mpmath.mpf(1), mpmath.mpf(1)
            for transform, error, count in zip(transforms, errors, counts):
                a = mpmath.mpf(float(numerics._modulus_upper(transform[f : f + 1])[0]))
                raised *= (a + mpmath.mpf(error)) ** count
                plain *= a**count
            out.append((raised - plain + share * plain) * mpmath.mpf(numerics._MARGIN))
    return out


@pytest.mark.parametrize(
    ("sigmas", "counts", "rate", "size"),
    [
        ((1.0, 1.2), [300, 200], 0.01, 4096),
        ((0.8,), [1000], 0.01, 8192),
        ((1.0,), [1], 0.01, 2048),
        ((2.0, 1.5, 1.0, 0.9), [5, 7, 11, 13], 0.1, 2048),
    ],
)
@pytest.mark.parametrize("route", ["numpy", "kernel"])
def test_product_bound_is_at_least_its_formula_in_exact_arithmetic(
    sigmas: tuple[float, ...], counts: list[int], rate: float, size: int, route: str
) -> None:
    leaves = sampled_gaussian_leaves(sigmas, rate, 1e-3)
    transforms = [numerics.certified_forward(leaf.on_circle(size), size) for leaf in leaves]
    errors = [numerics._leaf_error(leaf, size) for leaf in leaves]
    if route == "numpy":
        logs = numerics._LogModuli.of(transforms, errors, counts)
    else:
        logs = log_moduli_by_kernel(transforms, errors, counts)
    computed = np.ones(size // 2 + 1, dtype=bool)
    live, values = numerics._live_product_error(logs, computed)
    picks = np.unique(np.linspace(0, live.size - 1, 160).astype(int))
    exact = exact_bounds(transforms, errors, counts, live[picks])
    ratios = [float(mpmath.mpf(float(v)) / e) for v, e in zip(values[picks], exact)]
    assert min(ratios) >= 1.0
    # and not absurdly above it where it is evaluated (below e^-650 it is a fixed cap)
    evaluated = logs.upper[live[picks]] > -650.0
    assert max(r for r, keep in zip(ratios, evaluated) if keep) < 1.5


def test_the_sums_rounding_alone_would_leave_the_bound_below_its_formula() -> None:
    """Without the evaluation slacks, the same sums give a bound below the exact formula at
    some frequency (what the slacks are for)."""
    leaves = sampled_gaussian_leaves((1.0, 1.2), 0.01, 1e-3)
    size, counts = 4096, [300, 200]
    transforms = [numerics.certified_forward(leaf.on_circle(size), size) for leaf in leaves]
    errors = [numerics._leaf_error(leaf, size) for leaf in leaves]
    logs = numerics._LogModuli.of(transforms, errors, counts)
    live = np.flatnonzero(logs.upper > -650.0)
    upper, lower = logs.upper[live], logs.lower[live]
    share = numerics.power_rounding(sum(counts))
    plain = (
        np.exp(upper) * -np.expm1(np.minimum(lower - upper, 0.0)) + share * np.exp(lower)
    ) * numerics._MARGIN
    picks = np.unique(np.linspace(0, live.size - 1, 160).astype(int))
    exact = exact_bounds(transforms, errors, counts, live[picks])
    assert min(float(mpmath.mpf(float(v)) / e) for v, e in zip(plain[picks], exact)) < 1.0


def reference_multiply(
    product: np.ndarray, upper: np.ndarray, lower: np.ndarray, factor: np.ndarray, live: int,
    count: int, error: float, cutoff: float,
) -> int:
    """The kernel's steps in NumPy (the formulas it replaced)."""
    modulus = np.abs(factor[:live]) * (1.0 + 4.0 * 2.0**-53)
    with np.errstate(divide="ignore"):
        upper[:live] += count * np.log(modulus + error)
        lower[:live] += count * np.log(modulus)
    if not math.isnan(cutoff):
        alive = np.flatnonzero(upper[:live] > cutoff)
        live = int(alive[-1]) + 1 if alive.size else 0
    with np.errstate(under="ignore"):
        product[:live] *= factor[:live] ** count
    return live


@pytest.mark.parametrize("count", [1, 2, 3, 17, 1000])
def test_multiply_factor_against_numpy(count: int) -> None:
    """Products within a few ulps per multiplication of NumPy's powers, the log sums within
    1e-13 of NumPy's, the same live prefix; moduli down to 1e-170 (the sum of squares below
    the normal range: hypot)."""
    rng = np.random.default_rng(count)
    size = 3000
    moduli = np.exp(-np.sort(rng.exponential(3.0, size)))
    moduli[-400:] = 10.0 ** rng.uniform(-170, -150, 400)
    factor = moduli * np.exp(1j * rng.uniform(0, 2 * np.pi, size))
    start = np.exp(1j * rng.uniform(0, 2 * np.pi, size)) * 0.5
    results = []
    for route in (core.pld_multiply_factor, reference_multiply):
        product = start.copy()
        upper, lower = np.full(size, -1.0), np.full(size, -2.0)
        live = route(product, upper, lower, factor, size - 10, count, 1e-15, -700.0)
        results.append((product, upper, lower, live))
    (product, upper, lower, live), (ref_product, ref_upper, ref_lower, ref_live) = results
    assert live == ref_live
    scale = np.abs(ref_product[:live])
    assert np.all(np.abs(product[:live] - ref_product[:live]) <= 8 * count * 2.0**-53 * scale)
    np.testing.assert_array_equal(product[live:], start[live:])  # untouched
    finite = np.isfinite(ref_lower)
    assert np.all(np.abs(upper - ref_upper) <= 1e-13 * np.maximum(1.0, np.abs(ref_upper)))
    assert np.all(np.abs(lower[finite] - ref_lower[finite])
                  <= 1e-13 * np.maximum(1.0, np.abs(ref_lower[finite])))


def test_multiply_factor_moduli_are_upper_bounds() -> None:
    """The modulus each log is taken of is at least the exact |z| (mpmath), across the normal
    range and below it, where the squares underflow: its logarithm is at least log |z| less the
    logarithm's own rounding (1 ulp, 2 u relative, which the sums' slack covers), and at most
    8 u above it."""
    values = [1.0 + 1e-8j, 0.6 - 0.8j, 3e-155 + 4e-155j, 1e-160 - 1e-170j, 2.5e-300j, 1e-320]
    factor = np.array(values + [0.0], dtype=complex)
    product = np.ones(factor.size, dtype=complex)
    upper, lower = np.zeros(factor.size), np.zeros(factor.size)
    core.pld_multiply_factor(product, upper, lower, factor, factor.size, 1, 1e-300, math.nan)
    with mpmath.workdps(40):
        for z, logged in zip(values, lower[:-1].tolist()):
            exact = mpmath.log(abs(mpmath.mpc(z.real, z.imag)))
            unit = mpmath.mpf(2) ** -53
            assert mpmath.mpf(logged) >= exact - 2 * unit * abs(exact)
            assert mpmath.mpf(logged) <= exact + 8 * unit + 2 * unit * abs(exact)
    # (0 is taken at the smallest subnormal: an upper bound whose logarithm is finite)
    assert lower[-1] == math.log(5e-324) and upper[-1] == math.log(1e-300)
