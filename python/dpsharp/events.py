"""Events: immutable descriptions of what a randomised mechanism did.

Every accountant, the training engine, calibration and the command line describe work with
these same objects. An event's meaning never changes; new
behaviour gets a new event class.

Neighbouring relations and sensitivities
----------------------------------------
Noise is always stated relative to the sensitivity of the released query *under the
neighbouring relation of the analysis* (:class:`Neighbouring`). For a sum of per-example values
clipped to L2 norm C (DP-SGD's clipped gradient sum):

* add/remove one (:attr:`Neighbouring.ADD_REMOVE`): D, D' differ by the presence of one
  record. The clipped sum has L2 sensitivity C.
* zero-out (:attr:`Neighbouring.ZERO_OUT`; Kairouz, McMahan, Song, Thakkar, Thakurta, Xu 2021,
  "Practical and Private (Deep) Learning without Sampling or Shuffling", Section 2): D and D'
  have the same n record slots and D' equals D except that one record x is replaced by the
  *null record* ⊥. Sampling and batching act on slots (⊥ occupies its place in a permutation or
  a fixed-size sample), while every released query ignores ⊥: its clipped contribution is 0.
  The clipped sum has L2 sensitivity ||clip(x)|| <= C.
* replace one (:attr:`Neighbouring.REPLACE_ONE`): D, D' have the same size and differ in the
  value of one record. The clipped sum has L2 sensitivity 2C.

So for DP-SGD with clipping norm C and noise standard deviation s = sigma C, one step is
``Gaussian(sigma)`` (= s / C) under add/remove and under zero-out, and ``Gaussian(sigma / 2)``
(= s / (2 C)) under replace one. Zero-out is symmetric (the guarantee covers D against D' and
D' against D); a zero-out pair is a replace-one pair whose new value is ⊥, so a replace-one
guarantee (with its own multiplier, relative to 2C) also covers zero-out pairs.

Which events are valid under which relation (``Event.neighbourings``)
---------------------------------------------------------------------
* ``Gaussian``, ``Laplace`` (unsampled): valid under every relation; their analysis needs only
  the sensitivity under the relation, relative to which the noise is stated.
* ``PoissonSampled``: add/remove and zero-out. Zero-out sketch: write D = R + {x} and
  D' = R + {⊥}. Every slot is kept independently with probability q and the query ignores ⊥,
  so M(D') has exactly the law of M(R): each zero-out pair (D, D') yields the pair of output
  laws of the add/remove pair (D, R), and (D', D) that of (R, D). An add/remove guarantee
  covers both orders, so it holds verbatim under zero-out: same privacy-loss distributions
  (both the remove and the add direction), same Renyi curves. In that reduction the inner
  event runs on a sample with x against the same sample without it, so the inner event is
  analysed under add/remove (:attr:`Event.child_neighbouring`). Refused under replace one
  (no Poisson replace-one analysis here).
* ``SampledWithoutReplacement``: replace one only (Wang, Balle, Kasiviswanathan 2019). Under
  zero-out use a replace-one accountant with the multiplier relative to 2C (a zero-out pair is
  a replace-one pair), which this module does not do silently.
* ``Shuffled`` (one epoch of random reshuffling): zero-out and replace one, never add/remove
  (see :class:`Shuffled` for the proof sketch and the counterexample).
* ``Composed``, ``Repeated``: valid under every relation; children under the same relation.
* ``GaussianMixture``: add/remove and zero-out; ``ReplaceOnePoissonSampledGaussian``: replace
  one only (the replace-one analysis of Poisson sampling); ``TruncatedPoissonSampledGaussian``:
  add/remove only (see each class for its pair and proof).

An accountant stated under relation R accepts an event when R is in the ``neighbourings`` of
the event and, recursively, of every sub-event under the relation its parent analyses it under
(:func:`neighbouring_unsupported_reason`).

Events are frozen dataclasses: hashable, comparable, and validated at construction, so an
invalid event cannot exist. :func:`event_to_dict` / :func:`event_from_dict` give a stable,
JSON-compatible form used by accountant checkpoints.
"""

from __future__ import annotations

import enum
import math
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Iterable, Mapping

from dpsharp._validation import (
    require_count,
    require_positive_finite,
    require_probability,
    require_real,
)

