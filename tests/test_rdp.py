"""RDP curves and the RDP / moments accountants: known answers from the papers,
closed forms, conversions, the accountant contract, and bad input."""

from __future__ import annotations

import json
import math

import dpsharp
import numpy as np
import pytest
from dpsharp import (
    Composed,
    Gaussian,
    Laplace,
    MomentsAccountant,
    PoissonSampled,
    RDPAccountant,
    Repeated,
    SampledWithoutReplacement,
    Shuffled,
    UnsupportedEventError,
)
from dpsharp.rdp import (
    DEFAULT_ORDERS,
    delta_from_rdp,
    epsilon_from_rdp,
    gaussian_rdp,
    laplace_rdp,
    poisson_gaussian_rdp,
    sampled_without_replacement_gaussian_rdp,
)

MNIST_Q = 256 / 60000
BU_ORDERS = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64))


def mnist_steps(epochs: float) -> int:
    return round(epochs * 60000 / 256)


# --------------------------------------------------------------------- known answers
@pytest.mark.parametrize(
    ("q", "sigma", "steps", "expected"),
    [(0.01, 4.0, 10000, 1.2586), (0.01, 4.0, 40000, 2.5759), (0.01, 6.0, 40000, 1.6705)],
)
def test_moments_accountant_reference_values(q: float, sigma: float, steps: int, expected: float) -> None:
    """Abadi et al. 2016 moments accountant and Yu et al. 2019 row, re-derived."""
    acc = MomentsAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert round(acc.epsilon(1e-5), 4) == expected


@pytest.mark.parametrize(
    ("sigma", "epochs", "expected", "order"),
    [(0.7, 45, 7.1006, 3.8), (0.7, 70, 8.6757, 3.5), (1.3, 20, 1.3498, 17.0)],
)
def test_rdp_fractional_orders_reference_values(
    sigma: float, epochs: int, expected: float, order: float
) -> None:
    """Bu et al. 2020, Table 1 MNIST rows, orders {1.1..10.9} U {12..63}, classic."""
    acc = RDPAccountant(BU_ORDERS, "classic").compose(
        PoissonSampled(Gaussian(sigma), MNIST_Q), mnist_steps(epochs)
    )
    guarantee = acc.guarantee(1e-5)
    assert round(guarantee.epsilon, 4) == expected
    assert guarantee.details["order"] == pytest.approx(order)


def test_moments_accountant_is_classic_conversion_on_orders_2_to_33() -> None:
    """delta = min_lambda exp(alpha(lambda) - lambda eps), alpha(lambda) = lambda D_{lambda+1}."""
    event = PoissonSampled(Gaussian(1.1), 0.02)
    acc = MomentsAccountant().compose(event, 500)
    lambdas = np.arange(1, 33)
    log_moments = 500 * lambdas * poisson_gaussian_rdp(0.02, 1.1, lambdas + 1.0)
    eps = 2.0
    assert acc.delta(eps) == pytest.approx(math.exp(np.min(log_moments - lambdas * eps)), rel=1e-12)
    assert acc.epsilon(1e-6) == pytest.approx(
        np.min((log_moments + math.log(1e6)) / lambdas), rel=1e-12
    )
    assert acc.guarantee(1e-6).details["lambda"] == acc.guarantee(1e-6).details["order"] - 1


# --------------------------------------------------------------------- closed forms
def test_gaussian_closed_form_and_q_equal_one() -> None:
    orders = np.array([1.01, 1.5, 2.0, 7.25, 1000.0])
    for sigma in (0.3, 1.0, 17.0):
        expected = orders / (2 * sigma**2)
        np.testing.assert_allclose(gaussian_rdp(sigma, orders), expected, rtol=1e-15)
        np.testing.assert_allclose(poisson_gaussian_rdp(1.0, sigma, orders), expected, rtol=1e-15)


