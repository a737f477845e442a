"""The RDP accountant accounts DP-PCA and the tuning events: curves equal the formulas of
dpsharp.tuning_events applied to the accountant's own base curves, DP-PCA equals the Gaussian
mechanism with the same sampling and noise, and checkpoints round-trip."""

from __future__ import annotations

import numpy as np
import pytest
from dpsharp.accountants.base import UnsupportedEventError
from dpsharp.events import (
    Composed,
    Gaussian,
    Laplace,
    PoissonSampled,
    Repeated,
    SampledWithoutReplacement,
)
from dpsharp.tuning import select_random_repetitions
from dpsharp.tuning_events import (
    DisjointParts,
    PoissonTuning,
    PureDP,
    RandomChoice,
    TruncatedNegativeBinomialTuning,
    poisson_tuning_rdp,
    pure_dp_rdp,
    truncated_negative_binomial_tuning_rdp,
)

rdp_module = pytest.importorskip("dpsharp.accountants.rdp")
RDPAccountant = rdp_module.RDPAccountant

BASE = Repeated(PoissonSampled(Gaussian(1.1), 0.01), 1000)


def _curve(event) -> np.ndarray:  # type: ignore[no-untyped-def]
    return RDPAccountant().compose(event).rdp()


def test_dp_pca_event_is_accounted_as_the_sampled_gaussian() -> None:
    torch = pytest.importorskip("torch")
    from dpsharp.torch import DPPCA

    data = torch.randn(300, 10, dtype=torch.float64)
    for q in (1.0, 0.2):
        event = DPPCA(3, 4.0, q, seed=0).fit(data)
        gaussian = PoissonSampled(Gaussian(4.0), q)
        assert np.array_equal(_curve(event), _curve(gaussian))
        assert RDPAccountant().compose(event).epsilon(1e-5) == RDPAccountant().compose(gaussian).epsilon(1e-5)
    # q = 1: the Gaussian mechanism's closed form alpha / (2 sigma^2) (Mironov 2017).
    acc = RDPAccountant().compose(DPPCA(3, 4.0, 1.0, seed=0).fit(data))
    np.testing.assert_allclose(acc.rdp(), acc.orders / 32.0, rtol=1e-12)


def test_pure_dp_curve() -> None:
    acc = RDPAccountant().compose(PureDP(0.5), 3)
    np.testing.assert_allclose(acc.rdp(), 3 * pure_dp_rdp(0.5, acc.orders), rtol=1e-14)


def test_disjoint_parts_and_random_choice_take_the_max() -> None:
    other = Repeated(PoissonSampled(Gaussian(0.9), 0.02), 300)
    expected = np.maximum(np.maximum(_curve(BASE), _curve(other)), pure_dp_rdp(1.0, RDPAccountant().orders))
    np.testing.assert_allclose(_curve(DisjointParts((BASE, other, PureDP(1.0)))), expected, rtol=1e-14)
    np.testing.assert_allclose(_curve(RandomChoice((BASE, other))), np.maximum(_curve(BASE), _curve(other)), rtol=1e-14)


@pytest.mark.parametrize(("eta", "gamma"), [(1.0, 0.1), (0.0, 0.05), (-0.5, 0.2)])
def test_truncated_negative_binomial_search(eta: float, gamma: float) -> None:
    orders = RDPAccountant().orders
    formula = truncated_negative_binomial_tuning_rdp(_curve(BASE), orders, eta=eta, gamma=gamma)
    # the Renyi divergence is non-decreasing in the order, so the accountant keeps, at each
    # order, the smallest value of the formula at that order or a larger one
    assert np.all(np.diff(orders) > 0)
    expected = np.array([formula[index:].min() for index in range(orders.size)])
    assert expected[0] < formula[0]  # the formula's log(E[K]) / (alpha - 1) is loose near 1
    search = TruncatedNegativeBinomialTuning(BASE, eta, gamma)
    acc = RDPAccountant().compose(search)
    np.testing.assert_allclose(acc.rdp(), expected, rtol=1e-14)
    single = RDPAccountant().compose(BASE).epsilon(1e-5)
    # The search costs more than one run and far less than E[K] runs composed.
    many = RDPAccountant().compose(BASE, max(2, round(search.expected_runs))).epsilon(1e-5)
    assert single < acc.epsilon(1e-5) < many


def test_poisson_search_and_composition_with_more_work() -> None:
    orders = RDPAccountant().orders
    acc = RDPAccountant().compose(PoissonTuning(BASE, 10.0)).compose(PoissonSampled(Gaussian(8.0), 1.0))
    expected = poisson_tuning_rdp(_curve(BASE), orders, mean=10.0) + orders / 128.0
    np.testing.assert_allclose(acc.rdp(), expected, rtol=1e-12)


def test_checkpoint_round_trip_and_refusals() -> None:
    acc = RDPAccountant().compose(TruncatedNegativeBinomialTuning(BASE, 1.0, 0.1)).compose(
        DisjointParts((BASE, PureDP(1.0)))
    )
    restored = RDPAccountant()
    restored.load_state_dict(acc.state_dict())
    assert restored.epsilon(1e-5) == acc.epsilon(1e-5)
    with pytest.raises(UnsupportedEventError):
        RDPAccountant().compose(TruncatedNegativeBinomialTuning(PoissonSampled(Laplace(1.0), 0.1), 1.0, 0.1))
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        RDPAccountant().compose(PoissonTuning(SampledWithoutReplacement(Gaussian(1.0), 10, 100), 2.0))
    # A nested search is fine: the base of a search may itself be a composition.
    RDPAccountant().compose(PoissonTuning(Composed((BASE, PureDP(0.1))), 3.0))


def test_select_random_repetitions_event_accounts_in_rdp() -> None:
    result = select_random_repetitions(
        lambda lr: (lr, -abs(lr - 0.1)), [0.01, 0.1, 1.0], candidate_event=lambda lr: BASE,
        rng=np.random.default_rng(3), gamma=0.1,
    )
    acc = RDPAccountant().compose(result.event)
    assert acc.epsilon(1e-5) > RDPAccountant().compose(BASE).epsilon(1e-5)