__all__ = [
    "Composed",
    "DiscreteLaplace",
    "Event",
    "Gaussian",
    "GaussianMixture",
    "Laplace",
    "Neighbouring",
    "PoissonSampled",
    "RELATION_WORDS",
    "RandomizedResponse",
    "Repeated",
    "ReplaceOnePoissonSampledGaussian",
    "SampledWithoutReplacement",
    "Shuffled",
    "SingleEpochTreeAggregation",
    "TruncatedPoissonSampledGaussian",
    "ZCDP",
    "event_from_dict",
    "event_to_dict",
    "flatten",
    "neighbouring_unsupported_reason",
    "required_neighbouring",
]


class Neighbouring(str, enum.Enum):
    """The neighbouring relation a guarantee is stated under."""

    ADD_REMOVE = "add_remove"
    """D and D' differ by adding or removing one record (the relation of Abadi et al. 2016)."""
    REPLACE_ONE = "replace_one"
    """D and D' have the same size and differ in one record (Wang, Balle, Kasiviswanathan 2019)."""
    ZERO_OUT = "zero_out"
    """D and D' have the same size and D' has one record replaced by the null record, whose
    contribution to every released query is 0 (Kairouz et al. 2021, Section 2). A clipped sum
    has sensitivity C under it, as under add/remove."""


#: Plain-words statement of each relation, for privacy statements shown to users.
RELATION_WORDS: dict[Neighbouring, str] = {
    Neighbouring.ADD_REMOVE: (
        "neighbouring datasets differ by adding or removing one record (add/remove-one)"
    ),
    Neighbouring.ZERO_OUT: (
        "neighbouring datasets differ in one record being replaced by a zero (null) record "
        "whose clipped contribution is 0 (zero-out, Kairouz et al. 2021); not an add/remove "
        "guarantee"
    ),
    Neighbouring.REPLACE_ONE: (
        "neighbouring datasets have the same size and differ in the value of one record "
        "(replace-one)"
    ),
}


class Event:
    """Base class of all events. Subclasses are frozen dataclasses."""

    #: The relations this event's own analysis holds under, or None if it holds under every
    #: relation. Where it is not None the first one is the relation the analysis was first
    #: stated under (see :attr:`neighbouring`).
    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = None
    #: The relation of the first entry of :attr:`neighbourings` (None when unrestricted). Kept
    #: for event classes written before :attr:`neighbourings`: a class that sets only this
    #: attribute is valid under that one relation.
    neighbouring: ClassVar[Neighbouring | None] = None
    #: The relation the children are analysed under, for each relation of this event that
    #: changes it (a relation missing here analyses the children under the same relation).
    child_neighbouring: ClassVar[Mapping[Neighbouring, Neighbouring]] = {}
    #: Why the analysis does not hold under a relation, for a refusal that helps the user.
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {}

    @classmethod
    def allowed_neighbourings(cls) -> tuple[Neighbouring, ...] | None:
        """The relations this event's own analysis holds under (None: every relation)."""
        if cls.neighbourings is not None:
            return cls.neighbourings
        if cls.neighbouring is not None:
            return (cls.neighbouring,)
        return None

    def children(self) -> tuple[Event, ...]:
        """The events nested directly inside this one."""
        return ()


