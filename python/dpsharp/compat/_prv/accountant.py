"""prv-accountant's ``PRVAccountant`` and ``Accountant`` on dpsharp's tight PLD accountant.

``PRVAccountant(prvs, eps_error, delta_error, max_self_compositions)`` composes each privacy
random variable ``num_self_compositions[i]`` times. prv-accountant (Gopi, Lee, Wutschitz 2021)
discretises the PRVs on a mesh derived from ``eps_error`` and ``delta_error`` and returns an
estimate with an error band; here every PRV's dpsharp event
(:mod:`.privacy_random_variables`) is composed in :class:`dpsharp.accountants.pld.PLDAccountant`,
and the answers keep prv-accountant's conventions, with certified numbers:

* ``compute_epsilon(delta, num_self_compositions) -> (lower, estimate, upper)``: ``lower`` and
  ``upper`` are the PLD accountant's certified bounds on the optimal epsilon (not an estimate
  plus or minus ``eps_error``), at most ``2 * eps_error`` apart: as prv-accountant's mesh
  follows ``eps_error``, the PLD accountant's relative ``precision`` starts at ``eps_error``
  (clamped to [1e-3, 0.1]) and is halved or more while the bracket is wider; ``estimate`` is
  ``upper``, dpsharp's certified number for the composition (the same float as
  ``dpsharp.accountant("pld", precision=...).compose(...).epsilon(delta)`` at the precision
  used, :attr:`PRVAccountant.precision`).
* ``compute_delta(epsilon, num_self_compositions) -> (lower, estimate, upper)``: certified
  bounds on delta(epsilon); ``estimate`` is ``upper``.
* more compositions than ``max_self_compositions`` raise ``ValueError`` as in prv-accountant;
  ``delta_error`` and ``eps_max`` (prv-accountant's discretisation domain) are accepted and
  validated, and change nothing: the bounds are certified on any domain.

A PRV's mass at +inf (``ApproximateDPMechanism``'s delta) is composed in closed form: with
D = 1 - prod_i (1 - pm_inf_i)^{n_i}, delta_total(eps) = D + (1 - D) delta_finite(eps), exactly,
and the finite parts are composed in the PLD accountant. Pure and approximate DP are binary
randomized response, a replace-one pair, so they compose with Gaussian and Laplace PRVs (the
same pair under every relation) but not with a Poisson-subsampled one (an add/remove pair):
that mixture is refused, as is a user's own ``PrivacyRandomVariable`` given only by its CDF (its
discretisation could not be certified). prv-accountant's own PRV objects are accepted and read
by their parameters.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from dpsharp._validation import (
    require_count,
    require_delta,
    require_epsilon,
    require_positive_finite,
    require_probability,
)
from dpsharp.accountants import Accountant as _DpsharpAccountant
from dpsharp.accountants import UnsupportedEventError
from dpsharp.accountants import accountant as _make_accountant
from dpsharp.events import Event, PoissonSampled

from dpsharp.compat._prv import privacy_random_variables as _prvs
from dpsharp.compat._prv.privacy_random_variables import PrivacyRandomVariable

__all__ = ["Accountant", "ComposedPrivacyRandomVariable", "PRVAccountant"]

#: the PLD accountant's default relative precision, the first one tried
_DEFAULT_PRECISION = 1e-3
#: the coarsest relative precision asked of the PLD accountant
_COARSEST = 0.1
_MAX_REFINEMENTS = 6


def _from_peer(prv: Any) -> PrivacyRandomVariable | None:
    """dpsharp's PRV for one of prv-accountant's own PRV objects (read by its parameters)."""
    module = type(prv).__module__ or ""
    if not module.startswith("prv_accountant"):
        return None
    name = type(prv).__name__
    if name == "PoissonSubsampledGaussianMechanism":
        return _prvs.PoissonSubsampledGaussianMechanism(float(prv.p), float(prv.sigma))
    if name == "GaussianMechanism":
        return _prvs.GaussianMechanism(1.0 / float(prv.mu))
    if name == "LaplaceMechanism":
        return _prvs.LaplaceMechanism(float(prv.mu))
    if name == "PureDPMechanism":
        return _prvs.PureDPMechanism(float(prv.eps))
    if name == "ApproximateDPMechanism":
        return _prvs.ApproximateDPMechanism(float(prv.pure_dp.eps), float(prv.delta))
    return None


def _own(index: int, prv: Any) -> PrivacyRandomVariable:
    """dpsharp's PRV for ``prvs[index]``, with its event (None: its finite loss is 0);
    refuses a PRV without one, naming it."""
    own = prv if isinstance(prv, PrivacyRandomVariable) else _from_peer(prv)
    if own is None:
        raise UnsupportedEventError(
            f"prvs[{index}] = {prv!r} has no dpsharp counterpart: a privacy random variable "
            "given only by its CDF cannot be discretised with certified bounds here; describe "
            "the mechanism with dpsharp events (dpsharp.accountant('pld').compose(...))"
        )
    if own.event is None and not own.is_null and own.pm_inf == 0.0:
        raise UnsupportedEventError(f"prvs[{index}] = {prv!r} has no dpsharp event")
    return own


def _relation(prvs: list[Any], events: list[Event | None]) -> str:
    """The neighbouring relation whose dpsharp events are the PRVs' pairs: randomized response
    (pure and approximate DP) is a replace-one pair, Poisson sampling an add/remove one; the
    Gaussian and Laplace pairs are the same under both."""
    poisson = [i for i, e in enumerate(events) if isinstance(e, PoissonSampled)]
    binary = [i for i, e in enumerate(events) if type(e).__name__ == "RandomizedResponse"]
    if poisson and binary:
        raise UnsupportedEventError(
            f"prvs[{poisson[0]}] = {prvs[poisson[0]]!r} (Poisson sampling, analysed under "
            f"add/remove one) and prvs[{binary[0]}] = {prvs[binary[0]]!r} (randomized response, "
            "a replace-one pair) have no common neighbouring relation in dpsharp's PLD "
            "accountant"
        )
    return "replace_one" if binary else "add_remove"


def _with_infinity(delta: float, infinity: float) -> float | None:
    """The delta of the finite part that makes the total ``delta``: with independent masses
    at +inf of total D, delta_total(eps) = D + (1 - D) delta_finite(eps) (Y = +inf when any
    summand is); None when delta <= D (epsilon is +inf)."""
    if infinity == 0.0:
        return delta
    if delta <= infinity:
        return None
    return (delta - infinity) / (1.0 - infinity)


def _counts(name: str, value: Any, size: int) -> list[int]:
    if value is None:
        return [1] * size
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        counts = [require_count(f"{name}[{i}]", v) for i, v in enumerate(value)]
    else:
        counts = [require_count(name, value)]
    if len(counts) != size:
        raise ValueError(f"{name} must have one entry per PRV ({size}), got {len(counts)}")
    return counts


def _bounds(acc: _DpsharpAccountant, delta: float, width: float) -> tuple[float, float]:
    """Certified (lower, upper) epsilon bounds at ``delta``, at most ``width`` apart where the
    accountant's grid allows: the upper bound is the PLD accountant's one number
    (``epsilon``); the lower one is first taken from the optimistic composition on the same
    grid, and refined (``epsilon_bounds``) only when that is wider than ``width``."""
    upper = float(acc.epsilon(delta))
    side = getattr(acc, "_epsilon_side", None)
    if side is not None and math.isfinite(upper):
        try:
            lower = min(float(side(delta, pessimistic=False, refinement=0)), upper)
        except ValueError:  # below the optimistic side's round-off floor
            lower = 0.0
        if upper - lower <= width:
            return (lower, upper)
    lower, upper = acc.epsilon_bounds(delta)  # type: ignore[attr-defined]
    return (float(lower), float(upper))


class ComposedPrivacyRandomVariable:
    """The composition that :meth:`PRVAccountant.compute_composition` returns, in place of
    prv-accountant's discretised ``DiscretePrivacyRandomVariable``: dpsharp's PLD accountant
    holding the composed events (:attr:`accountant`)."""

    def __init__(self, accountant: _DpsharpAccountant, infinity_mass: float = 0.0) -> None:
        self.accountant = accountant
        #: P(Y = +inf) of the composition
        self.infinity_mass = infinity_mass

    def compute_epsilon(self, delta: float, delta_error: float = 0.0,
                        epsilon_error: float = 0.0) -> tuple[float, float, float]:
        """(lower, estimate, upper) epsilon at ``delta``: certified bounds, estimate = upper
        (``delta_error`` and ``epsilon_error`` are prv-accountant's error allowances: the
        bounds here are certified without them)."""
        finite = _with_infinity(require_delta(delta), self.infinity_mass)
        if finite is None:
            return (math.inf, math.inf, math.inf)
        if self.accountant.is_empty:
            return (0.0, 0.0, 0.0)
        lower, upper = self.accountant.epsilon_bounds(finite)  # type: ignore[attr-defined]
        return (float(lower), float(upper), float(upper))

    def compute_delta_estimate(self, epsilon: float) -> float:
        """delta(epsilon): dpsharp's certified upper bound."""
        finite = float(self.accountant.delta(require_epsilon(epsilon)))
        return self.infinity_mass + (1.0 - self.infinity_mass) * finite


