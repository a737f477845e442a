"""The pessimistic ("connect the dots") discretisation of the Gaussian-family pairs, cell by cell,
against the same rounding evaluated with mpmath at 40 digits.

Each grid cell (l_a, l_a + h] of the privacy loss is a narrow interval of the mechanism's output
x; its P- and Q-masses are spread onto the cell's two grid points keeping both (Doroshenko,
Ghazi, Kamath, Kumar, Manurangsi 2022), so the mass at grid point k is the lower share of cell k
plus the upper share of cell k - 1. The reference computes both shares from exact normal CDF
differences; the discretiser integrates narrow cells by a series (one exponential per normal)
and the others as differences of tails."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

from dpsharp._native import core

_GAUSSIAN, _REMOVE, _ADD = 0, 2, 3


def _reference_mass(mechanism: int, sigma: float, q: float, step: float, index: int) -> float:
    """The pessimistic mass at grid point ``index`` (global grid index), from mpmath."""
    mp.mp.dps = 40
    mu = 1 / mp.mpf(sigma)
    rate = mp.mpf(q)
    h = mp.mpf(step)

    def x_of(loss: mp.mpf) -> mp.mpf:
        if mechanism == _GAUSSIAN:
            log_ratio = loss
        else:
            signed = loss if mechanism == _REMOVE else -loss
            above = mp.expm1(signed) + rate
            if above <= 0:  # beyond the support of L: {L > l} is everything or nothing
                return -mp.inf
            log_ratio = mp.log(above / rate)
        return (log_ratio + mu * mu / 2) / mu

    def masses(a: mp.mpf, b: mp.mpf) -> tuple[mp.mpf, mp.mpf]:
        """(P, Q) of the loss cell (a, b]."""
        xa, xb = x_of(a), x_of(b)
        low, high = (xa, xb) if mechanism != _ADD else (xb, xa)
        null = mp.ncdf(high) - mp.ncdf(low)
        shifted = mp.ncdf(high - mu) - mp.ncdf(low - mu)
        if mechanism == _GAUSSIAN:
            return shifted, null
        mixture = (1 - rate) * null + rate * shifted
        return (mixture, null) if mechanism == _REMOVE else (null, mixture)

    def shares(k: int) -> tuple[mp.mpf, mp.mpf]:
        """(share at the lower point, share at the upper point) of cell (k h, (k + 1) h]."""
        a = k * h
        p, q_mass = masses(a, a + h)
        upper = p * (1 - mp.exp(a) * q_mass / p) / (1 - mp.exp(-h))
        return p - upper, upper

    return float(shares(index)[0] + shares(index - 1)[1])


@pytest.mark.parametrize(
    ("mechanism", "sigma", "q", "step"),
    [
        (_REMOVE, 0.8, 0.01, 2.0**-12 * 1.5),
        (_REMOVE, 2.0, 0.01, 2.0**-12 * 1.5),
        (_ADD, 0.9, 0.01, 2.0**-12 * 1.5),
        (_REMOVE, 0.6, 0.3, 2.0**-10),
        (_GAUSSIAN, 1.5, 1.0, 2.0**-10),
    ],
)
def test_pessimistic_cells_match_a_40_digit_reference(
    mechanism: int, sigma: float, q: float, step: float
) -> None:
    """Every sampled grid point's mass within 3e-10 relative of the mpmath value, from the
    bottom of the support (wide cells in x, differences of tails) through the bulk to the far
    upper tail (narrow cells, the series; at most about 1e-10 there, from the split of a cell
    between its two points, which divides by 1 - e^{-h}). Differences of tails alone lose up to
    about 2e-8 on these settings: a narrow cell's mass is a small part of the tails it is the
    difference of."""
    tail = 1e-16
    offset, mass, infinity = core.pld_discretize(mechanism, sigma, q, step, tail, tail, True)
    mass = np.asarray(mass)
    assert 0.0 <= infinity <= tail
    interior = np.unique(
        np.concatenate([np.arange(1, 12), np.linspace(12, mass.size - 2, 24).astype(int)])
    )
    for position in interior:
        exact = _reference_mass(mechanism, sigma, q, step, offset + int(position))
        if exact < 1e-250:
            continue
        assert math.isclose(mass[position], exact, rel_tol=3e-10), (position, mass[position], exact)


def _exact_add_delta(epsilon: float, sigma: float, q: float) -> mp.mpf:
    """delta(eps) of the add pair P = N(0, s^2), Q = (1 - q) N(0, s^2) + q N(1, s^2) (shift 1,
    s = sigma): P(L > eps) - e^eps Q(L > eps) with {L > eps} = {x < x_eps}, x_eps = s^2
    log((e^-eps - (1 - q)) / q) + 1/2; 0 at or above the support's top -log(1 - q)."""
    with mp.workdps(60):
        s, q_, eps = mp.mpf(sigma), mp.mpf(q), mp.mpf(epsilon)
        if mp.exp(-eps) <= 1 - q_:
            return mp.mpf(0)
        x = s**2 * mp.log((mp.exp(-eps) - 1 + q_) / q_) + mp.mpf(1) / 2
        below, shifted = mp.ncdf(x / s), mp.ncdf((x - 1) / s)
        return below - mp.exp(eps) * ((1 - q_) * below + q_ * shifted)


