"""Private hyperparameter selection: the exponential mechanism's distribution (chi-square), the
Gupta et al. 2010 formulas on 002's worked example, the Papernot-Steinke 2022 RDP bounds
against an independent mpmath evaluation of their theorems and against the exact Renyi
divergence of a brute-forced toy search, and the selection procedures' events."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from dpsharp.events import Gaussian, PoissonSampled, Repeated, event_from_dict, event_to_dict
from dpsharp.tuning import (
    exponential_mechanism,
    exponential_mechanism_probabilities,
    gupta_et_al_accuracy_loss,
    gupta_et_al_calls,
    gupta_et_al_epsilon,
    gupta_et_al_max_candidates,
    partition,
    poisson_tuning_rdp,
    pure_dp_rdp,
    sample_truncated_negative_binomial,
    select,
    select_partitioned,
    select_random_repetitions,
    truncated_negative_binomial_mean,
    truncated_negative_binomial_tuning_rdp,
)
from dpsharp.tuning_events import (
    DisjointParts,
    PoissonTuning,
    PureDP,
    RandomChoice,
    TruncatedNegativeBinomialTuning,
    rdp_to_delta,
)
from scipy import stats

ORDERS = np.concatenate([np.linspace(1.1, 10.9, 99), np.arange(12.0, 64.0), [128.0, 256.0, 1024.0]])


# ----------------------------------------------------------------- exponential mechanism
@pytest.mark.parametrize(
    ("scores", "epsilon", "sensitivity"),
    [([0.0, 1.0, 2.0, 5.0, 3.0], 1.3, 2.0), ([-12.0, -9.0, -10.0, -15.0], 0.8, 1.0)],
)
def test_exponential_mechanism_frequencies_chi_square(scores: list[float], epsilon: float, sensitivity: float) -> None:
    weights = [math.exp(epsilon * s / (2 * sensitivity)) for s in scores]
    expected = np.array(weights) / sum(weights)
    np.testing.assert_allclose(exponential_mechanism_probabilities(scores, epsilon, sensitivity), expected, rtol=1e-13)
    rng = np.random.default_rng(123)
    draws = 40000
    counts = np.bincount(
        [exponential_mechanism(scores, epsilon, sensitivity, rng) for _ in range(draws)], minlength=len(scores)
    )
    result = stats.chisquare(counts, expected * draws)
    assert result.pvalue > 1e-3, (counts, expected * draws)


def test_exponential_mechanism_004_form_and_extremes() -> None:
    # 004: probability proportional to exp(-epsilon z_i / 2), z_i = number of errors.
    errors = np.array([120.0, 100.0, 103.0])
    got = exponential_mechanism_probabilities(-errors, 0.5, 1.0)
    ref = np.exp(-0.5 * errors / 2) / np.exp(-0.5 * errors / 2).sum()
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    # Huge scores do not overflow (log-space normalisation).
    big = exponential_mechanism_probabilities([1e6, 1e6 - 1.0], 2.0, 1.0)
    np.testing.assert_allclose(big, [1 / (1 + math.exp(-1.0)), math.exp(-1.0) / (1 + math.exp(-1.0))], rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scores": [1.0, float("nan")], "epsilon": 1.0, "sensitivity": 1.0}, "finite"),
        ({"scores": [], "epsilon": 1.0, "sensitivity": 1.0}, "non-empty"),
        ({"scores": [1.0], "epsilon": 0.0, "sensitivity": 1.0}, r"epsilon must be in \(0, inf\)"),
        ({"scores": [1.0], "epsilon": 1.0, "sensitivity": -1.0}, r"sensitivity must be in \(0, inf\)"),
    ],
)
def test_exponential_mechanism_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        exponential_mechanism(rng=np.random.default_rng(0), **kwargs)


# ------------------------------------------------------------ Gupta et al. (Abadi et al. 2016, Theorem D.1)
def test_gupta_et_al_worked_example_of_002() -> None:
    """Abadi et al. 2016, appendix D: Q = 9500 of a 10,000-example validation set, epsilon' = 0.5, delta = 0.05;
    "we lose at most 1% in accuracy as long as 100 > 8 ln(40/p). This is satisfied as long as
    p >= 1/6700 ... one can try 6,700 different parameter settings at privacy cost epsilon = 4
    for the validation set"."""
    assert gupta_et_al_accuracy_loss(0.5, 0.05, 1 / 6700) == pytest.approx(8 * math.log(40 * 6700), rel=1e-14)
    assert gupta_et_al_accuracy_loss(0.5, 0.05, 1 / 6700) < 100.0
    k = gupta_et_al_max_candidates(0.5, 0.05, 100.0)
    assert k == math.floor(0.025 * math.exp(12.5)) == 6708  # the paper rounds down to 6,700
    assert gupta_et_al_accuracy_loss(0.5, 0.05, 1 / k) <= 100.0 < gupta_et_al_accuracy_loss(0.5, 0.05, 1 / (k + 1))
    # Privacy: 8 epsilon' = 4 on the validation set; the theorem's general statement adds epsilon.
    assert gupta_et_al_epsilon(2.0, 0.5, disjoint_validation=True) == 4.0
    assert gupta_et_al_epsilon(2.0, 0.5) == 6.0
    assert gupta_et_al_epsilon(5.0, 0.5, disjoint_validation=True) == 5.0
    # Calls: (1/(eps' delta p))^2 log(1/(eps' delta p)) at p = 1/100.
    x = 1 / (0.5 * 0.05 * 0.01)
    assert gupta_et_al_calls(0.5, 0.05, 0.01) == pytest.approx(x**2 * math.log(x), rel=1e-12)