class PRVAccountant:
    """Certified epsilon and delta of a heterogeneous composition of privacy random variables.

    Parameters
    ----------
    prvs
        One privacy random variable or a sequence of them (:mod:`.privacy_random_variables`,
        or prv-accountant's own objects).
    eps_error
        Half-width allowed for the epsilon bracket: the PLD accountant's precision is refined
        until ``upper - lower <= 2 * eps_error``, in (0, inf).
    delta_error
        prv-accountant's allowance on delta, in (0, 1); validated, unused (certified bounds).
    max_self_compositions
        Per PRV, the largest number of self-compositions asked later (default 1 each).
    eps_max
        prv-accountant's assumed bound on the true epsilon, in (0, inf); validated, unused.
    """

    def __init__(
        self,
        prvs: PrivacyRandomVariable | Sequence[PrivacyRandomVariable],
        eps_error: float,
        delta_error: float,
        max_self_compositions: int | Sequence[int] | None = None,
        eps_max: float | None = None,
    ) -> None:
        if isinstance(prvs, Sequence) and not isinstance(prvs, (str, bytes)):
            prvs = list(prvs)
        else:
            prvs = [prvs]
        if not prvs:
            raise ValueError("prvs must hold at least one privacy random variable")
        self.prvs = prvs
        own = [_own(i, prv) for i, prv in enumerate(prvs)]
        self.events = [prv.event for prv in own]
        self._log_keep = [math.log1p(-prv.pm_inf) for prv in own]
        self._relation = _relation(prvs, self.events)
        self.max_self_compositions = _counts("max_self_compositions", max_self_compositions,
                                             len(prvs))
        self.eps_error = require_positive_finite("eps_error", eps_error)
        self.delta_error = require_probability("delta_error", delta_error)
        if self.delta_error >= 1.0:
            raise ValueError(f"delta_error must be in (0, 1), got {delta_error!r}")
        self.eps_max = None if eps_max is None else require_positive_finite("eps_max", eps_max)
        # prv-accountant's mesh follows eps_error; here the PLD accountant's relative precision
        # starts at eps_error (within [1e-3, 0.1]) and is refined while the bracket is wider
        # than 2 eps_error
        self._precision = min(_COARSEST, max(_DEFAULT_PRECISION, self.eps_error))
        self._accountant: _DpsharpAccountant = self._fresh(self._precision)
        self._composed = [0] * len(prvs)

    @property
    def precision(self) -> float:
        """The relative precision of the PLD accountant the last answer came from."""
        return self._precision

    def _fresh(self, precision: float) -> _DpsharpAccountant:
        return _make_accountant("pld", precision=precision, neighbouring=self._relation)

    def _infinity(self, counts: list[int]) -> float:
        """P(Y = +inf) of the composition: 1 - prod_i (1 - pm_inf_i)^{n_i}."""
        return -math.expm1(math.fsum(n * keep for n, keep in zip(counts, self._log_keep)))

    # ------------------------------------------------------------------ composition
    def _requested(self, num_self_compositions: Any) -> list[int]:
        counts = _counts("num_self_compositions", num_self_compositions, len(self.prvs))
        for count, most in zip(counts, self.max_self_compositions):
            if count > most:
                raise ValueError(
                    "Requested number of compositions exceeds the maximum number of "
                    f"compositions: num_self_compositions={counts} must be <= "
                    f"max_self_compositions={self.max_self_compositions}"
                )
        return counts

    def _compose(self, counts: list[int], precision: float) -> _DpsharpAccountant:
        """The PLD accountant at ``precision`` holding ``counts``; grows the last one when it
        holds no more than ``counts`` (the PLD accountant's answers depend only on the
        composed multiset, so growing it gives the same numbers as composing afresh)."""
        grow = precision == self._precision and all(
            have <= want for have, want in zip(self._composed, counts))
        if not grow:
            self._accountant = self._fresh(precision)
            self._precision, self._composed = precision, [0] * len(counts)
        for i, (event, want) in enumerate(zip(self.events, counts)):
            if event is not None and want > self._composed[i]:
                self._accountant.compose(event, want - self._composed[i])
            self._composed[i] = want
        return self._accountant

    def compute_composition(
        self, num_self_compositions: int | Sequence[int] | None = None
    ) -> ComposedPrivacyRandomVariable:
        """The composition of ``num_self_compositions[i]`` copies of each PRV (default 1)."""
        counts = self._requested(num_self_compositions)
        return ComposedPrivacyRandomVariable(self._compose(counts, self._precision),
                                             self._infinity(counts))

    def compute_epsilon(
        self, delta: float, num_self_compositions: int | Sequence[int]
    ) -> tuple[float, float, float]:
        """(lower, estimate, upper) epsilon at ``delta``: certified bounds at most
        ``2 * eps_error`` apart; ``estimate`` is ``upper`` (dpsharp's certified number)."""
        counts = self._requested(num_self_compositions)
        finite = _with_infinity(require_delta(delta), self._infinity(counts))
        if finite is None:
            return (math.inf, math.inf, math.inf)
        precision = self._precision
        for _ in range(_MAX_REFINEMENTS + 1):
            acc = self._compose(counts, precision)
            if acc.is_empty:
                return (0.0, 0.0, 0.0)
            lower, upper = _bounds(acc, finite, 2.0 * self.eps_error)
            if upper - lower <= 2.0 * self.eps_error or not math.isfinite(upper):
                return (lower, upper, upper)
            # the precision is the relative gap (upper - lower) / upper
            precision = min(0.5 * precision, 0.9 * 2.0 * self.eps_error / upper)
        raise ValueError(
            f"could not reach eps_error={self.eps_error} (bracket [{lower}, {upper}]) at "
            f"delta={delta}; increase eps_error"
        )

    def compute_delta(
        self, epsilon: float, num_self_compositions: int | Sequence[int]
    ) -> tuple[float, float, float]:
        """(lower, estimate, upper) delta at ``epsilon``: certified bounds; ``estimate`` is
        ``upper``."""
        epsilon = require_epsilon(epsilon)
        counts = self._requested(num_self_compositions)
        infinity = self._infinity(counts)
        acc = self._compose(counts, self._precision)
        lower = upper = 0.0
        if not acc.is_empty:
            bounds = acc.delta_bounds(epsilon)  # type: ignore[attr-defined]
            lower, upper = float(bounds[0]), float(bounds[1])
        lower, upper = (infinity + (1.0 - infinity) * v for v in (lower, upper))
        return (lower, upper, upper)