def _freeze_float(obj: object, name: str, value: float) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class Gaussian(Event):
    """The Gaussian mechanism: release f(D) + N(0, (noise_multiplier * Delta_2)^2 I).

    ``noise_multiplier`` = noise standard deviation / L2 sensitivity Delta_2 of f under the
    neighbouring relation of the enclosing analysis (see the module docstring; for a sum clipped
    to norm C that is C under add/remove and zero-out, 2C under replace one). Valid under every
    relation. Its privacy-loss distribution is N(mu^2/2, mu^2) with mu = 1/noise_multiplier
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
    "Tail of Two Densities" blog, 003). Valid under every relation.
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

    Also valid under zero-out, with the same numbers: with D = R + {x} and D' = R + {⊥}, each
    slot is kept independently and every query ignores ⊥, so M(D') has the law of M(R), and
    the zero-out pairs give exactly the add/remove pairs (D, R) and (R, D), both of which the
    add/remove analysis covers (module docstring). The inner ``event`` is then analysed under
    add/remove. Not valid under replace one (see ``ReplaceOnePoissonSampledGaussian``). An inner
    ``Laplace`` event (the pair (1 - q) Lap(0, b) + q Lap(1, b) against Lap(0, b), and the
    reverse) is accounted by ``PLDAccountant`` only (:mod:`dpsharp.accountants._pld_continuous`).
    """

    event: Event
    sampling_probability: float

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (
        Neighbouring.ADD_REMOVE,
        Neighbouring.ZERO_OUT,
    )
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.ADD_REMOVE
    child_neighbouring: ClassVar[Mapping[Neighbouring, Neighbouring]] = {
        Neighbouring.ZERO_OUT: Neighbouring.ADD_REMOVE
    }
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.REPLACE_ONE: (
            "Poisson sampling is analysed under add/remove one (and zero-out, where it gives "
            "the same numbers); there is no replace-one analysis of it here"
        ),
    }

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
    accountant". Sampling rate gamma = sample_size / dataset_size. Not accepted under
    add/remove or zero-out: a zero-out pair is a replace-one pair, so account it under
    replace one (noise multiplier relative to the replace-one sensitivity, 2C for a clipped sum).
    """

    event: Event
    sample_size: int
    dataset_size: int

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (Neighbouring.REPLACE_ONE,)
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.REPLACE_ONE
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.ADD_REMOVE: (
            "sampling a fixed number of records without replacement is analysed under replace "
            "one (the dataset size is public)"
        ),
        Neighbouring.ZERO_OUT: (
            "sampling without replacement is analysed under replace one only; a zero-out pair "
            "is a replace-one pair, so account it with neighbouring='replace_one' and the noise "
            "multiplier relative to the replace-one sensitivity (sigma / 2 for a clipped sum)"
        ),
    }

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

    Valid under zero-out and replace one, where it costs what one run of ``event`` costs (Yu et
    al. 2019, Theorem 2, parallel composition; the max rho over the disjoint batches). Proof
    sketch: D and D' have the same n slots and differ in slot i only (x against ⊥, or x against
    x'). Couple the two runs with the same permutation pi. Given pi, the batches without slot i
    are identical and independent of the one batch that holds it, on which ``event`` runs on a
    pair of batches that are neighbours under the same relation. So, given pi, the divergence
    (hockey-stick at every epsilon, Renyi at every order) is at most that of one run of
    ``event``; the epoch's output laws are the mixtures over pi with the same weights, and these
    divergences are jointly convex (quasi-convex for Renyi), so the epoch's is at most the same.
    For DP-SGD with noise standard deviation sigma C the epoch is ``Shuffled(Gaussian(sigma))``
    under zero-out (sensitivity C) and ``Shuffled(Gaussian(sigma / 2))`` under replace one
    (sensitivity 2C).

    **Not valid under add/remove one**, and refused there: adding a record shifts every record
    after it in the permutation by one slot, across batch boundaries (and can add a batch), so
    the batches are not a data-independent partition and several batches change. Exactly: for
    clipped scalars D = {1, 1, 1}, D' = D + {-1}, batch size 2 and noise standard deviation 1
    on each batch sum, one epoch has delta(3) ~ 0.092, while ``Gaussian(1)`` promises 0.0015
    (tests/test_soundness_sampling.py). Use Poisson sampling for an add/remove guarantee.
    """

    event: Event
    batch_size: int
    dataset_size: int

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (
        Neighbouring.ZERO_OUT,
        Neighbouring.REPLACE_ONE,
    )
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.ZERO_OUT
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.ADD_REMOVE: (
            "random reshuffling has no add/remove-one guarantee: cutting a random permutation "
            "into fixed-size batches is not a data-independent partition, since adding a record "
            "shifts the records after it across batch boundaries (and can add a batch), so one "
            "added record changes several batches. Alternatives: Poisson sampling "
            "(PoissonSampled, a Poisson data loader) for an add/remove guarantee, or an "
            "accountant with neighbouring='zero_out' (a record replaced by a null record; the "
            "same noise multiplier, since a clipped sum has sensitivity C) or "
            "neighbouring='replace_one' (sensitivity 2C: Shuffled(Gaussian(sigma / 2)) for "
            "noise standard deviation sigma C)"
        ),
    }

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


