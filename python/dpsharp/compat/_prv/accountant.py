"""prv-accountant's ``PRVAccountant`` and ``Accountant`` on dpsharp's tight PLD accountant.

``PRVAccountant(prvs, eps_error, delta_error, max_self_compositions)`` composes each privacy
random variable ``num_self_compositions[i]`` times. prv-accountant (Gopi, Lee, Wutschitz 2021)
discretises the PRVs on a mesh derived from ``eps_error`` and ``delta_error`` and returns an
estimate with an error band; here every PRV's dpsharp event
(:mod:`.privacy_random_variables`) is composed in :class:`dpsharp.accountants.pld.PLDAccountant`,
and the answers keep prv-accountant's conventions, with certified numbers:

* ``compute_epsilon(delta, num_self_compositions) -> (lower, estimate, upper)``: ``lower`` and
  ``upper`` are the PLD accountant's certified bounds on the optimal epsilon (not an estimate
  plus or minus ``eps_error``), at most ``2 * eps_error`` apart. As prv-accountant's mesh
  follows ``eps_error``, so do the grids here: ``upper`` is the PLD accountant's epsilon at the
  relative ``precision`` 2 ``eps_error`` (clamped to [1e-3, 0.5]; the same float as
  ``dpsharp.accountant("pld", precision=...).compose(...).epsilon(delta)``,
  :attr:`PRVAccountant.precision`), whose pessimistic rounding errs at second order in the grid
  step and lands within a few percent of the exact epsilon; ``lower`` comes from the optimistic
  composition of one neighbouring direction on that grid halved until the bracket is at most
  ``2 * eps_error`` wide (once from the start for Poisson sampling, whose optimistic rounding
  errs far more), and the precision itself is refined only when that is not enough (where
  even the finest grids tried are not, the wider certified bracket comes with a
  ``RuntimeWarning``). ``estimate`` is ``upper``, dpsharp's certified number for the
  composition.
* ``compute_delta(epsilon, num_self_compositions) -> (lower, estimate, upper)``: certified
  bounds on delta(epsilon) (the lower one from the same optimistic grid as ``compute_epsilon``
  first tries); ``estimate`` is ``upper``.
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
from dpsharp.accountants.pld import _MAX_SIZE, _tail_for
from dpsharp.events import Event, PoissonSampled

from dpsharp.compat._prv import privacy_random_variables as _prvs
from dpsharp.compat._prv.privacy_random_variables import PrivacyRandomVariable

__all__ = ["Accountant", "ComposedPrivacyRandomVariable", "PRVAccountant"]

#: the PLD accountant's default relative precision (the deprecated ``Accountant`` without
#: ``eps_error``), and the finest one a PRVAccountant starts from
_DEFAULT_PRECISION = 1e-3
#: the coarsest relative precision asked of the PLD accountant for the upper bound: its grid
#: puts the upper bound within a few percent of the exact epsilon (about precision / 30 on
#: bench/results/adapters.md's settings), and the bracket's width is met by the lower bound's
#: finer grids (:func:`_bounds`)
_COARSEST = 0.5
#: the upper bound's precision is ``_PER_ERROR * eps_error`` within [1e-3, _COARSEST]
_PER_ERROR = 2.0
#: times the upper bound's precision is refined when the lower bounds cannot meet the width
_MAX_REFINEMENTS = 6
#: the lower bound's grid is at most 2^_MAX_LOWER_REFINEMENT times finer than the upper's
_MAX_LOWER_REFINEMENT = 4
#: the optimistic composition of a lower bound at delta truncates at most this times delta
_LOWER_TAIL = 1e-3


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


def _optimistic_epsilon(acc: _DpsharpAccountant, delta: float, refinement: int
                       ) -> tuple[float, int]:
    """(a certified lower bound on the optimal epsilon of ``acc``'s composition at ``delta``,
    the circle it was composed on): the optimistic composition of its first neighbouring
    direction alone, on the grid halved ``refinement`` times (the closed form of a plain
    Gaussian composition, circle 0). Under add/remove the optimal epsilon is the larger of the
    two directions' (the PLD accountant's upper bound takes the worse direction), so a lower
    bound on one direction bounds it from below; the first, remove, is the one that usually
    dominates. Raises ``ValueError`` below the optimistic side's round-off floor."""
    if acc._exact_gaussian() is not None:  # type: ignore[attr-defined]
        return float(acc._epsilon_side(delta, pessimistic=False,  # type: ignore[attr-defined]
                                       refinement=0)), 0
    if not acc._bounded_loss_only():  # type: ignore[attr-defined]
        acc._check_floor_up_front(2.0, delta)  # type: ignore[attr-defined]
    direction = acc._directions()[0]  # type: ignore[attr-defined]
    result = acc._composed(  # type: ignore[attr-defined]
        direction, False, acc._grid_step(refinement),  # type: ignore[attr-defined]
        _lower_tail(delta, acc._precision),  # type: ignore[attr-defined]
        refine=False,  # the direct sums tighten a round-off bound far below delta
    )
    acc._check_floor([result], delta)  # type: ignore[attr-defined]
    return float(result.epsilon(delta, pessimistic=False)), int(result.size)


