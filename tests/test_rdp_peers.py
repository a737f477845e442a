"""Cross-checks of the RDP accountant against dp-accounting 0.6.0 and opacus 1.6.0 (same
orders, same conversion). dp-accounting's RdpAccountant.get_epsilon uses the tight conversion
(Balle et al. 2020 / Canonne-Kamath-Steinke 2020 with the KL shortcut, orders > 1.01 only,
clamped at 0), which is dpsharp's conversion="tight"; opacus' get_privacy_spent uses the same
formula without the shortcut and the clamp.

Finding: both peers evaluate FRACTIONAL orders with a truncated series that is inaccurate in
dp-accounting 0.6.0 (e.g. q=0.01, sigma=1, alpha=1.1: +7.4% vs a 50-digit mpmath value, which
dpsharp matches to 1e-15; q=0.5, sigma=5, alpha=2.25: +50%; orders < 2 fail to converge for
q=0.1, sigma=0.8 and are dropped). Their errors are on the conservative side. So the 1e-6
agreement is asserted on integer orders (where all three are exact sums), and on the default
orders only where the peer's optimal order is accurate; test_peer_fractional_orders_are_off
documents the discrepancy against mpmath."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from dpsharp import Gaussian, PoissonSampled, RDPAccountant, SampledWithoutReplacement
from dpsharp.rdp import (
    DEFAULT_ORDERS,
    poisson_gaussian_rdp,
    sampled_without_replacement_gaussian_rdp,
)

pytestmark = pytest.mark.peers

SETTINGS = [
    (256 / 60000, 1.1, 10000),
    (0.01, 4.0, 10000),
    (0.01, 1.0, 1000),
    (0.1, 0.8, 100),
    (0.001, 0.6, 50000),
    (0.5, 5.0, 30),
]


INTEGER_ORDERS = [float(o) for o in range(2, 65)] + [80.0, 96.0, 128.0, 256.0, 512.0]


@pytest.mark.parametrize(("q", "sigma", "steps"), SETTINGS)
def test_epsilon_matches_dp_accounting(q: float, sigma: float, steps: int) -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    orders = INTEGER_ORDERS
    theirs = dp_accounting.rdp.RdpAccountant(orders)
    theirs.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    ours = RDPAccountant(orders, "tight").compose(PoissonSampled(Gaussian(sigma), q), steps)
    for delta in (1e-5, 1e-8):
        assert ours.epsilon(delta) == pytest.approx(theirs.get_epsilon(delta), rel=1e-6)
    for eps in (0.5, 2.0):
        if ours.delta(eps) < 1e-300:
            continue
        assert ours.delta(eps) == pytest.approx(theirs.get_delta(eps), rel=1e-6)


@pytest.mark.parametrize(("q", "sigma", "steps"), SETTINGS[:4])
def test_epsilon_matches_opacus(q: float, sigma: float, steps: int) -> None:
    pytest.importorskip("opacus")
    from opacus.accountants.analysis import rdp as opacus_rdp

    orders = INTEGER_ORDERS
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    with warnings.catch_warnings():  # opacus warns when the optimum is an end of the grid
        warnings.simplefilter("ignore", UserWarning)
        eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    ours = RDPAccountant(orders, "tight").compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert ours.epsilon(1e-5) == pytest.approx(eps, rel=1e-6)


def test_curves_match_dp_accounting_on_integer_orders() -> None:
    pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant as peer

    orders = np.array(INTEGER_ORDERS)
    for q, sigma in [(0.01, 1.0), (0.2, 0.7), (1e-4, 3.0), (0.9, 2.0)]:
        theirs = peer._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)
        np.testing.assert_allclose(poisson_gaussian_rdp(q, sigma, orders), theirs, rtol=1e-9)


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 4.0, 10000), (0.001, 0.6, 50000)])
def test_default_orders_match_dp_accounting_where_it_converges(q: float, sigma: float, steps: int) -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    # dp-accounting's fractional-order series is off by ~2e-4 relative at orders such as 3.9
    # (test_peer_fractional_orders_are_off), where the default grid's optimum can lie now:
    # compare on the integer orders, where its binomial sum is exact
    orders = [o for o in DEFAULT_ORDERS if o <= 512 and o == int(o)]
    theirs = dp_accounting.rdp.RdpAccountant(orders)
    theirs.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    ours = RDPAccountant(orders).compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert ours.epsilon(1e-5) == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-6)


def test_peer_fractional_orders_are_off() -> None:
    """dpsharp == mpmath (50 digits) to 1e-12; dp-accounting 0.6.0 is above by > 1% here."""
    pytest.importorskip("dp_accounting")
    from _rdp_reference import rdp as reference_rdp
    from dp_accounting.rdp import rdp_privacy_accountant as peer

    ref = float(reference_rdp(0.01, 1.0, 1.1))
    ours = poisson_gaussian_rdp(0.01, 1.0, [1.1])[0]
    theirs = peer._compute_rdp_poisson_subsampled_gaussian(0.01, 1.0, [1.1])[0]
    assert ours == pytest.approx(ref, rel=1e-12)
    assert theirs > 1.01 * ref


def test_without_replacement_against_dp_accounting() -> None:
    """dp-accounting implements WBK19 Theorem 27 (a Gaussian-specific strengthening) for
    alpha <= 256 and the general Theorem 9 terms above; dpsharp uses Theorem 9 everywhere, capped
    by the unsampled Gaussian. So: ours >= theirs (or ours is the cap) for alpha <= 256, and
    ours == min(theirs, cap) above."""
    pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant as peer

    orders = np.array([2.0, 3.0, 4.5, 10.0, 64.0, 256.0, 300.0, 512.0, 1000.0])
    for gamma, sigma in [(0.01, 1.0), (0.05, 0.8), (0.2, 2.0)]:
        ours = sampled_without_replacement_gaussian_rdp(gamma, sigma, orders)
        theirs = peer._compute_rdp_sample_wor_gaussian(gamma, sigma, orders)
        cap = orders / (2 * sigma**2)
        small = orders <= 256
        assert np.all((ours[small] >= theirs[small] * (1 - 1e-12)) | (ours[small] == cap[small]))
        np.testing.assert_allclose(ours[~small], np.minimum(theirs[~small], cap[~small]), rtol=1e-9)


def test_without_replacement_accountant_runs_under_replace_one() -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    orders = [float(o) for o in range(2, 65)] + [128.0]
    theirs = dp_accounting.rdp.RdpAccountant(orders, dp_accounting.NeighboringRelation.REPLACE_ONE)
    theirs.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(6000, 60, dp_accounting.GaussianDpEvent(1.0)),
        1000,
    )
    ours = RDPAccountant(orders, neighbouring="replace_one").compose(
        SampledWithoutReplacement(Gaussian(1.0), 60, 6000), 1000
    )
    # Theorem 9 is looser than dp-accounting's Theorem 27 at small orders: never smaller (up to
    # rounding), within 10% here
    assert theirs.get_epsilon(1e-5) * (1 - 1e-12) <= ours.epsilon(1e-5) <= 1.1 * theirs.get_epsilon(1e-5)
