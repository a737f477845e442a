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

Sensitivity convention
----------------------
dp-accounting defines its noise parameters relative to the *norm bound* C of one record's
value, not to the sensitivity: ``GaussianDpEvent(s)`` releases sum_i v_i + N(0, s^2 C^2 I) for
values with ||v_i||_2 <= C, ``LaplaceDpEvent(b)`` adds Laplace noise of scale b C for
||v_i||_1 <= C (dp_event.py, dp-accounting 0.6.0). The sensitivity of that sum is C under
ADD_OR_REMOVE_ONE and 2 C under REPLACE_ONE (the replaced value -v becomes +v), and
dp-accounting's PLD accountant reads the events that way: under REPLACE_ONE it analyses
``GaussianDpEvent(s)`` as the pair N(-1, s^2), N(+1, s^2), a mean shift of 2, i.e. the Gaussian
mechanism with mu = 2 / s (Balle and Wang 2018, Theorem 8: delta(eps) = Phi(mu/2 - eps/mu) -
e^eps Phi(-mu/2 - eps/mu)); ``PLDAccountant(REPLACE_ONE)`` gives epsilon 9.997 for
``GaussianDpEvent(1.0)`` at delta 1e-5.

dpsharp states every noise parameter relative to the sensitivity *under the relation of the
analysis* (:mod:`dpsharp.events`). The conversion therefore depends on the relation:

====================================  ===============================  ===========================
dp-accounting                         under ADD_OR_REMOVE_ONE          under REPLACE_ONE
====================================  ===============================  ===========================
GaussianDpEvent(s)                    Gaussian(s)                      Gaussian(s / 2)
LaplaceDpEvent(b)                     Laplace(b)                       refused (see below)
PoissonSampledDpEvent(q, e)           PoissonSampled(e', q)            ReplaceOnePoissonSampled-
(e Gaussian or Laplace)                                                Gaussian(s / 2, q) for e =
                                                                       GaussianDpEvent(s); other
                                                                       e refused (as in dp-acc.)
SampledWithoutReplacementDpEvent      SampledWithoutReplacement(       the same
(n, m, e)                             e'', m, dataset_size=n)
SelfComposedDpEvent(e, k)             Repeated(e', k)                  Repeated(e', k)
ComposedDpEvent([e1, ...])            Composed((e1', ...))             Composed((e1', ...))
NoOpDpEvent()                         Composed(()) (releases nothing)  the same
ZCDpEvent(rho, xi)                    ZCDP(rho, xi)                    the same
RepeatAndSelectDpEvent(e, mean, k)    PoissonTuning(e', mean) (k inf)  the same
                                      or TruncatedNegativeBinomial-
                                      Tuning(e', k, gamma)
RandomizedResponseDpEvent(p, k)       refused (as in dp-accounting)    RandomizedResponse(p, k)
                                                                       (REPLACE_SPECIAL: its
                                                                       zero-out pairs)
DiscreteLaplaceDpEvent(a, s)          DiscreteLaplace(a, s)            refused (as in dp-acc.)
SingleEpochTreeAggregationDpEvent     refused (as in dp-accounting)    refused under REPLACE_ONE;
(s, steps)                                                             REPLACE_SPECIAL: Single-
                                                                       EpochTreeAggregation
MixtureOfGaussiansDpEvent(s, c, p)    PoissonSampled(Gaussian(s / c),  refused (as in dp-acc.)
with one non-zero sensitivity c       sum of p where c)
MixtureOfGaussiansDpEvent(s, c, p)    GaussianMixture(s, c, p)         refused (as in dp-acc.)
with several non-zero sensitivities
TruncatedSubsampledGaussianDpEvent    TruncatedPoissonSampled-         refused (analysed under
(n, q, B, s)                          Gaussian(s, q, n, B)             add/remove only here)
====================================  ===============================  ===========================

A Gaussian composition inside a sampled event (``PoissonSampledDpEvent(q, ComposedDpEvent(
[GaussianDpEvent(s_1), ...]))``) is the one Gaussian of noise multiplier (sum 1/s_i^2)^(-1/2)
it is equivalent to, as dp-accounting's RDP accountant reads it.

e' is ``e`` converted under the same relation; e'' is ``e`` converted under REPLACE_ONE
whatever the accountant's relation, because sampling without replacement is analysed under
replace-one only (Wang, Balle, Kasiviswanathan 2019; dpsharp's accountants and dp-accounting's
accept it only under that relation), so ``SampledWithoutReplacementDpEvent(n,
m, GaussianDpEvent(s))`` becomes ``SampledWithoutReplacement(Gaussian(s / 2), m, n)``: with m = n
it is the plain Gaussian event and gets the same number. Both adapter accountants (PLD and
RDP) use this one reading, so the same ledger describes the same mechanism in both.

Where dp-accounting does not follow its own definition, the adapters take the conservative
side and are never less conservative than dp-accounting:

* dp-accounting 0.6.0's ``RdpAccountant`` gives ``GaussianDpEvent(s)`` the RDP alpha / (2 s^2)
  under every relation, and uses the same base RDP inside ``SampledWithoutReplacementDpEvent``:
  under REPLACE_ONE that is a mean shift of 1, half the sensitivity of the event's definition
  and of dp-accounting's own PLD accountant (its RDP gives 4.73 for ``GaussianDpEvent(1.0)`` at
  delta 1e-5, below the exact 9.997 of the mechanism it defines). :class:`RDPAccountant` here
  reads shift 2 (10.73), so under REPLACE_ONE it reports more than dp-accounting's RDP.
* ``LaplaceDpEvent`` under REPLACE_ONE is refused: dp-accounting's PLD accountant refuses it and
  its RDP accountant reads L1 sensitivity 1 where the definition gives 2, so the event has no
  single meaning there. State the mechanism as ``dpsharp.Laplace(scale)`` (scale = Laplace
  scale / L1 sensitivity under replace-one) in ``dpsharp.accountant(..., neighbouring=
  "replace_one")``.
* ``PoissonSampledDpEvent(q, GaussianDpEvent(s))`` under REPLACE_ONE is dp-accounting's pair
  (1 - q) N(0, s^2) + q N(-1, s^2) against (1 - q) N(0, s^2) + q N(1, s^2), dpsharp's
  ``ReplaceOnePoissonSampledGaussian(s / 2, q)`` (accounted by the PLD adapter; the RDP
  adapter has no replace-one analysis of Poisson sampling and refuses it). Any other sampled
  event is refused under REPLACE_ONE, as dp-accounting refuses it.
* The PLD adapter accounts the events whose privacy loss is continuous but not one of the
  compiled core's (``GaussianMixture``, ``PoissonSampled(Laplace)``,
  ``ReplaceOnePoissonSampledGaussian``, ``TruncatedPoissonSampledGaussian``) with the
  certified discretisation of :mod:`dpsharp.accountants._pld_continuous`; the RDP adapter
  refuses them (no RDP analysis of them here). ``TruncatedSubsampledGaussianDpEvent`` is
  accepted under ADD_OR_REMOVE_ONE only (dp-accounting also takes the other relations).
* ``NeighboringRelation.REPLACE_SPECIAL`` (a record replaced by a special record that adds
  zero to every released sum; Kairouz et al. 2021, Definition 1.1) is dpsharp's zero-out
  relation: the events convert as under ADD_OR_REMOVE_ONE (sensitivity C), as dp-accounting
  reads them there.
* RDP orders outside (1, 1e6] (dp-accounting accepts 1 and inf): order 1 is the KL divergence
  where it has a closed form (and otherwise bounded by order 1 + 2^-20), orders above 1e6 the
  closed forms where they exist (at inf the largest privacy loss: randomized response,
  Laplace, discrete Laplace) and inf otherwise (:func:`_extended_leaf_rdp`); they enter
  ``get_epsilon`` by dp-accounting's conversion rule. ``get_epsilon(0)`` is inf unless nothing
  was released (the PLD accountant certifies no pure-DP epsilon at delta 0);
  ``get_epsilon(1)`` is 0.
* REPLACE_SPECIAL for ``RandomizedResponseDpEvent`` is dpsharp's zero-out with the special
  record's released bucket uniform, as in dp-accounting (both directions, R(x) against the
  uniform law and the reverse, are accounted).

