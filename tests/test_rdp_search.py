"""The RDP accountant evaluates only the orders its answer needs (dpsharp.rdp.search_orders):
the answer must be the exhaustive minimum over every order of the grid, the bounds that let it
skip orders must be below the true log moments (mpmath at 50 digits), and the default grid must
never be looser than Opacus' default grid."""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from _rdp_reference import log_a_minus_one, rdp as reference_rdp

import dpsharp.rdp as rdp_module
from dpsharp import Gaussian, Laplace, PoissonSampled, RDPAccountant
from dpsharp.rdp import (
    DEFAULT_ORDERS,
    convex_lower_bound,
    delta_from_rdp,
    epsilon_from_rdp,
    poisson_gaussian_rdp,
)

OPACUS_DEFAULT_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + [float(v) for v in range(12, 64)]

# (q, sigma, steps): small and large epsilon, optimum at small, medium and large orders
SETTINGS = [
    (256 / 60000, 1.1, 10_000),
    (0.01, 4.0, 10_000),
    (0.02, 0.8, 10_000),
    (0.1, 0.7, 10_000),
    (0.05, 0.6, 1_000),
    (1e-3, 10.0, 10_000),
    (0.2, 0.5, 10_000),
    (0.5, 2.0, 3),
]


def exhaustive_curve(q: float, sigma: float, steps: int, orders: list[float]) -> np.ndarray:
    """Every order evaluated, as the accountant did before it searched."""
    return steps * poisson_gaussian_rdp(q, sigma, orders)


@pytest.mark.parametrize(("q", "sigma", "steps"), SETTINGS)
@pytest.mark.parametrize("conversion", ["tight", "classic"])
def test_answer_is_the_exhaustive_minimum(
    q: float, sigma: float, steps: int, conversion: str
) -> None:
    curve = exhaustive_curve(q, sigma, steps, list(DEFAULT_ORDERS))
    for delta in (1e-3, 1e-5, 1e-10):
        event = PoissonSampled(Gaussian(sigma), q)
        acc = RDPAccountant(conversion=conversion).compose(event, steps)
        eps, order = epsilon_from_rdp(
            DEFAULT_ORDERS, curve, delta, conversion=conversion  # type: ignore[arg-type]
        )
        guarantee = acc.guarantee(delta)
        assert guarantee.epsilon == eps
        assert guarantee.details["order"] == order
        target = max(eps, 0.05)
        fresh = RDPAccountant(conversion=conversion).compose(event, steps)
        expected = delta_from_rdp(
            DEFAULT_ORDERS, curve, target, conversion=conversion  # type: ignore[arg-type]
        )[0]
        assert fresh.delta(target) == expected


def test_heterogeneous_ledger_is_the_exhaustive_minimum() -> None:
    """Several lazy curves (distinct sigmas and rates) next to closed-form leaves."""
    orders = list(DEFAULT_ORDERS)
    leaves = [
        (PoissonSampled(Gaussian(0.9), 0.01), 3000),
        (PoissonSampled(Gaussian(1.3), 0.02), 2000),
        (PoissonSampled(Gaussian(5.0), 0.5), 7),
        (Gaussian(30.0), 4),
        (Laplace(40.0), 2),
    ]
    acc = RDPAccountant()
    for event, count in leaves:
        acc.compose(event, count)
    curve = (
        3000 * poisson_gaussian_rdp(0.01, 0.9, orders)
        + 2000 * poisson_gaussian_rdp(0.02, 1.3, orders)
        + 7 * poisson_gaussian_rdp(0.5, 5.0, orders)
        + 4 * rdp_module.gaussian_rdp(30.0, orders)
        + 2 * rdp_module.laplace_rdp(40.0, orders)
    )
    for delta in (1e-5, 1e-9):
        expected = epsilon_from_rdp(orders, curve, delta)[0]
        assert acc.epsilon(delta) == pytest.approx(expected, rel=1e-14)
    np.testing.assert_allclose(acc.rdp(), curve, rtol=1e-14)


