"""dpsharp.compat.dp_accounting: dp-accounting's events converted both ways, and code written
for dp-accounting's PrivacyAccountant running unchanged on dpsharp (checked against
dp-accounting 0.6.0 itself)."""

from __future__ import annotations

import math
import textwrap

import dpsharp
import pytest

dp = pytest.importorskip("dp_accounting")
from dpsharp.compat import dp_accounting as compat

pytestmark = pytest.mark.peers


def built(family: str) -> None:
    if family not in dpsharp.available():
        pytest.skip(f"the {family} accountant is not built in this checkout")


ROUND_TRIPS = [
    (dp.GaussianDpEvent(1.3), dpsharp.Gaussian(1.3)),
    (dp.LaplaceDpEvent(0.5), dpsharp.Laplace(0.5)),
    (dp.PoissonSampledDpEvent(0.01, dp.GaussianDpEvent(2.0)),
     dpsharp.PoissonSampled(dpsharp.Gaussian(2.0), 0.01)),
    (dp.SampledWithoutReplacementDpEvent(1000, 10, dp.GaussianDpEvent(1.0)),
     dpsharp.SampledWithoutReplacement(dpsharp.Gaussian(1.0), 10, 1000)),
    (dp.SelfComposedDpEvent(dp.LaplaceDpEvent(3.0), 7), dpsharp.Repeated(dpsharp.Laplace(3.0), 7)),
    (dp.ComposedDpEvent([dp.GaussianDpEvent(1.0), dp.SelfComposedDpEvent(dp.GaussianDpEvent(2.0), 3)]),
     dpsharp.Composed((dpsharp.Gaussian(1.0), dpsharp.Repeated(dpsharp.Gaussian(2.0), 3)))),
    (dp.NoOpDpEvent(), dpsharp.Composed(())),
]


@pytest.mark.parametrize(("theirs", "mine"), ROUND_TRIPS)
def test_events_convert_both_ways(theirs: object, mine: dpsharp.Event) -> None:
    assert compat.from_dp_event(theirs) == mine
    assert compat.to_dp_event(mine) == theirs
    assert compat.from_dp_event(compat.to_dp_event(mine)) == mine


def test_unconvertible_events_are_named() -> None:
    for event in (dp.NonPrivateDpEvent(), dp.UnsupportedDpEvent(), dp.RandomizedResponseDpEvent(0.5, 2)):
        with pytest.raises(dp.UnsupportedEventError, match=type(event).__name__):
            compat.from_dp_event(event)
    with pytest.raises(compat.UnsupportedEventError, match="Shuffled"):
        compat.to_dp_event(dpsharp.Shuffled(dpsharp.Gaussian(1.0), 10, 100))
    with pytest.raises(TypeError):
        compat.from_dp_event("GaussianDpEvent(1.0)")


# A script in dp-accounting's own idiom; it only sees the names in its namespace.
SCRIPT = textwrap.dedent(
    """
    import dp_accounting

    q, sigma, steps = 256 / 60000, 1.1, 2000
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    accountant = make_accountant()
    assert accountant.supports(event)
    assert accountant.supports(dp_accounting.NonPrivateDpEvent())
    assert not accountant.supports(dp_accounting.UnsupportedDpEvent())
    blown = make_accountant().compose(dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(1.0), dp_accounting.NonPrivateDpEvent()]))
    blown_eps, blown_delta = blown.get_epsilon(1e-5), blown.get_delta(1.0)
    try:
        accountant.compose(dp_accounting.UnsupportedDpEvent())
    except dp_accounting.UnsupportedEventError:
        refused = True
    else:
        refused = False
    eps = accountant.compose(event).compose(dp_accounting.NoOpDpEvent()).get_epsilon(target_delta=1e-5)
    delta = accountant.get_delta(target_epsilon=eps)
    ledger = accountant.ledger
    relation = accountant.neighboring_relation
    """
)


