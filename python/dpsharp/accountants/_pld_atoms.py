"""Mechanisms whose privacy loss takes finitely many values: their exact privacy-loss atoms, the
certified discretisation of the atoms on a grid, and their exact Renyi divergences.

Randomized response and the discrete Laplace mechanism have, for each pair (P, Q) of output
laws on neighbouring datasets, a privacy loss L = log(P(o) / Q(o)), o ~ P, with finitely many
values l_i and masses m_i (:func:`atoms`; derivations in :mod:`dpsharp.events`). From the atoms:

* Renyi divergence, exactly, at every order (:func:`atoms_rdp`):
  D_alpha(P || Q) = log(sum_i m_i e^{(alpha - 1) l_i}) / (alpha - 1) for alpha > 1
  (Mironov 2017, Definition 3, written as an expectation under P), the Kullback-Leibler
  divergence sum_i m_i l_i at alpha = 1 and max_i l_i at alpha = inf (its limits).
* A privacy-loss distribution on the grid {k h} (:func:`discretise_atoms`):

  - pessimistic: each atom l between the grid points a = floor(l / h) h and b = a + h is split
    into masses at a and b with the same mass and the same E[e^{-L}]
    (m_b = m (1 - e^{-(l - a)}) / (1 - e^{-h})). That is a mean-preserving spread of
    Y = e^{-L}; delta(eps) = E[(1 - e^{eps} Y)_+] is convex in each independent factor Y_i of a
    composition, so by Jensen's inequality every delta(eps) of every composition can only grow
    (the "connect the dots" argument of Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022,
    applied to atoms). Its error is O(h^2) per atom.
  - optimistic: the atoms are merged into pools that land on grid points
    (:func:`pulled_to_grid`: each pool a post-processing of the pair, a mean-preserving
    contraction of Y, so every delta(eps) of every composition can only shrink), then rounded
    down to the grid (delta(eps) is non-decreasing in every loss): a certified lower bound
    whose error is second order in the distance moved (O(h d) per release for atoms d apart,
    where rounding every atom down errs by O(h)).

  A loss span wider than ``_MAX_POINTS`` grid points keeps the top of the support: lower atoms
  are moved up to its bottom (pessimistic: losses only grow) or dropped (optimistic: a
  non-negative term only leaves the sum).

The masses are computed in double precision from closed forms (round-off about 1e-16
relative, like the cell masses of the Gaussian discretisation in the compiled core). The
losses placed on the grid are, for each side, the doubles on that side of the exact closed
forms (:func:`atom_loss_brackets`), so a rounded loss never moves an atom the wrong way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import mpmath
import numpy as np
import numpy.typing as npt
from scipy.special import logsumexp

from dpsharp._rounding import UNIT_ROUNDOFF as _UNIT
from dpsharp._rounding import gamma
from dpsharp.events import DiscreteLaplace, Event, Neighbouring, RandomizedResponse

__all__ = [
    "ATOM_EVENTS",
    "ATOM_MECHANISMS",
    "DISCRETE_LAPLACE",
    "RR_REPLACE",
    "RR_ZERO_ADD",
    "RR_ZERO_REMOVE",
    "atoms",
    "atom_loss_brackets",
    "atoms_rdp",
    "atoms_variance",
    "discretise_atoms",
    "place_atoms",
    "pulled_to_grid",
    "event_rdp",
    "leaf_key",
]

#: Mechanism codes of the atom leaves (the compiled core's codes are 0-4). Each leaf is
#: (code, parameter, rate) as the Gaussian-family leaves are: randomized response keeps
#: (noise parameter p, number of buckets k), the discrete Laplace mechanism (a, sensitivity).
RR_REPLACE, RR_ZERO_REMOVE, RR_ZERO_ADD, DISCRETE_LAPLACE = 16, 17, 18, 19
ATOM_MECHANISMS = (RR_REPLACE, RR_ZERO_REMOVE, RR_ZERO_ADD, DISCRETE_LAPLACE)

#: Largest loss span, in grid points, of one discretised atom leaf.
_MAX_POINTS = 1 << 22
#: Furthest atom a pool may merge a part of (:func:`pulled_to_grid`).
_MAX_PULL = 64
_ULP = 2.0**-52


def atoms(
    mechanism: int, parameter: float, rate: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(losses, masses) of the privacy loss under P of one atom leaf (masses sum to 1 up to
    round-off; atoms of zero mass are left out)."""
    losses, masses = _every_atom(mechanism, parameter, rate)
    keep = masses > 0.0
    return losses[keep], masses[keep]