def test_gupta_et_al_bad_input() -> None:
    with pytest.raises(ValueError, match=r"epsilon_prime must be in \(0, 0.5\]"):
        gupta_et_al_epsilon(1.0, 0.5000001)
    with pytest.raises(ValueError, match="p and delta must be in"):
        gupta_et_al_calls(0.1, 0.05, 1.0)
    with pytest.raises(ValueError, match="too small"):
        gupta_et_al_max_candidates(0.1, 0.05, 1.0)


# -------------------------------------------------------------------- pure DP as RDP
def test_pure_dp_rdp_equals_randomized_response_divergence() -> None:
    mpmath.mp.dps = 40
    for epsilon in (0.1, 1.0, 4.0, 30.0):
        e = mpmath.mpf(epsilon)
        p, q = mpmath.e**e / (1 + mpmath.e**e), 1 / (1 + mpmath.e**e)
        ours = pure_dp_rdp(epsilon, ORDERS)
        for alpha, value in zip(ORDERS, ours):
            a = mpmath.mpf(float(alpha))
            exact = mpmath.log(p**a * q ** (1 - a) + q**a * p ** (1 - a)) / (a - 1)
            assert value == pytest.approx(float(exact), rel=1e-12, abs=1e-300)
        assert np.all(ours <= epsilon + 1e-15)
        assert np.all(ours <= ORDERS * epsilon**2 / 2 * (1 + 1e-12))


# ------------------------------------------------------------- Papernot and Steinke 2022
def _mp_tnb_mean(eta: float, gamma: float, terms: int = 20000) -> mpmath.mpf:
    """E[K] by summing k P[K = k] from the PMF (independent of the closed form)."""
    eta_m, g = mpmath.mpf(eta), mpmath.mpf(gamma)
    normaliser = g ** (-eta_m) - 1 if eta != 0 else mpmath.log(1 / g)
    total, prod = mpmath.mpf(0), mpmath.mpf(1)
    for k in range(1, terms + 1):
        if eta != 0:
            prod *= (k - 1 + eta_m) / k
            pk = (1 - g) ** k * prod / normaliser
        else:
            pk = (1 - g) ** k / (k * normaliser)
        total += k * pk
    return total


@pytest.mark.parametrize(("eta", "gamma"), [(1.0, 0.1), (0.0, 0.05), (-0.5, 0.2), (2.0, 0.3), (1e-9, 0.05)])
def test_truncated_negative_binomial_mean_against_series(eta: float, gamma: float) -> None:
    mpmath.mp.dps = 30
    assert truncated_negative_binomial_mean(eta, gamma) == pytest.approx(float(_mp_tnb_mean(eta, gamma)), rel=1e-9)


