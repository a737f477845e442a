"""The tight accountant: privacy-loss distributions composed by FFT, with certified bounds.

Every mechanism event is replaced by a dominating pair (P, Q) whose privacy loss
L = log(dP/dQ)(X), X ~ P, is discretised on the grid {k h} twice (see ``cpp/include/dpsharp/
pld.hpp`` for the proofs):

* *pessimistic*: "connect the dots" (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022), a
  mean-preserving spread of Y = e^{-L} in each grid cell; every delta(eps) it gives, for every
  composition, is an upper bound;
* *optimistic*: post-processing to cells centred on the grid points followed by mean-preserving
  merges (the mirror argument); every delta(eps) is a lower bound.

Composition is convolution, done by FFT with a pointwise power for ``count`` copies (Koskela,
Jalko, Honkela 2020), and the folding of the linear result onto the FFT circle is accounted for
with Chernoff bounds (see :mod:`dpsharp.accountants._pld_numerics`). A schedule with many distinct
events (a different noise multiplier at every step) rounds the multipliers onto a grid geometric
in the root of the per-step loss variance (pessimistically for the upper bound; sampling rates
are kept) and accounts them on a grid twice the formula's (the rounding, not the grid, sets
such a schedule's bracket; its lower bound is taken on the formula's grid), discretises them in
batches that share the sigma-independent work, and composes them in two levels with the first
level's truncation accounted on each side (``_pld_numerics._compose_two_level``). A long
composition (from 2^15 steps) of few distinct events is done in two stages when that is
predicted to be cheaper: blocks of steps on the fine grid, each block moved to a coarser grid
by a mean-preserving spread (pessimistic) or contraction (optimistic), then the blocks
(``_pld_numerics.compose_staged``).
A long composition's spectrum is confined to a band of low frequencies; such a composition is
kept as that band and its epsilon and delta queries are answered from closed-form sums over it,
without the inverse transform of the circle (``_pld_band``). A narrow per-step PLD composed many
times then needs its transform only below a frequency that a certificate bounds (total variation
or a coarse certified grid), computed by direct sums over the PLD's masses
(``_pld_numerics._pruned_reach``); with that, one stage is usually cheaper than two and the
staging prediction says so.
A composition of plain Gaussian mechanisms only (no sampling, any noise multipliers) is exactly
mu-GDP with mu = sqrt(sum_i c_i / sigma_i^2) (Dong, Roth, Su 2019, Cor. 3.3) and is answered from
that closed form, with no grid and no FFT (``_pld_gaussian``). A composition of randomized
response and discrete Laplace mechanisms only, whose privacy losses take finitely many values, is
composed exactly over its multinomial outcomes while they are few enough (``_pld_lattice``):
certified to about 1e-12 relative at every delta, where the grid leaves a bracket of the
precision's size and the FFT's round-off floor refuses small deltas.
The floating-point error of the composition (transforms, powers, inverse transform, sums) is
covered by an a priori bound proven in ``_pld_numerics`` (ComposedPLD.noise), added to every
upper delta and subtracted from every lower one; a composition whose bound alone exceeds the
asked delta is refused before anything is allocated.
Hockey-stick curves:
delta(eps) = E_P[(1 - e^{eps - L})_+] + P(L = inf) (Balle, Wang 2018; the blog post "A Tail of
Two Densities", 2019).

Under add/remove one, Poisson subsampling is asymmetric: the pair of the remove direction
((1-q) N(0,1) + q N(mu,1) against N(0,1)) and of the add direction (the reverse) are composed
separately (every step of one pair of neighbouring datasets has the same direction) and the worse
delta is reported. The symmetrised trade-off min{f, f^-1}** of Bu et al. 2020 (Section 2.2)
is given by :meth:`PLDAccountant.tradeoff` with ``symmetrised=True``. Sampling without replacement
under replace-one uses the pair of min{f_q, f_q^-1}** with f_q = q G_mu + (1 - q) Id (Dong, Roth,
Su 2019, Thm 4.2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from itertools import islice
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
from scipy.special import log_ndtr

from dpsharp._native import core as _core
from dpsharp._rounding import fraction_rounded_up
from dpsharp._validation import (
    require_delta,
    require_epsilon,
    require_real,
    require_real_array,
)
from dpsharp.accountants import _pld_atoms as _atoms
from dpsharp.accountants import _pld_continuous as _continuous
from dpsharp.accountants import _pld_gaussian
from dpsharp.accountants import _pld_lattice
from dpsharp.accountants._pld_band import CrossingHint
from dpsharp.accountants._pld_numerics import (
    ComposedPLD,
    DiscretePLD,
    LeafSpectrum,
    compose,
    compose_staged,
    parallel_map,
    roundoff_floor,
    staging_pays,
    threads_for_caller,
)
from dpsharp.accountants.base import Accountant, PrivacyGuarantee
from dpsharp.accountants.registry import register
from dpsharp.events import (
    DiscreteLaplace,
    Event,
    Gaussian,
    Laplace,
    Neighbouring,
    PoissonSampled,
    RandomizedResponse,
    SampledWithoutReplacement,
    Shuffled,
    SingleEpochTreeAggregation,
)

__all__ = ["PLDAccountant"]

# Mechanism codes of the C++ core (dpsharp::pld::Mechanism).
_GAUSSIAN, _LAPLACE, _REMOVE, _ADD, _SYMMETRIC = 0, 1, 2, 3, 4

#: Budget for the mass beyond the truncations (per composition, before relative scaling).
_TAIL_BUDGET = 1e-12
#: Smallest truncation budget (beyond it the round-off of the FFT dominates).
_MIN_TAIL = 1e-30
#: Largest FFT circle (2^24 points, 128 MiB of doubles) before giving up refining.
_MAX_SIZE = 1 << 24
#: Above this share of the delta in question, a staged composition's round-off moved to its
#: blocks' tops also has the one-stage composition computed (:meth:`PLDAccountant._fine_value`).
_STAGED_ROUNDOFF_SHARE = 1e-2


@dataclass(frozen=True)
class _Composition(ComposedPLD):
    """A pessimistic composition that also knows the largest finite loss of its linear support,
    ``support_loss`` = h sum_i c_i k_i (k_i the top grid index of leaf i, c_i its count), and
    whether the composed discretised leaves put any mass at +inf (``bounded``: none does).

    A bounded composition (every leaf's loss is bounded above, e.g. Laplace, whose loss is at
    most 1/b, and no truncation sent mass to +inf) has every loss at most ``support_loss``, so
    delta(epsilon) = E[(1 - e^{epsilon - L})_+] is exactly 0 for epsilon >= support_loss, and
    epsilon(delta) <= support_loss at every delta: no FFT, window or round-off allowance enters
    either (the FFT's masses above the support are its round-off). On a grid that holds the
    Laplace atoms (:func:`_laplace_aligned`) this is the exact pure-DP statement: delta = 0 at
    epsilon = sum_i c_i / b_i, and epsilon <= sum_i c_i / b_i at every delta, even below the
    FFT's round-off floor.

    The top of a bounded composition is known exactly too: its mass at ``support_loss`` = L is
    m = prod_i m_i^{c_i} (m_i the top mass of leaf i: the only way to reach L is every release
    at its top), and every other composed loss is at most L - h (all lie on the grid). So for
    L - h <= epsilon <= L, delta(epsilon) = m (1 - e^{epsilon - L}) exactly, and for delta
    < m (1 - e^{-h}) the smallest epsilon with delta(epsilon) <= delta is L + log(1 - delta /
    m), else at most L - h (where delta(L - h) = m (1 - e^{-h})): near the pure-DP epsilon a
    small delta buys epsilon below L, again with no FFT. ``log_top_mass`` is an upper bound on
    log m (the rounding of the logarithms and their sum covered by a margin, below), so the
    values stay upper bounds."""

    support_loss: float = math.inf
    bounded: bool = False
    log_top_mass: float = math.inf
    #: the composition's largest loss with mass (every leaf at its top non-zero point) and
    #: a lower bound on the log of that mass, for lower bounds (:meth:`top_epsilon_lower`);
    #: -inf where none is certified (a leaf with a negative mass somewhere, or unbounded)
    atom_loss: float = math.inf
    log_atom_mass_lower: float = -math.inf
    #: composed in one level from discretised leaves with non-negative masses: the exact
    #: composition's hockey-stick curve is non-increasing, so an epsilon query may start its
    #: search at a hint (:meth:`ComposedPLD.epsilon`)
    monotone: bool = False

    @classmethod
    def of(
        cls,
        result: ComposedPLD,
        plds: Sequence[DiscretePLD],
        counts: Sequence[int],
        *,
        monotone: bool = False,
    ) -> _Composition:
        values = {name: getattr(result, name) for name in _composed_fields()}
        top = sum(count * (pld.offset + pld.mass.size - 1) for pld, count in zip(plds, counts))
        bounded = all(pld.infinity_mass == 0.0 for pld in plds) and result.infinity_mass == 0.0
        log_top = math.inf
        atom_loss, log_atom_lower = math.inf, -math.inf
        if bounded:
            tops = [float(pld.mass[-1]) for pld in plds]
            if min(tops, default=0.0) <= 0.0:
                log_top = -math.inf  # no mass at the support's top point
            else:
                log_top = _log_product_bound(tops, counts, upper=True)
            if plds and all(pld.non_negative for pld in plds):
                atoms = [_top_atom(pld.mass) for pld in plds]
                if all(index >= 0 for index, _ in atoms):
                    atom_loss = result.grid_step * sum(
                        count * (pld.offset + index)
                        for pld, (index, _), count in zip(plds, atoms, counts)
                    )
                    log_atom_lower = _log_product_bound(
                        [mass for _, mass in atoms], counts, upper=False
                    )
        return cls(**values, support_loss=top * result.grid_step, bounded=bounded,
                   log_top_mass=log_top, atom_loss=atom_loss,
                   log_atom_mass_lower=log_atom_lower, monotone=monotone)

    def delta(self, epsilon: float, *, pessimistic: bool) -> float:
        if pessimistic and self.bounded and epsilon >= self.support_loss:
            return 0.0
        value = super().delta(epsilon, pessimistic=pessimistic)
        top = self._top_delta(epsilon) if pessimistic else None
        return value if top is None else min(value, top)

    def epsilon(
        self, delta: float, *, pessimistic: bool, hint: CrossingHint | None = None
    ) -> float:
        value = super().epsilon(
            delta, pessimistic=pessimistic, hint=hint if self.monotone else None
        )
        exact = self.support_epsilon(delta) if pessimistic else None
        return value if exact is None else min(value, exact)

    def _top_delta(self, epsilon: float) -> float | None:
        """m (1 - e^{epsilon - L}) for L - h <= epsilon < L (class docstring), rounded up by
        4 u relative (expm1, the exp of the log, the product), else None."""
        loss, step = self.support_loss, self.grid_step
        if not (self.bounded and loss - step <= epsilon < loss) or self.log_top_mass < -700.0:
            return None  # (below e^-700 the top mass would underflow)
        value = math.exp(self.log_top_mass) * -math.expm1(epsilon - loss)
        return min(value * (1.0 + 4.0 * 2.0**-53), 1.0)

    def top_epsilon_lower(self, delta: float) -> float | None:
        """A certified lower bound on epsilon(delta) from one atom alone, for an optimistic
        composition of bounded leaves with non-negative masses; None where there is none.

        Its delta(epsilon) = sum_L p(L) (1 - e^{epsilon - L})_+ is a sum of non-negative
        terms and at most the true delta(epsilon) (the optimistic side). One term is the
        composition's largest loss with mass, L = ``atom_loss`` (every leaf at its top
        non-zero point: the only way to reach it), of mass m = prod_i m_i^{c_i}. So
        epsilon(delta) >= L + log(1 - delta / m) for delta < m, with no FFT: a lower bound
        that holds below the FFT's round-off floor, where the composition's own curve cannot
        be read (e.g. k-fold randomized response or discrete Laplace at delta 1e-14). m is
        taken from ``log_atom_mass_lower`` and every rounding is covered by margins (4 u of
        the terms, as :meth:`support_epsilon`)."""
        loss = self.atom_loss
        if (not math.isfinite(loss) or not self.log_atom_mass_lower > -700.0
                or not 0.0 < delta < 1.0):
            return None
        # m rounded down (exp within 1 ulp), the ratio rounded up
        ratio = delta / (math.exp(self.log_atom_mass_lower) * (1.0 - 2.0**-52))
        ratio *= 1.0 + 2.0**-52
        if not ratio < 1.0:
            return None
        shift = math.log1p(-ratio)
        value = loss + shift - 4.0 * 2.0**-52 * (abs(loss) + abs(shift))
        return max(value, 0.0)

    def top_delta_lower(self, epsilon: float) -> float:
        """A certified lower bound on delta(epsilon) from the same atom (see
        :meth:`top_epsilon_lower`): m (1 - e^{epsilon - L}) for epsilon < L, rounded down,
        else 0."""
        loss = self.atom_loss
        if (not math.isfinite(loss) or not self.log_atom_mass_lower > -700.0
                or not epsilon < loss):
            return 0.0
        value = math.exp(self.log_atom_mass_lower) * -math.expm1(epsilon - loss)
        return max(value * (1.0 - 4.0 * 2.0**-52), 0.0)

    def support_epsilon(self, delta: float | None = None) -> float | None:
        """For a bounded composition, max(support_loss, 0) (delta is 0 there), and with
        ``delta`` the smaller bound of the top mass (class docstring): L + log(1 - delta / m)
        where that is at least L - h, else L - h, raised by 4 ulp of its terms (the rounding of
        the quotient, log1p and the sum). None for an unbounded composition."""
        if not self.bounded:
            return None
        loss = self.support_loss
        if delta is None or not delta > 0.0 or not math.isfinite(loss):
            return max(loss, 0.0)
        below = loss - self.grid_step
        if self.log_top_mass < -700.0:  # (an underflowing top mass, below any delta asked)
            return max(min(below, loss), 0.0) if delta >= 1e-300 else max(loss, 0.0)
        ratio = delta / math.exp(self.log_top_mass)
        if ratio < 1.0:
            shift = math.log1p(-ratio)
            below = max(below, loss + shift + 4.0 * 2.0**-52 * (abs(loss) + abs(shift)))
        return max(min(below, loss), 0.0)


def _log_product_bound(masses: Sequence[float], counts: Sequence[int], *, upper: bool) -> float:
    """An upper (``upper``) or lower bound on log prod_i masses[i]^counts[i] (masses > 0):
    each log within 1 ulp, each product and the correctly rounded sum within half an ulp, so
    8 u of the terms' moduli (and of the sum) bounds them all."""
    terms = [count * math.log(mass) for mass, count in zip(masses, counts)]
    margin = 8.0 * 2.0**-53 * (math.fsum(abs(term) for term in terms) + 1.0)
    total = math.fsum(terms)
    return total + margin if upper else total - margin


