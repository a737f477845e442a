"""Events: validation, immutability, flattening, serialisation, neighbouring requirements."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dpsharp.events import (
    Composed,
    Gaussian,
    Laplace,
    Neighbouring,
    PoissonSampled,
    Repeated,
    SampledWithoutReplacement,
    Shuffled,
    event_from_dict,
    event_to_dict,
    flatten,
    neighbouring_unsupported_reason,
    required_neighbouring,
)

BAD_REALS = [0.0, -1.0, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value", BAD_REALS)
def test_gaussian_rejects_non_positive_or_non_finite(value: float) -> None:
    with pytest.raises(ValueError, match="noise_multiplier"):
        Gaussian(value)


@pytest.mark.parametrize("value", BAD_REALS)
def test_laplace_rejects_bad_scale(value: float) -> None:
    with pytest.raises(ValueError, match=r"scale must be in \(0, inf\)|scale must be a finite"):
        Laplace(value)


@pytest.mark.parametrize("q", [0.0, -0.1, 1.0000001, math.nan, math.inf])
def test_poisson_rejects_q_outside_unit_interval(q: float) -> None:
    with pytest.raises(ValueError, match="sampling_probability"):
        PoissonSampled(Gaussian(1.0), q)


def test_type_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match="noise_multiplier"):
        Gaussian("1.0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="noise_multiplier"):
        Gaussian(True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="event"):
        PoissonSampled(1.0, 0.1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="count"):
        Repeated(Gaussian(1.0), 2.0)  # type: ignore[arg-type]


def test_counts_and_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="count"):
        Repeated(Gaussian(1.0), -1)
    with pytest.raises(ValueError, match="sample_size"):
        SampledWithoutReplacement(Gaussian(1.0), 11, 10)
    with pytest.raises(ValueError, match="sample_size"):
        SampledWithoutReplacement(Gaussian(1.0), 0, 10)
    with pytest.raises(ValueError, match="batch_size"):
        Shuffled(Gaussian(1.0), 11, 10)


def test_events_are_frozen_and_hashable() -> None:
    event = PoissonSampled(Gaussian(1), 0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.sampling_probability = 0.1  # type: ignore[misc]
    assert event == PoissonSampled(Gaussian(1.0), 0.5)
    assert isinstance(event.event.noise_multiplier, float)
    assert len({event, PoissonSampled(Gaussian(1.0), 0.5)}) == 1
    composed = Composed([Gaussian(1.0), Laplace(2.0)])
    assert isinstance(composed.events, tuple)


def test_flatten_aggregates_counts_of_equal_leaves() -> None:
    a, b = Gaussian(1.0), PoissonSampled(Gaussian(2.0), 0.1)
    assert flatten(Repeated(a, 3)) == [(a, 3)]
    assert flatten(Composed([a, a, a])) == [(a, 3)]
    assert flatten(a, 3) == [(a, 3)]
    assert flatten(Repeated(Composed([a, b, Repeated(a, 2)]), 10**7)) == [(a, 3 * 10**7), (b, 10**7)]
    assert flatten(Repeated(a, 0)) == []
    assert flatten(Composed([])) == []


def test_neighbouring_requirements() -> None:
    assert required_neighbouring(Gaussian(1.0)) == {}
    poisson = PoissonSampled(Gaussian(1.0), 0.1)
    wor = SampledWithoutReplacement(Gaussian(1.0), 5, 10)
    shuffled = Shuffled(Gaussian(1.0), 2, 10)
    assert required_neighbouring(Composed([poisson])) == {Neighbouring.ADD_REMOVE: poisson}
    both = required_neighbouring(Composed([Repeated(poisson, 2), wor]))
    assert both == {Neighbouring.ADD_REMOVE: poisson, Neighbouring.REPLACE_ONE: wor}
    assert required_neighbouring(shuffled) == {Neighbouring.ZERO_OUT: shuffled}


ADD, ZERO, REPLACE = Neighbouring.ADD_REMOVE, Neighbouring.ZERO_OUT, Neighbouring.REPLACE_ONE


def test_which_relation_each_event_holds_under() -> None:
    """Gaussian / Laplace: every relation. Poisson: add/remove and zero-out (a null record in
    a Poisson sample is an absent one). Without replacement: replace one. Reshuffling: zero-out
    and replace one, never add/remove (Kairouz et al. 2021; tests/test_soundness_sampling.py)."""
    poisson = PoissonSampled(Gaussian(1.0), 0.1)
    wor = SampledWithoutReplacement(Gaussian(1.0), 5, 10)
    shuffled = Shuffled(Gaussian(1.0), 2, 10)
    valid = {
        Gaussian(1.0): {ADD, ZERO, REPLACE},
        Laplace(1.0): {ADD, ZERO, REPLACE},
        poisson: {ADD, ZERO},
        wor: {REPLACE},
        shuffled: {ZERO, REPLACE},
        Composed([Gaussian(1.0), Repeated(shuffled, 3)]): {ZERO, REPLACE},
        Composed([poisson, shuffled]): {ZERO},
        Shuffled(poisson, 2, 10): {ZERO},
        Shuffled(wor, 2, 10): {REPLACE},
        # the inner event of a Poisson sample under zero-out is analysed under add/remove
        PoissonSampled(shuffled, 0.5): set(),
    }
    for event, relations in valid.items():
        for relation in Neighbouring:
            reason = neighbouring_unsupported_reason(event, relation)
            assert (reason is None) == (relation in relations), (event, relation, reason)
    assert Neighbouring("zero_out") is ZERO


def test_reshuffling_refusal_says_why_and_what_instead() -> None:
    reason = neighbouring_unsupported_reason(Shuffled(Gaussian(1.0), 2, 10), "add_remove")
    assert reason is not None
    for words in ("batch boundaries", "not a data-independent partition", "Poisson",
                  "neighbouring='zero_out'", "neighbouring='replace_one'", "sigma / 2"):
        assert words in reason
    nested_event = PoissonSampled(Shuffled(Gaussian(1.0), 2, 10), 0.5)
    nested = neighbouring_unsupported_reason(nested_event, ZERO)
    assert nested is not None and "inside PoissonSampled" in nested
    with pytest.raises(ValueError):
        neighbouring_unsupported_reason(Gaussian(1.0), "swap")
    with pytest.raises(TypeError, match="event"):
        neighbouring_unsupported_reason("Gaussian", ZERO)  # type: ignore[arg-type]


def test_serialisation_round_trip() -> None:
    event = Composed(
        [
            Repeated(PoissonSampled(Gaussian(1.1), 256 / 60000), 14063),
            SampledWithoutReplacement(Laplace(0.5), 10, 100),
            Shuffled(Gaussian(3.0), 32, 1000),
            Composed([]),
        ]
    )
    data = event_to_dict(event)
    import json

    assert event_from_dict(json.loads(json.dumps(data))) == event
    with pytest.raises(ValueError, match="unknown event type"):
        event_from_dict({"type": "Nope"})