def neighbouring_unsupported_reason(
    event: Event, relation: Neighbouring | str, *, analyser: str = "this analysis"
) -> str | None:
    """None if every sub-event of ``event`` is valid under ``relation``, else a sentence naming
    the first sub-event that is not, why, and what to do instead.

    A sub-event is checked under the relation its parent analyses it under
    (:attr:`Event.child_neighbouring`; e.g. the inner event of a Poisson-sampled step under
    zero-out is analysed under add/remove). ``analyser`` names the accountant in the sentence.
    """
    _require_event("event", event)
    outer = Neighbouring(relation)
    stack: list[tuple[Event, Neighbouring, Event | None]] = [(event, outer, None)]
    while stack:
        current, current_relation, parent = stack.pop()
        allowed = current.allowed_neighbourings()
        if allowed is not None and current_relation not in allowed:
            names = " or ".join(repr(r.value) for r in allowed)
            where = ""
            if parent is not None and current_relation is not outer:
                where = (
                    f" (inside {parent!r}, whose {outer.value} analysis runs it under "
                    f"{current_relation.value})"
                )
            explanation = type(current).neighbouring_refusals.get(current_relation)
            sentence = (
                f"{current!r} is analysed under the {names} relation{where}, but {analyser} "
                f"states guarantees under {outer.value}"
            )
            if explanation is not None:
                sentence += f": {explanation}"
            if current_relation is outer:
                sentence += f"; create the accountant with neighbouring={allowed[0].value!r}"
            return sentence
        inner_relation = type(current).child_neighbouring.get(current_relation, current_relation)
        stack.extend((child, inner_relation, current) for child in reversed(current.children()))
    return None


def required_neighbouring(event: Event) -> dict[Neighbouring, Event]:
    """The relations that restricted sub-events of ``event`` were first analysed under (the
    first entry of their :attr:`Event.neighbourings`), each with the first such sub-event.

    Kept for compatibility: an event can be valid under several relations (``Shuffled`` under
    zero-out and replace one, ``PoissonSampled`` under add/remove and zero-out), which this
    summary cannot express; accountants use :func:`neighbouring_unsupported_reason`."""
    found: dict[Neighbouring, Event] = {}
    stack = [event]
    while stack:
        current = stack.pop()
        allowed = current.allowed_neighbourings()
        if allowed is not None and allowed[0] not in found:
            found[allowed[0]] = current
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
            result[field.name] = [
                event_to_dict(item) if isinstance(item, Event) else item for item in value
            ]
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
            kwargs[field.name] = tuple(
                event_from_dict(item) if isinstance(item, dict) else item for item in value
            )
        else:
            kwargs[field.name] = value
    return cls(**kwargs)


def _require_finite_non_negative(name: str, value: object) -> float:
    result = require_real(name, value)
    if result < 0.0:
        raise ValueError(f"{name} must be in [0, inf), got {result!r}")
    return result


@register_event_type
@dataclass(frozen=True)
class ZCDP(Event):
    """A mechanism known only by its zero-concentrated DP guarantee: (xi, rho)-zCDP, i.e.
    D_alpha(M(D) || M(D')) <= xi + rho alpha for every order alpha > 1 and neighbours D, D'
    under the relation of the enclosing analysis (Bun and Steinke 2016, Definition 1.1;
    rho-zCDP when xi = 0). The Gaussian mechanism with noise multiplier s is 1/(2 s^2)-zCDP
    with equality of the curves (Bun and Steinke 2016, Proposition 1.6). Valid under every
    relation: the guarantee is stated under the analysis' own relation.
    """

    rho: float
    xi: float = 0.0

    def __post_init__(self) -> None:
        _freeze_float(self, "rho", _require_finite_non_negative("rho", self.rho))
        _freeze_float(self, "xi", _require_finite_non_negative("xi", self.xi))


