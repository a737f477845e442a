"""ZCDPAccountant and the zCDP conversions (Bun and Steinke 2016; Canonne, Kamath, Steinke 2020;
Yu et al. 2019). Known answers: Yu et al. 2019, zCDP with batching."""

from __future__ import annotations

import math

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsharp
from dpsharp.accountants.zcdp import (
    SAMPLING_WARNING,
    ZCDPAccountant,
    zcdp_delta,
    zcdp_epsilon,
    zcdp_epsilon_bun_steinke,
    zcdp_epsilon_cks,
)
from dpsharp.composition import classical_gaussian_epsilon, classical_gaussian_sigma
from dpsharp.events import Gaussian, Laplace, PoissonSampled, Shuffled
from dpsharp.tradeoff import gdp_epsilon

Q, SIGMA, EPOCHS, DELTA = 0.01, 6.0, 400, 1e-5
N = 10000
BATCH = int(Q * N)


def test_reshuffling_400_epochs_reference() -> None:
    """Yu et al. 2019: zCDP random reshuffling, rho = epochs / (2 sigma^2), eps 21.551 (paper 21.5).

    Reshuffling is stated under zero-out (a record replaced by a null record): the clipped sum
    has sensitivity C there, as in the paper's analysis, so the paper's numbers carry over; an
    add/remove accountant refuses the epoch (tests/test_soundness_sampling.py)."""
    acc = ZCDPAccountant(batching="reshuffle", neighbouring="zero_out")
    acc.compose(Shuffled(Gaussian(SIGMA), BATCH, N), EPOCHS)
    assert acc.rho == pytest.approx(EPOCHS / (2 * SIGMA**2), rel=1e-15)
    guarantee = acc.guarantee(DELTA)
    assert round(guarantee.details["epsilon_bun_steinke"], 3) == 21.551
    assert round(acc.epsilon_bun_steinke(DELTA), 3) == 21.551
    # the reported epsilon is the better (CKS 2020) conversion, still a certified bound
    assert guarantee.certified and guarantee.warning is None
    assert guarantee.epsilon == acc.epsilon_cks(DELTA) < 21.551
    # ...and never below the exact epsilon of the equivalent Gaussian (mu^2 = 2 rho):
    # every conversion >= the exact Gaussian epsilon
    assert guarantee.epsilon >= gdp_epsilon(DELTA, math.sqrt(2 * acc.rho))


def test_epoch_costs_one_batch_not_the_sum() -> None:
    """Theorem 2: the 100 disjoint batches of an epoch cost max rho = 1/(2 sigma^2)."""
    epoch = Shuffled(Gaussian(SIGMA), BATCH, N)
    one_epoch = ZCDPAccountant(neighbouring="zero_out").compose(epoch)
    one_step = ZCDPAccountant().compose(Gaussian(SIGMA))
    with pytest.raises(dpsharp.UnsupportedEventError, match="zero_out"):
        ZCDPAccountant().compose(epoch)
    assert one_epoch.rho == one_step.rho == pytest.approx(1 / 72)
    hundred_steps = ZCDPAccountant().compose(Gaussian(SIGMA), 100)
    assert hundred_steps.rho == pytest.approx(100 / 72)


def test_sigma_6_classical_calibration_and_rho() -> None:
    """Yu et al. 2019: sigma = 6 is (0.808, 1e-5)-DP by sigma = sqrt(2 log(1.25/delta))/eps, and
    rho = 0.0139-zCDP."""
    # eps = sqrt(2 log(1.25e5))/6 = 0.80747: the paper rounds up to 0.808, the smallest
    # 3-decimal epsilon that sigma = 6 guarantees (0.807 would need sigma > 6).
    assert math.ceil(classical_gaussian_epsilon(SIGMA, DELTA) * 1000) / 1000 == 0.808
    assert classical_gaussian_sigma(0.808, DELTA) <= SIGMA < classical_gaussian_sigma(0.807, DELTA)
    assert round(ZCDPAccountant().compose(Gaussian(SIGMA)).rho, 4) == 0.0139


