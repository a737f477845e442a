"""The tight accountant on releases with almost no noise (noise multipliers far below any that
protects anything): a certified answer in seconds where the loss support fits a coarser grid, a
clear refusal where no grid covers it, never a small epsilon.

References, in mpmath: the exact epsilon of T unsampled Gaussian releases (Dong, Roth, Su 2019,
Corollary 2.13: mu = sqrt(T) / sigma), which dominates the same releases under Poisson sampling
(an upper reference), and the exact epsilon of one Poisson-sampled release (a lower reference:
composing more releases never lowers epsilon).
"""

from __future__ import annotations

import math

import mpmath
import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled

DELTA = 1e-5


def _root_bracket(excess, low: mpmath.mpf, high: mpmath.mpf) -> tuple[float, float]:
    """(low, high) around the root of the decreasing ``excess`` (excess(low) > 0 >= excess(high)),
    by 200 bisections in mpmath: low is below the root, high above it."""
    assert excess(low) > 0 >= excess(high)
    for _ in range(200):
        middle = (low + high) / 2
        if excess(middle) > 0:
            low = middle
        else:
            high = middle
    return float(low), float(high)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon(delta) of mu-GDP (rounded up), by bisection on the mpmath curve."""
    with mpmath.workdps(40):
        m = mpmath.mpf(mu)

        def excess(eps: mpmath.mpf) -> mpmath.mpf:
            above = mpmath.ncdf(-eps / m + m / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / m - m / 2)
            return above - delta

        return _root_bracket(excess, mpmath.mpf(0), m * m)[1]


def _sampled_release_epsilon(sigma: float, q: float, delta: float) -> float:
    """The exact epsilon(delta) of one Poisson-sampled Gaussian release, remove direction
    (P = (1 - q) N(0, sigma^2) + q N(1, sigma^2) against Q = N(0, sigma^2), the direction
    with the larger losses; rounded down): delta(eps) = P(x > x*) - e^eps Q(x > x*), x* where
    the loss log(1 - q + q e^{(2x - 1) / (2 sigma^2)}) equals eps."""
    with mpmath.workdps(60):
        s, r = mpmath.mpf(sigma), mpmath.mpf(q)

        def excess(eps: mpmath.mpf) -> mpmath.mpf:
            x = (mpmath.log((mpmath.exp(eps) - 1 + r) / r) * 2 * s * s + 1) / 2
            upper_p = (1 - r) * mpmath.ncdf(-x / s) + r * mpmath.ncdf(-(x - 1) / s)
            return upper_p - mpmath.exp(eps) * mpmath.ncdf(-x / s) - delta

        return _root_bracket(excess, mpmath.mpf(1), 1 / (s * s))[0]


@pytest.mark.parametrize("sigma", [3e-3, 1e-3, 5e-4])
def test_a_nearly_noiseless_sampled_run_is_answered_between_exact_references(sigma: float) -> None:
    """Ten Poisson-sampled releases (q = 0.1) at sigma = 3e-3 .. 5e-4: each leaf's loss reaches
    1 / (2 sigma^2), millions of points of the finest grids, so the grid is coarsened to keep a
    leaf within 2^18 points (sigma = 1e-3 took an 84-million-point transform that did not end
    in minutes before). The certified epsilon lies between the exact epsilon of one such
    release and that of ten unsampled ones."""
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(sigma), 0.1), 10)
    epsilon = accountant.epsilon(DELTA)
    assert _sampled_release_epsilon(sigma, 0.1, DELTA) <= epsilon
    assert epsilon <= _gaussian_epsilon(math.sqrt(10) / sigma, DELTA)


@pytest.mark.parametrize("sigma", [1e-4, 1e-160, 1e-200])
def test_a_noise_multiplier_no_grid_covers_is_refused(sigma: float) -> None:
    """Below about 5e-4, under sampling or next to other events, no grid of step at most 16
    covers the loss: a ValueError naming the noise multiplier. (1e-160, q = 0.1, gave a
    certified epsilon of 1.4e-4 before, where the release is not private at all.)"""
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(sigma), 0.1), 10)
    with pytest.raises(ValueError, match="noise_multiplier"):
        accountant.epsilon(DELTA)


def test_a_noiseless_gaussian_next_to_a_sampled_one_is_refused() -> None:
    """The same limit for an unsampled release composed with a sampled one (the grid route)."""
    accountant = PLDAccountant()
    accountant.compose(Gaussian(1e-5))
    accountant.compose(PoissonSampled(Gaussian(1.0), 0.01), 100)
    with pytest.raises(ValueError, match="noise_multiplier"):
        accountant.epsilon(DELTA)


def test_the_limit_follows_events_composed_after_a_query() -> None:
    """An accountant asked once, then given a nearly noiseless release, refuses the next query
    (the smallest noise multiplier is remembered per set of events, not once for all)."""
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(1.0), 0.01), 100)
    assert accountant.epsilon(DELTA) > 0.0
    accountant.compose(PoissonSampled(Gaussian(1e-6), 0.01))
    with pytest.raises(ValueError, match="noise_multiplier"):
        accountant.epsilon(DELTA)


@pytest.mark.parametrize("sigma", [1e-154, 1e-200])
def test_unsampled_gaussians_beyond_the_double_range_give_infinity(sigma: float) -> None:
    """Unsampled Gaussian releases are answered by the exact closed form; where mu^2 = T /
    sigma^2 overflows (or sigma^2 underflows) the exact epsilon is beyond the largest double:
    epsilon is +inf and the bracket (0, inf), not an exception from the root finder."""
    accountant = PLDAccountant()
    accountant.compose(Gaussian(sigma), 10)
    assert accountant.epsilon(DELTA) == math.inf
    assert accountant.epsilon_bounds(DELTA) == (0.0, math.inf)
