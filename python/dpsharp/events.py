"""Events: immutable descriptions of what a randomised mechanism did.

Every accountant, the training engine, calibration and the command line describe work with
these same objects (the data flow of DESIGN.md). An event's meaning never changes; new
behaviour gets a new event class.

Noise is always stated relative to the sensitivity of the released query *under the
neighbouring relation of the analysis*:

* add/remove one (:attr:`Neighbouring.ADD_REMOVE`): datasets D, D' differ by the presence of
  one record. A sum of per-example values clipped to L2 norm C has L2 sensitivity C.
* replace one (:attr:`Neighbouring.REPLACE_ONE`): datasets of the same size differ in the value
  of one record. The same clipped sum has L2 sensitivity 2C.

So for DP-SGD with clipping norm C and noise standard deviation s, ``Gaussian(s / C)``
describes one step under add/remove, and ``Gaussian(s / (2 C))`` under replace-one.

Events are frozen dataclasses: hashable, comparable, and validated at construction, so an
invalid event cannot exist. :func:`event_to_dict` / :func:`event_from_dict` give a stable,
JSON-compatible form used by accountant checkpoints.
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Iterable

from dpsharp._validation import require_count, require_positive_finite, require_probability

__all__ = [
    "Composed",
    "Event",
    "Gaussian",
    "Laplace",
    "Neighbouring",
    "PoissonSampled",
    "Repeated",
    "SampledWithoutReplacement",
    "Shuffled",
    "event_from_dict",
    "event_to_dict",
    "flatten",
    "required_neighbouring",
]


class Neighbouring(str, enum.Enum):
    """The neighbouring relation a guarantee is stated under."""

    ADD_REMOVE = "add_remove"
    """D and D' differ by adding or removing one record (the relation of Abadi et al. 2016)."""
    REPLACE_ONE = "replace_one"
    """D and D' have the same size and differ in one record (Wang, Balle, Kasiviswanathan 2019)."""


class Event:
    """Base class of all events. Subclasses are frozen dataclasses."""

    #: The relation this event's own analysis requires, or None if it is valid under both.
    neighbouring: ClassVar[Neighbouring | None] = None

    def children(self) -> tuple[Event, ...]:
        """The events nested directly inside this one."""
        return ()


def _freeze_float(obj: object, name: str, value: float) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class Gaussian(Event):
    """The Gaussian mechanism: release f(D) + N(0, (noise_multiplier * Delta_2)^2 I).

    ``noise_multiplier`` = noise standard deviation / L2 sensitivity Delta_2 of f under the
    neighbouring relation of the enclosing analysis (see the module docstring). Valid under
    both relations. Its privacy-loss distribution is N(mu^2/2, mu^2) with mu = 1/noise_multiplier
    (Dong, Roth, Su 2019: it is mu-GDP); its Renyi divergence of order alpha is
    alpha / (2 noise_multiplier^2) (Mironov 2017).
    """

    noise_multiplier: float

    def __post_init__(self) -> None:
        _freeze_float(
            self, "noise_multiplier", require_positive_finite("noise_multiplier", self.noise_multiplier)
        )


@dataclass(frozen=True)
class Laplace(Event):
    """The Laplace mechanism: release f(D) + Lap(scale * Delta_1) per coordinate.

    ``scale`` = Laplace scale b / L1 sensitivity Delta_1 of f under the relation of the
    enclosing analysis. It is (1/scale, 0)-DP (Dwork, McSherry, Nissim, Smith 2006; the
    "Tail of Two Densities" blog, 003). Valid under both relations.
    """

    scale: float

    def __post_init__(self) -> None:
        _freeze_float(self, "scale", require_positive_finite("scale", self.scale))


@dataclass(frozen=True)
class PoissonSampled(Event):
    """Poisson subsampling: every record joins the sample independently with probability q,
    then ``event`` runs on the sample.

    Analysed under add/remove one (Abadi et al. 2016; Mironov, Talwar, Zhang 2019; Bu et al.
    2020's ``min{f_p, f_p^-1}**``). The batch size is random with mean q * n; an empty sample
    is a valid outcome.
    """

    event: Event
    sampling_probability: float

    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.ADD_REMOVE

    def __post_init__(self) -> None:
        _require_event("event", self.event)
        _freeze_float(
            self,
            "sampling_probability",
            require_probability("sampling_probability", self.sampling_probability),
        )

    def children(self) -> tuple[Event, ...]:
        return (self.event,)


