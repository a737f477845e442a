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
