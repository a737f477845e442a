"""Certified discretisation of a continuous, monotone privacy loss: mixtures of Gaussian or of
Laplace laws on the real line.

The leaves here are pairs (P, Q) of laws on the real line, each a finite mixture of one noise
law shifted, P = sum_i a_i F(x - mu_i), Q = sum_j b_j F(x - nu_j), F the Gaussian N(0, s^2) or
the Laplace law Lap(0, b), whose privacy loss L(x) = log(p(x) / q(x)) is monotone in x (each
case's proof is in :func:`pairs_of`). A pair whose branch is revealed (a mixture of pairs with
weights w_k the same under P and Q) is a list of weighted pairs; its privacy-loss distribution
is the w-mixture of theirs.

Discretisation (:func:`discretise`). The line is cut at x_1 < ... < x_N into the cells
(-inf, x_1], [x_1, x_2], ..., [x_N, inf), the cuts placed where L is (to interpolation
accuracy) a grid value k h, so that each finite cell's loss runs between two neighbouring grid
points (h the grid step; :func:`_cells`). Outside [x_1, x_N] each Gaussian component has at
most the truncation budget of its mass; a Laplace pair's loss is constant there. For each cell
c, with P-mass p_c and Q-mass q_c (CDF differences, each taken in the accurate tail: the upper
tail from the survival function), L is bounded on c by its values at the end points (L is
monotone; at +-inf its limit), widened by a floating-point margin: lo_c <= L <= hi_c on c.
Only these bounds and the masses enter the proofs below; where the cuts fall only decides how
tight the result is.

* Pessimistic. On c, Y = e^{-L} lies in [e^{-hi_c}, e^{-lo_c}] and E_P[Y; c] = q_c. Its
  conditional law under P is replaced by the two-point law on {e^{-hi_c}, e^{-lo_c}} with the
  same mean (masses at hi_c: p_c (e^{-lo_c} - m) / (e^{-lo_c} - e^{-hi_c}), m = q_c / p_c),
  which is a mean-preserving spread of it (every law on [a, b] with mean m is dominated in the
  convex order by the two-point law on {a, b} with mean m). delta(eps) = E[(1 - e^{eps}
  prod_i Y_i)_+] of a composition of independent leaves is convex in each Y_i, so by Jensen's
  inequality every delta(eps) of every composition can only grow (the "connect the dots"
  argument of Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, here on cells of x; with lo_c,
  hi_c on neighbouring grid points it is their connect-the-dots discretisation). q_c is
  lowered by a relative 1e-9 before the split (a smaller m puts more mass at hi_c: only
  pessimistic). A cell whose lo_c is -inf keeps all its mass at hi_c (L only grows); a cell
  whose hi_c is +inf (the tail beyond the truncation where L is unbounded) sends its P-mass to
  loss +inf, where delta counts it in full. The two atoms of every cell are then put on the
  grid by :func:`dpsharp.accountants._pld_atoms.place_atoms` (another mean-preserving spread).
* Optimistic. Each cell is merged into one outcome: a post-processing of the pair (the map
  x -> its cell), so every delta(eps) of every composition can only shrink. The merged outcome
  has loss log(p_c / q_c), taken as log(p_c (1 - 1e-9) / (q_c (1 + 1e-9))) clipped to
  [lo_c, hi_c] (a lower bound on it, since the true value lies in [lo_c, hi_c]); a cell whose
  q_c underflows is moved to lo_c, and dropped when lo_c is -inf (a non-negative term leaves
  the sum). Here the cells are centred on the grid points, and each merged atom is brought
  onto (just above) its grid point by merging into it a part of the next atom
  (:func:`dpsharp.accountants._pld_atoms.pulled_to_grid`, again a post-processing; the one
  construction shared with the atom leaves), then rounded down to the grid (place_atoms,
  optimistic: delta is non-decreasing in every loss): an error O(h^2) per release, like the
  pessimistic side's. The largest atom (a Laplace pair's constant loss beyond the extreme
  means) has nothing above it and is pulled down onto the grid point below it by merging in
  parts of the atoms below it, again a post-processing, instead of being rounded down. Two
  more roundings of the same atoms by merges, an upward and a downward sweep over all of them
  (:func:`_optimistic_on_grid`), are computed too, and the one that keeps the most of the
  mean loss is used: at a hard edge of the losses (a small mixture weight) only a sweep
  ending at the sparse side stays second order.

The masses are computed in double precision from closed forms (round-off about 1e-12 relative
for the narrow cells, like the cell masses of the Gaussian discretisation in the compiled core);
the loss bounds carry a margin of 64 ulps of the magnitudes that enter them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri
from scipy.stats import binom

from dpsharp._native import core as _core
from dpsharp.accountants._pld_atoms import _MAX_POINTS, place_atoms, pulled_to_grid
from dpsharp.events import (
    Event,
    GaussianMixture,
    Laplace,
    Neighbouring,
    PoissonSampled,
    ReplaceOnePoissonSampledGaussian,
    Shuffled,
    TruncatedPoissonSampledGaussian,
)

__all__ = [
    "CONTINUOUS_MECHANISMS",
    "asymmetric",
    "discretise",
    "event_variance",
    "is_leaf",
    "leaf_key",
    "pairs_of",
]

#: Mechanism codes of the continuous leaves (the compiled core's are 0-4, the atom leaves'
#: 16-19). Each leaf is (code, parameter, rate) as the other leaves are.
MIXTURE_REMOVE, MIXTURE_ADD = 20, 21
LAPLACE_REMOVE, LAPLACE_ADD = 22, 23
REPLACE_GAUSSIAN = 24
TRUNCATED_REMOVE, TRUNCATED_ADD = 25, 26
CONTINUOUS_MECHANISMS = (
    MIXTURE_REMOVE,
    MIXTURE_ADD,
    LAPLACE_REMOVE,
    LAPLACE_ADD,
    REPLACE_GAUSSIAN,
    TRUNCATED_REMOVE,
    TRUNCATED_ADD,
)

#: Most cells of one leaf (the cells' loss span is then widened beyond h / 2).
_MAX_CELLS = 1 << 21
#: Uniform cells of the first level of :func:`_cells`.
_COARSE = 2048
_ULP = 2.0**-52
#: Relative allowance for the round-off of the cell masses in the split and the merge.
_MASS_SLACK = 1e-9

# Specifications too long for a float (a mixture's vectors, a truncated batch), kept in a table
# so that a leaf stays a (code, float, float) triple; the rate field is a 52-bit digest of the
# specification (>= 1), a function of the specification only, so that the canonical order of
# the leaves (and every floating-point sum over them) does not depend on the order in which
# events were composed or restored.
_SPECS: dict[float, tuple[float, ...]] = {}


def _intern(spec: tuple[float, ...]) -> float:
    digest = hashlib.blake2b(repr(spec).encode(), digest_size=8).digest()
    key = float(1 + (int.from_bytes(digest, "big") >> 12))  # exact: an integer below 2^53
    found = _SPECS.setdefault(key, spec)
    if found != spec:  # a digest collision (probability about 2^-52 per pair of events)
        raise ValueError(f"two event specifications share a digest: {found!r} and {spec!r}")
    return key


@dataclass(frozen=True)
class Pair:
    """P = sum_i a_i F(. - mu_i) against Q = sum_j b_j F(. - nu_j), F = N(0, scale^2)
    (``gaussian``) or Lap(0, scale); ``increasing``: whether L = log(p/q) is non-decreasing
    (else non-increasing)."""

    gaussian: bool
    scale: float
    p_means: tuple[float, ...]
    p_weights: tuple[float, ...]
    q_means: tuple[float, ...]
    q_weights: tuple[float, ...]
    increasing: bool

    def __post_init__(self) -> None:
        for means, weights, name in ((self.p_means, self.p_weights, "p"),
                                     (self.q_means, self.q_weights, "q")):
            kept = [(m, w) for m, w in zip(means, weights) if w > 0.0]
            object.__setattr__(self, f"{name}_means", tuple(m for m, _ in kept))
            object.__setattr__(self, f"{name}_weights", tuple(w for _, w in kept))

    def _log_density(
        self, x: npt.NDArray[np.float64], means: tuple[float, ...], weights: tuple[float, ...]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(log sum_i w_i f(x - m_i) without the common normalising constant, a bound on the
        magnitude of the terms that entered it)."""
        diff = x[:, None] - np.asarray(means)[None, :]
        if self.gaussian:
            terms = -0.5 * (diff / self.scale) ** 2
        else:
            terms = -np.abs(diff) / self.scale
        logs = np.log(np.asarray(weights))[None, :]
        shifted = terms + logs
        top = np.max(shifted, axis=1)
        value = top + np.log(np.sum(np.exp(shifted - top[:, None]), axis=1))
        return value, np.max(np.abs(terms), axis=1) + np.max(np.abs(logs))

    def loss(
        self, x: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(L(x), a margin: |computed - exact| <= margin)."""
        lp, mp = self._log_density(x, self.p_means, self.p_weights)
        lq, mq = self._log_density(x, self.q_means, self.q_weights)
        margin = 64.0 * _ULP * (mp + mq + np.abs(lp) + np.abs(lq) + 1.0)
        return lp - lq, margin

    def limit(self, upper: bool) -> float:
        """lim L(x) as x -> +inf (``upper``) or -inf: the ratio of the weights of the extreme
        components when P and Q share the extreme mean, else -+inf."""
        pick = max if upper else min
        mp, mq = pick(self.p_means), pick(self.q_means)
        if mp != mq:
            return math.inf if (mp > mq) == upper else -math.inf
        wp = math.fsum(w for m, w in zip(self.p_means, self.p_weights) if m == mp)
        wq = math.fsum(w for m, w in zip(self.q_means, self.q_weights) if m == mq)
        return math.log(wp / wq)

    def masses(self, cuts: npt.NDArray[np.float64], means: tuple[float, ...],
               weights: tuple[float, ...]) -> npt.NDArray[np.float64]:
        """Masses of the cells (-inf, c_1], [c_1, c_2], ..., [c_N, inf) under the mixture, each
        component's cell mass from its CDF below its mean and its survival function above."""
        out = np.zeros(cuts.size + 1)
        for mean, weight in zip(means, weights):
            z = (cuts - mean) / self.scale
            if self.gaussian:
                cdf, sf = ndtr(z), ndtr(-z)
            else:
                half = 0.5 * np.exp(-np.abs(z))
                cdf = np.where(z < 0.0, half, 1.0 - half)
                sf = np.where(z < 0.0, 1.0 - half, half)
            from_cdf = np.diff(np.concatenate(([0.0], cdf, [1.0])))
            from_sf = -np.diff(np.concatenate(([1.0], sf, [0.0])))
            above = np.concatenate(([False], z >= 0.0))  # the cell starts at or above the mean
            cell = np.where(above, from_sf, from_cdf)
            out += weight * np.maximum(cell, 0.0)
        return out

    def support(self, tail: float) -> tuple[float, float]:
        """[x_lo, x_hi] outside which each component has mass at most ``tail`` / 2 per side
        (Laplace: the span of the means, beyond which L is constant)."""
        means = self.p_means + self.q_means
        if not self.gaussian:
            return min(means), max(means)
        z = -float(ndtri(max(tail, 1e-300) / 2.0))
        return min(means) - z * self.scale, max(means) + z * self.scale


def pairs_of(mechanism: int, parameter: float, rate: float) -> list[tuple[float, Pair]]:
    """The branches (weight, pair) of one continuous leaf, in the units of its event
    (:mod:`dpsharp.events`). Monotonicity of each loss:

    * mixture of Gaussians, c_i >= 0: log p/q = log sum_i p_i e^{(c_i x - c_i^2 / 2)/s^2}, a sum
      of non-decreasing terms inside the log (remove); its negative (add).
    * Poisson-sampled Laplace: log((1 - q) + q e^{(|x| - |x - 1|)/b}), |x| - |x - 1|
      non-decreasing (remove); its negative (add).
    * replace-one Poisson-sampled Gaussian: p/q = ((1 - q) + q e^{-(x + 1/4)/z^2}) /
      ((1 - q) + q e^{(x - 1/4)/z^2}) after dividing both by the N(0, z^2) density:
      a decreasing numerator over an increasing denominator.
    """
    if mechanism in (MIXTURE_REMOVE, MIXTURE_ADD):
        spec = _SPECS[rate]
        half = len(spec) // 2
        means, weights = tuple(spec[:half]), tuple(spec[half:])
        mixture = Pair(True, parameter, means, weights, (0.0,), (1.0,), True)
        return [(1.0, mixture if mechanism == MIXTURE_REMOVE else _reverse(mixture))]
    if mechanism in (LAPLACE_REMOVE, LAPLACE_ADD):
        q = rate
        mixture = Pair(False, parameter, (0.0, 1.0), (1.0 - q, q), (0.0,), (1.0,), True)
        return [(1.0, mixture if mechanism == LAPLACE_REMOVE else _reverse(mixture))]
    if mechanism == REPLACE_GAUSSIAN:
        return [(1.0, _replace_pair(parameter, rate))]
    if mechanism in (TRUNCATED_REMOVE, TRUNCATED_ADD):
        q, n, batch = _SPECS[rate]
        t, q_full = truncation(q, int(n), int(batch))
        sampled = Pair(True, parameter, (0.0, 1.0), (1.0 - q, q), (0.0,), (1.0,), True)
        if q == 1.0:
            sampled = Pair(True, parameter, (1.0,), (1.0,), (0.0,), (1.0,), True)
        if mechanism == TRUNCATED_ADD:
            sampled = _reverse(sampled)
        branches = [(1.0 - t, sampled)]
        if t > 0.0 and q_full > 0.0:
            # the full-batch branch: the replace-one pair of noise sigma / 2 and means -+1 in
            # units of C, i.e. means -+1/2 in units of the replace-one sensitivity 2C
            # (noise multiplier sigma / 4 there)
            branches.append((t, _replace_pair(parameter / 4.0, min(q_full, 1.0))))
        return [(w, pair) for w, pair in branches if w > 0.0]
    raise ValueError(f"mechanism must be one of {CONTINUOUS_MECHANISMS}, got {mechanism!r}")


def _replace_pair(z: float, q: float) -> Pair:
    """(1 - q) N(0, z^2) + q N(-1/2, z^2) against (1 - q) N(0, z^2) + q N(1/2, z^2)."""
    if q >= 1.0:
        return Pair(True, z, (-0.5,), (1.0,), (0.5,), (1.0,), False)
    return Pair(True, z, (0.0, -0.5), (1.0 - q, q), (0.0, 0.5), (1.0 - q, q), False)


def _reverse(pair: Pair) -> Pair:
    return Pair(pair.gaussian, pair.scale, pair.q_means, pair.q_weights, pair.p_means,
                pair.p_weights, not pair.increasing)


def truncation(q: float, n: int, batch: int) -> tuple[float, float]:
    """(t, q') of a truncated Poisson-sampled batch (Chua et al. 2024): t = P(Binom(n - 1, q)
    >= B), the probability that the other records fill the batch, and q' =
    P(Binom(n, q) > B) B / (t n), the probability that a given record is in the truncated
    batch given that they do (as dp-accounting 0.6.0 computes them)."""
    t = float(binom.sf(batch - 1, n - 1, q))
    if t == 0.0:
        return 0.0, 0.0
    return t, float(binom.sf(batch, n, q)) * batch / t / n


def _cells(
    pair: Pair, grid_step: float, tail: float, offset: float = 0.0
) -> npt.NDArray[np.float64]:
    """The cut points x_1 < ... < x_N on the support, placed where L is close to a grid
    value k h, so that each cell's loss bounds are close to two neighbouring grid points and
    the cell's two-point law nearly sits on the grid (connect the dots): L is tabulated on
    ``_COARSE`` uniform cells, each cut into parts over which L moves by at most 16 h, and
    each grid value is located by linear interpolation in that table (L is monotone). At most
    ``_MAX_CELLS`` cells (every j-th grid value beyond that). ``offset`` = 1/2 cuts at the
    midpoints (k + 1/2) h instead, for cells centred on the grid points. Any cuts are sound:
    the loss bounds of each cell are evaluated at its end points; only the tightness depends
    on them."""
    lo, hi = pair.support(tail)
    if hi <= lo:
        return np.array([lo])
    coarse = np.linspace(lo, hi, _COARSE + 1)
    values, _ = pair.loss(coarse)
    change = np.abs(np.diff(values))
    parts = np.clip(np.ceil(change / (16.0 * grid_step)), 1.0, 4096.0).astype(np.int64)
    starts = np.repeat(coarse[:-1], parts)
    widths = np.repeat(np.diff(coarse) / parts, parts)
    offsets = np.arange(int(parts.sum())) - np.repeat(np.cumsum(parts) - parts, parts)
    table = np.concatenate((starts + offsets * widths, coarse[-1:]))
    losses, _ = pair.loss(table)
    if not pair.increasing:
        table, losses = table[::-1], losses[::-1]
    losses = np.maximum.accumulate(losses)  # monotone up to round-off, for the interpolation
    first = math.ceil(losses[0] / grid_step - offset)
    last = math.floor(losses[-1] / grid_step - offset)
    stride = max(1, math.ceil((last - first + 1) / _MAX_CELLS))
    levels = (np.arange(first, last + 1, stride, dtype=np.float64) + offset) * grid_step
    cuts = np.interp(levels, losses, table)
    cuts = np.unique(np.concatenate((cuts, [lo, hi])))
    return cuts


def _cell_atoms(
    pair: Pair, grid_step: float, tail: float, pessimistic: bool
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float]:
    """(losses, masses, mass at +inf) of the pair's cells (module docstring)."""
    cuts = _cells(pair, grid_step, tail, 0.0 if pessimistic else 0.5)
    values, margin = pair.loss(cuts)
    if pair.gaussian:
        limits = [pair.limit(False), pair.limit(True)]
        ends = np.concatenate((limits[:1], values, limits[1:]))
        # a finite limit is log(wp / wq) of correctly rounded sums: the quotient and the log
        # within 3 ulp of it
        limit_slack = [4.0 * _ULP * (abs(x) + 1.0) if math.isfinite(x) else 0.0 for x in limits]
        slack = np.concatenate((limit_slack[:1], margin, limit_slack[1:]))
    else:  # Laplace: L is constant beyond the extreme means, which are the end cuts
        ends = np.concatenate((values[:1], values, values[-1:]))
        slack = np.concatenate((margin[:1], margin, margin[-1:]))
    left, right = ends[:-1], ends[1:]
    left_slack, right_slack = slack[:-1], slack[1:]
    if pair.increasing:
        lo, hi = left - left_slack, right + right_slack
    else:
        lo, hi = right - right_slack, left + left_slack
    p = pair.masses(cuts, pair.p_means, pair.p_weights)
    q = pair.masses(cuts, pair.q_means, pair.q_weights)
    infinity = 0.0
    if pessimistic:
        unbounded = np.isposinf(hi)
        infinity = float(p[unbounded].sum())
        keep = ~unbounded & (p > 0.0)
        p, q, lo, hi = p[keep], q[keep], lo[keep], hi[keep]
        split = np.isfinite(lo) & (hi > lo)
        # share at hi: (e^{-lo} - m) / (e^{-lo} - e^{-hi}) = (1 - m e^{lo}) / (1 - e^{lo - hi})
        with np.errstate(divide="ignore"):
            log_mean = np.log(q * (1.0 - _MASS_SLACK)) - np.log(p)  # log m, m = q_c / p_c
        m_scaled = np.where(split, np.exp(np.where(split, lo, 0.0) + log_mean), 0.0)
        gap = np.where(split, -np.expm1(np.where(split, lo - hi, -1.0)), 1.0)
        share = np.where(split, np.clip((1.0 - m_scaled) / gap, 0.0, 1.0), 1.0)
        losses = np.concatenate((hi, lo[split]))
        masses = np.concatenate((p * share, (p * (1.0 - share))[split]))
        used = masses > 0.0
        return losses[used], masses[used], infinity
    keep = p > 0.0
    p, q, lo, hi = p[keep], q[keep], lo[keep], hi[keep]
    with np.errstate(divide="ignore"):
        merged = np.log(p * (1.0 - _MASS_SLACK)) - np.log(q * (1.0 + _MASS_SLACK))
    merged = np.minimum(np.maximum(merged, lo), hi)  # q = 0: +inf, clipped to hi
    merged = np.where(q > 0.0, merged, lo)
    used = np.isfinite(merged)  # -inf (q underflowed where lo is -inf): dropped
    return merged[used], p[used], 0.0


def _optimistic_on_grid(
    losses: npt.NDArray[np.float64], masses: npt.NDArray[np.float64], grid_step: float
) -> tuple[int, npt.NDArray[np.float64]]:
    """(offset, masses) on the grid {k grid_step} of the merged cell atoms of one branch
    (``_cell_atoms``, optimistic): three certified roundings, each by mean-preserving merges of
    parts of atoms (post-processings, module docstring), the one with the largest mean loss
    sum_k m_k k h kept (the closest to the branch's Kullback-Leibler divergence, which no
    optimistic rounding can raise):

    * each atom pulled onto its nearest grid point by parts of the next ones
      (:func:`dpsharp.accountants._pld_atoms.pulled_to_grid`, then :func:`place_atoms`);
    * an upward sweep aiming each group at the grid point at or above its first atom, and a
      downward sweep aiming at the one below (``pld_merge_onto_grid`` of the compiled core,
      the merges of the Gaussian leaves' cells there).

    Which is best depends on where the losses are dense: a sweep's last group, or an atom in
    the upper half of its cell under nearest-point targets, is rounded down whole, harmless at
    a sparse tail but first order at a hard edge. A mixture of Gaussians with a small weight
    q on the shifted component has half its mass within two cells above log(1 - q) (q = 5e-4,
    sigma = 0.6, h = 2^-14), where only the upward sweep keeps the divergence (to 2e-3; the
    nearest-point pull lost all of it there, 20000 releases then bracketed 0.43% wide)."""
    h = float(grid_step)
    candidates = [place_atoms(*pulled_to_grid(losses, masses, h), h, False)]
    order = np.argsort(losses, kind="stable")
    sorted_losses, sorted_masses = losses[order], masses[order]
    if sorted_losses.size:
        lowest = math.floor(float(sorted_losses[0]) / h)
        if lowest * h > sorted_losses[0]:
            lowest -= 1
        size = math.floor(float(sorted_losses[-1]) / h) - lowest + 1
        if size <= _MAX_POINTS:
            for upward in (True, False):
                offset, mass = _core.pld_merge_onto_grid(
                    sorted_losses, sorted_masses, lowest, size, h, upward
                )
                candidates.append((int(offset), np.asarray(mass)))

    def mean_loss(candidate: tuple[int, npt.NDArray[np.float64]]) -> float:
        offset, mass = candidate
        return math.fsum(mass * (offset + np.arange(mass.size)))

    return max(candidates, key=mean_loss)


def discretise(
    mechanism: int,
    parameter: float,
    rate: float,
    grid_step: float,
    tail: float,
    pessimistic: bool,
) -> tuple[int, npt.NDArray[np.float64], float]:
    """(offset, masses, infinity mass) of the leaf on the grid {k grid_step}: mass[i] at loss
    (offset + i) grid_step (module docstring), truncated where each Gaussian component has at
    most ``tail`` of its mass beyond the cells."""
    losses, masses, infinity = [], [], 0.0
    for weight, pair in pairs_of(mechanism, parameter, rate):
        branch_losses, branch_masses, branch_infinity = _cell_atoms(
            pair, grid_step, tail, pessimistic
        )
        if not pessimistic:  # already on the grid: its points are exact atoms of place_atoms
            offset, on_grid = _optimistic_on_grid(branch_losses, branch_masses, grid_step)
            branch_losses = (offset + np.arange(on_grid.size)) * grid_step
            branch_masses = on_grid
        losses.append(branch_losses)
        masses.append(weight * branch_masses)
        infinity += weight * branch_infinity
    offset, out = place_atoms(np.concatenate(losses), np.concatenate(masses), grid_step,
                              pessimistic)
    return offset, out, infinity


def is_leaf(event: Event) -> bool:
    """Whether ``event`` is a leaf of this module."""
    if isinstance(event, PoissonSampled):
        return isinstance(event.event, Laplace)
    return isinstance(
        event, (GaussianMixture, ReplaceOnePoissonSampledGaussian, TruncatedPoissonSampledGaussian)
    )


def leaf_key(event: Event, relation: Neighbouring, direction: str) -> tuple[int, float, float]:
    """(mechanism code, parameter, rate) of ``event`` in ``direction`` ("remove": P is the law
    on the dataset holding the record; "add": the reverse)."""
    remove = direction == "remove"
    if isinstance(event, PoissonSampled):
        assert isinstance(event.event, Laplace)
        code = LAPLACE_REMOVE if remove else LAPLACE_ADD
        return (code, event.event.scale, event.sampling_probability)
    if isinstance(event, GaussianMixture):
        spec = tuple(event.sensitivities) + tuple(event.probabilities)
        return (MIXTURE_REMOVE if remove else MIXTURE_ADD, event.noise_multiplier, _intern(spec))
    if isinstance(event, ReplaceOnePoissonSampledGaussian):
        return (REPLACE_GAUSSIAN, event.noise_multiplier, event.sampling_probability)
    assert isinstance(event, TruncatedPoissonSampledGaussian)
    spec = (event.sampling_probability, float(event.dataset_size), float(event.max_batch_size))
    code = TRUNCATED_REMOVE if remove else TRUNCATED_ADD
    return (code, event.noise_multiplier, _intern(spec))


def asymmetric(leaves: Iterable[Event], relation: Neighbouring) -> bool:
    """Whether a leaf among ``leaves`` has different remove and add pairs."""
    for leaf in leaves:
        inner = leaf.event if isinstance(leaf, Shuffled) else leaf
        if is_leaf(inner) and not isinstance(inner, ReplaceOnePoissonSampledGaussian):
            return True
    return False


def event_variance(event: Event) -> float:
    """A proxy for Var_P(L) of the event's remove pair (for the grid step): the variance of
    the cells' losses on a coarse grid."""
    key = leaf_key(event, Neighbouring.ADD_REMOVE, "remove")
    total = 0.0
    for weight, pair in pairs_of(*key):
        losses, masses = pulled_to_grid(*_cell_atoms(pair, 1e-2, 1e-12, False)[:2], 1e-2)
        mass = float(masses.sum())
        if mass <= 0.0:
            continue
        mean = float(np.dot(masses, losses)) / mass
        total += weight * float(np.dot(masses, (losses - mean) ** 2)) / mass
    return max(total, 1e-12)
