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
    assert required_neighbouring(Composed([poisson])) == {Neighbouring.ADD_REMOVE: poisson}
    both = required_neighbouring(Composed([Repeated(poisson, 2), wor]))
    assert both == {Neighbouring.ADD_REMOVE: poisson, Neighbouring.REPLACE_ONE: wor}


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