Events with no dpsharp counterpart (``UnsupportedDpEvent``) raise
:class:`UnsupportedEventError` naming the event. ``NonPrivateDpEvent``, a zero noise
multiplier and a zero sampling probability are read as dp-accounting's accountants read them:
the accountants then report epsilon = inf and delta = 1 (no noise), or nothing released
(sampling probability 0); randomized response with one bucket and a mixture whose only
sensitivity is 0 release nothing, and with noise parameter 0 nothing is private. dpsharp events
passed to the adapter accountants keep dpsharp's own
convention; dpsharp's ``Shuffled`` has no dp-accounting counterpart and :func:`to_dp_event`
refuses it.

dp-accounting is imported lazily, only to build or recognise its objects.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsharp._validation import (
    is_real_number,
    require_delta,
    require_positive_finite,
    require_probability,
    require_real,
)
from dpsharp.accountants import Accountant, accountant
from dpsharp.events import (
    Composed,
    DiscreteLaplace,
    Event,
    Gaussian,
    GaussianMixture,
    Laplace,
    Neighbouring,
    PoissonSampled,
    RandomizedResponse,
    Repeated,
    ReplaceOnePoissonSampledGaussian,
    SampledWithoutReplacement,
    SingleEpochTreeAggregation,
    TruncatedPoissonSampledGaussian,
    flatten,
)
from dpsharp.events import ZCDP
from dpsharp import rdp as dpsharp_rdp
from dpsharp.tuning_events import (
    PoissonTuning,
    TruncatedNegativeBinomialTuning,
    truncated_negative_binomial_mean,
)

__all__ = [
    "PLDAccountant",
    "PrivacyAccountant",
    "RDPAccountant",
    "RdpAccountant",
    "UnsupportedEventError",
    "from_dp_event",
    "to_dp_event",
]

#: dp-accounting's sum of values of norm <= C moves by SHIFT[relation] * C between neighbours;
#: dpsharp's noise multiplier is relative to that sensitivity. Powers of two: the division and
#: the multiplication by them are exact in floating point, so conversions round-trip.
_SHIFT: dict[Neighbouring, float] = {
    Neighbouring.ADD_REMOVE: 1.0,
    Neighbouring.REPLACE_ONE: 2.0,
    Neighbouring.ZERO_OUT: 1.0,
}

_LAPLACE_REPLACE_ONE = (
    "neighboring_relation must be `ADD_OR_REMOVE_ONE` or `REPLACE_SPECIAL` for `LaplaceDpEvent`"
    ". Found NeighboringRelation.REPLACE_ONE. LaplaceDpEvent has no unambiguous meaning under "
    "REPLACE_ONE: its definition (values of L1 "
    "norm <= C, noise scale noise_multiplier * C) gives an L1 sensitivity of 2C when a value is "
    "replaced, dp-accounting's PLDAccountant refuses it under REPLACE_ONE and its RdpAccountant "
    "reads a sensitivity of C. Account it under ADD_OR_REMOVE_ONE (sensitivity C), or, for a "
    "replace-one guarantee, state it as a dpsharp event, dpsharp.Laplace(scale) with scale = "
    "Laplace scale / L1 sensitivity under replace-one, in dpsharp.accountant(..., "
    "neighbouring='replace_one')"
)
_POISSON_REPLACE_ONE = (
    "neighboring_relation must be `ADD_OR_REMOVE_ONE` or `REPLACE_SPECIAL` for "
    "`PoissonSampledDpEvent` of a sub-event other than a Gaussian. Found "
    "NeighboringRelation.REPLACE_ONE. Under REPLACE_ONE, Poisson sampling is analysed for a "
    "Gaussian (or a composition of Gaussians) only, as in dp-accounting: "
    "ReplaceOnePoissonSampledGaussian"
)


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


def _noise(event: Any, name: str, value: Any) -> float:
    """A dp-accounting noise parameter, validated (the message names the event's parameter
    and starts with dp-accounting's words, "Noise multiplier")."""
    return require_positive_finite(f"Noise multiplier {type(event).__name__}.{name}", value)


def from_dp_event(event: Any, neighboring_relation: Any = None) -> Event:
    """The dpsharp event equivalent to dp-accounting's ``event`` under ``neighboring_relation``
    (dp-accounting's ``NeighboringRelation``; default ADD_OR_REMOVE_ONE), in dp-accounting's
    sensitivity convention (module docstring): ``GaussianDpEvent(s)`` becomes ``Gaussian(s)``
    under ADD_OR_REMOVE_ONE and ``Gaussian(s / 2)`` under REPLACE_ONE (mean shift 2C of a sum of
    values of norm <= C, noise s C).

    Raises :class:`UnsupportedEventError` naming the first sub-event without a counterpart, or
    without an unambiguous meaning under the relation (``LaplaceDpEvent`` and a sampled
    non-Gaussian under REPLACE_ONE), and ``ValueError`` / ``TypeError`` for an
    invalid parameter (a noise multiplier must be a positive finite real number).
    """
    return _from(event, _relation(neighboring_relation), _dp())


def _from(event: Any, relation: Neighbouring, dp: Any) -> Event:
    shift = _SHIFT[relation]
    if isinstance(event, dp.GaussianDpEvent):
        return Gaussian(_noise(event, "noise_multiplier", event.noise_multiplier) / shift)
    if isinstance(event, dp.LaplaceDpEvent):
        scale = _noise(event, "noise_multiplier", event.noise_multiplier)
        if relation is Neighbouring.REPLACE_ONE:
            raise _error_class()(f"{event!r}: {_LAPLACE_REPLACE_ONE}")
        return Laplace(scale / shift)
    if isinstance(event, dp.PoissonSampledDpEvent):
        rate = require_probability(
            f"Sampling rate {type(event).__name__}.sampling_probability",
            event.sampling_probability,
        )
        if relation is Neighbouring.REPLACE_ONE:
            return _replace_one_poisson(event, rate, dp)
        return PoissonSampled(_effective_gaussian(_from(event.event, relation, dp)), rate)
    if isinstance(event, dp.dp_event.TruncatedSubsampledGaussianDpEvent):
        return _truncated_poisson(event, relation)
    if isinstance(event, dp.SampledWithoutReplacementDpEvent):
        # analysed under replace-one whatever the enclosing relation: the inner noise is read
        # relative to the replace-one sensitivity 2C
        inner = _effective_gaussian(_from(event.event, Neighbouring.REPLACE_ONE, dp))
        return SampledWithoutReplacement(inner, event.sample_size, event.source_dataset_size)
    if isinstance(event, dp.SelfComposedDpEvent):
        return Repeated(_from(event.event, relation, dp), event.count)
    if isinstance(event, dp.ComposedDpEvent):
        return Composed(tuple(_from(inner, relation, dp) for inner in event.events))
    if isinstance(event, dp.dp_event.ZCDpEvent):
        # a guarantee, not a mechanism: the same under every relation
        rho, xi = event.rho, event.xi
        for name, value in (("rho", rho), ("xi", xi)):
            if not is_real_number(value) or not 0 <= value < math.inf:
                raise ValueError(f"ZCDpEvent.{name} must be >= 0 (and finite), got {value!r}")
        return ZCDP(float(rho), float(xi))
    if isinstance(event, dp.dp_event.RepeatAndSelectDpEvent):
        return _repeat_and_select(event, _from(event.event, relation, dp))
    if isinstance(event, dp.dp_event.RandomizedResponseDpEvent):
        return _randomized_response(event, relation)
    if isinstance(event, dp.dp_event.DiscreteLaplaceDpEvent):
        _require_relation(event, relation, _ADD_OR_SPECIAL)
        scale = _noise(event, "noise_parameter", event.noise_parameter)
        return DiscreteLaplace(scale, _integer(event, "sensitivity", event.sensitivity, 1))
    if isinstance(event, dp.dp_event.SingleEpochTreeAggregationDpEvent):
        return _tree_aggregation(event, relation)
    if isinstance(event, dp.dp_event.MixtureOfGaussiansDpEvent):
        return _mixture_of_gaussians(event, relation)
    if isinstance(event, dp.NoOpDpEvent):
        return Composed(())
    if isinstance(event, dp.DpEvent):
        raise _error_class()(f"{event!r} has no dpsharp counterpart")
    raise TypeError(
        f"event must be a dp_accounting DpEvent, got {event!r} ({type(event).__name__})"
    )