def _pessimistic_epsilon(acc: _DpsharpAccountant, direction: str, grid_step: float,
                        delta: float, *, coarse: bool, refine: bool = True) -> float:
    """The PLD accountant's certified upper epsilon of one direction's pessimistic composition
    on ``grid_step``, as its ``epsilon`` computes it (the truncation of ``_tail_for``, the
    round-off floors, the support bound of a bounded composition below the floor); raises
    ``ValueError`` where that refuses. ``refine`` False keeps the transforms' looser round-off
    bound (still an upper bound, for a check that only compares)."""
    if not acc._bounded_loss_only():  # type: ignore[attr-defined]
        acc._check_floor_up_front(2.0, delta)  # type: ignore[attr-defined]
    tail = _tail_for(delta, acc._precision)  # type: ignore[attr-defined]
    result = acc._composed(direction, True, grid_step, tail,  # type: ignore[attr-defined]
                           coarse=coarse, refine=refine)
    try:
        acc._check_floor([result], delta)  # type: ignore[attr-defined]
    except ValueError:  # below the FFT's floor the support bound still holds (as in epsilon)
        exact = result.support_epsilon(delta) if hasattr(result, "support_epsilon") else None
        if exact is None:
            raise
        return float(exact)
    return float(result.epsilon(delta, pessimistic=True))


def _upper_epsilon(acc: _DpsharpAccountant, delta: float) -> float:
    """``acc.epsilon(delta)``, the same float, with a cheaper skip of the second direction.

    The PLD accountant's epsilon is the larger of the directions' pessimistic epsilons on its
    grid h, and it skips the add direction when that direction's value on the grid 4h (a
    mean-preserving spread of the one on h, so at least as large) is already at most the
    remove direction's. On the coarse grids that ``eps_error`` allows, 4h is often too coarse
    to decide and the add direction is composed on h; here it is first tried on 2h (again a
    spread of h's, half the circle): when that is at most the remove direction's value, the
    answer is the remove direction's value, exactly what ``acc.epsilon`` returns (its own skip
    or its maximum, in which the add direction's value on h is at most the one on 2h).
    Otherwise, or wherever a check refuses, ``acc.epsilon`` itself answers (reusing the remove
    direction's composition)."""
    directions = acc._directions()  # type: ignore[attr-defined]
    if len(directions) < 2 or acc._exact_gaussian() is not None:  # type: ignore[attr-defined]
        return float(acc.epsilon(delta))
    step = acc._grid_step(0)  # type: ignore[attr-defined]
    try:
        first = _pessimistic_epsilon(acc, directions[0], step, delta, coarse=False)
        if math.isfinite(first) and all(
            _pessimistic_epsilon(acc, other, 2.0 * step, delta, coarse=True, refine=False)
            <= first
            for other in directions[1:]
        ):
            return first
    except ValueError:
        pass
    return float(acc.epsilon(delta))


def _lower_tail(delta: float, precision: float) -> float:
    """The truncation budget of the optimistic composition behind a lower bound at ``delta``:
    the mass it drops beyond its window (at most twice the budget) is subtracted from its
    delta, which then moves the lower epsilon by a negligible amount as long as the budget is
    far below ``delta``: a power of ten at most ``_LOWER_TAIL * delta``, and never below the
    PLD accountant's own (``_tail_for``). A wider budget than the upper bound's shortens the
    discretised PLDs and the circle (fewer terms in the transforms)."""
    budget = max(_LOWER_TAIL * delta, _tail_for(delta, precision))
    return float(10.0 ** math.floor(math.log10(budget)))


