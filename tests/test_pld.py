"""PLDAccountant: certified brackets against exact oracles, properties and bad input.

Oracles: a Gaussian mechanism with noise multiplier sigma is mu-GDP with mu = 1/sigma and its
hockey-stick curve is delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong,
Roth, Su 2019, Cor. 2.13); a composition of Gaussians is Gaussian with mu = sqrt(sum k_i /
sigma_i^2); q = 1 Poisson sampling is the plain Gaussian. Values computed here with mpmath at 50
digits.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsharp
from dpsharp import (
    Gaussian,
    Laplace,
    PLDAccountant,
    PoissonSampled,
    Repeated,
    SampledWithoutReplacement,
    UnsupportedEventError,
)

from _gaussian_reference import exact_delta, exact_epsilon_bisect

mpmath.mp.dps = 50


def exact_epsilon(delta: float, mu: float) -> float:
    return float(mpmath.findroot(lambda e: exact_delta(float(e), mu) - delta, (0.0, 200.0), solver="anderson"))


@pytest.mark.parametrize("precision", [1e-1, 1e-2, 1e-3])
@pytest.mark.parametrize("sigma,count", [(1.0, 1), (2.0, 100), (5.0, 1000), (0.7, 30)])
def test_gaussian_composition_is_bracketed(precision: float, sigma: float, count: int) -> None:
    acc = PLDAccountant(precision).compose(Gaussian(sigma), count)
    mu = math.sqrt(count) / sigma
    for delta in (1e-3, 1e-5, 1e-8):
        lower, upper = acc.epsilon_bounds(delta)
        exact = exact_epsilon_bisect(delta, mu)
        assert lower <= exact <= upper
        assert acc.epsilon(delta) >= exact
    for eps in (0.0, 0.5, 2.0, 5.0):
        lower, upper = acc.delta_bounds(eps)
        exact = exact_delta(eps, mu)
        assert lower <= exact * (1 + 1e-9) + 1e-300 and exact <= upper * (1 + 1e-9)


@pytest.mark.parametrize("precision", [1e-2, 1e-3])
def test_heterogeneous_gaussians_and_q_one_are_bracketed(precision: float) -> None:
    acc = PLDAccountant(precision)
    acc.compose(Gaussian(1.0), 3).compose(Gaussian(2.5), 10)
    acc.compose(PoissonSampled(Gaussian(1.5), 1.0), 4)
    acc.compose(Repeated(Gaussian(4.0), 7))
    mu = math.sqrt(3 / 1.0**2 + 10 / 2.5**2 + 4 / 1.5**2 + 7 / 4.0**2)
    for delta in (1e-4, 1e-6, 1e-9):
        lower, upper = acc.epsilon_bounds(delta)
        assert lower <= exact_epsilon_bisect(delta, mu) <= upper
    for eps in (0.3, 1.0, 3.0):
        lower, upper = acc.delta_bounds(eps)
        exact = exact_delta(eps, mu)
        assert lower <= exact * (1 + 1e-9) and exact <= upper * (1 + 1e-9)


def test_q_one_poisson_equals_gaussian_bracket() -> None:
    mu = math.sqrt(1000) / 10.0
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(10.0), 1.0), 1000)
    lower, upper = acc.epsilon_bounds(1e-5)
    assert lower <= exact_epsilon_bisect(1e-5, mu) <= upper


def test_pld_known_value_sigma_1_q_001_1000_steps() -> None:
    # sigma=1, q=0.01, T=1000, delta=1e-5 -> PLD/PRV ~ 1.828 (dp-accounting
    # 0.6.0 and prv-accountant 0.2.0).
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 1000)
    lower, upper = acc.epsilon_bounds(1e-5)
    assert lower <= upper <= lower * 1.001
    assert 1.826 <= lower and upper <= 1.830
    assert acc.epsilon(1e-5) == pytest.approx(1.828, abs=2e-3)


def test_laplace_pure_dp_bounds() -> None:
    # Laplace(b) is (1/b, 0)-DP, so delta(1/b) = 0 and epsilon(delta) <= 1/b; k-fold composition
    # is (k/b, 0)-DP. Single step: delta(eps) = 1 - e^{(eps - 1/b)/2} for 0 <= eps <= 1/b.
    acc = PLDAccountant(1e-3).compose(Laplace(1.0))
    for eps in (0.0, 0.25, 0.5, 0.9):
        lower, upper = acc.delta_bounds(eps)
        exact = -math.expm1((eps - 1.0) / 2.0)
        assert lower <= exact * (1 + 1e-9) and exact <= upper * (1 + 1e-9)
    assert acc.epsilon(1e-9) <= 1.0
    acc.compose(Laplace(2.0), 4)
    assert acc.delta(3.0) == 0.0  # exactly: the largest loss 1/1 + 4/2 is a grid point


def _largest_laplace_loss(scales_counts: list[tuple[float, int]]) -> Fraction:
    """M = sum_i c_i / b_i exactly, for the double scales b_i as given."""
    return sum((Fraction(count) / Fraction(scale) for scale, count in scales_counts), Fraction(0))


def _at_least(value: Fraction) -> float:
    """The smallest double >= ``value``."""
    nearest = float(value)
    return nearest if Fraction(nearest) >= value else math.nextafter(nearest, math.inf)


@pytest.mark.parametrize(
    "scales_counts",
    [[(0.5, 2), (4.0, 3)], [(2.0 / 3.0, 2), (1.0 / 3.0, 1)], [(1.0, 7)], [(8.0, 2), (0.25, 1)]],
)
def test_laplace_compositions_are_exactly_pure_dp(scales_counts: list[tuple[float, int]]) -> None:
    """sum_i c_i Laplace(b_i) is (M, 0)-DP with M = sum_i c_i / b_i, and M is its largest loss
    (closed form, in exact rationals: the double 2/3 is below 2/3, so M is above 6 there):
    delta = 0 exactly from the first double at or above M, and epsilon(delta) <= it at every
    delta, also below the FFT's round-off floor; just below M, delta(M - t) >= (1/2)^n (1 - e^-t)
    (n = sum c_i: every loss at its atom 1/b_i, which has probability 1/2 under P = Lap(1, b))."""
    acc = PLDAccountant()
    for scale, count in scales_counts:
        acc.compose(Laplace(scale), count)
    exact_largest = _largest_laplace_loss(scales_counts)
    largest = _at_least(exact_largest)
    steps = sum(count for _, count in scales_counts)
    assert acc.delta(largest) == 0.0 and acc.delta_bounds(largest)[1] == 0.0
    for delta in (1e-2, 1e-9, 1e-40):
        assert acc.epsilon(delta) <= largest
    for below in (math.nextafter(largest, 0.0), largest - 0.01):
        if Fraction(below) < exact_largest:
            gap = exact_largest - Fraction(below)
            with mpmath.workdps(40):
                shortfall = mpmath.mpf(gap.numerator) / gap.denominator
                atoms = mpmath.mpf(0.5) ** steps * -mpmath.expm1(-shortfall)
            assert acc.delta(below) >= atoms > 0


@pytest.mark.parametrize("scale", [4.0 / 3.0, 1.0 / 0.3, 1.0 / 0.7, 10.0 / 3.0])
def test_laplace_largest_loss_is_not_rounded_down(scale: float) -> None:
    """1/b in double precision is rounded to the nearest double; for b = 4/3 that is 0.75,
    below the true 1/b (the double 4/3 is below 4/3). delta at that rounded value is the atom's
    1/2 (1 - e^{0.75 - 1/b}) > 0 (closed form, mpmath); it read 0 while the core took 1/b to
    the nearest double."""
    nearest = 1.0 / scale
    exact = 1 / Fraction(scale)
    acc = PLDAccountant().compose(Laplace(scale))
    assert acc.delta(_at_least(exact)) == 0.0
    if Fraction(nearest) < exact:
        gap = exact - Fraction(nearest)
        with mpmath.workdps(40):
            atom = -mpmath.expm1(-mpmath.mpf(gap.numerator) / gap.denominator) / 2
        assert acc.delta(nearest) >= atom > 0


@pytest.mark.parametrize(("q", "steps"), [(1e-8, 10**8), (1e-3, 7), (0.5, 3), (1 - 1e-9, 2)])
def test_add_direction_loss_is_bounded_by_minus_steps_log_one_minus_q(q: float, steps: int) -> None:
    """Under Poisson sampling the add pair's loss L(x) = -log(1 - q + q e^{mu x - mu^2/2}) is
    below -log(1 - q) at every x, so T releases never exceed -T log(1 - q) (mpmath, 40 digits):
    the bound the accountant applies to that direction sits at or above it, within a few ulps;
    the remove direction's loss is unbounded."""
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(0.5), q), steps)
    with mpmath.workdps(40):
        exact = -steps * mpmath.log1p(-mpmath.mpf(q))
    bound = acc._largest_loss("add")
    assert exact <= bound <= exact * (1 + 1e-14)
    assert acc._largest_loss("remove") == math.inf