#: dp-accounting's relation requirements, in its own words
_ADD_OR_SPECIAL = ("ADD_OR_REMOVE_ONE", "REPLACE_SPECIAL")
_REPLACE_OR_SPECIAL = ("REPLACE_ONE", "REPLACE_SPECIAL")
_SPECIAL_ONLY = ("REPLACE_SPECIAL",)
_RELATION_NAMES = {
    Neighbouring.ADD_REMOVE: "ADD_OR_REMOVE_ONE",
    Neighbouring.REPLACE_ONE: "REPLACE_ONE",
    Neighbouring.ZERO_OUT: "REPLACE_SPECIAL",
}


def _require_relation(event: Any, relation: Neighbouring, allowed: tuple[str, ...]) -> None:
    """Refuse ``event`` under a relation dp-accounting does not analyse it under, with
    dp-accounting's message ("neighboring_relation must be `A` or `B` for `Event`")."""
    name = _RELATION_NAMES[relation]
    if name in allowed:
        return
    names = " or ".join(f"`{value}`" for value in allowed)
    raise _error_class()(
        f"neighboring_relation must be {names} for `{type(event).__name__}`. Found "
        f"NeighboringRelation.{name}."
    )


def _integer(event: Any, name: str, value: Any, minimum: int) -> int:
    """A dp-accounting integer parameter (an integral float such as 3.0 is accepted, as
    dp-accounting does)."""
    if is_real_number(value) and math.isfinite(value) and float(value).is_integer():
        if value >= minimum:
            return int(value)
    raise ValueError(
        f"{type(event).__name__}.{name} must be an integer >= {minimum}, got {value!r}"
    )


def _randomized_response(event: Any, relation: Neighbouring) -> Event:
    """``RandomizedResponseDpEvent(p, k)`` as :class:`~dpsharp.events.RandomizedResponse`
    (REPLACE_SPECIAL is dpsharp's zero-out, whose null record's bucket is uniform, as in
    dp-accounting's reading); one bucket releases nothing."""
    _require_relation(event, relation, _REPLACE_OR_SPECIAL)
    p = event.noise_parameter
    if not is_real_number(p) or not 0 <= p <= 1:
        raise ValueError(
            f"RandomizedResponseDpEvent.noise_parameter must be in [0, 1], got {p!r}"
        )
    buckets = _integer(event, "num_buckets", event.num_buckets, 1)
    if buckets == 1:
        return Composed(())
    return RandomizedResponse(float(p), buckets)


def _tree_aggregation(event: Any, relation: Neighbouring) -> Event:
    """``SingleEpochTreeAggregationDpEvent(sigma, step_counts)`` as
    :class:`~dpsharp.events.SingleEpochTreeAggregation` (REPLACE_SPECIAL only, as in
    dp-accounting); epochs without steps release nothing."""
    _require_relation(event, relation, _SPECIAL_ONLY)
    sigma = event.noise_multiplier
    if not is_real_number(sigma) or math.isnan(sigma) or sigma < 0:
        raise ValueError(
            f"noise_multiplier must be non-negative. Got {sigma!r} "
            f"(SingleEpochTreeAggregationDpEvent.noise_multiplier)"
        )
    counts = event.step_counts
    steps = list(counts) if isinstance(counts, (list, tuple)) else [counts]
    if not steps:
        raise ValueError(
            f"SingleEpochTreeAggregationDpEvent.step_counts must be a non-empty list or a "
            f"scalar, got {counts!r}"
        )
    for value in steps:
        if not is_real_number(value) or math.isnan(value) or value < 0:
            raise ValueError(f"Steps must be non-negative. Got {counts!r}")
    integers = [_integer(event, "step_counts", value, 0) for value in steps]
    if max(integers) == 0:
        return Composed(())
    return SingleEpochTreeAggregation(float(sigma), tuple(integers))


def _mixture_of_gaussians(event: Any, relation: Neighbouring) -> Event:
    """``MixtureOfGaussiansDpEvent(s, sensitivities, probs)`` where it is a mechanism dpsharp
    analyses: the released value is x + c N(0, s^2) ... with the sensitivity c drawn from
    ``sensitivities`` (Choquette-Choo, Ganesh, Steinke, Thakurta 2023); the pair is
    sum_i p_i N(c_i, s^2) against N(0, s^2) (and the reverse). When every non-zero c_i is the
    same c, it is exactly the Poisson-sampled Gaussian of noise multiplier s / c and sampling
    probability sum_{c_i = c} p_i (the Gaussian when that is 1); sensitivities all 0 release
    nothing. Other mixtures are refused by name."""
    _require_relation(event, relation, _ADD_OR_SPECIAL)
    sensitivities = [float(value) for value in event.sensitivities]
    probs = [float(value) for value in event.sampling_probs]
    if len(sensitivities) != len(probs) or not sensitivities:
        raise ValueError(
            "MixtureOfGaussiansDpEvent.sensitivities and sampling_probs must be non-empty and "
            f"of the same length, got {event.sensitivities!r} and {event.sampling_probs!r}"
        )
    if any(not math.isfinite(c) or c < 0 for c in sensitivities) or any(
        not 0 <= p <= 1 for p in probs
    ) or abs(math.fsum(probs) - 1.0) > 1e-9:
        raise ValueError(
            "MixtureOfGaussiansDpEvent needs sensitivities >= 0 and sampling_probs in [0, 1] "
            f"summing to 1, got {event.sensitivities!r} and {event.sampling_probs!r}"
        )
    total = math.fsum(probs)
    probs = [p / total for p in probs]  # (a distribution: normalised, as GaussianMixture does)
    support = {c for c, p in zip(sensitivities, probs) if c > 0 and p > 0}
    if not support:
        return Composed(())
    sigma = require_positive_finite(
        "MixtureOfGaussiansDpEvent.standard_deviation", event.standard_deviation
    )
    if len(support) > 1:
        # the pair sum_i p_i N(c_i, s^2) against N(0, s^2): dpsharp's GaussianMixture
        return GaussianMixture(sigma, tuple(sensitivities), tuple(probs))
    (sensitivity,) = support
    rate = math.fsum(p for c, p in zip(sensitivities, probs) if c == sensitivity)
    inner = Gaussian(sigma / sensitivity)
    return inner if rate >= 1.0 else PoissonSampled(inner, rate)


def _replace_one_poisson(event: Any, rate: float, dp: Any) -> Event:
    """``PoissonSampledDpEvent(q, e)`` under REPLACE_ONE: for e a Gaussian (or a composition of
    Gaussians, :func:`_effective_gaussian`) of multiplier s, dp-accounting's pair
    (1 - q) N(0, s^2) + q N(-1, s^2) against (1 - q) N(0, s^2) + q N(1, s^2), which is
    :class:`~dpsharp.events.ReplaceOnePoissonSampledGaussian` of multiplier s / 2 (relative to
    the replace-one sensitivity 2C); q = 1 is the Gaussian. Any other inner event is refused,
    as dp-accounting refuses it."""
    inner = _effective_gaussian(_from(event.event, Neighbouring.REPLACE_ONE, dp))
    if not isinstance(inner, Gaussian):
        raise _error_class()(f"{event!r}: {_POISSON_REPLACE_ONE}")
    if rate >= 1.0:
        return inner
    return ReplaceOnePoissonSampledGaussian(inner.noise_multiplier, rate)