def run_script(make_accountant: object) -> dict[str, object]:
    namespace: dict[str, object] = {"make_accountant": make_accountant}
    exec(compile(SCRIPT, "<dp-accounting script>", "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize(
    ("family", "ours", "theirs", "slack"),
    [
        ("pld", "PLDAccountant", lambda: dp.pld.PLDAccountant(value_discretization_interval=1e-4), 1e-3),
        ("rdp", "RDPAccountant", lambda: dp.rdp.RdpAccountant(), 1e-6),
    ],
)
def test_dp_accounting_script_runs_unchanged(family: str, ours: str, theirs: object, slack: float) -> None:
    built(family)
    mine = run_script(getattr(compat, ours))
    peer = run_script(theirs)
    assert mine["refused"] is True and peer["refused"] is True
    assert mine["blown_eps"] == peer["blown_eps"] == math.inf
    assert mine["blown_delta"] == peer["blown_delta"] == 1.0
    assert mine["ledger"] == peer["ledger"]
    assert mine["relation"] == peer["relation"] == dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    # equal to dpsharp's own API on the same events
    api = dpsharp.accountant(family).compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(1.1), 256 / 60000), 2000)
    assert mine["eps"] == api.epsilon(1e-5)
    assert mine["delta"] == api.delta(mine["eps"])
    assert mine["delta"] <= 1e-5 * (1 + 1e-6)
    # and no looser than dp-accounting's own number (dp-accounting 0.6.0, same events)
    assert mine["eps"] <= peer["eps"] * (1 + slack)
    assert mine["eps"] >= 0.9 * peer["eps"]


def test_replace_one_accountant_takes_sampling_without_replacement() -> None:
    built("rdp")
    relation = dp.NeighboringRelation.REPLACE_ONE
    event = dp.SelfComposedDpEvent(dp.SampledWithoutReplacementDpEvent(1000, 20, dp.GaussianDpEvent(1.5)), 300)
    mine = compat.RDPAccountant(neighboring_relation=relation)
    assert mine.neighboring_relation == relation
    assert mine.supports(event)
    assert not mine.supports(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(1.0)))
    eps = mine.compose(event).get_epsilon(1e-6)
    theirs = dp.rdp.RdpAccountant(neighboring_relation=relation).compose(event).get_epsilon(1e-6)
    assert eps == dpsharp.accountant("rdp", neighbouring="replace_one").compose(
        compat.from_dp_event(event)).epsilon(1e-6)
    # Both are upper bounds from Wang, Balle, Kasiviswanathan 2019; dp-accounting 0.6.0 uses a
    # strengthened per-order bound, and dpsharp's RDP of this event is larger per order (e.g.
    # order 8: 0.004060 vs 0.004017), so ours is 0.64% looser here (2.7328 vs 2.7154): a finding
    # reported to the RDP work, not an adapter error. The adapter must agree with the API
    # (above) and be of the same size as the peer.
    assert abs(eps / theirs - 1.0) < 0.02


def test_refused_compose_leaves_state_unchanged() -> None:
    built("rdp")
    acc = compat.RDPAccountant().compose(dp.GaussianDpEvent(3.0), 4)
    before = acc.get_epsilon(1e-5)
    bad = dp.ComposedDpEvent([dp.GaussianDpEvent(1.0), dp.UnsupportedDpEvent()])
    with pytest.raises(dp.UnsupportedEventError, match="UnsupportedDpEvent"):
        acc.compose(bad)
    assert acc.get_epsilon(1e-5) == before
    assert acc.ledger == dp.SelfComposedDpEvent(dp.GaussianDpEvent(3.0), 4)
    with pytest.raises(ValueError, match="count"):
        acc.compose(dp.GaussianDpEvent(3.0), 0)  # dp-accounting refuses count < 1 too
    assert acc.get_epsilon(1e-5) == before
    order = acc.get_epsilon_and_optimal_order(1e-5)[1]
    assert order > 1 and not math.isnan(order)