@register_event_type
@dataclass(frozen=True)
class RandomizedResponse(Event):
    """k-ary randomized response: each record holds one of ``num_buckets`` = k buckets; with
    probability ``noise_parameter`` = p the released bucket is drawn uniformly from the k
    buckets, otherwise it is the record's own (Warner 1965; the k-ary form of Kairouz, Oh,
    Viswanath 2014). P(own bucket) = 1 - p + p/k, P(any other) = p/k.

    * replace one: the pair R(x), R(x') with x != x'. The privacy loss takes the values
      +-log((1 - p + p/k) / (p/k)) (masses 1 - p + p/k and p/k) and 0 (mass (k - 2) p / k);
      symmetric in the two directions.
    * zero-out: the null record's released bucket is uniform (it ignores the record), so the
      pairs are R(x) against U and U against R(x), with losses log(1 + (k - 1)(1 - p)) and
      log(p) under R(x) (masses 1 - p + p/k, (k - 1) p / k), and their negatives under U
      (masses 1/k, (k - 1)/k): asymmetric, both directions are accounted.

    Not valid under add/remove one (a record's absence has no released bucket). p = 1 releases
    nothing about the data (loss 0); p = 0 would release the data and is refused (it is not
    differentially private).
    """

    noise_parameter: float
    num_buckets: int

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (
        Neighbouring.REPLACE_ONE,
        Neighbouring.ZERO_OUT,
    )
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.REPLACE_ONE
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.ADD_REMOVE: (
            "randomized response releases one bucket per record, so it is analysed when a "
            "record's bucket is replaced (replace_one) or replaced by the null record whose "
            "released bucket is uniform (zero_out)"
        ),
    }

    def __post_init__(self) -> None:
        _freeze_float(
            self,
            "noise_parameter",
            require_probability("noise_parameter", self.noise_parameter),
        )
        object.__setattr__(
            self, "num_buckets", require_count("num_buckets", self.num_buckets, minimum=2)
        )


#: Largest sensitivity of :class:`DiscreteLaplace` (its privacy loss has sensitivity + 1 atoms).
MAX_DISCRETE_SENSITIVITY = 10**7


@register_event_type
@dataclass(frozen=True)
class DiscreteLaplace(Event):
    """The discrete Laplace mechanism: release the integer f(D) + Z with
    P(Z = z) = (1 - e^{-a}) / (1 + e^{-a}) e^{-a |z|}, a = ``noise_parameter`` > 0, for an
    integer-valued f of L1 sensitivity ``sensitivity`` = s under the relation of the enclosing
    analysis (Ghosh, Roughgarden, Sundararajan 2009, the geometric mechanism; Canonne, Kamath,
    Steinke 2020).

    With X ~ Z and Y ~ Z + s the privacy loss log(P(X)/P(X - s)) is a s for X <= 0,
    a (s - 2x) for 0 < x < s and -a s for x >= s: s + 1 atoms with masses 1/(1 + e^{-a}),
    (1 - e^{-a}) e^{-a x} / (1 + e^{-a}) and e^{-a s} / (1 + e^{-a}); the pair is symmetric
    (x -> s - x), so both directions have this distribution. It is (a s, 0)-DP. Valid under
    every relation, with s the sensitivity under it.
    """

    noise_parameter: float
    sensitivity: int

    def __post_init__(self) -> None:
        _freeze_float(
            self,
            "noise_parameter",
            require_positive_finite("noise_parameter", self.noise_parameter),
        )
        sensitivity = require_count("sensitivity", self.sensitivity, minimum=1)
        if sensitivity > MAX_DISCRETE_SENSITIVITY:
            raise ValueError(
                f"sensitivity must be an integer in [1, {MAX_DISCRETE_SENSITIVITY}], got "
                f"{sensitivity}"
            )
        object.__setattr__(self, "sensitivity", sensitivity)


