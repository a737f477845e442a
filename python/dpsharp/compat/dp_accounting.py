"""dp-accounting's interface on dpsharp: its ``DpEvent`` objects and ``PrivacyAccountant`` API.

Code written for dp-accounting (TF Privacy, JAX Privacy) runs unchanged with one import
swapped::

    import dp_accounting
    from dpsharp.compat.dp_accounting import PLDAccountant      # was dp_accounting.pld.PLDAccountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    accountant = PLDAccountant()
    accountant.compose(event)
    epsilon = accountant.get_epsilon(target_delta=1e-5)

Event correspondence (:func:`from_dp_event` / :func:`to_dp_event`):

====================================  =============================================
dp-accounting                         dpsharp
====================================  =============================================
GaussianDpEvent(z)                    Gaussian(z)
LaplaceDpEvent(b)                     Laplace(b)
PoissonSampledDpEvent(q, e)           PoissonSampled(e, q)
SampledWithoutReplacementDpEvent      SampledWithoutReplacement(e, sample_size,
(n, m, e)                             dataset_size=n)
SelfComposedDpEvent(e, k)             Repeated(e, k)
ComposedDpEvent([e1, ...])            Composed((e1, ...))
NoOpDpEvent()                         Composed(()) (releases nothing)
====================================  =============================================

The noise parameters carry over unchanged: dp-accounting's accountants (like dpsharp's) read
``noise_multiplier`` as noise standard deviation / sensitivity under the accountant's
neighbouring relation (its RDP accountant applies the same formula to a Gaussian whichever the
relation). Events with no dpsharp counterpart (NonPrivate, Unsupported, RandomizedResponse,
tree aggregation, ...) raise :class:`UnsupportedEventError` naming the event, except that the
accountants accept ``NonPrivateDpEvent`` inside compositions and then report epsilon = inf and
delta = 1, as dp-accounting's do; dpsharp's
``Shuffled`` has no dp-accounting counterpart and :func:`to_dp_event` refuses it.

dp-accounting is imported lazily, only to build or recognise its objects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dpsharp.accountants import Accountant, accountant
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

__all__ = [
    "PLDAccountant",
    "PrivacyAccountant",
    "RDPAccountant",
    "UnsupportedEventError",
    "from_dp_event",
    "to_dp_event",
]


class UnsupportedEventError(ValueError):
    """A dp-accounting event that dpsharp cannot represent or the accountant cannot analyse.

    When dp-accounting is installed this class also derives from
    ``dp_accounting.UnsupportedEventError``, so ``except dp_accounting.UnsupportedEventError``
    in existing code keeps working (see :func:`_error_class`)."""


def _dp() -> Any:
    try:
        import dp_accounting
    except ImportError as exc:  # pragma: no cover - exercised only without the peer
        raise ImportError(
            "dpsharp.compat.dp_accounting needs dp-accounting for its event objects: "
            "pip install dp-accounting"
        ) from exc
    return dp_accounting


_ERROR_CLASS: type[Exception] | None = None


def _error_class() -> type[Exception]:
    """UnsupportedEventError, also a dp_accounting.UnsupportedEventError when available."""
    global _ERROR_CLASS
    if _ERROR_CLASS is None:
        try:
            peer = _dp().UnsupportedEventError
        except ImportError:  # pragma: no cover
            _ERROR_CLASS = UnsupportedEventError
        else:
            _ERROR_CLASS = type("UnsupportedEventError", (UnsupportedEventError, peer), {
                "__module__": __name__, "__doc__": UnsupportedEventError.__doc__})
    return _ERROR_CLASS


def from_dp_event(event: Any) -> Event:
    """The dpsharp event equivalent to dp-accounting's ``event`` (see the module table).

    Raises :class:`UnsupportedEventError` naming the first sub-event without a counterpart.
    """
    dp = _dp()
    if isinstance(event, dp.GaussianDpEvent):
        return Gaussian(event.noise_multiplier)
    if isinstance(event, dp.LaplaceDpEvent):
        return Laplace(event.noise_multiplier)
    if isinstance(event, dp.PoissonSampledDpEvent):
        return PoissonSampled(from_dp_event(event.event), event.sampling_probability)
    if isinstance(event, dp.SampledWithoutReplacementDpEvent):
        return SampledWithoutReplacement(
            from_dp_event(event.event), event.sample_size, event.source_dataset_size
        )
    if isinstance(event, dp.SelfComposedDpEvent):
        return Repeated(from_dp_event(event.event), event.count)
    if isinstance(event, dp.ComposedDpEvent):
        return Composed(tuple(from_dp_event(inner) for inner in event.events))
    if isinstance(event, dp.NoOpDpEvent):
        return Composed(())
    if isinstance(event, dp.DpEvent):
        raise _error_class()(f"{event!r} has no dpsharp counterpart")
    raise TypeError(f"event must be a dp_accounting DpEvent, got {event!r} ({type(event).__name__})")


def to_dp_event(event: Event) -> Any:
    """dp-accounting's event equivalent to the dpsharp ``event`` (inverse of
    :func:`from_dp_event`; ``Composed(())`` becomes ``NoOpDpEvent()``)."""
    dp = _dp()
    if isinstance(event, Gaussian):
        return dp.GaussianDpEvent(event.noise_multiplier)
    if isinstance(event, Laplace):
        return dp.LaplaceDpEvent(event.scale)
    if isinstance(event, PoissonSampled):
        return dp.PoissonSampledDpEvent(event.sampling_probability, to_dp_event(event.event))
    if isinstance(event, SampledWithoutReplacement):
        return dp.SampledWithoutReplacementDpEvent(
            event.dataset_size, event.sample_size, to_dp_event(event.event)
        )
    if isinstance(event, Repeated):
        return dp.SelfComposedDpEvent(to_dp_event(event.event), event.count)
    if isinstance(event, Composed):
        if not event.events:
            return dp.NoOpDpEvent()
        return dp.ComposedDpEvent([to_dp_event(inner) for inner in event.events])
    if isinstance(event, Event):
        raise _error_class()(f"{event!r} has no dp-accounting counterpart")
    raise TypeError(f"event must be a dpsharp event, got {event!r} ({type(event).__name__})")


def _strip_non_private(event: Any) -> tuple[Any, bool]:
    """Remove ``NonPrivateDpEvent`` parts reachable through composition (dp-accounting's
    accountants accept them and then report epsilon = inf, delta = 1); returns the rest and
    whether any was found."""
    dp = _dp()
    if isinstance(event, dp.NonPrivateDpEvent):
        return dp.NoOpDpEvent(), True
    if isinstance(event, dp.SelfComposedDpEvent):
        inner, found = _strip_non_private(event.event)
        return dp.SelfComposedDpEvent(inner, event.count), found and event.count > 0
    if isinstance(event, dp.ComposedDpEvent):
        parts = [_strip_non_private(inner) for inner in event.events]
        return dp.ComposedDpEvent([part for part, _ in parts]), any(found for _, found in parts)
    return event, False


def _relation(neighboring_relation: Any) -> Neighbouring:
    """dp-accounting's NeighboringRelation (or its name, or a dpsharp Neighbouring) -> ours."""
    if isinstance(neighboring_relation, Neighbouring):
        return neighboring_relation
    name = getattr(neighboring_relation, "name", neighboring_relation)
    mapping = {
        "ADD_OR_REMOVE_ONE": Neighbouring.ADD_REMOVE,
        "REPLACE_ONE": Neighbouring.REPLACE_ONE,
        "add_remove": Neighbouring.ADD_REMOVE,
        "replace_one": Neighbouring.REPLACE_ONE,
    }
    if name not in mapping:
        raise ValueError(
            "neighboring_relation must be NeighboringRelation.ADD_OR_REMOVE_ONE or REPLACE_ONE, "
            f"got {neighboring_relation!r}"
        )
    return mapping[name]