@pytest.mark.parametrize(("eta", "gamma"), [(1.0, 0.2), (0.0, 0.1), (-0.5, 0.1), (2.0, 0.4)])
def test_truncated_negative_binomial_sampler_mean(eta: float, gamma: float) -> None:
    rng = np.random.default_rng(17)
    draws = np.array([sample_truncated_negative_binomial(eta, gamma, rng) for _ in range(20000)])
    assert draws.min() >= 1
    mean = truncated_negative_binomial_mean(eta, gamma)
    standard_error = draws.std() / math.sqrt(draws.size)
    assert abs(draws.mean() - mean) < 5 * standard_error


def _mp_theorem2(base_curve, orders, eta, gamma):  # type: ignore[no-untyped-def]
    """Papernot and Steinke 2022, Theorem 2, evaluated independently in mpmath: E[K] from the
    PMF series, the lambda_hat minimum by an explicit loop."""
    mpmath.mp.dps = 30
    mean = _mp_tnb_mean(eta, gamma)
    eta_m, g = mpmath.mpf(eta), mpmath.mpf(gamma)
    best_hat = min(
        (1 + eta_m) * (1 - 1 / mpmath.mpf(lh)) * base_curve(lh) + (1 + eta_m) * mpmath.log(1 / g) / mpmath.mpf(lh)
        for lh in orders
    )
    return [base_curve(lam) + best_hat + mpmath.log(mean) / (mpmath.mpf(lam) - 1) for lam in orders]


@pytest.mark.parametrize(("eta", "gamma"), [(1.0, 0.1), (0.0, 0.05), (-0.5, 0.1)])
def test_theorem2_against_independent_mpmath_evaluation(eta: float, gamma: float) -> None:
    # Base: 1000 steps of the full-batch Gaussian mechanism with sigma = 30 (RDP 1000 alpha / 1800).
    def curve(alpha):  # type: ignore[no-untyped-def]
        return 1000 * mpmath.mpf(float(alpha)) / (2 * mpmath.mpf(30) ** 2)

    base = np.array([float(curve(a)) for a in ORDERS])
    ours = truncated_negative_binomial_tuning_rdp(base, ORDERS, eta=eta, gamma=gamma)
    reference = _mp_theorem2(curve, [float(a) for a in ORDERS], eta, gamma)
    np.testing.assert_allclose(ours, [float(r) for r in reference], rtol=1e-9)


def test_geometric_search_of_pure_dp_tends_to_three_epsilon() -> None:
    """Liu and Talwar 2019 (recovered by Papernot and Steinke 2022 with eta = 1): a geometric
    number of runs of an epsilon-DP base is 3 epsilon-DP; Theorem 2's bound tends to 3 epsilon
    as lambda and lambda_hat grow."""
    orders = np.array([2.0, 10.0, 1e3, 1e6, 1e9])
    bound = truncated_negative_binomial_tuning_rdp(pure_dp_rdp(0.5, orders), orders, eta=1.0, gamma=0.01)
    assert bound[-1] == pytest.approx(1.5, rel=1e-6)
    assert np.all(np.diff(bound) < 0)


# Papernot and Steinke 2022 (arXiv 2110.03620v2), Definition 1 and Theorem 2's E[K], by hand.
@pytest.mark.parametrize("gamma", [0.5, 0.1, 1e-3])
def test_truncated_negative_binomial_mean_closed_forms(gamma: float) -> None:
    root = math.sqrt(gamma)
    assert truncated_negative_binomial_mean(1.0, gamma) == pytest.approx(1 / gamma, rel=1e-14)  # geometric
    assert truncated_negative_binomial_mean(0.0, gamma) == pytest.approx((1 / gamma - 1) / math.log(1 / gamma), rel=1e-14)
    # eta = 2: 2 (1 - g) / (g (1 - g^2)) = 2 / (g (1 + g)); eta = -1/2: (1 + sqrt g) / (2 sqrt g).
    assert truncated_negative_binomial_mean(2.0, gamma) == pytest.approx(2 / (gamma * (1 + gamma)), rel=1e-13)
    assert truncated_negative_binomial_mean(-0.5, gamma) == pytest.approx((1 + root) / (2 * root), rel=1e-13)