@pytest.mark.slow
def test_tiny_rate_long_run_is_bounded_by_the_add_directions_largest_loss() -> None:
    """q = 1e-8, sigma = 0.5, 10^8 steps: the add direction's FFT composition is void at delta
    1e-5 (its proven round-off bound, 2.3e-5, is above it), and the answer fell back on the
    grid's support, 10^8 steps of 2^-20 = 95.37, where the mechanism's loss never exceeds
    -T log(1 - q) = 1.000000005 in that direction. The RDP accountant's bound (1.05) is an
    independent upper bound that the tight one must not exceed."""
    event = PoissonSampled(Gaussian(0.5), 1e-8)
    acc = PLDAccountant().compose(event, 10**8)
    epsilon = acc.epsilon(1e-5)
    with mpmath.workdps(40):
        largest = -(10**8) * mpmath.log1p(-mpmath.mpf(1e-8))
    assert epsilon <= largest * (1 + 1e-14)
    assert epsilon <= dpsharp.RDPAccountant().compose(event, 10**8).epsilon(1e-5)
    assert acc.delta(epsilon) <= 1e-5


def test_reciprocal_rounded_up_against_exact_rationals() -> None:
    """The core's 1/x rounded up is the smallest double at or above the rational 1/x."""
    from dpsharp._native import core

    rng = np.random.default_rng(7)
    values = np.concatenate([rng.uniform(0.01, 100.0, 2000), 10.0 ** rng.uniform(-300, 300, 2000),
                             [1.0, 0.5, 3.0, 4.0 / 3.0, 0.1, 5e-324, 1e308]])
    for x in values:
        got = core.reciprocal_rounded_up(float(x))
        if x < 1 / 1.7976931348623157e308:  # 1/x overflows
            assert got == math.inf
        else:
            assert got == _at_least(1 / Fraction(float(x)))


def test_laplace_scale_off_the_binary_grid_stays_sound() -> None:
    """1/b = 1/3 is no multiple of a binary grid step: the largest grid loss is above 1/3 by
    less than a step, delta there is still exactly 0, and just below the true largest loss 1
    the certified delta stays above the atoms' closed-form mass."""
    acc = PLDAccountant().compose(Laplace(3.0), 3)
    step = acc._grid_step()
    assert 0.0 <= acc.epsilon(1e-12) <= 1.0 + 3 * step
    assert acc.delta(1.0 + 3 * step) == 0.0
    assert acc.delta(1.0 - 0.01) >= 0.5**3 * -math.expm1(-0.01)


def test_directions_and_symmetrised_tradeoff() -> None:
    acc = PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(1.0), 0.1), 50)
    alphas = np.linspace(0.0, 1.0, 201)
    f = acc.tradeoff(alphas)
    f_sym = acc.tradeoff(alphas, symmetrised=True)
    assert np.all(f_sym <= f + 1e-12)
    assert np.all(np.diff(f) <= 1e-12) and np.all(f <= 1 - alphas + 1e-12)
    # The curve must lie above the GDP curve of the unsubsampled composition (subsampling helps)
    # and below the identity; and its certified delta agrees with the accountant's.
    mu_full = math.sqrt(50) / 1.0
    g = mpmath_gaussian_tradeoff(alphas[1:-1], mu_full)
    assert np.all(f[1:-1] >= g - 1e-9)


