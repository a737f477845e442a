"""The optimistic (lower-bound) discretisation of the Gaussian-family leaves in the compiled core
(cpp/src/pld_discretize.cpp): cells centred on the grid points, each merged into one outcome and
pulled onto its grid point by merging into it a part of the next one (or contracted down), the
roundings second order in the grid step instead of rounding every cell down.

References: the closed-form Gaussian composition (Dong, Roth, Su 2019, Corollary 2.13: T
Gaussian releases of multiplier sigma are mu-GDP with mu = sqrt(T) / sigma, delta(eps) =
Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)), evaluated in mpmath, and dp-accounting's
pessimistic PLD (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022) as an upper reference for the
Poisson-subsampled Gaussian.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.signal import fftconvolve

from dpsharp import Gaussian, PLDAccountant, PoissonSampled

mpmath.mp.dps = 40


def _gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP in mpmath: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    e, m = mpmath.mpf(eps), mpmath.mpf(mu)
    return float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


def _self_composed(mass: np.ndarray, times: int) -> np.ndarray:
    """The distribution of the sum of ``times`` independent losses of law ``mass`` (a power of
    two of them), by repeated squaring with FFT convolutions (negative round-off clipped)."""
    out = mass
    for _ in range(int(math.log2(times))):
        out = np.maximum(fftconvolve(out, out), 0.0)
    return out


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 16), (2.0, 64), (4.0, 32)])
def test_gaussian_optimistic_composition_stays_below_the_closed_form(
    sigma: float, steps: int
) -> None:
    """The optimistic Gaussian leaf (q = 1) composed ``steps`` times has delta(eps) at most the
    exact mu-GDP curve with mu = sqrt(steps) / sigma at every eps, and is close to it (second
    order in h per release: within 2% on this grid)."""
    from dpsharp._native import core

    step, tail = 2.0**-9, 1e-14
    offset, mass, infinity = core.pld_discretize(0, sigma, 1.0, step, tail, tail, False)
    assert infinity == 0.0
    composed = _self_composed(np.asarray(mass), steps)
    losses = (steps * offset + np.arange(composed.size)) * step
    mu = math.sqrt(steps) / sigma
    for eps in (0.25, 0.5, 1.0, 2.0):
        above = losses > eps
        lower = float(np.sum(composed[above] * -np.expm1(eps - losses[above])))
        exact = _gaussian_delta(eps, mu)
        assert lower <= exact * (1.0 + 1e-9) + 1e-15
        assert lower >= exact * (1.0 - 0.02)


def test_small_rate_bracket_at_the_base_grid_is_narrow() -> None:
    """q = 5e-4, sigma = 0.6, T = 20000: the optimistic composition on the base grid (no
    refinement) is within 2% of the pessimistic epsilon; rounding every cell down to the grid
    left 2.4% there. Both bounds bracket the exact epsilon: the lower one stays below
    dp-accounting's pessimistic epsilon (test_small_rate_lower_bound_below_dp_accounting)."""
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(0.6), 5e-4), 20_000)
    upper = accountant.epsilon(1e-5)
    lower = accountant._epsilon_side(1e-5, pessimistic=False, refinement=0)
    assert 0.0 < lower <= upper
    assert (upper - lower) / upper < 0.02


@pytest.mark.peers
@pytest.mark.parametrize(
    "interval", [1e-4, pytest.param(1e-5, marks=pytest.mark.slow)], ids=["1e-4", "1e-5"]
)
def test_small_rate_lower_bound_below_dp_accounting(interval: float) -> None:
    """The certified lower bound of q = 5e-4, sigma = 0.6, T = 5000, on the base grid and after
    epsilon_bounds' refinements, is at most dp-accounting's pessimistic epsilon (an upper bound
    on the exact one at any discretisation interval; 1e-4 keeps the default run fast, 1e-5 is
    the slow run)."""
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    reference = pld.from_gaussian_mechanism(
        0.6, sampling_prob=5e-4, value_discretization_interval=interval, pessimistic_estimate=True
    ).self_compose(5000).get_epsilon_for_delta(1e-5)
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(0.6), 5e-4), 5000)
    base = accountant._epsilon_side(1e-5, pessimistic=False, refinement=0)
    lower, _ = accountant.epsilon_bounds(1e-5)
    assert base <= lower <= reference
    assert (reference - lower) / reference < 1e-3
