"""The Poisson-subsampled Gaussian's RDP against an independent mpmath reference at 50 digits
(tests/_rdp_reference.py), on a grid with the hard corners: q close to 1, sigma < 0.5,
alpha in (1, 2), alpha in the thousands, and tiny divergences (q = 1e-6, sigma = 1000).
Requirement: relative error <= 1e-10, or +inf (fail closed), never smaller."""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
from _rdp_reference import rdp as reference_rdp
from dpsharp.rdp import poisson_gaussian_rdp

TOLERANCE = 1e-10


def check(q: float, sigma: float, alpha: float) -> None:
    ours = poisson_gaussian_rdp(q, sigma, [alpha])[0]
    ref = reference_rdp(q, sigma, alpha)
    # +inf would be allowed by the contract but would also be a failure of the precision goal
    assert np.isfinite(ours), (q, sigma, alpha)
    assert abs(mpmath.mpf(float(ours)) - ref) <= TOLERANCE * ref, (q, sigma, alpha, ours, ref)
    # an upper bound: the integer orders' sum is raised by its rounding bound, the fractional
    # orders' quadrature by twice its tolerance
    assert mpmath.mpf(float(ours)) >= ref, (q, sigma, alpha, ours, ref)


# Integer orders: the reference is an exact 50-digit binomial sum (fast).
@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    list(
        itertools.product(
            [1e-6, 0.004, 0.1, 0.5, 0.999, 1.0], [0.3, 0.45, 1.0, 10.0, 1000.0], [2.0, 3.0, 33.0, 256.0]
        )
    )
    + [(q, s, 2000.0) for q in (1e-6, 0.3, 0.999) for s in (0.3, 1.0, 1000.0)],
)
def test_integer_orders(q: float, sigma: float, alpha: float) -> None:
    check(q, sigma, alpha)


# Fractional orders where the 50-digit quadrature reference takes ~1-3 s each.
@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [
        (0.999, 0.3, 1.3),  # q close to 1, sigma < 0.5, alpha in (1, 2)
        (1e-6, 1000.0, 1.05),  # divergence ~ 5e-19
        (0.001, 4.0, 1.001),  # alpha barely above 1
        (0.1, 1000.0, 7.3),
        (0.01, 0.3, 1.1),
        (0.5, 0.3, 2048.0),  # integer in the thousands, small sigma (via the sum)
    ],
)
def test_fractional_orders_fast_corners(q: float, sigma: float, alpha: float) -> None:
    check(q, sigma, alpha)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [
        (0.9, 0.35, 1000.5),
        (0.01, 1.0, 5000.25),
        (0.01, 4.0, 9999.5),
        (1e-6, 0.3, 63.5),
        (0.999, 0.45, 63.5),
        (0.5, 0.3, 7.3),
        (0.001, 1.0, 63.5),
        (0.999, 1000.0, 9999.75),
        (1e-6, 1000.0, 1.5),
        (0.3, 0.3, 1.5),
    ],
)
def test_fractional_orders_slow_corners(q: float, sigma: float, alpha: float) -> None:
    check(q, sigma, alpha)


# Each quadrature the core may use for a fractional order, held to the goal on its own:
# method 1 = the trapezoidal rule alone (NaN where it cannot certify), 2 = adaptive
# Gauss-Kronrod alone, forced at integer orders where the reference is the exact 50-digit
# binomial sum (method 0, the default, takes the trapezoidal rule where it certifies).
QUADRATURE_SETTINGS = list(
    itertools.product(
        [1e-6, 0.004, 0.02, 0.1, 0.5, 0.999], [0.45, 0.8, 1.1, 4.0, 100.0], [2.0, 3.0, 9.0, 20.0]
    )
)


def check_quadrature(q: float, sigma: float, alpha: float, method: int) -> None:
    from dpsharp._native import core

    log_am1 = core.rdp_poisson_gaussian_log_a_minus_one(q, sigma, alpha, True, method)
    assert np.isfinite(log_am1), (q, sigma, alpha, method)  # each certifies on these settings
    with mpmath.workdps(60):
        ours = mpmath.log1p(mpmath.exp(mpmath.mpf(log_am1))) / (alpha - 1)
    ref = reference_rdp(q, sigma, alpha)
    assert abs(ours - ref) <= TOLERANCE * ref, (q, sigma, alpha, method, float(ours), ref)


@pytest.mark.parametrize(("q", "sigma", "alpha"), QUADRATURE_SETTINGS)
@pytest.mark.parametrize("method", [1, 2])
def test_each_quadrature_against_the_binomial_sum(
    q: float, sigma: float, alpha: float, method: int
) -> None:
    check_quadrature(q, sigma, alpha, method)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [(256 / 60000, 1.1, 9.3), (0.02, 0.8, 2.25), (0.01, 4.0, 16.5), (0.1, 0.5, 19.5)],
)
@pytest.mark.parametrize("method", [1, 2])
def test_each_quadrature_at_fractional_orders(
    q: float, sigma: float, alpha: float, method: int
) -> None:
    check_quadrature(q, sigma, alpha, method)


def test_quadrature_method_is_validated() -> None:
    from dpsharp._native import core

    with pytest.raises(ValueError, match="method"):
        core.rdp_poisson_gaussian_log_a_minus_one(0.01, 1.0, 2.5, True, 3)


# Integer orders of 1e5 and more (reached with custom orders): log C(alpha, k) and k log q are
# 1e6-1e7 in size there and cancel, which once lost 1e-10 to 1e-9 relative, below the exact
# value. The binomial probabilities are now taken in Loader's saddle-point form and the sum is
# rounded up by a bound on its error: within 1e-10 and never below the 50-digit reference.
@pytest.mark.slow  # the 50-digit sums take about a minute each
@pytest.mark.parametrize(("q", "sigma", "alpha"), [(1e-3, 300.0, 1e5), (1e-4, 1000.0, 4e5)])
def test_huge_integer_orders_are_never_below_the_exact_divergence(q: float, sigma: float,
                                                                  alpha: float) -> None:
    ours = poisson_gaussian_rdp(q, sigma, [alpha])[0]
    ref = reference_rdp(q, sigma, alpha)
    assert mpmath.mpf(float(ours)) >= ref, (q, sigma, alpha, ours, ref)
    assert mpmath.mpf(float(ours)) - ref <= TOLERANCE * ref