def _exact_subsampled_gaussian_tradeoffs(alpha: float, q: float, mu: float) -> tuple[float, float]:
    """(T(P, Q)(alpha), T(Q, P)(alpha)) of one Poisson-subsampled Gaussian release, P = (1 - q)
    N(0, 1) + q N(mu, 1) (with the record), Q = N(0, 1) (without): P / Q increases in x, so
    the Neyman-Pearson tests are half-lines (Dong, Roth, Su 2019, Section 2)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def mixture_cdf(t: float) -> float:
        return (1 - q) * norm.cdf(t) + q * norm.cdf(t - mu)

    # T(P, Q): reject P where x is small; alpha = P(x < t), beta = Q(x >= t)
    t = brentq(lambda t: mixture_cdf(t) - alpha, -60.0, 60.0, xtol=1e-14)
    p_against_q = float(norm.sf(t))
    # T(Q, P): reject Q where x is large; alpha = Q(x > t), beta = P(x <= t)
    q_against_p = float(mixture_cdf(norm.isf(alpha)))
    return p_against_q, q_against_p


def test_tradeoff_is_a_bound_for_both_orders_of_the_neighbouring_pair() -> None:
    """f-DP holds for both orders of a neighbouring pair: under add/remove the certified curve
    of one Poisson-subsampled Gaussian step must lie below min(T(P, Q), T(Q, P)), computed in
    closed form. One direction's curve alone lies above it (0.4046 against 0.3859 at alpha =
    0.5), so the default is the symmetrised curve; it stays tight at small alpha, where the
    add direction's curve ends (its loss stops at -log(1 - q)) and the remove direction's
    large epsilons decide."""
    q, sigma = 0.2, 0.5
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q))
    alphas = np.array([1e-6, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9])
    curve = acc.tradeoff(alphas)
    assert np.array_equal(curve, acc.tradeoff(alphas, symmetrised=True))
    exact = np.array([min(_exact_subsampled_gaussian_tradeoffs(a, q, 1 / sigma)) for a in alphas])
    assert np.all(curve <= exact + 1e-12)
    assert np.all(curve[:6] >= exact[:6] - 2e-3)  # tight where the minimum is convex
    one_direction = acc.tradeoff(alphas, symmetrised=False)
    assert np.any(one_direction > exact + 1e-3)


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.5, 0.5, 1), (0.9, 0.3, 1), (0.2, 0.8, 10), (0.01, 1.0, 1000)])
def test_epsilon_covers_both_directions(q: float, sigma: float, steps: int) -> None:
    """epsilon() composes the add direction only on a coarse grid when that already shows it is
    dominated; the answer must still bound the add direction's own fine-grid upper bound."""
    from dpsharp.accountants.pld import _tail_for

    acc = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
    for delta in (0.2, 1e-2, 1e-5):
        tail = _tail_for(delta, 1e-3)
        for direction in ("remove", "add"):
            composed = acc._composed(direction, True, acc._grid_step(0), tail)
            assert acc.epsilon(delta) >= composed.epsilon(delta, pessimistic=True)
        assert acc.delta(1.0) >= acc._composed("add", True, acc._grid_step(0), 1e-12).delta(1.0, pessimistic=True)


def mpmath_gaussian_tradeoff(alphas: np.ndarray, mu: float) -> np.ndarray:
    return np.array([float(mpmath.ncdf(mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * a) - mu)) for a in alphas])


def test_gaussian_tradeoff_below_exact_and_gdp_mu() -> None:
    sigma, count = 2.0, 16
    mu = math.sqrt(count) / sigma
    acc = PLDAccountant(1e-3).compose(Gaussian(sigma), count)
    alphas = np.array([1e-6, 1e-3, 0.01, 0.1, 0.3, 0.5, 0.9])
    f = acc.tradeoff(alphas)
    exact = mpmath_gaussian_tradeoff(alphas, mu)
    assert np.all(f <= exact + 1e-12)
    assert np.all(f >= exact - 5e-3)
    assert acc.gdp_mu() == pytest.approx(mu, rel=1e-9)
    # Subsampling never needs a larger mu than the full Gaussian composition.
    sub = PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(sigma), 0.1), count)
    assert sub.gdp_mu() <= mu * (1 + 1e-9)


def test_subsampled_gdp_mu_cannot_be_improved() -> None:
    """gdp_mu() of a Poisson-subsampled composition is the full Gaussian mu_0 = sqrt(T)/sigma,
    and that is optimal: independently of the accountant, delta(eps) >= q^T delta_{mu_0}(eps +
    T log(1/q)) (the all-sampled component of P), which exceeds delta_mu(eps) at a large eps for
    every mu < mu_0 (evaluated in log space with mpmath)."""
    sigma, q, steps = 1.0, 0.1, 4
    mu0 = math.sqrt(steps) / sigma
    acc = PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert acc.gdp_mu() == pytest.approx(mu0, rel=1e-12)
    mpmath.mp.dps = 60

    def log_gaussian_delta(eps: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
        return mpmath.log(mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2))

    shift = steps * mpmath.log(1 / mpmath.mpf(q))
    for fraction, eps in [(0.9, 1000), (0.99, 5000)]:
        mu = mpmath.mpf(fraction) * mu0
        eps = mpmath.mpf(eps)
        lower_bound = steps * mpmath.log(q) + log_gaussian_delta(eps + shift, mpmath.mpf(mu0))
        assert lower_bound > log_gaussian_delta(eps, mu)
        # ... while at moderate eps the subsampled composition is far below delta_mu.
        assert acc.delta(2.0) < math.exp(float(log_gaussian_delta(mpmath.mpf(2), mu)))


def test_guarantee_carries_lower_bound() -> None:
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 200)
    g = acc.guarantee(1e-5)
    assert g.certified and g.accountant == "pld"
    assert g.epsilon_lower is not None and g.epsilon_lower <= g.epsilon
    assert g.epsilon == pytest.approx(acc.epsilon_bounds(1e-5)[1])


def test_registry_and_exports() -> None:
    assert "pld" in dpsharp.available()
    assert isinstance(dpsharp.accountant("pld"), PLDAccountant)
    assert dpsharp.PLDAccountant is PLDAccountant


def test_optimistic_never_exceeds_pessimistic_and_refinement() -> None:
    acc = PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(0.9), 0.05), 300)
    for delta in (1e-3, 1e-5, 1e-7):
        lower, upper = acc.epsilon_bounds(delta)
        assert lower <= upper
    coarse = PLDAccountant(1e-1).compose(PoissonSampled(Gaussian(0.9), 0.05), 300)
    fine = PLDAccountant(1e-3).compose(PoissonSampled(Gaussian(0.9), 0.05), 300)
    lo_f, up_f = fine.epsilon_bounds(1e-5)
    lo_c, up_c = coarse.epsilon_bounds(1e-5)
    # Both brackets are certified, so they overlap, and refining never raises the upper bound
    # beyond the coarse tolerance.
    assert lo_c <= up_f and lo_f <= up_c
    assert up_f <= up_c * (1 + 1e-3)
    assert up_f - lo_f <= 1e-3 * up_f


def test_epsilon_delta_inverse() -> None:
    acc = PLDAccountant(1e-3).compose(PoissonSampled(Gaussian(1.2), 0.02), 500)
    for delta in (1e-3, 1e-5, 1e-8):
        eps = acc.epsilon(delta)
        assert acc.delta(eps) <= delta * (1 + 1e-6)
        assert acc.delta(eps * 0.99) > delta


@settings(max_examples=12, deadline=None)
@given(
    sigma=st.floats(0.6, 4.0),
    q=st.floats(0.001, 0.3),
    steps=st.integers(1, 400),
)
def test_monotone_in_steps_q_sigma(sigma: float, q: float, steps: int) -> None:
    def eps(s: float, qq: float, t: int) -> tuple[float, float]:
        return PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(s), qq), t).epsilon_bounds(1e-5)

    base_lo, base_up = eps(sigma, q, steps)
    for other in (eps(sigma, q, steps + 50), eps(sigma, min(1.0, q * 1.5), steps), eps(sigma / 1.3, q, steps)):
        # More steps, larger q, smaller sigma: the certified upper of the larger composition
        # is never below the certified lower of the smaller one.
        assert other[1] >= base_lo
        assert other[1] >= base_up * (1 - 2e-2)


