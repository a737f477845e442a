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
  P(S < a)`` from below, in exact arithmetic; the floating-point error of every step is bounded
  a priori below and added to the upper, subtracted from the lower delta (``ComposedPLD.noise``).

Round-off: a proof
------------------

Model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed. 2002, Section 2.2):
every real operation returns ``(x op y)(1 + d)``, ``|d| <= u = 2^-53``; ``gamma_k = k u / (1 -
k u)``; a complex product errs by at most ``sqrt(2) gamma_2`` relative (Lemma 3.5), a complex sum
by ``u``. One assumption beyond the model: ``std::cos`` and ``std::sin`` are within 2 ulp on
``[0, pi / 4]`` (glibc documents at most 1 ulp). The stored masses of the leaf PLDs are the exact
input (their own rounding in the discretisation is outside this bound, see ``pld.hpp``).

1. *Leaf transforms, componentwise.* The complex transform of ``P = m 2^k`` points (m odd, at
   most 15; C++ ``pld_transforms.cpp``) is a stage of direct DFTs of length m on the decimated
   sequences, then k radix-2 decimation-in-time stages (computed block by block and two stages
   per pass, which reorders independent operations only). Every twiddle is a ``twiddle_at``
   value (angle reduced to ``[0, pi / 4]`` in integers, then fl(fl(2 pi r) / n): within
   ``0.79 gamma_3``, plus 2 ulp of cos and sin: ``mu = 10 u``) times an exact power of -i.
   Each computed stage is the exact one with coefficients perturbed entrywise, ``|dA| <= eta
   |A|``: ``eta_0 = (1 + mu)(1 + sqrt(2) gamma_2)(1 + gamma_{m-1}) - 1`` (a recursive sum of m
   products), ``eta_2 = (1 + mu)(1 + sqrt(2) gamma_2)(1 + u) - 1`` (``x + w y``). So ``|Z^ -
   Z| <= ((1 + eta_0)(1 + eta_2)^k - 1) |A_k| ... |A_0| |z|`` (Lemma 3.8). Every row of
   ``|A_l|`` holds exactly ``r_l`` entries of modulus 1 (r = m, then 2), so every row of the
   product sums to ``m 2^k = P``, while the product dominates ``|DFT_P|``, whose P entries per
   row are 1: every entry of the product is 1, and ``|Z^_f - Z_f| <= c_P ||z||_1`` at every
   frequency. :func:`certified_forward` of real x on n points is that transform of x itself
   (P = n, ``c_F = c_n``; through a complex transform of n / 2 points, as the inverse below,
   the unpacking would add the errors of two entries and up to double the bound)
   (:func:`forward_error`), with two savings that keep the bound. On a real input the first
   stage forms each term ``c x`` as the two real products ``(c_re x, c_im x)``, the values of
   the complex product with an imaginary part 0. And each stage computes only the lower half,
   entries ``0 .. L/2``, of its partial transforms of length L (the decimated subsequences are
   real, so ``Z_{L-f} = conj Z_f``): column j of a stage of half-length H gives ``Z_j`` and
   ``Z_{j+H}``, stored as ``conj Z^_{j+H}`` for ``Z_{H-j}``, and reads only the lower halves of
   its inputs (j <= H/2). By induction every stored entry is ``sum_s (a_fs + d_fs) z_s`` with
   ``|d_fs| <= c_l`` (``c_l`` the bound after l stages, the entries of the product of the
   ``|A|`` being 1): an entry of the full computation from stored inputs, or the exact
   conjugate of one, which for real z is such a sum for the mirrored frequency with the same
   ``|d|``, since ``conj a_{L-f,s} = a_fs``. A leaf longer than the circle is folded first
   (``gamma_{rows-1}`` relative). A pruned leaf (:func:`_pruned_reach`) is transformed below its reach by direct
   summation (:func:`certified_band`: one twiddle, one real product, blocks of 16 summed in
   order and the block sums pairwise: ``c_B = (1 + mu)(1 + u)(1 + gamma_{15 + ceil(log2(S /
   16))}) - 1``, :func:`band_dft_error`); above it, the exact transform is certified below
   ``e^{-800 / c}`` (total variation, or a coarse certified grid with ``|M'| <= sum |s - c|
   m_s``). Masses are probabilities, ``||x||_1 <= 1``: E_i is about ``c_F`` or ``c_B``.
2. *Powers and products.* ``G = prod_i F_i^{c_i}`` is formed by complex products (integer
   powers by repeated squaring): unfolded into a tree, the product of ``T = sum c_i`` factors
   has ``T - 1`` multiplications, so ``G^ = prod F^_i^{c_i} (1 + t)``, ``|t| <= g_T = (1 +
   sqrt(2) gamma_2)^{T-1} - 1`` (:func:`power_rounding`). Expanding ``prod (F^_i - d_i)^{c_i}``
   with ``|d_i| <= E_i``: ``|G^ - G| <= prod (a_i + E_i)^{c_i} - prod a_i^{c_i} + g_T prod
   a_i^{c_i}`` with ``a_i >= |F^_i|``; where the product is not formed (0), ``|G| <= prod (a_i +
   E_i)^{c_i}``; above a pruned reach ``|G| <= e^{-800} prod (1 + E_j)^{c_j}``; plus 1e-300 per
   entry for gradual underflow (:func:`_product_error`: a bound e_f per frequency). The
   products are evaluated from the sums ``sum_i c_i log(a_i + E_i)`` and ``sum_i c_i log a_i``,
   each moved to the end of its proven evaluation-error interval that makes the bound larger
   (:meth:`_LogModuli.slacks`).
3. *From the spectrum to delta.* A hockey-stick sum over the window, ``sum_k m_k w_k`` with
   ``w_k = (1 - c rho^{k-K})_+`` (``0 <= c <= 1``, ``rho = e^{-h}``), is ``(1/n) sum_f G_f
   conj(W_f)`` (Parseval), and ``|W_f| / n <= s_f = min(1, (2/n) (1/|1 - w^f| + 1/|1 - rho
   w^f|))`` (two geometric series). So the spectrum's error moves every such sum by at most
   ``noise = sum_f mult_f e_f s_f`` (mult_f = 1 at 0 and n/2, else 2;
   :func:`_frequency_weights`), for every epsilon at once. The roll onto the window is exact
   (dense) or a rotation of the band's coefficients (``_ROTATION`` relative, added to noise).
   Formed masses: the inverse complex transform of P points (the same stages on the conjugate,
   then conjugated and scaled by 1/P) errs in the 2-norm by at most ``c_I(P) ||Z||_2 /
   sqrt(P)``, ``c_I = (1 + eta_0 sqrt(m))(1 + eta_H)^k (1 + u)^2 - 1`` with Higham's ``eta_H =
   mu + gamma_4 (sqrt(2) + mu)`` per radix-2 stage (Theorem 24.2; ``||dA_0||_2 <= eta_0 m =
   eta_0 sqrt(m) ||A_0||_2``). :func:`certified_inverse` on n points is that transform of the
   Hermitian extension (P = n) when n is 8 times an odd number, else (16 | n) a complex one on
   ``h = n / 2`` points: with ``A = X_f``, ``B = X_{f+h} = conj X_{h-f}`` and ``w = e^{-2 pi i /
   n}``, ``Z_f = (A + B) / 2 + i (A - B) conj(w^f) / 2`` is the transform of ``z_j = x_{2j} + i
   x_{2j+1}`` (the even samples' spectrum plus i times the odd samples'), formed with two complex
   sums, one product and exact halvings: with ``p = (1 + mu)(1 + sqrt(2) gamma_2)``, ``|Z^_f -
   Z_f| <= eta_P (|A| + |B|)``, ``eta_P = (1 + u)(u + p (1 + u) - 1) / 2 + u``, so ``||dZ||_2 <=
   sqrt(2) eta_P ||X||_2``; then ``z = IDFT_h(Z)``, and since ``||Z||_2 = ||X||_2 / sqrt(2)``
   (Parseval), ``||x^ - x||_2 <= (c_I(h) (1 + 2 eta_P) + 2 eta_P) ||X||_2 / sqrt(n)``
   (:func:`inverse_error`). So the masses err by at most ``c_I ||G^||_2`` in l1
   (Cauchy-Schwarz; ``mass_noise``), and the masses' l1 error
   from the spectrum's is at most ``||e||_2`` (Parseval and Cauchy-Schwarz; with the inverse's:
   ``mass_error``). The sums over the formed masses (running suffix sums, the recursion of W,
   dot products with expm1 weights) err by at most ``gamma_{4n+8}`` relative to the sum of
   their terms' moduli (Section 4.2): the pessimistic curve is evaluated as ``A (1 + g) + C -
   W (1 - g)`` on the clipped masses, the optimistic one as ``A (1 - g) + C - W (1 + g)`` less
   ``4 g`` times the negative mass. A band's closed forms carry their own evaluation bound
   (:mod:`._pld_band`). Clipping negative masses (pessimistic) only moves them towards the
   exact, non-negative ones.
4. *Levels.* A composed part made into a PLD for a further composition (:func:`_as_pld`:
   staged blocks, two-level groups) differs from the exact window by at most ``R = mass_error``
   in l1: the pessimistic side adds R at the window's top point (the deficit lies in the window,
   and moving mass to a larger loss dominates), the optimistic side removes the top R of the
   mass (which bounds the surplus for every non-decreasing weight, see :func:`_as_pld`); the
   pessimistic coarsening's own rounding goes to the top point too.
   Each level then composes exact inputs, and its own bound covers its own arithmetic.

The bound is linear in T for long compositions (about ``T (c + 2.83 u)`` times the spectrum's
weighted l1 norm, a few units); at the default precision it moves epsilon by about 1e-6
relative on Abadi et al.'s MNIST setting. Its frequency-0 part alone, ``g_T / 2`` for a
composition of finite mass at least 1/2 (:func:`roundoff_floor`), is known before anything is
allocated: a query whose delta it already voids is refused up front.

When the composed spectrum is 0 (below e^-800) outside a band of low frequencies holding at most
1/64 of the circle, the result is kept as that band (:class:`._pld_band.BandSpectrum`): epsilon
and delta are then evaluated from closed forms over the band, with a bound on their evaluation
error added on each side, and the masses are formed only for the queries that need all of them.
Where a leaf PLD is narrow against the circle and composed many times, its transform is only
computed below a frequency beyond which a certificate bounds its power below e^-800
(:func:`_pruned_reach`), by direct summation (:func:`certified_band`) instead of a transform of
the whole circle.

A long composition of few distinct PLDs can be done in two stages, blocks of steps on the fine
grid and the blocks on a coarser one (:func:`compose_staged`), each stage keeping its bound.

The composition's transforms are :func:`certified_forward`, :func:`certified_inverse` and
:func:`certified_band` (C++ core), whose structure the proof above needs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

import numpy as np
import scipy.signal

from dpsharp._native import core as _core
from dpsharp._rounding import UNIT_ROUNDOFF as _UNIT
from dpsharp._rounding import gamma as _gamma
from dpsharp.accountants._pld_band import (
    BAND_FRACTION,
    BandSpectrum,
    CrossingHint,
    remember_read_only,
)

__all__ = [
    "ComposedPLD",
    "DiscretePLD",
    "LeafSpectrum",
    "coarsened",
    "compose",
    "compose_staged",
    "staging_pays",
    "parallel_map",
    "threads_for_caller",
]