def _first_refinement(acc: _DpsharpAccountant, width: float) -> int:
    """The first lower-bound grid: the upper bound's own (refinement 0) for a composition
    without Poisson sampling, one halving for a Poisson-subsampled one (asymmetric), whose
    per-step losses pile up near log(1 - q), within a grid step or two of 0, where the
    optimistic rounding moves a large part of each step's mass to smaller losses (on
    bench/results/adapters.md's settings the same grid leaves the lower bound 0.18 to 1.0
    below the exact epsilon); none when no width is asked (``width`` infinite)."""
    if not math.isfinite(width):
        return 0
    return 1 if len(acc._directions()) > 1 else 0  # type: ignore[attr-defined]


def _bounds(acc: _DpsharpAccountant, delta: float, width: float
            ) -> tuple[float, float, bool]:
    """Certified (lower, upper) epsilon bounds at ``delta``, at most ``width`` apart where the
    grids allow, and whether finer grids could still narrow them: the upper bound is the PLD
    accountant's one number (``epsilon``, on its grid); the lower one comes from the optimistic
    composition of one direction (:func:`_optimistic_epsilon`) on the grid halved
    :func:`_first_refinement` times, then halved again (twice at once while the bracket is more
    than 3 times too wide) until the width is met, the grid is 2^_MAX_LOWER_REFINEMENT times
    finer or the circle would exceed the PLD accountant's largest; the largest lower bound found
    is kept (each is certified). Where ``delta`` is below the optimistic composition's round-off
    floor the search stops there, with False: a finer grid only raises the floor (a longer
    transform), and retrying every finer grid at every precision cost minutes (five Laplace
    mechanisms at delta 1e-14)."""
    upper = _upper_epsilon(acc, delta)
    if not math.isfinite(upper):
        return (0.0, upper, True)
    lower = 0.0
    refinement = _first_refinement(acc, width)
    while True:
        try:
            value, circle = _optimistic_epsilon(acc, delta, refinement)
        except ValueError:  # below the optimistic side's round-off floor on this grid
            return (lower, upper, False)
        lower = max(lower, min(value, upper))
        gap = upper - lower
        if gap <= width or refinement >= _MAX_LOWER_REFINEMENT or not math.isfinite(width):
            return (lower, upper, True)
        step = 2 if gap > 3.0 * width else 1
        step = min(step, _MAX_LOWER_REFINEMENT - refinement)
        if circle << step > _MAX_SIZE:
            return (lower, upper, True)
        refinement += step