def test_sampled_without_replacement_replace_one() -> None:
    acc = PLDAccountant(1e-2, neighbouring="replace_one")
    acc.compose(SampledWithoutReplacement(Gaussian(1.0), 100, 10_000), 1000)
    lower, upper = acc.epsilon_bounds(1e-5)
    assert 0 < lower <= upper
    # Symmetrised pair dominates both Poisson directions at the same rate.
    pois = PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(1.0), 0.01), 1000)
    p_lo, p_up = pois.epsilon_bounds(1e-5)
    assert upper >= p_lo
    # Full-batch sampling is the Gaussian.
    full = PLDAccountant(1e-3, neighbouring="replace_one").compose(
        SampledWithoutReplacement(Gaussian(2.0), 50, 50), 25
    )
    lo, up = full.epsilon_bounds(1e-5)
    assert lo <= exact_epsilon_bisect(1e-5, 5 / 2.0) <= up


def test_incremental_queries_match_fresh() -> None:
    event = PoissonSampled(Gaussian(1.0), 0.01)
    acc = PLDAccountant()
    values = []
    for _ in range(64):
        acc.compose(event)
        values.append(acc.epsilon(1e-5))
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:]))
    fresh = PLDAccountant().compose(event, 64)
    assert values[-1] == pytest.approx(fresh.epsilon(1e-5), rel=1e-9)


def test_state_dict_roundtrip() -> None:
    acc = PLDAccountant(1e-2).compose(PoissonSampled(Gaussian(1.0), 0.01), 100)
    other = PLDAccountant(1e-2)
    other.load_state_dict(acc.state_dict())
    assert other.epsilon(1e-5) == pytest.approx(acc.epsilon(1e-5), rel=1e-12)


@pytest.mark.parametrize("precision", [0.0, 1.0, -0.1, 2.0, float("nan"), float("inf")])
def test_bad_precision(precision: float) -> None:
    with pytest.raises(ValueError, match="precision"):
        PLDAccountant(precision)


def test_bad_queries_and_events() -> None:
    acc = PLDAccountant().compose(Gaussian(1.0), 10)
    for delta in (0.0, 1.0, -1e-5, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            acc.epsilon(delta)
        with pytest.raises(ValueError, match="delta"):
            acc.epsilon_bounds(delta)
    for eps in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="epsilon"):
            acc.delta(eps)
        with pytest.raises(ValueError, match="epsilon"):
            acc.delta_bounds(eps)
    with pytest.raises(ValueError, match="alphas"):
        acc.tradeoff([0.5, 1.5])
    with pytest.raises(UnsupportedEventError):
        # Poisson sampling is analysed for an inner Gaussian or Laplace mechanism only
        acc.compose(PoissonSampled(Repeated(Gaussian(1.0), 2), 0.1))
    with pytest.raises(UnsupportedEventError):
        acc.compose(SampledWithoutReplacement(Gaussian(1.0), 10, 100))  # needs replace_one
    with pytest.raises(TypeError):
        PLDAccountant("0.1")  # type: ignore[arg-type]


def test_unreachable_delta_is_refused_not_underestimated() -> None:
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 1000)
    with pytest.raises(ValueError, match="delta"):
        acc.epsilon(1e-18)
    # A small but reachable delta gives a finite bound above the exact Gaussian-free lower bound.
    lower, upper = acc.epsilon_bounds(1e-10)
    assert lower <= upper and math.isfinite(upper)


def test_empty_accountant() -> None:
    acc = PLDAccountant()
    assert acc.epsilon(1e-5) == 0.0 and acc.epsilon_bounds(1e-5) == (0.0, 0.0)
    assert acc.delta_bounds(1.0) == (0.0, 0.0)


def test_many_distinct_sigmas_are_quantised_soundly() -> None:
    # More than 512 distinct events: sigmas are rounded to a geometric grid (down for the upper
    # bound, up for the lower), which must still bracket the exact Gaussian composition.
    sigmas = np.linspace(2.0, 6.0, 600)
    acc = PLDAccountant(1e-2)
    for sigma in sigmas:
        acc.compose(Gaussian(float(sigma)), 2)
    mu = math.sqrt(float(np.sum(2.0 / sigmas**2)))
    lower, upper = acc.epsilon_bounds(1e-5)
    assert lower <= exact_epsilon_bisect(1e-5, mu) <= upper
    assert upper - lower <= 2e-2 * upper


# ---------------------------------------------------------------- answers depend on the multiset only
def _history_answers(events: list[tuple[object, int]], query_every: bool) -> tuple[float, float]:
    acc = PLDAccountant()
    for event, count in events:
        acc.compose(event, count)
        if query_every:
            acc.epsilon(1e-5)
            acc.delta(1.0)
    return acc.epsilon(1e-5), acc.delta(1.0)


@pytest.mark.parametrize(
    "chunks",
    [
        [(PoissonSampled(Gaussian(1.1), 0.01), 100), (PoissonSampled(Gaussian(1.1), 0.01), 600)],
        [(PoissonSampled(Gaussian(0.9), 0.02), 30), (Gaussian(5.0), 3), (PoissonSampled(Gaussian(1.3), 0.05), 200)],
    ],
)
def test_answers_are_a_function_of_the_multiset(chunks: list[tuple[object, int]]) -> None:
    """Base-class contract (accountants/base.py): incremental runs with queries in between,
    all-at-once composition in another order, and a restored checkpoint give bit-for-bit the
    same answers (issue: compose 100, query, compose 600 differed from compose 700)."""
    incremental = _history_answers(chunks, query_every=True)
    at_once = _history_answers(list(reversed(chunks)), query_every=False)
    assert incremental == at_once
    acc = PLDAccountant()
    for event, count in chunks:
        acc.compose(event, count)
        acc.epsilon(1e-5)
    restored = PLDAccountant()
    restored.load_state_dict(acc.state_dict())
    assert (restored.epsilon(1e-5), restored.delta(1.0)) == incremental
    assert acc.epsilon_bounds(1e-5) == restored.epsilon_bounds(1e-5)


@pytest.mark.parametrize("event", [Gaussian(0.01), PoissonSampled(Gaussian(0.01), 0.01)])
def test_extreme_sigma_is_finite_without_warnings(event: object) -> None:
    """sigma = 0.01 used to raise an invalid-divide RuntimeWarning (an error under the test
    configuration) from a ratio of underflowing exponentials; the upper bound must still bracket
    the exact Gaussian value (mu = 100 for the plain Gaussian)."""
    acc = PLDAccountant().compose(event, 1)
    upper = acc.epsilon(1e-5)
    assert math.isfinite(upper) and upper > 0.0
    assert acc.delta(upper) <= 1e-5 * (1 + 1e-9)
    if isinstance(event, Gaussian):
        # delta(eps; mu) decreases in eps, so exact epsilon <= upper iff exact delta(upper) <= 1e-5.
        assert exact_delta(upper, 100.0) <= 1e-5