def test_laplace_closed_form_against_mpmath() -> None:
    """Mironov 2017, Proposition 6, evaluated independently at 50 digits."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(50):
        for scale in (0.1, 1.0, 30.0):
            for alpha in (1.001, 1.5, 2.0, 9.75, 500.0):
                a, b = mpmath.mpf(alpha), mpmath.mpf(scale)
                ref = mpmath.log(
                    a / (2 * a - 1) * mpmath.exp((a - 1) / b)
                    + (a - 1) / (2 * a - 1) * mpmath.exp(-a / b)
                ) / (a - 1)
                ours = laplace_rdp(scale, [alpha])[0]
                assert abs(ours - ref) <= 1e-12 * ref


def test_laplace_rdp_tends_to_pure_dp() -> None:
    """D_alpha -> 1/b as alpha -> inf, and never exceeds it (Laplace is (1/b, 0)-DP)."""
    values = laplace_rdp(0.5, [2.0, 100.0, 1e5])
    assert np.all(values <= 2.0) and values[-1] == pytest.approx(2.0, rel=1e-4)


def test_sampled_without_replacement_bound_properties() -> None:
    orders = np.array(DEFAULT_ORDERS)
    for gamma, sigma in [(0.01, 1.0), (0.1, 0.7), (1.0, 2.0)]:
        values = sampled_without_replacement_gaussian_rdp(gamma, sigma, orders)
        assert np.all(values <= orders / (2 * sigma**2) * (1 + 1e-15))
        assert np.all(np.diff(values * (orders - 1)) >= -1e-12)  # (alpha-1) D is non-decreasing
        assert np.all(np.isfinite(values)) and np.all(values >= 0)
    # smaller gamma, smaller bound
    small = sampled_without_replacement_gaussian_rdp(0.001, 1.0, orders)
    large = sampled_without_replacement_gaussian_rdp(0.01, 1.0, orders)
    assert np.all(small <= large)


def test_fractional_wor_is_the_convex_interpolation() -> None:
    lo, hi, mid = sampled_without_replacement_gaussian_rdp(0.05, 1.5, [3.0, 4.0, 3.25])
    expected = (0.75 * 2 * lo + 0.25 * 3 * hi) / 2.25
    assert mid == pytest.approx(min(expected, 3.25 / (2 * 1.5**2)), rel=1e-14)


def test_integer_orders_equal_quadrature() -> None:
    """The two independent methods of the core (binomial sum, Gauss-Kronrod) agree."""
    from dpsharp._native import core

    for q, sigma, alpha in [(0.01, 1.0, 32.0), (0.3, 0.4, 500.0), (1e-5, 50.0, 2.0), (0.9, 2.0, 7.0)]:
        by_sum = core.rdp_poisson_gaussian_log_a_minus_one(q, sigma, alpha, False)
        by_quadrature = core.rdp_poisson_gaussian_log_a_minus_one(q, sigma, alpha, True)
        assert by_quadrature == pytest.approx(by_sum, rel=1e-12, abs=1e-12)


def test_curve_is_monotone_in_order() -> None:
    values = poisson_gaussian_rdp(0.01, 0.8, DEFAULT_ORDERS)
    assert np.all(np.diff(values) >= 0)


# --------------------------------------------------------------------- conversions
def test_classic_and_tight_conversions_formulas() -> None:
    orders = np.array([1.5, 2.0, 8.0, 32.0])
    rdp = np.array([0.3, 0.5, 2.0, 9.0])
    delta = 1e-6
    classic = rdp + math.log(1 / delta) / (orders - 1)
    tight = rdp + np.log1p(-1 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    eps, order = epsilon_from_rdp(orders, rdp, delta, conversion="classic")
    assert eps == pytest.approx(classic.min(), rel=1e-15) and order == orders[classic.argmin()]
    eps, order = epsilon_from_rdp(orders, rdp, delta, conversion="tight")
    assert eps == pytest.approx(tight.min(), rel=1e-15) and order == orders[tight.argmin()]
    assert epsilon_from_rdp(orders, rdp, delta, conversion="tight")[0] < classic.min()


def test_kl_bound_gives_zero_epsilon() -> None:
    # delta >= sqrt(1 - exp(-D)) -> (0, delta)-DP
    assert epsilon_from_rdp([2.0], [1e-4], 0.5)[0] == 0.0


def test_infinite_rdp_gives_infinite_epsilon() -> None:
    assert epsilon_from_rdp([2.0, 3.0], [math.inf, math.inf], 1e-5)[0] == math.inf
    assert delta_from_rdp([2.0, 3.0], [math.inf, math.inf], 1.0)[0] == 1.0


def test_conversions_are_inverse() -> None:
    orders = np.array(DEFAULT_ORDERS)
    rdp = 100 * poisson_gaussian_rdp(0.02, 1.0, orders)
    for conversion in ("classic", "tight"):
        for delta in (1e-3, 1e-5, 1e-9):
            eps, _ = epsilon_from_rdp(orders, rdp, delta, conversion=conversion)  # type: ignore[arg-type]
            back, _ = delta_from_rdp(orders, rdp, eps, conversion=conversion)  # type: ignore[arg-type]
            assert back == pytest.approx(delta, rel=1e-9)


# --------------------------------------------------------------------- accountant contract
def test_registered_and_exported() -> None:
    assert isinstance(dpsharp.accountant("rdp"), RDPAccountant)
    assert isinstance(dpsharp.accountant("moments"), MomentsAccountant)
    assert dpsharp.rdp.poisson_gaussian_rdp is poisson_gaussian_rdp
    from dpsharp.accountants import MomentsAccountant as M
    from dpsharp.accountants import RDPAccountant as R

    assert (M, R) == (MomentsAccountant, RDPAccountant)


def test_heterogeneous_composition_sums_curves() -> None:
    orders = [1.5, 2.0, 4.0, 16.0]
    a = PoissonSampled(Gaussian(1.0), 0.01)
    b = PoissonSampled(Gaussian(2.0), 0.05)
    acc = RDPAccountant(orders).compose(a, 30).compose(b, 7).compose(Gaussian(5.0)).compose(Laplace(3.0), 2)
    expected = (
        30 * poisson_gaussian_rdp(0.01, 1.0, orders)
        + 7 * poisson_gaussian_rdp(0.05, 2.0, orders)
        + gaussian_rdp(5.0, orders)
        + 2 * laplace_rdp(3.0, orders)
    )
    np.testing.assert_allclose(acc.rdp(), expected, rtol=1e-14)
    assert acc.epsilon(1e-5) == epsilon_from_rdp(orders, acc.rdp(), 1e-5)[0]


def test_count_repeated_composed_state_dict_identical() -> None:
    a = PoissonSampled(Gaussian(1.0), 0.01)
    b = Gaussian(3.0)
    one = RDPAccountant().compose(a, 20).compose(b, 20)
    two = RDPAccountant().compose(Repeated(Composed((b, a)), 20))
    three = RDPAccountant()
    for _ in range(20):
        three.compose(a).compose(b)
    restored = RDPAccountant()
    restored.load_state_dict(json.loads(json.dumps(one.state_dict())))
    for delta in (1e-3, 1e-7):
        values = {acc.epsilon(delta) for acc in (one, two, three, restored)}
        assert len(values) == 1
    assert one.delta(1.0) == restored.delta(1.0) == two.delta(1.0)


def test_sampled_without_replacement_needs_replace_one() -> None:
    event = SampledWithoutReplacement(Gaussian(1.0), 64, 6400)
    with pytest.raises(UnsupportedEventError, match="SampledWithoutReplacement"):
        RDPAccountant().compose(event)
    acc = RDPAccountant(neighbouring="replace_one").compose(event, 100)
    expected = epsilon_from_rdp(
        DEFAULT_ORDERS, 100 * sampled_without_replacement_gaussian_rdp(0.01, 1.0, DEFAULT_ORDERS), 1e-5
    )[0]
    assert acc.epsilon(1e-5) == expected
    with pytest.raises(UnsupportedEventError, match="PoissonSampled"):
        acc.compose(PoissonSampled(Gaussian(1.0), 0.01))


@pytest.mark.parametrize(
    "event",
    [
        PoissonSampled(Laplace(1.0), 0.1),
        Shuffled(Gaussian(1.0), 10, 100),
        Composed((Gaussian(1.0), PoissonSampled(PoissonSampled(Gaussian(1.0), 0.5), 0.5))),
    ],
)
def test_unsupported_events_are_refused_by_name(event: object) -> None:
    for acc in (RDPAccountant(), MomentsAccountant()):
        assert not acc.supports(event)  # type: ignore[arg-type]
        with pytest.raises(UnsupportedEventError, match=r"PoissonSampled|Shuffled"):
            acc.compose(event)  # type: ignore[arg-type]
        assert acc.is_empty


def test_empty_accountant() -> None:
    assert RDPAccountant().epsilon(1e-5) == 0.0
    assert MomentsAccountant().delta(1.0) == 0.0


# --------------------------------------------------------------------- bad input
@pytest.mark.timeout(5)
@pytest.mark.parametrize("sigma", [0.0, -1.0, math.nan, math.inf])
def test_bad_noise_multiplier(sigma: float) -> None:
    with pytest.raises(ValueError, match="noise_multiplier"):
        poisson_gaussian_rdp(0.1, sigma, [2.0])
    with pytest.raises(ValueError, match="noise_multiplier"):
        gaussian_rdp(sigma, [2.0])
    with pytest.raises(ValueError, match="noise_multiplier"):
        sampled_without_replacement_gaussian_rdp(0.1, sigma, [2.0])


@pytest.mark.timeout(5)
@pytest.mark.parametrize("q", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_bad_sampling_probability(q: float) -> None:
    with pytest.raises(ValueError, match="sampling_probability"):
        poisson_gaussian_rdp(q, 1.0, [2.0])


@pytest.mark.timeout(5)
@pytest.mark.parametrize("orders", [[1.0], [0.5], [math.nan], [math.inf], [2.0, math.nan], [], [2e6]])
def test_bad_orders(orders: object) -> None:
    with pytest.raises(ValueError, match="orders"):
        poisson_gaussian_rdp(0.1, 1.0, orders)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="orders"):
        RDPAccountant(orders)  # type: ignore[arg-type]


@pytest.mark.timeout(5)
@pytest.mark.parametrize("orders", ["x", "2", [True], [2.0, True], ["2"], [2 + 0j]])
def test_non_real_orders_are_type_errors(orders: object) -> None:
    """A string is not parsed and a bool is not an order: TypeError naming ``orders``."""
    with pytest.raises(TypeError, match="orders"):
        poisson_gaussian_rdp(0.1, 1.0, orders)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="orders"):
        RDPAccountant(orders)  # type: ignore[arg-type]


@pytest.mark.timeout(5)
def test_bad_core_arguments_are_rejected_in_cpp_too() -> None:
    """The compiled core guards itself even when called without the Python checks."""
    from dpsharp._native import core

    for args in [(math.nan, 1.0, [2.0]), (0.1, math.nan, [2.0]), (0.1, 1.0, [math.nan]), (0.1, 1.0, [1.0])]:
        with pytest.raises(ValueError):
            core.rdp_poisson_gaussian(*args)
    with pytest.raises(ValueError, match="delta"):
        core.rdp_epsilon([2.0], [1.0], math.nan, 1)


@pytest.mark.timeout(5)
@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2.0, math.nan, math.inf])
def test_bad_delta(delta: float) -> None:
    acc = RDPAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 10)
    with pytest.raises(ValueError, match="delta"):
        acc.epsilon(delta)
    with pytest.raises(ValueError, match="delta"):
        epsilon_from_rdp([2.0], [1.0], delta)


@pytest.mark.timeout(5)
@pytest.mark.parametrize("epsilon", [-1.0, math.nan, math.inf])
def test_bad_epsilon(epsilon: float) -> None:
    acc = MomentsAccountant().compose(PoissonSampled(Gaussian(1.0), 0.01), 10)
    with pytest.raises(ValueError, match="epsilon"):
        acc.delta(epsilon)


@pytest.mark.timeout(5)
def test_bad_counts_and_options() -> None:
    acc = RDPAccountant()
    with pytest.raises(ValueError, match="count"):
        acc.compose(Gaussian(1.0), -1)
    with pytest.raises(TypeError, match="count"):
        acc.compose(Gaussian(1.0), 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="conversion"):
        RDPAccountant(conversion="loose")
    with pytest.raises(ValueError, match="rdp"):
        epsilon_from_rdp([2.0, 3.0], [1.0, math.nan], 1e-5)
    assert acc.is_empty


def test_extreme_regimes_fail_closed_or_finite() -> None:
    """Huge orders with tiny sigma: a finite exact value or +inf, never NaN and never small."""
    values = poisson_gaussian_rdp(0.5, 0.3, [9999.5, 10000.0])
    assert not np.isnan(values).any()
    assert np.all(values >= 0.5 * 9999.5 / (2 * 0.3**2))  # >= D of the q-scaled... sanity floor


# --------------------------------------------------------------------- overflow of 1/(2 sigma^2)
def _poisson_rdp_bracket(q: float, sigma: float, alpha: float) -> tuple[float, float]:
    """Closed-form bounds on D_alpha of the Poisson-subsampled Gaussian, at 60 digits:
    with L = exp((2z - 1)/(2 sigma^2)) and c = 1/(2 sigma^2),
    q^alpha L^alpha <= (1 - q + q L)^alpha <= 1 - q + q L^alpha (keep one term; convexity), and
    E[L^alpha] = e^{alpha (alpha - 1) c} under N(0, sigma^2), so
    (alpha log q + alpha (alpha - 1) c) / (alpha - 1) <= D_alpha
    <= log(1 - q + q e^{alpha (alpha - 1) c}) / (alpha - 1). As doubles (+inf above the range)."""
    import mpmath

    with mpmath.workdps(60):
        q_m, a_m = mpmath.mpf(q), mpmath.mpf(alpha)
        c = 1 / (2 * mpmath.mpf(sigma) ** 2)
        lower = (a_m * mpmath.log(q_m) + a_m * (a_m - 1) * c) / (a_m - 1)
        upper = mpmath.log(1 - q_m + q_m * mpmath.exp(a_m * (a_m - 1) * c)) / (a_m - 1)
        return float(lower), float(upper)


@pytest.mark.parametrize("sigma", [1e-3, 1e-20, 1e-100, 1e-150, 6e-155, 1e-160, 1e-200, 1e-300, 5e-324])
@pytest.mark.parametrize("q", [1e-6, 0.1, 0.9])
def test_tiny_noise_rdp_is_within_the_closed_form_bracket(q: float, sigma: float) -> None:
    """Once 1/(2 sigma^2) overflows a double (sigma below ~7e-155) the divergence is above every
    double at every order: +inf, never the finite quadrature of an integrand that lost its shift
    (0.0076 at order 1.5 for sigma = 1e-160). Below the overflow the value lies in the bracket."""
    orders = [1.5, 2.0, 2.5, 3.0, 10.5, 100.0]
    values = poisson_gaussian_rdp(q, sigma, orders)
    for alpha, value in zip(orders, values):
        lower, upper = _poisson_rdp_bracket(q, sigma, alpha)
        assert not math.isnan(value)
        assert value >= lower * (1 - 1e-12), (alpha, value, lower)
        if math.isfinite(value):
            assert value <= upper * (1 + 1e-12), (alpha, value, upper)
    if sigma < 7e-155:
        assert np.all(np.isinf(values))


@pytest.mark.parametrize("sigma", [1e-160, 1e-300])
def test_tiny_noise_accountants_report_infinite_epsilon(sigma: float) -> None:
    """Every RDP path of a composition with an overflowing 1/(2 sigma^2) gives epsilon = +inf."""
    for acc in (RDPAccountant(), MomentsAccountant(), RDPAccountant(orders=[1.25, 1.5, 1.75])):
        acc.compose(PoissonSampled(Gaussian(sigma), 0.1), 10)
        assert acc.epsilon(1e-5) == math.inf
        assert acc.delta(10.0) == 1.0
    wor = RDPAccountant(neighbouring="replace_one").compose(
        SampledWithoutReplacement(Gaussian(sigma), 10, 100), 3
    )
    assert wor.epsilon(1e-5) == math.inf
    # Laplace(b): the exact epsilon(1e-5) is 1/b less than 1e-4 (delta(1/b - t) ~ (1 - e^-t)/2).
    assert RDPAccountant().compose(Laplace(sigma)).epsilon(1e-5) >= (1.0 / sigma) * (1 - 1e-12)


def _wor_theorem9(gamma: float, sigma: float, alpha: int) -> float:
    """(alpha - 1) D_alpha of Wang, Balle, Kasiviswanathan 2019, Theorem 9, for the Gaussian
    (eps(j) = j / (2 sigma^2)), capped by the unsampled alpha (alpha - 1) / (2 sigma^2), at 60
    digits, as a double (+inf above the range)."""
    import mpmath

    with mpmath.workdps(60):
        g, a = mpmath.mpf(gamma), mpmath.mpf(alpha)
        c = 1 / (2 * mpmath.mpf(sigma) ** 2)
        eps2 = 2 * c
        second = min(4 * mpmath.expm1(eps2), 2 * mpmath.exp(eps2))
        total = 1 + g**2 * mpmath.binomial(alpha, 2) * second
        for j in range(3, alpha + 1):
            total += 2 * g**j * mpmath.binomial(alpha, j) * mpmath.exp((j - 1) * j * c)
        return float(min(mpmath.log(total), a * (a - 1) * c))


@pytest.mark.parametrize("sigma", [0.5, 1e-3, 1e-100, 5e-155, 7e-155, 1e-160, 1e-300])
def test_sampled_without_replacement_bound_never_nan(sigma: float) -> None:
    """The Theorem 9 bound at integer orders equals its mpmath evaluation (inf once it overflows;
    log_add_exp(inf, inf) used to give NaN at order 3.5 from sigma ~ 7e-155 on), and fractional
    orders interpolate it."""
    gamma = 0.1
    values = sampled_without_replacement_gaussian_rdp(gamma, sigma, [2.0, 3.0, 4.0, 3.5])
    assert not np.isnan(values).any()
    for alpha, value in zip([2, 3, 4], values[:3]):
        expected = _wor_theorem9(gamma, sigma, alpha) / (alpha - 1)
        if math.isinf(expected):
            assert value == math.inf
        else:
            assert value == pytest.approx(expected, rel=1e-10)
    interpolated = 0.5 * (_wor_theorem9(gamma, sigma, 3) + _wor_theorem9(gamma, sigma, 4)) / 2.5
    assert values[3] >= min(interpolated, 3.5 / (2 * sigma**2) if sigma > 1e-150 else math.inf) * (1 - 1e-10)


@pytest.mark.parametrize("noise_multiplier", [1e8, 1e7, 3e6])
@pytest.mark.parametrize("epsilon", [0.0, 1e-12, 1e-9])
def test_delta_of_a_nearly_silent_release_is_not_rounded_to_zero(
    noise_multiplier: float, epsilon: float
) -> None:
    """A Gaussian release of multiplier 1e8 has Renyi divergences about 1e-16 at every order;
    the Kullback-Leibler conversion delta <= sqrt(1 - e^{-D}) then needs 1 - e^{-D} by expm1
    (exp(-D) rounds to 1 below D ~ 1.1e-16 and delta read 0). The converted delta must stay at
    or above the exact one, Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) with
    mu = 1 / sigma (Dong, Roth, Su 2019, Cor. 2.13), in 40-digit mpmath."""
    import mpmath

    with mpmath.workdps(40):
        mu, e = 1 / mpmath.mpf(noise_multiplier), mpmath.mpf(epsilon)
        exact = float(mpmath.ncdf(-e / mu + mu / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu - mu / 2))
    accountant = dpsharp.accountant("rdp")
    accountant.compose(Gaussian(noise_multiplier))
    converted = accountant.delta(epsilon)
    assert exact > 0.0
    assert converted >= exact
    assert converted <= 1e3 * exact  # the conversion's own looseness, not a rounding to 0


# --------------------------------------------------------------------- rounding to the safe side
def test_laplace_rdp_is_not_below_the_exact_divergence_at_any_scale() -> None:
    """Mironov 2017, Proposition 6, at 80 digits. The log argument's excess over 1 was formed as
    a difference whose first-order terms cancel: 1.4e-12 relative low at b = 1e5, 23% low at
    b = 1e15 and negative at 1e16 (where the accountant then refused with 'rdp values must be
    >= 0'). The value must be at or above exact, within 1e-13 relative."""
    mpmath = pytest.importorskip("mpmath")
    for scale in (0.05, 0.3, 1.0, 2.5, 30.0, 1e3, 1e5, 1e10, 1e15, 1e16, 1e100):
        orders = [1.0001, 1.01, 1.5, 2.0, 9.75, 500.0, 1e5]
        ours = laplace_rdp(scale, orders)
        # (the reference cancels too: 80 digits plus twice the digits of b)
        with mpmath.workdps(80 + 2 * max(0, int(math.log10(scale)))):
            for alpha, value in zip(orders, ours):
                a, b = mpmath.mpf(alpha), mpmath.mpf(scale)
                exact = mpmath.log(a / (2 * a - 1) * mpmath.exp((a - 1) / b)
                                   + (a - 1) / (2 * a - 1) * mpmath.exp(-a / b)) / (a - 1)
                assert value >= exact, (scale, alpha, value, float(exact))
                assert value <= exact * (1 + 1e-13) + mpmath.mpf(2.0**-1070), (scale, alpha)
    acc = dpsharp.accountant("rdp").compose(Laplace(1e16), 10**20)  # (refused before)
    assert acc.epsilon(1e-5) >= 0.0 and acc.delta(0.0) > 0.0


def test_gaussian_rdp_is_not_below_the_exact_divergence_nor_zero() -> None:
    """alpha / (2 sigma^2), exact in rationals: rounded to nearest it was up to an ulp low, and
    0 once sigma^2 overflowed (sigma >= 1e155), which the accountant read as pure DP."""
    from fractions import Fraction

    for sigma in (0.3, 1.0, 17.0, 1e150, 1e154, 1e160, 1e300):
        orders = [1.01, 1.5, 2.0, 7.25, 1000.0]
        for values in (gaussian_rdp(sigma, orders), poisson_gaussian_rdp(1.0, sigma, orders)):
            for alpha, value in zip(orders, values):
                exact = Fraction(alpha) / (2 * Fraction(sigma) ** 2)
                assert Fraction(float(value)) >= exact > 0
                assert Fraction(float(value)) <= exact * (1 + Fraction(1, 10**15)) + Fraction(
                    2.0**-1070)
    assert dpsharp.accountant("rdp").compose(Gaussian(1e200)).delta(0.001) > 0.0


def test_a_poisson_sampled_rdp_below_the_double_range_is_not_zero() -> None:
    """At q = 1e-170 the order-2 divergence is about q^2 (e^{1/sigma^2} - 1) = 1.7e-340: it
    read 0, and the accountant answered delta(0) = 0 (pure DP) for a Gaussian mechanism whose
    total variation is 3.8e-171. The smallest doubles above the exact value are returned."""
    values = poisson_gaussian_rdp(1e-170, 1.0, [2.0, 2.5, 3.0])
    assert np.all(values > 0.0) and np.all(values <= 1e-320)
    acc = dpsharp.accountant("rdp").compose(PoissonSampled(Gaussian(1.0), 1e-170))
    assert acc.delta(0.0) > 0.0
    # where the value is in the normal range the same branch matches the exact sum (k <= 2
    # terms of Mironov, Talwar, Zhang 2019: A_2 - 1 = q^2 (e^{1/sigma^2} - 1))
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        q = mpmath.mpf(1e-150)
        exact = mpmath.log1p(q * q * mpmath.expm1(1)) / 1
        value = poisson_gaussian_rdp(1e-150, 1.0, [2.0])[0]
        assert exact <= value <= exact * (1 + 1e-11)


def _tight_conversion_references(  # type: ignore[no-untyped-def]
        orders, curve, delta=None, epsilon=None):
    """The tight RDP conversion (Canonne, Kamath, Steinke 2020, Proposition 12; total
    variation <= sqrt(1 - e^{-D_alpha}) for the epsilon = 0 shortcut) evaluated at 60 digits on
    the given doubles: epsilon(delta) or delta(epsilon), minimised over the orders."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        best = mpmath.inf
        for alpha, value in zip(orders, curve):
            a, r = mpmath.mpf(float(alpha)), mpmath.mpf(float(value))
            if delta is not None:
                d = mpmath.mpf(delta)
                if d * d >= -mpmath.expm1(-r):
                    candidate = mpmath.mpf(0)
                elif a > mpmath.mpf("1.01"):
                    candidate = r + mpmath.log1p(-1 / a) - (mpmath.log(d) + mpmath.log(a)) / (a - 1)
                else:
                    candidate = mpmath.inf
            else:
                candidate = mpmath.log(-mpmath.expm1(-r)) / 2 if r > 0 else mpmath.ninf
                if a > mpmath.mpf("1.01"):
                    candidate = min(candidate, (a - 1) * (r - epsilon + mpmath.log1p(-1 / a))
                                    - mpmath.log(a))
            best = min(best, candidate)
        return max(best, 0) if delta is not None else min(mpmath.exp(best), 1)


def test_rdp_conversions_are_not_below_their_formula() -> None:
    """epsilon_from_rdp and delta_from_rdp against the same formula at 60 digits: rounded to
    nearest, delta read up to 5.9e-14 relative below (large |log delta|), a near-zero epsilon
    8e-14 below, and a D_alpha within an ulp of the epsilon = 0 shortcut's threshold answered 0
    where the formula gives 0.41. Each is now at or above, within 1e-11 relative."""
    # the shortcut's threshold: sqrt(1 - e^{-r}) exceeds delta by 5e-18
    got, _ = epsilon_from_rdp([2.0], [1.6912207771059824], 0.9031642130747976)
    exact = _tight_conversion_references([2.0], [1.6912207771059824], delta=0.9031642130747976)
    assert exact > 0.4 and exact <= got <= exact * (1 + 1e-11)
    orders = np.array([1.02, 1.05, 1.1, 1.5, 2, 3, 4, 5, 8, 10, 16, 20, 32, 64, 128, 256, 1000])
    curves = [gaussian_rdp(469.42720819147866, orders) * 36.31755276626032,
              gaussian_rdp(0.6222383860004285, orders),
              poisson_gaussian_rdp(1e-3, 1.0, orders) * 1000,
              poisson_gaussian_rdp(0.05, 0.8, orders) * 500]
    for curve in curves:
        for epsilon in (0.0, 0.01, 0.7279995540660957, 3.0, 10.0):
            got, _ = delta_from_rdp(orders, curve, epsilon)
            exact = _tight_conversion_references(orders, curve, epsilon=epsilon)
            assert exact <= got <= exact * (1 + 1e-11) + 1e-320, (epsilon, got, float(exact))
        for delta in (1e-300, 1e-12, 1e-5, 0.3, 0.8240900560644168):
            got, _ = epsilon_from_rdp(orders, curve, delta)
            exact = _tight_conversion_references(orders, curve, delta=delta)
            assert exact <= got <= exact * (1 + 1e-11) + 1e-13, (delta, got, float(exact))