def _top_atom(mass: np.ndarray) -> tuple[int, float]:
    """(index, mass) of the last positive entry of ``mass``, or (-1, 0.0) if none."""
    for width in (64, mass.size):  # the top few points first: usually they hold it
        tail = mass[mass.size - width:] if width < mass.size else mass
        positive = np.flatnonzero(tail > 0.0)
        if positive.size:
            index = int(positive[-1]) + mass.size - tail.size
            return index, float(mass[index])
    return -1, 0.0


@functools.cache
def _composed_fields() -> tuple[str, ...]:
    """The init fields of :class:`ComposedPLD` that :meth:`_Composition.of` copies (looked up
    once: a query after every step builds one composition per direction)."""
    return tuple(f.name for f in dataclasses.fields(ComposedPLD) if f.init)


class _Leaf(NamedTuple):
    """One mechanism in one direction: (mechanism code, parameter, sampling rate). A named tuple:
    tens of thousands are made and hashed for a long heterogeneous schedule."""

    mechanism: int
    parameter: float
    rate: float


#: A leaf's discretisation key as :meth:`PLDAccountant._leaves` makes it: (mechanism code,
#: parameter, rate), equal (and hashing equal) to the :class:`_Leaf` of the same fields.
_Key = tuple[int, float, float]


def _distinct_leaves(counts: Mapping[_Key, int]) -> list[_Leaf]:
    """The distinct keys of ``counts`` as :class:`_Leaf` objects, in the canonical (sorted)
    order (mechanism, parameter, rate), so that floating-point sums over them do not depend on
    the order of composition."""
    return [_Leaf(*key) for key in sorted(counts)]


class _DirectionCache:
    """Per direction and grid: the leaves' discretised PLDs, their spectra and the last result."""

    def __init__(self) -> None:
        self.plds: dict[tuple[_Leaf, bool], DiscretePLD] = {}
        self.spectra: dict[bool, dict[Any, LeafSpectrum]] = {True: {}, False: {}}
        self.results: dict[tuple[bool, tuple[_Leaf, ...], tuple[int, ...], bool],
                           ComposedPLD] = {}