@dataclass(frozen=True)
class SampledWithoutReplacement(Event):
    """A uniformly random subset of exactly ``sample_size`` of the ``dataset_size`` records,
    drawn without replacement, then ``event`` runs on it.

    Analysed under replace one (the dataset size is public), as in Wang, Balle,
    Kasiviswanathan 2019, "Subsampled Renyi differential privacy and analytical moments
    accountant". Sampling rate gamma = sample_size / dataset_size.
    """

    event: Event
    sample_size: int
    dataset_size: int

    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.REPLACE_ONE

    def __post_init__(self) -> None:
        _require_event("event", self.event)
        size = require_count("dataset_size", self.dataset_size, minimum=1)
        sample = require_count("sample_size", self.sample_size, minimum=1)
        if sample > size:
            raise ValueError(
                f"sample_size must be in [1, dataset_size={size}], got {sample}"
            )
        object.__setattr__(self, "dataset_size", size)
        object.__setattr__(self, "sample_size", sample)

    @property
    def sampling_rate(self) -> float:
        return self.sample_size / self.dataset_size

    def children(self) -> tuple[Event, ...]:
        return (self.event,)


@dataclass(frozen=True)
class Shuffled(Event):
    """One epoch of random reshuffling: the records are permuted uniformly at random and cut
    into ceil(dataset_size / batch_size) disjoint batches; ``event`` runs once on each batch.

    Every record lands in exactly one batch, so by parallel composition the epoch costs what one
    batch costs (Yu et al. 2019, Theorem 2: the max rho over the disjoint batches). Valid under
    both relations: with the noise stated relative to the relation's sensitivity, a neighbouring
    record changes one batch only.
    """

    event: Event
    batch_size: int
    dataset_size: int

    def __post_init__(self) -> None:
        _require_event("event", self.event)
        size = require_count("dataset_size", self.dataset_size, minimum=1)
        batch = require_count("batch_size", self.batch_size, minimum=1)
        if batch > size:
            raise ValueError(f"batch_size must be in [1, dataset_size={size}], got {batch}")
        object.__setattr__(self, "dataset_size", size)
        object.__setattr__(self, "batch_size", batch)

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.dataset_size // self.batch_size)

    def children(self) -> tuple[Event, ...]:
        return (self.event,)


@dataclass(frozen=True)
class Composed(Event):
    """Adaptive sequential composition: each event runs on the same dataset, in order, and may
    depend on the outputs of the ones before. The empty composition releases nothing."""

    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        if isinstance(self.events, Event) or not isinstance(self.events, Iterable):
            raise TypeError("events must be an iterable of Event objects")
        events = tuple(self.events)
        for index, event in enumerate(events):
            _require_event(f"events[{index}]", event)
        object.__setattr__(self, "events", events)

    def children(self) -> tuple[Event, ...]:
        return self.events


@dataclass(frozen=True)
class Repeated(Event):
    """``event`` composed adaptively with itself ``count`` times (count >= 0)."""

    event: Event
    count: int

    def __post_init__(self) -> None:
        _require_event("event", self.event)
        object.__setattr__(self, "count", require_count("count", self.count))

    def children(self) -> tuple[Event, ...]:
        return (self.event,)


def _require_event(name: str, value: object) -> None:
    if not isinstance(value, Event):
        raise TypeError(f"{name} must be a dpsharp event, got {value!r} ({type(value).__name__})")


def flatten(event: Event, count: int = 1) -> list[tuple[Event, int]]:
    """The multiset of mechanism events inside ``count`` runs of ``event``.

    ``Composed`` and ``Repeated`` are expanded; every other event (including sampled ones, whose
    inner event is analysed together with the sampling) is a leaf. Returns (leaf, total count)
    pairs, each distinct leaf once, in order of first appearance, leaves with count 0 omitted.

    The guarantee of an adaptive composition does not depend on the order of its parts (RDP and
    zCDP add, privacy-loss distributions convolve, GDP mu^2 add), so the multiset is all an
    accountant needs, and ``Repeated(Composed([a, b]), 10**7)`` costs O(size of the tree).
    """
    _require_event("event", event)
    count = require_count("count", count)
    if not isinstance(event, (Repeated, Composed)):  # a leaf (the common case)
        return [(event, count)] if count > 0 else []
    totals: dict[Event, int] = {}
    _accumulate_leaves(event, count, totals)
    return [(leaf, total) for leaf, total in totals.items() if total > 0]