def test_many_distinct_sigmas_match_the_exhaustive_minimum() -> None:
    """A decaying per-step schedule: one lazy curve per distinct sigma, searched together."""
    sigmas = np.geomspace(2.0, 0.8, 40)
    acc = RDPAccountant()
    curve = np.zeros(len(DEFAULT_ORDERS))
    for sigma in sigmas:
        acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.01), 25)
        curve = curve + 25 * poisson_gaussian_rdp(0.01, float(sigma), DEFAULT_ORDERS)
    expected = epsilon_from_rdp(DEFAULT_ORDERS, curve, 1e-5)[0]
    assert acc.epsilon(1e-5) == pytest.approx(expected, rel=1e-13)


def evaluated_fractional(accountant: RDPAccountant) -> list[float]:
    """The fractional points its (single) lazy curve has evaluated so far."""
    (curve,) = accountant._curves.values()
    assert isinstance(curve, rdp_module.LazyPoissonGaussianCurve)
    points = curve.plan.points[~np.isnan(curve.values)]
    return [float(p) for p in points if p != math.floor(p)]


@pytest.mark.parametrize(("q", "sigma", "steps"), [SETTINGS[0]] + SETTINGS[2:5])
def test_few_fractional_orders_are_integrated(
    q: float, sigma: float, steps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fractional orders (quadrature, 10-40x an integer order) are evaluated only near the
    optimum: at most 10 of the default grid's 120."""
    monkeypatch.setattr(rdp_module, "_CURVE_CACHE", {})  # a first evaluation
    acc = RDPAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert evaluated_fractional(acc) == []  # integer points only, before any query
    first = acc.epsilon(1e-5)
    total = sum(1 for o in DEFAULT_ORDERS if o != math.floor(o))
    assert total >= 100
    fractional = evaluated_fractional(acc)
    assert 0 < len(fractional) <= 10
    # a fresh accountant over the same event reuses the process-wide curve: no new quadrature
    again_acc = RDPAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert again_acc.epsilon(1e-5) == first
    assert evaluated_fractional(again_acc) == fractional


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.2, 0.6), (1e-4, 3.0), (0.9, 0.8)])
def test_convexity_bound_is_below_the_log_moment(q: float, sigma: float) -> None:
    """The bound from the orders 2, 3, 4.5, 5, 6 against the log moment K(alpha) = log(A_alpha):
    the exact 50-digit binomial sum at integer orders (tests/_rdp_reference.py), and at
    fractional ones the curve that tests/test_rdp_precision.py holds to 1e-10 of mpmath."""
    points = np.array([2.0, 3.0, 4.5, 5.0, 6.0])
    known = (points - 1.0) * poisson_gaussian_rdp(q, sigma, points)
    integer_at = np.array([4.0, 7.0, 9.0, 16.0])
    bound = convex_lower_bound(points, known, integer_at)
    for alpha, value in zip(integer_at, bound):
        with mpmath.workdps(60):
            exact = mpmath.log1p(mpmath.exp(log_a_minus_one(q, sigma, float(alpha))))
        assert mpmath.mpf(float(value)) <= exact * (1 + 1e-12), (alpha, value, exact)
    fractional_at = np.array([1.05, 1.5, 2.5, 3.3, 4.9, 5.5, 8.5, 100.5])
    bound = convex_lower_bound(points, known, fractional_at)
    truth = (fractional_at - 1.0) * poisson_gaussian_rdp(q, sigma, fractional_at)
    assert np.all(bound <= truth * (1 + 1e-9))
    assert np.all(bound[2:] > 0.0)  # informative from the first point on


def test_convexity_bound_on_a_closed_form() -> None:
    """K(alpha) = alpha (alpha - 1) / (2 sigma^2) (the Gaussian): the bound is below K
    everywhere, equal to the tangent-chord values where they are exact."""
    k = lambda a: a * (a - 1.0) / 2.0  # noqa: E731
    points = np.array([2.0, 3.0, 5.0, 8.0])
    at = np.array([1.01, 1.5, 2.5, 4.0, 6.0, 7.9, 9.0, 20.0])
    bound = convex_lower_bound(points, k(points), at)
    assert np.all(bound <= k(at))
    # at 4: max(K(3), chord(2,3) extended: 3 + 2*1 = 5, chord(5,8) extended back: 10 - 6*1 = 4)
    assert bound[3] == pytest.approx(5.0)
    # right of the last point: the chord of the last two points extended, 28 + 6 * 1 = 34
    assert bound[6] == pytest.approx(34.0)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.3, 0.5), (1e-4, 20.0)])