def _truncated_poisson(event: Any, relation: Neighbouring) -> Event:
    """``TruncatedSubsampledGaussianDpEvent(n, q, B, s)`` as
    :class:`~dpsharp.events.TruncatedPoissonSampledGaussian` (s, q, n, B), under
    ADD_OR_REMOVE_ONE (the relation of its analysis here); a sampling probability, batch size
    or dataset size of 0 releases nothing (as dp-accounting reads it)."""
    _require_relation(event, relation, ("ADD_OR_REMOVE_ONE",))
    n = _integer(event, "dataset_size", event.dataset_size, 0)
    batch = _integer(event, "truncated_batch_size", event.truncated_batch_size, 0)
    rate = event.sampling_probability
    if not is_real_number(rate) or not 0 <= rate <= 1:
        raise ValueError(
            f"TruncatedSubsampledGaussianDpEvent.sampling_probability must be in [0, 1], got "
            f"{rate!r}"
        )
    if n == 0 or batch == 0 or rate == 0:
        return Composed(())
    sigma = _noise(event, "noise_multiplier", event.noise_multiplier)
    return TruncatedPoissonSampledGaussian(sigma, float(rate), n, batch)


def _effective_gaussian(event: Event) -> Event:
    """A composition of Gaussian events run on one sample, as the one Gaussian event it is:
    releasing f_i + N(0, s_i^2) for queries f_i of sensitivity 1 is the Gaussian mechanism on
    (f_i / s_i)_i, of sensitivity (sum_i 1/s_i^2)^(1/2), so noise multiplier
    s = (sum_i count_i / s_i^2)^(-1/2) (Dong, Roth, Su 2019, Corollary 3.3: mu-GDP composes to
    (sum mu_i^2)^(1/2)-GDP; dp-accounting's RdpAccountant reads sampled compositions of
    Gaussians the same way). Any other event is returned unchanged."""
    if not isinstance(event, (Composed, Repeated)):
        return event
    leaves = flatten(event)
    if not leaves or not all(isinstance(leaf, Gaussian) for leaf, _ in leaves):
        return event
    precision = math.fsum(count / leaf.noise_multiplier**2 for leaf, count in leaves)
    if precision == 0.0:
        return event
    return Gaussian(1.0 / math.sqrt(precision))


def _repeat_and_select(event: Any, base: Event) -> Event:
    """dpsharp's form of ``RepeatAndSelectDpEvent(event, mean, shape)``: run the base K times
    and release the best run (Papernot and Steinke 2022), K ~ Poisson(mean) for shape = inf
    (:class:`~dpsharp.tuning_events.PoissonTuning`), else K ~ D_{shape, gamma}, the truncated
    negative binomial of Definition 1 with E[K] = mean (shape 0: logarithmic, 1: geometric;
    :class:`~dpsharp.tuning_events.TruncatedNegativeBinomialTuning`). mean = 1 with a finite
    shape is K = 1: the base event itself."""
    mean, shape = _repeat_and_select_parameters(event)
    if shape == math.inf:
        return PoissonTuning(base, float(mean))
    if mean == 1:
        return base
    return TruncatedNegativeBinomialTuning(base, float(shape), _gamma_for_mean(float(shape),
                                                                              float(mean)))


def _repeat_and_select_parameters(event: Any) -> tuple[Any, Any]:
    """(mean, shape) of a ``RepeatAndSelectDpEvent``, validated: mean in [1, inf), shape in
    [0, inf]."""
    shape = event.shape
    if not is_real_number(shape) or math.isnan(shape) or shape < 0:
        raise ValueError(f"RepeatAndSelectDpEvent.shape must be in [0, inf], got {shape!r}")
    mean = event.mean
    if not is_real_number(mean) or math.isnan(mean) or not 1 <= mean < math.inf:
        raise ValueError(f"RepeatAndSelectDpEvent.mean must be in [1, inf), got {mean!r}")
    return mean, shape


def _gamma_for_mean(eta: float, mean: float) -> float:
    """The gamma in (0, 1) of D_{eta, gamma} with E[K] = ``mean`` > 1 (Papernot and Steinke
    2022, Theorem 2: E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta)), (1/gamma - 1) /
    log(1/gamma) for eta = 0), by bisection: E[K] decreases from inf to 1 as gamma goes from 0
    to 1. The lower end of the final bracket is returned: E[K] there is >= ``mean``, and the
    RDP bound of Theorem 2 decreases in gamma (its log(1/gamma) and log E[K] terms do), so the
    bound computed with it is at least the bound of the exact gamma. The floating-point E[K]
    is compared with ``mean (1 + 1e-13)``, far above its own rounding error (a few ulps), so
    that the exact E[K] at the returned gamma is >= ``mean`` too."""
    target = mean * (1.0 + 1e-13)
    low, high = 0.0, 1.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if truncated_negative_binomial_mean(eta, middle) >= target:
            low = middle
        else:
            high = middle
    if low == 0.0:
        raise ValueError(f"RepeatAndSelectDpEvent.mean {mean!r} is too large for shape {eta!r}")
    return low


def to_dp_event(event: Event, neighboring_relation: Any = None) -> Any:
    """dp-accounting's event equivalent to the dpsharp ``event`` under ``neighboring_relation``
    (inverse of :func:`from_dp_event`: ``Gaussian(z)`` becomes ``GaussianDpEvent(z)`` under
    ADD_OR_REMOVE_ONE and ``GaussianDpEvent(2 z)`` under REPLACE_ONE; ``Composed(())`` becomes
    ``NoOpDpEvent()``). Raises :class:`UnsupportedEventError` for an event with no dp-accounting
    counterpart under the relation (``Shuffled``; ``Laplace`` and ``PoissonSampled`` under
    REPLACE_ONE)."""
    return _to(event, _relation(neighboring_relation), _dp())


def _to(event: Event, relation: Neighbouring, dp: Any) -> Any:
    shift = _SHIFT[relation]
    if isinstance(event, Gaussian):
        return dp.GaussianDpEvent(event.noise_multiplier * shift)
    if isinstance(event, Laplace):
        if relation is Neighbouring.REPLACE_ONE:
            raise _error_class()(f"{event!r} has no dp-accounting counterpart under REPLACE_ONE: "
                                 f"{_LAPLACE_REPLACE_ONE}")
        return dp.LaplaceDpEvent(event.scale * shift)
    if isinstance(event, PoissonSampled):
        if relation is Neighbouring.REPLACE_ONE:
            raise _error_class()(f"{event!r} has no dp-accounting counterpart under REPLACE_ONE: "
                                 f"{_POISSON_REPLACE_ONE}")
        return dp.PoissonSampledDpEvent(event.sampling_probability, _to(event.event, relation, dp))
    if isinstance(event, ReplaceOnePoissonSampledGaussian) and relation is Neighbouring.REPLACE_ONE:
        return dp.PoissonSampledDpEvent(
            event.sampling_probability, dp.GaussianDpEvent(event.noise_multiplier * shift)
        )
    if isinstance(event, GaussianMixture) and relation is not Neighbouring.REPLACE_ONE:
        return dp.dp_event.MixtureOfGaussiansDpEvent(
            event.noise_multiplier, list(event.sensitivities), list(event.probabilities)
        )
    if isinstance(event, TruncatedPoissonSampledGaussian) and relation is Neighbouring.ADD_REMOVE:
        return dp.dp_event.TruncatedSubsampledGaussianDpEvent(
            event.dataset_size, event.sampling_probability, event.max_batch_size,
            event.noise_multiplier,
        )
    if isinstance(event, SampledWithoutReplacement):
        return dp.SampledWithoutReplacementDpEvent(
            event.dataset_size, event.sample_size, _to(event.event, Neighbouring.REPLACE_ONE, dp)
        )
    if isinstance(event, Repeated):
        return dp.SelfComposedDpEvent(_to(event.event, relation, dp), event.count)
    if isinstance(event, ZCDP):
        return dp.dp_event.ZCDpEvent(event.rho, event.xi)
    if isinstance(event, PoissonTuning):
        return dp.dp_event.RepeatAndSelectDpEvent(
            _to(event.base, relation, dp), event.mean, math.inf
        )
    if isinstance(event, TruncatedNegativeBinomialTuning):
        return dp.dp_event.RepeatAndSelectDpEvent(
            _to(event.base, relation, dp), event.expected_runs, event.eta
        )
    if isinstance(event, Composed):
        if not event.events:
            return dp.NoOpDpEvent()
        return dp.ComposedDpEvent([_to(inner, relation, dp) for inner in event.events])
    if isinstance(event, Event):
        raise _error_class()(f"{event!r} has no dp-accounting counterpart")
    raise TypeError(f"event must be a dpsharp event, got {event!r} ({type(event).__name__})")


