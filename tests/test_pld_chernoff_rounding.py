"""The Chernoff bounds on the mass outside a composition's window, and its mass at +inf, are
upper bounds on their exact formulas after floating-point evaluation (50-digit mpmath on the
same doubles): the log-MGFs are raised by their evaluation error (a log-MGF is multiplied by the
step count, up to 10^7, before it enters a tail), the tails by that of their sums, and the +inf
mass carries the bound on its own evaluation error on each side."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpsharp._native import core
from dpsharp.accountants import _pld_numerics as numerics
from dpsharp.accountants._pld_numerics import DiscretePLD

_REMOVE = 2  # the core's code of the remove direction of a Poisson-sampled Gaussian


def exact_log_mgf(pld: DiscretePLD, t: float) -> mpmath.mpf:
    step = mpmath.mpf(pld.grid_step)
    terms = [
        mpmath.mpf(mass) * mpmath.exp(mpmath.mpf(t) * (pld.offset + index) * step)
        for index, mass in enumerate(pld.mass.tolist())
        if mass > 0
    ]
    return mpmath.log(mpmath.fsum(terms))


def leaves() -> list[DiscretePLD]:
    offset, mass, infinity = core.pld_discretize(_REMOVE, 1.0, 0.01, 2.0**-11, 1e-12, 1e-12, True)
    sampled = DiscretePLD(int(offset), np.asarray(mass), float(infinity), 2.0**-11)
    rng = np.random.default_rng(3)
    spread = rng.random(3000) ** 8  # masses over many magnitudes, far from either end
    spread /= spread.sum() * 1.001
    wide = DiscretePLD(-1500, spread, 0.0, 2.0**-9)
    return [sampled, wide]


@pytest.mark.parametrize("which", [0, 1])
def test_log_mgf_is_an_upper_bound_within_its_slack(which: int) -> None:
    pld = leaves()[which]
    exponents = numerics.chernoff_exponents()
    got = pld.log_mgf(exponents)
    with mpmath.workdps(50):
        for t, value in zip(exponents.tolist(), got.tolist()):
            exact = exact_log_mgf(pld, t)
            assert mpmath.mpf(value) >= exact
            assert mpmath.mpf(value) - exact < 1e-10 * max(1, abs(exact))


def test_window_tails_are_upper_bounds_on_their_formula() -> None:
    """At 10^6 and 10^7 copies: each tail at the window's edges is at least the exact
    minimum over the exponents of ``exp(c M(t) - t b)`` with the exact log-MGF M."""
    pld = leaves()[0]
    exponents = numerics.chernoff_exponents()
    with mpmath.workdps(50):
        moments = [exact_log_mgf(pld, t) for t in exponents.tolist()]
        for count in (10**6, 10**7):
            window = numerics._Window.of([pld], [count], math.log(1e-12))
            composed = window._composed(numerics._Bounds(0.0, 0.0, 0.0), dense=np.zeros(2))
            low = mpmath.mpf(window.start) * mpmath.mpf(pld.grid_step)
            high = mpmath.mpf(window.start + window.size - 1) * mpmath.mpf(pld.grid_step)
            k = len(exponents) // 2
            above = min(
                mpmath.exp(count * m - mpmath.mpf(t) * high)
                for m, t in zip(moments[:k], exponents[:k].tolist())
            )
            below = min(
                mpmath.exp(count * m + mpmath.mpf(t) * low)
                for m, t in zip(moments[k:], (-exponents[k:]).tolist())
            )
            if composed.above:
                assert mpmath.mpf(composed.above) >= min(above, 1)
            if composed.below:
                assert mpmath.mpf(composed.below) >= min(below, 1)
            assert composed.above or composed.below


def test_infinity_mass_error_brackets_the_exact_mass() -> None:
    rng = np.random.default_rng(11)
    with mpmath.workdps(50):
        for _ in range(300):
            kinds = int(rng.integers(1, 4))
            probabilities = 10.0 ** rng.uniform(-17, -1, kinds)
            counts = [int(c) for c in 10 ** rng.uniform(0, 7, kinds)]
            plds = [
                DiscretePLD(k, np.array([0.5, 0.5]) * (1.0 - p), float(p), 2.0**-8)
                for k, p in enumerate(probabilities.tolist())
            ]
            window = numerics._Window.of(plds, counts, math.log(1e-12))
            composed = window._composed(numerics._Bounds(0.0, 0.0, 0.0), dense=np.zeros(2))
            finite = mpmath.mpf(1)
            for pld, count in zip(plds, counts):
                finite *= (1 - mpmath.mpf(pld.infinity_mass)) ** count
            exact = 1 - finite
            assert mpmath.mpf(composed.infinity_mass) + composed.infinity_error >= exact
            assert mpmath.mpf(composed.infinity_mass) - composed.infinity_error <= exact