class PrivacyAccountant:
    """dp-accounting's ``PrivacyAccountant`` interface over a dpsharp accountant.

    ``compose(event, count=1)`` takes dp-accounting ``DpEvent`` objects (or dpsharp events),
    validates the whole event first and returns ``self``; ``supports(event)``;
    ``get_epsilon(target_delta)``; ``get_delta(target_epsilon)``; ``ledger`` (the composed
    events as one dp-accounting ``ComposedDpEvent``, as dp-accounting's ``DpEventBuilder``
    builds it); ``neighboring_relation`` (dp-accounting's enum). The dpsharp accountant is
    :attr:`dpsharp_accountant`.
    """

    family: str = ""

    def __init__(self, neighboring_relation: Any = None, **options: Any) -> None:
        relation = Neighbouring.ADD_REMOVE if neighboring_relation is None else _relation(neighboring_relation)
        self._relation = relation
        self._accountant: Accountant = accountant(self.family, neighbouring=relation.value, **options)
        self._builder: Any = None
        self._non_private = False

    @property
    def neighboring_relation(self) -> Any:
        """dp-accounting's NeighboringRelation member for this accountant's relation."""
        enum = _dp().NeighboringRelation
        return enum.ADD_OR_REMOVE_ONE if self._relation is Neighbouring.ADD_REMOVE else enum.REPLACE_ONE

    @property
    def dpsharp_accountant(self) -> Accountant:
        return self._accountant

    def _convert(self, event: Any) -> tuple[Event | None, str | None, bool]:
        """(dpsharp event, why unsupported or None, whether it contains a NonPrivateDpEvent)."""
        if isinstance(event, Event):
            converted: Event = event
            non_private = False
        else:
            event, non_private = _strip_non_private(event)
            try:
                converted = from_dp_event(event)
            except UnsupportedEventError as exc:
                return None, str(exc), non_private
        return converted, self._accountant.unsupported_reason(converted), non_private

    def supports(self, event: Any) -> bool:
        """Whether :meth:`compose` would accept ``event``."""
        converted, reason, _ = self._convert(event)
        return converted is not None and reason is None

    def compose(self, event: Any, count: int = 1) -> PrivacyAccountant:
        """Compose ``count`` runs of ``event``; returns ``self``. Raises
        :class:`UnsupportedEventError` (also a ``dp_accounting.UnsupportedEventError``) naming
        the unsupported sub-event, leaving the state unchanged."""
        dp = _dp()
        if not isinstance(event, (dp.DpEvent, Event)):
            raise TypeError(f"`event` must be `DpEvent`. Found {type(event)}.")
        converted, reason, non_private = self._convert(event)
        if converted is None or reason is not None:
            raise _error_class()(f"Unsupported event: {event}. Error: [{reason}]")
        if self._builder is None:
            self._builder = dp.DpEventBuilder()
        # dp-accounting's own ledger: validates count (an int >= 1) as dp-accounting does
        self._builder.compose(event if isinstance(event, dp.DpEvent) else to_dp_event(event), count)
        self._accountant.compose(converted, count)
        self._non_private = self._non_private or (non_private and count > 0)
        return self

    @property
    def ledger(self) -> Any:
        """The composed events as dp-accounting's ``DpEventBuilder`` would build them."""
        if self._builder is None:
            return _dp().NoOpDpEvent()
        return self._builder.build()

    def get_epsilon(self, target_delta: float) -> float:
        """epsilon(target_delta) of the composition (dpsharp's ``epsilon``); inf once a
        ``NonPrivateDpEvent`` was composed (as in dp-accounting)."""
        epsilon = float(self._accountant.epsilon(target_delta))
        return math.inf if self._non_private else epsilon

    def get_delta(self, target_epsilon: float) -> float:
        """delta(target_epsilon) of the composition (dpsharp's ``delta``); 1 once a
        ``NonPrivateDpEvent`` was composed (as in dp-accounting)."""
        delta = float(self._accountant.delta(target_epsilon))
        return 1.0 if self._non_private else delta