@pytest.mark.parametrize(("eta", "gamma"), [(1.0, 0.3), (0.0, 0.3)])
def test_sampler_matches_definition1_special_cases(eta: float, gamma: float) -> None:
    """Definition 1 at eta = 1 (geometric, gamma (1 - gamma)^(k-1)) and eta = 0 (logarithmic,
    (1 - gamma)^k / (k log(1/gamma))): chi-square of 20000 draws."""
    rng = np.random.default_rng(23)
    draws = np.array([sample_truncated_negative_binomial(eta, gamma, rng) for _ in range(20000)])
    ks = np.arange(1, 9)
    pmf = gamma * (1 - gamma) ** (ks - 1) if eta == 1.0 else (1 - gamma) ** ks / (ks * math.log(1 / gamma))
    observed = np.array([np.sum(draws == k) for k in ks] + [np.sum(draws > ks[-1])])
    expected = draws.size * np.append(pmf, 1 - pmf.sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0, -0.5])
def test_corollary3_pure_dp_search_is_two_plus_eta_epsilon(eta: float) -> None:
    """Corollary 3 (section 3.1): an eps-DP base gives a ((2 + eta) eps)-DP search; eta = 0 gives
    2 eps, eta = 1 Liu and Talwar's 3 eps. An eps-DP base is (lambda, eps)-RDP at every order;
    at lambda = lambda_hat = 1e12 Theorem 2 is (2 + eta) eps up to O(1e-11)."""
    eps = 0.5
    bound = truncated_negative_binomial_tuning_rdp(np.array([eps, eps]), np.array([2.0, 1e12]), eta=eta, gamma=0.01)
    assert bound[-1] == pytest.approx((2 + eta) * eps, rel=1e-9)


@pytest.mark.parametrize(
    ("rho", "gamma", "eta"), [(0.1, 0.05, 0.0), (0.5, 0.01, 1.0), (0.02, 0.1, 0.5), (0.05, 0.2, -0.5), (1.0, 1e-4, 2.0)]
)
def test_corollary4_zcdp_base(rho: float, gamma: float, eta: float) -> None:
    """Corollary 4: a rho-zCDP base (RDP rho lambda) with rho <= log(1/gamma) gives
    eps' = rho (lambda - 1) + log(E[K])/(lambda - 1) + 2 (1 + eta) sqrt(rho log(1/gamma)) - eta rho
    (lambda_hat = sqrt(log(1/gamma)/rho)), which at lambda = 1 + sqrt(log(E[K])/rho) is
    2 sqrt(rho log E[K]) + 2 (1 + eta) sqrt(rho log(1/gamma)) - eta rho. E[K] by hand."""
    log_inv_gamma = math.log(1 / gamma)
    if eta == 0.0:
        mean = (1 / gamma - 1) / log_inv_gamma
    else:
        mean = eta * (1 - gamma) / (gamma * (1 - gamma**eta))
    lam_hat = math.sqrt(log_inv_gamma / rho)
    lam_star = 1 + math.sqrt(math.log(mean) / rho)
    orders = np.array(sorted({1.5, 2.0, 4.0, lam_hat, lam_star, 50.0}))
    bound = truncated_negative_binomial_tuning_rdp(rho * orders, orders, eta=eta, gamma=gamma)
    constant = 2 * (1 + eta) * math.sqrt(rho * log_inv_gamma) - eta * rho
    expected = rho * (orders - 1) + math.log(mean) / (orders - 1) + constant
    np.testing.assert_allclose(bound, expected, rtol=1e-12)
    at_star = bound[list(orders).index(lam_star)]
    assert at_star == pytest.approx(2 * math.sqrt(rho * math.log(mean)) + constant, rel=1e-12)


