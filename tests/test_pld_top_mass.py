"""A bounded PLD composition (Laplace mechanisms) near its largest loss: epsilon(delta) below
the pure-DP epsilon from the exact top mass, certified against closed forms.

One Laplace mechanism with scale b (L1 sensitivity 1) has delta(eps) = 1 - e^{(eps - 1/b) / 2}
for 0 <= eps <= 1/b, so epsilon(delta) = 1/b + 2 log(1 - delta) exactly. A composition of k
Laplace mechanisms puts P-mass 2^-k on its largest loss L = sum_i 1/b_i (each release at its
own largest loss 1/b_i, on the half line beyond the other mean), so delta(eps) >= 2^-k (1 -
e^{eps - L}) and epsilon(delta) >= L + log(1 - 2^k delta): a lower reference that the
certified epsilon may not cross, and which it should meet to first order in delta.
"""

from __future__ import annotations

import math

import mpmath
import pytest

from dpsharp.accountants.pld import PLDAccountant
from dpsharp.events import Laplace

mpmath.mp.dps = 40


@pytest.mark.parametrize("scale", [1.0, 0.5])
@pytest.mark.parametrize("delta", [1e-14, 1e-10])
def test_single_laplace_epsilon_below_its_largest_loss(scale: float, delta: float) -> None:
    accountant = PLDAccountant().compose(Laplace(scale))
    exact = mpmath.mpf(1) / mpmath.mpf(scale) + 2 * mpmath.log1p(-mpmath.mpf(delta))
    mine = accountant.epsilon(delta)
    assert mine >= float(exact)  # certified
    # within 1e-3 delta (and 4 ulp) of the exact value: before, the pure-DP 1/b (above by 2 delta)
    assert mine <= float(exact) + 1e-3 * delta + 4 * math.ulp(1.0 / scale)
    assert accountant.delta(mine) <= delta


def test_laplace_composition_epsilon_from_the_top_mass() -> None:
    """dp-accounting's Laplace test composition (3 x Lap(1), 2 x Lap(2)) at its delta 1e-14."""
    delta = 1e-14
    accountant = PLDAccountant().compose(Laplace(1.0), 3).compose(Laplace(2.0), 2)
    lower = 4 + mpmath.log1p(-32 * mpmath.mpf(delta))
    mine = accountant.epsilon(delta)
    assert mine >= float(lower)
    assert mine <= float(lower) + 1e-3 * delta + 4 * math.ulp(4.0)
    assert accountant.delta(mine) <= delta


def test_single_laplace_delta_near_its_largest_loss() -> None:
    """delta(eps) for eps within a grid step below 1/b: from the top mass, at least the exact
    1 - e^{(eps - 1/b) / 2} and within 1e-4 relative of it."""
    accountant = PLDAccountant().compose(Laplace(1.0))
    for gap in (1e-12, 1e-9, 1e-7):
        exact = -mpmath.expm1((mpmath.mpf(1.0 - gap) - 1) / 2)
        mine = accountant.delta(1.0 - gap)
        assert float(exact) <= mine <= float(exact) * (1 + 1e-4)
