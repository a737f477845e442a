"""The certified lower bound of the PLD accountant on compositions of mechanisms whose privacy
loss takes finitely many values (accountants/_pld_atoms.pulled_to_grid): it stays below the
exact epsilon, and the bracket is narrow where rounding every atom down was not.

Every test runs on both routes of such a composition: on the grid (the exact lattice switched
off) and on the exact lattice of accountants/_pld_lattice.py (where its outcomes are few
enough; the routes' own tests are in tests/test_pld_lattice.py).

References, computed here independently of dpsharp:

* k-fold composition of eps0-DP binary randomized response (Kairouz, Oh, Viswanath 2015): the
  composed loss is eps0 (2 J - k), J ~ Bin(k, e^eps0 / (1 + e^eps0)), and
  delta(eps) = E[(1 - e^{eps - L})_+]; evaluated in mpmath at 30 digits;
* k-fold composition of the discrete Laplace mechanism (Ghosh, Roughgarden, Sundararajan
  2009): the loss log(P(z) / P(z - s)) = a (|z - s| - |z|) is a times an integer, its law
  summed from the two-sided geometric pmf and convolved k times on the integer lattice.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import optimize

from dpsharp.accountants import _pld_lattice
from dpsharp.accountants.pld import PLDAccountant
from dpsharp.events import DiscreteLaplace, Laplace, RandomizedResponse


@pytest.fixture(autouse=True, params=["grid", "lattice"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The route of an atom-only composition: "grid" switches the exact lattice off."""
    if request.param == "grid":
        monkeypatch.setattr(_pld_lattice, "MAX_OUTCOMES", 0)
    return str(request.param)


def _rr_delta(eps0: float, count: int, eps: float) -> mpmath.mpf:
    """delta(eps) of ``count`` compositions of eps0-DP randomized response, in mpmath."""
    with mpmath.workdps(30):
        e0, e = mpmath.mpf(eps0), mpmath.mpf(eps)
        p = mpmath.exp(e0) / (1 + mpmath.exp(e0))
        j0 = max(0, math.ceil((eps / eps0 + count) / 2.0) - 1)  # terms with loss <= eps vanish
        total = mpmath.mpf(0)
        log_p, log_q = mpmath.log(p), mpmath.log(1 - p)
        # terms beyond j0 + 2000 hold less than e^-300 of the mass for the counts used here
        for j in range(j0, min(count, j0 + 2000) + 1):
            loss = e0 * (2 * j - count)
            if loss <= e:
                continue
            log_mass = (mpmath.loggamma(count + 1) - mpmath.loggamma(j + 1)
                        - mpmath.loggamma(count - j + 1) + j * log_p + (count - j) * log_q)
            total += mpmath.exp(log_mass) * (1 - mpmath.exp(e - loss))
        return total


