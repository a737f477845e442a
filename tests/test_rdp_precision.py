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