def test_random_sampling_theorem_3_reference() -> None:
    """Yu et al. 2019, zCDP(RS): Theorem 3 with P = q^2/sigma^2, T = 40000, q = 0.01, sigma = 6:
    rho_hat = T q^2 / sigma^2 = 1/9, U = sigma^2 log(1/(q sigma)) + 1 = 102.28, delta >=
    exp(-rho_hat (U-1)^2) so case (15): rho_hat + 2 sqrt(rho_hat log(1/delta)) = 2.373, the
    paper's 2.37 (this is the computation)."""
    acc = ZCDPAccountant(batching="sample").compose(PoissonSampled(Gaussian(SIGMA), Q), 40000)
    assert acc.rho == pytest.approx(40000 * Q**2 / SIGMA**2, rel=1e-14)
    assert acc.alpha_max == pytest.approx(SIGMA**2 * math.log(1 / (Q * SIGMA)) + 1)
    guarantee = acc.guarantee(DELTA)
    assert round(guarantee.details["epsilon_bun_steinke"], 2) == 2.37
    assert guarantee.certified is False
    assert guarantee.warning == SAMPLING_WARNING and "empirical" in guarantee.warning
    assert guarantee.epsilon <= guarantee.details["epsilon_bun_steinke"]


def test_theorem_3_case_16_when_alpha_star_exceeds_u() -> None:
    # small rho_hat and tiny delta: alpha* = 1 + sqrt(log(1/delta)/rho) > U -> (16)
    rho, u, delta = 0.001, 20.0, 1e-10
    assert 1 + math.sqrt(math.log(1 / delta) / rho) > u
    expected = rho * u + math.log(1 / delta) / (u - 1)
    assert zcdp_epsilon_bun_steinke(rho, delta, alpha_max=u) == pytest.approx(expected)


def test_random_sampling_refused_outside_stated_range() -> None:
    acc = ZCDPAccountant(batching="sample")
    # q <= 1/(16 sigma) = 1/96 for sigma = 6: q = 0.02 is outside
    with pytest.raises(dpsharp.UnsupportedEventError, match=r"q <= 1/\(16 sigma\)"):
        acc.compose(PoissonSampled(Gaussian(SIGMA), 0.02))
    with pytest.raises(dpsharp.UnsupportedEventError, match="Gaussian"):
        acc.compose(PoissonSampled(Laplace(1.0), 0.001))
    assert acc.is_empty


def test_poisson_refused_under_reshuffling() -> None:
    """A Poisson step is not a reshuffled batch."""
    with pytest.raises(dpsharp.UnsupportedEventError, match="batching='sample'"):
        ZCDPAccountant(batching="reshuffle").compose(PoissonSampled(Gaussian(SIGMA), Q))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 6.0])
def test_zcdp_of_gaussian_equals_rdp_over_alpha(sigma: float) -> None:
    """Gaussian RDP is alpha / (2 sigma^2) (Mironov 2017, closed form),
    so the zCDP parameter is RDP(alpha)/alpha for every alpha."""
    acc = ZCDPAccountant().compose(Gaussian(sigma))
    for alpha in (1.5, 2.0, 10.0, 64.0):
        rdp = alpha / (2 * sigma**2)
        assert acc.rho == pytest.approx(rdp / alpha, rel=1e-15)


@pytest.mark.peers
def test_zcdp_of_gaussian_matches_dp_accounting_rdp() -> None:
    rdp_module = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    orders = [1.5, 2.0, 8.0, 32.0]
    for sigma in (0.7, 2.0):
        peer = rdp_module.RdpAccountant(orders)
        peer.compose(dp_event.GaussianDpEvent(sigma), 5)
        ours = ZCDPAccountant().compose(Gaussian(sigma), 5)
        for order, rdp in zip(orders, peer._rdp):
            assert rdp / order == pytest.approx(ours.rho, rel=1e-12)


def test_laplace_rho() -> None:
    # (1/b)-DP => (1/(2 b^2))-zCDP (Bun and Steinke 2016, Proposition 1.4)
    assert ZCDPAccountant().compose(Laplace(2.0), 3).rho == pytest.approx(3 / 8)


