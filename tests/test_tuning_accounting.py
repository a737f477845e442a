"""The accountants account the selection events: worked examples of Yu et al. 2019's partition-and-select
procedure (zCDP), pure-DP steps (classic), DP-PCA's event, and refusals."""

from __future__ import annotations

import math

import pytest
from dpsharp.accountants.base import UnsupportedEventError
from dpsharp.events import Gaussian, PoissonSampled, Repeated, Shuffled
from dpsharp.tuning_events import (
    DisjointParts,
    PoissonTuning,
    PureDP,
    RandomChoice,
    TruncatedNegativeBinomialTuning,
)

zcdp = pytest.importorskip("dpsharp.accountants.zcdp")
classic = pytest.importorskip("dpsharp.accountants.classic")


def _epochs(sigma: float, epochs: int) -> Repeated:
    """Reshuffled epochs: accounted under zero-out (dpsharp.events.Shuffled)."""
    return Repeated(Shuffled(Gaussian(sigma), 600, 60000), epochs)


def test_zcdp_pure_dp_is_half_epsilon_squared() -> None:
    acc = zcdp.ZCDPAccountant().compose(PureDP(0.8))
    assert acc.rho == pytest.approx(0.32, rel=1e-15)
    # rho + 2 sqrt(rho log(1/delta)) (Bun-Steinke), as 004 converts.
    assert acc.epsilon_bun_steinke(1e-5) == pytest.approx(0.32 + 2 * math.sqrt(0.32 * math.log(1e5)), rel=1e-12)


def test_zcdp_partitioned_search_worked_example_004() -> None:
    """Yu et al. 2019, IV.C.3: k candidate schedules trained on k disjoint portions, the exponential
    mechanism (epsilon-DP, hence epsilon^2/2-zCDP) on the last: by Theorem 2 the search costs
    max(rho_1, ..., rho_k, epsilon^2/2). Here rho_i = epochs_i / (2 sigma_i^2) (reshuffling)."""
    trains = [_epochs(8.0, 100), _epochs(6.0, 40), _epochs(10.0, 120)]
    rhos = [100 / 128, 40 / 72, 120 / 200]
    search = DisjointParts((*trains, PureDP(1.0)))
    acc = zcdp.ZCDPAccountant(neighbouring="zero_out").compose(search)
    assert acc.rho == pytest.approx(max(*rhos, 0.5), rel=1e-14) == pytest.approx(0.78125)
    # Versus training all three on the full data and adding up (the naive cost 004 avoids).
    naive = zcdp.ZCDPAccountant(neighbouring="zero_out")
    for train in trains:
        naive.compose(train)
    naive.compose(PureDP(1.0))
    assert naive.rho == pytest.approx(sum(rhos) + 0.5, rel=1e-14)
    # A large epsilon for the selection dominates.
    large = DisjointParts((*trains, PureDP(2.0)))
    assert zcdp.ZCDPAccountant(neighbouring="zero_out").compose(large).rho == pytest.approx(2.0)
    # RandomChoice costs the max too; composition with other work adds.
    acc2 = zcdp.ZCDPAccountant(neighbouring="zero_out").compose(RandomChoice(tuple(trains)))
    acc2.compose(Gaussian(16.0))
    assert acc2.rho == pytest.approx(100 / 128 + 1 / 512, rel=1e-14)


def test_zcdp_refuses_the_rdp_only_tuning_events_and_bad_parts() -> None:
    acc = zcdp.ZCDPAccountant(neighbouring="zero_out")
    with pytest.raises(UnsupportedEventError, match="RDP analysis only"):
        acc.compose(TruncatedNegativeBinomialTuning(_epochs(8.0, 10), 1.0, 0.1))
    with pytest.raises(UnsupportedEventError, match="RDP analysis only"):
        acc.compose(PoissonTuning(_epochs(8.0, 10), 3.0))
    with pytest.raises(UnsupportedEventError):
        acc.compose(DisjointParts((PoissonSampled(Gaussian(1.0), 0.5), PureDP(1.0))))
    assert acc.is_empty


def test_zcdp_checkpoint_round_trip_with_tuning_events() -> None:
    acc = zcdp.ZCDPAccountant(neighbouring="zero_out")
    acc.compose(DisjointParts((_epochs(8.0, 100), PureDP(1.0)))).compose(PureDP(0.3))
    restored = zcdp.ZCDPAccountant(neighbouring="zero_out")
    restored.load_state_dict(acc.state_dict())
    assert restored.rho == acc.rho and restored.epsilon(1e-5) == acc.epsilon(1e-5)


def test_zcdp_dp_pca_full_data_event_004() -> None:
    """Yu et al. 2019 run DP-PCA with sigma_pca = 16 on the whole training set and reports its constant
    cost 1/(2 sigma_pca^2) apart from the training budget."""
    acc = zcdp.ZCDPAccountant().compose(Gaussian(16.0))
    assert acc.rho == 1 / 512


def test_classic_pure_dp_basic_composition() -> None:
    acc = classic.ClassicAccountant("basic").compose(PureDP(0.7), 3)
    assert acc.epsilon(1e-5) == pytest.approx(2.1, rel=1e-14)
    assert acc.delta(2.1) <= 1e-9
    with pytest.raises(UnsupportedEventError):
        classic.ClassicAccountant().compose(DisjointParts((PureDP(1.0),)))
