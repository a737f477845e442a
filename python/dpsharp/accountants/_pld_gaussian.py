"""Exact answers for compositions that are exactly Gaussian (no FFT).

The privacy loss of the Gaussian pair P = N(1/sigma, 1), Q = N(0, 1) is itself Gaussian,
N(mu^2 / 2, mu^2) under P with mu = 1/sigma, and the sum of independent Gaussian losses is the
loss of the pair with mu = sqrt(sum_i c_i / sigma_i^2): a composition of plain Gaussian
mechanisms is exactly mu-GDP (Dong, Roth, Su 2019, Cor. 3.3), with

    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)

(ibid., Cor. 2.13; Balle and Wang 2018, Thm. 8). :func:`epsilon_bounds` and :func:`delta_bounds`
answer from that formula with certified brackets about 1e-14 wide: mu^2 is summed in double
precision with a proven relative margin (each term c / sigma^2 within 2u + u^2, math.fsum
correctly rounded: 3u < 2^-48 in all, so ``mu2 (1 - 2^-48) <= mu^2 <= mu2 (1 + 2^-48)`` once the
margin's own rounding is covered, see :func:`mu_squared_bounds`), delta(eps) is non-decreasing
in mu, the root of the double-precision formula is only a starting point, and every returned
endpoint is checked in 50-digit arithmetic (mpmath) against the formula at the mu on its own
side, and moved outwards until it holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import mpmath
from scipy.optimize import brentq
from scipy.special import log_ndtr

__all__ = ["delta_bounds", "epsilon_bounds", "mu_squared_bounds"]

#: Relative margin on the double-precision sum of c_i / sigma_i^2 (see the module docstring).
_MU2_MARGIN = 2.0**-48
#: Digits of the verifying evaluation.
_DIGITS = 50


def mu_squared_bounds(terms: Iterable[tuple[float, int]]) -> tuple[float, float]:
    """(low, high) with low <= sum_i c_i / sigma_i^2 <= high, for (sigma_i, c_i) pairs."""
    # (+inf where sigma^2 underflows, below about 1e-162: delta is then answered as inf)
    total = math.fsum(count / (sigma * sigma) if sigma * sigma > 0.0 else math.inf
                      for sigma, count in terms)
    return total * (1.0 - _MU2_MARGIN), total * (1.0 + _MU2_MARGIN)


def _log_delta(eps: float, mu: float) -> float:
    """log delta_mu(eps) in double precision (the starting point of the search only)."""
    a = float(log_ndtr(-eps / mu + mu / 2.0))
    b = eps + float(log_ndtr(-eps / mu - mu / 2.0))
    if not b < a:
        return -math.inf
    return a + math.log1p(-math.exp(b - a))


def _delta_exact(eps: float, mu2: float) -> mpmath.mpf:
    """delta_mu(eps) at ``_DIGITS`` digits, mu = sqrt(mu2) (eps and mu2 exact doubles)."""
    with mpmath.workdps(_DIGITS):
        mu = mpmath.sqrt(mpmath.mpf(mu2))
        e = mpmath.mpf(eps)
        return mpmath.ncdf(-e / mu + mu / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu - mu / 2)


def _root(delta: float, mu: float) -> float:
    """eps >= 0 with delta_mu(eps) = delta in double precision (0 if delta_mu(0) <= delta)."""
    target = math.log(delta)
    if not math.isfinite(mu):
        return math.inf  # a noise multiplier whose square underflows: no privacy at all
    if _log_delta(0.0, mu) <= target:
        return 0.0
    high = mu * mu / 2.0 + mu * math.sqrt(2.0 * max(-target, 1.0)) + 1.0
    while _log_delta(high, mu) > target:
        high *= 2.0
        if not math.isfinite(high):
            return math.inf  # the root lies beyond the largest double
    return float(brentq(lambda e: _log_delta(e, mu) - target, 0.0, high, xtol=1e-300, rtol=8.9e-16))


def _outwards(value: float, direction: float, attempt: int) -> float:
    """``value`` moved by 2^(attempt - 46) relative (absolute below 1e-16) in ``direction``."""
    step = max(abs(value), 1e-16) * 2.0 ** (attempt - 46)
    return value + direction * step


def epsilon_bounds(delta: float, mu2_low: float, mu2_high: float) -> tuple[float, float]:
    """(lower, upper) on the exact epsilon(delta) of a mu-GDP pair with mu^2 in
    [mu2_low, mu2_high]: delta_{mu_low}(lower) >= delta (so the exact epsilon is at least
    lower, or lower is 0) and delta_{mu_high}(upper) <= delta, both checked at 50 digits.
    mu^2 = 0 (every noise multiplier so large that 1 / sigma^2 underflows): the pair is one
    distribution, epsilon 0."""
    if mu2_high == 0.0:
        return 0.0, 0.0
    upper = _root(delta, math.sqrt(mu2_high))
    if math.isinf(upper):  # epsilon beyond the largest double: no finite certificate
        lower = _root(delta, math.sqrt(mu2_low))
        return (0.0 if math.isinf(lower) else _certified_lower(lower, delta, mu2_low)), upper
    attempt = 0
    while upper > 0.0 or _delta_exact(0.0, mu2_high) > delta:
        if _delta_exact(upper, mu2_high) <= delta:
            break
        upper = _outwards(upper, 1.0, attempt)
        attempt += 1
    lower = _certified_lower(_root(delta, math.sqrt(mu2_low)), delta, mu2_low)
    return min(lower, upper), upper


def _certified_lower(lower: float, delta: float, mu2_low: float) -> float:
    """``lower`` moved down until delta_{mu_low}(lower) >= delta at 50 digits (or 0; a root
    beyond the largest double gives 0, the bound that needs no evaluation)."""
    if math.isinf(lower):
        return 0.0
    attempt = 0
    while lower > 0.0 and _delta_exact(lower, mu2_low) < delta:
        lower = max(_outwards(lower, -1.0, attempt), 0.0)
        attempt += 1
    return lower


def delta_bounds(epsilon: float, mu2_low: float, mu2_high: float) -> tuple[float, float]:
    """(lower, upper) on the exact delta(epsilon) of a mu-GDP pair with mu^2 in
    [mu2_low, mu2_high], each the 50-digit value rounded outwards to a double.

    Far in the tail, where -eps/mu + mu/2 <= -40 for mu^2 = mu2_high, the exact delta is below
    Phi(-eps/mu + mu/2) <= Phi(-40) < 1e-349 (dropping the subtracted term), so (0, the
    smallest positive double) brackets it; the 50-digit formula is not evaluated there (its
    two terms agree to about mu^2 / eps relative, and mpmath's erfc overflows near eps 1e300)."""
    if mu2_high == 0.0:  # one distribution (1 / sigma^2 underflowed): delta 0
        return 0.0, 0.0
    mu_high = math.sqrt(mu2_high)
    if -epsilon / mu_high + mu_high / 2.0 <= -40.0:
        return 0.0, math.nextafter(0.0, 1.0)
    with mpmath.workdps(_DIGITS):
        high = _delta_exact(epsilon, mu2_high)
        low = _delta_exact(epsilon, mu2_low)
        upper = min(math.nextafter(float(high), math.inf), 1.0)
        lower = max(math.nextafter(float(low), -math.inf), 0.0)
    return lower, upper
