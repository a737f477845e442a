"""PLDAccountant against the field (dp-accounting 0.6.0, prv-accountant 0.2.0).

dp-accounting's PLD accountant with ``value_discretization_interval=1e-5`` is a pessimistic
estimate (an upper bound up to its truncation); our certified upper bound must be within 0.1% of
it, and our certified lower bound must not exceed it (nor prv-accountant's upper bound). The
Abadi et al. 2016 settings (q = 0.01, sigma = 4) are the subset used here because the peer is
fast on them; bench/bench_pld.py runs every setting of the issue.
"""

from __future__ import annotations

import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled

pytestmark = pytest.mark.peers

SETTINGS = [(0.01, 4.0, 10_000), (0.01, 4.0, 40_000)]


@pytest.mark.parametrize("q,sigma,steps", SETTINGS)
def test_upper_within_a_tenth_of_a_percent_of_dp_accounting(q: float, sigma: float, steps: int) -> None:
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld_accountant = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    peer = pld_accountant.PLDAccountant(value_discretization_interval=1e-5)
    peer.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    theirs = peer.get_epsilon(1e-5)
    ours = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
    lower, upper = ours.epsilon_bounds(1e-5)
    assert ours.epsilon(1e-5) <= 1.001 * theirs
    assert upper <= 1.001 * theirs
    assert lower <= theirs


@pytest.mark.parametrize("q,sigma,steps", [(0.01, 1.0, 1000), (0.01, 4.0, 10_000)])
def test_bounds_consistent_with_prv_accountant(q: float, sigma: float, steps: int) -> None:
    prv = pytest.importorskip("prv_accountant")
    mechanism = prv.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
    peer = prv.PRVAccountant(prvs=[mechanism], max_self_compositions=[steps], eps_error=0.01, delta_error=1e-10)
    their_low, _, their_up = peer.compute_epsilon(delta=1e-5, num_self_compositions=[steps])
    lower, upper = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps).epsilon_bounds(1e-5)
    # Two certified brackets of the same number must intersect.
    assert lower <= their_up and their_low <= upper
