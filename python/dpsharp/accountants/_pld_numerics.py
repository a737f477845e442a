"""Composition of discretised privacy-loss distributions by FFT (the numerics behind
:class:`dpsharp.accountants.pld.PLDAccountant`).

A discretised PLD is a mass vector on the loss grid ``{k h}`` plus a mass at ``+inf``. The PLD of
an adaptive composition is the distribution of the *sum* of independent losses, i.e. the
convolution of the mass vectors (Dong, Roth, Su 2019, Thm 3.2 for f-DP; Koskela, Jalko, Honkela
2020 for PLDs). We convolve on a circle of ``n`` points with the real FFT, so that ``count`` copies
of a PLD cost one transform and a pointwise power (Koskela et al. 2020, Section 5), and the folding
of the true (linear) result onto the circle is accounted for rigorously:

* Reduction modulo ``n`` is a ring homomorphism, so the circular result is exactly the linear one
  folded onto ``[a, a + n)``: every entry is the true mass there plus *non-negative* aliased mass.
* The mass of the linear result outside the window is bounded by Chernoff's inequality with the
  exact moment generating functions of the discretised PLDs:
  ``P(S > b) <= min_{t > 0} exp(sum_i c_i log E[e^{t L_i}] - t b)`` and the mirror image below.
* Hence ``delta_upper = sum(window, clipped at 0) + P(inf) + P(S > b) + P(S < a) (1 - e^{eps-a})_+``
  bounds the discretised composition from above, and ``delta_lower = sum(window) - P(S > b) -
  P(S < a) - |negative round-off|`` from below.
* The FFT's own round-off shows partly as negative mass (subtracted above); the rest moves the
  masses smoothly (a T-th power carries a spectrum's ~1e-16 relative error T times over) and is
  covered by an allowance the accountant sets per composition (``ComposedPLD.noise``, added to
  the upper and subtracted from the lower delta): measured, not proven.

When the composed spectrum is 0 (below e^-800) outside a band of low frequencies holding at most
1/64 of the circle, the result is kept as that band (:class:`._pld_band.BandSpectrum`): epsilon
and delta are then evaluated from closed forms over the band, with a bound on their evaluation
error added on each side, and the masses are formed only for the queries that need all of them.
Where a leaf PLD is narrow against the circle and composed many times, its transform is only
computed below a frequency beyond which a total-variation bound certifies that its power is
below e^-800 (:func:`_pruned_reach`), by a chirp transform of about the PLD's length
(:func:`_pruned_transform`) instead of a transform of the whole circle.

A long composition of few distinct PLDs can be done in two stages, blocks of steps on the fine
grid and the blocks on a coarser one (:func:`compose_staged`), each stage keeping its bound.

The circle's transforms are :func:`forward_transform` / :func:`inverse_transform` (scipy.fft's
pocketfft; from ``_SPLIT_FROM`` points on as two half-length transforms on two threads), and the
pruned leaf transforms use scipy.fft's complex transforms; a GPU build can replace those by cuFFT.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import scipy.fft
import scipy.signal

from dpsharp._native import core as _core
from dpsharp.accountants._pld_band import BAND_FRACTION, BandSpectrum

__all__ = [
    "ComposedPLD",
    "DiscretePLD",
    "LeafSpectrum",
    "coarsened",
    "compose",
    "compose_staged",
    "staging_pays",
    "forward_transform",
    "inverse_transform",
    "parallel_map",
    "threads_for_caller",
]

#: Exponents t of the Chernoff bounds (both signs are used).
_CHERNOFF_T = np.array([0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])


#: From this circle size on (and for sizes divisible by 4), a transform is computed as the two
#: transforms of half the size of the even and odd samples, on two threads (pocketfft runs one
#: 1-D transform on one thread), joined by one radix-2 step in the C++ core
#: (``fft_halves.hpp``). Always so from this size, whatever the number of threads, so the bits
#: do not depend on it.
_SPLIT_FROM = 1 << 16


def forward_transform(values: np.ndarray, size: int) -> np.ndarray:
    """Real FFT of ``values`` (already of length ``size``)."""
    if size < _SPLIT_FROM or size % 4:
        return scipy.fft.rfft(values, n=size, workers=1)
    even, odd = _on_two_threads(lambda part: scipy.fft.rfft(part, workers=1), values[0::2], values[1::2])
    return _core.fft_combine_halves(even, odd, size, _split_threads())


def inverse_transform(spectrum: np.ndarray, size: int) -> np.ndarray:
    """Inverse of :func:`forward_transform`."""
    if size < _SPLIT_FROM or size % 4:
        return scipy.fft.irfft(spectrum, n=size, workers=1)
    halves = _core.fft_split_spectrum(spectrum, size, _split_threads())
    even, odd = _on_two_threads(lambda part: scipy.fft.irfft(part, n=size // 2, workers=1), *halves)
    out = np.empty(size)
    out[0::2] = even
    out[1::2] = odd
    return out


@dataclass(frozen=True)
class DiscretePLD:
    """Masses ``mass[i]`` at loss ``(offset + i) * grid_step`` and ``infinity_mass`` at +inf."""

    offset: int
    mass: np.ndarray
    infinity_mass: float
    grid_step: float

    def log_mgf(self, exponents: np.ndarray) -> np.ndarray:
        """``log E[e^{t L}; L finite]`` for each exponent ``t`` (exact for the finite masses;
        computed in the C++ core by a recurrence over the grid, see ``pld.hpp``)."""
        return _core.pld_log_mgf(self.mass, self.offset, self.grid_step, exponents.tolist())

    @cached_property
    def chernoff_log_mgf(self) -> np.ndarray:
        """:meth:`log_mgf` at the Chernoff exponents (:func:`chernoff_exponents`), computed once
        per PLD (a heterogeneous composition computes it on the worker that discretised it)."""
        return self.log_mgf(chernoff_exponents())

    def folded(self, size: int) -> np.ndarray:
        """The masses folded onto a circle of ``size`` points: entry ``j`` holds the masses at
        indices ``offset + i`` with ``i = j (mod size)``."""
        length = self.mass.size
        if length <= size:
            out = np.zeros(size)
            out[:length] = self.mass
            return out
        rows = -(-length // size)
        padded = np.zeros(rows * size)
        padded[:length] = self.mass
        return padded.reshape(rows, size).sum(axis=0)


@dataclass
class LeafSpectrum:
    """The real FFT of one PLD folded onto a circle of ``size`` points, and its squared modulus
    (0 where it underflows, below 1e-308: such an entry contributes nothing to a composition
    whose masses are computed to ~1e-16). A pruned spectrum (:func:`_pruned_reach`) holds only
    the first entries; the product with it is certified 0 beyond them."""

    size: int
    transform: np.ndarray
    modulus_squared: np.ndarray
    #: arg of the transform at every frequency, once the spectrum is used a second time
    phase: np.ndarray | None = None
    uses: int = 0

    def phase_at(self, kept: np.ndarray) -> np.ndarray:
        """arg of the transform at the frequencies ``kept``. The first use (a one-off query)
        computes it there only; a cached spectrum used again (an incremental run, where
        ``kept`` grows with every step) computes and keeps it at every frequency."""
        self.uses += 1
        if self.phase is None and self.uses > 1:
            self.phase = np.angle(self.transform)
        return self.phase[kept] if self.phase is not None else np.angle(self.transform[kept])


@dataclass(frozen=True)
class ComposedPLD:
    """A composition on the window ``[start, start + size) * grid_step`` with certified slack.

    The window's masses (entry ``j`` at loss ``(start + j) h``) are held either ``dense`` (the
    circular FFT result, rolled) or, for a long composition whose spectrum is confined to a band
    of low frequencies, as that band (``spectral``, see :mod:`._pld_band`): then epsilon and delta
    queries are answered from closed-form sums over the band, and :attr:`mass` is formed only
    when a query needs the whole curve.
    ``infinity_mass`` is the composed mass at +inf; ``above`` and ``below`` bound the mass of the
    linear composition above and below the window. ``excess`` bounds the total mass by which the
    (non-negative) measure that was composed exceeds the optimistic PLDs' composition (non-zero
    after a two-level composition, see :func:`compose`); ``inner_roundoff`` is the negative mass
    clipped by its first level. ``noise`` is an allowance for the floating-point error of the
    composition that no negative mass reveals (see ``_ROUNDOFF_PER_STEP`` in pld.py): added to
    every pessimistic delta and subtracted from every optimistic one.
    """

    start: int
    infinity_mass: float
    above: float
    below: float
    grid_step: float
    dense: np.ndarray | None = None
    spectral: BandSpectrum | None = None
    excess: float = 0.0
    inner_roundoff: float = 0.0
    noise: float = 0.0

    def __post_init__(self) -> None:
        if (self.dense is None) == (self.spectral is None):
            raise ValueError("a ComposedPLD holds its masses either dense or spectral")

    @cached_property
    def mass(self) -> np.ndarray:
        """The window's masses (formed by one inverse transform when held spectral)."""
        if self.dense is not None:
            return self.dense
        assert self.spectral is not None
        return inverse_transform(self.spectral.full_spectrum(), self.spectral.size)

    @property
    def size(self) -> int:
        if self.dense is not None:
            return self.dense.size
        assert self.spectral is not None
        return self.spectral.size

    @property
    def losses(self) -> np.ndarray:
        return (self.start + np.arange(self.size)) * self.grid_step

    @property
    def roundoff(self) -> float:
        """A measure of the round-off level: the total negative mass left by the FFT (dense), or
        the bound on the evaluation error of the band's sums (spectral)."""
        if self.spectral is not None:
            return self.spectral.error + self.inner_roundoff
        return float(-self.mass[self.mass < 0].sum()) + self.inner_roundoff

    def _constants(self, pessimistic: bool) -> tuple[float, float]:
        """(constant added to every delta, mass that sits below the window's bottom point). A
        spectral composition's masses are not clipped at 0, so its pessimistic constant also
        carries the evaluation error bound of the band's sums."""
        if pessimistic:
            evaluation = self.spectral.error if self.spectral is not None else 0.0
            return self.infinity_mass + self.above + self.noise + evaluation, self.below
        return (
            self.infinity_mass - self.above - self.below - 2.0 * self.roundoff - self.excess - self.noise,
            0.0,
        )

    def _curve_terms(self, pessimistic: bool) -> tuple[np.ndarray, float, float]:
        mass = np.maximum(self.mass, 0.0) if pessimistic else self.mass
        return (mass, *self._constants(pessimistic))

    def delta(self, epsilon: float, *, pessimistic: bool) -> float:
        """``sum_k m_k (1 - e^{eps - l_k})_+ + constant``: an upper (pessimistic) or lower bound
        of the hockey-stick divergence of the discretised composition."""
        if self.spectral is not None:
            value = self._spectral_delta(epsilon, pessimistic)
            if value is not None:
                return value
        mass, constant, low_mass = self._curve_terms(pessimistic)
        losses = self.losses
        above = losses > epsilon
        value = float(np.dot(mass[above], -np.expm1(epsilon - losses[above]))) + constant
        first = self.start * self.grid_step
        if low_mass and epsilon < first:
            value += low_mass * -np.expm1(epsilon - first)
        return min(max(value, 0.0), 1.0)

    def _spectral_delta(self, epsilon: float, pessimistic: bool) -> float | None:
        """:meth:`delta` from the band's suffix sums: ``A_K - e^{eps - l_K} W_K + constant`` with
        ``l_K <= eps < l_{K+1}``; None (use the masses) for an epsilon below the window."""
        assert self.spectral is not None
        h = self.grid_step
        index = math.floor(epsilon / h) - self.start
        # the index of the last grid point at or below epsilon, as `losses > epsilon` decides it
        while index + 1 < self.size and (self.start + index + 1) * h <= epsilon:
            index += 1
        while index >= 0 and (self.start + index) * h > epsilon:
            index -= 1
        if index < 0:
            return None
        constant, _ = self._constants(pessimistic)
        if index >= self.size - 1:
            return min(max(constant, 0.0), 1.0)
        mass_above, weighted_above = self.spectral.suffix_sums(index)
        discount = math.exp(epsilon - (self.start + index) * h)
        value = mass_above - discount * weighted_above + constant
        return min(max(value, 0.0), 1.0)

    def epsilon(self, delta: float, *, pessimistic: bool) -> float:
        """The smallest eps >= 0 with ``delta(eps) <= delta`` (exact for the discrete curve, which
        is ``A - e^eps B`` between grid points); inf when the +inf mass alone exceeds delta."""
        constant, low_mass = self._constants(pessimistic)
        h = self.grid_step
        first = self.start * h
        if constant >= delta and pessimistic and constant > 0:
            return float("inf")
        # The answer is clamped at 0, so grid points below l = -h are not needed: the suffix
        # sums are computed from index i0 (loss <= -h when i0 > 0) on, which gives the same
        # values as over the whole window (suffix sums run from the top end). The walk gives
        # the first grid index j >= i0 where the curve A_j + constant - W_j is <= delta, with
        # A_j = sum_{k > j} m_k and W_j = sum_{k > j} m_k e^{-(l_k - l_j)}, and A, W at j - 1:
        # over the masses in the C++ core, or by a search over the band's closed forms.
        i0 = max(0, -self.start - 1)
        if self.spectral is not None:
            found = self.spectral.crossing(i0, constant, delta)
            if found is None:
                return float("inf")
            j, tail_mass, tail_weighted = found
            j_from = j - i0
        else:
            j_from, tail_mass, tail_weighted = _core.pld_delta_crossing(
                self.mass[i0:], constant, math.exp(-h), delta, pessimistic
            )
        if j_from < 0:
            return float("inf")  # the curve is non-increasing: no crossing below i0 either
        if i0 > 0 and j_from == 0:
            return 0.0  # delta(l_{i0}) <= delta with l_{i0} <= -h < 0
        j = i0 + j_from
        # Between l_{j-1} and l_j the curve is A - e^eps B; with B normalised at the left end
        # (anchor), eps = anchor + log((A - delta) / B).
        if j == 0:
            mass = np.maximum(self.mass, 0.0) if pessimistic else self.mass
            anchor = first
            a_sum = float(mass.sum()) + constant + low_mass
            shifted = np.exp(-(self.losses - first))  # e^{-(l_k - a)} <= 1, no division
            b_sum = float(np.dot(mass, shifted)) + low_mass
        else:
            anchor = (self.start + j - 1) * h
            a_sum = tail_mass + constant
            b_sum = tail_weighted
        if a_sum <= delta or b_sum <= 0:
            value = anchor
        else:
            value = anchor + float(np.log((a_sum - delta) / b_sum))
        return max(value, 0.0)

    def delta_curve(self, *, pessimistic: bool) -> tuple[np.ndarray, np.ndarray]:
        """(eps grid, delta bound at each grid point)."""
        mass, constant, _ = self._curve_terms(pessimistic)
        losses = self.losses
        tail_mass = np.concatenate((np.cumsum(mass[::-1])[::-1][1:], [0.0]))
        tail_weighted = _discounted_suffix(mass, self.grid_step)
        curve = np.clip(tail_mass + constant - tail_weighted, 0.0, 1.0)
        return losses, curve


