"""The last steps from a composition to delta and epsilon, where the FFT's round-off bound is 0
(one copy of one PLD, no transform): the rounding of the grid losses inside the hockey-stick
weights and of epsilon's closing formula must still leave the certified values on the safe side
of the exact values of the same discretised PLD (60-digit mpmath).

Grid losses ``(start + k) h`` are rounded products; at large offsets and an epsilon an ulp
below a grid loss, the weight ``1 - e^{eps - l}`` is about ``l - eps``, so the loss's rounding
(``u |l|``) is of the weight's own size: it left the certified delta at 0.71 of the exact one
before the arguments were moved by their rounding."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpsharp.accountants import _pld_numerics as numerics
from dpsharp.accountants._pld_numerics import DiscretePLD


def exact_delta(pld: DiscretePLD, epsilon: float) -> mpmath.mpf:
    step = mpmath.mpf(pld.grid_step)
    total = mpmath.mpf(pld.infinity_mass)
    for index, mass in enumerate(pld.mass.tolist()):
        loss = mpmath.mpf(pld.offset + index) * step
        if loss > epsilon:
            total += mpmath.mpf(mass) * (1 - mpmath.exp(mpmath.mpf(epsilon) - loss))
    return total


def one_copy(pld: DiscretePLD) -> numerics.ComposedPLD:
    composed = numerics.compose([pld], [1], log_tail=math.log(1e-12), pessimistic=True)
    assert composed.noise == 0.0  # nothing else absorbs the last steps' rounding
    return composed


@pytest.mark.parametrize("offset", [100_001, 299_999, 512_347, 777_777])
def test_delta_just_below_a_grid_loss_is_not_below_exact(offset: int) -> None:
    pld = DiscretePLD(offset, np.array([0.5, 0.5]), 0.0, 1e-4)
    composed = one_copy(pld)
    with mpmath.workdps(60):
        epsilon = (offset + 1) * 1e-4
        for _ in range(3):  # one, two and three ulps below the computed grid loss
            epsilon = math.nextafter(epsilon, -math.inf)
            exact = exact_delta(pld, epsilon)
            assert composed.delta(epsilon, pessimistic=True) >= exact
            assert composed.delta(epsilon, pessimistic=False) <= exact


def test_epsilon_is_not_below_the_exact_crossing() -> None:
    rng = np.random.default_rng(5)
    with mpmath.workdps(60):
        for _ in range(8):
            offset = int(rng.integers(50_000, 900_000))
            step = float(rng.choice([1e-4, 3e-5, 2.0**-12]))
            mass = rng.random(3)
            mass /= mass.sum()
            pld = DiscretePLD(offset, mass, 0.0, step)
            composed = one_copy(pld)
            for delta in (1e-3, 1e-6, 1e-9):
                low, high = mpmath.mpf(0), mpmath.mpf(offset + 2) * mpmath.mpf(step)
                for _ in range(200):  # bisection on the exact, decreasing curve
                    middle = (low + high) / 2
                    above = exact_delta(pld, middle) > delta
                    low, high = (middle, high) if above else (low, middle)
                assert composed.epsilon(delta, pessimistic=True) >= high
                assert composed.epsilon(delta, pessimistic=False) <= low