#: Exponents t of the Chernoff bounds (both signs are used).
_CHERNOFF_T = np.array([0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
_EXPONENTS = tuple(_CHERNOFF_T.tolist())


#: Relative error of a complex product (Higham 2002, Lemma 3.5; no FMA contraction).
_PRODUCT = math.sqrt(2.0) * _gamma(2)
#: Error of one twiddle (pld_transforms.cpp: a ``twiddle_at`` value times an exact power of
#: -i): the angle, reduced to [0, pi/4] in integers, is fl(fl(2 pi r) / n), within 0.79 gamma_3
#: of the true one, and cos and sin are assumed within 2 ulp (2^-51) each (glibc documents at
#: most 1 ulp for both): 0.79 gamma_3 + 2 sqrt(2) 2^-51 < 8.1 u; 10 u is used.
_TWIDDLE = 10.0 * _UNIT


def _twiddle_error(size: int) -> float:
    """Error of every twiddle of a transform on ``size`` points (the same at every size)."""
    del size
    return _TWIDDLE


#: Relative margin on every bound below, for the rounding of the bound's own evaluation (a few
#: dozen floating-point operations on positive numbers, each within 2^-53 relative).
_MARGIN = 1.0 + 1e-9
#: Absolute slack per spectrum entry for gradual underflow (every rounding below 2^-1022 errs by
#: at most 2^-1075 absolutely; far fewer than 10^20 of them reach one entry).
_UNDERFLOW = 1e-300
#: A bound taken for every e^x with x <= _LOG_DEEP (e^-650 = 5.1e-283), in the round-off bound
#: of a product (:func:`_live_product_error`).
_LOG_DEEP = -650.0
_DEEP = 1e-282


def _size_factors(size: int) -> tuple[int, int]:
    """(m, k) with size = m 2^k, m odd."""
    levels = (size & -size).bit_length() - 1
    return size >> levels, levels


def _through_half(size: int) -> bool:
    """Whether the inverse real transform on ``size`` points goes through a complex one on
    size / 2 points (pld_transforms.cpp)."""
    return size % 16 == 0


def _complex_forward_error(points: int, twiddle: float) -> float:
    """c_P with ``|Z^_f - Z_f| <= c_P ||z||_1`` for the complex transform on ``points``."""
    odd, levels = _size_factors(points)
    first = (1.0 + twiddle) * (1.0 + _PRODUCT) * (1.0 + _gamma(odd - 1)) - 1.0
    butterfly = (1.0 + twiddle) * (1.0 + _PRODUCT) * (1.0 + _UNIT) - 1.0
    return (1.0 + first) * (1.0 + butterfly) ** levels - 1.0


def _complex_inverse_error(points: int, twiddle: float) -> float:
    """c_I(P) with ``||z^ - z||_2 <= c_I ||Z||_2 / sqrt(P)`` for the inverse complex transform."""
    odd, levels = _size_factors(points)
    first = (1.0 + twiddle) * (1.0 + _PRODUCT) * (1.0 + _gamma(odd - 1)) - 1.0
    butterfly = twiddle + _gamma(4) * (math.sqrt(2.0) + twiddle)
    growth = (1.0 + first * math.sqrt(odd)) * (1.0 + butterfly) ** levels
    return growth * (1.0 + _UNIT) ** 2 - 1.0


@functools.lru_cache(maxsize=64)
def forward_error(size: int) -> float:
    """c with ``|X^_f - X_f| <= c ||x||_1`` at every frequency for :func:`certified_forward`
    (the componentwise bound of the module docstring, part 1: c_P with P = n)."""
    return _complex_forward_error(size, _twiddle_error(size)) * _MARGIN


def band_dft_error(length: int, size: int) -> float:
    """c with ``|X^_f - X_f| <= c ||x||_1`` for :func:`certified_band` over ``length`` values
    on a circle of ``size`` points: a twiddle, its product with a real value (one rounding per
    part), and the sum (blocks of 16 in order, the block sums pairwise: gamma_{15 + ceil(log2
    blocks)}; Higham 2002, Sections 4.2-4.3)."""
    blocks = max(1, -(-length // 16))
    depth = 15 + math.ceil(math.log2(blocks))
    twiddle = _twiddle_error(size)
    return ((1.0 + twiddle) * (1.0 + _UNIT) * (1.0 + _gamma(depth)) - 1.0) * _MARGIN


@functools.lru_cache(maxsize=64)
def inverse_error(size: int) -> float:
    """c with ``||x^ - x||_2 <= c ||X||_2 / sqrt(n)`` for :func:`certified_inverse`, i.e.
    ``||x^ - x||_1 <= c ||X||_2`` (Cauchy-Schwarz), ``||X||_2`` over the full Hermitian spectrum
    (the normwise bound of the module docstring, part 3: c_I on n points, or through the
    complex transform on n / 2 points)."""
    twiddle = _twiddle_error(size)
    if not _through_half(size):
        return _complex_inverse_error(size, twiddle) * _MARGIN
    product = (1.0 + twiddle) * (1.0 + _PRODUCT)
    packing = (1.0 + _UNIT) * (_UNIT + product * (1.0 + _UNIT) - 1.0) / 2.0 + _UNIT
    half = _complex_inverse_error(size // 2, twiddle)
    return (half * (1.0 + 2.0 * packing) + 2.0 * packing) * _MARGIN


@functools.lru_cache(maxsize=64)
def power_rounding(total_count: int) -> float:
    """``(1 + sqrt(2) gamma_2)^(T - 1) - 1``: the relative rounding error of a product of T
    spectrum values formed by any tree of T - 1 complex multiplications (part 2)."""
    if total_count <= 1:
        return 0.0
    return math.expm1((total_count - 1) * math.log1p(_PRODUCT)) * _MARGIN


@functools.lru_cache(maxsize=64)
def roundoff_floor(total_count: int) -> float:
    """A lower part of the proven round-off bound of a composition of ``total_count`` steps whose
    finite mass is at least 1/2: the product rounding at frequency 0 alone,
    ``power_rounding(T) / 2``, is part of every pessimistic delta and of every optimistic one
    (see the module docstring). Computed in microseconds, before anything is allocated."""
    with np.errstate(over="ignore"):
        return 0.5 * power_rounding(total_count)


#: From this many points a transform is split over the caller's threads
#: (:func:`threads_for_caller`); the bits do not depend on the thread count. Below, starting
#: and joining threads for each pass costs more than it saves on a shared 2-core machine (2^17
#: points: 1 thread 90 ms, 2 threads 132 ms at load average 15; 2^20: 1254 / 1164 ms).
_THREADED_FROM = 1 << 20


def _transform_threads(size: int) -> int:
    return threads_for_caller() if size >= _THREADED_FROM else 1


#: The largest transform taken (2^26 points: 512 MiB for one complex half spectrum).
#: Poisson-subsampled Gaussian runs of 3,000 to 1e7 steps use at most 1.6e6 points; beyond
#: this (2^31 steps of Laplace(1): 6.4e9 points; of a Poisson-subsampled Gaussian at sigma
#: 5e-4: 2.8e14) the transforms asked for tens of GiB and more and were killed for memory.
MAX_TRANSFORM_POINTS = 1 << 26


def _require_transform_size(size: int) -> None:
    if size > MAX_TRANSFORM_POINTS:
        raise ValueError(
            f"this composition needs a transform of {size} points (about "
            f"{size * 16 / 2**31:.3g} GiB per complex array), beyond the {MAX_TRANSFORM_POINTS} "
            "points the tight accountant takes: its privacy loss spans too many grid steps. "
            "Compose fewer steps per accountant, ask at a coarser precision, or account the "
            "run with the RDP accountant (a looser bound, in memory independent of the steps)"
        )


def certified_forward(values: np.ndarray, size: int) -> np.ndarray:
    """``rfft(values, size)`` by the transform of ``pld_transforms.cpp`` (error:
    :func:`forward_error`)."""
    _require_transform_size(size)
    return _core.pld_certified_rfft(
        np.ascontiguousarray(values, dtype=float), size, threads=_transform_threads(size)
    )


def certified_forward_pair(
    first: np.ndarray, second: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(rfft(first, size), rfft(second, size))`` by one complex transform of ``first + i
    second`` (``pld_transforms.cpp``: half the work of two; error: :func:`_pair_errors`)."""
    _require_transform_size(size)
    return _core.pld_certified_rfft_pair(  # type: ignore[no-any-return]
        np.ascontiguousarray(first, dtype=float),
        np.ascontiguousarray(second, dtype=float),
        size,
        threads=_transform_threads(size),
    )


def certified_inverse(spectrum: np.ndarray, size: int) -> np.ndarray:
    """``irfft(spectrum, size)`` by the transform of ``pld_transforms.cpp`` (error:
    :func:`inverse_error`)."""
    _require_transform_size(size)
    return _core.pld_certified_irfft(
        np.ascontiguousarray(spectrum, dtype=complex), size, threads=_transform_threads(size)
    )


#: Terms (values times frequencies) of a direct-sum band per thread at least: a band is split
#: over at most terms / this many of the caller's threads (each then sums for about 0.3 ms or
#: more, far above the cost of starting it), so a small band stays on one thread.
_BAND_TERMS_PER_THREAD = 1 << 17


def certified_band(values: np.ndarray, size: int, reach: int) -> np.ndarray:
    """The first ``reach`` entries of ``rfft(values, size)`` by direct summation (error:
    :func:`band_dft_error`; the bits do not depend on the number of threads)."""
    values = np.ascontiguousarray(values, dtype=float)
    threads = max(1, min(threads_for_caller(), values.size * reach // _BAND_TERMS_PER_THREAD))
    return _core.pld_certified_band_dft(values, size, reach, threads=threads)


def _frequency_weights(size: int, grid_step: float, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(multiplicity, weight) at the real-FFT frequencies ``0 .. count - 1``: the multiplicity
    of f in the full spectrum (1 at 0 and n/2, else 2) and a bound on ``|W_f| / n`` for the DFT
    W of any hockey-stick weight vector ``w_k = (1 - c rho^{k-K})_+`` on the window (``0 <= c
    <= 1``, rho = e^{-h}): ``min(1, (2/n) (1/|1 - w^f| + 1/|1 - rho w^f|))`` (two finite
    geometric series), 1 at f = 0.

    A pure function of its arguments, kept for the last few (read-only arrays): an incremental
    run asks for the same circle at every step."""
    key = (size, grid_step, count)
    cache = _FREQUENCY_WEIGHTS
    hit = cache.get(key)
    if hit is None:
        hit = remember_read_only(cache, _FREQUENCY_WEIGHTS_LOCK, key,
                                 _frequency_weights_uncached(size, grid_step, count))
    return hit


_FREQUENCY_WEIGHTS: dict[tuple[int, float, int], tuple[np.ndarray, np.ndarray]] = {}


def _weighted_multiplicity(size: int, grid_step: float, count: int) -> tuple[np.ndarray, float]:
    """(multiplicity * weight of :func:`_frequency_weights`, the sum of its entries), kept like
    them (functions of the circle only)."""
    key = (size, grid_step, count)
    hit = _WEIGHTED.get(key)
    if hit is None:
        multiplicity, weight = _frequency_weights(size, grid_step, count)
        weighted = multiplicity * weight
        weighted.flags.writeable = False
        hit = (weighted, float(weighted.sum()))
        with _FREQUENCY_WEIGHTS_LOCK:
            while len(_WEIGHTED) >= 8:
                _WEIGHTED.pop(next(iter(_WEIGHTED)), None)
            _WEIGHTED[key] = hit
    return hit


_WEIGHTED: dict[tuple[int, float, int], tuple[np.ndarray, float]] = {}
_FREQUENCY_WEIGHTS_LOCK = threading.Lock()


def _frequency_weights_uncached(
    size: int, grid_step: float, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_frequency_weights`, computed."""
    frequencies = np.arange(count)
    multiplicity = np.where((frequencies == 0) | (2 * frequencies == size), 1.0, 2.0)
    sine = np.sin((math.pi / size) * frequencies)
    rho = math.exp(-grid_step)
    with np.errstate(divide="ignore"):
        plain = 1.0 / (2.0 * sine)
        discounted = 1.0 / np.sqrt((-math.expm1(-grid_step)) ** 2 + 4.0 * rho * sine * sine)
    weight = np.minimum(1.0, (2.0 / size) * (plain + discounted) * (1.0 + 1e-12))
    weight[0] = 1.0
    return multiplicity, weight


def _product_error(logs: _LogModuli, computed: np.ndarray) -> np.ndarray:
    """Bound on ``|G^_f - G_f|`` with ``G = prod_i F_i^{c_i}`` exact and ``G^`` the computed
    product of the computed ``F^_i`` (``|F^_i - F_i| <= E_i`` at every frequency) where
    ``computed`` holds, and ``G^ = 0`` elsewhere (part 2), from ``upper = sum_i c_i log(a_i +
    E_i)`` and ``lower = sum_i c_i log a_i`` (``a_i >= |F^_i|``, :class:`_LogModuli`):
    ``e^upper - e^lower + g_T e^lower`` where computed, ``e^upper`` elsewhere, each sum taken
    at the end of its computed value's error interval that makes the bound larger
    (:meth:`_LogModuli.slacks`).

    Only the entries with ``upper > -746`` are evaluated: below, ``e^upper`` and ``e^lower``
    (``lower <= upper``) are exactly 0 in double precision, so the bound is ``_UNDERFLOW``
    there either way (a long composition's band is a small part of the circle)."""
    bound = np.full(logs.upper.shape, _UNDERFLOW)
    live, values = _live_product_error(logs, computed)
    bound[live] = values
    return bound


def _live_product_error(
    logs: _LogModuli, computed: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The entries of :func:`_product_error` above the underflow slack (``upper > -746``) and
    the bound there; every other entry's bound is ``_UNDERFLOW``. (Its sums' evaluation error,
    :meth:`_LogModuli.slacks`, is far below one unit in the exponent, so the computed sums
    classify the entries.)"""
    upper, lower = logs.upper, logs.lower
    live = np.flatnonzero(upper > _EXP_IS_ZERO)
    if not live.size:
        return live, np.zeros(0)
    every = live.size == upper.size  # (then no gathers)
    live_upper = upper if every else upper[live]
    live_lower = lower if every else lower[live]
    live_computed = computed if every else computed[live]
    upper_slack, lower_slack = logs.slacks(live_upper, live_lower)
    rounding_share = power_rounding(logs.total)
    # Where e^upper is below _DEEP (e^-650, within 60 e-folds of the subnormal doubles), the
    # bound before the slack, at most e^upper (1 + rounding_share), is taken as _DEEP
    # (1 + rounding_share) instead of evaluated, and e^lower enters ``rounding`` as at least
    # _DEEP (a larger, still valid bound): otherwise the products below (``spread``, a share
    # down to 1e-16 of e^upper; ``rounding``) reach subnormal numbers, on which x86 arithmetic
    # is about 20 times slower, and a staged composition's second stage holds a fifth of its
    # circle within that reach of the underflow (32 powers of the block's round-off floor). A
    # composition's bound is at least its rounding at frequency 0 (about 1e-16 per step), so
    # the 1e-282 per entry changes no digit of it. (e^(upper + slack) < 1e-282 there too: the
    # slack is below 0.6.)
    deep = live_upper <= _LOG_DEEP
    if not deep.any():
        return live, _normal_product_error(
            live_upper, live_lower, upper_slack, lower_slack, live_computed, rounding_share
        )
    values = np.full(live.size, _DEEP * (1.0 + rounding_share) * _MARGIN + _UNDERFLOW)
    normal = np.flatnonzero(~deep)
    values[normal] = _normal_product_error(
        live_upper[normal], live_lower[normal], upper_slack[normal], lower_slack[normal],
        live_computed[normal], rounding_share,
    )
    return live, values


def _normal_product_error(
    upper: np.ndarray,
    lower: np.ndarray,
    upper_slack: np.ndarray,
    lower_slack: np.ndarray,
    computed: np.ndarray,
    rounding_share: float,
) -> np.ndarray:
    """:func:`_live_product_error` at entries with ``upper > _LOG_DEEP``: with ``U = upper +
    upper_slack`` and ``L-, L+ = lower -+ lower_slack`` (the ends of the sums' error intervals,
    :meth:`_LogModuli.slacks`), ``e^U - e^L- + g_T e^max(L+, _LOG_DEEP)`` where computed,
    ``e^U`` elsewhere, with the margin and the slack."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        raised = upper + upper_slack
        outer = np.exp(raised)
        inner = np.exp(np.maximum(lower + lower_slack, _LOG_DEEP))
        spread = outer * -np.expm1(np.minimum((lower - lower_slack) - raised, 0.0))
        rounding = rounding_share * inner
    return np.where(computed, spread + rounding, outer) * _MARGIN + _UNDERFLOW


#: e^x rounds to exactly 0 in double precision for every x below this (e^-745.2 is less than
#: half the smallest subnormal, 2^-1074 = e^-744.44).
_EXP_IS_ZERO = -746.0


def _modulus_upper(transform: np.ndarray) -> np.ndarray:
    """An upper bound on ``|z|`` of each computed entry (sqrt(re^2 + im^2) in floating point is
    within 3 u of it)."""
    return np.abs(transform) * (1.0 + 4.0 * _UNIT)


@dataclass(frozen=True)
class DiscretePLD:
    """Masses ``mass[i]`` at loss ``(offset + i) * grid_step`` and ``infinity_mass`` at +inf."""

    offset: int
    mass: np.ndarray
    infinity_mass: float
    grid_step: float

    def log_mgf(self, exponents: np.ndarray) -> np.ndarray:
        """Upper bounds on ``log E[e^{t L}; L finite]`` for each exponent ``t`` (of the stored
        finite masses), from the C++ core's value (``pld.hpp``) raised by its evaluation error.

        The core walks from the end where ``t l`` is largest with the ratio ``fl(e^{-|t| h})``
        (exp within 1 ulp): a term k steps away has carried k roundings of the ratio and k
        products (3 k u relative), the products with the masses and the recursive sum of the
        K <= n terms gamma_{n} more, the walk's cut-off at most 1e-18 of the sum (its terms
        dropped); then ``t anchor + log(sum)``, with the anchor a rounded grid loss, three
        roundings. Where the walk's factor underflows it sums ``e^{log m_k + t l_k - top}``
        instead, each term relatively within u (|log m_k| + 3 |t l_k| + |top|) + 2 u, with
        ``|log m_k| <= 745``. Both are within ``gamma_{4 n + 8} + 1e-17 + u (760 + 6 |t| L +
        4 |value|)`` of the exact value, ``L`` the largest |grid loss| (and a log-MGF
        multiplied by a step count of 10^7 leaves that, about 1e-7 in the exponent of a tail
        of at most 1e-12, negligible); the result is raised by it."""
        values = np.asarray(
            _core.pld_log_mgf(self.mass, self.offset, self.grid_step, exponents.tolist())
        )
        reach = self.grid_step * max(abs(self.offset), abs(self.offset + self.mass.size - 1))
        with np.errstate(invalid="ignore"):
            slack = (
                _gamma(4 * self.mass.size + 8) + 1e-17
                + _UNIT * (760.0 + 6.0 * np.abs(exponents) * reach + 4.0 * np.abs(values))
            ) * (1.0 + 1e-6)
            return np.where(np.isfinite(values), values + slack, values)

    @cached_property
    def chernoff_log_mgf(self) -> np.ndarray:
        """:meth:`log_mgf` at the Chernoff exponents (:func:`chernoff_exponents`), computed once
        per PLD (a heterogeneous composition computes it on the worker that discretised it)."""
        return self.log_mgf(chernoff_exponents())

    @cached_property
    def non_negative(self) -> bool:
        """Whether every stored mass is >= 0 (then so is every mass of an exact composition of
        such PLDs, and its hockey-stick curve is non-increasing), computed once per PLD."""
        return bool((self.mass >= 0.0).all())

    @cached_property
    def mass_l1(self) -> float:
        """An upper bound on ``sum |mass|`` (:func:`_l1`), computed once per PLD."""
        return _l1(self.mass)

    @cached_property
    def _coarse_cache(self) -> dict[int, tuple[int, np.ndarray] | None]:
        return {}

    @cached_property
    def _coarse_terms(self) -> tuple[float, float]:
        """(an upper bound on the l1 mass, D = sum_s |s - c| m_s about the rounded mean c,
        rounded up) of :meth:`coarse_moduli`, computed once per PLD."""
        mass = self.mass
        total = _l1(mass)
        if total <= 0.0:
            return total, 0.0
        index = np.arange(mass.size)
        centre = round(float((index * mass).sum()) / float(mass.sum()))
        spread = float((np.abs(index - centre) * np.abs(mass)).sum())
        return total, spread / (1.0 - _gamma(mass.size + 2))

    @cached_property
    def total_variation(self) -> float:
        """``sum_s |m_s - m_{s-1}|`` with ``m_{-1} = m_S = 0``, rounded up (the relative
        1e-12 covers the summation), computed once per PLD (:func:`_pruned_reach`)."""
        return float(np.abs(np.diff(self.mass, prepend=0.0, append=0.0)).sum()) * (1.0 + 1e-12)

    def coarse_moduli(self, gap: float) -> tuple[int, np.ndarray] | None:
        """(N, b): ``b[j] >= |M(w)|`` for every w nearest to ``2 pi j / N`` on a grid of N points
        (``0 <= j <= N / 2``), where ``M(w) = sum_s mass_s e^{-i w s}``, with N chosen so that
        the grid's share ``D pi / N`` of b is at most ``gap / 4`` (see :func:`_pruned_reach`);
        None for an empty PLD. Memoised per N."""
        points = self.coarse_points(gap)
        if points is None:
            return None
        mass = self.mass
        total, spread = self._coarse_terms
        cache = self._coarse_cache
        if points not in cache:
            transform = certified_forward(mass, points)
            slack = forward_error(points) * total + spread * math.pi / points
            cache[points] = (points, (_modulus_upper(transform) + slack) * _MARGIN)
        return cache[points]

    def coarse_points(self, gap: float) -> int | None:
        """The grid size N of :meth:`coarse_moduli` at ``gap`` (None for an empty PLD), without
        its transform."""
        total, spread = self._coarse_terms
        if total <= 0.0:
            return None
        return _circle_size(max(self.mass.size, math.ceil(4.0 * math.pi * spread / gap)))

    @cached_property
    def second_moment(self) -> tuple[float, float]:
        """(M, S2): the total mass and ``sum_s m_s (s - c)^2`` about the mean c, in grid steps
        (for :func:`_reach_at_least`), computed once per PLD."""
        mass = self.mass
        total = float(mass.sum())
        if total <= 0.0:
            return total, 0.0
        index = np.arange(mass.size, dtype=float)
        centre = float((index * mass).sum()) / total
        return total, float(((index - centre) ** 2 * mass).sum())

    def on_circle(self, size: int) -> np.ndarray:
        """The values whose transform on a circle of ``size`` points is that of the masses
        folded onto it: the masses themselves where they fit (:func:`certified_forward`
        zero-pads them, and skips the zeros), else :meth:`folded`."""
        return self.mass if self.mass.size <= size else self.folded(size)

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
    #: bound on ``|transform - exact|`` at every entry (:func:`forward_error`,
    #: :func:`band_dft_error`)
    error: float = 0.0
    #: the first ``direct`` entries are direct sums (:func:`certified_band`), within
    #: ``direct_error`` of the exact ones
    direct: int = 0
    direct_error: float = 0.0
    _log_moduli: tuple[int, np.ndarray, np.ndarray] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    #: suffix maxima of the squared moduli and of log(a + E), by length (see :meth:`_suffix_max`)
    _suffix_maxima: dict[tuple[str, int], np.ndarray] = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )

    def _suffix_max(self, which: str, count: int) -> np.ndarray:
        """``max(values[f:count])`` at every f < count, for ``which`` "modulus" (the squared
        moduli) or "upper" (log(a + E) of :meth:`log_moduli`): non-increasing, so the
        frequencies at which a threshold can still be passed are a prefix found by bisection
        (:meth:`prefix_above`). Kept until :meth:`refine` changes the transform."""
        key = (which, count)
        hit = self._suffix_maxima.get(key)
        if hit is None:
            values = (
                self.modulus_squared[:count] if which == "modulus" else self.log_moduli(count)[0]
            )
            hit = np.maximum.accumulate(values[::-1])[::-1]
            hit.flags.writeable = False
            self._suffix_maxima[key] = hit
        return hit

    def prefix_above(self, count: int, threshold: float) -> int:
        """The smallest P <= count with ``modulus_squared[f] <= threshold`` at every f in
        [P, count) (the same comparisons, on the suffix maxima: exact)."""
        maxima = self._suffix_max("modulus", count)
        return _last_above(lambda f: float(maxima[f]) > threshold, count)

    def errors(self, count: int) -> np.ndarray:
        """The error bound of each of the first ``count`` entries."""
        return np.where(np.arange(count) < self.direct, self.direct_error, self.error)

    def log_moduli(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(log(a + E), log a) over the first ``count`` entries, with ``a`` the
        :func:`_modulus_upper` of the transform and ``E`` :meth:`errors`: the terms of
        :class:`_LogModuli` (read-only; kept until :meth:`refine` changes the transform, so that
        recomposing after one more step does not take the logarithms again)."""
        cached = self._log_moduli
        if cached is not None and cached[0] == count:
            return cached[1], cached[2]
        modulus = _modulus_upper(self.transform[:count])
        upper, lower = _log_moduli(modulus, self.errors(count))
        upper.flags.writeable = False
        lower.flags.writeable = False
        self._log_moduli = (count, upper, lower)
        return upper, lower

    def refine(self, pld: DiscretePLD, reach: int) -> None:
        """Recompute the first ``reach`` entries by direct summation (tighter than the whole
        transform's stages; the composed band is where the bound counts)."""
        if reach <= self.direct:
            return
        values = certified_band(pld.mass, self.size, reach)
        self.transform = self.transform.copy()
        self.transform[:reach] = values
        self.modulus_squared = self.modulus_squared.copy()
        with np.errstate(under="ignore"):
            self.modulus_squared[:reach] = values.real * values.real + values.imag * values.imag
        self.direct = reach
        self.direct_error = band_dft_error(pld.mass.size, self.size) * _l1(pld.mass)
        self._log_moduli = None
        self._suffix_maxima = {}


def _last_above(test: Callable[[int], bool], count: int) -> int:
    """For ``test`` true on a prefix of ``range(count)`` and false after it: the prefix's
    length, by bisection."""
    low, high = 0, count  # test holds below low, fails from high on
    while low < high:
        middle = (low + high) // 2
        if test(middle):
            low = middle + 1
        else:
            high = middle
    return low


def _live_reach(leaves: Sequence[LeafSpectrum], counts: Sequence[int], reach: int) -> int:
    """A frequency Q <= reach from which the round-off bound of :func:`_product_error` is
    certainly the underflow slack alone: there ``sum_i c_i log(a_i + E_i) <= -747`` by the
    leaves' suffix maxima of log(a_i + E_i), one unit in the exponent below the -746 at which
    e^upper is exactly 0 (far more than the rounding of the sum)."""
    maxima = [leaf._suffix_max("upper", reach) for leaf in leaves]
    if len(maxima) == 1:  # (the usual incremental case: one leaf)
        count, top = counts[0], maxima[0]
        return _last_above(lambda f: count * float(top[f]) > _EXP_IS_ZERO - 1.0, reach)

    def live(f: int) -> bool:
        return sum(count * float(top[f]) for count, top in zip(counts, maxima)) > _EXP_IS_ZERO - 1.0

    return _last_above(live, reach)


def _argument_rounding(epsilon: float, losses: np.ndarray | float) -> np.ndarray | float:
    """How far to move the argument ``eps - l_k`` of a hockey-stick weight (towards the safe
    side), with the grid loss ``l_k = (start + k) h`` itself a rounded product: the product
    and the difference err by at most ``u (2 |l_k| + |eps|)`` together, and the move's own
    rounding by ``u |eps - l_k - m|``, so a move of ``m = 4 u (|l_k| + |eps|)`` leaves the
    computed argument on the safe side of the exact one. Absolute: where eps is just below a
    grid loss the weight is about ``l_k - eps``, and no relative margin on the sum covers an
    error of ``u |l_k|`` in it."""
    return 4.0 * _UNIT * (np.abs(losses) + abs(epsilon))


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
    clipped by its first level. ``noise`` is the proven bound (module docstring) on the error
    that the floating-point composition makes in any hockey-stick sum ``sum_k m_k (1 - c
    rho^{k-K})_+`` of the window, added to every pessimistic delta and subtracted from every
    optimistic one; ``mass_noise`` is added on top where the sum is evaluated from the formed
    masses (their inverse transform and the summation), and ``mass_error`` bounds the l1 error
    of the formed masses (for :func:`_as_pld`). ``staged_roundoff`` is, for a pessimistic
    :func:`compose_staged`, the mass its blocks moved to their top points for their round-off
    (each block's ``mass_error``, times its copies): about what the staging itself can add to a
    delta, which decides when the one-stage composition is worth computing too (the route is a
    choice between certified bounds; no bound reads this field).
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
    mass_noise: float = 0.0
    mass_error: float = 0.0
    staged_roundoff: float = 0.0
    #: a bound on the evaluation error of ``infinity_mass`` (added on the pessimistic side,
    #: subtracted on the optimistic one)
    infinity_error: float = 0.0

    def __post_init__(self) -> None:
        if (self.dense is None) == (self.spectral is None):
            raise ValueError("a ComposedPLD holds its masses either dense or spectral")

    @cached_property
    def mass(self) -> np.ndarray:
        """The window's masses (formed by one inverse transform when held spectral)."""
        if self.dense is not None:
            return self.dense
        assert self.spectral is not None
        return certified_inverse(self.spectral.full_spectrum(), self.spectral.size)

    @property
    def size(self) -> int:
        if self.dense is not None:
            return self.dense.size
        assert self.spectral is not None
        return self.spectral.size

    @property
    def losses(self) -> np.ndarray:
        return (self.start + np.arange(self.size)) * self.grid_step

    @cached_property
    def roundoff(self) -> float:
        """A measure of the round-off level: the total negative mass left by the FFT (dense), or
        the bound on the evaluation error of the band's sums (spectral); computed once (every
        query checks it)."""
        if self.spectral is not None:
            return self.spectral.error + self.inner_roundoff
        return float(-self.mass[self.mass < 0].sum()) + self.inner_roundoff

    def _constants(self, pessimistic: bool, *, from_masses: bool = True) -> tuple[float, float]:
        """(constant added to every delta, mass that sits below the window's bottom point). The
        round-off bound (``noise``, plus ``mass_noise`` for a sum over the formed masses or the
        evaluation bound of the band's closed forms) is added on the pessimistic side and
        subtracted on the optimistic one."""
        if from_masses or self.spectral is None:
            evaluation = self.mass_noise
            if not pessimistic:
                # The optimistic masses are not clipped: a sum's rounding is within gamma of the
                # sum of its terms' moduli, i.e. of (the sum + twice the negative mass); the
                # relative part is applied where the sum is formed (``_slack``).
                evaluation += 4.0 * self._summation * self._negative_mass
        else:
            # the band's closed forms, and the addition of this constant to them
            evaluation = self.spectral.error + 4.0 * _UNIT * (
                self.infinity_mass + self.above + self.noise + self.spectral.error
            )
        roundoff = self.noise + evaluation
        if pessimistic:
            return self.infinity_mass + self.infinity_error + self.above + roundoff, self.below
        return (self.infinity_mass - self.infinity_error - self.above - self.below - self.excess
                - roundoff), 0.0

    @property
    def _summation(self) -> float:
        """Relative rounding of a hockey-stick sum over the formed masses: the suffix sums (a
        running sum, and W by ``W_j = e^{-h} m_{j+1} + e^{-h} W_{j+1}``, three roundings per
        step, and the rounding of ``e^{-h}`` itself, raised to the distance between the terms:
        one more per step, so that ``exp`` need not be correctly rounded) or a dot product with
        weights computed by expm1 (within a few ulp; their arguments' rounding is moved apart,
        :func:`_argument_rounding`): at most gamma_{4 n + 8} of the sum of the moduli of their
        terms (Higham 2002, Section 4.2)."""
        return _gamma(4 * self.size + 8)

    @cached_property
    def _mass_l1(self) -> float:
        return _l1(self.mass)

    @cached_property
    def _negative_mass(self) -> float:
        return float(-self.mass[self.mass < 0].sum()) / (1.0 - _gamma(self.size + 1))

    def _slack(self, pessimistic: bool) -> float:
        """The relative factor s of a hockey-stick sum over the formed masses, evaluated as
        ``A (1 + s) - W (1 - s)``: +gamma above the exact sum, -gamma below it."""
        return self._summation if pessimistic else -self._summation

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
        # np.sum of the products, not np.dot: BLAS sums in an order that depends on its thread
        # count, and the answer must be a function of the multiset alone (NumPy's pairwise sum
        # is the same whatever the threads). Each weight's argument eps - l_k is moved by its
        # rounding (:func:`_argument_rounding`), which no relative margin covers where eps is
        # just below a grid loss.
        arguments = epsilon - losses[above]
        arguments -= np.copysign(_argument_rounding(epsilon, losses[above]),
                                 self._slack(pessimistic))
        value = float(np.sum(mass[above] * -np.expm1(arguments)))
        value *= 1.0 + self._slack(pessimistic)
        value += constant
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
        constant, _ = self._constants(pessimistic, from_masses=False)
        if index >= self.size - 1:
            return min(max(constant, 0.0), 1.0)
        mass_above, weighted_above = self.spectral.suffix_sums(index)
        loss = (self.start + index) * h
        shift = float(_argument_rounding(epsilon, loss))
        discount = math.exp(epsilon - loss + (-shift if pessimistic else shift))
        value = mass_above - discount * weighted_above + constant
        return min(max(value, 0.0), 1.0)

    def epsilon(
        self, delta: float, *, pessimistic: bool, hint: CrossingHint | None = None
    ) -> float:
        """The smallest eps >= 0 with ``delta(eps) <= delta`` (exact for the discrete curve, which
        is ``A - e^eps B`` between grid points); inf when the +inf mass alone exceeds delta.

        ``hint`` (a composition held as a band): the grid point where a previous query crossed,
        looked at first (:meth:`BandSpectrum.crossing`, the same answer in a few evaluations
        instead of a bisection; the curve computed is within ``noise`` plus the band's
        evaluation bound of the exact composition's, which is non-increasing), and updated
        to this query's crossing."""
        constant, low_mass = self._constants(pessimistic, from_masses=self.spectral is None)
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
        if i0 >= self.size:
            # The whole window lies at losses <= -h (an optimistic PLD whose rounding moved the
            # composition below 0): every hockey-stick term vanishes for eps >= 0, so delta(0)
            # is the constant alone (empty suffix sums said inf, an unsound lower bound).
            return 0.0 if constant <= delta else float("inf")
        if self.spectral is not None:
            local = None if hint is None or hint.index is None else hint.index - self.start
            found = self.spectral.crossing(
                i0, constant, delta, hint=local,
                margin=(self.noise + self.spectral.error) * _MARGIN,
            )
            if found is None:
                return float("inf")
            j, tail_mass, tail_weighted = found
            if hint is not None:
                hint.index = self.start + j
            j_from = j - i0
        else:
            # The curve tested is A (1 + s) + constant - W (1 - s) (``_slack``).
            j_from, tail_mass, tail_weighted = _core.pld_delta_crossing(
                self.mass[i0:], constant, math.exp(-h), delta, pessimistic, self._slack(pessimistic)
            )
        if j_from < 0:
            return float("inf")  # the curve is non-increasing: no crossing below i0 either
        if i0 > 0 and j_from == 0:
            return 0.0  # delta(l_{i0}) <= delta with l_{i0} <= -h < 0
        j = i0 + j_from
        # Between l_{j-1} and l_j the curve is A - e^eps B; with B normalised at the left end
        # (anchor), eps = anchor + log((A - delta) / B).
        if j == 0:
            mass, constant, low_mass = self._curve_terms(pessimistic)
            anchor = first
            a_sum = float(mass.sum())
            # e^{-(l_k - a)} <= 1, no division; its argument moved by its rounding
            differences = self.losses - first
            differences += np.copysign(
                _argument_rounding(first, self.losses), self._slack(pessimistic)
            )
            shifted = np.exp(-differences)
            b_sum = float(np.sum(mass * shifted))  # (not np.dot: see delta)
            slack = self._slack(pessimistic)
            a_sum, b_sum = a_sum * (1.0 + slack), b_sum * (1.0 - slack)
            a_sum += constant + low_mass
            b_sum += low_mass
        else:
            anchor = (self.start + j - 1) * h
            a_sum = tail_mass + constant
            b_sum = tail_weighted
            if self.spectral is None:
                slack = self._slack(pessimistic)
                a_sum += tail_mass * slack
                b_sum *= 1.0 - slack
        if a_sum <= delta or b_sum <= 0:
            value = anchor
        else:
            shift = float(np.log((a_sum - delta) / b_sum))
            # the rounding of the anchor (a grid loss), of the quotient, the logarithm and the
            # sum: within 4 ulp of |anchor| + |shift|
            rounding = 4.0 * 2.0**-52 * (abs(anchor) + abs(shift))
            value = anchor + shift + (rounding if pessimistic else -rounding)
        return max(value, 0.0)

    def delta_curve(self, *, pessimistic: bool) -> tuple[np.ndarray, np.ndarray]:
        """(eps grid, delta bound at each grid point)."""
        mass, constant, _ = self._curve_terms(pessimistic)
        losses = self.losses
        tail_mass = np.concatenate((np.cumsum(mass[::-1])[::-1][1:], [0.0]))
        tail_weighted = _discounted_suffix(mass, self.grid_step)
        slack = self._slack(pessimistic)
        tail_mass = tail_mass * (1.0 + slack)
        tail_weighted = tail_weighted * (1.0 - slack)
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
    ``log_mgf_total[i] = log E[e^{t_i S}]`` for t in (+_CHERNOFF_T, -_CHERNOFF_T). (On Python
    floats: the same correctly rounded operations as elementwise on the 9 exponents, without
    the per-call cost of NumPy on such short vectors; a query after every step asks twice.)"""
    values = log_mgf_total.tolist() if isinstance(log_mgf_total, np.ndarray) else log_mgf_total
    k = len(_EXPONENTS)
    upper = min((m - log_tail) / t for m, t in zip(values[:k], _EXPONENTS))
    lower = max((m - log_tail) / -t for m, t in zip(values[k:], _EXPONENTS))
    return float(lower), float(upper)


def chernoff_tails(
    log_mgf_total: np.ndarray,
    a: float,
    b: float,
    magnitude: np.ndarray | None = None,
    terms: int = 1,
) -> tuple[float, float]:
    """(bound on P(S < a), bound on P(S > b)): ``exp(M(t) - t b)`` minimised over the exponents
    (and the mirror below), each exponent raised by its evaluation error. ``magnitude[i]``
    bounds the sum of the moduli of the ``terms`` terms summed into ``log_mgf_total[i]`` (each
    a step count times an upper bound on a log-MGF, :meth:`DiscretePLD.log_mgf`; by default the
    total's own modulus): their products and sum, ``t b`` and the difference err by at most
    ``gamma_{terms + 3} (magnitude + |t b|)``, and exp by 1 ulp more, covered by ``1 + 4 u``."""
    values = log_mgf_total.tolist() if isinstance(log_mgf_total, np.ndarray) else log_mgf_total
    sizes = (np.abs(log_mgf_total) if magnitude is None else magnitude).tolist()
    k = len(_EXPONENTS)
    share = _gamma(terms + 3)
    above = math.exp(min(
        m - t * b + share * (size + abs(t * b))
        for m, t, size in zip(values[:k], _EXPONENTS, sizes[:k])
    )) * (1.0 + 4.0 * _UNIT)
    below = math.exp(min(
        m + t * a + share * (size + abs(t * a))
        for m, t, size in zip(values[k:], _EXPONENTS, sizes[k:])
    )) * (1.0 + 4.0 * _UNIT)
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
    refine: bool = True,
    window_counts: list[int] | None = None,
) -> ComposedPLD:
    """The composition of ``counts[i]`` copies of ``plds[i]``, on a circle (a 2-3-5-smooth size,
    fast for pocketfft; the folding argument holds for any size) just wide
    enough for the Chernoff window at ``e^{log_tail}`` (with ``window_counts``, at least as
    long as the circle of that composition: any circle holding the window is sound).

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

    ``refine`` False keeps the transforms' own round-off bound where the composed band would
    be recomputed by direct sums for a tighter one (several times the cost of the transforms;
    a caller whose delta is far above either bound can skip it).

    Without a cache and with more than ``_TWO_LEVEL_FROM`` PLDs (a heterogeneous schedule), the
    composition is done in two levels, see :func:`_compose_two_level`; ``pessimistic`` says which
    side the PLDs round to, which decides how the first level's results are made into PLDs.
    One copy of one PLD is that PLD (:func:`_one_copy`, no transform).
    """
    if spectra is None and len(plds) > _TWO_LEVEL_FROM:
        return _compose_two_level(plds, counts, log_tail=log_tail, pessimistic=pessimistic)
    if len(plds) == 1 and counts[0] == 1:
        return _one_copy(plds[0])
    window = _Window.of(plds, counts, log_tail, window_counts)
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
    # Every candidate lies below each leaf's prefix (suffix maxima; the same comparisons), a
    # small part of the circle for a long composition: the tests run on that prefix only.
    thresholds = [math.exp(-1600.0 / count) for count in counts]
    prefix = min(
        leaf.prefix_above(reach, threshold) for leaf, threshold in zip(leaf_spectra, thresholds)
    )
    candidates = np.ones(prefix, dtype=bool)
    for threshold, leaf in zip(thresholds, leaf_spectra):
        candidates &= leaf.modulus_squared[:prefix] > threshold
    where = np.flatnonzero(candidates)
    log_modulus = np.zeros(where.size)
    for count, leaf in zip(counts, leaf_spectra):
        log_modulus += (0.5 * count) * np.log(leaf.modulus_squared[where])
    kept = where[log_modulus > -800.0]
    top = int(kept[-1]) + 1 if kept.size else 0
    for index, leaf in enumerate(leaf_spectra):
        # A narrow band of a whole transform: its entries recomputed by direct sums, whose bound
        # is several times tighter than the stages' (where that costs at most about four
        # transforms: the bound is what the epsilon pays for).
        mass_size = plds[index].mass.size
        budget = 4.0 * size * math.log2(size)
        # (``refine`` False skips it: the stages' own, looser bound is kept, still certified.)
        if (refine and leaf.direct < top and mass_size <= size
                and _PRUNED_COST * mass_size * top < budget):
            leaf.refine(plds[index], top)
    # The product of integer powers (repeated squaring): T - 1 complex multiplications in the
    # tree of every entry, whose rounding power_rounding bounds.
    product = np.ones(kept.size, dtype=complex)
    with np.errstate(under="ignore"):
        for count, leaf in zip(counts, leaf_spectra):
            product *= _integer_power(leaf.transform[kept], count)
    band = int(kept[-1]) + 1 if kept.size else 0
    # (a band held spectral needs its coefficients only; a dense result the whole half-circle)
    spectrum = np.zeros(band if 0 < band <= size // BAND_FRACTION else size // 2 + 1,
                        dtype=complex)
    spectrum[kept] = product
    # The round-off bound is the underflow slack alone from `live` on (:func:`_live_reach`):
    # the log-moduli are summed on that prefix only.
    live = max(_live_reach(leaf_spectra, counts, reach), band)
    computed = np.zeros(live, dtype=bool)
    computed[kept] = True
    logs = _LogModuli.of_leaves(leaf_spectra, counts, live)
    # Every entry outside `kept` is exactly 0: the band ends at its last frequency.
    return _result_of_spectrum(
        window, spectrum, band, logs, computed, _pruned_tail(leaf_spectra, counts, size),
        reach=reach,
    )


def _one_copy(pld: DiscretePLD) -> ComposedPLD:
    """The composition of one copy of ``pld``: the PLD itself, on a window holding its whole
    support (nothing above or below it), with no transform and so no round-off bound (its
    masses are the exact input of every bound here, see the module docstring). A query on one
    step, the first of an incremental run, then costs a pass over the masses instead of two
    transforms of a circle as long as the support."""
    return ComposedPLD(
        start=pld.offset,
        dense=pld.mass.copy(),
        infinity_mass=pld.infinity_mass,
        above=0.0,
        below=0.0,
        grid_step=pld.grid_step,
    )


@dataclass
class _LogModuli:
    """``upper = sum_i c_i log(|F^_i| + E_i)`` and ``lower = sum_i c_i log |F^_i|`` (moduli
    rounded up) per frequency, and T = sum_i c_i: what :func:`_product_error` needs; with the
    number of terms summed into each entry and the positive part of the terms, which bound the
    sums' own evaluation error (:meth:`slacks`)."""

    upper: np.ndarray
    lower: np.ndarray
    total: int
    #: the number of factors whose terms are summed into each entry
    terms: int = 0
    #: ``P = sum_i c_i lambda_i`` with ``lambda_i >= max(0, log(a_i + E_i))`` at every frequency
    #: (:func:`_positive_log_bound`)
    positive: float = 0.0

    @classmethod
    def of(
        cls,
        transforms: Sequence[np.ndarray],
        errors: Sequence[float | np.ndarray],
        counts: Sequence[int],
    ) -> _LogModuli:
        size = transforms[0].size if transforms else 0
        out = cls(np.zeros(size), np.zeros(size), 0)
        for transform, error, count in zip(transforms, errors, counts):
            out.add(transform, error, count)
        return out

    @classmethod
    def of_leaves(
        cls, leaves: Sequence[LeafSpectrum], counts: Sequence[int], reach: int
    ) -> _LogModuli:
        """:meth:`of` the first ``reach`` entries of the leaves' transforms and errors, the
        same values from each leaf's kept logarithms (:meth:`LeafSpectrum.log_moduli`)."""
        out: _LogModuli | None = None
        for leaf, count in zip(leaves, counts):
            # (the leaf's logarithms over its whole transform are kept; a prefix is a view)
            upper, lower = leaf.log_moduli(leaf.transform.size)
            upper, lower = upper[:reach], lower[:reach]
            positive = count * _positive_log_bound(
                leaf.transform[0], max(leaf.error, leaf.direct_error)
            )
            if out is None:  # 0 + x is x: the first terms are taken as they are
                out = cls(count * upper, count * lower, count, 1, positive)
                continue
            out.upper += count * upper
            out.lower += count * lower
            out.total += count
            out.terms += 1
            out.positive += positive
        return out if out is not None else cls(np.zeros(reach), np.zeros(reach), 0)

    def add(self, transform: np.ndarray, error: float | np.ndarray, count: int) -> None:
        upper, lower = _log_moduli(_modulus_upper(transform), error)
        self.upper += count * upper
        self.lower += count * lower
        self.total += count
        self.terms += 1
        self.positive += count * _positive_log_bound(transform[0], float(np.max(error)))

    def merge(self, other: _LogModuli) -> None:
        self.upper += other.upper
        self.lower += other.lower
        self.total += other.total
        self.terms += other.terms
        self.positive += other.positive

    def slacks(self, upper: np.ndarray, lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bounds ``D_U``, ``D_L`` on the evaluation errors ``|upper^ - upper|`` and ``|lower^ -
        lower|`` of the computed sums (here, entries of ``self.upper`` and ``self.lower``): the
        round-off bound needs ``e^upper - e^lower``, and the sums differ by about ``T E / a``,
        often only a few hundred ulps of the sums themselves, so their rounding is not a
        relative ``_MARGIN`` of the bound (at q = 0.01, sigma = 1, 500 steps, the bound
        evaluated from the computed sums was up to 0.5% below its value from the exact sums).

        Each term ``c log x`` (x = a + E or a) is computed within ``_LOG_TERM = 21 u`` of
        ``c (|log(a + E)| + |log a|)``. With ``r = E / a``: ``log a`` within 4 ulp (8 u
        relative, NumPy's logarithm; the compiled core's is within 1 ulp); ``log(a + E)`` as
        ``log a + log1p(r)`` for r < 1 (:func:`_log_moduli`; ``multiply_factor`` in pld.hpp,
        with a three-term series for r <= 2^-20), whose parts err by 8 u of ``|log a|``, 8 u
        of ``log1p(r)`` and 1.5 u of it from the rounding of r, and the sum by u of the result,
        ``log1p(r) = log(a + E) - log a`` being at most ``|log(a + E)| + |log a|``; for r >= 1
        directly, 8 u of ``|log(a + E)|`` and the rounding of ``a + E``, at most ``1.01 u <=
        1.5 u log1p(r)``; then the product by c within u. Any order of summing the n terms
        errs by at most ``gamma_{n-1}`` times the sum of their moduli (Higham 2002, eq. 4.4),
        so with ``k = (_LOG_TERM + gamma_n)(1 + gamma_n)``, ``D <= k M`` with ``M = sum_i c_i
        (|log(a_i + E_i)| + |log a_i|)``. Every term is at most ``lambda_i`` above 0
        (:func:`_positive_log_bound`), so ``|t| <= -t + 2 c_i lambda_i``, and ``M <= -(upper +
        lower) + 4 P <= -(upper^ + lower^) + 2 D + 4 P``: ``D <= k (max(-(upper^ + lower^),
        0) + 4 P) / (1 - 2 k)``, for both sums. (Every modulus is at least the smallest
        subnormal, so the sums are finite; ``lower^ = -inf`` from another caller, a factor of
        exactly 0, gives ``D_L = 0`` and the formula ``e^upper`` there.) The raised and lowered
        sums are then formed by one more rounding each, ``2 u |sum|`` more; the result is raised
        by 1e-6 relative for the rounding of this evaluation."""
        kappa = (_LOG_TERM + _gamma(self.terms)) * (1.0 + _gamma(self.terms))
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(lower)
            magnitude = np.maximum(-(upper + np.where(finite, lower, 0.0)), 0.0)
            shared = kappa * (magnitude + 4.0 * self.positive) / (1.0 - 2.0 * kappa)
            upper_slack = (shared + 2.0 * _UNIT * np.abs(upper)) * (1.0 + 1e-6)
            lower_slack = np.where(
                finite, (shared + 2.0 * _UNIT * np.abs(lower)) * (1.0 + 1e-6), 0.0
            )
        return upper_slack, lower_slack


_SMALLEST_SUBNORMAL = 5e-324
#: Bound on the evaluation error of one term ``c log x`` of :class:`_LogModuli`, relative to
#: ``c (|log(a + E)| + |log a|)`` (see :meth:`_LogModuli.slacks`).
_LOG_TERM = 21.0 * _UNIT


def _log_moduli(modulus: np.ndarray, error: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(log(a + E), log a)`` for the moduli a (rounded up; a modulus of 0 taken at the
    smallest subnormal: any ``a >= |F^|`` serves the bound, and its logarithm stays finite)
    and the error bounds E, the first without rounding the sum a + E where ``r = E / a < 1``
    (there its rounding, up to an ulp of a, can be a large part of E): ``log a + log1p(r)``;
    directly where r >= 1, where the sum's rounding is at most 1.5 u of log1p(r) (see
    :meth:`_LogModuli.slacks`)."""
    modulus = np.maximum(modulus, _SMALLEST_SUBNORMAL)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lower = np.log(modulus)
        ratio = error / modulus
        upper = np.where(ratio < 1.0, lower + np.log1p(np.minimum(ratio, 1.0)),
                         np.log(modulus + error))
    return upper, lower


def _positive_log_bound(zero_frequency: complex, error: float) -> float:
    """``lambda >= max(0, log(a_f + E))`` at every frequency f of a computed transform whose
    entry at frequency 0 is ``zero_frequency`` and whose entries err by at most ``error``: the
    exact transform of non-negative masses peaks at frequency 0, so ``|F^_f| <= |F_0| + E <=
    |F^_0| + 2 E``, ``a_f + E <= (|F^_0| + 3 E)(1 + 7 u)`` with the rounding up of
    :func:`_modulus_upper` and of the sum, and ``log x <= x - 1``; computed with room for its
    own rounding (a few u, added as 8 u)."""
    peak = (abs(zero_frequency) + 3.0 * error) * (1.0 + 16.0 * _UNIT)
    return max(peak - 1.0, 0.0) + 8.0 * _UNIT


def _pruned_tail(leaves: Sequence[LeafSpectrum], counts: Sequence[int], size: int) -> float:
    """A bound on ``|G_f|`` at every frequency from the smallest reach of a pruned leaf
    spectrum on (0 if none is pruned): that leaf's power is at most ``e^-800`` there by the
    total-variation bound of :func:`_pruned_reach` (a bound on the exact transform), and every
    other factor at most ``(1 + E_j)^{c_j}``."""
    half = size // 2 + 1
    if all(leaf.transform.size >= half for leaf in leaves):
        return 0.0
    growth = sum(count * math.log1p(leaf.error) for leaf, count in zip(leaves, counts))
    return math.exp(-800.0 + growth) * _MARGIN


#: Spectrum entries at most this large in modulus are dropped when a composition is held as a
#: band (:func:`_result_of_spectrum`): each moves every mass of the window by at most 2e-300 / n.
_NEGLIGIBLE_SPECTRUM = 1e-300


#: Relative error of a band coefficient's rotation ``D_f e^{-2 pi i t / n}`` (t reduced modulo n
#: in integers): the angle fl(fl(-2 pi / n) t) is within 2 pi gamma_3 of the true one, cos and
#: sin within 2 ulp each (the assumption of ``_TWIDDLE``), and the complex product.
_ROTATION = 2.0 * math.pi * _gamma(3) + 4.0 * math.sqrt(2.0) * _UNIT + _PRODUCT


def _result_of_spectrum(
    window: _Window,
    spectrum: np.ndarray,
    band: int,
    logs: _LogModuli,
    computed: np.ndarray,
    tail: float = 0.0,
    *,
    reach: int | None = None,
) -> ComposedPLD:
    """The composition whose real-FFT spectrum on the window's circle is ``spectrum``, every
    entry of which from ``band`` on is negligible: held as that band (no inverse transform) when
    it holds at most ``size / BAND_FRACTION`` frequencies, else dense; with its round-off bounds
    (module docstring, parts 2-4). ``logs`` describe the computed factors at the frequencies
    ``0 .. Q - 1`` (Q = ``computed.size``), ``computed`` says where ``spectrum`` holds their
    computed product (elsewhere it is 0); from Q to ``reach`` (Q by default) the factors' bound
    is the underflow slack alone (:func:`_live_reach`), and ``tail`` bounds ``|G_f|`` from
    ``reach`` on.

    The weighted sum of the bounds e_f is taken over the entries above the underflow slack,
    plus the slack times the sum of all the weights (each entry's slack counted at least once);
    the squares of the slack (1e-600) are covered by ``1e-300 sqrt(n)`` on the l2 norm."""
    size = window.size
    held_as_band = 0 < band <= size // BAND_FRACTION
    live_count = computed.size
    reach = live_count if reach is None else reach
    if held_as_band:
        computed = computed & (np.arange(live_count) < band)
    live, values = _live_product_error(logs, computed)
    multiplicity, weight = _frequency_weights(size, window.grid_step, reach)
    weighted, weight_sum = _weighted_multiplicity(size, window.grid_step, reach)
    beyond = size // 2 + 1 - reach  # frequencies bounded by `tail`
    noise = (
        float((weighted[live] * values).sum())
        + _UNDERFLOW * weight_sum * (1.0 + 1e-6)
        + 2.0 * beyond * tail
    )
    mass_error = math.sqrt(
        float((multiplicity[live] * values * values).sum()) + 2.0 * beyond * tail * tail
    ) + _UNDERFLOW * math.sqrt(2.0 * reach)
    scale = inverse_error(size)
    if held_as_band:
        coefficients = spectrum[:band]
        rotation = _ROTATION * _modulus_upper(coefficients)
        noise += float((multiplicity[:band] * weight[:band] * rotation).sum())
        mass_error += math.sqrt(float((multiplicity[:band] * rotation * rotation).sum()))
        norm = math.sqrt(float((multiplicity[:band] * _modulus_upper(coefficients) ** 2).sum()))
        inverse = scale * (norm + mass_error)
        bounds = _Bounds(noise, inverse, mass_error + inverse)
        return window.band_result(coefficients, bounds)
    norm = math.sqrt(float((multiplicity * _modulus_upper(spectrum[:reach]) ** 2).sum()))
    inverse = scale * (norm + mass_error)
    masses = certified_inverse(spectrum, size)
    bounds = _Bounds(noise, inverse, mass_error + inverse)
    return window.result(masses, bounds)


class _Bounds(NamedTuple):
    """The round-off bounds of a composition (see :class:`ComposedPLD`), each rounded up."""

    noise: float
    mass_noise: float
    mass_error: float


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
    #: the sum of the moduli of the terms of log_mgf_total (for its evaluation error)
    log_mgf_magnitude: np.ndarray | None = None
    #: the number of PLDs whose terms are summed (into log_mgf_total and log_finite)
    terms: int = 1

    @classmethod
    def of(
        cls,
        plds: Sequence[DiscretePLD],
        counts: Sequence[int],
        log_tail: float,
        span_counts: Sequence[int] | None = None,
    ) -> _Window:
        """The window of the composition of ``counts`` copies of ``plds``; with
        ``span_counts``, its circle is at least as long as that composition's would be (a
        longer circle holds the same window with less folded onto it)."""
        grid_step = plds[0].grid_step
        log_mgf_total = np.zeros(2 * _CHERNOFF_T.size)
        log_mgf_magnitude = np.zeros(2 * _CHERNOFF_T.size)
        support_low = support_high = 0
        log_finite = 0.0
        for pld, count in zip(plds, counts):
            term = count * pld.chernoff_log_mgf
            log_mgf_total += term
            log_mgf_magnitude += np.abs(term)
            support_low += count * pld.offset
            support_high += count * (pld.offset + pld.mass.size - 1)
            log_finite += count * math.log1p(-pld.infinity_mass)
        a, b = chernoff_window(log_mgf_total, log_tail)
        # A bound that is not finite (a log-MGF of -inf: no finite mass left, as in the
        # optimistic PLD of a near-null composition) bounds nothing: the support does.
        start = max(int(np.floor(a / grid_step)), support_low) if math.isfinite(a) else support_low
        stop = min(int(np.ceil(b / grid_step)), support_high) if math.isfinite(b) else support_high
        size = _circle_size(max(stop - start + 1, 2))
        if span_counts is not None:
            size = max(size, cls.of(plds, span_counts, log_tail).size)
        return cls(start, size, support_low, support_low, support_high, log_mgf_total, log_finite,
                   grid_step, log_mgf_magnitude, len(plds))

    def result(self, circular: np.ndarray, bounds: _Bounds) -> ComposedPLD:
        """The :class:`ComposedPLD` of the circular composition ``circular`` (index 0 = loss
        ``shift * h``, where ``shift`` is the sum of the composed offsets)."""
        mass = np.roll(circular, self._rotation)
        return self._composed(bounds, dense=mass)

    def band_result(self, band: np.ndarray, bounds: _Bounds) -> ComposedPLD:
        """The :class:`ComposedPLD` of a circular composition whose real-FFT spectrum is
        ``band`` at frequencies 0 .. J-1 and 0 at every other frequency, held spectral. The roll
        of :meth:`result` by r points multiplies frequency f by ``w^{-f r}`` (its argument
        reduced modulo n in integers)."""
        turn = (np.arange(band.size, dtype=np.int64) * self._rotation) % self.size
        coefficients = band * np.exp((-2j * math.pi / self.size) * turn)
        spectral = BandSpectrum(coefficients, self.size, self.grid_step)
        return self._composed(bounds, spectral=spectral)

    @property
    def _rotation(self) -> int:
        """The roll that brings loss ``start * h`` to index 0 of the circular result."""
        return (self.shift - self.start) % self.size

    def _composed(self, bounds: _Bounds, **masses: Any) -> ComposedPLD:
        window_low = self.start * self.grid_step
        window_high = (self.start + self.size - 1) * self.grid_step
        below, above = chernoff_tails(
            self.log_mgf_total, window_low, window_high, self.log_mgf_magnitude, self.terms
        )
        if self.start <= self.support_low:
            below = 0.0
        if self.start + self.size - 1 >= self.support_high:
            above = 0.0
        infinity_mass = float(-np.expm1(self.log_finite))
        # log_finite = sum_i c_i log1p(-p_i): each term within 3 u, the sum gamma_{terms}, of
        # terms of one sign, so within (3 u + gamma_terms) |log_finite|; 1 - e^x moves by at
        # most e^x times that, and |x| e^x <= 1 - e^x for x <= 0; expm1 adds 2 u.
        infinity_error = (5.0 * _UNIT + _gamma(self.terms)) * infinity_mass * (1.0 + 1e-6)
        return ComposedPLD(
            start=self.start,
            **masses,
            infinity_mass=infinity_mass,
            infinity_error=infinity_error,
            above=above,
            below=below,
            grid_step=self.grid_step,
            noise=bounds.noise * _MARGIN,
            mass_noise=bounds.mass_noise * _MARGIN,
            mass_error=bounds.mass_error * _MARGIN,
        )


def _compose_by_products(
    plds: Sequence[DiscretePLD],
    counts: Sequence[int],
    log_tail: float,
    *,
    parallel: bool,
    paired: bool = True,
) -> ComposedPLD:
    """The composition with the spectrum ``prod_i F_i^{c_i}`` formed by complex multiplication
    (integer powers by repeated squaring). Every factor has modulus at most its mass (<= 1 up to
    round-off, or the small excess of a first-level result), so partial products never overflow,
    and an entry that underflows is below every digit of the inverse transform. With
    ``parallel`` the factors are split into ``_PRODUCT_CHUNKS`` chunks multiplied on the worker
    threads (a fixed number, so the rounding does not depend on the number of threads). With
    ``paired`` the factors' transforms are taken two at a time, as one complex transform
    (:func:`certified_forward_pair`: half the work, with its own error bound, about
    sqrt(2) times a single transform's for two similar PLDs, see :func:`_pair_errors`).

    Where the pair pays: a composition that is queried (the last level of a two-level or
    staged composition) carries the spectrum's error into delta through the hockey-stick
    weights ``|W_f| / n``, which fall off with the frequency, and its circle is the largest, so
    pairs save the most there for a small widening; a composition made into a PLD for a further
    level (:func:`_as_pld`) moves its whole l1 mass error to its top point, where it enters
    every delta in full, on a small circle whose transforms are cheap: there each factor is
    transformed on its own (``paired`` False)."""
    window = _Window.of(plds, counts, log_tail)
    size = window.size

    def transforms(chunk: range) -> Iterator[tuple[int, np.ndarray, float]]:
        """(index, transform, its error bound) of each PLD of the chunk, in order: two at a
        time by :func:`certified_forward_pair` (half the work), the last alone if odd."""
        indices = list(chunk)
        singles = indices if not paired else indices[len(indices) - len(indices) % 2 :]
        for position in range(0, len(indices) - 1, 2) if paired else ():
            first, second = indices[position], indices[position + 1]
            folded = (plds[first].folded(size), plds[second].folded(size))
            pair = certified_forward_pair(*folded, size)
            errors = _pair_errors(plds[first], plds[second], size, folded=folded)
            yield first, pair[0], errors[0]
            yield second, pair[1], errors[1]
        for single in singles:
            transform = certified_forward(plds[single].on_circle(size), size)
            yield single, transform, _leaf_error(plds[single], size)

    half = size // 2 + 1
    rest = _log_growth(plds, counts, size)

    def product(chunk: range) -> tuple[np.ndarray, _LogModuli]:
        """The chunk's product and log-moduli. Frequencies are dropped as they die: once the
        partial ``upper`` plus ``rest`` (a bound on every factor's contribution, over all the
        PLDs, :func:`_log_growth`) is at most ``_EXP_IS_ZERO - 2`` at frequency f, the final
        ``upper`` there is below ``_EXP_IS_ZERO`` whatever the other factors, so the round-off
        bound is the underflow slack alone, which also covers the exact product's modulus
        (at most e^upper): the product is set to 0 there and the rest of the factors' logarithms
        and powers are skipped (the recorded partial ``upper`` and ``lower`` stay below the
        threshold, so :func:`_live_product_error` treats the entry as dead). The live entries
        only ever shrink to a prefix (its length is recomputed after every factor), a band of
        low frequencies for a composition of more than a few PLDs."""
        out = np.ones(half, dtype=complex)
        upper, lower = np.zeros(half), np.zeros(half)
        total, terms, positive = 0, 0, 0.0
        top = half
        cutoff = _EXP_IS_ZERO - 2.0 - rest if rest is not None else math.nan
        for index, transform, error in transforms(chunk):
            # On [0, top): upper += c log(|F| + E), lower += c log |F| (moduli rounded up, as
            # :func:`_modulus_upper`), then the live prefix cut at the last upper above the
            # cutoff, and only that prefix multiplied by F^c (repeated squaring, as
            # :func:`_integer_power`): every entry above it is set to 0 at the end (the live
            # prefix only shrinks), whatever its product. (A block of a staged composition keeps
            # about 2% of its circle: q = 5e-4, sigma = 0.6, 6,250 steps per block.) In the
            # compiled core, without the GIL: the chunks of a heterogeneous schedule's first
            # level run on both threads at once.
            count = counts[index]
            top = _core.pld_multiply_factor(out, upper, lower, transform, top, count, error,
                                            cutoff)
            total += count
            terms += 1
            positive += count * _positive_log_bound(transform[0], error)
        out[top:] = 0.0
        return out, _LogModuli(upper, lower, total, terms, positive)

    chunks = _chunks(len(plds), _PRODUCT_CHUNKS if parallel else 1)
    partial = parallel_map(product, chunks, threshold=2)
    spectrum, logs = partial[0]
    for other, other_logs in partial[1:]:
        with np.errstate(under="ignore"):
            spectrum *= other
        logs.merge(other_logs)
    significant = np.flatnonzero(np.abs(spectrum) > _NEGLIGIBLE_SPECTRUM)
    band = int(significant[-1]) + 1 if significant.size else 0
    computed = np.ones(size // 2 + 1, dtype=bool)
    return _result_of_spectrum(window, spectrum, band, logs, computed)


def _log_growth(plds: Sequence[DiscretePLD], counts: Sequence[int], size: int) -> float | None:
    """An upper bound on ``sum_i c_i log(a_i + E_i)`` over every PLD at every frequency, for
    the transforms of :func:`_compose_by_products` on ``size`` points (single or paired), or
    None where it exceeds 1 (then no frequency is dropped early).

    Every computed entry obeys ``|F^_f| <= |F_f| + E <= A + E`` with A the l1 bound of the
    masses, so ``a = |F^_f| (1 + 4 u) <= (A + E)(1 + 4 u)``. Each error bound ``E`` is at most
    ``4 (c + g + u) A_max + _UNDERFLOW``, with c = :func:`forward_error` and g the largest
    folding's ``gamma_{rows - 1}``: :func:`_leaf_error` is ``(c (1 + g) + g) A`` and
    :func:`_pair_errors` at most ``(2.1 c + 1.1 u + g) A_max + _UNDERFLOW``. The logarithm is
    raised by 1e-12 for its own rounding."""
    if not plds:
        return 0.0
    largest = max(_mass_l1(pld) for pld in plds)
    rows = max(-(-pld.mass.size // size) for pld in plds)
    folding = _gamma(rows - 1) if rows > 1 else 0.0
    error = 4.0 * (forward_error(size) + folding + _UNIT) * largest + _UNDERFLOW
    per_step = math.log((largest + error) * (1.0 + 8.0 * _UNIT) + error) + 1e-12
    growth = max(per_step, 0.0) * sum(counts) * _MARGIN
    return growth if growth <= 1.0 else None


def _mass_l1(pld: DiscretePLD) -> float:
    """:func:`_l1` of the PLD's masses, computed once per PLD."""
    return pld.mass_l1


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
            [plds[i] for i in chunk], [counts[i] for i in chunk], group_log_tail, parallel=False,
            paired=False,
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
    # The formed masses differ from the exact window's (a non-negative measure m) by at most
    # R = mass_error in l1, and clipping at 0 only brings them closer: m <= clip + (m - clip)_+
    # and clip <= m + (clip - m)_+, each positive part of mass <= R.
    roundoff = part.mass_error
    if pessimistic:
        roundoff += _UNIT * (mass[0] + part.below)  # the addition below
        mass[0] += part.below
        # (m - clip)_+ lies in the window: moved to its top point (moving mass to a larger loss
        # only raises every delta). The addition's own rounding is covered by the margin.
        mass[-1] += roundoff * _MARGIN * (1.0 + 4.0 * _UNIT)
        # (+inf mass rounded up: its evaluation error, then the sum's rounding)
        infinity = min(
            (part.infinity_mass + part.infinity_error + part.above) * (1.0 + 4.0 * _UNIT), 1.0
        )
        return DiscretePLD(part.start, mass, infinity, part.grid_step), 0.0, clipped
    # (clip - m)_+ (mass <= R) is bounded by the top R of clip's mass: for every non-decreasing
    # g >= 0 (a hockey-stick weight, or one composed with any non-negative measure), sum m g >=
    # sum min(clip, m) g = sum clip g - sum (clip - m)_+ g >= sum (clip - top_R) g, the top R
    # being the sub-measure of clip of mass R that maximises sum . g. So the top R of the mass
    # is removed (sent to loss -inf), which keeps every delta of every composition below.
    _remove_top(mass, roundoff * _MARGIN * (1.0 + 1e-12))
    # (+inf mass rounded down: its evaluation error, then the difference's rounding)
    infinity = max(part.infinity_mass - part.infinity_error, 0.0) * (1.0 - 2.0 * _UNIT)
    pld = DiscretePLD(part.start, mass, infinity, part.grid_step)
    return pld, part.above + part.below, clipped


def _remove_top(mass: np.ndarray, amount: float) -> None:
    """Remove ``amount`` of mass from the highest-loss entries of the non-negative ``mass``
    (in place; all of it if the total is smaller)."""
    if amount <= 0.0:
        return
    from_top = np.cumsum(mass[::-1])
    whole = int(np.searchsorted(from_top, amount, side="left"))  # entries emptied from the top
    if whole >= mass.size:
        mass[:] = 0.0
        return
    taken = float(from_top[whole - 1]) if whole else 0.0
    if whole:
        mass[mass.size - whole :] = 0.0
    index = mass.size - 1 - whole
    # the running sums are within gamma_whole of exact: take a little more, never less
    mass[index] = max(mass[index] - (amount - taken) - _gamma(whole + 2) * amount, 0.0)


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
    # row sums of products, not matrix products (BLAS orders its sums by its thread count)
    mass[:rows] = (by_row * (1.0 - upper_weight)).sum(axis=1)
    mass[1:] += (by_row * upper_weight).sum(axis=1)
    # Round-off of the spread (weights within 8 u each, sums of `factor` products and one more
    # addition): at most gamma_{factor + 9} times 2 ||m||_1 in l1; the mass it may have lost
    # (within the grid's range) is moved to its top point, which only raises every delta.
    mass[-1] += 2.0 * _gamma(factor + 9) * _l1(pld.mass) * _MARGIN
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
    moved_to_top = 0.0
    for copies, per_leaf in ((blocks, block_counts), (1, remainder_counts)):
        members = [i for i, count in enumerate(per_leaf) if count > 0]
        if not members:
            continue
        block = _compose_by_products(
            [plds[i] for i in members], [per_leaf[i] for i in members], block_log_tail,
            parallel=False, paired=False,
        )
        pld, excess, clipped = _as_pld(block, pessimistic)
        parts.append(coarsened(pld, factor, pessimistic=pessimistic))
        part_counts.append(copies)
        log_excess += copies * math.log1p(excess)
        inner_roundoff += copies * clipped
        moved_to_top += copies * block.mass_error
    result = _compose_by_products(parts, part_counts, log_tail - math.log(2.0), parallel=False)
    return dataclasses.replace(
        result, excess=math.expm1(log_excess), inner_roundoff=inner_roundoff,
        staged_roundoff=moved_to_top if pessimistic else 0.0,
    )


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
        # One stage with pruned leaf transforms (:func:`_pruned_reach`): _PRUNED_COST S K
        # operations each, in units of transform points (n log2 n per transform), and (the
        # composition then held as a band) no inverse.
        terms = sum(
            pld.mass.size * reach for pld, reach in zip(plds, reaches)  # type: ignore[operator]
        )
        return staged < 0.9 * _PRUNED_COST * terms / math.log2(whole)
    return staged < 0.9 * 3 * whole


_SMALL_CIRCLES = (16, 24, 32, 40, 48, 64, 72, 80, 96, 120, 128)


def _circle_size(needed: int) -> int:
    """The smallest size >= ``needed`` of the form m 2^k, m in {8, 9, 10, 12, 15} (at most 25%
    above ``needed``, few enough that cached spectra of an incremental run are reused over many
    steps), or up to 128 points the smallest multiple of 8 of the form m 2^k, m in {1, 3, 5, 9,
    15}: sizes the transforms of ``pld_transforms.cpp`` take (8 | n, odd part at most 15)."""
    if needed <= 128:
        # Multiples of 8 (the transforms of pld_transforms.cpp reduce angles by octants).
        return next(size for size in _SMALL_CIRCLES if size >= needed)
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
    :func:`_pruned_reach` (by :func:`certified_band`) where that is certified enough and
    cheaper. From ``spectra`` when it holds one of that size that reaches far enough."""
    reach = _pruned_reach(pld, size, count)
    needed = size // 2 + 1 if reach is None else reach
    if spectra is not None:
        hit = spectra.get(key)
        if hit is not None and hit.size == size and hit.transform.size >= needed:
            return hit
    if reach is None:
        transform = certified_forward(pld.on_circle(size), size)
        error = _leaf_error(pld, size)
    else:
        transform = certified_band(pld.mass, size, reach)
        error = band_dft_error(pld.mass.size, size) * _l1(pld.mass)
    with np.errstate(under="ignore"):
        modulus_squared = transform.real * transform.real + transform.imag * transform.imag
    direct = 0 if reach is None else reach
    return LeafSpectrum(size, transform, modulus_squared, error, direct, error if direct else 0.0)


def _l1(values: np.ndarray) -> float:
    """An upper bound on ``sum |values|``: any summation order errs by at most gamma_{N-1}
    relative on non-negative terms (Higham 2002, eq. 4.4)."""
    return float(np.abs(values).sum()) / (1.0 - _gamma(values.size + 1))


def _pair_errors(
    first: DiscretePLD,
    second: DiscretePLD,
    size: int,
    *,
    folded: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[float, float]:
    """Bounds on the errors of :func:`certified_forward_pair` of the two PLDs' masses folded onto
    the circle, each against the exact transform of its own exact folded masses (the analogue
    of :func:`_leaf_error`); ``folded``: the two folded vectors, if the caller has them.

    Proof. Let ``z = a + i b`` with a, b the computed folded vectors (``||a||_1 <= (1 + g_a) A``,
    A the masses' l1 bound and g_a the folding's rounding). The componentwise bound of part 1
    of the module docstring holds for complex input: ``|Z^_f - Z_f| <= c (|A_k| ... |A_0| |z|)_f
    = c sum_j |z_j|`` (every entry of the product of the stages' moduli is 1), with ``|z_j| =
    sqrt(a_j^2 + b_j^2)`` the complex modulus: so ``Z`` errs by at most ``c N`` at every
    frequency, ``N = sum_j |z_j|``, which is at most ``||a||_1 + ||b||_1`` and about
    ``sqrt(2) ||a||_1`` for two similar PLDs (Cauchy-Schwarz on each entry:
    ``sqrt(a^2 + b^2) <= a + b``, equality only where one of them is 0). N is evaluated from
    the folded vectors: each ``hypot`` within 1 ulp (2 u relative) of ``|z_j|``, their sum of
    non-negative terms within ``gamma_{n-1}`` of its exact value (Higham 2002, eq. 4.4), so
    ``N <= fl(sum fl(hypot)) / ((1 - 2 u)(1 - gamma_{n+1}))``; without the vectors the bound
    ``||a||_1 + ||b||_1 <= (1 + g_a) A + (1 + g_b) B`` is used. Unpacking, ``(Z_f + conj
    Z_{n-f}) / 2`` errs by at most ``c N`` (each of the two entries by ``c N``, halved), and its
    computed real and imaginary parts (one addition each, the halving exact) by ``u`` relative
    more, on a value of modulus at most ``||a||_1 + c N``; likewise for b with ``-i (Z_f - conj
    Z_{n-f}) / 2``. The folding adds ``g_a A`` (as in :func:`_leaf_error`), and ``_UNDERFLOW``
    covers a halving below the normal range."""
    c = forward_error(size)
    parts: list[tuple[float, float]] = []
    for pld in (first, second):
        mass_l1 = pld.mass_l1
        rows = -(-pld.mass.size // size)
        folding = _gamma(rows - 1) if rows > 1 else 0.0
        parts.append((mass_l1, folding))
    norms = [(1.0 + folding) * mass_l1 for mass_l1, folding in parts]
    joint_norm = norms[0] + norms[1]
    if folded is not None:
        moduli = float(np.hypot(folded[0], folded[1]).sum())
        bound = moduli / ((1.0 - 2.0 * _UNIT) * (1.0 - _gamma(folded[0].size + 1)))
        joint_norm = min(joint_norm, bound)
    joint = c * joint_norm
    errors = []
    for (mass_l1, folding), norm in zip(parts, norms):
        unpacked = joint * (1.0 + _UNIT) + _UNIT * (norm + joint)
        errors.append(unpacked * _MARGIN + folding * mass_l1 + _UNDERFLOW)
    return errors[0], errors[1]


def _leaf_error(pld: DiscretePLD, size: int) -> float:
    """Bound on the error of ``certified_forward(pld.folded(size), size)`` at every frequency
    against the exact transform of ``pld``'s masses folded onto the circle: the transform's
    :func:`forward_error` of the computed folded vector, plus the folding's rounding (each entry
    a sum of ``rows`` masses, gamma_{rows - 1} relative)."""
    mass_l1 = pld.mass_l1
    rows = -(-pld.mass.size // size)
    folding = _gamma(rows - 1) if rows > 1 else 0.0
    return (forward_error(size) * (1.0 + folding) + folding) * mass_l1


def _pruned_reach(pld: DiscretePLD, size: int, count: int) -> int | None:
    """A frequency K such that ``|F_k|^count <= e^-800`` at every frequency ``K <= k <= size /
    2`` of the circle, where F is the (exact) transform of ``pld``'s masses, when such a K is
    small enough for :func:`certified_band` below K (plus the certificate's own work) to be
    cheaper than the whole transform; else None. Two certificates, the smaller K is used:

    * total variation (summation by parts): with ``m_{-1} = m_S = 0``, ``(1 - e^{-i w}) F(w) =
      sum_{s=0}^{S} (m_s - m_{s-1}) e^{-i w s}``, so ``|F(w)| <= V / (2 |sin(w / 2)|)`` with V
      the total variation of the masses, growing less in ``w`` on ``[0, pi]``;
    * a coarse grid: F(w) is the trigonometric polynomial ``M(w) = sum_s m_s e^{-i w s}`` at
      ``w = 2 pi k / size``, and ``|M'(w)| <= D = sum_s |s - c| m_s`` for any centre c (after
      the unimodular factor ``e^{-i w c}``), so ``|M(w)| <= |M^(w_j)| + E + D pi / N`` at the
      point ``w_j = 2 pi j / N`` of a grid of N points nearest to w, with ``M^`` the
      :func:`certified_forward` transform of N points and E its :func:`forward_error` bound
      (:meth:`DiscretePLD.coarse_moduli`).

    Those entries are ones that :func:`compose` drops in any case (every product below
    e^-800); their exact values are bounded in the round-off bound (:func:`_pruned_tail`)."""
    mass = pld.mass
    if mass.size > size // 2 or count < 1:
        return None
    cost = size * math.log2(size)
    threshold = math.exp(-800.0 / count)
    reaches: list[int] = []
    variation = pld.total_variation
    if variation > 0.0 and math.log(0.5 * variation) + 800.0 / count < 0.0:
        sine = 0.5 * variation * math.exp(800.0 / count)
        reach = math.ceil(size / math.pi * math.asin(sine)) + 1
        if reach <= size // 2:
            reaches.append(reach)
    gap = -math.expm1(-800.0 / count)
    points = pld.coarse_points(gap)
    cheapest = cost - points * math.log2(points) if points is not None and points < size else cost
    if _PRUNED_COST * mass.size * _reach_at_least(pld, size, count) >= cheapest:
        return None  # no certificate's K is below that: skip the coarse grid's transform
    # (a coarse grid no smaller than the circle saves nothing: not transformed, which at a
    # large count would be a transform far above the circle's own size)
    coarse = pld.coarse_moduli(gap) if points is not None and points < size else None
    if coarse is not None:
        points, bound = coarse
        hot = np.flatnonzero(bound > threshold)
        last = int(hot[-1]) if hot.size else 0
        # Frequency k is nearest to the grid point round(k N / size); every k above
        # (last + 1/2) size / N is nearest to a point whose bound is at most the threshold.
        reach = math.floor((last + 0.5) * size / points) + 2
        if reach <= size // 2:
            reaches.append(reach)
        cost -= points * math.log2(points)
    if not reaches:
        return None
    reach = min(reaches)
    if _PRUNED_COST * mass.size * reach >= cost:
        return None
    return reach


def _reach_at_least(pld: DiscretePLD, size: int, count: int) -> int:
    """A frequency below every K that a certificate of :func:`_pruned_reach` can give (0 where
    none is known): with non-negative masses of total M and second moment S2 about their mean
    c (in grid steps), ``|F(w)| >= sum_s m_s cos(w (s - c)) >= M - w^2 S2 / 2``, so
    ``|F_k|^count > e^-800`` wherever ``M - w_k^2 S2 / 2 > e^(-800 / count)``, ``w_k = 2 pi k /
    size``, and a valid K lies above every such k. (1% below the formula's largest k, far more
    than the rounding of M and S2, so that the bound holds as computed.) Used to skip a
    certificate that cannot pay. At most ``size``: where S2 is so small that the formula passes
    every frequency (room / S2 overflowed to +inf for a PLD of sigma 13,540, q = 1e-6), no
    certificate can give a K, and ``size`` is below every one vacuously."""
    if count < 1 or not pld.non_negative:
        return 0
    total, second = pld.second_moment
    room = total - math.exp(-800.0 / count) * (1.0 + 1e-9)
    if room <= 0.0 or second <= 0.0:
        return 0
    return max(int(min(0.99 * size * math.sqrt(2.0 * room / second) / (2.0 * math.pi), size)), 0)


#: Cost of a pruned transform (:func:`certified_band`, S masses at K frequencies) against a
#: whole one of the circle (:func:`certified_forward`, n points): ``_PRUNED_COST S K`` against
#: ``n log2 n``. Measured on this project's 2-core machine when it was set: S K = 10^6 terms
#: in about 3 ms, a transform of n = 393,216 points (n log2 n = 7.3e6) in about 130 ms. The
#: transforms have since become far cheaper (about 9 ms for that circle, the band sums 1.4 ms
#: for 10^6 terms: a ratio near 1.1), but the rule is kept: the pruned route also spares the
#: composition's inverse transform (its band is summed in closed form), and a larger constant,
#: tried at 1 and 2, was slower on some fresh queries (down to 0.6x) and faster on others (up to
#: 1.8x, there only by skipping the band refinement of :func:`compose`, whose tighter bound
#: then no longer lowers epsilon: 3e-7 relative at q = 0.01, sigma = 1, T = 1e3).
_PRUNED_COST = 0.25


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