def _heterogeneous_epsilon(_: object = None) -> float:
    acc = PLDAccountant()
    for sigma in np.linspace(0.8, 1.6, 80):
        acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.01), 5)
    return acc.epsilon(1e-5)


def test_heterogeneous_query_works_in_a_forked_child() -> None:
    """The per-leaf thread pool must not deadlock a child forked after it was started (e.g. a
    multiprocessing sweep with the default fork start method on Linux)."""
    import multiprocessing

    expected = _heterogeneous_epsilon()  # starts the pool in this process
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        result = pool.apply_async(_heterogeneous_epsilon, (None,))
        assert result.get(timeout=120) == pytest.approx(expected, rel=1e-12)


def _mpmath_log_mgf(mass: np.ndarray, offset: int, grid_step: float, t: float) -> float:
    total = mpmath.fsum(
        mpmath.mpf(float(m)) * mpmath.exp(t * (offset + k) * mpmath.mpf(grid_step))
        for k, m in enumerate(mass)
        if m > 0
    )
    return float(mpmath.log(total)) if total > 0 else -math.inf


@pytest.mark.parametrize(
    "mass",
    [
        np.concatenate((np.zeros(440), [0.25, 0.5, 0.25])),  # nothing near the bottom
        np.concatenate(([1e-300], np.zeros(500), [0.5, 0.5])),  # a tiny mass at the bottom
        np.concatenate(([0.5, 0.5], np.zeros(500), [1e-300])),  # and at the top
        np.full(300, 1.0 / 300),
        np.zeros(10),
    ],
)
def test_log_mgf_is_exact_whatever_sits_at_the_ends(mass: np.ndarray) -> None:
    """The Chernoff window rests on exact log-MGFs of the discretised PLDs: a walk that stopped
    when its factor got small (not small relative to the sum) returned -inf or a far too small
    value when the masses at the anchoring end were 0 or tiny, as the optimistic rounding of a
    wide subsampled Gaussian produces."""
    from dpsharp.accountants._pld_numerics import DiscretePLD, chernoff_exponents

    pld = DiscretePLD(offset=-439, mass=mass, infinity_mass=0.0, grid_step=0.0625)
    exponents = chernoff_exponents()
    ours = pld.log_mgf(exponents)
    expected = [_mpmath_log_mgf(mass, -439, 0.0625, float(t)) for t in exponents]
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-12)


def test_wide_heterogeneous_bounds_are_finite() -> None:
    """100 distinct sigmas from 0.1 to 10 at q = 0.3 (found crashing with an OverflowError in
    epsilon_bounds: the optimistic PLD's log-MGF was -inf)."""
    acc = PLDAccountant()
    for sigma in np.geomspace(0.1, 10.0, 100):
        acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.3), 3)
    lower, upper = acc.epsilon_bounds(1e-5)
    assert 0.0 < lower <= upper == acc.epsilon(1e-5)
    assert math.isfinite(upper)