def _dlap_composed(a: float, s: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(losses, masses) of ``count`` compositions of the discrete Laplace mechanism: the law
    of j = |z - s| - |z|, z ~ P(z) proportional to e^{-a |z|}, convolved on the lattice."""
    span = int(60.0 / a) + s
    z = np.arange(-span, span + s + 1)
    pmf = np.exp(-a * np.abs(z))
    pmf /= pmf.sum()
    j = np.abs(z - s) - np.abs(z)  # in [-s, s]
    one = np.bincount(j + s, weights=pmf, minlength=2 * s + 1)
    law = np.ones(1)
    for _ in range(count):
        law = np.convolve(law, one)
    return a * (np.arange(law.size) - s * count), law


def _epsilon_from(losses: np.ndarray, masses: np.ndarray, delta: float) -> float:
    def excess(e: float) -> float:
        gap = np.minimum(e - losses, 700.0)
        return float(np.sum(masses * np.maximum(-np.expm1(gap), 0.0))) - delta

    return float(optimize.brentq(excess, 0.0, float(losses.max()), xtol=1e-13))


def _rr(eps0: float) -> RandomizedResponse:
    return RandomizedResponse(2.0 / (1.0 + math.exp(eps0)), 2)


@pytest.mark.parametrize(("eps0", "count", "delta"), [(0.01, 20_000, 1e-5), (0.1, 1000, 1e-6)])
def test_randomized_response_bracket_holds_the_exact_epsilon_and_meets_the_precision(
    eps0: float, count: int, delta: float
) -> None:
    """eps0-DP randomized response composed ``count`` times: the exact delta at the certified
    lower bound is at least ``delta`` (so lower <= exact epsilon) and at the upper bound at most
    ``delta``, and the bracket is within the precision 1e-3 relative. Rounding both atoms down
    left 2.3e-2 and 4.9e-4 relative (0.151 and 0.0096 in epsilon) after every refinement."""
    acc = PLDAccountant(neighbouring="replace_one").compose(_rr(eps0), count)
    lower, upper = acc.epsilon_bounds(delta)
    assert _rr_delta(eps0, count, lower) >= delta
    assert _rr_delta(eps0, count, upper) <= delta
    assert 0.0 < upper - lower <= 1e-3 * upper


def test_randomized_response_lower_bound_on_one_grid() -> None:
    """20,000 steps of 0.01-DP randomized response at delta 1e-5: the optimistic bound of the
    base grid alone (h = 2^-12, 0.01 / h = 40.96) is within 0.3 of the exact epsilon and below
    it; rounding the atoms down erred by 2.5 there."""
    eps0, count, delta = 0.01, 20_000, 1e-5
    acc = PLDAccountant(neighbouring="replace_one").compose(_rr(eps0), count)
    lower = acc._epsilon_side(delta, pessimistic=False, refinement=0)
    upper = acc.epsilon(delta)
    assert _rr_delta(eps0, count, lower) >= delta >= _rr_delta(eps0, count, upper)
    assert upper - lower <= 0.3


@pytest.mark.parametrize(("a", "s", "count", "delta"),
                         [(0.02, 3, 2000, 1e-5), (0.05, 2, 500, 1e-6), (0.5, 1, 100, 1e-6)])
def test_discrete_laplace_bracket_holds_the_exact_epsilon(
    a: float, s: int, count: int, delta: float
) -> None:
    """The discrete Laplace mechanism composed ``count`` times: the certified bracket holds
    the exact epsilon of the lattice convolution and is within the precision; on the base grid
    the optimistic bound is within 0.04, 0.002 and 1e-4 of it (rounding the atoms down:
    0.40, 0.036 and 4.3e-5; the last one's atoms lie on the grid and stay there)."""
    losses, masses = _dlap_composed(a, s, count)
    exact = _epsilon_from(losses, masses, delta)
    acc = PLDAccountant().compose(DiscreteLaplace(a, s), count)
    lower, upper = acc.epsilon_bounds(delta)
    assert lower <= exact + 1e-9 * exact <= upper + 2e-9 * exact
    assert upper - lower <= 1e-3 * upper
    base = acc._epsilon_side(delta, pessimistic=False, refinement=0)
    assert base <= exact + 1e-9 * exact
    assert exact - base <= {0.02: 0.04, 0.05: 0.002, 0.5: 1e-4}[a]


def test_pulled_atoms_are_below_every_delta_of_random_atoms() -> None:
    """Random finite privacy losses (2 to 12 atoms, spacings from far below to far above the
    grid step): the optimistic grid law's delta(eps) = sum m (1 - e^{eps - l})_+ is at most the
    exact one at every eps in [-3, 3] (for every eps, so for every composition: each release
    may be shifted by any other's loss), no mass is lost, and no loss exceeds the largest."""
    from dpsharp.accountants._pld_atoms import place_atoms, pulled_to_grid

    rng = np.random.default_rng(7)
    eps_grid = np.linspace(-3.0, 3.0, 601)
    for _ in range(100):
        size = int(rng.integers(2, 13))
        h = float(rng.choice([1e-3, 1e-2, 0.05, 0.3]))
        losses = np.sort(rng.uniform(-2.0, 2.0, size) * float(rng.choice([1e-2, 1.0])))
        masses = rng.dirichlet(np.ones(size))
        pulled_l, pulled_m = pulled_to_grid(losses, masses, h, nearest=bool(rng.integers(2)))
        offset, out = place_atoms(pulled_l, pulled_m, h, False)
        grid = (offset + np.arange(out.size)) * h
        assert math.fsum(out) == pytest.approx(1.0, rel=1e-12)
        assert grid[out > 0].max() <= losses.max()
        exact = np.maximum(-np.expm1(eps_grid[:, None] - losses[None, :]), 0.0) @ masses
        ours = np.maximum(-np.expm1(eps_grid[:, None] - grid[None, :]), 0.0) @ out
        assert np.all(ours <= exact + 1e-15)


@pytest.mark.parametrize("delta", [1e-12, 1e-14, 1e-15, 1e-20])
def test_bounds_below_the_round_off_floor_from_the_top_atom(delta: float, route: str) -> None:
    """Ten releases of randomized response (eps0 = log 3) and of the discrete Laplace mechanism
    (a = 1, s = 1) at deltas at and below the FFT's round-off floor. The optimistic
    composition's curve cannot be read there; its top atom (every release at its largest
    loss, mass prod m_i) still gives epsilon >= L + log(1 - delta / m). The bracket holds the
    exact epsilon (mpmath and the lattice convolution) and is narrow; the lower bound was 0.0
    at 1e-12 and 1e-14 and both queries raised at 1e-15. (The exact lattice's bracket is its
    rounding allowance, about 1e-13 relative.)"""
    eps0 = math.log(3.0)
    acc = PLDAccountant(neighbouring="replace_one").compose(_rr(eps0), 10)
    lower, upper = acc.epsilon_bounds(delta)
    assert _rr_delta(eps0, 10, lower) >= delta >= _rr_delta(eps0, 10, upper)
    assert 0.0 < upper - lower <= 1e-4 * upper
    assert upper == acc.epsilon(delta)

    # discrete Laplace: its atoms lie on the grid, so the bracket is within a few ulp of exact
    acc = PLDAccountant().compose(DiscreteLaplace(1.0, 1), 10)
    lower, upper = acc.epsilon_bounds(delta)
    top_mass = mpmath.mpf(1) / (1 + mpmath.exp(-1))  # P(z <= 0): the loss is a there
    exact = 10 + mpmath.log1p(-mpmath.mpf(delta) / top_mass**10)  # only the top atom counts
    assert lower <= float(exact) <= upper
    assert upper - lower <= (1e-13 if route == "grid" else 1e-12 * upper)


def test_laplace_lower_bound_below_the_round_off_floor() -> None:
    """Ten Laplace mechanisms at delta 1e-12: the lower bound was 0.0. Now it comes from the
    optimistic composition's top atom, one grid step per release below the largest loss 10:
    below the top-mass reference 10 + log(1 - 2^10 delta) (itself below the exact epsilon,
    see tests/test_pld_top_mass.py) and within 10 grid steps of it."""
    delta = 1e-12
    acc = PLDAccountant().compose(Laplace(1.0), 10)
    lower, upper = acc.epsilon_bounds(delta)
    reference = float(10 + mpmath.log1p(-1024 * mpmath.mpf(delta)))
    assert lower <= reference <= upper
    assert reference - lower <= 10 * acc._grid_step(0) + 1e-12


def test_delta_lower_bound_includes_the_top_atom() -> None:
    """delta_bounds' lower end stays below the exact delta of randomized response (mpmath) at
    epsilons close to the largest loss, where only the top atom contributes."""
    eps0 = math.log(3.0)
    acc = PLDAccountant(neighbouring="replace_one").compose(_rr(eps0), 10)
    for eps in (9.0, 10.5, 10.98):
        lower, upper = acc.delta_bounds(eps)
        exact = float(_rr_delta(eps0, 10, eps))
        assert lower <= exact <= upper
        assert lower >= 0.5 * exact