class Accountant:
    """prv-accountant's deprecated single-mechanism interface: ``max_compositions``
    Poisson-subsampled Gaussian steps at a fixed ``delta``.

    ``compute_epsilon(num_compositions) -> (lower, estimate, upper)``, from
    :class:`PRVAccountant` (so ``estimate`` is the certified upper bound). Emits
    prv-accountant's ``DeprecationWarning`` pointing to :class:`PRVAccountant`. ``eps_error``
    None takes the PLD accountant's default precision; ``mesh_size`` must be None, as there.
    """

    def __init__(
        self,
        noise_multiplier: float,
        sampling_probability: float,
        delta: float,
        max_compositions: int,
        eps_error: float | None = None,
        mesh_size: float | None = None,
        verbose: bool = False,
    ) -> None:
        warnings.warn(
            "`Accountant` will be deprecated. Use `PRVAccountant` with "
            "`PoissonSubsampledGaussianMechanism` PRV instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        if mesh_size is not None:
            raise ValueError("mesh_size must be None (as in prv-accountant); use eps_error")
        self.noise_multiplier = require_positive_finite("noise_multiplier", noise_multiplier)
        self.sampling_probability = require_probability("sampling_probability",
                                                        sampling_probability)
        self.delta = require_delta(delta)
        self.max_compositions = require_count("max_compositions", max_compositions, minimum=1)
        self.eps_error = (None if eps_error is None
                          else require_positive_finite("eps_error", eps_error))
        self.verbose = bool(verbose)
        self.accountant = _accountant_for(self)

    def compute_epsilon(self, num_compositions: int) -> tuple[float, float, float]:
        """(lower, estimate, upper) epsilon at ``delta`` after ``num_compositions`` steps."""
        if require_count("num_compositions", num_compositions) > self.max_compositions:
            raise ValueError(
                "Requested number of compositions exceeds the maximum number of compositions: "
                f"num_compositions must be <= max_compositions={self.max_compositions}, "
                f"got {num_compositions}"
            )
        return self.accountant.compute_epsilon(self.delta, [num_compositions])


def _accountant_for(owner: Accountant) -> PRVAccountant:
    accountant = PRVAccountant(
        _prvs.PoissonSubsampledGaussianMechanism(owner.sampling_probability,
                                                 owner.noise_multiplier),
        eps_error=1.0 if owner.eps_error is None else owner.eps_error,
        delta_error=owner.delta / 1000.0,
        max_self_compositions=[owner.max_compositions],
    )
    if owner.eps_error is None:  # the PLD accountant's default precision, never refined
        accountant.eps_error = math.inf
        accountant._precision = _DEFAULT_PRECISION
        accountant._accountant = accountant._fresh(_DEFAULT_PRECISION)
    return accountant