def _exact_search_rdp(p_scores: np.ndarray, q_scores: np.ndarray, pgf, alpha: float, p_zero: float) -> float:  # type: ignore[no-untyped-def]
    """The exact D_alpha between the outputs of best-of-K on two neighbours whose base outputs
    are scores with PMFs p_scores and q_scores on an ordered set (index = score), with
    P[max <= x] = pgf(F(x)); K = 0 (probability p_zero) outputs a separate symbol."""
    mpmath.mp.dps = 40

    def output_pmf(pmf: np.ndarray) -> list:  # type: ignore[type-arg]
        cdf = [mpmath.mpf(0)] + list(np.cumsum([mpmath.mpf(float(x)) for x in pmf]))
        masses = [pgf(cdf[i + 1]) - pgf(cdf[i]) for i in range(len(pmf))]
        return ([mpmath.mpf(p_zero)] if p_zero > 0 else []) + masses

    p_out, q_out = output_pmf(p_scores), output_pmf(q_scores)
    a = mpmath.mpf(alpha)

    def divergence(p, q):  # type: ignore[no-untyped-def]
        return mpmath.log(sum(pi**a * qi ** (1 - a) for pi, qi in zip(p, q) if pi > 0)) / (a - 1)

    return float(max(divergence(p_out, q_out), divergence(q_out, p_out)))


def _base_rdp(p_scores: np.ndarray, q_scores: np.ndarray, orders: np.ndarray) -> np.ndarray:
    mpmath.mp.dps = 40
    out = []
    for alpha in orders:
        a = mpmath.mpf(float(alpha))
        values = []
        for p, q in ((p_scores, q_scores), (q_scores, p_scores)):
            values.append(
                mpmath.log(sum(mpmath.mpf(float(x)) ** a * mpmath.mpf(float(y)) ** (1 - a) for x, y in zip(p, q))) / (a - 1)
            )
        out.append(float(max(values)))
    return np.array(out)


TOY_P = np.array([0.30, 0.30, 0.25, 0.15])  # base output distribution (4 ordered scores) on D
TOY_Q = np.array([0.36, 0.31, 0.21, 0.12])  # on a neighbouring D'
TOY_ORDERS = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0])


@pytest.mark.parametrize(("eta", "gamma"), [(1.0, 0.1), (0.0, 0.05), (0.5, 0.02), (-0.5, 0.1)])
def test_theorem2_bounds_the_exact_divergence_of_a_toy_search(eta: float, gamma: float) -> None:
    """Independent check of validity: brute-force the exact Renyi divergence of best-of-K for a
    small base mechanism and assert Theorem 2's bound (as we evaluate it) is above it."""
    base = _base_rdp(TOY_P, TOY_Q, TOY_ORDERS)
    bound = truncated_negative_binomial_tuning_rdp(base, TOY_ORDERS, eta=eta, gamma=gamma)
    e, g = mpmath.mpf(eta), mpmath.mpf(gamma)

    def pgf(s):  # type: ignore[no-untyped-def]
        if eta == 0:
            return mpmath.log(1 - (1 - g) * s) / mpmath.log(g)
        return ((1 - (1 - g) * s) ** (-e) - 1) / (g ** (-e) - 1)

    for alpha, value in zip(TOY_ORDERS, bound):
        exact = _exact_search_rdp(TOY_P, TOY_Q, pgf, float(alpha), 0.0)
        assert exact <= value
    assert np.all(bound >= base)


@pytest.mark.parametrize("mean", [0.5, 3.0, 10.0])
def test_poisson_theorem_bounds_the_exact_divergence_of_a_toy_search(mean: float) -> None:
    base = _base_rdp(TOY_P, TOY_Q, TOY_ORDERS)
    bound = poisson_tuning_rdp(base, TOY_ORDERS, mean=mean)
    m = mpmath.mpf(mean)
    for alpha, value in zip(TOY_ORDERS, bound):
        exact = _exact_search_rdp(TOY_P, TOY_Q, lambda s: mpmath.e ** (m * (s - 1)), float(alpha), float(mpmath.e ** (-m)))
        assert exact <= value


def test_poisson_theorem6_expression_fails_for_small_mean() -> None:
    """Papernot and Steinke 2022, Theorem 6's expression eps + mean delta_hat + log(mean)/(lambda - 1)
    is below the exact divergence of the toy search at mean 0.5, lambda 1.5; ours is above it."""
    base = _base_rdp(TOY_P, TOY_Q, TOY_ORDERS)
    m = mpmath.mpf(0.5)
    exact = _exact_search_rdp(TOY_P, TOY_Q, lambda s: mpmath.e ** (m * (s - 1)), 1.5, float(mpmath.e ** (-m)))
    delta_hat = rdp_to_delta(base, TOY_ORDERS, math.log1p(1 / 0.5))
    short = base[0] + 0.5 * delta_hat + math.log(0.5) / 0.5
    assert short < exact <= poisson_tuning_rdp(base, TOY_ORDERS, mean=0.5)[0]