def _discounted_suffix(mass: np.ndarray, grid_step: float) -> np.ndarray:
    """``W_j = sum_{k > j} m_k e^{-(k - j) h}`` by the recursion ``W_j = e^{-h} (m_{j+1} +
    W_{j+1})`` (a first-order linear filter run backwards): no ratio of underflowing exponentials,
    so it stays finite however wide the window is."""
    decay = math.exp(-grid_step)
    reversed_mass = mass[::-1]
    out = scipy.signal.lfilter([0.0, decay], [1.0, -decay], reversed_mass)
    return np.ascontiguousarray(out[::-1])


def chernoff_window(log_mgf_total: np.ndarray, log_tail: float) -> tuple[float, float]:
    """Losses (a, b) with P(S < a), P(S > b) <= e^{log_tail} by Chernoff's bound, given
    ``log_mgf_total[i] = log E[e^{t_i S}]`` for t in (+_CHERNOFF_T, -_CHERNOFF_T)."""
    k = _CHERNOFF_T.size
    upper = np.min((log_mgf_total[:k] - log_tail) / _CHERNOFF_T)
    lower = np.max((log_mgf_total[k:] - log_tail) / -_CHERNOFF_T)
    return float(lower), float(upper)


def chernoff_tails(log_mgf_total: np.ndarray, a: float, b: float) -> tuple[float, float]:
    """(bound on P(S < a), bound on P(S > b))."""
    k = _CHERNOFF_T.size
    above = np.exp(np.min(log_mgf_total[:k] - _CHERNOFF_T * b))
    below = np.exp(np.min(log_mgf_total[k:] + _CHERNOFF_T * a))
    return float(min(below, 1.0)), float(min(above, 1.0))