@register("pld")
class PLDAccountant(Accountant):
    """Privacy-loss-distribution accountant with certified upper and lower bounds.

    Parameters
    ----------
    precision
        Target relative gap (upper - lower) / upper between the two epsilon bounds, in (0, 1).
        The grid step h is derived from it and from the mean per-step variance of the privacy
        loss (see :meth:`_base_step`; second-order roundings err by O(T h^2) against a composed
        variance of order T; a short composition gets a finer grid, and Laplace atoms are put
        on the grid), and the per-step truncation from the tail budget divided by T rounded up
        to a power of two (at least 4): both are functions of the composed multiset only, so
        incremental, all-at-once and restored accountants give identical answers.
        :meth:`epsilon_bounds` refines the lower bound's grid until the gap is met or the FFT
        size limit is reached, and then returns the wider honest bracket.
    neighbouring
        The relation every guarantee is stated under (``"add_remove"``, ``"zero_out"`` or
        ``"replace_one"``; see :mod:`dpsharp.events`). Reshuffled epochs (``Shuffled``) need
        zero-out or replace one; Poisson steps give the same numbers under add/remove and
        zero-out.

    Notes
    -----
    ``epsilon(delta)`` is always a certified upper bound (up to double-precision round-off of
    about 1e-12 relative in the cell masses, and of an ulp or two in the largest loss of a
    discrete Laplace or randomized-response release, whose double value is taken as exact:
    within that of the top loss delta may read up to the top atom's mass times it, about 1e-16,
    below the exact value; neither is certified. Where every composed event's loss is bounded in
    a direction (a Laplace release by 1/b, rounded up; a Poisson-sampled Gaussian in the add
    direction by -log(1 - q)), that direction answers delta = 0 from the first double at or above
    the sum of the bounds, whatever the grid: a Laplace-only composition's exact pure-DP
    epsilon. The round-off of the FFT
    composition is covered by a proven bound, see ``_pld_numerics``), computed on the grid the
    precision implies. A delta below twice that bound is refused (except for a composition of
    pure-DP mechanisms, whose largest loss bounds epsilon at every delta without an FFT). A long
    run is composed in two stages (``compose_staged``), whose blocks move their round-off to
    their top losses; where that is more than 1% of the delta asked (of half the delta found,
    for a delta query), the one-stage composition is computed too and the smaller of the two
    certified bounds returned (:meth:`_fine_value`). A composition whose transforms would need
    more than 2^26 points (``_pld_numerics.MAX_TRANSFORM_POINTS``; billions of steps of a
    mechanism with a wide loss) is refused with a ValueError naming the size, not allocated.

    One composition, one certified number: :meth:`epsilon`, the upper end of
    :meth:`epsilon_bounds`, :meth:`guarantee` and every entry point built on them (the
    ``dpsharp epsilon`` statement, the Opacus and dp-accounting adapters, ``dpsharp bench
    precision``) give the same float for the same ledger, delta and precision. It is the
    certified upper bound on the grid that the precision implies (:meth:`_base_step`), placed
    within about precision / 8 of the exact epsilon on the settings of bench/bench_pld.py;
    :meth:`epsilon_bounds` proves how close by refining only its lower bound.

    A schedule with more than 512 distinct mechanism events (e.g. a different noise multiplier at
    every step) is accounted with its noise multipliers rounded onto a grid geometric in the
    root of their per-step loss variance, down for the upper bound and up for the lower one
    (a post-processing argument, see ``_quantized``; sampling rates are kept exact), with the
    finest quantum (at most half the
    precision) that leaves at most 512 distinct values, or else the coarsest whose predicted
    widening of the bracket is within the budget (``_gap_quantum``). The bounds stay certified;
    the bracket can then be up to about 3 times the precision wide, and ``epsilon_bounds``
    does not refine the grid beyond 64 distinct events. Such a rounded schedule's bracket is
    set by the rounding, not the grid: its grid step is twice the formula's (half the work per
    distinct event, about 0.03% on the upper bound) and ``epsilon_bounds`` takes its lower
    bound on the formula's grid (``_schedule_coarsening``).

    Comparing with dp-accounting: its ``value_discretization_interval`` is an absolute grid step
    of the privacy loss, while ``precision`` is relative, so the grid here is coarser than
    dp-accounting's at 1e-4 wherever the per-step loss is wide (large q, small sigma), except
    for short compositions, whose grid is refined until their whole support spans up to about
    800 000 points (about dp-accounting's grid step there, and its cost). Both discretisations
    err by O(h^2) with about the same constant; at the default precision ``epsilon`` at
    delta = 1e-5 is within 1.5e-4 relative of dp-accounting 0.6.0's default answer on the
    settings of bench/bench_pld.py (up to 1.25e-4 above it), and 3 steps of q = 0.2,
    sigma = 0.5 are within 1e-8 relative of the exact epsilon and not above dp-accounting's
    default answer (tests/test_pld_one_number.py).
    """

    certified = True

    def __init__(
        self,
        precision: float = 1e-3,
        *,
        neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    ) -> None:
        precision = require_real("precision", precision)
        if not 0.0 < precision < 1.0:
            raise ValueError(f"precision must be in (0, 1), got {precision!r}")
        super().__init__(neighbouring=neighbouring)
        self._precision = precision
        self._reset_caches()

    # ------------------------------------------------------------------ events
    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        inner = leaf.event if isinstance(leaf, Shuffled) else leaf
        if isinstance(inner, (Gaussian, Laplace, SingleEpochTreeAggregation) + _atoms.ATOM_EVENTS):
            return None
        if _continuous.is_leaf(inner):  # continuous monotone losses (_pld_continuous)
            return None
        if isinstance(inner, PoissonSampled):
            if isinstance(inner.event, Gaussian):
                return None
            return "Poisson sampling is analysed for an inner Gaussian or Laplace only"
        if isinstance(inner, SampledWithoutReplacement):
            if isinstance(inner.event, Gaussian):
                return None
            return "sampling without replacement is analysed for an inner Gaussian only"
        return f"{type(inner).__name__} events have no privacy-loss distribution here"

    def _leaves(self, leaf: Event, direction: str) -> _Key:
        """The discretisation key of a leaf event in one direction, as a plain tuple
        (mechanism code, parameter, rate): a long schedule makes one per event and direction,
        and a plain tuple of numbers is not tracked by the garbage collector (a named tuple is,
        and tens of thousands of them set off full collections); made a :class:`_Leaf` once
        per distinct key, where the composition needs one (:func:`_distinct_leaves`)."""
        if type(leaf) is PoissonSampled and type(leaf.event) is Gaussian:
            # The step of a per-step schedule, tens of thousands of times: the branch below
            # without the type tests before it (none of which such an event passes).
            sigma, q = leaf.event.noise_multiplier, leaf.sampling_probability
            if q == 1.0:
                return (_GAUSSIAN, sigma, 1.0)
            return (_REMOVE if direction == "remove" else _ADD, sigma, q)
        # A shuffled epoch costs one run of its event (parallel composition, see events.Shuffled).
        inner = leaf.event if isinstance(leaf, Shuffled) else leaf
        if isinstance(inner, Gaussian):
            return (_GAUSSIAN, inner.noise_multiplier, 1.0)
        if isinstance(inner, Laplace):
            return (_LAPLACE, inner.scale, 1.0)
        if isinstance(inner, _atoms.ATOM_EVENTS):
            return tuple(_atoms.leaf_key(inner, self._neighbouring, direction))
        if _continuous.is_leaf(inner):
            return tuple(_continuous.leaf_key(inner, self._neighbouring, direction))
        if isinstance(inner, SingleEpochTreeAggregation):  # its Gaussian (events.py)
            return (_GAUSSIAN, inner.equivalent_noise_multiplier, 1.0)
        if isinstance(inner, PoissonSampled):
            sigma = inner.event.noise_multiplier  # type: ignore[attr-defined]
            q = inner.sampling_probability
            if q == 1.0:
                return (_GAUSSIAN, sigma, 1.0)
            return (_REMOVE if direction == "remove" else _ADD, sigma, q)
        assert isinstance(inner, SampledWithoutReplacement)
        sigma = inner.event.noise_multiplier  # type: ignore[attr-defined]
        if inner.sample_size == inner.dataset_size:
            return (_GAUSSIAN, sigma, 1.0)
        return (_SYMMETRIC, sigma, inner.sampling_rate)

    def _directions(self) -> list[str]:
        """The directions composed: ["remove", "add"] when some event is asymmetric under the
        relation, else ["remove"]. A function of the set of composed events, which only grows
        between resets, so it is kept per number of distinct events (a query after every step
        asks again with the same set)."""
        memo = self._directions_memo
        if memo and memo[0] == len(self._counts):
            return list(memo[1])
        asymmetric = any(
            isinstance(leaf.event if isinstance(leaf, Shuffled) else leaf, PoissonSampled)
            and self._leaves(leaf, "remove")[0] == _REMOVE
            for leaf in self._counts
        ) or _atoms.asymmetric(self._counts, self._neighbouring) or _continuous.asymmetric(
            self._counts, self._neighbouring
        )
        directions = ("remove", "add") if asymmetric else ("remove",)
        self._directions_memo = [len(self._counts), directions]
        return list(directions)

    def _steps(self) -> int:
        return sum(self._counts.values())

    # ------------------------------------------------------------------ grid
    def _grid_step(self, refinement: int = 0) -> float:
        """The grid step of the composition at ``refinement`` (0: the grid of :meth:`epsilon`,
        :meth:`delta`, :meth:`tradeoff` and :meth:`gdp_mu`; each further level halves it, for
        the lower bounds of :meth:`epsilon_bounds`). A function of the composed multiset and the
        precision only (:meth:`_base_step`)."""
        return self._base_step() / (2.0**refinement)

    def _base_step(self) -> float:
        """h = 0.035 sqrt(precision / 1e-3) sqrt(V / T), rounded down to a step 2^k or
        3 * 2^(k-1), where V / T is the mean per-step variance of the privacy loss
        (q^2 (e^{mu^2} - 1) for a Poisson-sampled Gaussian, mu^2 for a Gaussian, 1/b^2 for
        Laplace); then

        * made finer while the composition is short (:meth:`_short_step`): its whole linear
          support, at most ``_SHORT_POINTS`` grid points, costs one small FFT, and a short
          composition's epsilon is where a coarse grid errs most against its size (a second-order
          rounding of 3 steps of a Poisson-sampled Gaussian with q = 0.2, sigma = 0.5 moves
          epsilon by 1e-3 relative at the formula's step);
        * moved onto the Laplace losses (:func:`_laplace_aligned`): where the largest loss 1/b of
          every Laplace event is a multiple of a step of the same family at most 16 times finer,
          that step is taken, so each Laplace atom sits on a grid point and the composition's
          largest loss is exact (delta is exactly 0 beyond it, see :class:`_Composition`).

        The roundings err by O(h^2) per step, so the relative error of epsilon is O(T h^2 / V);
        the constant puts the upper bound within about precision / 8 of the exact epsilon on the
        settings of bench/bench_pld.py (0.07, twice as coarse, left up to 0.7 precision), so that
        :meth:`epsilon_bounds` meets the precision by refining its lower bound only."""
        key = (len(self._counts), self._steps())
        cached = self._base_steps.get(key)
        if cached is not None:
            return cached
        # Per leaf in the order of self._counts (which only grows), computed once; fsum is
        # correctly rounded, so the total does not depend on the order of composition.
        variances = self._leaf_variances
        if len(variances) < len(self._counts):
            variances.extend(_loss_variance(leaf) for leaf in islice(self._counts, len(variances), None))
        total = math.fsum(count * variance for count, variance in zip(self._counts.values(), variances))
        spread = math.sqrt(total / max(self._steps(), 1))
        step = _STEP_CONSTANT * math.sqrt(self._precision / 1e-3) * spread
        step *= self._schedule_coarsening()
        step = max(min(max(step, 2.0**-20), 2.0**-4), self._support_step())
        power = 2.0 ** math.floor(math.log2(step))
        # Steps 2^k and 3 * 2^(k-1): every grid loss (offset + i) h is still exact in binary
        # (an integer times a power of two), and the step is at most a third (not half) below
        # the formula's.
        step = 0.75 * (2.0 * power) if step >= 1.5 * power else power
        refined = self._short_step(step)
        # (a refined short grid: its compositions' circles are sized for the whole bucket of
        # step counts, see _short_step)
        self._short_span = refined < step and self._smooth_leaves()
        step = _laplace_aligned(refined, self._laplace_losses())
        self._base_steps = {key: step}  # only the latest multiset is asked about again
        return step

    def _support_step(self) -> float:
        """The finest power-of-two step at which every Gaussian-family leaf's loss support,
        at most W = (1 + 2 z sigma) / sigma^2 + 2 wide (z = 12 standard deviations, both
        directions: the loss (2x - 1) / (2 sigma^2) of a Gaussian release, capped by log(1 - q)
        on one side under sampling), spans at most ``_LEAF_POINTS`` grid points; 0.0 where
        that is finer than the formula's step can be. Only a noise multiplier far below the
        usual (sigma below about 0.009) sets it: a leaf there spans millions of points of the
        capped step 2^-4 (sigma = 1e-3, q = 0.1: 8 million, and an 84-million-point transform
        that did not finish in minutes), while the loss it bounds runs to 1/(2 sigma^2) and
        beyond, so a coarser grid costs no relative precision (each release's rounding moves the
        loss by at most one step). A function of the set of composed events only: the
        smallest noise multiplier is kept per number of distinct events (the set only grows
        between resets), so an incremental run does not scan the leaves at every step."""
        memo = self._support_memo
        if not memo or memo[0] != len(self._counts):
            columns = self._leaf_columns(self._directions()[0])
            smallest_sigma = (float(np.min(columns.parameter[columns.rounded]))
                              if columns.rounded.any() else math.inf)
            self._support_memo = memo = [len(self._counts), smallest_sigma]
        sigma = memo[1]
        if math.isinf(sigma):
            return 0.0
        square = sigma * sigma
        width = (1.0 + 24.0 * sigma) / square + 2.0 if square > 0.0 else math.inf
        if not width > _LEAF_POINTS * 2.0**-4:
            return 0.0
        if not width <= _LEAF_POINTS * _MAX_STEP:
            # (1 + 24 s) / s^2 + 2 = L  <=>  (L - 2) s^2 - 24 s - 1 = 0
            widest = _LEAF_POINTS * _MAX_STEP - 2.0
            smallest = (24.0 + math.sqrt(576.0 + 4.0 * widest)) / (2.0 * widest)
            raise ValueError(
                f"noise_multiplier {sigma!r} is below the smallest the tight accountant "
                f"resolves next to other events or under sampling, {smallest:.3g}: its privacy "
                f"loss reaches 1 / (2 sigma^2) = {0.5 * _inverse_square(sigma):.3g} and no grid "
                f"of step at most {_MAX_STEP:g} covers it; such a release is not private (a "
                f"Gaussian without sampling alone is answered exactly)"
            )
        return 2.0 ** math.ceil(math.log2(width / _LEAF_POINTS))

    def _schedule_coarsening(self) -> float:
        """``_SCHEDULE_COARSENING`` for a schedule whose noise multipliers are rounded (more than
        ``_LEAF_BUDGET`` distinct events in some direction, :meth:`_rounding_quantum`), else 1.

        Such a schedule's bracket is dominated by the rounding of its noise multipliers (a
        budget of ``_ROUNDING_GAP`` times the precision), not by the grid: the upper bound's
        grid error is O(T h^2) (second order, a mean-preserving spread in each cell), so twice
        the step moves it by about three times the formula grid's own error, 0.03% on the
        schedules of bench/bench_schedules.py (q = 0.01, 10^3 to 10^5 distinct noise
        multipliers), while every leaf has half the grid points and its transforms half the
        circle. The optimistic side's grid error is first order, so :meth:`epsilon_bounds`
        computes the lower bound of such a schedule on the formula's grid (refinement 1),
        where the bracket stays within about ``_ROUNDING_GAP + 0.3`` times the precision.
        Either grid gives certified bounds; a function of the composed multiset only."""
        if len(self._counts) <= _LEAF_BUDGET:
            return 1.0
        for direction in self._directions():
            if self._rounding_quantum(direction, True) > 0.0:
                return _SCHEDULE_COARSENING
        return 1.0

    def _laplace_losses(self) -> list[float]:
        """The largest privacy loss 1/b of each distinct Laplace event (its atom; 1/b rounded
        up, as the core analyses it), collected over the leaves in the order of self._counts
        (which only grows), each leaf once."""
        seen = self._laplace_seen
        for leaf in islice(self._counts, seen[0], None):
            inner = leaf.event if isinstance(leaf, Shuffled) else leaf
            if isinstance(inner, Laplace):
                seen[1].add(_core.reciprocal_rounded_up(inner.scale))
            elif isinstance(inner, _atoms.ATOM_EVENTS):  # losses within 1e-12 of a dyadic value
                seen[1].update(_atoms.alignment_losses(inner, self._neighbouring))
        seen[0] = len(self._counts)
        return sorted(seen[1])

    def _short_step(self, step: float) -> float:
        """The grid step of a short composition: the largest step 2^k or 3 * 2^(k-1), at most
        ``step`` and at least ``step / 2^_SHORT_LEVELS``, at which the linear support of its
        bucket, 1 + ceil((B / T) sum_i c_i (n_i - 1)) grid points with n_i the points of leaf i
        (about proportional to 1/h), T the number of steps and B its bucket (the smallest power
        of two >= T, at least 4: :func:`_step_bucket`; B = T where some loss has an atom,
        :meth:`_smooth_leaves`), stays within ``_SHORT_POINTS``
        (scaled by sqrt(1e-3 / precision), like the step, and at most a quarter of the largest
        circle); ``step`` itself when not even one halving fits. The FFT circle of a composition
        is never longer than its linear support (and a refined composition's circle is sized
        for its bucket, :meth:`_composed`), so this bounds the cost of the finer grid; a
        long composition (whose support is far longer than its circle) keeps ``step``.

        The step is the same for every count of a bucket (of smooth losses), so a query after
        every step moves to a new grid (discretisation and transforms) about log2(T) times
        instead of at nearly every step: 4 grids over the first 32 steps of q = 0.01,
        sigma = 1 instead of 10 (22 over the first 54), where a new grid cost about 88 ms per
        step over the first ten. The grid of T steps is up to twice the one of its own
        support's budget (that of B steps; up to 5 times for one step), whose O(h^2) rounding
        stays far below the precision (epsilon at delta = 1e-5 moved by at most 1e-5 relative
        over the first 60 steps of q = 0.01, sigma = 1 and of q = 0.2, sigma = 0.5; the most at
        33 to 54 steps, which the bucket of 64 puts on the formula's grid)."""
        budget = min(_SHORT_POINTS * math.sqrt(1e-3 / self._precision), _MAX_SIZE / 4)
        steps = self._steps()
        # Every discretised leaf has at least two points: support >= steps + 1.
        if 2 * (steps + 1) > budget or len(self._counts) > _REFINE_UP_TO:
            return step
        # The support is taken for the bucket of step counts (:func:`_step_bucket`; every count
        # scaled by bucket / steps, rounded up): one grid for every count of the bucket, so that
        # a query after every step discretises and transforms the leaves once per bucket, not at
        # every step (the circle is sized for the bucket too, see :meth:`_composed`).
        # (Losses with atoms, whose rounding errs to first order, keep the grid of their own
        # count, as every composition did before: B = T in the support below.)
        smooth = self._smooth_leaves()
        bucket = _step_bucket(steps, smooth)
        span = bucket if smooth else steps
        if 2 * (span + 1) > budget:
            return step
        tail = _TAIL_BUDGET / bucket
        support = 0
        # Directions one at a time: the support is their maximum, so the first that does not
        # fit decides (the others are not discretised).
        for direction in self._directions():
            leaves: dict[_Key, int] = {}
            for key, count in zip(self._exact_keys(direction), self._counts.values()):
                leaves[key] = leaves.get(key, 0) + count
            order = _distinct_leaves(leaves)
            # Each leaf's number of grid points at (step, tail), kept: an incremental run asks
            # again at every step with the same leaves (a pure function of its key, so the
            # answer is the same as discretising again).
            sizes = self._leaf_points
            if any(sizes.get(cell) is None for cell in ((key, step, tail) for key in order)):
                if len(sizes) > 4 * _LEAF_BUDGET:
                    sizes.clear()
                missing = [key for key in order if (key, step, tail) not in sizes]
                made = _discretize(missing, step, tail, True)
                for key, pld in zip(missing, made):
                    sizes[(key, step, tail)] = pld.mass.size
                # Kept for :meth:`_composed` (the same discretisation when the step stays):
                # only the latest, taken over by the composition's cache when used.
                self._short_plds = {(key, step, tail): pld for key, pld in zip(missing, made)}
            linear = sum(leaves[key] * (sizes[(key, step, tail)] - 1) for key in order)
            support = max(support, 1 + -(-linear * span // steps))
            if 2 * support > budget:
                return step
        if 2 * support > budget:
            return step
        finest = max(step * support / budget, step / 2.0**_SHORT_LEVELS)
        return min(_family_at_least(finest), step)

    def _composed(
        self,
        direction: str,
        pessimistic: bool,
        grid_step: float,
        tail: float,
        *,
        coarse: bool = False,
        refine: bool = True,
        block: int = 1,
        stage: bool = True,
    ) -> ComposedPLD:
        """The composition of one direction at one grid step and truncation budget (with
        ``block`` > 1: of every count rounded up to a multiple of ``block``, a composition that
        only adds steps, for the checks of :meth:`_worst_direction`; with ``stage`` False in
        one stage even where :func:`staging_pays`, see :meth:`_fine_value`). With more
        than ``_LEAF_BUDGET`` distinct events, noise multipliers are rounded onto a grid of
        ratio ``1 + quantum / 2`` in the root of their loss variance (see :func:`_quantized`;
        rates are kept), with the finest
        quantum that brings the count within the budget (:meth:`_rounding_quantum`), or for the
        ``coarse`` pass of :meth:`_worst_direction` at least ``_COARSE_QUANTUM``. ``refine``
        False keeps the transforms' own round-off bound (see ``_pld_numerics.compose``)."""
        # Every discretisation parameter is a deterministic function of the composed multiset
        # (grid step, tail budget and the bucket of the step count, :func:`_step_bucket`), so
        # answers do not depend on the order of compose() calls and queries, nor on a
        # checkpoint restore: the caches below are keyed by those parameters and only save work.
        steps = self._steps()
        self._check_floor_up_front(2.0, 1.0)  # before anything is allocated
        bucket = _step_bucket(steps, self._smooth_leaves())
        per_step_tail = tail / bucket
        quantum = self._rounding_quantum(direction, pessimistic)
        if coarse and quantum:
            quantum = max(quantum, _COARSE_QUANTUM)
        cache_key = (direction, grid_step, tail, bucket, quantum, refine)
        cache = self._caches.get(cache_key)
        if cache is None:
            # Keep the caches of the last few grids only (each holds spectra of every leaf).
            while len(self._caches) >= 8:
                self._caches.pop(next(iter(self._caches)))
            cache = self._caches[cache_key] = _DirectionCache()
        keys = self._exact_keys(direction)
        if quantum:
            # The rounded keys, in the same order, kept per rounding like the exact ones.
            rounded = self._leaf_keys.setdefault((direction, quantum, pessimistic), [])
            if len(rounded) < len(keys):
                start = len(rounded)
                rounded.extend(_quantized(keys[start:], quantum, pessimistic,
                                          self._leaf_columns(direction).rows_from(start)))
            keys = rounded
        leaves: dict[_Key, int] = {}
        for key, count in zip(keys, self._counts.values()):
            leaves[key] = leaves.get(key, 0) + count
        # A canonical order, so that floating-point sums do not depend on insertion order.
        order = _distinct_leaves(leaves)
        counts = tuple(-(-leaves[key] // block) * block for key in order)
        result_key = (pessimistic, tuple(order), counts, stage)
        hit = cache.results.get(result_key)
        if hit is not None:
            return hit
        missing = [key for key in order if (key, pessimistic) not in cache.plds]
        if pessimistic and missing and self._short_plds:
            # Discretised by _short_step with the same arguments: the same PLDs.
            for key in missing:
                made = self._short_plds.pop((key, grid_step, per_step_tail), None)
                if made is not None:
                    cache.plds[(key, True)] = made
            missing = [key for key in missing if (key, True) not in cache.plds]
        for key, pld in zip(missing, _discretize(missing, grid_step, per_step_tail, pessimistic)):
            cache.plds[(key, pessimistic)] = pld
        plds = [cache.plds[(key, pessimistic)] for key in order]
        few_leaves = len(order) <= _CACHE_SPECTRA_UP_TO
        plan = _staging(steps) if few_leaves and stage else None
        if plan is not None and not staging_pays(
            plds, counts, blocks=plan[0], factor=plan[1], log_tail=math.log(tail)
        ):
            plan = None
        if plan is not None:
            blocks, factor = plan
            result = compose_staged(
                plds,
                list(counts),
                blocks=blocks,
                factor=factor,
                log_tail=math.log(tail),
                pessimistic=pessimistic,
            )
        else:
            # Spectra are cached for incremental use only when there are few distinct leaves
            # (otherwise their memory, leaves x FFT size, would dominate).
            # On a short composition's refined grid (_short_step) the circle is sized for the
            # bucket of step counts (every count scaled by bucket / steps), so that every count
            # of the bucket composes on one circle and reuses its leaf spectra: a longer
            # circle only folds less (its window's Chernoff tails are its own).
            span = None
            if self._short_span and grid_step >= self._base_step():
                span = [-(-count * bucket // steps) for count in counts]
            result = compose(
                plds,
                list(counts),
                log_tail=math.log(tail),
                pessimistic=pessimistic,
                spectra=cache.spectra[pessimistic] if few_leaves else None,
                keys=list(order),
                refine=refine,
                window_counts=span,
            )
        if pessimistic:
            monotone = plan is None and few_leaves and all(pld.non_negative for pld in plds)
            result = _Composition.of(result, plds, counts, monotone=monotone)
        else:  # (its top atom: lower bounds below the round-off floor)
            result = _Composition.of(result, plds, counts)
        # The latest multiset's results only (both routes of it: see _fine_value).
        cache.results = {key: value for key, value in cache.results.items()
                         if key[:3] == result_key[:3]}
        cache.results[result_key] = result
        return result

    def _exact_keys(self, direction: str) -> list[_Key]:
        """The discretisation key of each composed leaf event, in the (insertion) order of
        self._counts, which only grows: a pure function of (event, direction), kept across
        queries so that a long heterogeneous schedule is mapped once, without hashing the events
        again."""
        keys = self._exact_leaf_keys.setdefault(direction, [])
        if len(keys) < len(self._counts):
            keys.extend(self._leaves(leaf, direction) for leaf in islice(self._counts, len(keys), None))
        return keys

    def _leaf_columns(self, direction: str) -> _LeafColumns:
        """:meth:`_exact_keys` of ``direction`` as arrays (:class:`_LeafColumns`), kept and
        extended by the rows of the events composed since (a long schedule's keys are converted
        once, not at every query)."""
        keys = self._exact_keys(direction)
        held = self._columns.get(direction)
        if held is None or held.size < len(keys):
            more = _LeafColumns.of(keys[held.size if held is not None else 0 :])
            held = more if held is None else held.extended(more)
            self._columns[direction] = held
        return held

    def _rounding_quantum(self, direction: str, pessimistic: bool) -> float:
        """The quantum of the noise-multiplier rounding (0.0: none). Rounding costs tightness (the
        pessimistic side raises the root of a noise multiplier's loss variance by up to a
        factor 1 + quantum / 2, see :class:`_RoundingGrid`) and saves a
        discretisation per merged event, so it is used only when there are more than
        ``_LEAF_BUDGET`` distinct events, and then with the finest quantum in
        precision * (1/16, 1/8, 1/4, 1/2) that brings them within the budget; if none does,
        with the coarsest quantum whose rounding is predicted to widen the bracket by at most
        ``_ROUNDING_GAP`` times the precision (:func:`_gap_quantum`; a schedule whose epsilon
        moves little with its noise multipliers is rounded more coarsely). A function of the set
        of composed events only. A direction whose leaves round like the first direction's
        (:meth:`_LeafColumns.rounds_like`: the add direction of Poisson-sampled Gaussians) takes
        the first direction's quantum, the number the same search gives it."""
        memo_key = (direction, pessimistic, len(self._counts))
        memo = self._quantum_memo
        if memo_key in memo:
            return memo[memo_key]
        first = self._directions()[0]
        if direction != first and self._leaf_columns(first).rounds_like(
            self._leaf_columns(direction)
        ):
            quantum = self._rounding_quantum(first, pessimistic)
            memo[memo_key] = quantum
            return quantum
        keys = self._exact_keys(direction)
        distinct = len(set(keys))
        quantum = 0.0
        if distinct > _LEAF_BUDGET:
            quantum = math.nan
            candidates = [self._precision * fraction for fraction in (1 / 16, 1 / 8, 1 / 4, 1 / 2)]
            columns = self._leaf_columns(direction)
            for candidate, count in zip(candidates,
                                        _rounded_counts(columns, candidates, pessimistic)):
                if count <= _LEAF_BUDGET:
                    quantum = candidate
                    break
            if math.isnan(quantum):
                # The same for both sides (a function of both roundings), computed once.
                other = memo.get((direction, not pessimistic, len(self._counts)))
                quantum = other if other else _gap_quantum(
                    columns, list(self._counts.values()), self._precision
                )
        if any(key[2] != len(self._counts) for key in memo):
            memo.clear()  # only the latest set of events is asked about again
        memo[memo_key] = quantum
        return quantum

    def _smooth_leaves(self) -> bool:
        """Whether every composed event is a (sampled) Gaussian mechanism in every direction, whose
        privacy loss has no atom (see ``_FIRST_BUCKET``); kept per number of distinct events
        (the set of events only grows between resets)."""
        memo = self._smooth_memo
        if not memo or memo[0] != len(self._counts):
            smooth = all(
                key[0] in _SMOOTH_MECHANISMS
                for direction in self._directions()
                for key in self._exact_keys(direction)
            )
            self._smooth_memo = memo = [len(self._counts), smooth]
        return bool(memo[1])

    def _hint(self, result: ComposedPLD, delta: float) -> CrossingHint:
        """Where the last epsilon query at ``delta`` on this grid crossed (for the next one of an
        incremental run, which crosses a few grid points away; only a starting point, the
        answer does not depend on it, see :meth:`ComposedPLD.epsilon`)."""
        key = (result.grid_step, delta)
        hint = self._crossing_hints.get(key)
        if hint is None:
            if len(self._crossing_hints) >= 16:
                self._crossing_hints.clear()
            hint = self._crossing_hints[key] = CrossingHint()
        return hint

    def _reset_caches(self) -> None:
        self._caches = {}
        self._crossing_hints: dict[tuple[float, float], CrossingHint] = {}
        self._smooth_memo: list[Any] = []  # [events, _smooth_leaves' value]
        self._exact_leaf_keys: dict[str, list[_Key]] = {}
        self._leaf_keys: dict[tuple[str, float, bool], list[_Key]] = {}
        self._columns: dict[str, _LeafColumns] = {}  # _leaf_columns, per direction
        self._quantum_memo: dict[tuple[str, bool, int], float] = {}
        self._leaf_variances: list[float] = []
        self._base_steps: dict[tuple[int, int], float] = {}
        self._laplace_seen: list[Any] = [0, set()]  # (leaves looked at, their Laplace losses)
        # direction -> (multiset key, _largest_loss of it)
        self._largest_loss_memo: dict[str, tuple[tuple[int, int], float]] = {}
        self._gaussian_memo: list[Any] = []  # [(events, steps), _exact_gaussian's value]
        self._lattice_memo: list[Any] = []  # [(events, steps), _exact_lattice's value]
        self._directions_memo: list[Any] = []  # [events, _directions' value]
        self._support_memo: list[Any] = []  # [events, smallest Gaussian-family noise multiplier]
        self._leaf_points: dict[tuple[_Leaf, float, float], int] = {}  # for _short_step
        self._short_plds: dict[tuple[_Leaf, float, float], DiscretePLD] = {}  # (its latest)
        self._short_span = False  # the grid is a short composition's refined one (_base_step)

    # ------------------------------------------------------------------ queries
    def _bounds_at(
        self, refinement: int, tail: float, pessimistic: bool
    ) -> list[ComposedPLD]:
        step = self._grid_step(refinement)
        return [self._composed(d, pessimistic, step, tail) for d in self._directions()]

    def _epsilon(self, delta: float) -> float:
        return self._epsilon_side(delta, pessimistic=True, refinement=0)

    def _epsilon_side(self, delta: float, *, pessimistic: bool, refinement: int) -> float:
        gaussian = self._exact_gaussian()
        if gaussian is not None:  # exact: no grid, no FFT (_pld_gaussian)
            lower, upper = _pld_gaussian.epsilon_bounds(delta, *gaussian)
            return upper if pessimistic else lower
        lattice = self._exact_lattice()
        if lattice is not None:  # exact: no grid, no FFT (_pld_lattice); the worse direction
            return max(part.epsilon(delta, upper=pessimistic) for part in lattice)
        if not self._bounded_loss_only():
            self._check_floor_up_front(2.0, delta)
        tail = _tail_for(delta, self._precision)
        if pessimistic:

            def certified_epsilon(result: ComposedPLD) -> float:
                try:
                    self._check_floor([result], delta)
                except ValueError:
                    # Below the FFT's floor the support bound still holds (no FFT enters it).
                    exact = (
                        result.support_epsilon(delta)
                        if isinstance(result, _Composition) else None
                    )
                    if exact is None:
                        raise
                    return exact
                return result.epsilon(delta, pessimistic=True, hint=self._hint(result, delta))

            return self._worst_direction(certified_epsilon, refinement, tail,
                                         delta_of=lambda value: delta,
                                         limit=lambda value, bound: min(value, max(bound, 0.0)))
        # The lower bound is the largest direction's. A direction whose certified upper bound
        # (the coarse pessimistic pass of _worst_direction, usually kept from the upper bound's
        # query) is at most the running lower bound cannot raise it: its optimistic composition
        # is skipped (under Poisson sampling the add direction, half of the work).
        directions = self._directions()
        step = self._grid_step(refinement)

        def certified_lower(result: ComposedPLD) -> float:
            top = (result.top_epsilon_lower(delta) if isinstance(result, _Composition)
                   else None)
            try:
                self._check_floor([result], delta)
            except ValueError:
                if top is None:  # below the round-off floor, and no top atom to read
                    raise
                return top
            value = result.epsilon(delta, pessimistic=False)
            return value if top is None else max(value, top)

        best = certified_lower(self._composed(directions[0], False, step, tail))
        for direction in directions[1:]:
            try:
                coarse = self._composed(direction, True, 4.0 * step, tail, coarse=True)
                self._check_floor([coarse], delta)
                if coarse.epsilon(delta, pessimistic=True) <= best:
                    continue
            except ValueError:  # below the coarse round-off floor: no shortcut for it
                pass
            best = max(best, certified_lower(self._composed(direction, False, step, tail)))
        return best

    def _worst_direction(
        self,
        upper_value: Callable[[ComposedPLD], float],
        refinement: int,
        tail: float,
        *,
        delta_of: Callable[[float], float] | None = None,
        limit: Callable[[float, float], float] | None = None,
    ) -> float:
        """max over the directions of ``upper_value`` (an epsilon or a delta, non-decreasing
        under mean-preserving spreads) of the pessimistic composition at ``refinement``
        (each fine composition's value by :meth:`_fine_value`; ``delta_of`` maps a value to
        the delta it stands for: the query's delta for an epsilon, the value for a delta;
        None for a value that does not depend on the route, e.g. the support's largest loss).
        ``limit(value, bound)`` lowers each direction's value by what the bound
        :meth:`_largest_loss` on its privacy loss implies (every route's value, the coarse
        checks' too: the bound holds for the mechanism, whatever the grid).

        The first direction (remove) is composed on the fine grid; any other is skipped when a
        certified upper bound of its value is already at most the running maximum. Three
        bounds are tried, cheapest first:

        * the composition with every count rounded up to a multiple of the block of
          :func:`_check_block` (at most 1/32 more steps), on the grid 16 times coarser: the
          hockey-stick divergence of a composition can only grow with more composed mechanisms
          (the shorter composition is a post-processing of the longer one: drop the extra
          outputs), so this bounds the direction at every count of the block. Every count of
          the block asks for the same composition, so a query after every step composes the
          other direction once per block instead of once per step;
        * the composition itself on the grid 16 times coarser, then 4 times coarser
          (``_COARSE_FACTORS``).

        Each coarse pessimistic PLD is itself a certified upper bound (a mean-preserving spread
        of the fine one onto a subset of its grid points), so the skipped direction is certified
        below the maximum returned, which therefore still bounds every direction. On the
        Poisson-subsampled Gaussians measured (q 0.001 to 0.5, sigma 0.5 to 2, 10 to 3,000
        steps) the add direction stays 10% to 90% below the remove direction and the first
        check decides. With many distinct
        events the coarse pass also rounds the noise multipliers on a coarser grid
        (``_COARSE_QUANTUM``; still pessimistic), except its last, finest check, on twice the
        schedule's grid with its own rounding (each still a certified upper bound). Under
        Poisson sampling the remove direction usually dominates, and this saves most of the add
        direction's FFTs; the answer is still a function of the multiset only."""
        directions = self._directions()
        step = self._grid_step(refinement)

        def bounded(direction: str) -> Callable[[ComposedPLD], float]:
            bound = self._largest_loss(direction) if limit is not None else math.inf
            if limit is None or math.isinf(bound):
                return upper_value
            return lambda result: limit(upper_value(result), bound)

        best = self._fine_value(bounded(directions[0]), directions[0], step, tail, delta_of)
        steps = self._steps()
        block = _check_block(steps)
        # Rounding every count up to a multiple of the block adds at most (block - 1) steps per
        # distinct event: with many distinct events (a per-step schedule, about 10 steps per
        # rounded noise multiplier) that is many times the run, whose bound cannot pass; the
        # check is then skipped (which checks run changes nothing certified: a function of the
        # composed multiset, like every other choice here).
        if len(self._counts) * (block - 1) > steps // 8:
            block = 1
        # The coarse grids are multiples of the formula's step: a rounded schedule's grid is
        # already coarsened (_schedule_coarsening), so its factors are divided by that; its
        # last check keeps the schedule's own rounding (the coarse rounding alone moves a long
        # schedule's bound by about 0.4%, more than the gap between its directions, e.g. ADP
        # over 10^5 steps, where the check then saves the finest composition of a direction).
        coarsening = self._schedule_coarsening()
        factors = tuple(max(factor / coarsening, 1.0) for factor in _COARSE_FACTORS)
        rounded_last = coarsening > 1.0
        for direction in directions[1:]:
            value_of = bounded(direction)
            coarse = math.inf
            if block > 1:  # the end of the block of steps: one composition for its steps
                try:
                    coarse = value_of(self._composed(
                        direction, True, _COARSE_FACTORS[0] * step, tail, coarse=True, block=block
                    ))
                except ValueError:  # below the coarse round-off floor: no shortcut there
                    coarse = math.inf
                if coarse <= best:
                    continue
            for index, factor in enumerate(factors):  # the coarsest grid first: the cheapest
                own = rounded_last and index == len(factors) - 1 and factor > 1.0
                try:
                    coarse = value_of(
                        self._composed(direction, True, factor * step, tail, coarse=not own)
                    )
                except ValueError:  # below the coarse round-off floor: no shortcut there
                    coarse = math.inf
                if coarse <= best:
                    break
            if coarse > best:
                best = max(best, self._fine_value(value_of, direction, step, tail, delta_of))
        return best

    def _fine_value(
        self,
        upper_value: Callable[[ComposedPLD], float],
        direction: str,
        step: float,
        tail: float,
        delta_of: Callable[[float], float] | None,
    ) -> float:
        """``upper_value`` of the pessimistic composition of ``direction`` on the grid ``step``;
        where that composition was staged (:func:`compose_staged`) and the mass its blocks moved
        to their top points for their round-off (``staged_roundoff``) exceeds
        ``_STAGED_ROUNDOFF_SHARE`` of the delta in question (``delta_of(value)``), the smaller of
        that and the one-stage composition's value, both certified upper bounds. Each block's
        proven round-off (about 6e-10 at q = 5e-4, sigma = 0.6, T = 2e5, times 32 blocks) sits
        at the top of the block's losses, so at a delta near it the staged epsilon is far from
        tight: 8.15 at delta = 1e-8 there, where one stage gives 6.09. Above the share the
        staging costs at most about 0.1% of epsilon (0.097% at delta = 1e-6, 0.034% at 3e-6 in
        that example) and keeps its speed. A function of the composed multiset and the query
        only (the one-stage composition is cached beside the staged one); epsilon can step
        down by that much as delta falls past the share, as it can where the truncation
        budget (:func:`_tail_for`) changes."""
        result = self._composed(direction, True, step, tail)
        value = upper_value(result)
        if (delta_of is not None and value > 0.0
                and result.staged_roundoff > _STAGED_ROUNDOFF_SHARE * delta_of(value)):
            try:
                one_stage = self._composed(direction, True, step, tail, stage=False)
                value = min(value, upper_value(one_stage))
            except ValueError:  # below the one stage's own round-off floor: the staged value
                pass
        return value

    def _exact_gaussian(self) -> tuple[float, float] | None:
        """(low, high) bounds on mu^2 = sum_i c_i / sigma_i^2 when every composed event is, in
        every direction, a plain Gaussian mechanism (the pair N(1/sigma, 1), N(0, 1): Gaussian,
        Poisson sampling with q = 1, a full sample without replacement); the composition is
        then exactly mu-GDP (Dong, Roth, Su 2019, Cor. 3.3) and answered by the closed form of
        :mod:`._pld_gaussian` instead of a grid and FFTs. None otherwise. A function of the
        composed multiset only (memoised on its size)."""
        key = (len(self._counts), self._steps())
        memo = self._gaussian_memo
        if memo and (memo[0] == key or (memo[1] is None and memo[0][0] == key[0])):
            return memo[1]  # (not all Gaussian: a property of the set of events, not the counts)
        terms: dict[float, int] = {}
        for direction in self._directions():
            for leaf, count in zip(self._exact_keys(direction), self._counts.values()):
                mechanism, parameter, rate = leaf
                if mechanism != _GAUSSIAN or rate != 1.0:
                    self._gaussian_memo = [key, None]
                    return None
                if direction == "remove":
                    terms[parameter] = terms.get(parameter, 0) + count
        value = _pld_gaussian.mu_squared_bounds(terms.items())
        self._gaussian_memo = [key, value]
        return value

    def _exact_lattice(self) -> list[_pld_lattice.LatticeComposition] | None:
        """The exact composition of each direction (:mod:`._pld_lattice`) when every composed
        event is a randomized response or discrete Laplace mechanism (finitely many losses) and
        each direction has at most ``_pld_lattice.MAX_OUTCOMES`` composed outcomes; None
        otherwise. Its distinct leaves are taken in sorted order, so the sums do not depend on
        the order of composition. A function of the composed multiset only (memoised on its
        size, like :meth:`_exact_gaussian`)."""
        key = (len(self._counts), self._steps())
        memo = self._lattice_memo
        if memo and memo[0] == key:
            return memo[1]  # type: ignore[no-any-return]
        value: list[_pld_lattice.LatticeComposition] | None = None
        per_direction = []
        for direction in self._directions():
            leaves: dict[_Key, int] = {}
            for leaf, count in zip(self._exact_keys(direction), self._counts.values()):
                if leaf[0] not in _atoms.ATOM_MECHANISMS:
                    break
                leaves[leaf] = leaves.get(leaf, 0) + count
            else:
                order = sorted(leaves)
                masses = [_atoms.atoms(*leaf)[1] for leaf in order]
                sizes = [(mass, mass, mass, leaves[leaf]) for leaf, mass in zip(order, masses)]
                if _pld_lattice.outcomes(sizes) <= _pld_lattice.MAX_OUTCOMES:
                    # (each atom's loss bracketed by doubles: its closed form at 40 digits)
                    per_direction.append([
                        (*_atoms.atom_loss_brackets(*leaf), mass, leaves[leaf])
                        for leaf, mass in zip(order, masses)
                    ])
                    continue
            break
        else:
            value = [_pld_lattice.LatticeComposition(leaves) for leaves in per_direction]
        self._lattice_memo = [key, value]
        return value

    def _largest_loss(self, direction: str) -> float:
        """An upper bound on the composition's privacy loss in ``direction`` (+inf where a
        composed event's loss is unbounded there): the smallest double at or above M = sum_i c_i
        M_i, the sum taken exactly in rationals, with M_i the largest loss of event i
        (:func:`_leaf_largest_loss`: 1/b of a Laplace release, -log(1 - q) of a Poisson-sampled
        Gaussian in the add direction, each rounded up).

        delta(epsilon) = 0 for epsilon >= M and epsilon(delta) <= M at every delta in that
        direction: a statement about the mechanism, not the grid, applied to every route
        (:meth:`_worst_direction`). The grid's own support rounds each event's largest loss up
        to its next grid point, up to a step per release above M: for 1/b = 1/3, or the double
        4/3 (whose reciprocal lies just above 0.75), or -log(1 - q) far below the step (q = 1e-8
        on the finest step 2^-20, where 10^8 releases put the grid's support at 95 against M =
        1.0, and that support was the answer wherever the FFT's round-off made the composition
        itself void)."""
        key = (len(self._counts), self._steps())
        held = self._largest_loss_memo.get(direction)
        if held is not None and held[0] == key:
            return held[1]
        per_loss: dict[float, int] = {}
        for leaf_key, count in zip(self._exact_keys(direction), self._counts.values()):
            top = _leaf_largest_loss(leaf_key)
            if math.isinf(top):
                per_loss = {}
                break
            per_loss[top] = per_loss.get(top, 0) + count
        bound = math.inf
        if per_loss:
            bound = fraction_rounded_up(
                sum((count * Fraction(top) for top, count in per_loss.items()), Fraction(0)))
        self._largest_loss_memo[direction] = (key, bound)
        return bound

    def _bounded_loss_only(self) -> bool:
        """Whether every composed event is a Laplace, discrete Laplace or randomized response
        mechanism (bounded loss: the support bound and the top atom answer without the FFT,
        see :class:`_Composition`)."""
        return all(
            isinstance(leaf.event if isinstance(leaf, Shuffled) else leaf,
                       (Laplace, DiscreteLaplace, RandomizedResponse))
            for leaf in self._counts
        )

    def _check_floor_up_front(self, factor: float, delta: float) -> None:
        """Refuse, before anything is composed, a query whose answer the proven round-off bound
        alone makes void: ``factor`` times its lower part for this many steps
        (:func:`~dpsharp.accountants._pld_numerics.roundoff_floor`, microseconds) at least
        ``delta`` (an epsilon query needs delta above twice the bound; any query needs the bound
        below 1/2)."""
        steps = self._steps()
        floor = roundoff_floor(steps)
        if factor * floor < delta:
            return
        product = math.sqrt(2.0) * 2.0 * 2.0**-53 / (1.0 - 2.0 * 2.0**-53)
        limit = 2.0 * min(delta / factor, 0.25) / product
        smallest = (
            f"ask for delta >= {factor * floor:.1e}" if factor * floor < 1.0
            else "no delta below 1 can be certified"
        )
        raise ValueError(
            f"{steps} composed steps are beyond what double-precision FFT composition can "
            f"certify at delta={delta!r}: the proven round-off bound of the composition is at "
            f"least {floor:.1e} (the rounding of {steps - 1} complex products, (1 + sqrt(2) "
            f"gamma_2)^(T - 1) - 1 over 2); {smallest}, or account at most about {limit:.1e} "
            f"steps per query"
        )

    def _check_floor(self, results: list[ComposedPLD], delta: float) -> None:
        """Refuse a delta at the round-off level: below 10 times the round-off estimate (the
        negative mass of a dense composition, the evaluation bound of one held as a band), below
        1e-15, or below twice the proven round-off bound of the composition (there every epsilon
        would be infinite or bounded only loosely)."""
        noise = max(r.roundoff for r in results) + 1e-16 * max(math.sqrt(r.size) for r in results)
        allowance = max(
            r.noise + (r.spectral.error if r.spectral is not None else r.mass_noise)
            for r in results
        )
        floor = max(10.0 * noise, 1e-15, 2.0 * allowance)
        if delta < floor:
            raise ValueError(
                f"delta={delta!r} is below what double-precision FFT composition can certify for "
                f"this composition (round-off level ~{noise:.1e}, proven round-off bound for "
                f"{self._steps()} composed steps {allowance:.1e}); ask for delta >= {floor:.1e}"
            )

    def _delta(self, epsilon: float) -> float:
        return self._delta_upper(epsilon)[0]

    def _delta_upper(self, epsilon: float) -> tuple[float, float]:
        """(certified upper delta(epsilon), the truncation budget it was computed with).

        The budget starts at ``_TAIL_BUDGET`` and is refined once to suit the delta found; both
        answers are certified, so the smaller is returned. (Keeping the first one when it is
        smaller keeps delta(epsilon(delta)) <= delta up to a few units of rounding, the two
        being summed differently: epsilon(delta) was computed with the budget of delta, which
        the first pass uses whenever delta >= 1e-7, while an upper delta just below a power of
        ten would otherwise move the second pass to a ten times smaller budget and another
        composition.)"""
        tail = _TAIL_BUDGET
        gaussian = self._exact_gaussian()
        if gaussian is not None:  # exact: no grid, no FFT (_pld_gaussian)
            return _pld_gaussian.delta_bounds(epsilon, *gaussian)[1], tail
        lattice = self._exact_lattice()
        if lattice is not None:  # exact: no grid, no FFT (_pld_lattice)
            return max(part.delta(epsilon, upper=True) for part in lattice), tail
        best, best_tail = math.inf, tail
        for _ in range(2):
            upper = self._worst_direction(
                lambda result: result.delta(epsilon, pessimistic=True), 0, tail,
                limit=lambda value, bound: 0.0 if epsilon >= bound else value,
                # Half the delta found: at an epsilon that an epsilon query at d answered on
                # one stage (staged_roundoff > 1% of d), the staged delta is up to d +
                # staged_roundoff, so it is answered on one stage too and delta(epsilon(d))
                # stays <= d.
                delta_of=lambda value: value / 2.0,
            )
            if upper < best:
                best, best_tail = upper, tail
            refined = _tail_for(max(upper, 1e-300), self._precision)
            if refined >= tail:
                break
            tail = refined
        return best, best_tail

    def epsilon_bounds(self, delta: float) -> tuple[float, float]:
        """(lower, upper): certified bounds on the optimal epsilon of the composition at
        ``delta``. ``upper`` is exactly :meth:`epsilon` (``delta``): one composition, one
        certified number, whichever entry point asks. The lower bound's grid is refined
        (halving h) until (upper - lower) <= precision * upper or the FFT circle would exceed
        2^24 points (at most 4 halvings, none with more than 64 distinct events), or a halving
        closes less than a quarter of the bracket (its width is then held by the lower bound's
        round-off allowance, not the grid); then the wider, still honest, bracket is returned.
        Below the FFT's round-off floor a composition of bounded losses (Laplace, discrete
        Laplace, randomized response) is bracketed by its support and its top atom alone
        (:class:`_Composition`); any other has a lower bound of 0.0 there."""
        delta = require_delta(delta)
        if self.is_empty:
            return 0.0, 0.0
        upper = self._epsilon_side(delta, pessimistic=True, refinement=0)
        lower = 0.0
        # A rounded schedule's grid is coarsened (:meth:`_schedule_coarsening`): its lower
        # bound is taken on the formula's grid at once, and not refined further.
        coarsened = self._schedule_coarsening() > 1.0
        refinement = 1 if coarsened else 0
        gap = math.inf
        while True:
            if not math.isfinite(upper):
                return lower, upper
            try:
                # Every grid's lower bound is certified, so the largest so far is kept.
                lower = max(lower, self._epsilon_side(delta, pessimistic=False, refinement=refinement))
            except ValueError:
                return lower, upper  # below the optimistic side's round-off floor
            lower = min(lower, upper)
            if upper - lower <= self._precision * upper:
                return lower, upper
            many_leaves = len(self._counts) > _REFINE_UP_TO
            # A halving that closed less than a quarter of the gap found it held by what no
            # finer grid removes (the round-off allowance of the optimistic cells' masses, 2e-9
            # of loss per release: 76% of epsilon at q = 1e-6, sigma = 1, T = 1e6), while each
            # further halving doubles the cost (there 2, 5, 21 and 35 s for no digit).
            stalled = upper - lower > _STALLED_SHARE * gap
            gap = upper - lower
            if refinement >= 4 or many_leaves or coarsened or stalled:
                return lower, upper
            sizes = [r.size for r in self._bounds_at(refinement, _tail_for(delta, self._precision), False)]
            if max(sizes) * 2 > _MAX_SIZE:
                return lower, upper
            refinement += 1

    def delta_bounds(self, epsilon: float) -> tuple[float, float]:
        """(lower, upper): certified bounds on the optimal delta(epsilon) of the composition."""
        epsilon = require_epsilon(epsilon)
        if self.is_empty:
            return 0.0, 0.0
        gaussian = self._exact_gaussian()
        if gaussian is not None:  # exact: no grid, no FFT (_pld_gaussian)
            return _pld_gaussian.delta_bounds(epsilon, *gaussian)
        lattice = self._exact_lattice()
        if lattice is not None:  # exact: no grid, no FFT (_pld_lattice)
            return (max(part.delta(epsilon, upper=False) for part in lattice),
                    max(part.delta(epsilon, upper=True) for part in lattice))
        upper, tail = self._delta_upper(epsilon)
        # (a rounded schedule's lower bound on the formula's grid, see _schedule_coarsening)
        lowers = self._bounds_at(1 if self._schedule_coarsening() > 1.0 else 0, tail, False)
        lower = max(
            max(r.delta(epsilon, pessimistic=False),
                r.top_delta_lower(epsilon) if isinstance(r, _Composition) else 0.0)
            for r in lowers
        )
        return min(lower, upper), upper

    def guarantee(self, delta: float) -> PrivacyGuarantee:
        """The certified epsilon at ``delta`` with its certified lower bound."""
        delta = require_delta(delta)
        lower, upper = self.epsilon_bounds(delta)
        return PrivacyGuarantee(
            epsilon=upper,
            delta=delta,
            certified=True,
            accountant=self.name,
            neighbouring=self._neighbouring,
            epsilon_lower=lower,
            details={"precision": self._precision, "directions": self._directions()},
        )

    # ------------------------------------------------------------------ f-DP
    def tradeoff(self, alphas: Sequence[float] | np.ndarray, *,
                 symmetrised: bool = True) -> np.ndarray:
        """Certified lower bound on the trade-off curve f(alpha) of the composition: the
        composition is f-DP with this f.

        f(alpha) = sup_eps [1 - delta(eps) - e^eps alpha] (the envelope duality of Dong, Roth, Su
        2019, Prop. 2.12); using the certified upper delta at the grid points (a subset of all
        eps) gives a curve below the true one. f-DP holds for both orders of a neighbouring
        pair, so where the composition is asymmetric (Poisson sampling under add/remove) the
        curve is min{f, f^-1}** over the two directions (Bu et al. 2020, Section 2.2; Dong,
        Roth, Su 2019, the symmetrised C_p(f) of their subsampling theorem), whose delta curve
        is the pointwise maximum of both directions' curves. ``symmetrised=False`` gives the
        first direction's curve alone (the remove pair P = mixture, Q = N(0, 1)): a bound on
        T(P, Q) of that pair, not an f-DP guarantee of an asymmetric composition by itself.
        """
        alphas = require_real_array("alphas", alphas)
        if alphas.ndim != 1:
            shown = float(alphas) if alphas.ndim == 0 else f"an array of shape {alphas.shape}"
            raise TypeError(
                f"alphas must be a 1-d sequence of type-I errors in [0, 1] (e.g. [0.5]), got "
                f"{shown}"
            )
        outside = (alphas < 0.0) | (alphas > 1.0)
        if np.any(outside):
            raise ValueError(f"alphas must lie in [0, 1], got {float(alphas[outside][0])!r}")
        if self.is_empty:
            return 1.0 - alphas
        results = self._bounds_at(0, _TAIL_BUDGET, True)
        if not symmetrised:
            results = results[:1]
        return _tradeoff_from_curves([r.delta_curve(pessimistic=True) for r in results], alphas)

    def gdp_mu(self) -> float:
        """The smallest mu (to 1e-4 relative, rounded up) such that the composition is certifiably
        mu-GDP: delta(eps) <= delta_mu(eps) for every eps, with delta the certified upper curve
        (checked on the grid with one step of slack: delta_up(l_k) <= delta_mu(l_{k+1})), combined
        with the exact bound sqrt(sum_i k_i / sigma_i^2) of the unsubsampled Gaussians, which
        dominates every subsampled Gaussian (and beyond the grid the +inf mass makes the PLD alone
        unable to certify any finite mu). inf if the composition holds a Laplace mechanism and
        its curve cannot be certified.

        For Poisson-subsampled Gaussians the answer is that exact bound, and no smaller mu is
        true: under remove, P = prod_i ((1-q_i) N(0,1) + q_i N(mu_i,1)) >= (prod_i q_i)
        N(mu_vec, I) as measures, so delta(eps) >= Q delta_{mu_0}(eps + log(1/Q)) with
        Q = prod_i q_i and mu_0 = sqrt(sum_i mu_i^2) (take the Gaussian pair's optimal test at
        eps + log(1/Q)). That decays like exp(-eps^2 / (2 mu_0^2)), slower than delta_mu(eps) for
        any mu < mu_0, so it exceeds delta_mu at some (large) eps: a finite-T subsampled composition
        is mu-GDP only for mu >= mu_0. The CLT's much smaller mu (:class:`GDPAccountant`) is an
        approximation, not a guarantee; for a certified statement at a given delta use
        :meth:`epsilon` or :meth:`tradeoff`."""
        if self.is_empty:
            return 0.0
        gaussian_mu = self._gaussian_mu()
        if gaussian_mu == 0.0 or self._exact_gaussian() is not None:
            # exactly gaussian_mu-GDP (_pld_gaussian); 0: every noise multiplier so large that
            # 1 / sigma^2 underflows, and the answer is at most gaussian_mu
            return gaussian_mu
        results = self._bounds_at(0, _TAIL_BUDGET, True)
        curves = [r.delta_curve(pessimistic=True) for r in results]
        if any(r.infinity_mass + r.above > 0 for r in results):
            return gaussian_mu

        def certified(mu: float) -> bool:
            for eps, curve in curves:
                nxt = np.append(eps[1:], np.inf)
                if np.any(curve > _gaussian_delta(nxt, mu) + 1e-15):
                    return False
            return True

        high = gaussian_mu if math.isfinite(gaussian_mu) else 1.0
        while not certified(high):
            if math.isfinite(gaussian_mu):
                # the PLD's curve certifies nothing below the exact bound (any mu it certifies
                # is above it): the exact bound is the answer, never a larger mu or inf
                return gaussian_mu
            high *= 2.0
            if high > 1e6:
                return math.inf
        low = 0.0
        while high - low > 1e-4 * high:
            mid = 0.5 * (low + high)
            (high, low) = (mid, low) if certified(mid) else (high, mid)
        return min(high, gaussian_mu)

    def _gaussian_mu(self) -> float:
        total = 0.0
        for leaf, count in self._counts.items():
            inner = leaf.event if isinstance(leaf, Shuffled) else leaf
            if isinstance(inner, Laplace) or isinstance(inner, _atoms.ATOM_EVENTS):
                return math.inf
            if _continuous.is_leaf(inner):
                return math.inf
            if isinstance(inner, SingleEpochTreeAggregation):
                total += count * _inverse_square(inner.equivalent_noise_multiplier)
                continue
            sigma = inner.noise_multiplier if isinstance(inner, Gaussian) else inner.event.noise_multiplier  # type: ignore[attr-defined]
            # 1 / sigma^2 without the OverflowError of sigma**2 (sigma = 1e200: 0) or the
            # division by an underflowed 0 (sigma = 1e-200: inf)
            total += count * _inverse_square(sigma)
        return math.sqrt(total)

    def _options(self) -> dict[str, Any]:
        return {"precision": self._precision}


#: epsilon_bounds refines the grid only up to this many distinct mechanism events (and a short
#: composition's grid is refined, :meth:`PLDAccountant._short_step`, only up to as many).
_REFINE_UP_TO = 64
#: Constant of the grid step formula (:meth:`PLDAccountant._base_step`).
_STEP_CONSTANT = 0.035
#: A short composition's grid is refined while its linear support stays within this many points
#: (at the default precision), at most 2^_SHORT_LEVELS times.
_SHORT_POINTS = float(3 << 18)
#: Grid points a Gaussian-family leaf may span before the grid is coarsened (_support_step).
_LEAF_POINTS = float(1 << 18)
#: The coarsest grid step _support_step may choose (e^{-h} stays far from underflow).
_MAX_STEP = 16.0
_SHORT_LEVELS = 12
#: epsilon_bounds stops refining its lower bound where a halving of the grid left more than
#: this share of the bracket's width.
_STALLED_SHARE = 0.75

#: Laplace alignment looks for a grid step at most this many times finer than the formula's.
_ALIGN_RANGE = 16.0

#: Above this many distinct mechanism events, noise multipliers are rounded onto a grid (see
#: :func:`_quantized` and :meth:`PLDAccountant._rounding_quantum`).
_LEAF_BUDGET = 512
#: Grid coarsening of a schedule whose noise multipliers are rounded
#: (:meth:`PLDAccountant._schedule_coarsening`).
_SCHEDULE_COARSENING = 2.0
#: Quantum of the coarse pass of :meth:`PLDAccountant._worst_direction` (noise multipliers within
#: 2.5% share one discretisation there).
_COARSE_QUANTUM = 0.05
#: Grid factors of the coarse checks of :meth:`PLDAccountant._worst_direction`, coarsest first.
_COARSE_FACTORS = (16.0, 4.0)


def _step_bucket(steps: int, smooth: bool) -> int:
    """The bucket of a step count: the smallest power of two >= steps, except that counts up
    to ``_FIRST_BUCKET`` of ``smooth`` losses (:meth:`PLDAccountant._smooth_leaves`) are each
    their own bucket. The per-step truncation budget is the tail budget over the bucket, and a
    short composition's refined grid and circle are those of the bucket
    (:meth:`PLDAccountant._short_step`), so every count of a bucket shares its leaves'
    discretisations and spectra."""
    if smooth and steps <= _FIRST_BUCKET:
        return max(steps, 1)
    return 1 << max(steps - 1, 0).bit_length()


#: Step counts of smooth losses up to this keep a grid of their own (above it, powers of two
#: share one). One grid for 1 to 4 steps cost a fifth of the discretisation at the first query,
#: but its coarser grid put three steps (q = 0.2, sigma = 0.5) 7.4e-10 relative above
#: dp-accounting's default delta at epsilon 1 (tests/test_pld_peer_defaults.py); each count's
#: own grid is below it. Losses with atoms (randomized response, Laplace, the atoms of
#: _pld_atoms), whose rounding onto the grid errs to first order, round every count up to a
#: power of two for the tail budget only, and keep the grid of their own count.
_FIRST_BUCKET = 4
#: Mechanisms whose privacy loss has a density (no atom): a coarser grid errs to second order.
_SMOOTH_MECHANISMS = (_GAUSSIAN, _REMOVE, _ADD, _SYMMETRIC)


def _check_block(steps: int) -> int:
    """The block of counts of the first check of :meth:`PLDAccountant._worst_direction`: the
    largest power of two at most steps / 32 (1, no rounding, below 64 steps)."""
    return 1 << max((steps // 32).bit_length() - 1, 0)
#: Cache per-leaf spectra (for incremental queries) up to this many distinct leaves.
_CACHE_SPECTRA_UP_TO = 16
#: From this many composed steps (and up to _CACHE_SPECTRA_UP_TO distinct leaves) the composition
#: is done in two stages on two grids (:func:`_staging`).
_STAGED_FROM = 1 << 15


def _staging(steps: int) -> tuple[int, int] | None:
    """(blocks, factor) of :func:`~dpsharp.accountants._pld_numerics.compose_staged` for a
    composition of ``steps`` steps, or None below ``_STAGED_FROM`` steps.

    A block of T1 = T / blocks steps has about sqrt(T1) times one step's loss spread, and a
    rounding errs by O(h^2 / spread^2) relative, so coarsening the block by a factor well below
    sqrt(T1) adds little to the steps' own rounding error. ``blocks`` is the power of two nearest
    sqrt(T) / 16 (at least 4) and ``factor`` the power of two at most sqrt(T1) / 8 (at least 2).
    ``bench/bench_pld_staging.py`` measures both on Poisson-subsampled Gaussians from 4e4 to 1e7
    steps: the staged upper epsilon is at most 5e-6 relative above the one-stage one on the same
    grid (the precision knob's default gap is 1e-3), and the staged query is 3x faster at 1e6
    steps and 7-8x at 1e7 (the gain grows with T; with fewer steps, or where a block's window is
    set by far tails, :func:`~dpsharp.accountants._pld_numerics.staging_pays` keeps one stage)."""
    if steps < _STAGED_FROM:
        return None
    blocks = 1 << max(2, round(math.log2(math.sqrt(steps) / 16.0)))
    factor = 1 << max(1, math.floor(math.log2(math.sqrt(steps // blocks) / 8.0)))
    return blocks, factor


def _discretize(
    leaves: list[_Leaf], grid_step: float, tail: float, pessimistic: bool
) -> list[DiscretePLD]:
    """The discretised PLD of each leaf (truncated at ``tail`` on both sides), with its Chernoff
    log-MGFs, computed on the worker threads. Gaussian-family leaves with the same mechanism and
    rate are discretised in batches that share the parameter-independent work
    (``pld_discretize_many``, the same values)."""

    def finish(offset: int, mass: np.ndarray, infinity: float) -> DiscretePLD:
        pld = DiscretePLD(int(offset), np.asarray(mass), float(infinity), grid_step)
        pld.chernoff_log_mgf  # noqa: B018 - computed here, on the worker thread
        return pld

    def one(key: _Leaf) -> list[DiscretePLD]:
        if key.mechanism in _atoms.ATOM_MECHANISMS:  # finitely many losses (_pld_atoms)
            return [finish(*_atoms.discretise_atoms(*key, grid_step, pessimistic))]
        if key.mechanism in _continuous.CONTINUOUS_MECHANISMS:  # (_pld_continuous)
            return [finish(*_continuous.discretise(*key, grid_step, tail, pessimistic))]
        return [
            finish(*_core.pld_discretize(
                key.mechanism, key.parameter, key.rate, grid_step, tail, tail, pessimistic
            ))
        ]

    def batch(keys: list[_Leaf], threads: int = 1) -> list[DiscretePLD]:
        first = keys[0]
        parts = _core.pld_discretize_many(
            first.mechanism, [k.parameter for k in keys], first.rate, grid_step, tail, tail,
            pessimistic, threads,
        )
        return [finish(*part) for part in parts]

    tasks: list[tuple[Callable[[Any], list[DiscretePLD]], Any, list[int]]] = []
    families: dict[tuple[int, float], list[int]] = {}
    for index, key in enumerate(leaves):
        if key.mechanism in (_GAUSSIAN, _REMOVE, _ADD):
            families.setdefault((key.mechanism, key.rate), []).append(index)
        else:
            tasks.append((one, key, [index]))
    for indices in families.values():
        for start in range(0, len(indices), _BATCH):
            chunk = indices[start : start + _BATCH]
            tasks.append((batch, [leaves[i] for i in chunk], chunk))
    if len(tasks) == 1 and tasks[0][0] is batch:
        # One batch (a few distinct events): the C++ core splits its grid points over the CPUs.
        return batch(tasks[0][1], threads=threads_for_caller())
    out: list[DiscretePLD | None] = [None] * len(leaves)
    for (_, _, indices), plds in zip(
        tasks, parallel_map(lambda task: task[0](task[1]), tasks, threshold=2)
    ):
        for index, pld in zip(indices, plds):
            out[index] = pld
    return out  # type: ignore[return-value]


#: Leaves per call of the batched discretisation (several batches keep both threads busy).
_BATCH = 32
#: Leaves whose parameters are never rounded by :func:`_quantized` (kept as they are).
_KEPT_MECHANISMS = _atoms.ATOM_MECHANISMS + _continuous.CONTINUOUS_MECHANISMS


def _quantized(
    leaves: list[_Key], quantum: float, pessimistic: bool, columns: _LeafColumns | None = None
) -> list[_Key]:
    """Round the noise multipliers of Gaussian-family leaves onto the grid of
    :class:`_RoundingGrid` (geometric in the root s of the per-step loss-variance proxy,
    :func:`_variance_root`, with ratio ``1 + quantum / 2``): down for the pessimistic side, up
    for the optimistic side. Sampling rates are kept exact (a schedule's rates are few; rounding
    them up by a grid step widened the bracket by about as much again as its noise multipliers).
    Sound because the pair of (sigma', q) is a post-processing of the pair of (sigma, q)
    whenever sigma' >= sigma (map N(1/sigma, 1) to N(1/sigma', 1) by scaling and adding
    independent noise), for both directions and the symmetrised pair; every rounded value is
    checked to lie on its side in floating point. Laplace, atom and continuous leaves are kept
    as they are. ``columns``: those of ``leaves`` where the caller holds them."""
    if not leaves:
        return []
    columns = _LeafColumns.of(leaves) if columns is None else columns
    grid = _RoundingGrid.of(columns, quantum, pessimistic)
    # One object per distinct key, made from the distinct rows (a schedule has far fewer
    # distinct rounded keys than leaves).
    columns = (grid.mechanism, grid.sigma, grid.rate)
    order = np.lexsort(columns[::-1])
    ordered = [column[order] for column in columns]
    starts = np.zeros(order.size, dtype=bool)
    starts[0] = True
    for column in ordered:
        starts[1:] |= column[1:] != column[:-1]
    group = np.empty(order.size, dtype=np.int64)
    group[order] = np.cumsum(starts) - 1
    made = [
        _Leaf(int(kind), sigma, rate)
        for kind, sigma, rate in zip(*(column[starts].tolist() for column in ordered))
    ]
    out = [made[index] for index in group.tolist()]
    for index in np.flatnonzero(~grid.rounded).tolist():
        out[index] = leaves[index]  # kept as it is
    return out


def _variance_root(sigma: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """s = sqrt(v), v the per-step loss-variance proxy of :func:`_loss_variance`:
    ``v = min(mu^2, q^2 (e^{mu^2} - 1))`` for a sampled Gaussian (rate q < 1), ``v = mu^2``
    without sampling, mu = 1 / sigma. Strictly decreasing in sigma at a fixed rate."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        mu = 1.0 / sigma
        sampled = rate * np.sqrt(np.expm1(np.minimum(mu * mu, 700.0)))
        return np.where(rate < 1.0, np.minimum(mu, sampled), mu)


def _sigma_of_root(root: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_variance_root` at a fixed rate: the noise multiplier 1 / mu with
    mu = max(s, sqrt(log(1 + s^2 / q^2))) for q < 1, mu = s without sampling (rounded: the
    callers check the side)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        sampled = np.sqrt(np.log1p(np.square(root / rate)))
        return 1.0 / np.where(rate < 1.0, np.maximum(root, sampled), root)


def _gap_quantum(columns: _LeafColumns, counts: Sequence[int], precision: float) -> float:
    """The coarsest quantum ``precision * 2^(j/_QUANTUM_STEPS)``, ``|j| <= 2 _QUANTUM_STEPS``,
    at which the two roundings of :func:`_quantized` move the composed loss variance proxy ``V = sum_i c_i v_i``
    (:func:`_loss_variance`, v = s^2) apart by at most ``_ROUNDING_GAP * precision`` relative:
    ``(V(pessimistic sigmas) - V(optimistic sigmas)) / V``, about ``quantum`` since each leaf's
    s moves by one grid ratio ``1 + quantum / 2``. (Epsilon grows about like sqrt(V) to V, so
    the relative gap the rounding opens is at most about that much: on bench/bench_schedules.py's
    schedules the measured widening is below the prediction.) The finest quantum of the range if
    none is within the budget. Only tightness depends on this choice; every quantum is sound.
    Found by bisection over j (the predicted gap grows with the quantum). ``columns``: the
    leaves (:class:`_LeafColumns`)."""
    weights = np.where(columns.rounded, np.asarray(counts, dtype=float), 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        per_leaf = np.where(columns.rounded, weights * np.square(columns.root), 0.0)
        exact = math.fsum(per_leaf.tolist())
    if not 0.0 < exact < math.inf:
        return precision

    def within(j: int) -> bool:
        quantum = precision * 2.0 ** (j / _QUANTUM_STEPS)
        up = _RoundingGrid.of(columns, quantum, True).sigma
        down = _RoundingGrid.of(columns, quantum, False).sigma
        with np.errstate(invalid="ignore", over="ignore"):
            spread = weights * (
                np.square(_variance_root(up, columns.rate))
                - np.square(_variance_root(down, columns.rate))
            )
        # (A NaN or inf prediction, e.g. a noise multiplier below 1e-154, is not within.)
        return math.fsum(np.where(columns.rounded, spread, 0.0).tolist()) <= (
            _ROUNDING_GAP * precision * exact
        )

    low, high = -2 * _QUANTUM_STEPS, 2 * _QUANTUM_STEPS  # the largest j in [low, high] within
    if within(high):
        return precision * 2.0 ** (high / _QUANTUM_STEPS)
    while high - low > 1:
        middle = (low + high) // 2
        (low, high) = (middle, high) if within(middle) else (low, middle)
    return precision * 2.0 ** (low / _QUANTUM_STEPS)


#: Quanta per doubling tried by :func:`_gap_quantum`.
_QUANTUM_STEPS = 8
#: Budget of :func:`_gap_quantum`, in units of the precision, for the predicted widening of the
#: bracket by the rounding of a schedule's noise multipliers (about 3 precisions in all with the
#: 0.2-0.3 that the coarser grid of such a schedule adds, see
#: :meth:`PLDAccountant._schedule_coarsening`).
_ROUNDING_GAP = 2.8


def _rounded_counts(
    columns: _LeafColumns, quanta: Sequence[float], pessimistic: bool
) -> list[int]:
    """For each quantum, the number of distinct keys :func:`_quantized` would make of the
    leaves of ``columns`` (counted on the arrays, without making the keys)."""
    return [_RoundingGrid.of(columns, quantum, pessimistic).distinct() for quantum in quanta]


@dataclass(frozen=True)
class _LeafColumns:
    """Leaves as arrays: mechanism code, parameter, rate, whether the leaf is rounded (the
    Gaussian family; Laplace, atom and continuous leaves are kept), and the root s of its
    loss-variance proxy (:func:`_variance_root`; 1.0 for a kept leaf)."""

    mechanism: np.ndarray
    parameter: np.ndarray
    rate: np.ndarray
    rounded: np.ndarray
    root: np.ndarray

    @classmethod
    def of(cls, leaves: Sequence[_Key]) -> _LeafColumns:
        """The columns of ``leaves`` (every field an int code or a float: exact in float64)."""
        if not leaves:
            empty = np.zeros(0)
            return cls(empty, empty, empty, np.zeros(0, dtype=bool), empty)
        table = np.array(leaves, dtype=float).reshape(len(leaves), 3)
        mechanism, parameter, rate = (np.ascontiguousarray(table[:, j]) for j in range(3))
        rounded = ~np.isin(mechanism, (_LAPLACE,) + _KEPT_MECHANISMS)
        root = np.where(rounded, _variance_root(np.where(rounded, parameter, 1.0), rate), 1.0)
        return cls(mechanism, parameter, rate, rounded, root)

    @property
    def size(self) -> int:
        return int(self.parameter.size)

    def extended(self, more: _LeafColumns) -> _LeafColumns:
        """These rows followed by ``more``'s (every column is elementwise, so the rows are the
        ones :meth:`of` makes of the whole list)."""
        return _LeafColumns(*(np.concatenate((mine, theirs)) for mine, theirs in zip(
            (self.mechanism, self.parameter, self.rate, self.rounded, self.root),
            (more.mechanism, more.parameter, more.rate, more.rounded, more.root),
        )))

    def rows_from(self, start: int) -> _LeafColumns:
        """The rows from ``start`` on (views)."""
        return _LeafColumns(self.mechanism[start:], self.parameter[start:], self.rate[start:],
                            self.rounded[start:], self.root[start:])

    def rounds_like(self, other: _LeafColumns) -> bool:
        """Whether every rounding gives ``other`` what it gives these rows, up to the names of
        the mechanisms: the same parameters, rates and rounded rows, and mechanism codes that
        correspond one to one (these rows' Poisson "remove" code to the "add" code, every other
        code to itself; these rows hold no "add" code). Then :func:`_rounded_counts` and
        :func:`_gap_quantum` give both the same numbers: the two directions of a schedule of
        Poisson-sampled Gaussians (the same noise multipliers and rates) need one search."""
        if self.size != other.size or bool(np.any(self.mechanism == _ADD)):
            return False
        renamed = np.where(self.mechanism == _REMOVE, float(_ADD), self.mechanism)
        return (np.array_equal(self.parameter, other.parameter)
                and np.array_equal(self.rate, other.rate)
                and np.array_equal(self.rounded, other.rounded)
                and np.array_equal(renamed, other.mechanism))


@dataclass(frozen=True)
class _RoundingGrid:
    """The rounded noise multipliers of :func:`_quantized`, per leaf. The grid is geometric in
    s = sqrt(v) (:func:`_variance_root`), s' = r^k with r = 1 + quantum / 2: the pessimistic
    side takes the noise multiplier of the grid point at or above s (a larger s, a smaller
    sigma), the optimistic side that of the point at or below it. Each leaf's variance proxy
    then moves by the same relative amount whatever its noise multiplier (a grid geometric in
    sigma moves the proxy of a small noise multiplier, whose e^{1/sigma^2} grows fast, several
    times more than that of a large one). The inverse (:func:`_sigma_of_root`) is rounded: a
    value that lands on the wrong side of the exact noise multiplier moves one grid point on,
    and a leaf where that does not settle it keeps its own noise multiplier. So every rounded
    value is on its side exactly, in floating point. ``quantum`` 0 keeps every leaf."""

    #: the noise multiplier each leaf is keyed by (the leaf's own where it is kept)
    sigma: np.ndarray
    #: whether the leaf is rounded (False: Laplace and the other leaves kept as they are)
    rounded: np.ndarray
    mechanism: np.ndarray
    rate: np.ndarray

    @classmethod
    def of(cls, leaves: _LeafColumns, quantum: float, pessimistic: bool) -> _RoundingGrid:
        if not quantum > 0.0 or leaves.parameter.size == 0:
            return cls(leaves.parameter, leaves.rounded, leaves.mechanism, leaves.rate)
        log_r = math.log1p(quantum / 2.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scaled = np.log(leaves.root) / log_r
        active = leaves.rounded & np.isfinite(scaled) & (np.abs(scaled) < 2.0**50)
        scaled = np.where(active, scaled, 0.0)
        index = np.ceil(scaled) if pessimistic else np.floor(scaled)
        step = 1.0 if pessimistic else -1.0

        def sigma_at(k: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", under="ignore"):
                return _sigma_of_root(np.exp(k * log_r), leaves.rate)

        candidate = sigma_at(index)
        for _ in range(3):
            wrong = active & ~_on_side(candidate, leaves.parameter, pessimistic)
            if not wrong.any():
                break
            index = np.where(wrong, index + step, index)
            candidate = np.where(wrong, sigma_at(index), candidate)
        good = active & _on_side(candidate, leaves.parameter, pessimistic)
        sigma = np.where(good, candidate, leaves.parameter)
        return cls(sigma, leaves.rounded, leaves.mechanism, leaves.rate)

    def distinct(self) -> int:
        """The number of distinct (mechanism, sigma, rate) rows (by sorting, not hashing tens
        of thousands of tuples)."""
        if self.sigma.size == 0:
            return 0
        order = np.lexsort((self.rate, self.sigma, self.mechanism))
        columns = [column[order] for column in (self.mechanism, self.sigma, self.rate)]
        changed = np.zeros(order.size - 1, dtype=bool)
        for column in columns:
            changed |= column[1:] != column[:-1]
        return int(changed.sum()) + 1


def _on_side(candidate: np.ndarray, sigma: np.ndarray, pessimistic: bool) -> np.ndarray:
    """Whether each rounded noise multiplier is a positive finite value on its side of the
    exact one (at most it for the pessimistic side, at least it for the optimistic side)."""
    with np.errstate(invalid="ignore"):
        side = candidate <= sigma if pessimistic else candidate >= sigma
        return side & np.isfinite(candidate) & (candidate > 0.0)


def _laplace_aligned(step: float, losses: Sequence[float]) -> float:
    """The largest grid step h' <= ``step`` of the form 2^k or 3 * 2^(k-1), and at least
    ``step / _ALIGN_RANGE``, of which every loss in ``losses`` is an exact integer multiple
    (checked in floating point: m h' == loss exactly); ``step`` itself when there is none
    (e.g. 1/b = 0.1, which no binary step divides). Halving h' keeps the property, so every
    refinement of the grid keeps the atoms on it too."""
    if not losses:
        return step
    power = 2.0 ** math.floor(math.log2(step))
    candidates = []
    while power >= step / (2.0 * _ALIGN_RANGE):
        candidates.extend((1.5 * power, power))
        power /= 2.0
    for candidate in candidates:
        if not step / _ALIGN_RANGE <= candidate <= step:
            continue
        if all(_is_multiple(loss, candidate) for loss in losses):
            return candidate
    return step


def _family_at_least(value: float) -> float:
    """The smallest step of the form 2^k or 3 * 2^(k-1) that is >= ``value`` > 0."""
    power = 2.0 ** math.floor(math.log2(value))
    if power >= value:
        return power
    return 1.5 * power if 1.5 * power >= value else 2.0 * power


def _is_multiple(loss: float, step: float) -> bool:
    ratio = loss / step
    return ratio == math.floor(ratio) and math.floor(ratio) * step == loss


def _leaf_largest_loss(key: _Key) -> float:
    """The largest privacy loss of one discretised event (its key, :meth:`PLDAccountant._leaves`),
    rounded up; +inf where the loss is unbounded. Laplace of scale b: 1/b
    (``reciprocal_rounded_up``, as the core analyses it). A Poisson-sampled Gaussian in the add
    direction: L(x) = -log(1 - q + q e^{mu x - mu^2/2}) < -log(1 - q) (its supremum as x ->
    -inf), log1p within an ulp and raised by two."""
    mechanism = key[0]
    if mechanism == _LAPLACE:
        return _core.reciprocal_rounded_up(key[1])
    if mechanism == _ADD and key[2] < 1.0:
        top = -math.log1p(-key[2])
        return math.nextafter(math.nextafter(top, math.inf), math.inf)
    return math.inf


def _loss_variance(leaf: Event) -> float:
    """A closed-form proxy for the per-step variance of the privacy loss (used for the grid)."""
    if type(leaf) is PoissonSampled and type(leaf.event) is Gaussian:  # the last branch, directly
        mu2 = _inverse_square(leaf.event.noise_multiplier)
        return min(mu2, leaf.sampling_probability**2 * math.expm1(min(mu2, 700.0)))
    inner = leaf.event if isinstance(leaf, Shuffled) else leaf
    if isinstance(inner, Laplace):
        return _inverse_square(inner.scale)
    if isinstance(inner, _atoms.ATOM_EVENTS):
        return _atoms.event_variance(inner)
    if _continuous.is_leaf(inner):
        return _continuous.event_variance(inner)
    if isinstance(inner, SingleEpochTreeAggregation):
        return _inverse_square(inner.equivalent_noise_multiplier)
    if isinstance(inner, Gaussian):
        return _inverse_square(inner.noise_multiplier)
    rate = inner.sampling_probability if isinstance(inner, PoissonSampled) else inner.sampling_rate  # type: ignore[attr-defined]
    mu2 = _inverse_square(inner.event.noise_multiplier)  # type: ignore[attr-defined]
    return min(mu2, rate**2 * math.expm1(min(mu2, 700.0)))


def _inverse_square(sigma: float) -> float:
    """1 / sigma^2, +inf where sigma^2 underflows (a noise multiplier below about 1e-162)."""
    square = sigma * sigma
    return 1.0 / square if square > 0.0 else math.inf


def _tail_for(delta: float, precision: float) -> float:
    """Truncation budget for a delta query: its effect on delta is at most 1e-2 * precision *
    delta, i.e. far below the requested relative precision of epsilon."""
    budget = max(min(1e-2 * precision * delta, _TAIL_BUDGET), _MIN_TAIL)
    return 10.0 ** math.floor(math.log10(budget))


def _gaussian_delta(eps: np.ndarray, mu: float) -> np.ndarray:
    """delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su 2019,
    Cor. 2.13), in log space; 0 at eps = +inf."""
    eps = np.asarray(eps, dtype=float)
    out = np.zeros_like(eps)
    finite = np.isfinite(eps)
    e = eps[finite]
    a = log_ndtr(-e / mu + mu / 2)
    b = e + log_ndtr(-e / mu - mu / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[finite] = np.where(a > b, np.exp(a) * -np.expm1(np.minimum(b - a, 0.0)), 0.0)
    return out


def _tradeoff_from_curves(
    curves: list[tuple[np.ndarray, np.ndarray]], alphas: np.ndarray
) -> np.ndarray:
    eps = curves[0][0]
    delta = curves[0][1]
    for other_eps, other_delta in curves[1:]:
        # Below a curve's first grid point its delta is not bounded from above by the curve
        # (delta is non-increasing), so the merged grid starts at the later first point; above
        # a curve's last grid point its delta is at most its value there. A short curve (the
        # add direction of a Poisson-sampled Gaussian, whose loss stops at -log(1 - q)) thus
        # keeps the other curve's large epsilons, where the small alphas' terms come from.
        lo = max(eps[0], other_eps[0])
        grid = np.union1d(eps, other_eps)
        grid = grid[grid >= lo]
        # Each curve is non-increasing, so its value at the next grid point of its own is a
        # lower bound and at the previous grid point an upper bound: use the upper one.
        def upper_at(e: np.ndarray, d: np.ndarray, x: np.ndarray) -> np.ndarray:
            idx = np.searchsorted(e, x, side="right") - 1
            return d[np.clip(idx, 0, e.size - 1)]

        delta = np.maximum(upper_at(eps, delta, grid), upper_at(other_eps, other_delta, grid))
        eps = grid
    # f(alpha) >= max_k (1 - delta_k - e^{eps_k} alpha), plus the trivial 0.
    # e^{eps} alpha is formed as e^{eps + log alpha}: 0 at alpha = 0 even where e^{eps}
    # overflows (inf * 0 would be NaN), and -inf terms where it overflows for alpha > 0.
    best = np.zeros_like(alphas)
    with np.errstate(divide="ignore"):
        log_alphas = np.log(alphas)
    chunk = 4096
    for startix in range(0, eps.size, chunk):
        e = eps[startix : startix + chunk]
        d = delta[startix : startix + chunk]
        with np.errstate(over="ignore"):
            values = 1.0 - d[None, :] - np.exp(e[None, :] + log_alphas[:, None])
        best = np.maximum(best, values.max(axis=1))
    # Each term is a valid lower bound of f, so their maximum (and 0) is; f <= 1 - alpha always.
    return np.clip(best, 0.0, 1.0 - alphas)