@register_event_type
@dataclass(frozen=True)
class SingleEpochTreeAggregation(Event):
    """Tree aggregation of a stream of Gaussian-noised sums, restarted after each epoch, every
    record contributing to exactly one step of one epoch (Kairouz, McMahan, Song, Thakkar,
    Thakurta, Xu 2021, "Practical and Private (Deep) Learning without Sampling or Shuffling",
    Appendix D). Epoch j has ``step_counts[j]`` steps; every node of its binary tree releases
    its sum plus Gaussian noise of standard deviation ``noise_multiplier`` times the node sum's
    sensitivity under the relation of the analysis.

    A record's step lies in at most d = ceil(log2(max_j step_counts[j] + 1)) released nodes of
    its epoch's tree and in no node of another epoch, so the releases are an adaptive
    composition of d Gaussian mechanisms of multiplier sigma for that record: the Gaussian
    mechanism of noise multiplier sigma / sqrt(d) (mu-GDP with mu = sqrt(d) / sigma, Dong, Roth,
    Su 2019, Corollary 3.3; RDP alpha d / (2 sigma^2), the value of Kairouz et al. 2021 that
    dp-accounting 0.6.0 uses). :attr:`equivalent_noise_multiplier` is sigma / sqrt(d).

    Valid under zero-out (the setting of Kairouz et al. 2021) and replace one (a replaced
    record changes the same nodes); not under add/remove, where an added record is a new step
    that shifts the tree.
    """

    noise_multiplier: float
    step_counts: tuple[int, ...]

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (
        Neighbouring.ZERO_OUT,
        Neighbouring.REPLACE_ONE,
    )
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.ZERO_OUT
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.ADD_REMOVE: (
            "tree aggregation is analysed with every record in one step of a stream of fixed "
            "length (zero_out, or replace_one)"
        ),
    }

    def __post_init__(self) -> None:
        _freeze_float(
            self,
            "noise_multiplier",
            require_positive_finite("noise_multiplier", self.noise_multiplier),
        )
        counts = self.step_counts
        if isinstance(counts, (str, bytes)) or not isinstance(counts, Iterable):
            counts = (counts,)  # type: ignore[assignment]
        steps = tuple(
            require_count(f"step_counts[{index}]", value) for index, value in enumerate(counts)
        )
        if not steps or max(steps) < 1:
            raise ValueError(
                "step_counts must hold at least one epoch with >= 1 step, got "
                f"{self.step_counts!r}"
            )
        object.__setattr__(self, "step_counts", steps)

    @property
    def depth(self) -> int:
        """d = ceil(log2(max step count + 1)): the most released nodes holding one step."""
        return max(self.step_counts).bit_length()

    @property
    def equivalent_noise_multiplier(self) -> float:
        """sigma / sqrt(d): the Gaussian mechanism this release is, per record."""
        return self.noise_multiplier / math.sqrt(self.depth)