def test_conversions_closed_forms() -> None:
    rho, delta = 0.5, 1e-6
    assert zcdp_epsilon_bun_steinke(rho, delta) == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    # CKS at its optimum alpha beats Bun-Steinke; brute force over a fine alpha grid agrees
    cks = zcdp_epsilon_cks(rho, delta)
    grid = [1 + 10 ** (k / 5000) for k in range(-30000, 20000)]
    brute = min(
        a * rho + (math.log(1 / delta) + (a - 1) * math.log1p(-1 / a) - math.log(a)) / (a - 1) for a in grid
    )
    assert cks == pytest.approx(brute, rel=1e-8) and cks <= brute + 1e-12
    assert zcdp_epsilon(rho, delta) == cks < zcdp_epsilon_bun_steinke(rho, delta)
    # delta(eps) of Bun-Steinke: exp(-(eps - rho)^2 / (4 rho)) is an upper bound on ours
    eps = 5.0
    assert zcdp_delta(rho, eps) <= math.exp(-((eps - rho) ** 2) / (4 * rho)) * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    rho=st.floats(min_value=1e-4, max_value=50.0),
    log10_delta=st.floats(min_value=-14.0, max_value=-1.0),
)
def test_conversions_round_trip_and_beat_exact_gaussian(rho: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    eps = zcdp_epsilon(rho, delta)
    # delta(eps(delta)) <= delta (both conversions are the same family of bounds)
    assert zcdp_delta(rho, eps) <= delta * (1 + 1e-6)
    # never below the exact Gaussian with the same rho (mu^2 = 2 rho)
    assert eps >= gdp_epsilon(delta, math.sqrt(2 * rho)) * (1 - 1e-9)


def test_checkpoint_and_options() -> None:
    acc = ZCDPAccountant(batching="sample").compose(PoissonSampled(Gaussian(SIGMA), Q), 123)
    restored = ZCDPAccountant(batching="sample")
    restored.load_state_dict(acc.state_dict())
    assert restored.rho == acc.rho and restored.alpha_max == acc.alpha_max
    assert restored.epsilon(DELTA) == acc.epsilon(DELTA)
    with pytest.raises(ValueError, match="options"):
        ZCDPAccountant(batching="reshuffle").load_state_dict(acc.state_dict())


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="batching"):
        ZCDPAccountant(batching="poisson")
    with pytest.raises(ValueError, match="rho"):
        zcdp_epsilon(-1.0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        zcdp_epsilon(1.0, 0.0)
    with pytest.raises(ValueError, match="epsilon"):
        zcdp_delta(1.0, -1.0)
    with pytest.raises(ValueError, match="delta"):
        ZCDPAccountant().compose(Gaussian(1.0)).epsilon(float("nan"))


def test_empty() -> None:
    acc = ZCDPAccountant()
    assert acc.rho == 0.0 and acc.epsilon(1e-5) == 0.0 and acc.delta(1.0) == 0.0
    assert isinstance(dpsharp.accountant("zcdp", batching="sample"), ZCDPAccountant)


def test_random_sampling_heterogeneous_composition_case_2() -> None:
    """Theorem 3, composition case 2: rho_hat = sum_i P(q_i, sigma_i), alpha limited to
    min_i U(q_i, sigma_i); plain Gaussians add their rho and impose no limit."""
    acc = ZCDPAccountant(batching="sample")
    acc.compose(PoissonSampled(Gaussian(6.0), 0.01), 1000)
    acc.compose(PoissonSampled(Gaussian(3.0), 0.02), 500)
    acc.compose(Gaussian(20.0), 2)
    expected_rho = 1000 * 0.01**2 / 36 + 500 * 0.02**2 / 9 + 2 / 800
    expected_u = min(36 * math.log(1 / 0.06) + 1, 9 * math.log(1 / 0.06) + 1)
    assert acc.rho == pytest.approx(expected_rho, rel=1e-14)
    assert acc.alpha_max == pytest.approx(expected_u)
    eps = acc.epsilon(DELTA)
    assert zcdp_delta(acc.rho, eps, alpha_max=acc.alpha_max) <= DELTA * (1 + 1e-6)
    assert acc.delta(eps) <= DELTA * (1 + 1e-6)


@settings(max_examples=30, deadline=None)
@given(
    rho=st.floats(min_value=1e-4, max_value=5.0),
    u=st.floats(min_value=1.5, max_value=500.0),
    log10_delta=st.floats(min_value=-14.0, max_value=-1.0),
)
def test_restricted_conversions_round_trip(rho: float, u: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    eps = zcdp_epsilon(rho, delta, alpha_max=u)
    assert zcdp_delta(rho, eps, alpha_max=u) <= delta * (1 + 1e-6)
    # restricting alpha can only cost: never below the unrestricted bound
    assert eps >= zcdp_epsilon(rho, delta) * (1 - 1e-9)


def test_replace_one_relation() -> None:
    """Under replace-one the noise is stated relative to that relation's sensitivity, so a
    Gaussian or a Shuffled epoch is accounted the same; Poisson sampling (an add/remove
    analysis) is refused by the base class."""
    acc = ZCDPAccountant(neighbouring="replace_one").compose(Shuffled(Gaussian(SIGMA), BATCH, N), 2)
    assert acc.rho == pytest.approx(2 / 72)
    with pytest.raises(dpsharp.UnsupportedEventError, match="add_remove"):
        ZCDPAccountant(batching="sample", neighbouring="replace_one").compose(PoissonSampled(Gaussian(SIGMA), Q))
    assert dpsharp.GDPAccountant(neighbouring="replace_one").compose(Gaussian(1.0)).mu == 1.0
    assert dpsharp.ClassicAccountant(neighbouring="replace_one").neighbouring.value == "replace_one"


@pytest.mark.parametrize(
    ("schedule", "epochs_ref"),
    [
        (lambda t: 8.0, 100),
        (lambda t: 10.0 / (1 + 0.05 * t), 38),
        (lambda t: 10.0 * 0.6 ** (t // 10), 31),
        (lambda t: 10.0 * math.exp(-0.01 * t), 71),
        (lambda t: (10.0 - 2.0) * (1 - t / 100) ** 3 + 2.0, 44),
    ],
)
def test_table_ii_dynamic_budget_epochs(schedule, epochs_ref: int) -> None:  # type: ignore[no-untyped-def]
    """Table II of Yu et al. 2019: budget rho = 0.78125, one sigma_t per epoch
    (t from 0), reshuffling accounting, stop before the epoch whose cost would exceed it."""
    budget = 0.78125
    acc = ZCDPAccountant(neighbouring="zero_out")
    epoch = 0
    while True:
        trial = ZCDPAccountant(neighbouring="zero_out")
        trial.load_state_dict(acc.state_dict())
        trial.compose(Shuffled(Gaussian(schedule(epoch)), 256, 60000))
        if trial.rho > budget:
            break
        acc, epoch = trial, epoch + 1
    assert epoch == epochs_ref


def test_delta_of_a_huge_rho_is_one_not_an_overflow() -> None:
    """rho = 5 / (2 sigma^2) = 2.5e20 (sigma = 1e-10): the bound's exponent passes 709 and
    delta(epsilon) is 1 (no privacy) for any epsilon below rho."""
    accountant = dpsharp.accountant("zcdp").compose(Gaussian(1e-10), 5)
    assert accountant.rho == pytest.approx(2.5e20, rel=1e-12)
    assert accountant.delta(1.0) == 1.0
    assert accountant.delta(1e6) == 1.0


def test_random_sampling_is_refused_below_sigma_one() -> None:
    """Theorem 3's P = q^2/sigma^2 comes from Abadi et al. 2016's Lemma 3, stated for sigma >= 1
    and q < 1/(16 sigma). Below sigma = 1 the exact RDP is far above alpha P: at sigma = 0.5,
    q = 1e-3 and alpha = U = sigma^2 log(1/(q sigma)) + 1 the exact divergence (the RDP
    accountant's, accurate to 1e-10 against mpmath) is about 12 times U q^2 / sigma^2."""
    sigma, q = 0.5, 1e-3
    alpha_max = sigma**2 * math.log(1.0 / (q * sigma)) + 1.0
    exact = dpsharp.rdp.poisson_gaussian_rdp(q, sigma, [alpha_max])[0]
    assert exact > 10.0 * alpha_max * q**2 / sigma**2
    with pytest.raises(dpsharp.UnsupportedEventError, match="stated for sigma >= 1"):
        ZCDPAccountant(batching="sample").compose(PoissonSampled(Gaussian(sigma), q))
    # sigma = 1 is inside the stated range
    ZCDPAccountant(batching="sample").compose(PoissonSampled(Gaussian(1.0), 1.0 / 16.0))


def _exact_gaussian_delta(epsilon: float, sigma: float) -> mpmath.mpf:
    """delta(eps) of the Gaussian mechanism with noise multiplier sigma (Balle and Wang 2018,
    Theorem 8), mu = 1 / sigma: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), 80 digits."""
    with mpmath.workdps(80):
        mu, eps = 1 / mpmath.mpf(sigma), mpmath.mpf(epsilon)
        return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize(("sigma", "delta"), [(1e-20, 1e-5), (5.011872336272715e-16, 1e-300),
                                              (1e-18, 1e-10), (1e-3, 1e-5)])
def test_epsilon_of_a_huge_rho_keeps_its_square_root_term(sigma: float, delta: float) -> None:
    """rho + 2 sqrt(rho log(1/delta)) rounded to nearest lost its second term above rho ~ 1e30:
    Gaussian(1e-20) answered epsilon = rho = 5e39, where the exact Gaussian delta is 1.0. The
    zCDP epsilon of a Gaussian release is an upper bound on its exact epsilon, so the exact
    delta at it must be within the target."""
    epsilon = dpsharp.ZCDPAccountant().compose(Gaussian(sigma)).epsilon(delta)
    assert _exact_gaussian_delta(epsilon, sigma) <= delta


def test_delta_of_a_large_rho_is_not_below_the_exact_minimum() -> None:
    """zcdp_delta at rho = 1e14: (alpha - 1)(alpha rho - epsilon) cancels, and the value read
    1.2e-8 relative below the exact minimum over alpha of the Canonne-Kamath-Steinke bound
    (golden-section search in mpmath at 60 digits)."""
    rho = 1e14
    epsilon = ZCDPAccountant().compose(dpsharp.events.ZCDP(rho)).epsilon(1e-5)
    with mpmath.workdps(60):
        r, e = mpmath.mpf(rho), mpmath.mpf(epsilon)

        def log_cks(t: mpmath.mpf) -> mpmath.mpf:
            a = 1 + mpmath.exp(t)
            return (a - 1) * (a * r - e) + (a - 1) * mpmath.log(1 - 1 / a) - mpmath.log(a)

        low, high = mpmath.mpf(-40), mpmath.mpf(0)
        golden = (mpmath.sqrt(5) - 1) / 2
        for _ in range(200):
            left, right = high - golden * (high - low), low + golden * (high - low)
            low, high = (low, right) if log_cks(left) < log_cks(right) else (left, high)
        exact = mpmath.exp(log_cks((low + high) / 2))
    assert exact <= zcdp_delta(rho, epsilon) <= exact * (1 + 1e-6)


@pytest.mark.parametrize("delta", [1e-10, 1e-300])
def test_delta_of_epsilon_is_within_the_target_where_the_best_order_is_huge(delta: float) -> None:
    """A tiny rho puts the best Renyi order far beyond the searched orders (rho = 1e-30: about
    1e16; random sampling at sigma = 1e6, q = 1e-9 restricts it to U = 7e12): delta stopped at
    the search's end, 1e8, and delta(epsilon(1e-10)) came out 37 times the target. Every order
    gives a valid delta, so the closed-form Bun-Steinke minimum and the restriction's end are
    candidates too."""
    for accountant in (ZCDPAccountant().compose(dpsharp.events.ZCDP(1e-30)),
                       ZCDPAccountant("sample").compose(PoissonSampled(Gaussian(1e6), 1e-9))):
        assert accountant.delta(accountant.epsilon(delta)) <= delta