@pytest.mark.parametrize("mean", [0.05, 0.5, 0.99, 1.0, 3.0])
def test_poisson_identical_neighbours_cost_nothing(mean: float) -> None:
    """Identical output laws (eps = 0 at every order, delta_hat = 0): the search's divergence is
    exactly 0. Theorem 6's expression gives log(mean)/(lambda - 1), negative (so invalid) for
    mean < 1; ours gives 0."""
    orders = np.array([1.5, 2.0, 10.0])
    ours = poisson_tuning_rdp(np.zeros(3), orders, mean=mean, base_delta=lambda eps_hat: 0.0)
    assert np.all(ours == 0.0)
    theorem6 = np.log(mean) / (orders - 1)
    assert np.all(theorem6 < 0) if mean < 1 else np.all(theorem6 >= 0)


def _laplace_rdp(eps: float, alpha: float) -> float:
    """Mironov 2017, Prop. 6: D_alpha of Laplace(0, 1/eps) from Laplace(1, 1/eps), by hand."""
    return eps + math.log1p((alpha - 1) * math.expm1(-(2 * alpha - 1) * eps) / (2 * alpha - 1)) / (alpha - 1)


@pytest.mark.parametrize(("eps", "mean"), [(1.0, 1.0), (0.1, 2.0), (1.0, 10.0), (2.0, 1000.0), (0.5, 1e6)])
def test_poisson_pure_dp_case_of_theorem6(eps: float, mean: float) -> None:
    """Theorem 6 for an eps-DP base (Laplace) at lambda = 1 + 1/(e^eps - 1), where the condition
    e^eps_hat <= 1 + 1/(lambda - 1) allows eps_hat = eps, so delta_hat = 0 and the paper's bound is
    eps(lambda) + log(mean) (e^eps - 1). Ours is the derived log1p(mean (e^((lambda-1) eps(lambda))
    - 1))/(lambda - 1) (evaluated here in mpmath), at most the paper's for mean >= 1."""
    lam = 1 + 1 / math.expm1(eps)
    rdp = _laplace_rdp(eps, lam)
    theorem6 = rdp + math.log(mean) * math.expm1(eps)
    ours = poisson_tuning_rdp(np.array([rdp]), np.array([lam]), mean=mean, base_delta=lambda e: 0.0)[0]
    mpmath.mp.dps = 30
    a = mpmath.mpf(lam)
    expected = mpmath.log1p(mean * mpmath.expm1((a - 1) * mpmath.mpf(rdp))) / (a - 1)
    assert ours == pytest.approx(float(expected), rel=1e-12)
    assert ours <= theorem6
    # The two differ by log(1 - e^(-(lambda-1) eps(lambda)) (1 - 1/mean))/(lambda - 1) <= 0.
    gap = math.log1p(-math.exp(-(lam - 1) * rdp) * (1 - 1 / mean)) / (lam - 1)
    assert ours - theorem6 == pytest.approx(gap, rel=1e-9, abs=1e-12)


def test_poisson_bound_against_direct_evaluation() -> None:
    """Our Poisson bound evaluated independently in mpmath for a Gaussian base: delta_hat from
    the CKS conversion of the base curve at eps_hat = log(1 + 1/(lambda - 1)); it is below both
    Theorem 6's expression (mean = 8 >= 1) and the bound with only the K = 0 term added."""
    base = 500 * ORDERS / (2 * 25.0**2)
    ours = poisson_tuning_rdp(base, ORDERS, mean=8.0)
    mpmath.mp.dps = 30
    for index in (0, 50, 120):
        lam = mpmath.mpf(float(ORDERS[index]))
        eps = mpmath.mpf(float(base[index]))
        eps_hat = mpmath.log(1 + 1 / (lam - 1))
        delta_hat = min(
            mpmath.mpf(1),
            min(
                mpmath.e ** ((mpmath.mpf(float(a)) - 1) * (mpmath.mpf(float(b)) - eps_hat))
                * (1 - 1 / mpmath.mpf(float(a))) ** (mpmath.mpf(float(a)) - 1)
                / mpmath.mpf(float(a))
                for a, b in zip(ORDERS, base)
            ),
        )
        expected = mpmath.log1p(8 * mpmath.e ** (8 * (lam - 1) * delta_hat) * mpmath.expm1((lam - 1) * eps)) / (lam - 1)
        assert ours[index] == pytest.approx(float(expected), rel=1e-9)
        theorem6 = eps + 8 * delta_hat + mpmath.log(8) / (lam - 1)
        with_k0 = mpmath.log(mpmath.e ** (-8) + 8 * mpmath.e ** ((lam - 1) * (eps + 8 * delta_hat))) / (lam - 1)
        assert ours[index] <= float(theorem6) <= float(with_k0)