def _is_zero(value: Any) -> bool:
    return is_real_number(value) and value == 0


def _strip_non_private(
    event: Any, relation: Neighbouring = Neighbouring.ADD_REMOVE
) -> tuple[Any, bool]:
    """Remove the parts that dp-accounting's accountants read as releasing the data without
    noise (``NonPrivateDpEvent``, a Gaussian or Laplace event with noise multiplier 0, a sampled
    event around one of these with sampling probability > 0; the accountants then report
    epsilon = inf, delta = 1) or as releasing nothing (a Poisson sampling probability of 0),
    reachable through composition and through the base of a ``RepeatAndSelectDpEvent``;
    returns the rest and whether a non-private part was found."""
    dp = _dp()
    if isinstance(event, dp.NonPrivateDpEvent):
        return dp.NoOpDpEvent(), True
    if isinstance(event, (dp.GaussianDpEvent, dp.LaplaceDpEvent)) and _is_zero(
        event.noise_multiplier
    ):
        return dp.NoOpDpEvent(), True
    if isinstance(event, dp.PoissonSampledDpEvent) and _is_zero(event.sampling_probability):
        return dp.NoOpDpEvent(), False
    zero_noise = _zero_noise_event(event, relation, dp)
    if zero_noise is not None:
        return dp.NoOpDpEvent(), zero_noise
    if isinstance(event, dp.SampledWithoutReplacementDpEvent) and (
        _is_zero(event.sample_size) or _is_zero(event.source_dataset_size)
    ):
        return dp.NoOpDpEvent(), False  # an empty sample: nothing is released
    if isinstance(event, (dp.PoissonSampledDpEvent, dp.SampledWithoutReplacementDpEvent)):
        _, found = _strip_non_private(event.event, relation)
        return (dp.NoOpDpEvent(), True) if found else (event, False)
    if isinstance(event, dp.SelfComposedDpEvent):
        inner, found = _strip_non_private(event.event, relation)
        return dp.SelfComposedDpEvent(inner, event.count), found and event.count > 0
    if isinstance(event, dp.dp_event.RepeatAndSelectDpEvent):
        # K >= 1 runs with positive probability (mean >= 1): a base that releases the data
        # without noise makes the selection release it too; parts of the base that release
        # nothing are removed from it as from any composition
        _repeat_and_select_parameters(event)
        inner, found = _strip_non_private(event.event, relation)
        if found:
            return dp.NoOpDpEvent(), True
        return dp.dp_event.RepeatAndSelectDpEvent(inner, event.mean, event.shape), False
    if isinstance(event, dp.ComposedDpEvent):
        parts = [_strip_non_private(inner, relation) for inner in event.events]
        return dp.ComposedDpEvent([part for part, _ in parts]), any(found for _, found in parts)
    return event, False


def _zero_noise_event(event: Any, relation: Neighbouring, dp: Any) -> bool | None:
    """For the events dp-accounting reads as releasing nothing or releasing the data without
    noise, under a relation it accepts them under: False (nothing released: one bucket of
    randomized response, a mixture whose only sensitivity is 0) or True (no noise: noise
    parameter 0); None otherwise (including a relation the event is refused under, whose
    conversion then raises dp-accounting's error)."""
    name = _RELATION_NAMES[relation]
    if isinstance(event, dp.dp_event.RandomizedResponseDpEvent) and name in _REPLACE_OR_SPECIAL:
        if _is_zero(event.num_buckets - 1) if is_real_number(event.num_buckets) else False:
            return False
        return True if _is_zero(event.noise_parameter) else None
    if isinstance(event, dp.dp_event.DiscreteLaplaceDpEvent) and name in _ADD_OR_SPECIAL:
        return True if _is_zero(event.noise_parameter) else None
    if isinstance(event, dp.dp_event.MixtureOfGaussiansDpEvent) and name in _ADD_OR_SPECIAL:
        if list(event.sensitivities) == [0]:
            return False
        return True if _is_zero(event.standard_deviation) else None
    if isinstance(event, dp.dp_event.SingleEpochTreeAggregationDpEvent) and name in _SPECIAL_ONLY:
        return True if _is_zero(event.noise_multiplier) else None
    if isinstance(event, dp.dp_event.TruncatedSubsampledGaussianDpEvent) and name == (
        "ADD_OR_REMOVE_ONE"
    ):
        sizes = (event.sampling_probability, event.truncated_batch_size, event.dataset_size)
        if any(_is_zero(value) for value in sizes):
            return False
        return True if _is_zero(event.noise_multiplier) else None
    return None


#: delta(inf) is answered by delta at this epsilon (an upper bound: delta decreases in epsilon;
#: beyond it e^{-epsilon} underflows, so no finite privacy loss contributes to delta there)
_LARGEST_EPSILON = 1e4

_RELATIONS = {
    "ADD_OR_REMOVE_ONE": Neighbouring.ADD_REMOVE,
    "REPLACE_ONE": Neighbouring.REPLACE_ONE,
    "REPLACE_SPECIAL": Neighbouring.ZERO_OUT,
    "add_remove": Neighbouring.ADD_REMOVE,
    "replace_one": Neighbouring.REPLACE_ONE,
    "zero_out": Neighbouring.ZERO_OUT,
}


def _relation(neighboring_relation: Any) -> Neighbouring:
    """dp-accounting's NeighboringRelation (or its name, or a dpsharp Neighbouring, or None for
    ADD_OR_REMOVE_ONE) -> ours. REPLACE_SPECIAL (a record replaced by a special record that
    contributes zero to every released sum; Kairouz et al. 2021, Definition 1.1) is dpsharp's
    zero-out relation, under which a sum of values of norm <= C moves by C, as under add/remove
    (dp-accounting reads its Gaussian, Laplace and Poisson-sampled events under it exactly as
    under ADD_OR_REMOVE_ONE)."""
    if neighboring_relation is None:
        return Neighbouring.ADD_REMOVE
    if isinstance(neighboring_relation, Neighbouring):
        name: Any = neighboring_relation.value
    else:
        name = getattr(neighboring_relation, "name", neighboring_relation)
    if isinstance(name, str) and name in _RELATIONS:
        return _RELATIONS[name]
    raise ValueError(
        "neighboring_relation must be NeighboringRelation.ADD_OR_REMOVE_ONE, REPLACE_ONE or "
        f"REPLACE_SPECIAL, got {neighboring_relation!r}"
    )


