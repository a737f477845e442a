"""The interface every dpsharp accountant implements.

An accountant turns the events a run performed into a privacy guarantee. The contract:

* ``compose(event, count=1) -> self`` validates the *whole* event first (type, neighbouring
  relation, support of every sub-event) and only then changes state, so a refused event
  leaves the accountant exactly as it was.
* The state is the multiset of composed mechanism events (:func:`dpsharp.events.flatten`),
  kept in order of first appearance. Every answer is a function of that multiset alone, which
  is why ``Repeated``, ``Composed`` and ``count`` agree exactly, and why a state restored with
  :meth:`load_state_dict` gives bit-for-bit the same answers as the original.
* ``epsilon(delta)`` and ``delta(epsilon)`` return floats; ``guarantee(delta)`` returns a
  :class:`PrivacyGuarantee` that also says whether the number is a certified bound or an
  approximation, and carries family-specific details (the RDP order, the GDP mu, bounds).
* Each accountant states its guarantees under one neighbouring relation (add/remove, zero-out
  or replace one; :class:`dpsharp.events.Neighbouring`), fixed at construction. An event
  whose analysis does not hold under it (e.g. Poisson sampling, an add/remove and zero-out
  analysis, inside a replace-one accountant; a reshuffled epoch inside an add/remove one) is
  refused with :class:`UnsupportedEventError` saying why, never silently mis-accounted
  (:func:`dpsharp.events.neighbouring_unsupported_reason`).
"""

from __future__ import annotations

import abc
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, TypeVar

from dpsharp._validation import require_count, require_delta, require_epsilon
from dpsharp.events import (
    Event,
    Neighbouring,
    event_from_dict,
    event_to_dict,
    flatten,
    neighbouring_unsupported_reason,
)

__all__ = ["Accountant", "PrivacyGuarantee", "UnsupportedEventError"]

_STATE_FORMAT = 1

#: The most runs of one event an accountant composes: every accountant weighs an event by its
#: count as a float, and a larger integer overflowed that conversion (an OverflowError from
#: deep inside).
_LARGEST_COUNT = int(sys.float_info.max)

AccountantT = TypeVar("AccountantT", bound="Accountant")


class UnsupportedEventError(ValueError):
    """The accountant cannot analyse an event (or one of its sub-events). The message names the
    sub-event and the reason."""


@dataclass(frozen=True)
class PrivacyGuarantee:
    """An (epsilon, delta) statement and how much to trust it.

    ``epsilon`` is the number to report: a proven upper bound when ``certified`` is True, an
    approximation otherwise (e.g. the GDP central limit theorem). ``epsilon_lower``, when
    known, is a proven lower bound on the optimal epsilon of the same composition.
    """

    epsilon: float
    delta: float
    certified: bool
    accountant: str
    neighbouring: Neighbouring
    epsilon_lower: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    warning: str | None = None