def test_rdp_to_delta_is_valid_for_the_gaussian() -> None:
    # The exact Gaussian delta(eps) for mu = 1/sigma is below the RDP conversion.
    sigma, epsilon = 2.0, 1.0
    mu = 1 / sigma
    exact = stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
    converted = rdp_to_delta(ORDERS / (2 * sigma**2), ORDERS, epsilon)
    assert exact <= converted < 3 * exact


# ---------------------------------------------------------------------------- events
def test_tuning_events_validate_and_round_trip() -> None:
    base = Repeated(PoissonSampled(Gaussian(1.1), 0.01), 1000)
    events = [
        PureDP(1.0),
        DisjointParts((base, PureDP(0.5))),
        RandomChoice((base, Repeated(PoissonSampled(Gaussian(2.0), 0.01), 500))),
        TruncatedNegativeBinomialTuning(base, 1.0, 0.1),
        PoissonTuning(base, 10.0),
    ]
    for event in events:
        assert event_from_dict(event_to_dict(event)) == event
        hash(event)
    with pytest.raises(ValueError, match=r"eta must be in \(-1, inf\)"):
        TruncatedNegativeBinomialTuning(base, -1.0, 0.1)
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\)"):
        TruncatedNegativeBinomialTuning(base, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"mean must be in \(0, inf\)"):
        PoissonTuning(base, 0.0)
    with pytest.raises(ValueError, match="epsilon must be a finite number"):
        PureDP(float("inf"))
    with pytest.raises(ValueError, match=r"epsilon must be in \(0, inf\)"):
        PureDP(0.0)
    with pytest.raises(ValueError, match="at least one"):
        DisjointParts(())
    with pytest.raises(TypeError):
        RandomChoice((base, 3))  # type: ignore[arg-type]


# ------------------------------------------------------------------------ procedures
def test_partition_is_a_partition_with_equal_expected_sizes() -> None:
    parts = partition(10000, 5, np.random.default_rng(0))
    together = np.sort(np.concatenate(parts))
    assert np.array_equal(together, np.arange(10000))
    sizes = np.array([len(p) for p in parts])
    assert stats.chisquare(sizes).pvalue > 1e-3


def test_select_partitioned_event_and_choice() -> None:
    rng = np.random.default_rng(5)
    candidates = [0.1, 0.5, 0.9]
    seen: list[np.ndarray] = []

    def train(candidate: float, indices: np.ndarray) -> float:
        seen.append(indices)
        return candidate

    def event_of(candidate: float) -> PoissonSampled:
        return PoissonSampled(Gaussian(1.0 + candidate), 0.05)

    def score(model: float, holdout: np.ndarray) -> float:
        return 100.0 * model  # the best is clear at epsilon = 1

    result = select_partitioned(
        train, candidates, candidate_event=event_of, num_records=400, score_fn=score, epsilon=1.0, rng=rng
    )
    assert result.index == 2 and result.candidate == 0.9 and result.model == 0.9 and result.runs == 3
    assert result.event == DisjointParts((*[event_of(c) for c in candidates], PureDP(1.0)))
    assert len(seen) == 3 and not set(seen[0]) & set(seen[1])
    assert select(train, candidates, method="partitioned", candidate_event=event_of, num_records=400,
                  score_fn=score, epsilon=1.0, rng=np.random.default_rng(5)).event == result.event