class PLDAccountant(PrivacyAccountant):
    """dp-accounting's ``pld.PLDAccountant`` interface on dpsharp's tight PLD accountant:
    ``get_epsilon`` / ``get_delta`` are certified upper bounds. dp-accounting's
    ``value_discretization_interval`` is accepted and ignored (dpsharp chooses its grid from
    ``precision``, passed through ``**options``)."""

    family = "pld"

    def __init__(
        self,
        neighboring_relation: Any = None,
        value_discretization_interval: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(neighboring_relation, **options)

    def get_epsilon_bounds(self, target_delta: float) -> tuple[float, float]:
        """Certified (lower, upper) epsilon."""
        if self._accountant.is_empty:
            return (0.0, 0.0)
        lower, upper = self._accountant.epsilon_bounds(target_delta)  # type: ignore[attr-defined]
        return (float(lower), float(upper))


class RDPAccountant(PrivacyAccountant):
    """dp-accounting's ``rdp.RdpAccountant`` interface on dpsharp's RDP accountant
    (``RDPAccountant(orders=None, neighboring_relation=...)``);
    ``get_epsilon_and_optimal_order`` as there."""

    family = "rdp"

    def __init__(self, orders: Sequence[float] | None = None, neighboring_relation: Any = None, **options: Any) -> None:
        if orders is not None:
            options["orders"] = list(orders)
        super().__init__(neighboring_relation, **options)

    def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float]:
        """(epsilon, the RDP order that attains it)."""
        guarantee = self._accountant.guarantee(target_delta)
        order = next(
            (guarantee.details[key] for key in ("order", "optimal_order", "best_order", "alpha")
             if key in guarantee.details),
            float("nan"),
        )
        return (float(guarantee.epsilon), float(order))