def _delta_bounds(acc: _DpsharpAccountant, epsilon: float, width: float
                  ) -> tuple[float, float]:
    """Certified (lower, upper) delta(epsilon): the upper bound is the PLD accountant's
    (``delta``, on its grid, with the truncation it chose); the lower one the optimistic
    composition of one direction (see :func:`_optimistic_epsilon`) with that truncation, on the
    grid :func:`_first_refinement` asks for ``width``."""
    if acc._exact_gaussian() is not None:  # type: ignore[attr-defined]
        lower, upper = acc.delta_bounds(epsilon)  # type: ignore[attr-defined]
        return float(lower), float(upper)
    upper, tail = acc._delta_upper(epsilon)  # type: ignore[attr-defined]
    result = acc._composed(  # type: ignore[attr-defined]
        acc._directions()[0], False,  # type: ignore[attr-defined]
        acc._grid_step(_first_refinement(acc, width)), tail,  # type: ignore[attr-defined]
        refine=False,  # the direct sums tighten a round-off bound far below these deltas
    )
    lower = float(result.delta(epsilon, pessimistic=False))
    return max(0.0, min(lower, float(upper))), float(upper)


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
        Half-width allowed for the epsilon bracket, in (0, inf): the grids are chosen from it
        and refined until ``upper - lower <= 2 * eps_error`` (see the module docstring).
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
        # (the upper bound's grid) starts at 2 eps_error (within [1e-3, 0.5]), the lower bound's
        # grid is made finer until the bracket is at most 2 eps_error wide (_bounds), and the
        # precision is refined only when that cannot reach the width
        # Every query starts from this precision (a refinement for one query never carries
        # over to the next, so an answer does not depend on what was asked before).
        self._base_precision = min(_COARSEST, max(_DEFAULT_PRECISION, _PER_ERROR * self.eps_error))
        self._precision = self._base_precision
        # per precision used: the PLD accountant and the counts composed into it
        self._held: dict[float, tuple[_DpsharpAccountant, list[int]]] = {}
        self._accountant: _DpsharpAccountant = self._compose([0] * len(prvs), self._base_precision)

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
        """The PLD accountant at ``precision`` holding ``counts``; grows the one held for that
        precision when it holds no more than ``counts`` (the PLD accountant's answers depend
        only on the composed multiset, so growing it gives the same numbers as composing
        afresh)."""
        held = self._held.get(precision)
        if held is None or any(have > want for have, want in zip(held[1], counts)):
            held = self._held[precision] = (self._fresh(precision), [0] * len(counts))
        accountant, composed = held
        for i, (event, want) in enumerate(zip(self.events, counts)):
            if event is not None and want > composed[i]:
                accountant.compose(event, want - composed[i])
            composed[i] = want
        self._accountant, self._precision = accountant, precision
        return accountant

    def compute_composition(
        self, num_self_compositions: int | Sequence[int] | None = None
    ) -> ComposedPrivacyRandomVariable:
        """The composition of ``num_self_compositions[i]`` copies of each PRV (default 1)."""
        counts = self._requested(num_self_compositions)
        return ComposedPrivacyRandomVariable(self._compose(counts, self._base_precision),
                                             self._infinity(counts))

    def compute_epsilon(
        self, delta: float, num_self_compositions: int | Sequence[int]
    ) -> tuple[float, float, float]:
        """(lower, estimate, upper) epsilon at ``delta``: certified bounds at most
        ``2 * eps_error`` apart; ``estimate`` is ``upper`` (dpsharp's certified number). Where
        the finest grids tried cannot bring the bracket within ``2 * eps_error`` (the upper
        bound's precision halved 6 times, the lower bound's grid 16 times finer), or ``delta``
        is below the round-off floor of the lower bound's composition, the wider, still
        certified, bracket is returned with a ``RuntimeWarning``."""
        counts = self._requested(num_self_compositions)
        finite = _with_infinity(require_delta(delta), self._infinity(counts))
        if finite is None:
            return (math.inf, math.inf, math.inf)
        precision = self._base_precision
        best = 0.0  # every lower bound is certified: the largest is kept
        for _ in range(_MAX_REFINEMENTS + 1):
            acc = self._compose(counts, precision)
            if acc.is_empty:
                return (0.0, 0.0, 0.0)
            lower, upper, refinable = _bounds(acc, finite, 2.0 * self.eps_error)
            best = lower = min(max(best, lower), upper)
            if upper - lower <= 2.0 * self.eps_error or not math.isfinite(upper):
                return (lower, upper, upper)
            if not refinable:  # the lower bound is at its round-off floor: see _bounds
                break
            # the precision is the relative gap (upper - lower) / upper
            precision = min(0.5 * precision, 0.9 * 2.0 * self.eps_error / upper)
        warnings.warn(
            f"compute_epsilon: the certified bracket [{lower!r}, {upper!r}] at delta={delta!r} "
            f"is wider than 2 * eps_error = {2.0 * self.eps_error!r} on the finest grids tried; "
            "both ends are still certified bounds (the lower one is where the optimistic "
            "discretisation errs most, e.g. an eps_error far below 1e-3 of epsilon, or a delta "
            "below the round-off floor of its composition)",
            RuntimeWarning,
            stacklevel=2,
        )
        return (lower, upper, upper)

    def compute_delta(
        self, epsilon: float, num_self_compositions: int | Sequence[int]
    ) -> tuple[float, float, float]:
        """(lower, estimate, upper) delta at ``epsilon``: certified bounds; ``estimate`` is
        ``upper``."""
        epsilon = require_epsilon(epsilon)
        counts = self._requested(num_self_compositions)
        infinity = self._infinity(counts)
        acc = self._compose(counts, self._base_precision)
        lower = upper = 0.0
        if not acc.is_empty:
            lower, upper = _delta_bounds(acc, epsilon, 2.0 * self.eps_error)
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
        accountant._held.clear()
        accountant._base_precision = _DEFAULT_PRECISION
        accountant._compose([0] * len(accountant.prvs), _DEFAULT_PRECISION)
    return accountant
