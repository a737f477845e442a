"""The exact hockey-stick curve of a Gaussian mechanism (mu-GDP), in mpmath: the oracle of the
PLD tests. delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su
2019, Cor. 2.13)."""

from __future__ import annotations

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
