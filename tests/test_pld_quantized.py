"""Rounding of many distinct noise multipliers onto a grid geometric in the root of their
per-step loss variance, sampling rates kept (the accounting of a per-step schedule): every
rounded parameter lies on its side, and the bounds computed with them bracket an independent
reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.signal import fftconvolve
from scipy.special import ndtr

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp.accountants import pld as pld_module
from dpsharp.accountants.pld import (
    _QUANTUM_STEPS,
    _ROUNDING_GAP,
    _Leaf,
    _LeafColumns,
    _quantized,
    _rounded_counts,
    _sigma_of_root,
    _variance_root,
)


@pytest.mark.parametrize("quantum", [1e-3, 4e-3])
def test_rounded_parameters_are_on_their_side(quantum: float) -> None:
    """Noise multipliers whose variance root s (``_variance_root``) lies on the rounding grid
    r^k (r = 1 + quantum / 2) and one ulp either side of such a noise multiplier, at sampling
    rates from 1 down to 1e-4: the pessimistic rounding never raises a noise multiplier, the
    optimistic one never lowers it, exactly, in floating point (the grid's inverse is rounded
    and lands an ulp past some of these), each moves s by at most one grid ratio, and the
    rates are kept exactly (the pair of (sigma', q) must be a post-processing of the pair of
    (sigma, q))."""
    log_r = math.log1p(quantum / 2.0)
    leaves = []
    for mechanism, rate in ((0, 1.0), (2, 0.3), (3, 0.01), (2, 1e-4), (4, 0.05)):
        rates = np.full(1500, rate)
        roots = np.exp(np.arange(-1000, 500) * log_r) * (rate if rate < 1.0 else 1.0)
        grid = _sigma_of_root(roots, rates)
        grid = grid[np.isfinite(grid) & (grid > 0.0)]
        for sigma in np.concatenate([grid, np.nextafter(grid, 0.0), np.nextafter(grid, np.inf)]):
            leaves.append(_Leaf(mechanism, float(sigma), rate))
    for pessimistic in (True, False):
        rounded = _quantized(leaves, quantum, pessimistic)
        for leaf, key in zip(leaves, rounded):
            assert key.rate == leaf.rate and key.mechanism == leaf.mechanism
            if pessimistic:
                assert key.parameter <= leaf.parameter
            else:
                assert key.parameter >= leaf.parameter
        exact = _variance_root(np.array([leaf.parameter for leaf in leaves]),
                               np.array([leaf.rate for leaf in leaves]))
        moved = _variance_root(np.array([key.parameter for key in rounded]),
                               np.array([key.rate for key in rounded]))
        assert np.all(np.abs(np.log(moved / exact)) <= log_r * (1 + 1e-9))
        assert _rounded_counts(_LeafColumns.of(leaves), [quantum], pessimistic) == [
            len(set(rounded))
        ]


def test_variance_root_inverts_and_matches_the_variance_proxy() -> None:
    """s^2 is the per-step loss-variance proxy of the grid step (min(mu^2, q^2 (e^{mu^2} - 1))
    for a sampled Gaussian, mu^2 for a plain one, mu = 1 / sigma, written out here), and
    _sigma_of_root inverts it to within a few ulp."""
    sigmas = np.geomspace(0.05, 100.0, 400)
    for rate in (1.0, 0.5, 0.01, 1e-5):
        rates = np.full(sigmas.size, rate)
        mu2 = 1.0 / sigmas**2
        proxy = mu2 if rate == 1.0 else np.minimum(mu2, rate**2 * np.expm1(mu2))
        roots = _variance_root(sigmas, rates)
        np.testing.assert_allclose(roots**2, proxy, rtol=1e-13)
        np.testing.assert_allclose(_sigma_of_root(roots, rates), sigmas, rtol=1e-12)


def _loss_measure(
    sigma: float, q: float, direction: str, step: float, upper: bool
) -> tuple[int, np.ndarray, float]:
    """(first index, masses, mass at +inf) of the privacy loss of one Poisson-subsampled
    Gaussian under P, on the grid k * step: the output x is cut into 10^5 cells whose exact P
    masses (normal CDFs) are put at the cell's largest loss rounded up to the grid (``upper``)
    or its smallest rounded down. Moving mass to larger losses can only raise the hockey-stick
    divergence E_P[(1 - e^{eps - L})_+] of every composition, and to smaller ones only lower it,
    so the two measures bracket the exact composition (the mass beyond the cut x range goes to
    +inf, or is dropped)."""
    mu = 1.0 / sigma
    x = np.linspace(-30.0, 30.0 + mu, 100_001)
    if direction == "remove":  # P = (1 - q) N(0, 1) + q N(mu, 1), Q = N(0, 1)
        cdf = (1.0 - q) * ndtr(x) + q * ndtr(x - mu)
        loss = np.log1p(q * np.expm1(mu * x - mu * mu / 2.0))
    else:  # P = N(0, 1), Q = the mixture
        cdf = ndtr(x)
        loss = -np.log1p(q * np.expm1(mu * x - mu * mu / 2.0))
    mass = np.diff(cdf)
    ends = np.maximum(loss[:-1], loss[1:]) if upper else np.minimum(loss[:-1], loss[1:])
    index = np.ceil(ends / step) if upper else np.floor(ends / step)
    first = int(index.min())
    out = np.bincount((index - first).astype(np.int64), weights=mass)
    return first, out, (max(1.0 - float(mass.sum()), 0.0) if upper else 0.0)


def _reference_bracket(sigmas: list[float], q: float, delta: float) -> tuple[float, float]:
    """Bounds on the exact epsilon of the composition (worse of the two directions), from the
    measures of :func:`_loss_measure` convolved directly (independent of the accountant)."""
    step = 5e-4
    bounds = []
    for upper in (False, True):
        worst = 0.0
        for direction in ("remove", "add"):
            first, mass, infinity = 0, np.array([1.0]), 0.0
            for sigma in sigmas:
                offset, part, beyond = _loss_measure(sigma, q, direction, step, upper)
                first += offset
                mass = np.maximum(fftconvolve(mass, part), 0.0)
                infinity += beyond
            losses = (first + np.arange(mass.size)) * step

            def delta_at(eps: float) -> float:
                return float(np.sum(mass * -np.expm1(np.minimum(eps - losses, 0.0)))) + infinity

            low, high = 0.0, 20.0
            for _ in range(50):
                middle = 0.5 * (low + high)
                low, high = (middle, high) if delta_at(middle) > delta else (low, middle)
            worst = max(worst, high if upper else low)
        bounds.append(worst)
    return bounds[0], bounds[1]


def test_rounded_schedule_brackets_an_independent_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three distinct Poisson-subsampled Gaussians accounted with the schedule rounding forced
    on (an 8% quantum, each noise multiplier's variance root halfway between two grid points:
    moved by 2%, its noise multiplier by about 1.3%, about 2.5% in epsilon) against a direct
    convolution of their finely discretised losses. The certified bracket must hold the
    reference's: rounding a side the wrong way (a noise multiplier up for the upper bound, down
    for the lower) moves that side past it."""
    quantum = 0.08
    monkeypatch.setattr(PLDAccountant, "_rounding_quantum", lambda self, *args: quantum)
    log_r = math.log1p(quantum / 2.0)
    q, delta = 0.2, 1e-3
    roots = np.exp((np.array([-38, -34, -31]) + 0.5) * log_r)  # sigma about 1.2, 1, 0.9
    sigmas = [float(s) for s in _sigma_of_root(roots, np.full(3, q))]
    accountant = PLDAccountant(0.1)  # the rounding, not the grid, sets the bracket
    for sigma in sigmas:
        accountant.compose(PoissonSampled(Gaussian(sigma), q))
    lower, upper = accountant.epsilon_bounds(delta)
    reference_lower, reference_upper = _reference_bracket(sigmas, q, delta)
    assert reference_upper - reference_lower <= 3e-3 * reference_upper
    assert lower <= reference_upper and reference_lower <= upper
    # The rounding is on: each side sits about 2.5% beyond the reference.
    assert upper >= 1.01 * reference_upper and lower <= 0.99 * reference_lower


def test_rounding_quantum_follows_the_requested_gap() -> None:
    """3,000 distinct noise multipliers (more than any quantum up to half the precision merges
    into 512): the quantum is the coarsest of its ladder (``_QUANTUM_STEPS`` per doubling)
    whose two roundings move the composed loss-variance proxy V = sum_i v_i, v = min(mu^2,
    q^2 (e^{mu^2} - 1)) (written out here), apart by at most _ROUNDING_GAP times the precision,
    relative; the next step of the ladder would not be; and the certified bracket stays within
    3 times the precision, for noise multipliers from 80 down to 2 (epsilon moves little with
    each) and from 20 down to 0.5."""
    precision, q = 1e-2, 0.01

    def proxy(sigmas: np.ndarray) -> float:
        mu2 = 1.0 / sigmas**2
        return float(np.minimum(mu2, q * q * np.expm1(mu2)).sum())

    for high, low in ((80.0, 2.0), (20.0, 0.5)):
        accountant = PLDAccountant(precision)
        sigmas = np.geomspace(high, low, 3000)
        for sigma in sigmas:
            accountant.compose(PoissonSampled(Gaussian(float(sigma)), q))
        quantum = accountant._rounding_quantum("remove", True)
        leaves = [_Leaf(2, float(sigma), q) for sigma in sigmas]

        def widening(quantum: float) -> float:
            up = np.array([key.parameter for key in _quantized(leaves, quantum, True)])
            down = np.array([key.parameter for key in _quantized(leaves, quantum, False)])
            return (proxy(up) - proxy(down)) / proxy(sigmas)

        assert widening(quantum) <= _ROUNDING_GAP * precision
        assert widening(quantum * 2.0 ** (1.0 / _QUANTUM_STEPS)) > _ROUNDING_GAP * precision
        lower, upper = accountant.epsilon_bounds(1e-5)
        assert 0.0 < upper - lower <= 3.0 * precision * upper


def test_coarsened_schedule_grid_brackets_an_independent_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schedule whose noise multipliers are rounded is accounted on a grid twice the
    formula's (forced here on three distinct events, with a negligible rounding quantum so that
    the grid alone sets the bracket): the upper bound on that coarse grid and the lower bound of
    ``epsilon_bounds`` (taken on the formula's grid) must bracket a direct convolution of the
    finely discretised losses. The coarse grid's error is first order on the optimistic side:
    the optimistic bound on the coarse grid lies below the reference, so an upper bound that
    lost its pessimistic rounding there would fail, and the lower bound taken on the formula's
    grid is the tighter one."""
    monkeypatch.setattr(pld_module, "_LEAF_BUDGET", 2)
    monkeypatch.setattr(pld_module, "_REFINE_UP_TO", 2)  # (no short-composition refinement)
    monkeypatch.setattr(PLDAccountant, "_rounding_quantum", lambda self, *args: 1e-9)
    q, delta = 0.2, 1e-3
    sigmas = [1.2, 1.0, 0.9]
    accountant = PLDAccountant(0.01)  # a coarse grid: its error dominates
    for sigma in sigmas:
        accountant.compose(PoissonSampled(Gaussian(sigma), q))
    coarse = accountant._grid_step()
    monkeypatch.setattr(pld_module, "_SCHEDULE_COARSENING", 1.0)
    accountant._reset_caches()
    assert coarse == 2.0 * accountant._grid_step()
    monkeypatch.setattr(pld_module, "_SCHEDULE_COARSENING", 2.0)
    accountant._reset_caches()
    upper = accountant.epsilon(delta)
    lower, bracket_upper = accountant.epsilon_bounds(delta)
    assert bracket_upper == upper
    coarse_lower = accountant._epsilon_side(delta, pessimistic=False, refinement=0)
    reference_lower, reference_upper = _reference_bracket(sigmas, q, delta)
    assert reference_upper - reference_lower <= 3e-3 * reference_upper
    assert reference_lower <= upper and lower <= reference_upper
    assert coarse_lower < reference_lower  # the coarse grid's first-order side is visible
    assert coarse_lower < lower


def test_columns_extended_are_the_columns_of_the_whole_list() -> None:
    """An accountant converts its keys to columns once and appends the rows of later events:
    the rows are those made of the whole list at once, bit for bit (every column is
    elementwise), including kept (Laplace) rows."""
    leaves = [(2, float(sigma), 0.01) for sigma in np.geomspace(3.0, 0.5, 700)]
    leaves[100] = (pld_module._LAPLACE, 4.0, 1.0)
    leaves += [(0, 2.5, 1.0), (3, 0.9, 0.3)]
    whole = _LeafColumns.of(leaves)
    for cut in (0, 1, 100, 350, len(leaves)):
        pieced = _LeafColumns.of(leaves[:cut]).extended(_LeafColumns.of(leaves[cut:]))
        for name in ("mechanism", "parameter", "rate", "rounded", "root"):
            assert np.array_equal(getattr(pieced, name), getattr(whole, name)), (name, cut)
    tail = whole.rows_from(350)
    assert np.array_equal(tail.root, _LeafColumns.of(leaves[350:]).root)


def test_add_direction_takes_the_quantum_its_own_search_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The add direction of a per-step schedule of Poisson-sampled Gaussians has the remove
    direction's noise multipliers and rates: it takes the remove direction's rounding quantum
    instead of searching again, and that is the quantum its own search gives (computed here
    with the sharing switched off), on both sides, for an incremental and a fresh accountant.
    Leaves that differ between the directions do not share."""
    sigmas = np.geomspace(2.5, 0.7, 900)

    def quanta(accountant: PLDAccountant) -> list[float]:
        return [accountant._rounding_quantum(direction, side)
                for direction in ("remove", "add") for side in (True, False)]

    fresh = PLDAccountant()
    incremental = PLDAccountant()
    for step, sigma in enumerate(sigmas):
        event = PoissonSampled(Gaussian(float(sigma)), 0.02)
        fresh.compose(event)
        incremental.compose(event)
        if step in (520, 700):
            quanta(incremental)  # queried on the way, columns extended afterwards
    shared = quanta(fresh)
    assert shared == quanta(incremental)
    assert shared[0] > 0.0 and shared[2:] == shared[:2]
    monkeypatch.setattr(_LeafColumns, "rounds_like", lambda self, other: False)
    searched = PLDAccountant()
    for sigma in sigmas:
        searched.compose(PoissonSampled(Gaussian(float(sigma)), 0.02))
    assert quanta(searched) == shared
    monkeypatch.undo()
    remove = _LeafColumns.of([(2, float(s), 0.02) for s in sigmas])
    add = _LeafColumns.of([(3, float(s), 0.02) for s in sigmas])
    assert remove.rounds_like(add)
    assert not add.rounds_like(add)  # (rows holding the add code are not a first direction)
    moved = _LeafColumns.of([(3, float(s) * (1.0 + 1e-12 * (k == 5)), 0.02)
                             for k, s in enumerate(sigmas)])
    assert not remove.rounds_like(moved)
    other_rate = _LeafColumns.of([(3, float(s), 0.03) for s in sigmas])
    assert not remove.rounds_like(other_rate)