class PrivacyAccountant:
    """dp-accounting's ``PrivacyAccountant`` interface over a dpsharp accountant.

    ``compose(event, count=1)`` takes dp-accounting ``DpEvent`` objects, converted in
    dp-accounting's sensitivity convention under this accountant's relation (module docstring),
    or dpsharp events (dpsharp's convention); it validates the whole event first and returns
    ``self``. ``supports(event)``; ``get_epsilon(target_delta)``; ``get_delta(target_epsilon)``;
    ``ledger`` (the composed events as one dp-accounting ``ComposedDpEvent``, as
    dp-accounting's ``DpEventBuilder`` builds it); ``neighboring_relation`` (dp-accounting's
    enum: ADD_OR_REMOVE_ONE, the default, or REPLACE_ONE). The dpsharp accountant is
    :attr:`dpsharp_accountant`.
    """

    family: str = ""

    def __init__(self, neighboring_relation: Any = None, **options: Any) -> None:
        relation = _relation(neighboring_relation)
        self._relation = relation
        self._accountant: Accountant = accountant(
            self.family, neighbouring=relation.value, **options
        )
        self._builder: Any = None
        self._non_private = False

    @property
    def neighboring_relation(self) -> Any:
        """dp-accounting's NeighboringRelation member for this accountant's relation."""
        enum = _dp().NeighboringRelation
        return {
            Neighbouring.ADD_REMOVE: enum.ADD_OR_REMOVE_ONE,
            Neighbouring.REPLACE_ONE: enum.REPLACE_ONE,
            Neighbouring.ZERO_OUT: enum.REPLACE_SPECIAL,
        }[self._relation]

    @property
    def dpsharp_accountant(self) -> Accountant:
        return self._accountant

    def _convert(self, event: Any) -> tuple[Event | None, str | None, bool]:
        """(dpsharp event, why unsupported or None, whether it releases data without noise)."""
        if isinstance(event, Event):
            converted: Event = event
            non_private = False
        else:
            event, non_private = _strip_non_private(event, self._relation)
            try:
                converted = from_dp_event(event, self._relation)
            except UnsupportedEventError as exc:
                return None, str(exc), non_private
        return converted, self._accountant.unsupported_reason(converted), non_private

    def _first_invalid(self, event: Any) -> tuple[Any, str] | None:
        """(the first sub-event that :meth:`compose` cannot take, why), or None: compositions
        are searched through, as dp-accounting's accountants do, so the sub-event named is the
        innermost unsupported one."""
        dp = _dp()
        if isinstance(event, Event):
            converted, reason, _ = self._convert(event)
            if reason is None:
                try:
                    to_dp_event(event, self._relation)  # the ledger must be able to hold it
                except UnsupportedEventError as exc:
                    reason = str(exc)
            return None if reason is None else (event, reason)
        if isinstance(event, dp.ComposedDpEvent):
            for inner in event.events:
                found = self._first_invalid(inner)
                if found is not None:
                    return found
            return None
        if isinstance(event, dp.SelfComposedDpEvent):
            return self._first_invalid(event.event)
        if not isinstance(event, dp.DpEvent):
            raise TypeError(f"`event` must be `DpEvent`. Found {type(event)}.")
        converted, reason, _ = self._convert(event)
        if converted is None or reason is not None:
            return (event, reason or "Unsupported event.")
        return None

    def _maybe_compose(self, event: Any, count: int, do_compose: bool) -> Any:
        """dp-accounting's hook: None when ``event`` can be composed (and, with
        ``do_compose``, composes it ``count`` times), else dp-accounting's
        ``CompositionErrorDetails(invalid_event, error_message)``."""
        found = self._first_invalid(event)
        if found is not None:
            details = _dp().PrivacyAccountant.CompositionErrorDetails
            return details(invalid_event=found[0], error_message=found[1])
        if do_compose:
            self.compose(event, count)
        return None

    def supports(self, event: Any) -> bool:
        """Whether :meth:`compose` would accept ``event``."""
        return self._first_invalid(event) is None

    def compose(self, event: Any, count: int = 1) -> PrivacyAccountant:
        """Compose ``count`` runs of ``event``; returns ``self``. Raises
        :class:`UnsupportedEventError` (also a ``dp_accounting.UnsupportedEventError``) naming
        the unsupported sub-event and why (dp-accounting's message: "Unsupported event: ...
        Error: [...] caused by subevent ..."), leaving the state unchanged."""
        dp = _dp()
        if not isinstance(event, (dp.DpEvent, Event)):
            raise TypeError(f"`event` must be `DpEvent`. Found {type(event)}.")
        found = self._first_invalid(event)
        if found is not None:
            raise _error_class()(
                f"Unsupported event: {event}. Error: [{found[1]}] caused by subevent {found[0]}."
            )
        converted, _, non_private = self._convert(event)
        assert converted is not None
        # dp-accounting's ledger in dp-accounting's convention; validates count as
        # dp-accounting does, before any change
        recorded = event if isinstance(event, dp.DpEvent) else to_dp_event(event, self._relation)
        builder = dp.DpEventBuilder() if self._builder is None else self._builder
        builder.compose(recorded, count)
        self._builder = builder
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
        """epsilon(target_delta) of the composition (dpsharp's ``epsilon``), with dp-accounting's
        edge cases: inf once an event without noise was composed; 0 when nothing was released
        or at ``target_delta`` = 1 (every mechanism is (0, 1)-DP); at ``target_delta`` = 0, inf
        (dpsharp states no pure-DP epsilon for its events: inf is the upper bound it can
        certify)."""
        delta = require_real("target_delta", target_delta)
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"target_delta must be in [0, 1], got {delta!r}")
        if self._non_private:
            return math.inf
        if self._accountant.is_empty or delta == 1.0:
            return 0.0
        if delta == 0.0:
            return math.inf
        return float(self._accountant.epsilon(delta))

    def get_delta(self, target_epsilon: float) -> float:
        """delta(target_epsilon) of the composition (dpsharp's ``delta``): 1 once an event
        without noise was composed, 0 when nothing was released (as in dp-accounting). At
        ``target_epsilon`` = inf: the certified delta at the largest finite epsilon, an upper
        bound on delta(inf) because delta decreases in epsilon."""
        if not is_real_number(target_epsilon):
            raise TypeError(f"target_epsilon must be a real number, got {target_epsilon!r}")
        epsilon = float(target_epsilon)
        if math.isnan(epsilon):
            raise ValueError("target_epsilon must be in [0, inf], got nan")
        if self._non_private:
            return 1.0
        if self._accountant.is_empty:
            return 0.0
        return float(self._accountant.delta(min(epsilon, _LARGEST_EPSILON)))


class PLDAccountant(PrivacyAccountant):
    """dp-accounting's ``pld.PLDAccountant`` interface on dpsharp's tight PLD accountant:
    ``get_epsilon`` / ``get_delta`` are certified upper bounds. dp-accounting's
    ``value_discretization_interval`` is validated (None or a positive finite number) and
    otherwise ignored: dpsharp chooses its grid from ``precision``, passed through
    ``**options``."""

    family = "pld"

    def __init__(
        self,
        neighboring_relation: Any = None,
        value_discretization_interval: float | None = None,
        **options: Any,
    ) -> None:
        if value_discretization_interval is not None:
            require_positive_finite("value_discretization_interval", value_discretization_interval)
        super().__init__(neighboring_relation, **options)

    def get_epsilon(self, target_delta: float) -> float:
        """:meth:`PrivacyAccountant.get_epsilon`; at ``target_delta`` = 0 the largest loss of
        the pessimistic composition where every composed loss is bounded (randomized response,
        Laplace, discrete Laplace: delta is exactly 0 from there on, with no transform
        involved), else inf, as dp-accounting's PLD answers."""
        if (
            is_real_number(target_delta) and target_delta == 0 and not self._non_private
            and not self._accountant.is_empty
        ):
            return self._largest_loss()
        return super().get_epsilon(target_delta)

    def _largest_loss(self) -> float:
        from dpsharp.accountants import pld as pld_module

        def support(result: Any) -> float:
            value = (
                result.support_epsilon()
                if isinstance(result, pld_module._Composition) else None
            )
            return math.inf if value is None else float(value)

        try:
            return float(self._accountant._worst_direction(  # type: ignore[attr-defined]
                support, 0, pld_module._TAIL_BUDGET
            ))
        except ValueError:  # beyond what the composition can hold: no bound
            return math.inf

    def get_epsilon_bounds(self, target_delta: float) -> tuple[float, float]:
        """Certified (lower, upper) epsilon; (inf, inf) once an event without noise was
        composed."""
        target_delta = require_delta(target_delta, "target_delta")
        if self._non_private:
            return (math.inf, math.inf)
        if self._accountant.is_empty:
            return (0.0, 0.0)
        lower, upper = self._accountant.epsilon_bounds(target_delta)  # type: ignore[attr-defined]
        return (float(lower), float(upper))


#: the largest RDP order dpsharp's RDP accountant bounds
_MAX_ORDER = 1e6
#: order 1 of a mechanism without a closed-form KL divergence is bounded by this order's RDP
_NEAR_ONE = 1.0 + 2.0**-20