def _require_tuple(name: str, values: object) -> tuple[object, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of real numbers, got {values!r}")
    return tuple(values)


def _freeze_fields(event: Event, positive: tuple[str, ...] = (),
                   probabilities: tuple[str, ...] = (), counts: tuple[str, ...] = ()) -> None:
    """Validate and freeze the fields of a frozen ``event`` by name: ``positive`` real numbers
    in (0, inf), ``probabilities`` in (0, 1], ``counts`` integers >= 1 (each check raises the
    error naming its field)."""
    for name in positive:
        _freeze_float(event, name, require_positive_finite(name, getattr(event, name)))
    for name in probabilities:
        _freeze_float(event, name, require_probability(name, getattr(event, name)))
    for name in counts:
        object.__setattr__(event, name, require_count(name, getattr(event, name), minimum=1))


@register_event_type
@dataclass(frozen=True)
class GaussianMixture(Event):
    """The mixture-of-Gaussians mechanism: a release whose laws on neighbouring datasets are
    (up to post-processing) P = sum_i p_i N(c_i, s^2) on the dataset holding the record and
    Q = N(0, s^2) on the one without it, with s = ``noise_multiplier``, c_i = ``sensitivities``
    (>= 0) and p_i = ``probabilities`` (summing to 1; a sum within 1e-9 of 1 is normalised),
    all relative to the sensitivity of the released query under the relation of the analysis
    (Choquette-Choo, Ganesh, Steinke, Thakurta 2023, "Privacy Amplification for Matrix
    Mechanisms": a record that contributes c_i times, with probability p_i independent of the
    data). Both orders (remove: P against Q; add: Q against P) are accounted. With one
    non-zero c it is the Poisson-sampled Gaussian of multiplier s / c and rate the total
    probability of c.

    The privacy loss of the remove pair, log sum_i p_i e^{(c_i x - c_i^2 / 2) / s^2}, is
    non-decreasing in x (c_i >= 0), so the tight accountant discretises it with a certified
    bound (:mod:`dpsharp.accountants._pld_continuous`). Valid under add/remove and zero-out
    (the null record contributes 0 whatever its participation, as for ``PoissonSampled``);
    not under replace one. Accounted by the tight accountant (``PLDAccountant``) only; the
    RDP, moments, zCDP, GDP and classic accountants refuse it (no analysis of it there).
    """

    noise_multiplier: float
    sensitivities: tuple[float, ...]
    probabilities: tuple[float, ...]

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (
        Neighbouring.ADD_REMOVE,
        Neighbouring.ZERO_OUT,
    )
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.ADD_REMOVE
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.REPLACE_ONE: (
            "the mixture of Gaussians is analysed as the pair of a record's presence against "
            "its absence (add/remove one, or zero-out)"
        ),
    }

    def __post_init__(self) -> None:
        _freeze_fields(self, positive=("noise_multiplier",))
        raw_c = _require_tuple("sensitivities", self.sensitivities)
        raw_p = _require_tuple("probabilities", self.probabilities)
        if not raw_c or len(raw_c) != len(raw_p):
            raise ValueError(
                "sensitivities and probabilities must be non-empty and of the same length, got "
                f"{len(raw_c)} and {len(raw_p)}"
            )
        sens = tuple(
            _require_finite_non_negative(f"sensitivities[{i}]", c) for i, c in enumerate(raw_c)
        )
        if any(math.isinf(c) for c in sens):
            raise ValueError(f"sensitivities must be finite, in [0, inf), got {raw_c!r}")
        probs = tuple(
            require_probability(f"probabilities[{i}]", p, allow_zero=True)
            for i, p in enumerate(raw_p)
        )
        total = math.fsum(probs)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"probabilities must sum to 1 (within 1e-9), got sum {total!r}")
        if total != 1.0:
            # A distribution: the probabilities within 1e-9 of summing to 1 are taken divided by
            # their sum (used as given, P would lack up to 1e-9 of its mass, and the remove
            # direction's delta read up to 7e-10 relative below the mixture's).
            probs = tuple(p / total for p in probs)
        if not any(c > 0.0 and p > 0.0 for c, p in zip(sens, probs)):
            raise ValueError(
                "sensitivities must hold a value in (0, inf) with a probability in (0, 1]; a "
                "mixture whose only sensitivity is 0 releases nothing"
            )
        object.__setattr__(self, "sensitivities", sens)
        object.__setattr__(self, "probabilities", probs)


@register_event_type
@dataclass(frozen=True)
class ReplaceOnePoissonSampledGaussian(Event):
    """Poisson subsampling of a clipped sum under replace one: every record slot joins the
    sample independently with probability q = ``sampling_probability``; the release is the sum
    over the sample of per-record values of L2 norm at most C, plus N(0, (z 2C)^2 I), with
    z = ``noise_multiplier`` relative to the replace-one sensitivity 2C (module docstring: a
    sampled record contributes its value, an unsampled one 0).

    Pair: condition on the other slots (the same in D and D'); the replaced slot is kept with
    probability q and then contributes v or v' (||v||, ||v'|| <= C), so the laws are
    (1 - q) N(0) + q N(v) against (1 - q) N(0) + q N(v'), dominated by the one-dimensional pair
    P = (1 - q) N(0, z^2) + q N(-1/2, z^2), Q = (1 - q) N(0, z^2) + q N(1/2, z^2) (v = -v' of
    norm C, in units of 2C; Zhu, Dong, Wang 2022, "Optimal Accounting of Differential Privacy
    via Characteristic Function", Poisson subsampling under replace-one; Lebeda, Regehr,
    Kamath, Steinke 2024, "Avoiding Pitfalls for Privacy Accounting of Subsampled Mechanisms
    under Composition"). The pair is symmetric (x -> -x swaps P and Q), so one direction is
    accounted; q = 1 is ``Gaussian(z)`` under replace one. dp-accounting 0.6.0's PLD accountant
    analyses ``PoissonSampledDpEvent(q, GaussianDpEvent(2 z))`` under REPLACE_ONE with this pair.
    Its privacy loss is non-increasing in x, and the tight accountant discretises it with a
    certified bound (:mod:`dpsharp.accountants._pld_continuous`). Valid under replace one only.
    Accounted by ``PLDAccountant`` only; the RDP, moments, zCDP, GDP and classic accountants
    refuse it (no replace-one analysis of Poisson sampling there).
    """

    noise_multiplier: float
    sampling_probability: float

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (Neighbouring.REPLACE_ONE,)
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.REPLACE_ONE
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.ADD_REMOVE: (
            "this is the replace-one analysis of Poisson sampling; under add/remove one use "
            "PoissonSampled(Gaussian(...), q)"
        ),
        Neighbouring.ZERO_OUT: (
            "this is the replace-one analysis of Poisson sampling; under zero-out use "
            "PoissonSampled(Gaussian(...), q)"
        ),
    }

    def __post_init__(self) -> None:
        _freeze_fields(self, positive=("noise_multiplier",),
                       probabilities=("sampling_probability",))