def test_tradeoff_is_finite_when_the_loss_grid_passes_exp_overflow() -> None:
    """A composition whose losses exceed 709 (e^eps overflows): the certified trade-off curve
    at alpha = 0 was NaN (inf * 0). For mu = 50 the exact curve is G_mu(alpha) =
    Phi(Phi^-1(1 - alpha) - mu): 1 at alpha = 0 and below 1e-300 elsewhere on this grid."""
    import warnings

    acc = PLDAccountant().compose(Gaussian(0.02), 1)
    alphas = np.array([0.0, 1e-12, 0.5, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = acc.tradeoff(alphas)
    assert np.all(np.isfinite(f))
    assert 0.99 <= f[0] <= 1.0
    assert np.all(f[1:] <= 1e-9) and np.all(f >= 0.0)


def test_epsilon_bounds_upper_never_above_epsilon() -> None:
    """epsilon_bounds refines the grid and keeps the tightest certified bounds: its upper end is
    at most epsilon() (which uses the precision's own grid) and at least its lower end."""
    acc = PLDAccountant(1e-2)
    acc.compose(PoissonSampled(Gaussian(0.6), 0.05), 300).compose(Gaussian(5.0), 20)
    for delta in (1e-3, 1e-6):
        lower, upper = acc.epsilon_bounds(delta)
        assert lower <= upper <= acc.epsilon(delta)
        assert upper - lower <= 1e-2 * upper


def test_epsilon_bounds_stops_refining_where_a_halving_closes_little(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At a precision the lower bound cannot reach (its cells' round-off allowance holds the
    bracket), each halving of the grid doubles the cost for no digit: refinement stops at the
    first halving that closes less than a quarter of the bracket, and the bracket returned is
    the tightest one found (every grid's lower bound is certified)."""
    acc = PLDAccountant(3e-7).compose(PoissonSampled(Gaussian(2.0), 0.05), 100)
    found: list[tuple[int, float]] = []
    original = PLDAccountant._epsilon_side

    def recording(self: PLDAccountant, delta: float, *, pessimistic: bool,
                  refinement: int) -> float:
        value = original(self, delta, pessimistic=pessimistic, refinement=refinement)
        if not pessimistic:
            found.append((refinement, value))
        return value

    monkeypatch.setattr(PLDAccountant, "_epsilon_side", recording)
    lower, upper = acc.epsilon_bounds(1e-6)
    assert [refinement for refinement, _ in found] == list(range(len(found)))
    assert 2 <= len(found) <= 4
    gaps = [upper - max(value for _, value in found[: k + 1]) for k in range(len(found))]
    assert all(after <= 0.75 * before for before, after in zip(gaps[:-2], gaps[1:-1]))
    assert gaps[-1] > 0.75 * gaps[-2]
    assert lower == max(value for _, value in found) and lower <= upper


_mechanism_events = st.one_of(
    st.builds(Laplace, st.floats(1.0, 20.0)),
    st.builds(Gaussian, st.floats(1.0, 100.0)),
    st.builds(
        PoissonSampled,
        st.builds(Gaussian, st.floats(0.2, 20.0)),
        st.floats(1e-4, 1.0),
    ),
)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(
    precision=st.sampled_from([1e-2, 1e-3]),
    parts=st.lists(st.tuples(_mechanism_events, st.sampled_from([1, 3, 100, 1000])), min_size=1, max_size=6),
    extra_sigmas=st.sampled_from([0, 70, 600]),
)
def test_random_compositions_keep_every_contract(
    precision: float, parts: list[tuple[object, int]], extra_sigmas: int
) -> None:
    """Random mixtures (Laplace, Gaussian, Poisson-subsampled Gaussian; with 70 extra distinct
    sigmas the two-level composition, with 600 also the sigma rounding): bounds ordered, epsilon
    and delta inverse, trade-off curve finite, no numpy warnings. A sweep like this found the -inf log-MGF and the NaN trade-off."""
    import warnings

    acc = PLDAccountant(precision)
    for event, count in parts:
        acc.compose(event, count)  # type: ignore[arg-type]
    for sigma in np.linspace(0.5, 3.0, extra_sigmas):
        acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.01), 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for delta in (1e-3, 1e-7):
            lower, upper = acc.epsilon_bounds(delta)
            epsilon = acc.epsilon(delta)
            assert 0.0 <= lower <= upper <= epsilon * (1 + 1e-12)
            if math.isfinite(epsilon) and epsilon < 500:
                assert acc.delta(epsilon) <= delta * (1 + 1e-6) + 1e-15
                delta_lower, delta_upper = acc.delta_bounds(epsilon)
                assert delta_lower <= delta_upper
        curve = acc.tradeoff(np.linspace(0.0, 1.0, 11))
        assert np.all(np.isfinite(curve))
        assert np.all(curve <= 1.0 - np.linspace(0.0, 1.0, 11) + 1e-12)


# ---------------------------------------------------------------- many distinct events (two-level composition)
@pytest.mark.parametrize(
    ("mechanism", "rate", "sigmas"),
    [
        (2, 0.01, np.linspace(0.6, 2.0, 40)),  # Poisson remove
        (3, 0.05, np.linspace(0.6, 2.0, 40)),  # Poisson add
        (0, 1.0, np.linspace(0.8, 4.0, 20)),  # Gaussian
        (2, 0.5, [0.02, 0.05, 1.0]),  # tiny sigmas: the log-space discretisation path
    ],
)
@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize(("step", "threads"), [pytest.param(2.0**-10, 1, marks=pytest.mark.slow),
                                               (2.0**-10, 2),
                                               pytest.param(2.0**-13, 3, marks=pytest.mark.slow)])
def test_batched_discretisation_is_bit_identical(
    mechanism: int, rate: float, sigmas: object, pessimistic: bool, step: float, threads: int
) -> None:
    """The batched discretiser shares the sigma-independent work across noise multipliers and
    splits the grid points over ``threads``; it must give exactly what the one-at-a-time,
    one-thread discretiser gives (the grids here hold 2^14 to 2^18 points, so every thread takes
    part)."""
    from dpsharp._native import core

    sigmas = [float(s) for s in sigmas]  # type: ignore[union-attr]
    if step < 2.0**-10:
        sigmas = sigmas[::8]
    tail = 1e-15
    batched = core.pld_discretize_many(
        mechanism, sigmas, rate, step, tail, tail, pessimistic, threads
    )
    assert len(batched) == len(sigmas)
    for sigma, (offset, mass, infinity) in zip(sigmas, batched):
        single = core.pld_discretize(mechanism, sigma, rate, step, tail, tail, pessimistic)
        assert offset == single[0] and infinity == single[2]
        np.testing.assert_array_equal(mass, single[1])


def test_batched_discretisation_rejects_no_threads() -> None:
    from dpsharp._native import core

    with pytest.raises(ValueError, match="threads"):
        core.pld_discretize_many(2, [1.0], 0.01, 2.0**-10, 1e-15, 1e-15, True, 0)


def _flat_composition(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsharp.accountants import _pld_numerics

    monkeypatch.setattr(_pld_numerics, "_TWO_LEVEL_FROM", 10**9)


@pytest.mark.parametrize("precision", [1e-2, 1e-3])
@pytest.mark.parametrize(("count", "gap"), [(300, 1.0), pytest.param(2000, 2.0, marks=pytest.mark.slow)])
def test_two_level_composition_brackets_exact_gaussians(precision: float, count: int, gap: float) -> None:
    """300 or 2,000 distinct Gaussians (well over the 64 that switch to the two-level
    composition): the certified bracket holds the exact Gaussian composition at several deltas.
    Up to 512 distinct events nothing is rounded and the bracket meets the precision; beyond, the
    noise multipliers are rounded (down for the upper bound, up for the lower) and the bracket
    may be up to twice as wide."""
    sigmas = np.linspace(3.0, 12.0, count)
    repeats = 1 + np.arange(count) % 3
    acc = PLDAccountant(precision)
    for sigma, repeat in zip(sigmas, repeats):
        acc.compose(Gaussian(float(sigma)), int(repeat))
    mu = math.sqrt(float(np.sum(repeats / sigmas**2)))
    for delta in (1e-3, 1e-6, 1e-10):
        lower, upper = acc.epsilon_bounds(delta)
        exact = exact_epsilon_bisect(delta, mu)
        assert lower <= exact <= upper <= acc.epsilon(delta) * (1 + 1e-12)
        assert upper - lower <= gap * precision * upper
        delta_lower, delta_upper = acc.delta_bounds(exact)
        assert delta_lower <= delta * (1 + 1e-9) and delta_upper >= delta * (1 - 1e-9)


@pytest.mark.slow
def test_two_level_composition_agrees_with_the_flat_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-level composition of 1,000 distinct Poisson-subsampled Gaussians against the same
    discretised PLDs composed in one level: both are certified bounds of the same discretised
    composition, so they may differ only by the first level's tail slack and round-off, and each
    side's bound must stay on its side of the other method's opposite bound."""
    sigmas = np.linspace(0.7, 2.0, 1000)

    def bounds() -> tuple[float, float, float]:
        acc = PLDAccountant()
        for sigma in sigmas:
            acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.02))
        lower, upper = acc.epsilon_bounds(1e-6)
        return lower, upper, acc.delta(1.0)

    two_level = bounds()
    _flat_composition(monkeypatch)
    flat = bounds()
    assert two_level[0] <= flat[1] and flat[0] <= two_level[1]
    # The slack (~1e-12 in delta, the tail budget) moves epsilon by ~1e-7 at delta = 1e-6, and
    # the first level's round-off bound (moved whole to each group's top point) by ~9e-7: its
    # leaves are transformed one at a time (a pair's bound, on the complex moduli of a + i b, is
    # about sqrt(2) times a single transform's and is used on the queried level only).
    for ours, reference in zip(two_level, flat):
        assert ours == pytest.approx(reference, rel=1e-6)


def test_composed_pld_excess_lowers_only_the_optimistic_side() -> None:
    """A first-level composition leaves aliased mass (non-negative, at most above + below) in its
    window: the optimistic bound must subtract the excess it can cause, the pessimistic one keeps
    it (it only adds to delta)."""
    from dpsharp.accountants._pld_numerics import ComposedPLD

    mass = np.array([0.2, 0.3, 0.5])
    plain = ComposedPLD(start=0, dense=mass, infinity_mass=0.0, above=0.0, below=0.0, grid_step=0.5)
    slack = ComposedPLD(start=0, dense=mass, infinity_mass=0.0, above=0.0, below=0.0, grid_step=0.5, excess=1e-3)
    assert slack.delta(0.2, pessimistic=True) == plain.delta(0.2, pessimistic=True)
    assert slack.delta(0.2, pessimistic=False) == pytest.approx(plain.delta(0.2, pessimistic=False) - 1e-3, abs=1e-15)


@pytest.mark.parametrize("group_tail", [pytest.param(0.3, marks=pytest.mark.slow),
                                        pytest.param(1e-1, marks=pytest.mark.slow),
                                        pytest.param(1e-2, marks=pytest.mark.slow), 1e-3, None])
@pytest.mark.parametrize("mechanism", [0, 2])
def test_two_level_bookkeeping_keeps_each_side(group_tail: float | None, mechanism: int) -> None:
    """The two-level composition of 100 distinct PLDs with coarse first-level windows (tail up to
    0.3: the groups' out-of-window masses, which the pessimistic side moves to the window's bottom
    or to +inf and the optimistic side subtracts as excess, are then large enough that dropping
    any of them moves delta across the reference) brackets the reference at every eps on a grid;
    None is the default group window. Gaussian PLDs (mechanism 0) against the exact Gaussian
    composition; Poisson-subsampled ones (mechanism 2, q = 0.2) against a one-level composition
    of the same PLDs at a 1e-30 truncation. (Mutation check: without the +inf move or without the
    optimistic excess this test fails; without the move of the below-window mass it still
    passes, that mass's effect hiding under the Chernoff bounds' slack.)"""
    from dpsharp._native import core
    from dpsharp.accountants._pld_numerics import (
        DiscretePLD,
        _compose_by_products,
        _compose_two_level,
    )

    sigmas = np.linspace(3.0, 12.0, 100) if mechanism == 0 else np.linspace(0.8, 2.0, 100)
    rate = 1.0 if mechanism == 0 else 0.2
    step = 2.0**-11
    mu = math.sqrt(float(np.sum(1.0 / sigmas**2)))
    group_log_tail = None if group_tail is None else math.log(group_tail)
    for pessimistic in (True, False):
        plds = []
        for sigma in sigmas:
            offset, mass, infinity = core.pld_discretize(mechanism, float(sigma), rate, step, 1e-15, 1e-15, pessimistic)
            plds.append(DiscretePLD(offset, mass, infinity, step))
        result = _compose_two_level(
            plds, [1] * len(plds), log_tail=math.log(1e-14), pessimistic=pessimistic,
            group_log_tail=group_log_tail,
        )
        assert result.excess == 0.0 or not pessimistic
        reference = _compose_by_products(plds, [1] * len(plds), math.log(1e-30), parallel=False)
        for eps in (0.0, 0.3, 0.8, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0):
            bound = result.delta(eps, pessimistic=pessimistic)
            if mechanism == 0:
                exact = exact_delta(eps, mu)
            else:
                # The reference's own certified bound on the other side (each side carries its
                # proven round-off bound).
                exact = reference.delta(eps, pessimistic=not pessimistic)
            assert (bound >= exact) if pessimistic else (bound <= exact), (pessimistic, eps, bound, exact)
            if group_tail is None:
                assert bound == pytest.approx(exact, rel=1e-3, abs=1e-9)


def _mpmath_gaussian_family_delta(mechanism: int, sigma: float, rate: float, eps: float) -> float:
    """delta(eps) = P(L > eps) - e^eps Q(L > eps) of the Gaussian-family pairs, with mu = 1/sigma:
    0 Gaussian (q = 1) and 2 remove, P = (1-q) N(0,1) + q N(mu,1), Q = N(0,1), where {L > eps} =
    {x > x_eps}, x_eps = (log((e^eps - (1-q)) / q) + mu^2/2) / mu; 3 add, the reverse pair, where
    {L > eps} = {x < x'}, x' = (log((e^-eps - (1-q)) / q) + mu^2/2) / mu (empty when e^-eps <= 1-q)."""
    mu, q, e = mpmath.mpf(1) / sigma, mpmath.mpf(rate), mpmath.mpf(eps)

    def above(x: mpmath.mpf) -> mpmath.mpf:
        return 1 - mpmath.ncdf(x)

    if mechanism in (0, 2):
        x = (mpmath.log((mpmath.exp(e) - (1 - q)) / q) + mu**2 / 2) / mu
        p_tail = (1 - q) * above(x) + q * above(x - mu)
        return float(p_tail - mpmath.exp(e) * above(x))
    assert mechanism == 3
    if mpmath.exp(-e) <= 1 - q:
        return 0.0
    x = (mpmath.log((mpmath.exp(-e) - (1 - q)) / q) + mu**2 / 2) / mu
    q_tail = (1 - q) * mpmath.ncdf(x) + q * mpmath.ncdf(x - mu)
    return float(mpmath.ncdf(x) - mpmath.exp(e) * q_tail)


@pytest.mark.parametrize(
    ("mechanism", "rate", "sigma"),
    [(0, 1.0, 0.8), (0, 1.0, 3.0), (2, 0.01, 0.8), (2, 0.01, 4.0), (3, 0.3, 2.0), (2, 0.5, 1.0)],
)
def test_optimistic_rounding_stays_below_and_close_to_the_exact_curve(
    mechanism: int, rate: float, sigma: float
) -> None:
    """The optimistic rounding (computed from linear-space tails for the Gaussian-family pairs):
    its hockey-stick curve is below the continuous pair's (in mpmath, from the closed-form
    tails below) at every eps, and within a few percent of it on a fine grid."""
    from dpsharp._native import core

    step, tail = 2.0**-12, 1e-15
    offset, mass, infinity = core.pld_discretize(mechanism, sigma, rate, step, tail, tail, False)
    losses = (offset + np.arange(mass.size)) * step
    for eps in np.linspace(0.0, 2.0, 9):
        above = losses > eps
        lower = float(np.sum(mass[above] * -np.expm1(eps - losses[above]))) + infinity
        exact = _mpmath_gaussian_family_delta(mechanism, sigma, rate, float(eps))
        assert lower <= exact * (1 + 1e-12)
        assert lower >= exact * (1 - 0.03) - 1e-13  # second order in h: close, not equal


def test_gdp_mu_of_huge_noise_multipliers_is_the_exact_bound_and_returns() -> None:
    """1 / sigma^2 of sigma = 1e200 underflows to 0: gdp_mu raised OverflowError (sigma**2),
    and with that fixed it looped for ever doubling mu = 0. For sigma = 1e100 the PLD's curve
    certifies nothing below the exact bound sqrt(T) / sigma, and gdp_mu answered inf instead
    of that bound."""
    for sigma in (1e200, 1e100, 1e10):
        acc = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), 0.01), 10)
        exact_bound = math.sqrt(10) / sigma if sigma < 1e150 else 0.0  # (1e200: underflows)
        assert acc.gdp_mu() == pytest.approx(exact_bound, rel=1e-15, abs=0.0)
        assert acc.epsilon(1e-5) == 0.0


def test_delta_does_not_depend_on_the_blas_thread_count() -> None:
    """The answers are a function of the multiset: a dot product summed by BLAS moved delta by a
    few ulps between one and two BLAS threads (800 distinct noise multipliers)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    sigmas = 2.0 * (0.8 / 2.0) ** (np.arange(800) / 799)

    def answers() -> list[float]:
        acc = PLDAccountant()
        for sigma in sigmas:
            acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.01))
        return [acc.delta(0.5), acc.delta(1.0), acc.delta(2.0), *acc.delta_bounds(1.0)]

    default = answers()
    with threadpoolctl.threadpool_limits(1):
        single = answers()
    assert default == single


def _exact_total_variation_of_sampled_gaussian(q: float, sigma: float) -> mpmath.mpf:
    """q (2 Phi(1 / (2 sigma)) - 1): the total variation (delta at epsilon 0) of one Poisson-
    subsampled Gaussian step in either direction, and of the replace-one pair
    q G_mu + (1 - q) Id of sampling without replacement (Dong, Roth, Su 2019, Thm 4.2), mu =
    1 / sigma; 50-digit mpmath."""
    with mpmath.workdps(50):
        return mpmath.mpf(q) * (2 * mpmath.ncdf(1 / (2 * mpmath.mpf(sigma))) - 1)


@pytest.mark.parametrize(("q", "sigma"), [
    (1e-12, 3.0),  # the linear-space discretisation
    (1e-9, 1.0),
    (1e-12, 1e3),  # both far tails underflow: the log-space one
    (1e-12, 1e8),
])
def test_certified_delta_at_a_tiny_sampling_rate_is_not_below_the_exact_value(
        q: float, sigma: float) -> None:
    """One Poisson-subsampled Gaussian step, delta(0) against its closed form. A cell's split
    between its ends was r = e^a Q / P with P and Q both 1 - O(q): 1 - r kept only the digits
    above their ulp, and delta(0) read 1.1e-4 relative below the exact value at q = 1e-12,
    sigma = 3 (2.6% at sigma = 1e3, 0 at sigma = 1e8)."""
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q))
    exact = _exact_total_variation_of_sampled_gaussian(q, sigma)
    assert exact <= acc.delta(0.0) <= exact * (1 + 1e-4)