@pytest.mark.parametrize(("q", "step"), [(1 - 1e-12, 0.0123456), (1 - 1e-9, 0.0123456),
                                         (1 - 1e-14, 0.1)])
def test_add_direction_near_full_sampling_is_not_below_the_exact_curve(
        q: float, step: float) -> None:
    """Poisson add direction, sigma 0.3, q next to 1, at the grid points of its last cells
    before the top of its support -log(1 - q): the weight c = e^{-a} - (1 - q) of the null
    normal was formed as expm1(-a) + q, two numbers near -1 and 1 cancelling into one near
    1 - q, and delta there read up to 37% below the exact value (8% at q = 1 - 1e-12)."""
    sigma = 0.3
    offset, mass, infinity = core.pld_discretize(3, sigma, q, step, 1e-20, 1e-20, True)
    losses = (offset + np.arange(len(mass))) * step
    top = -math.log1p(-q)
    checked = 0
    for loss in losses[(losses > top - 30 * step) & (losses < top)]:
        exact = _exact_add_delta(float(loss), sigma, q)
        got = float(np.sum(mass * np.clip(-np.expm1(loss - losses), 0.0, None)) + infinity)
        assert got >= exact * (1 - 1e-11), (loss, got, exact)
        checked += 1
    assert checked >= 3


def _exact_delta(mechanism: int, epsilon: float, sigma: float, q: float) -> mp.mpf:
    """delta(eps) of the Gaussian (q = 1) or Poisson remove pair with shift 1 and noise s =
    sigma: P = (1 - q) N(0, s^2) + q N(1, s^2), Q = N(0, s^2); {L > eps} = {x > x_eps}, x_eps =
    s^2 log((e^eps - (1 - q)) / q) + 1/2, so delta = q Phi-bar((x - 1) / s) - c Phi-bar(x / s),
    c = e^eps - (1 - q)."""
    if mechanism == _ADD:
        return _exact_add_delta(epsilon, sigma, q)
    with mp.workdps(60):
        s, q_, eps = mp.mpf(sigma), mp.mpf(q), mp.mpf(epsilon)
        c = mp.exp(eps) - 1 + q_
        x = s**2 * mp.log(c / q_) + mp.mpf(1) / 2
        return q_ * mp.ncdf(-(x - 1) / s) - c * mp.ncdf(-x / s)


@pytest.mark.parametrize(
    ("mechanism", "sigma", "q", "step"),
    [(_GAUSSIAN, 1e5, 1.0, 1e-4), (_GAUSSIAN, 3e5, 1.0, 1e-7), (_REMOVE, 1e6, 0.1, 1e-6),
     (_ADD, 1e6, 0.5, 1e-6), (_REMOVE, 1e3, 0.5, 1e-5)],
)
def test_far_tail_of_a_large_noise_multiplier_is_not_below_the_exact_curve(
        mechanism: int, sigma: float, q: float, step: float) -> None:
    """delta at the top grid points (the mass sent to +inf and the upper cells), 1e-30 to 1e-20,
    against mpmath. The excess q S - c N cancels there to about mu / x of its terms (mu = 1 /
    sigma), so the null and the shifted normal's tails must be of one set: their thresholds
    x and x - mu rounded separately differ by an ulp of x, and delta read up to 1.2e-7
    relative below exact at sigma = 1e6 (3.7e-9 at 1e5, 5e-11 at 1e3)."""
    offset, mass, infinity = core.pld_discretize(mechanism, sigma, q, step, 1e-20, 1e-20, True)
    mass = np.asarray(mass)
    losses = (offset + np.arange(mass.size)) * step
    for loss in losses[-min(mass.size, 12):]:
        exact = _exact_delta(mechanism, float(loss), sigma, q)
        if exact <= 0:
            continue
        got = math.fsum((mass * np.clip(-np.expm1(loss - losses), 0.0, None)).tolist()) + infinity
        assert exact <= got <= exact * (1 + 1e-6), (loss, got, exact)