def _accumulate_leaves(event: Event, count: int, totals: dict[Event, int]) -> None:
    if isinstance(event, Repeated):
        _accumulate_leaves(event.event, count * event.count, totals)
    elif isinstance(event, Composed):
        for inner in event.events:
            _accumulate_leaves(inner, count, totals)
    else:
        totals[event] = totals.get(event, 0) + count


def required_neighbouring(event: Event) -> dict[Neighbouring, Event]:
    """The relations that sub-events of ``event`` require, each with the first sub-event that
    requires it. An accountant stated under relation R refuses an event whose requirements
    contain a relation other than R."""
    found: dict[Neighbouring, Event] = {}
    stack = [event]
    while stack:
        current = stack.pop()
        if current.neighbouring is not None and current.neighbouring not in found:
            found[current.neighbouring] = current
        stack.extend(reversed(current.children()))
    return found


_EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (Gaussian, Laplace, PoissonSampled, SampledWithoutReplacement, Shuffled, Composed, Repeated)
}


def register_event_type(cls: type[Event]) -> type[Event]:
    """Make a new event class serialisable by :func:`event_to_dict` (used as a decorator)."""
    if cls.__name__ in _EVENT_TYPES and _EVENT_TYPES[cls.__name__] is not cls:
        raise ValueError(f"an event type named {cls.__name__!r} is already registered")
    _EVENT_TYPES[cls.__name__] = cls
    return cls


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-compatible description of ``event`` that :func:`event_from_dict` inverts."""
    _require_event("event", event)
    result: dict[str, Any] = {"type": type(event).__name__}
    for field in fields(event):  # type: ignore[arg-type]
        value = getattr(event, field.name)
        if isinstance(value, Event):
            result[field.name] = event_to_dict(value)
        elif isinstance(value, tuple):
            result[field.name] = [event_to_dict(item) for item in value]
        else:
            result[field.name] = value
    return result


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from :func:`event_to_dict`'s output (validating it again).

    A malformed description is a ValueError (TypeError if ``data`` is not a dict) that names
    the missing or unexpected field and the fields the event type has."""
    if not isinstance(data, dict):
        raise TypeError(
            f"data must be a dict made by event_to_dict, got {data!r} ({type(data).__name__})"
        )
    known = ", ".join(map(repr, _EVENT_TYPES))
    type_name = data.get("type")
    if not isinstance(type_name, str) or type_name not in _EVENT_TYPES:
        raise ValueError(
            f"unknown event type in {data!r}: its 'type' field must be one of {known}"
        )
    cls = _EVENT_TYPES[type_name]
    names = [field.name for field in fields(cls)]  # type: ignore[arg-type]
    unexpected = sorted(set(data) - set(names) - {"type"}, key=str)
    if unexpected:
        raise ValueError(
            f"event dict of type {type_name!r} has unexpected field {unexpected[0]!r}; its "
            f"fields are {', '.join(map(repr, names))}"
        )
    kwargs: dict[str, Any] = {}
    for field in fields(cls):  # type: ignore[arg-type]
        if field.name not in data:
            if field.default is not MISSING or field.default_factory is not MISSING:
                continue  # a field added later with a default: older descriptions lack it
            raise ValueError(
                f"event dict of type {type_name!r} is missing the field {field.name!r}; its "
                f"fields are {', '.join(map(repr, names))}"
            )
        value = data[field.name]
        if isinstance(value, dict) and "type" in value:
            kwargs[field.name] = event_from_dict(value)
        elif isinstance(value, list):
            kwargs[field.name] = tuple(event_from_dict(item) for item in value)
        else:
            kwargs[field.name] = value
    return cls(**kwargs)