@register_event_type
@dataclass(frozen=True)
class TruncatedPoissonSampledGaussian(Event):
    """Truncated Poisson subsampling of a clipped sum (Chua, Ghazi, Kamath, Kumar, Manurangsi,
    Sinha, Zhang 2024, "Scalable DP-SGD: Shuffling vs. Poisson Subsampling"): each of the
    ``dataset_size`` = n records joins the batch independently with probability q =
    ``sampling_probability``; a batch larger than ``max_batch_size`` = B is cut to B records
    chosen uniformly; the release is the batch's sum of values of L2 norm at most C plus
    N(0, (sigma C)^2 I), sigma = ``noise_multiplier`` (relative to C, the add/remove
    sensitivity). Analysed under add/remove one, with n the size of the dataset holding the
    record.

    Let K be the number of the other n - 1 records that join, K ~ Binom(n - 1, q), the same
    law on both datasets and independent of the record. On K < B no truncation can involve
    the record and the pair is the Poisson-sampled Gaussian's, ((1 - q) N(0) + q N(1), N(0))
    in units of C (and the reverse). On K >= B, with probability t = P(K >= B), the record,
    when kept, replaces another record of the batch, with q' = P(Binom(n, q) > B) B / (t n)
    the probability that it is in the cut batch given K >= B; that branch is bounded by the
    replace-one pair ((1 - q') N(0, (sigma/2)^2) + q' N(-1, (sigma/2)^2), (1 - q') N(0,
    (sigma/2)^2) + q' N(1, (sigma/2)^2)) (Chua et al. 2024; the pair dp-accounting 0.6.0 uses).

    Revealed-branch mixture. Let M' output (1[K >= B], M's output). M is a post-processing of
    M' (drop the first coordinate), so every hockey-stick divergence of M is at most M''s
    (the data-processing inequality), for one release and, releasing the branch of every step,
    for every adaptive composition. The branch has the same law on both datasets, so M''s
    privacy-loss distribution is the mixture with weights (1 - t, t) of the two branches'
    loss distributions: its delta(eps) = (1 - t) delta_1(eps) + t delta_2(eps). The tight
    accountant discretises that mixture with a certified bound
    (:mod:`dpsharp.accountants._pld_continuous`). Valid under add/remove one only (under
    zero-out the null record takes a place in the batch, a different pair). Accounted by
    ``PLDAccountant`` only; the other accountants refuse it.
    """

    noise_multiplier: float
    sampling_probability: float
    dataset_size: int
    max_batch_size: int

    neighbourings: ClassVar[tuple[Neighbouring, ...] | None] = (Neighbouring.ADD_REMOVE,)
    neighbouring: ClassVar[Neighbouring | None] = Neighbouring.ADD_REMOVE
    neighbouring_refusals: ClassVar[Mapping[Neighbouring, str]] = {
        Neighbouring.ZERO_OUT: (
            "truncated Poisson sampling is analysed under add/remove one (a null record "
            "would take a place in the truncated batch)"
        ),
        Neighbouring.REPLACE_ONE: (
            "truncated Poisson sampling is analysed under add/remove one here"
        ),
    }

    def __post_init__(self) -> None:
        _freeze_fields(self, positive=("noise_multiplier",),
                       probabilities=("sampling_probability",),
                       counts=("dataset_size", "max_batch_size"))