def _every_atom(
    mechanism: int, parameter: float, rate: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """:func:`atoms` with the atoms of zero mass kept (the order of :func:`_exact_losses`)."""
    if mechanism in (RR_REPLACE, RR_ZERO_REMOVE, RR_ZERO_ADD):
        p, k = float(parameter), float(rate)
        # P(own bucket) = (1 - p) + p/k: as 1 - p (k - 1) / k it lost p / k to cancellation
        # once p (k - 1) / k rounds near 1 (k = 1e18, p = 1 - 2^-53: 1% of delta(0))
        own = (1.0 - p) + p / k
        other = p / k
        if mechanism == RR_REPLACE:
            # log(own / other) = log(1 + k (1 - p) / p)
            loss = math.log1p(k * (1.0 - p) / p)
            values = [(loss, own), (-loss, other), (0.0, (k - 2.0) * other)]
        else:
            # R(x) against the uniform U: own * k = 1 + (k - 1)(1 - p), other * k = p
            high, low = math.log1p((k - 1.0) * (1.0 - p)), math.log(p)
            if mechanism == RR_ZERO_REMOVE:
                values = [(high, own), (low, (k - 1.0) * other)]
            else:
                values = [(-high, 1.0 / k), (-low, (k - 1.0) / k)]
        return (np.array([loss for loss, _ in values], dtype=np.float64),
                np.array([mass for _, mass in values], dtype=np.float64))
    if mechanism == DISCRETE_LAPLACE:
        a, s = float(parameter), int(rate)
        r = math.exp(-a)
        x = np.arange(1, s, dtype=np.float64)
        inner = -math.expm1(-a) / (1.0 + r) * np.exp(-a * x)
        losses = np.concatenate(([a * s], a * (s - 2.0 * x), [-a * s]))
        masses = np.concatenate(([1.0 / (1.0 + r)], inner, [math.exp(-a * s) / (1.0 + r)]))
        return losses, masses
    raise ValueError(f"mechanism must be one of {ATOM_MECHANISMS}, got {mechanism!r}")


def _exact_losses(mechanism: int, parameter: float, rate: float) -> list[mpmath.mpf]:
    """The losses of :func:`_every_atom`, in its order, from the same closed forms evaluated
    in the working precision of mpmath from the double parameters."""
    if mechanism == DISCRETE_LAPLACE:
        a, s = mpmath.mpf(parameter), int(rate)
        return [a * s, *(a * (s - 2 * x) for x in range(1, s)), -a * s]
    p, k = mpmath.mpf(parameter), mpmath.mpf(rate)
    if mechanism == RR_REPLACE:
        loss = mpmath.log1p(k * (1 - p) / p)
        return [loss, -loss, mpmath.mpf(0)]
    high, low = mpmath.log1p((k - 1) * (1 - p)), mpmath.log(p)
    return [high, low] if mechanism == RR_ZERO_REMOVE else [-high, -low]


def atom_loss_brackets(
    mechanism: int, parameter: float, rate: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(below, above): for each atom of :func:`atoms` (the same order), the doubles at or below
    and at or above its exact loss, the closed form evaluated at 40 digits from the double
    parameters (the double of :func:`atoms` when it is exact, else it and its neighbour)."""
    losses, masses = _every_atom(mechanism, parameter, rate)
    if mechanism == DISCRETE_LAPLACE:
        brackets = _product_brackets(float(parameter), int(rate), losses)
        if brackets is not None:
            below, above = brackets
            return below[masses > 0.0], above[masses > 0.0]
    with mpmath.workdps(40):
        exact = [value for value, mass in zip(_exact_losses(mechanism, parameter, rate), masses)
                 if mass > 0.0]
        below = np.array([float(x) if mpmath.mpf(float(x)) <= x else
                          math.nextafter(float(x), -math.inf) for x in exact])
        above = np.array([float(x) if mpmath.mpf(float(x)) >= x else
                          math.nextafter(float(x), math.inf) for x in exact])
    return below, above


def _veltkamp_split(x: Any) -> tuple[Any, Any]:
    """(high, low) with x = high + low exactly, each of at most 26 significant bits (Veltkamp;
    no overflow for |x| < 2^996)."""
    scaled = 134217729.0 * x  # 2^27 + 1
    high = scaled - (scaled - x)
    return high, x - high


def _product_brackets(
    a: float, sensitivity: int, losses: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
    """(below, above) of the discrete Laplace losses a m (m = s, s - 2, ..., -s, the order of
    :func:`_every_atom`, whose doubles ``losses`` are the rounded products), from the exact
    rounding error of each product (Dekker's two-product: a m = p + e exactly, with the
    Veltkamp split of both factors into 26-bit halves), vectorised instead of one mpmath
    product per atom. None where the split is not exact (a factor or product near the ends
    of the double range, or |m| >= 2^53)."""
    if sensitivity >= 2**53 or not (2.0**-400 < a < 2.0**400):
        return None
    m = np.concatenate(([float(sensitivity)],
                        sensitivity - 2.0 * np.arange(1, sensitivity, dtype=np.float64),
                        [-float(sensitivity)]))
    product = a * m
    if not np.array_equal(product, losses) or not np.all(np.abs(product) < 2.0**900):
        return None
    a_high, a_low = _veltkamp_split(np.float64(a))
    m_high, m_low = _veltkamp_split(m)
    error = ((a_high * m_high - product) + a_high * m_low + a_low * m_high) + a_low * m_low
    below = np.where(error < 0.0, np.nextafter(product, -np.inf), product)
    above = np.where(error > 0.0, np.nextafter(product, np.inf), product)
    return below, above


def atoms_variance(mechanism: int, parameter: float, rate: float) -> float:
    """Var_P(L) of one atom leaf (for the grid step)."""
    losses, masses = atoms(mechanism, parameter, rate)
    mean = float(np.dot(masses, losses))
    return max(float(np.dot(masses, (losses - mean) ** 2)), 0.0)


def discretise_atoms(
    mechanism: int, parameter: float, rate: float, grid_step: float, pessimistic: bool
) -> tuple[int, npt.NDArray[np.float64], float]:
    """(offset, masses, infinity mass) of the leaf on the grid {k grid_step}: mass[i] at loss
    (offset + i) grid_step (module docstring: pessimistic split or optimistic round-down). Each
    atom's loss is the double on its side of the exact closed form (:func:`atom_loss_brackets`:
    at or above it for the pessimistic side, at or below for the optimistic one), not the
    rounded double of :func:`atoms`: a loss rounded down by an ulp left, after T releases, the
    top of the support T ulps low, and the certified delta there 0 where the exact one is
    not."""
    _, masses = atoms(mechanism, parameter, rate)
    below, above = atom_loss_brackets(mechanism, parameter, rate)
    rounding = _mass_rounding(mechanism, parameter, rate)
    if pessimistic:
        offset, out = place_atoms(above, masses, grid_step, True, mass_rounding=rounding)
    else:
        # each pool a sum of atoms' masses: within their rounding and gamma of the sum; taken
        # below it
        losses, pooled = pulled_to_grid(below, masses, grid_step, nearest=False)
        shrink = 1.0 - (rounding + gamma(masses.size + 1)) * (1.0 + 1e-6)
        offset, out = place_atoms(losses, pooled * shrink, grid_step, False)
    return offset, out, 0.0


def _mass_rounding(mechanism: int, parameter: float, rate: float) -> float:
    """A bound on the relative rounding of every atom mass of :func:`atoms` (closed forms of a
    few correctly rounded operations, exp and expm1 within 1 ulp): randomized response's
    (1 - p) + p / k, p / k, (k - 2) p / k, 1 / k and (k - 1) / k within 3 u; the discrete
    Laplace mechanism's 1 / (1 + r), (1 - r) r^x / (1 + r) and r^s / (1 + r), r = e^{-a}, with
    the exponentials of the rounded a x, within (8 + min(a s, 746)) u (the product a x errs by
    up to u a x, which the exponential turns into a relative error; past a x = 746 the mass is
    0 and the atom is left out). Doubled for room."""
    if mechanism == DISCRETE_LAPLACE:
        return 2.0 * (8.0 + min(float(parameter) * float(rate), 746.0)) * _UNIT
    return 8.0 * _UNIT



def place_atoms(
    losses: npt.NDArray[np.float64],
    masses: npt.NDArray[np.float64],
    grid_step: float,
    pessimistic: bool,
    *,
    mass_rounding: float = 0.0,
) -> tuple[int, npt.NDArray[np.float64]]:
    """(offset, masses) of the finite atoms (``losses``, ``masses``) on the grid
    {k grid_step}: mass[i] at loss (offset + i) grid_step. Pessimistic: each atom split
    between its two neighbouring grid points with its mass and E[e^{-L}] kept (a
    mean-preserving spread of e^{-L}); optimistic: each atom moved down to the grid point
    below it (module docstring). Also used by :mod:`._pld_continuous` for the atoms it makes
    of a continuous privacy loss.

    With ``mass_rounding`` (a bound on the relative rounding of every given mass), each part
    of a pessimistic split is raised past its rounding: the given mass's, the share's (two
    expm1 within 1 ulp and a quotient: 5 u of the share; 1 - share one more u of 1) and the
    product's, at most (``mass_rounding`` + 8 u) of the atom's mass, so every point's mass is
    at least the exact split's (more mass only raises every delta). A part that is exactly 0
    (an atom on a grid point, whose exact upper share is 0 too) stays 0."""
    losses = np.asarray(losses, dtype=np.float64)
    masses = np.asarray(masses, dtype=np.float64)
    h = float(grid_step)
    scaled = losses / h
    low = np.floor(scaled)
    frac_loss = losses - low * h  # in [0, h), exact up to the rounding of low * h
    if pessimistic:
        upper_share = np.where(frac_loss > 0.0, np.expm1(-frac_loss) / math.expm1(-h), 0.0)
        upper_share = np.clip(upper_share, 0.0, 1.0)
        index = np.concatenate((low, low + 1.0))
        lower_part, upper_part = masses * (1.0 - upper_share), masses * upper_share
        if mass_rounding:
            raise_by = masses * ((mass_rounding + 8.0 * _UNIT) * (1.0 + 1e-6))
            lower_part = np.where(lower_part > 0.0, lower_part + raise_by, lower_part)
            upper_part = np.where(upper_part > 0.0, upper_part + raise_by, upper_part)
        weight = np.concatenate((lower_part, upper_part))
        used = weight > 0.0  # an atom on a grid point has no upper part
        index, weight = index[used], weight[used]
    else:
        index, weight = low, masses
    if index.size == 0:
        return 0, np.zeros(1)
    top = float(index.max())
    bottom = max(float(index.min()), top - (_MAX_POINTS - 1))
    if pessimistic:
        index = np.maximum(index, bottom)  # losses only grow
    else:
        keep = index >= bottom
        index, weight = index[keep], weight[keep]  # non-negative terms leave the sum
    offset = int(bottom)
    size = int(top - bottom) + 1
    out = np.bincount((index - bottom).astype(np.int64), weights=weight, minlength=size)
    return offset, out


def pulled_to_grid(
    losses: npt.NDArray[np.float64],
    masses: npt.NDArray[np.float64],
    grid_step: float,
    nearest: bool = True,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Optimistic atoms moved onto (just above) grid points by merges, not by rounding down.

    With the atoms sorted by loss, atom k (loss l_k, mass m_k) has the target g_k = the grid
    point nearest l_k (``nearest``; the cells of :mod:`._pld_continuous`, centred on grid
    points) or the first grid point at or above l_k (else; the isolated atoms of this module,
    for which a round-down would err at first order), plus h / 1000; an atom already within
    h / 1000 above a grid point keeps its loss. If l_k < g_k and the next atom lies above g_k,
    a part t_k <= m_{k+1} of the next atom is merged into atom k, t_k = m_k expm1(g_k - l_k) /
    (-expm1(g_k - l_{k+1})), the part that puts the merged Y = e^{-L} mean at e^{-g_k}; the
    next atom keeps m_{k+1} - t_k (t_k is computed from m_k, not from what atom k kept, so the
    merged loss is at least g_k up to rounding). Where the next atom is too light, parts of
    the following ones (up to ``_MAX_PULL`` atoms on) are merged in too, out of what they
    keep (a pool whose own part shrinks so is only further above its target). The top atom
    has nothing above it: it is pulled down instead, onto the grid point below it (+ h / 1000),
    by merging into it parts of the atoms below (nearest first, out of what they keep: each
    giving pool then leans further toward its higher part, so is only further above its own
    target).

    Proof that the result is a certified lower bound. Every pool is a merge of outcomes of the
    pair (P, Q): outcomes o_1, o_2, ... (each a fraction of one atom's outcomes, chosen at
    random independently of the data) are reported as one outcome o*. That is a randomised
    post-processing, and o* has P-mass sum_i p_i and Q-mass sum_i p_i e^{-l_i}, i.e. loss
    -log of the P-mean of Y = e^{-L} over the pool: the merged law of Y is a mean-preserving
    contraction of the original one. delta(eps) = E[(1 - e^{eps} prod_i Y_i)_+] of a
    composition of independent releases is convex in each Y_i, so by Jensen's inequality
    every delta(eps) of every composition can only shrink (equivalently, by the
    post-processing inequality for each release). Each pool is then put at its merged loss
    (less a rounding margin where a merge happened) and rounded down to the grid
    (:func:`place_atoms`; delta is non-decreasing in every loss): a pool that reached its
    target is at least h / 1000 above its grid point and lands on it. No mass is lost
    (every atom's mass is split among the pools), and no loss rises above the largest one
    (a post-processing cannot: so the top atom's grid point is the grid point below it).

    Error. A merge moves the Y-mean of no pool; its loss changes the law of L only at second
    order: about m |g - l| |l' - g| / 2 in the mean loss for a part merged from an atom at
    l', instead of the m |g - l| of a round-down. For cells (l' - g about h) that is O(h^2)
    per release; for the isolated atoms of randomized response or the discrete Laplace
    mechanism it is O(h d) with d their spacing (100,000 steps of 0.01-DP randomized response:
    the optimistic epsilon now within 1.1e-2 of the exact one at delta 0.01001, was 0.76)."""
    h = float(grid_step)
    order = np.argsort(losses, kind="stable")
    l, m = losses[order], masses[order]
    if l.size < 2:
        return l, m
    if nearest:
        target = np.round(l / h) * h + 1e-3 * h
    else:  # the first grid point (+ h / 1000) at or above the atom
        target = np.ceil(l / h - 1e-3) * h + 1e-3 * h
    # an atom within h / 1000 above a grid point stays (its round-down costs at most that)
    target = np.where(l - np.floor(l / h) * h <= 1e-3 * h, l, target)
    up = np.expm1(target[:-1] - l[:-1])  # > 0: atom k below its target
    down = -np.expm1(target[:-1] - l[1:])  # > 0: the next atom above atom k's target
    pull = (up > 0.0) & (down > 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        wanted = np.where(pull, m[:-1] * up / np.where(pull, down, 1.0), 0.0)
    taken = np.minimum(wanted, m[1:])
    kept = m - np.concatenate(([0.0], taken))  # atom k's mass left after giving to k - 1
    kept = np.maximum(kept, 0.0)
    # pool k: kept[k] of atom k, taken[k] of atom k + 1, and (rarely) parts of later atoms
    # where atom k + 1 alone is too light (a heavy atom of constant loss, a steep tail)
    pools = [np.arange(l.size), np.arange(l.size - 1)]
    atoms = [np.arange(l.size), np.arange(1, l.size)]
    parts = [kept, taken]
    extra_pool, extra_atom, extra_mass = [], [], []

    def draw(k: int, owed: float, sources: range, sign: float) -> None:
        """Merge into pool k parts of the atoms ``sources`` (out of what they keep) until the
        Y-excess (sign -1: atoms above the target) or deficit (sign +1: atoms below) ``owed``,
        in units of mass, is cancelled."""
        for j in sources:
            if owed <= 0.0:
                return
            gain = sign * math.expm1(target[k] - l[j])
            if gain > 0.0 and kept[j] > 0.0:
                part = min(kept[j], owed / gain)
                kept[j] -= part
                owed -= part * gain
                extra_pool.append(k)
                extra_atom.append(j)
                extra_mass.append(part)

    for k in np.flatnonzero(wanted > taken + 1e-12 * wanted).tolist():
        # Y-excess still to cancel after atom k + 1's part
        draw(k, (wanted[k] - taken[k]) * down[k], range(k + 2, min(l.size, k + _MAX_PULL + 1)),
             -1.0)
    # the top atom has nothing above it: its pool is pulled down instead, onto (just above)
    # the grid point below it, by merging into it parts of the atoms below, out of what they
    # keep (each giving pool then leans further toward its higher part: only further above
    # its own target)
    top = l.size - 1
    floor_target = math.floor(l[top] / h) * h + 1e-3 * h
    if floor_target < l[top] and kept[top] > 0.0:
        target[top] = floor_target
        deficit = kept[top] * -math.expm1(floor_target - l[top])
        draw(top, deficit, range(top - 1, max(-1, top - _MAX_PULL - 1), -1), 1.0)
    if extra_pool:
        pools.append(np.array(extra_pool))
        atoms.append(np.array(extra_atom))
        parts.append(np.array(extra_mass))
    pool = np.concatenate(pools)
    atom = np.concatenate(atoms)
    part = np.concatenate(parts)
    # merged loss of each pool relative to its target: -log of its Y-mean over e^{-target}
    y_rel = np.expm1(target[pool] - l[atom])
    pool_mass = np.bincount(pool, weights=part, minlength=l.size)
    pulled = np.bincount(pool, weights=np.where(atom != pool, part, 0.0), minlength=l.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.bincount(pool, weights=part * y_rel, minlength=l.size) / pool_mass
        merged = target - np.log1p(np.maximum(excess, -1.0 + 1e-300))
    merged = np.where(pulled > 0.0, merged, l)  # a pool without a merge keeps its loss
    margin = np.where(pulled > 0.0, 8.0 * _ULP * (np.abs(merged) + 1.0), 0.0)  # merges only
    used = pool_mass > 0.0
    return (merged - margin)[used], pool_mass[used]


def atoms_rdp(
    mechanism: int, parameter: float, rate: float, orders: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """D_alpha(P || Q) of one atom leaf at each order alpha in [1, inf] (module docstring):
    the Kullback-Leibler divergence at 1, the largest loss at inf. Rounded up: the masses and
    losses are within a few units of roundoff of their closed forms, and a divergence much
    smaller than its atoms' losses is a sum whose first-order terms cancel (sum m_i l_i, or
    sum m_i (e^{t_i} - 1) with t_i = (alpha - 1) l_i): 8 ulps (2^-52 each) of the terms'
    magnitudes are added before the logarithm (randomized response at p = 1 - 1e-12 read
    5.7e-5 relative below its exact divergence without it), and each value is raised past
    the logarithm's and the division's rounding."""
    losses, masses = atoms(mechanism, parameter, rate)
    log_masses = np.log(masses)
    result = []
    for order in np.atleast_1d(np.asarray(orders, dtype=np.float64)).tolist():
        if order == 1.0:
            value = float(np.dot(masses, losses)) + 8.0 * _ULP * float(np.dot(masses,
                                                                           np.abs(losses)))
        elif math.isinf(order):
            top = float(losses.max())
            value = top + 8.0 * _ULP * abs(top)
        else:
            beta = order - 1.0
            t = beta * losses
            if float(np.abs(t).max()) < 0.5:
                # log1p(sum m (e^t - 1)) keeps its relative precision as alpha -> 1
                growth = np.expm1(t)
                slack = 8.0 * _ULP * float(np.dot(masses, np.abs(growth) + np.abs(t) * np.exp(t)))
                excess = float(np.dot(masses, growth)) + slack
                value = math.log1p(max(excess, 0.0)) * (1.0 + 8.0 * _ULP) / beta
            else:
                total = float(logsumexp(log_masses + t))
                value = (total + 8.0 * _ULP * (1.0 + float(np.abs(t).max()) + abs(total))) / beta
        result.append(max(math.nextafter(value, math.inf), 0.0))
    return np.array(result, dtype=np.float64)


#: The event types whose privacy loss is one of these atom leaves.
ATOM_EVENTS = (RandomizedResponse, DiscreteLaplace)


def leaf_key(
    event: RandomizedResponse | DiscreteLaplace, relation: Neighbouring, direction: str
) -> tuple[int, float, float]:
    """(mechanism code, parameter, rate) of ``event`` under ``relation`` in ``direction``
    ("remove": P is the law on the dataset holding the record; "add": the reverse)."""
    if isinstance(event, DiscreteLaplace):  # symmetric pair: one distribution
        return (DISCRETE_LAPLACE, event.noise_parameter, float(event.sensitivity))
    if relation is Neighbouring.ZERO_OUT:
        code = RR_ZERO_REMOVE if direction == "remove" else RR_ZERO_ADD
    else:  # replace one: symmetric
        code = RR_REPLACE
    return (code, event.noise_parameter, float(event.num_buckets))


def asymmetric(leaves: Iterable[Event], relation: Neighbouring) -> bool:
    """Whether an atom leaf among ``leaves`` has different remove and add distributions under
    ``relation`` (randomized response under zero-out)."""
    if relation is not Neighbouring.ZERO_OUT:
        return False
    return any(
        isinstance(getattr(leaf, "event", leaf), RandomizedResponse)
        and getattr(leaf, "event", leaf).noise_parameter < 1.0
        for leaf in leaves
    )


def event_variance(event: RandomizedResponse | DiscreteLaplace) -> float:
    """Var_P(L) of the event's (replace-one for randomized response) pair: the grid step's
    proxy for the spread of its privacy loss."""
    return atoms_variance(*leaf_key(event, Neighbouring.REPLACE_ONE, "remove"))


def event_rdp(
    event: RandomizedResponse | DiscreteLaplace, relation: Neighbouring, orders: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """The RDP curve of ``event`` under ``relation``: the larger of the two directions'
    divergences at each order in [1, inf] (exact, :func:`atoms_rdp`)."""
    curves = [
        atoms_rdp(*leaf_key(event, relation, direction), orders)
        for direction in ("remove", "add")
    ]
    return np.maximum(curves[0], curves[1])


def alignment_losses(
    event: RandomizedResponse | DiscreteLaplace, relation: Neighbouring
) -> list[float]:
    """The dyadic values m 2^-20 that the event's largest losses (both directions) are within
    1e-12 relative of, for the grid's choice of step (``PLDAccountant._laplace_losses``): a grid
    point there keeps the atom's split mass above it at the size of its round-off, so delta is
    0 (to round-off) at an epsilon such as 1 or 4 that is exactly the largest loss. Only the
    grid step depends on it; every discretisation stays pessimistic."""
    found = []
    for direction in ("remove", "add"):
        losses, _ = atoms(*leaf_key(event, relation, direction))
        top = float(losses.max())
        snapped = round(top * 2.0**20) / 2.0**20
        if top > 0.0 and snapped > 0.0 and abs(top - snapped) <= 1e-12 * top:
            found.append(snapped)
    return found
