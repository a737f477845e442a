"""Rounding to the safe side for the closed-form accountants and composition theorems.

A privacy bound evaluated in floating point is rounded to the nearest double, which is below the
exact value about half the time (0.1 added ten times is 1.0 in doubles; the exact sum of those
ten doubles is 1 + 5.6e-17). A certified epsilon or delta must not be below the exact value of
the formula it claims, so these helpers return a double at or above it:

* :func:`sum_rounded_up` and :func:`fraction_rounded_up` are exact (the smallest double at or
  above the exact sum or rational);
* :func:`raised` bounds a short formula's rounding from its terms' magnitudes (forward error
  analysis: each elementary operation is within one unit of roundoff, Higham 2002, Section 2.2).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from fractions import Fraction

#: The unit roundoff of IEEE double precision, 2^-53 (Higham 2002, Section 2.1).
UNIT_ROUNDOFF = 2.0**-53
_LARGEST_DOUBLE = Fraction(sys.float_info.max)


def gamma(count: float) -> float:
    """gamma_k = k u / (1 - k u), the relative error bound of k successive roundings
    (Higham 2002, Lemma 3.1)."""
    return count * UNIT_ROUNDOFF / (1.0 - count * UNIT_ROUNDOFF)


def raised(value: float, magnitude: float) -> float:
    """``value`` raised past the rounding of its evaluation: by 8 units of roundoff of
    ``magnitude`` (the sum of the absolute values of the terms it was formed from, each within
    a few roundings of its exact value), then to the next double. (Rounded to nearest, the
    zCDP conversion rho + 2 sqrt(rho log(1/delta)) lost its second term entirely above
    rho ~ 1e30, and its CKS delta read 1e-8 relative below exact at rho = 1e14, where
    alpha rho - epsilon cancels.)"""
    return math.nextafter(value + 8.0 * UNIT_ROUNDOFF * magnitude, math.inf)


def fraction_rounded_up(exact: Fraction) -> float:
    """The smallest double >= the rational ``exact`` (float() rounds to nearest; one step up
    where that is below); +inf past the largest double (an upper bound that no finite double
    is)."""
    if exact > _LARGEST_DOUBLE:
        return math.inf
    nearest = float(exact)
    return nearest if Fraction(nearest) >= exact else math.nextafter(nearest, math.inf)


def sum_rounded_up(values: Iterable[float]) -> float:
    """The smallest double >= the exact sum of the doubles ``values``. ``math.fsum`` rounds the
    exact sum to nearest; the sign of the exact remainder sum - fsum (itself an fsum, whose
    correct rounding keeps the sign) says whether to step up. +inf where a value is +inf."""
    terms = list(values)
    total = math.fsum(terms)
    if not math.isfinite(total):
        return total
    terms.append(-total)
    return math.nextafter(total, math.inf) if math.fsum(terms) > 0.0 else total