class Accountant(abc.ABC):
    """Base class: validation, the composed multiset, the ledger and checkpoints.

    Subclasses implement :meth:`_leaf_unsupported_reason`, :meth:`_epsilon`, :meth:`_delta`
    and :meth:`_options`, and may override :meth:`_on_compose` to update incremental caches.
    """

    #: Registry name ("rdp", "pld", ...).
    name: ClassVar[str] = ""

    def __init__(self, *, neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE) -> None:
        try:
            self._neighbouring = Neighbouring(neighbouring)
        except ValueError as exc:
            valid = ", ".join(repr(r.value) for r in Neighbouring)
            raise ValueError(f"neighbouring must be one of {valid}, got {neighbouring!r}") from exc
        self._counts: dict[Event, int] = {}
        self._ledger: list[tuple[Event, int]] = []
        self._version = 0

    # ------------------------------------------------------------------ certification
    @property
    def certified(self) -> bool:
        """Whether *every* answer of this accountant, as configured, is a proven bound.

        A property of the configured instance, not of the family: ``ZCDPAccountant(batching=
        "reshuffle")`` is certified, ``ZCDPAccountant(batching="sample")`` (the empirical
        P(q, sigma) of Yu et al. 2019) is not, and ``GDPAccountant`` (the central limit theorem
        of Bu et al. 2020 for sampled events) never is. When False, an individual answer may
        still be a proven bound: :attr:`PrivacyGuarantee.certified` of :meth:`guarantee` says so
        for each answer. Budgets and calibrations refuse an uncertified accountant unless the
        caller opts in (``allow_approximation=True``). Families whose answers are all proven
        bounds keep this default (or declare ``certified = True``)."""
        return True

    @property
    def version(self) -> int:
        """A counter that changes whenever the composed multiset changes (every accepted
        :meth:`compose` with a non-zero count, every :meth:`load_state_dict`). Anything derived
        from the ledger and kept between calls (e.g. a training engine's allowance of further
        steps under a budget) compares it to know the ledger moved under it."""
        return self._version

    # ------------------------------------------------------------------ composition
    @property
    def neighbouring(self) -> Neighbouring:
        """The neighbouring relation every guarantee of this accountant is stated under."""
        return self._neighbouring

    @property
    def ledger(self) -> tuple[tuple[Event, int], ...]:
        """The composed events in order, as (event, count); consecutive repeats are merged."""
        return tuple(self._ledger)

    @property
    def composed(self) -> tuple[tuple[Event, int], ...]:
        """The multiset of composed mechanism events, as (leaf event, total count)."""
        return tuple(self._counts.items())

    @property
    def composed_counts(self) -> Mapping[Event, int]:
        """:attr:`composed` as a live read-only mapping (leaf event -> total count), taken in
        O(1): :meth:`compose` only adds to it, and :meth:`load_state_dict` replaces it, so a
        view taken before a load still holds the multiset as it was then (plus anything
        composed after the view was taken and before the load)."""
        return MappingProxyType(self._counts)

    @property
    def is_empty(self) -> bool:
        return not self._counts

    def compose(self: AccountantT, event: Event, count: int = 1) -> AccountantT:
        """Compose ``count`` adaptive runs of ``event``; returns ``self``.

        Raises :class:`UnsupportedEventError` (naming the sub-event) if any part of ``event`` is
        outside what this accountant can analyse, and leaves the state unchanged.
        """
        count = require_count("count", count)
        if not isinstance(event, Event):
            raise TypeError(f"event must be a dpsharp event, got {event!r} ({type(event).__name__})")
        leaves = flatten(event, count)
        reason = self._unsupported_reason(event, leaves if count else flatten(event))
        if reason is not None:
            raise UnsupportedEventError(reason)
        for leaf, leaf_count in leaves:
            total = self._counts.get(leaf, 0) + leaf_count
            if total > _LARGEST_COUNT:  # (every accountant weighs its events by float(count))
                raise ValueError(
                    f"count must keep each composed event's total runs at most about 1.8e308 "
                    f"(the largest float); got about 1e{len(str(total)) - 1} runs of {leaf!r}"
                )
        if leaves:
            self._on_compose(leaves)
            for leaf, leaf_count in leaves:
                self._counts[leaf] = self._counts.get(leaf, 0) + leaf_count
        if count:
            if self._ledger and self._ledger[-1][0] == event:
                self._ledger[-1] = (event, self._ledger[-1][1] + count)
            else:
                self._ledger.append((event, count))
            self._version += 1
        return self

    def supports(self, event: Event) -> bool:
        """Whether :meth:`compose` would accept ``event``."""
        return self.unsupported_reason(event) is None

    def unsupported_reason(self, event: Event) -> str | None:
        """None if ``event`` is supported, else a sentence naming the offending sub-event."""
        if not isinstance(event, Event):
            return f"{event!r} is not a dpsharp event"
        return self._unsupported_reason(event, flatten(event))

    def _unsupported_reason(self, event: Event, leaves: list[tuple[Event, int]]) -> str | None:
        """:meth:`unsupported_reason` given ``flatten(event)`` (up to the counts)."""
        relation_reason = neighbouring_unsupported_reason(
            event, self._neighbouring, analyser=f"this {type(self).__name__}"
        )
        if relation_reason is not None:
            return relation_reason
        for leaf, _ in leaves:
            reason = self._leaf_unsupported_reason(leaf)
            if reason is not None:
                return f"{type(self).__name__} cannot account {leaf!r}: {reason}"
        return None

    # ------------------------------------------------------------------ queries
    def epsilon(self, delta: float) -> float:
        """The epsilon this accountant proves for the composition at ``delta`` in (0, 1) (an
        estimate where ``guarantee(delta).certified`` is False): the same float as
        ``guarantee(delta).epsilon``, whichever entry point asks. 0.0 when nothing was
        composed."""
        delta = require_delta(delta)
        if self.is_empty:
            return 0.0
        return self._epsilon(delta)

    def delta(self, epsilon: float) -> float:
        """The smallest delta for ``epsilon`` >= 0. 0.0 when nothing was composed."""
        epsilon = require_epsilon(epsilon)
        if self.is_empty:
            return 0.0
        return self._delta(epsilon)

    def guarantee(self, delta: float) -> PrivacyGuarantee:
        """:meth:`epsilon` with its provenance (``certified`` from this configured instance);
        subclasses add bounds and details."""
        return PrivacyGuarantee(
            epsilon=self.epsilon(delta),
            delta=require_delta(delta),
            certified=self.certified,
            accountant=self.name,
            neighbouring=self._neighbouring,
        )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """A JSON-compatible checkpoint: the options and the ledger of composed events."""
        return {
            "format": _STATE_FORMAT,
            "accountant": type(self).__name__,
            "options": self._options(),
            "neighbouring": self._neighbouring.value,
            "ledger": [[event_to_dict(event), count] for event, count in self._ledger],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint made by :meth:`state_dict` of an accountant of the same class
        and options; afterwards every answer equals the original's exactly."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"unsupported state format {state.get('format')!r}")
        if state.get("accountant") != type(self).__name__:
            raise ValueError(
                f"state was saved by {state.get('accountant')!r}, not {type(self).__name__!r}"
            )
        if state.get("options") != self._options():
            raise ValueError(
                f"state was saved with options {state.get('options')!r}, but this accountant "
                f"has {self._options()!r}; construct it with the same options"
            )
        if Neighbouring(state["neighbouring"]) is not self._neighbouring:
            raise ValueError(
                f"state is stated under {state['neighbouring']!r}, this accountant under "
                f"{self._neighbouring.value!r}"
            )
        ledger = [(event_from_dict(item), require_count("count", count)) for item, count in state["ledger"]]
        # A ledger this accountant refuses part-way (an event it cannot analyse, or a second
        # distinct event where it takes one) must leave the state as it was, as a refused
        # compose does: the accountant's attributes are kept (the reset and the composes below
        # rebind them, none is changed in place) and put back on any failure.
        saved = dict(self.__dict__)
        self._counts = {}
        self._ledger = []
        self._version += 1
        self._reset_caches()
        try:
            for event, count in ledger:
                self.compose(event, count)
        except BaseException:
            version = self._version
            self.__dict__.clear()
            self.__dict__.update(saved)
            self._version = version + 1  # views taken during the failed load are stale
            raise

    # ------------------------------------------------------------------ subclass hooks
    @abc.abstractmethod
    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        """None if the mechanism event ``leaf`` can be analysed, else why not."""

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float:
        """epsilon(delta) of the non-empty composed multiset ``self._counts``."""

    @abc.abstractmethod
    def _delta(self, epsilon: float) -> float:
        """delta(epsilon) of the non-empty composed multiset ``self._counts``."""

    @abc.abstractmethod
    def _options(self) -> dict[str, Any]:
        """The constructor options, JSON-compatible, checked when a state is loaded."""

    def _on_compose(self, leaves: list[tuple[Event, int]]) -> None:
        """Called with the validated leaves before they are added to ``self._counts``; may
        update caches (it must not raise for supported leaves)."""

    def _reset_caches(self) -> None:
        """Drop anything derived from ``self._counts`` (called when a state is loaded)."""

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self._options().items())
        return f"{type(self).__name__}({options})"
