"""A composed PLD held by its spectrum in a band of low frequencies (the query side of
:func:`dpsharp.accountants._pld_numerics.compose`).

The composition of T copies of a PLD has the spectrum ``F^T``; for a long composition this is
below ``e^-800`` (zero in double precision, and dropped by ``compose``) everywhere except in a
band of low frequencies ``|f| < J``: the composed loss is spread over thousands of grid points,
so its masses are a smooth (band-limited) sequence. On the settings of bench/bench_pld.py, J is
about 100 to 750 frequencies on circles of 15,000 to 2.4 million points
(bench/results/pld_band.txt). The masses of the window are then the trigonometric polynomial

    m_k = (1/n) [D_0 + 2 Re sum_{f=1}^{J-1} D_f w^{f k}],   w = e^{2 pi i / n},  0 <= k < n

(``D_f``: the composed spectrum with the window's rotation folded in), and the two suffix sums a
hockey-stick query needs have closed forms (finite geometric series): with rho = e^{-h},

    A_K = sum_{k > K} m_k
        = (1/n) [D_0 (n - 1 - K) + 2 Re sum_f D_f (w^{f (K+1)} - 1) / (1 - w^f)],
    W_K = sum_{k > K} m_k rho^{k - K}
        = (1/n) [D_0 rho (1 - rho^{n-1-K}) / (1 - rho)
                 + 2 Re sum_f D_f (rho w^{f (K+1)} - rho^{n-K}) / (1 - rho w^f)],

so delta at a grid point is ``A_K - W_K`` (plus the constants of the bound) in O(J) operations,
and the crossing of ``delta`` by bisection over K in O(J log n) (both in the C++ core,
``pld_band.cpp``): the inverse transform of the circle (and the O(n) passes over its masses) is
not needed for an epsilon or delta query. The masses are formed (one inverse transform of
:meth:`BandSpectrum.full_spectrum`) only for the queries that need the whole curve (trade-off,
mu-GDP) and for coarsening a staged composition's blocks.

Floating point: the sums are evaluated in double precision with pairwise summation; the
error of one evaluation of ``A_K - c W_K`` (0 <= c < e^h: a query at epsilon between grid
points K and K + 1 discounts W_K by ``e^{eps - l_K}``) is bounded by
:attr:`BandSpectrum.error` = (log2 J + 72) u S e^h, where u = 2^-53 and S bounds the sum of
the moduli of the terms (``|D_0|`` twice and ``(2/n) |D_f| (2 / |1 - w^f| + 2 / |1 - rho
w^f|)``). The 72 counts, relative to each term's share of S: 52 u for the work of one term, the
factors ``1 / (1 - w^f)`` and ``1 / (1 - rho w^f)`` formed in NumPy (angle, sine and versine,
the complex reciprocal and the product with D_f: at most about 23 u with sines within 2 ulp)
and ``rho`` (a few u more), the phase ``(1 - cos phi, sin phi)`` in the core (at most 11.3 u;
``w^{f(K+1)}`` is formed from ``f (K+1) mod n`` in integers, so its argument is exact before
the final roundings) and its combination with ``rho`` for W (5 u), the two products and the
difference (2 u), about 50 u in all; 12 (+ log2 J) for the pairwise sum (blocks of 16 summed
in order, then halving); 8 u for the operations after the closed forms (the product by c, the
difference). The error of the coefficients themselves (the leaf transforms, the T-th
power and the rotation onto the window) has the proven bound of
:mod:`dpsharp.accountants._pld_numerics` (``ComposedPLD.noise``), which a dense composition has
too; the two are added on each side (tests/test_pld_roundoff.py checks them against exact
convolutions).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from dpsharp._native import core as _core
from dpsharp._rounding import UNIT_ROUNDOFF

__all__ = ["BAND_FRACTION", "BandSpectrum", "CrossingHint"]

#: A composition is kept in spectral form when its band holds at most size / BAND_FRACTION
#: frequencies: a query then costs about log2(n) evaluations of J terms (a query after every
#: step 2 to 5, from the previous crossing: :meth:`BandSpectrum.crossing`), below the inverse
#: transform of the circle (and the passes over its masses) that it replaces. (64 until the
#: hinted crossing: 16 moves steps ~600 to 1000 of q = 0.01, sigma = 1 to the band; a query
#: after every step measured 0.7-0.9 ms there against 1.1-2.1 ms dense, loaded machine.)
BAND_FRACTION = 16

#: Grid points that :meth:`BandSpectrum.crossing` walks from its hint before it bisects.
_WALK = 8


def remember_read_only(cache: dict, lock: threading.Lock, key: object,
                       arrays: tuple[np.ndarray, ...], limit: int = 8) -> tuple[np.ndarray, ...]:
    """Make ``arrays`` read-only and keep them in ``cache`` under ``key``, dropping the oldest
    entries beyond ``limit``; returns ``arrays``. The small caches of pure functions of a grid
    that an incremental run asks for at every step, shared between threads."""
    for array in arrays:
        array.flags.writeable = False
    with lock:
        while len(cache) >= limit:
            cache.pop(next(iter(cache)), None)
        cache[key] = arrays
    return arrays


def _factors(size: int, grid_step: float, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``1 / (1 - w^f)``, ``1 / (1 - rho w^f)`` and the sum of their moduli at ``f = 1 ..
    length - 1``: functions of the circle, the grid and f only (each entry computed on its own,
    so a prefix of a longer computation holds the same values), kept for the last few circles
    (an incremental run asks for the same circle at every step)."""
    key = (size, grid_step)
    hit = _FACTORS.get(key)
    if hit is None or hit[0].size < length - 1:
        frequencies = np.arange(1, max(length, 2 * (hit[0].size + 1) if hit else length),
                                dtype=np.int64)
        frequencies = frequencies[frequencies <= size // 2]
        half_angle = (math.pi / size) * frequencies
        # 1 - w^f = 2 sin^2(theta/2) - i sin(theta) and 1 - rho w^f = (1 - rho) + 2 rho
        # sin^2(theta/2) - i rho sin(theta): no cancellation in the real parts (1 - cos(theta)
        # is ~1e-12 at theta ~ 1e-6, where forming it from cos would lose 4 of 16 digits).
        versine = 2.0 * np.sin(half_angle) ** 2
        sine = np.sin(2.0 * half_angle)
        decay = math.exp(-grid_step)  # rho
        plain = 1.0 / (versine - 1j * sine)
        discounted = 1.0 / ((-math.expm1(-grid_step) + decay * versine) - 1j * (decay * sine))
        hit = remember_read_only(_FACTORS, _FACTORS_LOCK, key,
                                 (plain, discounted, np.abs(plain) + np.abs(discounted)))
    count = length - 1
    return hit[0][:count], hit[1][:count], hit[2][:count]


_FACTORS: dict[tuple[int, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
_FACTORS_LOCK = threading.Lock()


class CrossingHint:
    """Where a query's crossing was last found (an absolute grid index: loss ``index * h``), for
    the next query of the same kind on the next composition of a run (one more step moves it
    by a few grid points): :meth:`BandSpectrum.crossing` looks there first."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: int | None = None


class BandSpectrum:
    """The masses ``m_k`` (``0 <= k < size``) of a composition's window, held as the coefficients
    ``D_0 .. D_{J-1}`` of their real trigonometric polynomial (see the module docstring)."""

    def __init__(self, coefficients: np.ndarray, size: int, grid_step: float) -> None:
        if coefficients.size < 1 or 2 * coefficients.size > size:
            raise ValueError(
                f"a band of {coefficients.size} frequencies does not fit a circle of {size}"
            )
        self.coefficients = coefficients
        self.size = size
        plain, discounted, factor_moduli = _factors(size, grid_step, coefficients.size)
        total = float(coefficients[0].real)  # D_0: the mass of the window
        rest = coefficients[1:]
        # P_f = D_f / (1 - w^f) and Q_f = D_f / (1 - rho w^f), as (re, im) pairs for the C++ core.
        self._terms = (
            np.ascontiguousarray(rest * plain).view(np.float64),
            np.ascontiguousarray(rest * discounted).view(np.float64),
            total,
            size,
            grid_step,
        )
        # S of the error bound: |D_0| (for A) + |D_0| (for W)
        #   + (2/n) |D_f| (2 |1/(1-w^f)| + 2 |1/(1-rho w^f)|)
        moduli = np.abs(rest) * factor_moduli
        scale = 2.0 * abs(total) + (4.0 / size) * float(moduli.sum())
        #: S, which also bounds |A_K| and |W_K| at every K (each is a sum of some of its terms)
        self.scale = scale
        #: the bound on one evaluation of A_K - c W_K, 0 <= c < e^h (the module docstring)
        self.error = (
            (math.log2(max(coefficients.size, 2)) + 72.0) * UNIT_ROUNDOFF * scale
            * math.exp(grid_step)
        )

    def suffix_sums(self, index: int) -> tuple[float, float]:
        """``(A_K, W_K)`` at ``K = index`` (``-1 <= K < size``): the mass above grid point K and
        that mass discounted by ``e^{-(l_k - l_K)}`` (C++ core: ``pld.hpp``, band_suffix_sums)."""
        return _core.pld_band_suffix_sums(*self._terms, index)

    def full_spectrum(self) -> np.ndarray:
        """The real-FFT spectrum of the window's masses (the band, then zeros): its inverse real
        transform of ``size`` points gives the masses."""
        spectrum = np.zeros(self.size // 2 + 1, dtype=complex)
        spectrum[: self.coefficients.size] = self.coefficients
        return spectrum

    def crossing(
        self,
        first: int,
        constant: float,
        delta: float,
        *,
        hint: int | None = None,
        margin: float = math.inf,
    ) -> tuple[int, float, float] | None:
        """The first grid index ``j >= first`` at which ``A_j + constant - W_j <= delta`` (a
        non-increasing curve: the hockey-stick divergence at the grid points), with ``(A, W)`` at
        ``j - 1``, by bisection in the C++ core (about log2(n) evaluations of the closed forms);
        None when even the last point is above ``delta``; ``(first, nan, nan)`` when the curve is
        already at most ``delta`` at ``first``.

        With ``hint`` (a grid index, e.g. where the previous query of a run crossed) and
        ``margin`` (a bound on ``|c_K - e_K|`` at every K, ``c_K`` the computed curve and ``e_K``
        a non-increasing one, e.g. the curve of the exact composition), the crossing is looked
        for next to the hint first (:meth:`_near`), in a few evaluations; the answer is the
        bisection's, bit for bit, or the bisection is run."""
        if hint is not None and margin < math.inf:
            near = self._near(first, constant, delta, hint, margin)
            if near is not None:
                return near
        index, mass, weighted = _core.pld_band_crossing(*self._terms, first, constant, delta)
        if index < 0:
            return None
        return int(index), float(mass), float(weighted)

    def _near(
        self, first: int, constant: float, delta: float, hint: int, margin: float
    ) -> tuple[int, float, float] | None:
        """The bisection's answer of :meth:`crossing` found by a walk of at most ``_WALK`` grid
        points from ``hint``, or None (then the bisection decides).

        The walk stops at j with ``c_{j-1} > delta >= c_j``, c the curve computed as the C++
        bisection computes it (``A + constant - W`` from the same evaluator, the same
        floating-point operations). It is the bisection's answer when ``c_{j-1} - delta > 2 m``
        and ``delta - c_j > 2 m`` (m = ``margin``, plus the rounding of the two additions,
        at most 4 u (|A| + |constant| + |W|) <= 4 u (2 S + |constant|)) and ``first < j``:
        for every K <= j - 1, ``c_K >= e_K - m >= e_{j-1} - m >= c_{j-1} - 2 m > delta``, and
        for every K >= j, ``c_K <= e_K + m <= e_j + m <= c_j + 2 m < delta`` (e non-increasing),
        so every comparison of the bisection (at ``first``, then at its midpoints) goes the
        way it goes for the walk's j, and the bisection ends with high = j, low = j - 1, with
        (A, W) at j - 1 evaluated by the same code at the same index: the same floats."""
        last = self.size - 1
        gap = 2.0 * (margin + 4.0 * UNIT_ROUNDOFF * (2.0 * self.scale + abs(constant)))
        curve: dict[int, tuple[float, float, float]] = {}

        def at(index: int) -> tuple[float, float, float]:
            hit = curve.get(index)
            if hit is None:
                mass, weighted = _core.pld_band_suffix_sums(*self._terms, index)
                hit = curve[index] = (mass + constant - weighted, mass, weighted)
            return hit

        j = min(max(hint, first + 1), last)
        if j <= first:
            return None
        for _ in range(_WALK):
            if at(j)[0] > delta:  # the crossing lies above j
                if j >= last:
                    return None
                j += 1
            elif at(j - 1)[0] <= delta:  # ... or below it
                if j - 1 <= first:
                    return None
                j -= 1
            else:
                below, mass, weighted = at(j - 1)
                if below - delta > gap and delta - at(j)[0] > gap:
                    return j, mass, weighted
                return None
        return None