@pytest.mark.parametrize("dataset_size", [10**6, 10**9, 10**12])
def test_certified_delta_of_sampling_without_replacement_is_not_below_the_exact_value(
        dataset_size: int) -> None:
    """The replace-one pair of one record drawn from n without replacement, delta(0) against
    the closed form q (2 Phi(mu / 2) - 1): its log-space discretisation split the cells by the
    same ratio of two nearly equal masses."""
    acc = PLDAccountant(neighbouring="replace_one").compose(
        SampledWithoutReplacement(Gaussian(2.0), 1, dataset_size))
    exact = _exact_total_variation_of_sampled_gaussian(1 / dataset_size, 2.0)
    assert exact <= acc.delta(0.0) <= exact * (1 + 1e-8)


@pytest.mark.parametrize("scale", [1e4, 1e8, 1e12])
def test_certified_delta_of_a_wide_laplace_is_not_below_the_exact_value(scale: float) -> None:
    """Laplace(b) with shift 1: delta(0) = 1 - e^{-1 / (2 b)} in closed form. At b = 1e8 the
    split of the cells from their log masses read 6e-9 relative below it."""
    acc = PLDAccountant().compose(Laplace(scale))
    with mpmath.workdps(50):
        exact = -mpmath.expm1(-1 / (2 * mpmath.mpf(scale)))
    assert exact <= acc.delta(0.0) <= exact * (1 + 1e-9)