def _split_orders(orders: Sequence[float]) -> tuple[list[float], list[float]]:
    """(the orders in (1, 1e6], which dpsharp's RDP accountant bounds; the others, which
    dp-accounting also accepts: 1 and (1e6, inf]). Orders must be real numbers >= 1."""
    values = list(orders)
    if not values:
        raise ValueError(f"orders must hold at least one order >= 1, got {orders!r}")
    for value in values:
        if not is_real_number(value) or math.isnan(value):
            raise ValueError(f"orders must be real numbers >= 1, got {orders!r}")
        if value < 1:
            raise ValueError(f"orders must be >= 1, got {value!r} in {orders!r}")
    core = [float(value) for value in values if 1 < value <= _MAX_ORDER]
    extra = [float(value) for value in values if not 1 < value <= _MAX_ORDER]
    return core, extra


def _laplace_rdp_any(scale: float, order: float) -> float:
    """The Laplace mechanism's RDP (Mironov 2017, Proposition 6) at any order in [1, inf]:
    eps + log1p((alpha - 1) expm1((1 - 2 alpha) eps) / (2 alpha - 1)) / (alpha - 1) with
    eps = 1/scale; its limits eps + expm1(-eps) (KL) at 1 and eps at inf."""
    eps = 1.0 / scale
    if order == 1.0:
        return eps + math.expm1(-eps)
    if math.isinf(order):
        return eps
    return eps + math.log1p(
        (order - 1.0) * math.expm1((1.0 - 2.0 * order) * eps) / (2.0 * order - 1.0)
    ) / (order - 1.0)


def _extended_leaf_rdp(
    leaf: Event, orders: npt.NDArray[np.float64], relation: Neighbouring
) -> npt.NDArray[np.float64]:
    """An upper bound on the Renyi divergence of ``leaf`` at every order in [1, inf]:

    * in (1, 1e6]: dpsharp's RDP accountant's curve (:func:`dpsharp.accountants.rdp.leaf_rdp`);
    * the closed forms at every order where they exist (Gaussian and tree aggregation
      alpha / (2 sigma^2), Mironov 2017 Prop. 7; Laplace, Prop. 6; (xi, rho)-zCDP
      xi + rho alpha; randomized response and the discrete Laplace mechanism exactly from
      their loss atoms, :func:`dpsharp.accountants._pld_atoms.atoms_rdp`), order 1 being the
      KL divergence (their limit) and inf the largest privacy loss;
    * otherwise: at order 1 the divergence at order 1 + 2^-20 (D_alpha is non-decreasing in
      alpha, van Erven and Harremoes 2014, Theorem 3, so D_1 <= D_{1 + 2^-20}), and inf above
      1e6 (a sampled Gaussian's privacy loss is unbounded: D_inf = inf);
    * tuning leaves (Papernot and Steinke 2022): their formula over every finite order above 1
      (:func:`dpsharp.tuning_events.rdp_of_leaf`, with the base's curve from this function),
      each replaced by the smallest value at a larger order
      (:func:`dpsharp.accountants.rdp.monotone_envelope`, as dp-accounting does), at order 1
      the smallest of those values, inf at inf.
    """
    from dpsharp.accountants._pld_atoms import ATOM_EVENTS, event_rdp
    from dpsharp.accountants.rdp import leaf_rdp, monotone_envelope
    from dpsharp.tuning_events import TUNING_EVENT_TYPES, rdp_of_leaf

    out = np.full(orders.shape, math.inf)
    core = (orders > 1.0) & (orders <= _MAX_ORDER)
    if isinstance(leaf, TUNING_EVENT_TYPES):
        finite = np.isfinite(orders) & (orders > 1.0)
        if finite.any():
            alphas = orders[finite]

            def base(event: Event) -> npt.NDArray[np.float64]:
                total = np.zeros(alphas.shape)
                for inner, count in flatten(event):
                    total = total + count * _extended_leaf_rdp(inner, alphas, relation)
                return total

            values = rdp_of_leaf(leaf, alphas, base)
            assert values is not None
            if isinstance(leaf, TruncatedNegativeBinomialTuning) and (orders == 1.0).any():
                # Theorem 2 of Papernot and Steinke 2022 also holds with lambda_hat = 1, where
                # the base's epsilon_hat (its KL divergence, finite here) has coefficient
                # 1 - 1/lambda_hat = 0: eps(lambda) + (1 + eta) log(1/gamma) + log(E[K]) /
                # (lambda - 1), which dp-accounting uses when order 1 is given
                kl = sum(count * float(_extended_leaf_rdp(inner, np.ones(1), relation)[0])
                         for inner, count in flatten(leaf.base))
                if math.isfinite(kl):
                    mean = truncated_negative_binomial_mean(leaf.eta, leaf.gamma)
                    at_one = (base(leaf.base) + (1.0 + leaf.eta) * math.log(1.0 / leaf.gamma)
                              + math.log(mean) / (alphas - 1.0))
                    values = np.minimum(values, at_one)
            out[finite] = monotone_envelope(alphas, values)
            out[orders == 1.0] = float(np.min(values))
        return out
    if core.any():
        out[core] = leaf_rdp(leaf, orders[core], relation)
    for index in np.flatnonzero(~core).tolist():
        order = float(orders[index])
        if isinstance(leaf, ATOM_EVENTS):
            value = float(event_rdp(leaf, relation, [order])[0])
        elif isinstance(leaf, (Gaussian, SingleEpochTreeAggregation)):
            sigma = (
                leaf.noise_multiplier if isinstance(leaf, Gaussian)
                else leaf.equivalent_noise_multiplier
            )
            value = order / (2.0 * sigma**2)
        elif isinstance(leaf, Laplace):
            value = _laplace_rdp_any(leaf.scale, order)
        elif isinstance(leaf, ZCDP):
            value = leaf.xi + (leaf.rho * order if leaf.rho > 0 else 0.0)
        elif order == 1.0:
            value = float(leaf_rdp(leaf, np.array([_NEAR_ONE]), relation)[0])
        else:
            value = math.inf
        out[index] = value
    return out


def _extended_epsilon(orders: npt.NDArray[np.float64], rdp: npt.NDArray[np.float64],
                      delta: float) -> tuple[float, float]:
    """(epsilon, order) from RDP values at orders outside (1, 1e6], by dp-accounting's rule
    (the conversion of dpsharp's accountant; Canonne, Kamath, Steinke 2020, Prop. 12):
    epsilon = 0 where delta >= sqrt(1 - e^{-D}) (Bretagnolle-Huber: the total variation is at
    most sqrt(1 - e^{-KL}) and KL <= D_alpha); at finite alpha > 1e6
    epsilon = D + log1p(-1/alpha) - (log delta + log alpha)/(alpha - 1); at alpha = inf
    epsilon = D_inf (the privacy loss is at most D_inf: (D_inf, 0)-DP); (inf, nan) if none
    applies."""
    best, best_order = math.inf, math.nan
    for order, value in zip(orders.tolist(), rdp.tolist()):
        if value < 0 or math.isnan(value):
            continue
        if delta * delta + math.expm1(-value) > 0:
            candidate = 0.0
        elif math.isinf(order):
            candidate = value
        elif order > 1.01:
            candidate = value + math.log1p(-1.0 / order) - (
                math.log(delta) + math.log(order)) / (order - 1.0)
        else:
            continue
        if candidate < best:
            best, best_order = max(candidate, 0.0), order
    return best, best_order


def _extended_delta(orders: npt.NDArray[np.float64], rdp: npt.NDArray[np.float64],
                    epsilon: float) -> float:
    """delta(epsilon) from RDP values at orders outside (1, 1e6] (the inverse rule of
    :func:`_extended_epsilon`); 1 if none applies."""
    best = 1.0
    for order, value in zip(orders.tolist(), rdp.tolist()):
        if math.isnan(value) or math.isinf(value):
            continue
        best = min(best, math.sqrt(max(-math.expm1(-value), 0.0)))
        if math.isinf(order):
            if epsilon >= value:
                best = 0.0
        elif order > 1.01:
            log_delta = (order - 1.0) * (value - epsilon + math.log1p(-1.0 / order)) - math.log(
                order)
            best = min(best, math.exp(min(log_delta, 0.0)))
    return best


