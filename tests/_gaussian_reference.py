"""The exact hockey-stick curve of a Gaussian mechanism (mu-GDP), in mpmath: the oracle of the
PLD tests. delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su
2019, Cor. 2.13)."""

from __future__ import annotations

import math

import mpmath

mpmath.mp.dps = 50


def exact_delta(eps: float, mu: float) -> float:
    e, m = mpmath.mpf(eps), mpmath.mpf(mu)
    return float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


def exact_epsilon_bisect(delta: float, mu: float) -> float:
    """The eps with exact_delta(eps, mu) = delta, by bisection (delta decreases in eps)."""
    lo, hi = 0.0, 1.0
    while exact_delta(hi, mu) > delta:
        hi *= 2
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if exact_delta(mid, mu) > delta else (lo, mid)
    return 0.5 * (lo + hi)


def exact_epsilon_lower(delta: float, mu: float) -> float:
    """The exact epsilon(delta) of the mu-Gaussian mechanism at 40 digits (bisection on the
    decreasing delta(eps); Balle and Wang 2018, Theorem 8), rounded down to a float: a lower
    bound for every certified epsilon of the same mechanism."""
    with mpmath.workdps(40):
        target, shift = mpmath.mpf(delta), mpmath.mpf(mu)

        def excess(eps: mpmath.mpf) -> mpmath.mpf:
            return (mpmath.ncdf(shift / 2 - eps / shift)
                    - mpmath.exp(eps) * mpmath.ncdf(-shift / 2 - eps / shift) - target)

        low, high = mpmath.mpf(0), mpmath.mpf(1)
        while excess(high) > 0:
            high *= 2
        for _ in range(150):
            middle = (low + high) / 2
            low, high = (middle, high) if excess(middle) > 0 else (low, middle)
        rounded = float(low)
        return rounded if rounded <= low else math.nextafter(rounded, 0.0)
