"""Exact answers for compositions of mechanisms whose privacy loss takes finitely many values
(randomized response, the discrete Laplace mechanism): no grid, no FFT.

One release of such a mechanism has, for a pair (P, Q) of output laws, the privacy loss
L = log(P(o) / Q(o)), o ~ P, with atoms l_1 .. l_a of masses m_1 .. m_a (:mod:`._pld_atoms`).
The loss of c independent releases is sum_j k_j l_j, where the counts (k_1 .. k_a) of each atom
are multinomial:

    P(k) = c! / (k_1! ... k_a!) * m_1^k_1 ... m_a^k_a,

and the losses of distinct mechanisms add over the product of their outcomes. With the
composed outcomes (L_i, p_i) enumerated, the hockey-stick divergence of the composed pair is

    delta(eps) = sum_{i: L_i > eps} p_i (1 - e^{eps - L_i})

(the hockey-stick divergence in privacy-loss form: Balle and Wang 2018; Sommer, Meiser,
Mohammadi 2019),
a sum of non-negative terms: no cancellation. :class:`LatticeComposition` evaluates it with
every atom's loss replaced by the double at or above its exact value for the upper bound (at or
below it for the lower one: each term is non-decreasing in L), the closed form evaluated at 40
digits from the double parameters (:func:`~dpsharp.accountants._pld_atoms.atom_loss_brackets`);
every composed loss moved by a bound on the rounding of its sum; every log-probability moved by
a bound on its rounding (``lgamma``, ``log`` and the sums: a relative 1e-13 of the sum of the
terms' magnitudes, about 100 times the double-precision error of each, which also covers the
masses' own rounding); every product and the final sum rounded outwards. So
``delta(eps, upper=True) >= delta_exact(eps) >= delta(eps, upper=False)``; the two sides differ
by about 1e-12 relative, where a grid's rounding and an FFT's round-off bound leave a bracket of
the precision's size, and the FFT cannot certify a delta below its round-off floor at all (a
randomized response run of 500 releases at delta = 1e-10: 0.8% above the exact epsilon on the
default grid, and the support bound, nine times the exact epsilon, at 1e-11).

The number of outcomes is prod_i C(c_i + a_i - 1, a_i - 1): used up to :data:`MAX_OUTCOMES`
(a k-ary randomized response under replace-one, 3 atoms, composed up to 722 times; under
zero-out, 2 atoms, 262,143 times; a discrete Laplace mechanism of sensitivity 1 as often, of
sensitivity 3 up to 114 times); beyond that the accountant composes on its grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import gammaln

__all__ = ["MAX_OUTCOMES", "LatticeComposition", "Leaf", "outcomes"]

#: Largest number of composed outcomes enumerated (a query there takes about 0.1 s and some
#: 30 MB).
MAX_OUTCOMES = 1 << 18
#: Largest count-vector table of one mechanism (outcomes times atoms; 32 MB of integers).
_MAX_COUNT_ENTRIES = 1 << 22
_UNIT = 2.0**-53
#: Relative bound on the error of each log-gamma value and logarithm against its magnitude
#: (about 100 times their double-precision accuracy); the sums add one unit roundoff per term
#: (:class:`_Side`).
_LOG_RELATIVE = 1e-13
#: Relative rounding allowance of the final sums (pairwise summation of at most 2^22 positive
#: terms errs by at most about 23 u relative).
_SUM_RELATIVE = 1e-12
#: An upper side counts a term whose log-probability is lower than this as e^this (a normal
#: double, so its exp is within an ulp): never below the term's mass.
_LOG_TINY = -700.0


#: One mechanism of a lattice composition: (the doubles at or below its atoms' exact losses,
#: those at or above them, the atoms' masses under P, its count).
Leaf = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], int]


def outcomes(leaves: Sequence[Leaf]) -> int:
    """The number of composed outcomes of ``leaves`` (:data:`Leaf`, one per distinct
    mechanism): prod_i C(c_i + a_i - 1, a_i - 1); ``MAX_OUTCOMES + 1`` where one leaf's count
    vectors alone would hold more than ``_MAX_COUNT_ENTRIES`` integers (many atoms)."""
    total = 1
    for losses, _, _, count in leaves:
        own = math.comb(count + losses.size - 1, losses.size - 1)
        if own * losses.size > _MAX_COUNT_ENTRIES:
            return MAX_OUTCOMES + 1
        total *= own
        if total > MAX_OUTCOMES:
            return MAX_OUTCOMES + 1
    return total


def _count_vectors(count: int, parts: int) -> npt.NDArray[np.int64]:
    """Every vector of ``parts`` non-negative integers summing to ``count``, one per row."""
    rows = np.zeros((1, 0), dtype=np.int64)
    used = np.zeros(1, dtype=np.int64)
    for _ in range(parts - 1):
        lengths = count - used + 1  # the next part takes 0 .. count - used
        parent = np.repeat(np.arange(rows.shape[0]), lengths)
        starts = np.cumsum(lengths) - lengths
        values = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
        rows = np.concatenate([rows[parent], values[:, None]], axis=1)
        used = used[parent] + values
    return np.concatenate([rows, (count - used)[:, None]], axis=1)


@dataclass(frozen=True)
class _Outcomes:
    """Composed outcomes: loss, log-probability, the magnitudes their roundings scale with
    (sum_j k_j |l_j| and the sum of the absolute values of the log-probability's terms), and
    the number of inexact operations in the loss's sum: a product k_j l_j with k_j not a power
    of two, an addition of two non-zero terms (a product by 1 and an addition of 0 are exact,
    so one release's loss is its atom's, exactly)."""

    loss_below: npt.NDArray[np.float64]
    loss_above: npt.NDArray[np.float64]
    log_mass: npt.NDArray[np.float64]
    loss_scale: npt.NDArray[np.float64]
    log_scale: npt.NDArray[np.float64]
    loss_ops: npt.NDArray[np.float64]

    @classmethod
    def of_leaf(cls, below: npt.NDArray[np.float64], above: npt.NDArray[np.float64],
                masses: npt.NDArray[np.float64], count: int) -> _Outcomes:
        losses = np.maximum(np.abs(below), np.abs(above))  # (the magnitudes)
        vectors = _count_vectors(count, losses.size)
        log_masses = np.log(masses)
        factorials = gammaln(vectors + 1.0)
        log_mass = np.full(vectors.shape[0], float(gammaln(count + 1.0)))
        loss_below = np.zeros(vectors.shape[0])
        loss_above = np.zeros(vectors.shape[0])
        loss_scale = np.zeros(vectors.shape[0])
        log_scale = np.full(vectors.shape[0], float(gammaln(count + 1.0)))
        nonzero = np.zeros(vectors.shape[0])
        inexact_products = np.zeros(vectors.shape[0])
        for j in range(losses.size):  # atom by atom, in order (no matrix product)
            k = vectors[:, j].astype(np.float64)
            log_mass -= factorials[:, j]
            log_mass += k * log_masses[j]
            loss_below += k * below[j]
            loss_above += k * above[j]
            loss_scale += k * losses[j]
            log_scale += factorials[:, j] + k * abs(log_masses[j]) + k
            used = (k > 0.0) & (losses[j] != 0.0)
            nonzero += used
            inexact_products += used & (np.frexp(k)[0] != 0.5)  # (k not a power of two)
        loss_ops = inexact_products + np.maximum(nonzero - 1.0, 0.0)
        return cls(loss_below, loss_above, log_mass, loss_scale, log_scale, loss_ops)

    def times(self, other: _Outcomes) -> _Outcomes:
        """The outcomes of both compositions together (independent: losses add, one more
        addition)."""
        fields = ("loss_below", "loss_above", "log_mass", "loss_scale", "log_scale", "loss_ops")
        combined = [(getattr(self, name)[:, None] + getattr(other, name)[None, :]).ravel()
                    for name in fields]
        combined[-1] += 1.0
        return _Outcomes(*combined)


class _Side:
    """One side of the bounds: each outcome's loss moved by its rounding bound (up or down),
    sorted by it, with its probability moved the same way. An outcome's loss and
    log-probability are sums of at most ``terms`` rounded terms (each atom's, one per mechanism
    for the product of outcomes, and the log-gamma values), each partial sum at most the sum of
    the magnitudes (``loss_scale``, ``log_scale``): the log-probability's sums err by at most
    ``terms`` unit roundoffs of that, every product k log m and every logarithm by one more,
    and each log-gamma value by ``_LOG_RELATIVE`` of its magnitude; a loss by one unit
    roundoff of its scale per inexact operation (``_Outcomes.loss_ops``), from the sum of the
    atoms' doubles on its side of their exact losses. With ``exact_losses`` the atoms and the
    loss sums are exact (:func:`_exact_loss_sums`) and only the log-probabilities move."""

    def __init__(self, composed: _Outcomes, upper: bool, terms: int, exact_losses: bool) -> None:
        sign = 1.0 if upper else -1.0
        rounding = (terms + 4) * _UNIT
        # (the sum of the atoms' doubles on this side, each inexact operation erring by at
        # most u times its result, at most loss_scale, the scale's own rounding covered by the
        # factor 1.01)
        loss = composed.loss_above if upper else composed.loss_below
        if not exact_losses:
            loss = loss + sign * (1.01 * _UNIT) * composed.loss_ops * composed.loss_scale
        log_mass = composed.log_mass + sign * (
            (_LOG_RELATIVE + rounding) * composed.log_scale + 8.0 * _UNIT)
        order = np.argsort(loss, kind="stable")
        self.upper = upper
        self.loss = loss[order]
        with np.errstate(under="ignore"):
            self.mass = np.exp(np.maximum(log_mass[order], _LOG_TINY) if upper else log_mass[order])
        # (suffix sums of the masses and of mass * e^-loss, made at the first epsilon query)
        self._suffix: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

    def delta(self, epsilon: float) -> float:
        start = int(np.searchsorted(self.loss, epsilon, side="right"))  # L > epsilon
        if start == self.loss.size:
            return 0.0
        factor = -np.expm1(epsilon - self.loss[start:])
        total = float(np.sum(self.mass[start:] * factor))
        if self.upper:  # each exp, expm1 and product within 4 ulp, the sum within 1e-12
            return total * (1.0 + 8.0 * 2.0 * _UNIT) * (1.0 + _SUM_RELATIVE)
        return total * (1.0 - 8.0 * 2.0 * _UNIT) * (1.0 - _SUM_RELATIVE)

    def epsilon(self, delta: float) -> float:
        """Where delta(epsilon) (non-increasing) crosses ``delta``, to adjacent doubles: a
        bisection on the bit patterns between 0 (or the last point found too small) and the
        largest loss (where delta is 0), started from the root of the suffix sums' closed
        form. The upper side returns the end where its delta is at most ``delta`` (the exact
        epsilon is at most that); the lower side the end where its delta exceeds ``delta``
        (the exact delta does too, at that end and below it: the exact epsilon is above it),
        or 0.0."""
        if self.delta(0.0) <= delta:
            return 0.0
        low, high = 0.0, max(float(self.loss[-1]), 0.0)  # delta(low) > delta >= delta(high)
        guess = self._approximate_root(delta)
        for width in (1e-9, 1e-6, 1e-3) if math.isfinite(guess) else ():
            # Narrow [low, high] to a window around the guess, each end checked (the bracket
            # only ever moves onto points whose side is known); widen where the guess was off.
            step = width * max(abs(guess), 1.0)
            above, below = min(guess + step, high), max(guess - step, low)
            if above < high:
                if self.delta(above) > delta:
                    low = above
                    continue
                high = above
            if below > low:
                if self.delta(below) <= delta:
                    high = below
                    continue
                low = below
            break
        low_bits = int(np.float64(low).view(np.int64))
        high_bits = int(np.float64(high).view(np.int64))
        while high_bits - low_bits > 1:
            middle_bits = low_bits + (high_bits - low_bits) // 2
            if self.delta(float(np.int64(middle_bits).view(np.float64))) <= delta:
                high_bits = middle_bits
            else:
                low_bits = middle_bits
        return float(np.int64(high_bits if self.upper else low_bits).view(np.float64))

    def _approximate_root(self, delta: float) -> float:
        """Where sum_{L > eps} p - e^eps sum_{L > eps} p e^{-L} (suffix sums: about the same
        delta, without the term-wise care) crosses ``delta``: only a starting point."""
        if self._suffix is None:
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                scaled = self.mass * np.exp(-self.loss)
            self._suffix = (np.cumsum(self.mass[::-1])[::-1],
                            np.cumsum(scaled[::-1])[::-1])
        mass_sums, scaled_sums = self._suffix
        low, high = 0.0, max(float(self.loss[-1]), 0.0)
        for _ in range(80):
            middle = 0.5 * (low + high)
            start = int(np.searchsorted(self.loss, middle, side="right"))
            with np.errstate(invalid="ignore", over="ignore"):
                value = 0.0 if start == self.loss.size else (
                    float(mass_sums[start])
                    - math.exp(min(middle, 700.0)) * float(scaled_sums[start]))
            if value > delta:
                low = middle
            else:
                high = middle
        return 0.5 * (low + high)


def _exact_loss_sums(leaves: Sequence[Leaf]) -> bool:
    """Whether every composed loss sum_j k_j l_j is computed exactly: every atom's double its
    exact loss (the two sides agree), a multiple of 2^-40, and every partial sum below 2^13 in
    magnitude (then each product and sum is an integer multiple of 2^-40 below 2^53 of them:
    exact in double precision). So the discrete Laplace mechanism with a dyadic parameter
    answers delta = 0 exactly at its largest loss, as the grid route does."""
    bound = 0.0
    for below, above, _, count in leaves:
        if not np.array_equal(below, above):
            return False
        scaled = np.ldexp(below, 40)
        if not np.all(scaled == np.floor(scaled)):
            return False
        bound += count * float(np.max(np.abs(below), initial=0.0))
    return bound < 2.0**13


class LatticeComposition:
    """The exact composition of finitely-valued privacy losses (module docstring), with
    certified upper and lower delta(eps) and epsilon(delta)."""

    def __init__(self, leaves: Sequence[Leaf]) -> None:
        """``leaves``: one :data:`Leaf` per distinct mechanism (its atoms under P)."""
        if not leaves or outcomes(leaves) > MAX_OUTCOMES:
            raise ValueError(f"a lattice composition holds 1 to {MAX_OUTCOMES} outcomes")
        composed: _Outcomes | None = None
        for below, above, masses, count in leaves:
            part = _Outcomes.of_leaf(*(np.asarray(values, dtype=np.float64)
                                       for values in (below, above, masses)), int(count))
            composed = part if composed is None else composed.times(part)
        assert composed is not None
        terms = sum(2 * np.asarray(below).size + 2 for below, _, _, _ in leaves)
        exact = _exact_loss_sums(leaves)
        self._upper = _Side(composed, upper=True, terms=terms, exact_losses=exact)
        self._lower = _Side(composed, upper=False, terms=terms, exact_losses=exact)

    def delta(self, epsilon: float, *, upper: bool) -> float:
        """A certified upper (``upper``) or lower bound on delta(``epsilon``)."""
        return (self._upper if upper else self._lower).delta(epsilon)

    def epsilon(self, delta: float, *, upper: bool) -> float:
        """A certified upper (``upper``) or lower bound on the smallest epsilon whose delta is
        at most ``delta``."""
        return (self._upper if upper else self._lower).epsilon(delta)