def test_noise_so_large_that_its_inverse_square_underflows_is_answered() -> None:
    """Gaussian(1e300): 1 / sigma^2 underflows to 0 and the exact closed form divided by mu = 0
    (ZeroDivisionError); Laplace(1e300): 1 / b**2 raised OverflowError in the grid's variance.
    Both releases are one distribution up to rounding: epsilon 0, delta 0."""
    gaussian = PLDAccountant().compose(Gaussian(1e300), 3)
    assert gaussian.epsilon(1e-5) == 0.0 and gaussian.delta(0.0) == 0.0
    assert gaussian.epsilon_bounds(1e-5) == (0.0, 0.0) and gaussian.gdp_mu() == 0.0
    laplace = PLDAccountant().compose(Laplace(1e300), 3)
    assert laplace.epsilon(1e-5) == 0.0 and laplace.delta(0.5) == 0.0


def test_a_loss_beyond_the_grid_is_a_value_error_naming_the_mechanism() -> None:
    """Laplace(1e-300) has loss 1e300, which no grid of 2^40 steps reaches: the refusal names
    the mechanism and its scale as a ValueError (it was a bare RuntimeError)."""
    acc = PLDAccountant().compose(Laplace(1e-300))
    with pytest.raises(ValueError, match=r"Laplace mechanism \(scale 1e-300\)"):
        acc.epsilon(1e-5)


@pytest.mark.parametrize(("event", "count"), [
    (Laplace(1.0), 2**31),
    (Laplace(1e-8), 2**31),
    (PoissonSampled(Gaussian(5e-4), 0.01), 2**31),
])
def test_a_composition_beyond_the_transform_limit_is_refused_before_allocating(
        event, count: int) -> None:
    """2^31 steps whose composed loss spans billions of grid steps: the transform asked for
    48 GiB to 2e6 GiB and the process was killed for memory (a MemoryError at best). Refused
    up front, naming the size, for every query."""
    acc = PLDAccountant().compose(event, count)
    for query in (acc.epsilon, acc.delta, acc.epsilon_bounds):
        with pytest.raises(ValueError, match=r"needs a transform of \d+ points"):
            query(1e-5)


def test_a_long_composition_within_the_limit_is_answered_in_two_stages() -> None:
    """2^31 steps of q = 0.01, sigma = 1: one stage would need 2^27 points, the staged
    composition stays below the limit; its answer lies below the RDP accountant's (a looser
    bound of the same run)."""
    acc = PLDAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 2**31)
    lower, upper = acc.epsilon_bounds(1e-5)
    rdp = dpsharp.RDPAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 2**31)
    assert 0.0 < lower <= upper == acc.epsilon(1e-5) < rdp.epsilon(1e-5)


@pytest.mark.parametrize("delta", [1e-10, 1e-5])
def test_guarantee_of_a_nearly_flat_loss_distribution_does_not_overflow(delta: float) -> None:
    """sigma = 13,540, q = 1e-6: the discretised loss distribution's second moment is so small
    that the pruning estimate's room / S2 overflowed (OverflowError converting +inf to an int)
    in guarantee(), which also asks for the lower bound. The bracket must hold both ends and sit
    below the RDP accountant's certified epsilon (Mironov, Talwar, Zhang 2019)."""
    event = PoissonSampled(Gaussian(13540.46), 1e-6)
    result = PLDAccountant().compose(event, 1000).guarantee(delta)
    rdp = dpsharp.accountant("rdp").compose(event, 1000).epsilon(delta)
    assert result.certified
    assert 0.0 <= result.epsilon_lower <= result.epsilon <= rdp