def test_select_random_repetitions_releases_the_best_run() -> None:
    rng = np.random.default_rng(9)
    runs_seen: list[int] = []

    def train(candidate: int) -> tuple[int, float]:
        runs_seen.append(candidate)
        return candidate, float(candidate)

    base = Repeated(PoissonSampled(Gaussian(1.0), 0.01), 100)
    result = select_random_repetitions(
        train, [1, 2, 3, 4], candidate_event=lambda c: base, rng=rng, gamma=0.2
    )
    assert result.runs == len(runs_seen) >= 1
    assert result.candidate == max(runs_seen) == result.model
    # K is the search's secret randomness: not in the result's repr (printing it is common)
    assert "runs" not in repr(result) and f"={result.runs})" not in repr(result)
    assert result.event == TruncatedNegativeBinomialTuning(base, 1.0, 0.2)
    mixed = select_random_repetitions(
        train, [1, 2], candidate_event=lambda c: Repeated(PoissonSampled(Gaussian(float(c)), 0.01), 100),
        rng=rng, distribution="poisson", mean=3.0,
    )
    assert isinstance(mixed.event, PoissonTuning) and isinstance(mixed.event.base, RandomChoice)
    with pytest.raises(ValueError, match="gamma must be given"):
        select_random_repetitions(train, [1], candidate_event=lambda c: base, rng=rng)
    with pytest.raises(ValueError, match="distribution must be"):
        select_random_repetitions(train, [1], candidate_event=lambda c: base, rng=rng, distribution="uniform")


def test_poisson_search_can_run_nothing() -> None:
    rng = np.random.default_rng(0)
    base = PoissonSampled(Gaussian(1.0), 0.01)
    results = [
        select_random_repetitions(lambda c: (c, 0.0), ["a"], candidate_event=lambda c: base, rng=rng,
                                  distribution="poisson", mean=0.05)
        for _ in range(50)
    ]
    empty = [r for r in results if r.runs == 0]
    assert empty and all(r.index == -1 and r.candidate is None for r in empty)


def _tnb_pgf(eta: float, gamma: float):  # type: ignore[no-untyped-def]
    """E[s^K] for K ~ D_{eta, gamma}: ((1 - (1-gamma) s)^(-eta) - 1)/(gamma^(-eta) - 1), or
    log(1 - (1-gamma) s)/log(gamma) for eta = 0."""
    e, g = mpmath.mpf(eta), mpmath.mpf(gamma)
    if eta == 0:
        return lambda s: mpmath.log(1 - (1 - g) * s) / mpmath.log(g)
    return lambda s: ((1 - (1 - g) * s) ** (-e) - 1) / (g ** (-e) - 1)


def _poisson_pgf(mean: float):  # type: ignore[no-untyped-def]
    m = mpmath.mpf(mean)
    return lambda s: mpmath.e ** (m * (s - 1))


@pytest.mark.parametrize("seed", range(6))
def test_search_bounds_hold_for_random_toy_mechanisms(seed: int) -> None:
    """Random base pairs (5 ordered outputs, likelihood ratios up to ~e^1.5): the exact
    divergence of the best-of-K search never exceeds either bound, for several distributions."""
    rng = np.random.default_rng(1000 + seed)
    p = rng.dirichlet(np.ones(5))
    q = p * np.exp(rng.uniform(-0.75, 0.75, size=5))
    q /= q.sum()
    base = _base_rdp(p, q, TOY_ORDERS)
    for eta, gamma in ((1.0, 0.05), (0.0, 0.2), (-0.3, 0.1)):
        pgf = _tnb_pgf(eta, gamma)
        bound = truncated_negative_binomial_tuning_rdp(base, TOY_ORDERS, eta=eta, gamma=gamma)
        for alpha, value in zip(TOY_ORDERS, bound):
            assert _exact_search_rdp(p, q, pgf, float(alpha), 0.0) <= value
    for mean in (0.3, 2.0, 20.0):
        bound = poisson_tuning_rdp(base, TOY_ORDERS, mean=mean)
        poisson_pgf = _poisson_pgf(mean)
        for alpha, value in zip(TOY_ORDERS, bound):
            exact = _exact_search_rdp(p, q, poisson_pgf, float(alpha), float(mpmath.e ** (-mean)))
            assert exact <= value
