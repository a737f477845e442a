"""Atom losses on the grid route are the doubles on their side of the exact closed forms.

The discrete Laplace mechanism's top loss is a s for the double a: 10 x fl(0.1) is 1 + 5.6e-17,
whose nearest double is 1.0. Placed at 1.0 on a grid aligned to it, eleven releases put the
support's top at exactly 11.0, and the certified delta there was 0 while the exact one is
m^11 (1 - e^{11 - 11 a s}) = 5.1e-19; with a = fl(1/3), s = 3 (a s = 1 - 5.6e-17) the lower
bound came out 1.8 times the exact delta. The references: the composed atoms in 60-digit
mpmath (every loss a multiple of a, masses from the closed form)."""

from __future__ import annotations

import math

import mpmath
import pytest

from dpsharp import PLDAccountant
from dpsharp.events import DiscreteLaplace, GaussianMixture


def exact_discrete_laplace_delta(
    a: float, sensitivity: int, steps: int, epsilon: float
) -> mpmath.mpf:
    """delta(eps) of ``steps`` releases of the discrete Laplace mechanism: the loss of one
    release is a m, m in {s, s - 2, ..., -s}, with P(m = s) = 1 / (1 + r), P(m = -s) = r^s /
    (1 + r), P(m = s - 2x) = (1 - r) r^x / (1 + r) for 0 < x < s, r = e^{-a}."""
    with mpmath.workdps(60):
        rate, r = mpmath.mpf(a), mpmath.exp(-mpmath.mpf(a))
        one = {sensitivity: 1 / (1 + r), -sensitivity: r**sensitivity / (1 + r)}
        for x in range(1, sensitivity):
            one[sensitivity - 2 * x] = (1 - r) * r**x / (1 + r)
        composed = {0: mpmath.mpf(1)}
        for _ in range(steps):
            step: dict[int, mpmath.mpf] = {}
            for total, mass in composed.items():
                for m, p in one.items():
                    step[total + m] = step.get(total + m, 0) + mass * p
            composed = step
        return mpmath.fsum(
            mass * (1 - mpmath.exp(mpmath.mpf(epsilon) - rate * total))
            for total, mass in composed.items()
            if rate * total > epsilon
        )


@pytest.mark.parametrize(
    ("a", "sensitivity", "steps", "top"),
    [(0.1, 10, 11, 11.0), (1 / 3, 3, 115, 115.0)],
)
def test_delta_bracket_holds_the_exact_delta_at_the_top_of_the_support(
    a: float, sensitivity: int, steps: int, top: float
) -> None:
    accountant = PLDAccountant().compose(DiscreteLaplace(a, sensitivity), steps)
    assert accountant._exact_lattice() is None  # the grid route, past the exact lattice
    epsilon = top
    for _ in range(3):  # at the double top and one and two ulps below it
        exact = exact_discrete_laplace_delta(a, sensitivity, steps, epsilon)
        lower, upper = accountant.delta_bounds(epsilon)
        assert accountant.delta(epsilon) >= exact
        assert upper >= exact
        assert lower <= exact
        epsilon = math.nextafter(epsilon, -math.inf)


def test_mixture_probabilities_within_the_tolerance_are_normalised() -> None:
    """A distribution: probabilities within 1e-9 of summing to 1 are divided by their sum (used
    as given, P lacked their missing mass and the remove direction's delta read 7e-10
    relative low); the event then answers as the normalised one does."""
    gap = 9.9e-10
    given = GaussianMixture(0.8, (0.0, 1.0), (0.5, 0.5 - gap))
    assert math.fsum(given.probabilities) == 1.0
    normalised = GaussianMixture(0.8, (0.0, 1.0), (0.5 / (1 - gap), (0.5 - gap) / (1 - gap)))
    for epsilon in (0.0, 1.0, 3.0):
        assert PLDAccountant().compose(given).delta(epsilon) == pytest.approx(
            PLDAccountant().compose(normalised).delta(epsilon), rel=1e-13
        )


@pytest.mark.parametrize("a", [8.0, 9.0])
def test_top_of_the_support_carries_the_masses_rounding(a: float) -> None:
    """1,000 releases of the discrete Laplace mechanism (a dyadic, so every atom sits on the
    grid): the only composed loss within a grid step of the top L = 10 a T has mass m^T,
    m = 1 / (1 + e^{-a}), so delta(eps) = m^T (1 - e^{eps - L}) there. The double m errs by
    about 1e-16 relative (below the exact m for a = 9, above it for a = 8), which the count
    turns into 1e-13: before the atoms' masses carried their rounding, the certified delta
    read 8e-14 relative below the exact one (a = 9) and the lower bound 1e-13 above it
    (a = 8), at deltas near 3e-3."""
    steps = 1000
    accountant = PLDAccountant().compose(DiscreteLaplace(a, 10), steps)
    top = 10.0 * a * steps
    step = accountant._grid_step()
    with mpmath.workdps(60):
        mass = (1 / (1 + mpmath.exp(-mpmath.mpf(a)))) ** steps
        for epsilon in (top - step / 2, top - step / 8, math.nextafter(top, 0.0)):
            exact = mass * (1 - mpmath.exp(mpmath.mpf(epsilon) - mpmath.mpf(top)))
            lower, upper = accountant.delta_bounds(epsilon)
            assert accountant.delta(epsilon) >= exact
            assert upper >= exact
            assert lower <= exact