def test_pinsker_floor_is_below_the_kl_divergence(q: float, sigma: float) -> None:
    """The floor 2 TV^2 <= KL(mu || mu_0) <= D_alpha, with the KL of the mixture
    mu = (1-q) N(0, s^2) + q N(1, s^2) from mu_0 = N(0, s^2) integrated by mpmath (30 digits)."""
    curve = rdp_module.LazyPoissonGaussianCurve(q, sigma, rdp_module.order_plan(np.array([1.5])))
    with mpmath.workdps(30):
        q_m, s_m = mpmath.mpf(q), mpmath.mpf(sigma)

        def integrand(z: mpmath.mpf) -> mpmath.mpf:
            ratio = 1 - q_m + q_m * mpmath.exp((2 * z - 1) / (2 * s_m**2))
            density = (1 - q_m) * mpmath.npdf(z, 0, s_m) + q_m * mpmath.npdf(z, 1, s_m)
            return density * mpmath.log(ratio)

        kl = mpmath.quad(integrand, [-40 * s_m, -5 * s_m, 0, 1, 5 * s_m + 1, 40 * s_m + 1])
    assert 0 < curve.floor <= kl


def test_default_grid_contains_opacus_defaults() -> None:
    assert set(OPACUS_DEFAULT_ORDERS) <= set(DEFAULT_ORDERS)
    assert list(DEFAULT_ORDERS) == sorted(set(DEFAULT_ORDERS))


@pytest.mark.parametrize(
    ("q", "sigma", "steps"),
    [(0.05, 0.6, 1_000), (0.01, 0.6, 10_000), (0.02, 0.8, 10_000), (0.03, 0.7, 5_000)],
)
def test_large_epsilon_not_looser_than_opacus(q: float, sigma: float, steps: int) -> None:
    """Epsilon 25-40: the default grid is as tight as Opacus' RDP on its own default orders
    (the former grid, quarters in (1, 8], was 0.08-2.4% looser here)."""
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant as OpacusRDP

    peer = OpacusRDP()
    peer.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = float(peer.get_epsilon(1e-5))
    ours = RDPAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps).epsilon(1e-5)
    assert ours <= theirs * (1 + 1e-9)


def test_compiled_search_refuses_malformed_terms() -> None:
    """The core writes a lazy curve's evaluations in place: it refuses values it could not
    write back (read-only, wrong dtype or length) instead of filling a temporary copy."""
    plan = rdp_module.order_plan(rdp_module.validate_orders(DEFAULT_ORDERS))
    args = (plan.points, plan.grid_at_int64, plan.orders, plan.grid_integer_uint8)
    core = rdp_module._core
    good = np.full(plan.points.size, np.nan)
    read_only = good.copy()
    read_only.flags.writeable = False
    for values in (read_only, good.astype(np.float32), good[:-1]):
        with pytest.raises(ValueError, match="values"):
            core.rdp_search_orders(*args, [(10.0, values, 0.01, 1.0, 0.0, True)], 1e-5, 1, False, 2)
    for q, sigma in ((0.0, 1.0), (0.01, -1.0), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match="lazy term"):
            core.rdp_search_orders(*args, [(10.0, good, q, sigma, 0.0, True)], 1e-5, 1, False, 2)
    known, total = core.rdp_search_orders(
        *args, [(10.0, good, 0.01, 1.0, 0.0, True)], 1e-5, 1, False, 2
    )
    # what it evaluated stayed in the caller's array, equal to a direct evaluation
    evaluated = plan.grid_at[known]
    np.testing.assert_array_equal(
        10.0 * good[evaluated], 10.0 * poisson_gaussian_rdp(0.01, 1.0, plan.points[evaluated])
    )
    np.testing.assert_array_equal(total, 10.0 * good[evaluated])