def chernoff_exponents() -> np.ndarray:
    return np.concatenate((_CHERNOFF_T, -_CHERNOFF_T))


def compose(
    plds: list[DiscretePLD],
    counts: list[int],
    *,
    log_tail: float,
    pessimistic: bool,
    spectra: dict[Any, LeafSpectrum] | None = None,
    keys: list[Any] | None = None,
) -> ComposedPLD:
    """The composition of ``counts[i]`` copies of ``plds[i]``, on a circle (a 2-3-5-smooth size,
    fast for pocketfft; the folding argument holds for any size) just wide
    enough for the Chernoff window at ``e^{log_tail}``.

    The spectrum of the composition is ``prod_i F_i^{c_i}`` with ``F_i`` the transform of PLD
    ``i``. With a spectrum cache (few distinct PLDs, incremental use) it is computed as
    ``exp(sum_i c_i log|F_i| + 1j sum_i c_i arg F_i)``: the modulus is formed first, and the phases
    and the complex exponential are evaluated only where it exceeds ``e^-800`` (far below the
    smallest double; every other entry is 0 in double precision either way), for a wide
    composition a small fraction of the circle. (log|F| is 0.5 log(|F|^2): exact where |F|^2
    does not underflow, and an entry below 1e-154 is dropped, far below the ~1e-16 accuracy of
    the composed masses.) ``spectra`` caches a :class:`LeafSpectrum` per
    PLD (``keys[i]`` names ``plds[i]``; its position by default), so that recomposing after one
    more step only costs pointwise work and one inverse FFT.

    Without a cache and with more than ``_TWO_LEVEL_FROM`` PLDs (a heterogeneous schedule), the
    composition is done in two levels, see :func:`_compose_two_level`; ``pessimistic`` says which
    side the PLDs round to, which decides how the first level's results are made into PLDs.
    """
    if spectra is None and len(plds) > _TWO_LEVEL_FROM:
        return _compose_two_level(plds, counts, log_tail=log_tail, pessimistic=pessimistic)
    window = _Window.of(plds, counts, log_tail)
    size = window.size
    leaf_keys = keys if keys is not None else list(range(len(plds)))
    leaf_spectra = parallel_map(
        lambda index: _leaf_spectrum(plds[index], size, spectra, leaf_keys[index], counts[index]),
        range(len(plds)),
    )
    if spectra is not None:
        for key, leaf in zip(leaf_keys, leaf_spectra):
            spectra[key] = leaf
    # Every |F_i| <= 1, so sum_i c_i log|F_i| > -800 needs c_i log|F_i| > -800 for each i:
    # logarithms are taken only where every factor passes that test (for a long composition a
    # small fraction of the circle). A leaf spectrum computed only below some frequency
    # (:func:`_pruned_reach`) is certified to fail the test above it, so the product is 0 there.
    reach = min(leaf.transform.size for leaf in leaf_spectra)
    candidates = np.ones(reach, dtype=bool)
    for count, leaf in zip(counts, leaf_spectra):
        candidates &= leaf.modulus_squared[:reach] > math.exp(-1600.0 / count)
    where = np.flatnonzero(candidates)
    log_modulus = np.zeros(where.size)
    for count, leaf in zip(counts, leaf_spectra):
        log_modulus += (0.5 * count) * np.log(leaf.modulus_squared[where])
    keep = log_modulus > -800.0
    kept = where[keep]
    phase = np.zeros(kept.size)
    for leaf, count in zip(leaf_spectra, counts):
        phase += count * leaf.phase_at(kept)
    spectrum = np.zeros(size // 2 + 1, dtype=complex)
    spectrum[kept] = np.exp(log_modulus[keep] + 1j * phase)
    # Every entry outside `kept` is exactly 0: the band ends at its last frequency.
    return _result_of_spectrum(window, spectrum, int(kept[-1]) + 1 if kept.size else 0)


#: Spectrum entries at most this large in modulus are dropped when a composition is held as a
#: band (:func:`_result_of_spectrum`): each moves every mass of the window by at most 2e-300 / n.
_NEGLIGIBLE_SPECTRUM = 1e-300


def _result_of_spectrum(window: _Window, spectrum: np.ndarray, band: int) -> ComposedPLD:
    """The composition whose real-FFT spectrum on the window's circle is ``spectrum``, every
    entry of which from ``band`` on is negligible: held as that band (no inverse transform) when
    it holds at most ``size / BAND_FRACTION`` frequencies, else dense."""
    if 0 < band <= window.size // BAND_FRACTION:
        return window.band_result(spectrum[:band])
    return window.result(inverse_transform(spectrum, window.size))


@dataclass(frozen=True)
class _Window:
    """The circle of a composition: ``size`` points from loss ``start * grid_step``, wide enough
    for the Chernoff window, and what is needed to turn the circular result into a
    :class:`ComposedPLD`."""

    start: int
    size: int
    shift: int  # sum_i c_i offset_i: index 0 of the circular result is loss shift * h
    support_low: int
    support_high: int
    log_mgf_total: np.ndarray
    log_finite: float  # log of the composed finite mass
    grid_step: float

    @classmethod
    def of(cls, plds: Sequence[DiscretePLD], counts: Sequence[int], log_tail: float) -> _Window:
        grid_step = plds[0].grid_step
        log_mgf_total = np.zeros(chernoff_exponents().size)
        support_low = support_high = 0
        log_finite = 0.0
        for pld, count in zip(plds, counts):
            log_mgf_total += count * pld.chernoff_log_mgf
            support_low += count * pld.offset
            support_high += count * (pld.offset + pld.mass.size - 1)
            log_finite += count * math.log1p(-pld.infinity_mass)
        a, b = chernoff_window(log_mgf_total, log_tail)
        start = max(int(np.floor(a / grid_step)), support_low)
        stop = min(int(np.ceil(b / grid_step)), support_high)
        size = _circle_size(max(stop - start + 1, 2))
        return cls(start, size, support_low, support_low, support_high, log_mgf_total, log_finite, grid_step)

    def result(self, circular: np.ndarray) -> ComposedPLD:
        """The :class:`ComposedPLD` of the circular composition ``circular`` (index 0 = loss
        ``shift * h``, where ``shift`` is the sum of the composed offsets)."""
        mass = np.roll(circular, self._rotation)
        return self._composed(dense=mass)

    def band_result(self, band: np.ndarray) -> ComposedPLD:
        """The :class:`ComposedPLD` of a circular composition whose real-FFT spectrum is
        ``band`` at frequencies 0 .. J-1 and 0 at every other frequency, held spectral. The roll
        of :meth:`result` by r points multiplies frequency f by ``w^{-f r}`` (its argument
        reduced modulo n in integers)."""
        turn = (np.arange(band.size, dtype=np.int64) * self._rotation) % self.size
        coefficients = band * np.exp((-2j * math.pi / self.size) * turn)
        return self._composed(spectral=BandSpectrum(coefficients, self.size, self.grid_step))

    @property
    def _rotation(self) -> int:
        """The roll that brings loss ``start * h`` to index 0 of the circular result."""
        return (self.shift - self.start) % self.size

    def _composed(self, **masses: Any) -> ComposedPLD:
        window_low = self.start * self.grid_step
        window_high = (self.start + self.size - 1) * self.grid_step
        below, above = chernoff_tails(self.log_mgf_total, window_low, window_high)
        if self.start <= self.support_low:
            below = 0.0
        if self.start + self.size - 1 >= self.support_high:
            above = 0.0
        return ComposedPLD(
            start=self.start,
            **masses,
            infinity_mass=float(-np.expm1(self.log_finite)),
            above=above,
            below=below,
            grid_step=self.grid_step,
        )


def _compose_by_products(
    plds: Sequence[DiscretePLD], counts: Sequence[int], log_tail: float, *, parallel: bool
) -> ComposedPLD:
    """The composition with the spectrum ``prod_i F_i^{c_i}`` formed by complex multiplication
    (integer powers by repeated squaring). Every factor has modulus at most its mass (<= 1 up to
    round-off, or the small excess of a first-level result), so partial products never overflow,
    and an entry that underflows is below every digit of the inverse transform. With
    ``parallel`` the factors are split into ``_PRODUCT_CHUNKS`` chunks multiplied on the worker
    threads (a fixed number, so the rounding does not depend on the number of threads)."""
    window = _Window.of(plds, counts, log_tail)
    size = window.size

    def product(chunk: range) -> np.ndarray:
        out = np.ones(size // 2 + 1, dtype=complex)
        for index in chunk:
            transform = forward_transform(plds[index].folded(size), size)
            out *= _integer_power(transform, counts[index])
        return out

    chunks = _chunks(len(plds), _PRODUCT_CHUNKS if parallel else 1)
    partial = parallel_map(product, chunks, threshold=2)
    spectrum = partial[0]
    for other in partial[1:]:
        spectrum *= other
    significant = np.flatnonzero(np.abs(spectrum) > _NEGLIGIBLE_SPECTRUM)
    return _result_of_spectrum(window, spectrum, int(significant[-1]) + 1 if significant.size else 0)


def _integer_power(values: np.ndarray, exponent: int) -> np.ndarray:
    """``values ** exponent`` elementwise for an integer ``exponent >= 1``, by repeated squaring
    (about 2 log2(exponent) complex products)."""
    result: np.ndarray | None = None
    base = values
    while True:
        if exponent & 1:
            result = base.copy() if result is None else result * base
        exponent >>= 1
        if not exponent:
            assert result is not None
            return result
        base = base * base


def _chunks(length: int, parts: int) -> list[range]:
    bounds = np.linspace(0, length, min(parts, length) + 1).astype(int)
    return [range(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _compose_two_level(
    plds: list[DiscretePLD],
    counts: list[int],
    *,
    log_tail: float,
    pessimistic: bool,
    group_log_tail: float | None = None,
) -> ComposedPLD:
    """A composition of many distinct PLDs in two levels: consecutive groups of about
    ``_GROUP_SIZE`` PLDs (the caller's order puts similar ones together) are composed on their
    own, narrower circles, and the group results are composed on the full one. The per-PLD
    transforms are then of the group's circle, not the whole composition's.

    Each group result is turned into a PLD that keeps the bound on its side by :func:`_as_pld`
    (whose docstring gives the argument); the optimistic side's excess masses ``e_g`` compose
    to at most ``prod_g (1 + e_g) - 1`` (``ComposedPLD.excess``).

    The groups' Chernoff windows are set at ``e^{log_tail} / groups`` (unless ``group_log_tail``
    is given), so the extra +inf mass of the pessimistic side is at most the tail budget in
    total."""
    groups = max(2, round(len(plds) / _GROUP_SIZE))
    if group_log_tail is None:
        group_log_tail = log_tail - math.log(groups)

    def first_level(chunk: range) -> tuple[DiscretePLD, float, float]:
        part = _compose_by_products(
            [plds[i] for i in chunk], [counts[i] for i in chunk], group_log_tail, parallel=False
        )
        pld, excess, clipped = _as_pld(part, pessimistic)
        pld.chernoff_log_mgf  # noqa: B018 - computed here, on the worker thread
        return pld, excess, clipped

    parts = parallel_map(first_level, _chunks(len(plds), groups), threshold=2)
    result = _compose_by_products([p for p, _, _ in parts], [1] * len(parts), log_tail, parallel=True)
    excess = math.expm1(sum(math.log1p(e) for _, e, _ in parts))
    inner_roundoff = sum(c for _, _, c in parts)
    return dataclasses.replace(result, excess=excess, inner_roundoff=inner_roundoff)


def _as_pld(part: ComposedPLD, pessimistic: bool) -> tuple[DiscretePLD, float, float]:
    """A composition turned into a PLD that keeps the bound on its side, to be composed further:
    (the PLD, its excess mass ``e``, the negative round-off clipped).

    * pessimistic: the circular window holds the linear composition plus non-negative aliased
      mass; the mass below the window (at most ``below``, Chernoff) is added at the window's
      bottom point and the mass above it (at most ``above``) at +inf, and negative round-off is
      clipped to 0. The result is a measure that dominates the composition pointwise after
      moving mass only to larger losses, so every delta(eps) of every composition it enters can
      only grow (the hockey-stick integrand is non-negative and non-decreasing in the loss;
      convolution of non-negative measures is monotone; Chernoff's bound holds for any
      non-negative measure). ``e = 0``.
    * optimistic: the window is kept as it is (clipped at 0) and the masses outside it are
      dropped (which can only lower delta); the window exceeds the composition's restriction to
      it by its aliased mass plus the clipped round-off, at most ``e = above + below + clipped``.
      Writing the measure as (its true part) + (an excess of mass <= e), a composition of such
      measures exceeds the composition of the true parts by a measure of mass at most
      ``prod (1 + e_i) - 1``; as the hockey-stick integrand is in [0, 1], subtracting that
      (``ComposedPLD.excess``) keeps every delta a lower bound."""
    mass = part.mass
    clipped = float(-mass[mass < 0].sum())
    mass = np.maximum(mass, 0.0)
    if pessimistic:
        mass[0] += part.below
        infinity = min(part.infinity_mass + part.above, 1.0)
        return DiscretePLD(part.start, mass, infinity, part.grid_step), 0.0, clipped
    pld = DiscretePLD(part.start, mass, part.infinity_mass, part.grid_step)
    return pld, part.above + part.below + clipped, clipped


def coarsened(pld: DiscretePLD, factor: int, *, pessimistic: bool) -> DiscretePLD:
    """``pld`` moved onto the grid of step ``factor * grid_step`` (grid points ``J factor h``),
    on the side that keeps its bound (the arguments of ``pld.hpp``, which hold for any
    non-negative measure on the losses, not only for a mechanism's PLD):

    * pessimistic: every atom at loss ``l = J H + r h`` (``0 <= r < factor``) is spread onto
      ``J H`` and ``(J + 1) H`` keeping its mass and its mass times ``e^{-l}`` (weight
      ``(1 - e^{-r h}) / (1 - e^{-H})`` at the upper point): a mean-preserving spread of
      ``Y = e^{-L}`` ("connect the dots"), so every delta(eps) of every composition can only
      grow;
    * optimistic: the mean-preserving contraction of :cpp:func:`coarsen_optimistic` (C++ core),
      which can only lower every delta(eps).

    Both shift the loss by O(H^2) per atom. The infinity mass stays where it is."""
    if factor == 1:
        return pld
    if not pessimistic:
        offset, mass = _core.pld_coarsen_optimistic(pld.mass, pld.offset, pld.grid_step, factor)
        return DiscretePLD(int(offset), mass, pld.infinity_mass, pld.grid_step * factor)
    lowest = pld.offset // factor
    lead = pld.offset - lowest * factor
    rows = -(-(lead + pld.mass.size) // factor)
    padded = np.zeros(rows * factor)
    padded[lead : lead + pld.mass.size] = pld.mass
    by_row = padded.reshape(rows, factor)
    upper_weight = np.expm1(-np.arange(factor) * pld.grid_step) / math.expm1(-factor * pld.grid_step)
    mass = np.zeros(rows + 1)
    mass[:rows] = by_row @ (1.0 - upper_weight)
    mass[1:] += by_row @ upper_weight
    return DiscretePLD(lowest, mass, pld.infinity_mass, pld.grid_step * factor)


def compose_staged(
    plds: Sequence[DiscretePLD],
    counts: Sequence[int],
    *,
    blocks: int,
    factor: int,
    log_tail: float,
    pessimistic: bool,
) -> ComposedPLD:
    """The composition of ``counts[i]`` copies of ``plds[i]`` in two stages on two grids: a block
    of ``counts[i] // blocks`` copies of each PLD (and a remainder block of the
    ``counts[i] % blocks`` left over) is composed on the PLDs' fine grid h, turned into a PLD on
    its side (:func:`_as_pld`), coarsened to the grid ``H = factor h`` (:func:`coarsened`), and
    ``blocks`` copies of the block (and the remainder block once) are composed on that grid.

    Why: a rounding onto a grid of step h errs by O(h^2) per composed PLD against a loss whose
    variance is that PLD's, so the grid a composition needs scales with the spread of what is
    composed. A block of T1 = T / blocks steps has sqrt(T1) times a step's spread, so its
    coarsening by a factor well below sqrt(T1) adds little error, and the circles are of about
    sqrt(T1) s / h and sqrt(T) s / H points (s: a step's loss spread) instead of one of
    sqrt(T) s / h, when the truncation tails do not set the windows (see :func:`staging_pays`).

    Bounds: every stage keeps its side (the coarsening by its mean-preserving spread or
    contraction; the block's window by :func:`_as_pld`). Each block's Chernoff window is set at
    ``e^{log_tail} / (2 (blocks + 1))``, so the +inf mass its truncation adds over all copies is at
    most half the tail budget, and the second stage's window at the other half. On the
    optimistic side the blocks' excess masses compose to at most ``(1 + e_A)^blocks (1 + e_B) - 1``
    (``ComposedPLD.excess``)."""
    if blocks < 2 or factor < 1:
        raise ValueError("compose_staged needs blocks >= 2 and factor >= 1")
    block_log_tail = _block_log_tail(log_tail, blocks)
    block_counts = [count // blocks for count in counts]
    remainder_counts = [count - blocks * per_block for count, per_block in zip(counts, block_counts)]
    parts: list[DiscretePLD] = []
    part_counts: list[int] = []
    log_excess = 0.0
    inner_roundoff = 0.0
    for copies, per_leaf in ((blocks, block_counts), (1, remainder_counts)):
        members = [i for i, count in enumerate(per_leaf) if count > 0]
        if not members:
            continue
        block = _compose_by_products(
            [plds[i] for i in members], [per_leaf[i] for i in members], block_log_tail,
            parallel=False,
        )
        pld, excess, clipped = _as_pld(block, pessimistic)
        parts.append(coarsened(pld, factor, pessimistic=pessimistic))
        part_counts.append(copies)
        log_excess += copies * math.log1p(excess)
        inner_roundoff += copies * clipped
    result = _compose_by_products(parts, part_counts, log_tail - math.log(2.0), parallel=False)
    return dataclasses.replace(result, excess=math.expm1(log_excess), inner_roundoff=inner_roundoff)


def _block_log_tail(log_tail: float, blocks: int) -> float:
    return log_tail - math.log(2.0 * (blocks + 1))


def staging_pays(
    plds: Sequence[DiscretePLD], counts: Sequence[int], *, blocks: int, factor: int, log_tail: float
) -> bool:
    """Whether :func:`compose_staged` is predicted to be cheaper than one composition on the
    PLDs' grid, from the circle sizes of the Chernoff windows (microseconds to compute): the one
    stage costs about three transforms' worth of its circle (n0 points: a forward and an inverse
    transform, and the pointwise logarithms, phases and exponentials of :func:`compose`), the
    staged one about four transforms of the block circle (n1: the block and the remainder
    block) and three of the coarse one (n0 / factor). Staging is used when that estimate is
    below 0.9 times the one-stage one (whose leaf transforms, where :func:`_pruned_reach`
    prunes all of them, count ``_PRUNED_COST`` chirp lengths each, and no inverse).
    Where few composed steps have far tails (rare records
    with little noise), the block's window is set by them rather than by its spread, n1 is
    close to n0 and staging does not pay. (A one-stage result held as a band skips the inverse
    transform, so the estimate overstates one stage there; bench/results/pld_staging.txt finds
    the two routes within 0.8-1.2x of each other at 4e4-1e5 steps, and staging 3-7x faster at
    1e6-1e7.)"""
    whole = _Window.of(plds, counts, log_tail).size
    block_counts = [max(count // blocks, 1) for count in counts]
    block = _Window.of(plds, block_counts, _block_log_tail(log_tail, blocks)).size
    staged = 4 * block + 3 * whole / factor
    reaches = [_pruned_reach(pld, whole, count) for pld, count in zip(plds, counts)]
    if all(reach is not None for reach in reaches):
        # One stage with pruned leaf transforms (:func:`_pruned_reach`): _PRUNED_COST chirp
        # lengths each, and (the composition then held as a band) no inverse.
        chirps = [scipy.fft.next_fast_len(pld.mass.size + reach - 1) for pld, reach in zip(plds, reaches)]
        return staged < 0.9 * _PRUNED_COST * sum(chirps)
    return staged < 0.9 * 3 * whole


def _circle_size(needed: int) -> int:
    """The smallest size >= ``needed`` of the form m 2^k, m in {8, 9, 10, 12, 15} (fast 2-3-5
    FFT sizes, at most 25% above ``needed``, few enough that cached spectra of an incremental run
    are reused over many steps)."""
    if needed <= 16:
        return 16
    base = 1 << (int(needed - 1).bit_length() - 4)  # needed in (8 base, 16 base]
    for m in (9, 10, 12, 15, 16):
        if m * base >= needed:
            return m * base
    raise AssertionError("unreachable")


def _leaf_spectrum(
    pld: DiscretePLD,
    size: int,
    spectra: dict[Any, LeafSpectrum] | None,
    key: Any,
    count: int,
) -> LeafSpectrum:
    """The spectrum of ``pld`` folded onto a circle of ``size`` points, for a composition of
    ``count`` copies: at every frequency, or only at the frequencies below
    :func:`_pruned_reach` (by :func:`_pruned_transform`) where that is certified enough and
    cheaper. From ``spectra`` when it holds one of that size that reaches far enough."""
    reach = _pruned_reach(pld, size, count)
    needed = size // 2 + 1 if reach is None else reach
    if spectra is not None:
        hit = spectra.get(key)
        if hit is not None and hit.size == size and hit.transform.size >= needed:
            return hit
    if reach is None:
        transform = forward_transform(pld.folded(size), size)
    else:
        transform = _pruned_transform(pld.mass, size, reach)
    with np.errstate(under="ignore"):
        modulus_squared = transform.real * transform.real + transform.imag * transform.imag
    return LeafSpectrum(size, transform, modulus_squared)


def _pruned_reach(pld: DiscretePLD, size: int, count: int) -> int | None:
    """A frequency K such that ``|F_k|^count <= e^-800`` at every frequency ``K <= k <= size /
    2`` of the circle, where F is the transform of ``pld``'s masses, when such a K is small
    enough for :func:`_pruned_transform` to be cheaper than the whole transform; else None.

    The bound (summation by parts): with ``m_{-1} = m_S = 0``, ``(1 - e^{-i w}) F(w) = sum_{s=0}^{S}
    (m_s - m_{s-1}) e^{-i w s}``, so ``|F(w)| <= V / (2 |sin(w / 2)|)`` with V the total variation
    of the masses; ``sin(pi k / size)`` grows on ``[0, size / 2]``, so ``V / (2 sin(pi K / size))
    <= e^{-800 / count}`` bounds every frequency from K on. Those entries are ones that
    :func:`compose` sets to 0 in any case (it drops every product below e^-800), so pruning
    changes no kept frequency; the masses must fit the circle unfolded."""
    mass = pld.mass
    if mass.size > size // 2 or count < 1:
        return None
    variation = float(np.abs(np.diff(mass, prepend=0.0, append=0.0)).sum()) * (1.0 + 1e-12)
    if variation <= 0.0 or math.log(0.5 * variation) + 800.0 / count >= 0.0:
        return None
    sine = 0.5 * variation * math.exp(800.0 / count)
    reach = math.ceil(size / math.pi * math.asin(sine)) + 1
    if reach > size // 2:
        return None
    length = scipy.fft.next_fast_len(mass.size + reach - 1)
    if _PRUNED_COST * length * math.log2(length) >= size * math.log2(size):
        return None
    return reach


#: Cost of a pruned transform of chirp length L against a whole one of the circle (n points):
#: ``_PRUNED_COST L log L`` against ``n log n``. Three complex transforms of L points (each about
#: twice a real one) and the chirps, against one real transform that runs on two threads from
#: ``_SPLIT_FROM`` points on: measured on this project's 2-core machine, L = 270k took 30 ms
#: against 26 ms for n = 2.36M (ratio of L log L to n log n: 0.097), L = 33k 1.8 ms against
#: 2.0 ms for n = 492k (0.054).
_PRUNED_COST = 12.0


def _pruned_transform(mass: np.ndarray, size: int, reach: int) -> np.ndarray:
    """``F_k = sum_{s<S} m_s e^{-2 pi i s k / size}`` for ``k < reach``: the first ``reach``
    entries of ``rfft(m, size)``, by Bluestein's chirp transform (``s k = (s^2 + k^2 - (k -
    s)^2) / 2``, so F is a chirp times the convolution of ``m_s c_s`` with ``conj(c_j)``, ``c_j =
    e^{-i pi j^2 / size}``), computed by FFTs of about ``S + reach`` points instead of
    ``size``. Each chirp angle is ``pi (j^2 mod 2 size) / size`` with the reduction done in
    integers, so it is correct to an ulp however large j^2 is (a chirp formed from the
    unreduced j^2 would lose digits in proportion to it)."""
    length = mass.size
    fft_size = scipy.fft.next_fast_len(length + reach - 1)
    lags = np.arange(max(length, reach), dtype=np.int64)  # c_{-j} = c_j
    chirp = np.exp((-1j * math.pi / size) * ((lags * lags) % (2 * size)))
    weighted = np.zeros(fft_size, dtype=complex)
    weighted[:length] = mass * chirp[:length]
    kernel = np.zeros(fft_size, dtype=complex)  # conj(c_j) at j mod fft_size
    kernel[:reach] = np.conj(chirp[:reach])
    if length > 1:
        kernel[fft_size - (length - 1) :] = np.conj(chirp[length - 1 : 0 : -1])
    convolution = scipy.fft.ifft(scipy.fft.fft(weighted) * scipy.fft.fft(kernel))
    return chirp[:reach] * convolution[:reach]


#: Above this many distinct PLDs (without a spectrum cache) :func:`compose` works in two levels.
_TWO_LEVEL_FROM = 64
#: Number of PLDs per first-level group of a two-level composition.
_GROUP_SIZE = 32
#: Chunks of a parallel product of spectra.
_PRODUCT_CHUNKS = 4

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")
#: Below this many items, :func:`parallel_map` stays on the calling thread.
_PARALLEL_FROM = 16
_POOL: ThreadPoolExecutor | None = None
_WORKERS = os.cpu_count() or 1
_POOL_PREFIX = "dpsharp-pld"


def parallel_map(
    function: Callable[[_Item], _Result], items: Sequence[_Item], *, threshold: int = _PARALLEL_FROM
) -> list[_Result]:
    """``[function(item) for item in items]``, on a pool of threads (one per CPU) when there are
    at least ``threshold`` items. The per-leaf work of a heterogeneous composition (the C++ discretisation and
    pocketfft's transforms) releases the GIL, so the threads run in parallel; results are in the
    order of ``items`` and do not depend on the number of threads."""
    if len(items) < threshold or _WORKERS < 2:
        return [function(item) for item in items]
    return list(_pool().map(function, items))


def _in_pool_thread() -> bool:
    return threading.current_thread().name.startswith(_POOL_PREFIX)


def threads_for_caller() -> int:
    """Threads a C++ kernel called from this thread may use: one on a pool thread (the pool's
    other threads are busy with work of their own), else one per CPU."""
    return 1 if _in_pool_thread() else _WORKERS


def _split_threads() -> int:
    return min(threads_for_caller(), 2)


def _on_two_threads(
    function: Callable[[_Item], _Result], first: _Item, second: _Item
) -> tuple[_Result, _Result]:
    """``(function(first), function(second))``, the second on a pool thread while the calling
    thread computes the first, unless the caller is itself a pool thread (then both in turn:
    a pool thread waiting on the pool could wait forever) or there is one CPU."""
    if _WORKERS < 2 or _in_pool_thread():
        return function(first), function(second)
    pending = _pool().submit(function, second)
    return function(first), pending.result()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix=_POOL_PREFIX)
    return _POOL


def _forget_pool_after_fork() -> None:
    """A forked child inherits the pool object but not its threads (it would wait on them
    forever): it starts its own pool on first use."""
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)
