"""The shared accountant contract (base.py), exercised through a minimal pure-DP accountant
defined here: Laplace(b) is (1/b, 0)-DP and basic composition adds epsilons (Dwork et al.
2006), a closed form we can check exactly."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from dpsharp.accountants.base import Accountant, UnsupportedEventError
from dpsharp.events import (
    Composed,
    Event,
    Gaussian,
    Laplace,
    Neighbouring,
    PoissonSampled,
    Repeated,
    SampledWithoutReplacement,
)


class PureLaplaceAccountant(Accountant):
    name = "test-pure-laplace"

    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        return None if isinstance(leaf, Laplace) else "only Laplace is supported"

    def _total(self) -> float:
        return math.fsum(count / leaf.scale for leaf, count in self._counts.items())  # type: ignore[attr-defined]

    def _epsilon(self, delta: float) -> float:
        return self._total()

    def _delta(self, epsilon: float) -> float:
        return 0.0 if epsilon >= self._total() else 1.0

    def _options(self) -> dict[str, Any]:
        return {}


def test_empty_accountant_is_private() -> None:
    acc = PureLaplaceAccountant()
    assert acc.epsilon(1e-5) == 0.0 and acc.delta(0.0) == 0.0


def test_compose_count_repeated_and_composed_agree() -> None:
    by_count = PureLaplaceAccountant().compose(Laplace(2.0), 6)
    by_repeat = PureLaplaceAccountant().compose(Repeated(Laplace(2.0), 6))
    by_composed = PureLaplaceAccountant().compose(Composed([Laplace(2.0)] * 6))
    one_by_one = PureLaplaceAccountant()
    for _ in range(6):
        one_by_one.compose(Laplace(2.0))
    values = {acc.epsilon(0.5) for acc in (by_count, by_repeat, by_composed, one_by_one)}
    assert values == {3.0}
    assert one_by_one.ledger == ((Laplace(2.0), 6),)


def test_unsupported_sub_event_is_named_and_state_unchanged() -> None:
    acc = PureLaplaceAccountant().compose(Laplace(1.0))
    before = acc.state_dict()
    bad = Composed([Laplace(1.0), Gaussian(0.5)])
    assert not acc.supports(bad)
    with pytest.raises(UnsupportedEventError, match=r"Gaussian\(noise_multiplier=0.5\)"):
        acc.compose(bad)
    assert acc.state_dict() == before


def test_wrong_neighbouring_relation_is_refused() -> None:
    add_remove = PureLaplaceAccountant()
    replace_one = PureLaplaceAccountant(neighbouring="replace_one")
    assert replace_one.neighbouring is Neighbouring.REPLACE_ONE
    wor = SampledWithoutReplacement(Laplace(1.0), 5, 10)
    poisson = PoissonSampled(Laplace(1.0), 0.1)
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        add_remove.compose(wor)
    with pytest.raises(UnsupportedEventError, match="add_remove"):
        replace_one.compose(poisson)
    with pytest.raises(ValueError, match="neighbouring"):
        PureLaplaceAccountant(neighbouring="swap")


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, math.nan, math.inf])
def test_bad_delta(delta: float) -> None:
    with pytest.raises(ValueError, match="delta"):
        PureLaplaceAccountant().compose(Laplace(1.0)).epsilon(delta)


@pytest.mark.parametrize("epsilon", [-0.1, math.nan, -math.inf])
def test_bad_epsilon(epsilon: float) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        PureLaplaceAccountant().compose(Laplace(1.0)).delta(epsilon)


def test_bad_count() -> None:
    acc = PureLaplaceAccountant()
    with pytest.raises(ValueError, match="count"):
        acc.compose(Laplace(1.0), -1)
    with pytest.raises(TypeError, match="count"):
        acc.compose(Laplace(1.0), 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="event"):
        acc.compose("Laplace(1)")  # type: ignore[arg-type]


def test_state_dict_round_trip_through_json() -> None:
    acc = PureLaplaceAccountant().compose(Laplace(3.0), 7).compose(Laplace(0.7)).compose(Laplace(3.0))
    state = json.loads(json.dumps(acc.state_dict()))
    restored = PureLaplaceAccountant()
    restored.load_state_dict(state)
    assert restored.epsilon(1e-6) == acc.epsilon(1e-6) == pytest.approx(8 / 3.0 + 1 / 0.7, rel=1e-15)
    assert restored.ledger == acc.ledger
    with pytest.raises(ValueError, match="add_remove"):
        PureLaplaceAccountant(neighbouring="replace_one").load_state_dict(state)


def test_composed_counts_is_a_live_view_that_a_load_detaches() -> None:
    """composed_counts follows compose() in O(1) (the training engine holds it at every
    charge) and equals composed; load_state_dict replaces the multiset, so a view taken before
    the load keeps the earlier one (what the engine compares to refuse a ledger that shrank)."""
    from dpsharp.accountants import accountant as make_accountant

    accountant = make_accountant("rdp")
    accountant.compose(Gaussian(1.0), 3)
    view = accountant.composed_counts
    saved = accountant.state_dict()
    accountant.compose(Gaussian(2.0), 2)
    assert dict(view) == dict(accountant.composed) == {Gaussian(1.0): 3, Gaussian(2.0): 2}
    with pytest.raises(TypeError):
        view[Gaussian(1.0)] = 0  # type: ignore[index]
    accountant.load_state_dict(saved)
    assert dict(accountant.composed_counts) == {Gaussian(1.0): 3}
    assert dict(view) == {Gaussian(1.0): 3, Gaussian(2.0): 2}


@pytest.mark.parametrize("name", ["rdp", "pld"])
def test_a_load_refused_part_way_leaves_the_state_as_it_was(name: str) -> None:
    """A checkpoint whose second ledger item the accountant refuses (a sampling without
    replacement under add/remove) raises, and the accountant keeps its 5,000 steps: it used to
    be left holding the checkpoint's first item alone, with a far smaller epsilon (4.59 -> 1.04
    for RDP), as if the load had succeeded."""
    from dpsharp.accountants import accountant as make_accountant
    from dpsharp.events import PoissonSampled, SampledWithoutReplacement

    held = make_accountant(name).compose(PoissonSampled(Gaussian(1.0), 0.01), 5000)
    before = (held.epsilon(1e-5), held.ledger, dict(held.composed))
    state = make_accountant(name).compose(PoissonSampled(Gaussian(1.0), 0.01), 10).state_dict()
    refused = make_accountant(name, neighbouring="replace_one").compose(
        SampledWithoutReplacement(Gaussian(1.0), 10, 1000), 3).state_dict()
    state["ledger"] = state["ledger"] + refused["ledger"]
    with pytest.raises(UnsupportedEventError):
        held.load_state_dict(state)
    assert (held.epsilon(1e-5), held.ledger, dict(held.composed)) == before
    fresh = make_accountant(name).compose(PoissonSampled(Gaussian(1.0), 0.01), 5000)
    assert held.epsilon(1e-5) == fresh.epsilon(1e-5)