class RDPAccountant(PrivacyAccountant):
    """dp-accounting's ``rdp.RdpAccountant`` interface on dpsharp's RDP accountant
    (``RDPAccountant(orders=None, neighboring_relation=...)``);
    ``get_epsilon_and_optimal_order`` as there. Under REPLACE_ONE it reads dp-accounting's
    Gaussian events with the replace-one sensitivity of their definition (module docstring),
    which dp-accounting's own RDP accountant does not.

    Orders: dp-accounting accepts any order >= 1. The orders in (1, 1e6] are dpsharp's RDP
    accountant's; order 1 (the KL divergence) and orders above 1e6 (inf: the pure-DP epsilon)
    are bounded by :func:`_extended_leaf_rdp` (exact closed forms where they exist, else a
    sound bound: order 1 by order 1 + 2^-20, inf above 1e6) and enter ``get_epsilon`` by
    dp-accounting's conversion rule (:func:`_extended_epsilon`). Without any order in
    (1, 1e6] dpsharp's accountant keeps its default orders for the ledger and only the
    given orders answer."""

    family = "rdp"

    def __init__(
        self, orders: Sequence[float] | None = None, neighboring_relation: Any = None,
        **options: Any,
    ) -> None:
        core: list[float] = []
        extra: list[float] = []
        if orders is not None and not isinstance(orders, str):
            core, extra = _split_orders(orders)
            if core:
                options["orders"] = core
        elif orders is not None:
            options["orders"] = orders
        super().__init__(neighboring_relation, **options)
        self._core_given = orders is None or isinstance(orders, str) or bool(core)
        self._extra_orders = np.array(extra, dtype=np.float64)
        self._extra_rdp = np.zeros(len(extra))
        # with orders outside (1, 1e6], the whole curve at the given orders is also kept here
        # (a tuning leaf's value at one order depends on its base's values at the others)
        self._context_orders = np.unique(np.array(core + extra, dtype=np.float64))
        self._context_rdp = np.zeros(self._context_orders.shape)
        self._extra_index = np.searchsorted(self._context_orders, self._extra_orders)
        self._core_index = np.flatnonzero(
            (self._context_orders > 1.0) & (self._context_orders <= _MAX_ORDER))
        self._all_orders = np.asarray(
            self._accountant.orders if orders is None or isinstance(orders, str) else orders,
            dtype=np.float64,
        )

    def compose(self, event: Any, count: int = 1) -> PrivacyAccountant:
        super().compose(event, count)
        if self._extra_orders.size and count > 0:
            converted, _, _ = self._convert(event)
            assert converted is not None
            for leaf, total in flatten(converted, count):
                curve = _extended_leaf_rdp(leaf, self._context_orders, self._relation)
                self._context_rdp = self._context_rdp + total * curve
            self._extra_rdp = self._context_rdp[self._extra_index]
        return self

    @property
    def _orders(self) -> npt.NDArray[np.float64]:
        """dp-accounting's ``_orders``: the orders as given (dpsharp's default grid if none)."""
        return self._all_orders.copy()

    @property
    def _rdp(self) -> npt.NDArray[np.float64]:
        """dp-accounting's ``_rdp``: the composed RDP bound at each of :attr:`_orders` (inf
        everywhere once an event without noise was composed, as in dp-accounting)."""
        result = np.full(self._all_orders.shape, math.inf)
        if self._non_private:
            return result
        curve = dict(zip(self._accountant.orders.tolist(), self._accountant.rdp().tolist()))
        if not self._core_given:
            curve = {}
        for order, value in zip(self._context_orders.tolist(), self._context_rdp.tolist()):
            if self._extra_orders.size:  # both are upper bounds: the smaller holds
                curve[order] = min(curve.get(order, math.inf), value)
        for index, order in enumerate(self._all_orders.tolist()):
            if order in curve:
                result[index] = curve[order]
        return result

    def get_epsilon(self, target_delta: float) -> float:
        """epsilon(target_delta): the smallest over the given orders (dpsharp's accountant over
        those in (1, 1e6], :func:`_extended_epsilon` over the others)."""
        return self.get_epsilon_and_optimal_order(target_delta)[0]

    def get_delta(self, target_epsilon: float) -> float:
        """delta(target_epsilon) over the given orders (:meth:`get_epsilon`'s rules)."""
        delta = super().get_delta(target_epsilon)  # validates; dp-accounting's edge cases
        if self._non_private or self._accountant.is_empty:
            return delta
        if not self._core_given:
            delta = 1.0
        if self._extra_orders.size:
            epsilon = float(target_epsilon)
            delta = min(delta, _extended_delta(self._extra_orders, self._extra_rdp, epsilon))
            if self._core_index.size and math.isfinite(epsilon):
                kept, _ = dpsharp_rdp.delta_from_rdp(
                    self._context_orders[self._core_index],
                    self._context_rdp[self._core_index], epsilon,
                    conversion=self._accountant.conversion,  # type: ignore[attr-defined]
                )
                delta = min(delta, float(kept))
        return delta

    def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float]:
        """(epsilon, the RDP order that attains it); (inf, nan) once an event without noise
        was composed; (0, nan) when nothing was released or at ``target_delta`` = 1; (inf, nan)
        at ``target_delta`` = 0 (as :meth:`get_epsilon`)."""
        delta = require_real("target_delta", target_delta)
        if self._non_private or self._accountant.is_empty or delta <= 0.0 or delta >= 1.0:
            return (super().get_epsilon(target_delta), math.nan)  # edge cases, validation
        best, best_order = math.inf, math.nan
        if self._core_given:
            guarantee = self._accountant.guarantee(target_delta)
            best = float(guarantee.epsilon)
            best_order = float(next(
                (guarantee.details[key] for key in ("order", "optimal_order", "best_order",
                                                    "alpha") if key in guarantee.details),
                math.nan,
            ))
        if self._extra_orders.size:
            extra, order = _extended_epsilon(self._extra_orders, self._extra_rdp,
                                             float(target_delta))
            if extra < best:
                best, best_order = extra, order
            if self._core_index.size:  # the curve kept here, at the orders in (1, 1e6]
                kept, order = dpsharp_rdp.epsilon_from_rdp(
                    self._context_orders[self._core_index],
                    self._context_rdp[self._core_index], float(target_delta),
                    conversion=self._accountant.conversion,  # type: ignore[attr-defined]
                )
                if kept < best:
                    best, best_order = float(kept), float(order)
        return (best, best_order)


#: dp-accounting's name for :class:`RDPAccountant`
RdpAccountant = RDPAccountant


def _submodule(name: str, doc: str, members: dict[str, Any]) -> ModuleType:
    """``dpsharp.compat.dp_accounting.<name>``: dp-accounting's ``<name>`` package with
    dpsharp's accountants in place of its own; its other names are dp-accounting's."""
    module = ModuleType(f"{__name__}.{name}", doc)
    module.__dict__.update(members)

    def forward(attribute: str) -> Any:
        return getattr(importlib.import_module(f"dp_accounting.{name}"), attribute)

    module.__getattr__ = forward  # type: ignore[method-assign]
    sys.modules[module.__name__] = module
    return module


pld = _submodule("pld", "dp-accounting's ``pld`` on dpsharp: ``pld.PLDAccountant``.",
                 {"PLDAccountant": PLDAccountant})
rdp = _submodule("rdp", "dp-accounting's ``rdp`` on dpsharp: ``rdp.RdpAccountant``.",
                 {"RdpAccountant": RDPAccountant, "RDPAccountant": RDPAccountant})


def __getattr__(name: str) -> Any:
    """dp-accounting's other public names (``dp_event``, ``DpEventBuilder``,
    ``NeighboringRelation``, the ``*DpEvent`` classes, ``mechanism_calibration``,
    ``calibrate_dp_mechanism``, ...), so ``import dpsharp.compat.dp_accounting as
    dp_accounting`` runs a dp-accounting script unchanged; the accountants are dpsharp's."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(_dp(), name)
    except AttributeError:
        raise AttributeError(
            f"module {__name__!r} has no attribute {name!r} (nor has dp_accounting)"
        ) from None
