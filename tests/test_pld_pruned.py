"""Pruned leaf transforms (``_pld_numerics._pruned_reach`` / ``certified_band``): the leaf
spectrum of a long composition computed only at the frequencies its power keeps, with a
certificate (total variation, or a coarse certified grid) for the rest. Checked against
long-double direct sums (an independent evaluation of the DFT), against the whole transform's
entries above the reach, and the accountant's answers against the unpruned route and the exact
Gaussian curve."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.fft

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp._native import core
from dpsharp.accountants import _pld_numerics, pld
from dpsharp.accountants._pld_numerics import (
    DiscretePLD,
    _pruned_reach,
    _reach_at_least,
    band_dft_error,
    certified_band,
)

from _gaussian_reference import exact_epsilon_bisect


def direct_dft(mass: np.ndarray, size: int, frequencies: list[int]) -> np.ndarray:
    """sum_s m_s e^{-2 pi i s k / size} in long double, with s k reduced modulo size in integers."""
    index = np.arange(mass.size, dtype=np.int64)
    weights = mass.astype(np.longdouble)
    out = []
    for k in frequencies:
        angle = (-2 * np.pi) * ((index * k) % size).astype(np.longdouble) / size
        out.append(complex(np.sum(weights * np.cos(angle)), np.sum(weights * np.sin(angle))))
    return np.array(out)


@pytest.mark.parametrize(
    ("length", "size", "reach"), [(1, 16, 5), (5, 64, 30), (1046, 131072, 441), (3000, 40960, 900)]
)
def test_pruned_transform_is_the_dft(length: int, size: int, reach: int) -> None:
    mass = np.random.default_rng(length).random(length)
    mass /= mass.sum()
    pruned = certified_band(mass, size, reach)
    assert pruned.shape == (reach,)
    frequencies = sorted({0, 1, reach // 3, reach // 2, reach - 1})
    exact = direct_dft(mass, size, frequencies)
    # Within its proven componentwise bound (a few dozen ulp of the total mass, 1).
    bound = band_dft_error(length, size) * float(mass.sum())
    assert np.max(np.abs(pruned[frequencies] - exact)) <= bound
    assert np.max(np.abs(pruned - scipy.fft.rfft(mass, size)[:reach])) <= 2e-15 + bound


def abadi_leaf(steps: int, precision: float) -> tuple[DiscretePLD, int]:
    """The remove-direction leaf PLD of Abadi et al.'s setting on the accountant's grid, and the
    circle of its one-stage composition."""
    accountant = PLDAccountant(precision=precision).compose(PoissonSampled(Gaussian(4.0), 0.01), steps)
    step = accountant._grid_step()
    tail = pld._tail_for(1e-5, precision)
    bucket = 1 << (steps - 1).bit_length()
    offset, mass, infinity = core.pld_discretize(2, 4.0, 0.01, step, tail / bucket, tail / bucket, True)
    leaf = DiscretePLD(int(offset), mass, float(infinity), step)
    size = _pld_numerics._Window.of([leaf], [steps], math.log(tail)).size
    return leaf, size


@pytest.mark.parametrize(("steps", "precision"), [(10_000, 1e-3), (40_000, 2.5e-4), (10**6, 1e-3)])
def test_reach_certificate_holds_on_the_whole_transform(steps: int, precision: float) -> None:
    """Every entry of the whole transform from the reach on has |F|^steps <= e^-800, and the
    reach prunes most of the circle on these settings."""
    leaf, size = abadi_leaf(steps, precision)
    reach = _pruned_reach(leaf, size, steps)
    assert reach is not None and reach < size // 16
    whole = scipy.fft.rfft(leaf.folded(size))
    with np.errstate(divide="ignore"):
        log_modulus = np.log(np.abs(whole[reach:]))
    assert np.all(steps * log_modulus <= -800.0)
    # The certificate is a bound, not the exact edge: the whole transform keeps fewer.
    kept = np.flatnonzero(steps * np.log(np.abs(whole) + 1e-300) > -800.0)
    assert kept[-1] < reach


@pytest.mark.parametrize(("steps", "precision"), [(10_000, 1e-3), (40_000, 2.5e-4), (10**6, 1e-3)])
def test_reach_lower_bound_is_below_the_exact_edge(steps: int, precision: float) -> None:
    """``_reach_at_least`` (from the masses' second moment) is below every frequency where the
    exact |F|^steps (numpy's transform in double, far inside the margin) still exceeds e^-800,
    so below every certificate's reach; and within a factor 1.5 of that edge (it is what
    spares the coarse grid's transform where pruning cannot pay)."""
    leaf, size = abadi_leaf(steps, precision)
    least = _reach_at_least(leaf, size, steps)
    whole = scipy.fft.rfft(leaf.folded(size))
    kept = np.flatnonzero(steps * np.log(np.abs(whole) + 1e-300) > -800.0)
    edge = int(kept[-1]) + 1
    assert 0 < least < edge < 1.5 * least
    assert np.all(steps * np.log(np.abs(whole[:least])) > -800.0)
    reach = _pruned_reach(leaf, size, steps)
    assert reach is not None and reach >= least


def test_reach_lower_bound_skips_the_coarse_transform(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where even the lower bound's pruned cost exceeds a whole transform, ``_pruned_reach``
    returns None without the coarse grid's transform (q = 5e-4, sigma = 0.6, T = 2 10^5: its
    leaf at the staged query's circle), as the full check does."""
    asked: list[tuple[DiscretePLD, int, int]] = []
    real_reach = _pld_numerics._pruned_reach
    monkeypatch.setattr(_pld_numerics, "_pruned_reach",
                        lambda *args: asked.append(args) or real_reach(*args))
    PLDAccountant().compose(PoissonSampled(Gaussian(0.6), 5e-4), 200_000).epsilon(1e-5)
    monkeypatch.undo()
    leaf, size, count = asked[0]
    assert count == 200_000 and leaf.mass.size > 10**5
    calls: list[int] = []
    real = DiscretePLD.coarse_moduli
    monkeypatch.setattr(DiscretePLD, "coarse_moduli",
                        lambda self, gap: calls.append(1) or real(self, gap))
    leaf = DiscretePLD(leaf.offset, leaf.mass, leaf.infinity_mass, leaf.grid_step)  # no memo
    assert _pruned_reach(leaf, size, count) is None
    assert calls == []
    # With the shortcut off, the certificates give the same answer after the transform.
    monkeypatch.setattr(_pld_numerics, "_reach_at_least", lambda *args: 0)
    assert _pruned_reach(leaf, size, count) is None
    assert calls == [1]


def test_no_reach_where_pruning_cannot_pay_or_be_certified() -> None:
    leaf, size = abadi_leaf(10_000, 1e-3)
    assert _pruned_reach(leaf, size, 1) is None  # |F| <= e^-800 cannot be certified
    assert _pruned_reach(leaf, leaf.mass.size, 10_000) is None  # masses would fold
    flat = DiscretePLD(0, np.full(4096, 1.0 / 4096), 0.0, 2.0**-10)
    assert _pruned_reach(flat, 1 << 14, 100) is None  # needs most frequencies


@pytest.mark.parametrize(("steps", "precision"), [(40_000, 1e-3), (40_000, 2.5e-4)])
def test_accountant_with_and_without_pruning(monkeypatch: pytest.MonkeyPatch, steps: int, precision: float) -> None:
    event = PoissonSampled(Gaussian(4.0), 0.01)
    calls: list[int] = []
    real = _pld_numerics.certified_band

    def spy(mass: np.ndarray, size: int, reach: int) -> np.ndarray:
        calls.append(reach)
        return real(mass, size, reach)

    monkeypatch.setattr(_pld_numerics, "certified_band", spy)
    pruned = PLDAccountant(precision=precision).compose(event, steps)
    pruned_eps, pruned_bounds = pruned.epsilon(1e-5), pruned.epsilon_bounds(1e-5)
    epsilons = (0.5 * pruned_eps, pruned_eps, 1.5 * pruned_eps)
    pruned_deltas = [pruned.delta(epsilon) for epsilon in epsilons]
    assert calls, "this setting is composed with pruned leaf transforms"
    monkeypatch.setattr(_pld_numerics, "_pruned_reach", lambda *args: None)
    monkeypatch.setattr(pld, "staging_pays", lambda *args, **kwargs: False)
    whole = PLDAccountant(precision=precision).compose(event, steps)
    # Both bound the same exact composition from above, each within its proven round-off bound
    # (the pruned one's direct sums are tighter than the whole transform's stages): they differ
    # by at most the two bounds.
    def roundoff(accountant: PLDAccountant) -> float:
        result = accountant._composed("remove", True, accountant._grid_step(), pld._TAIL_BUDGET)
        assert result.spectral is not None
        return result.noise + result.spectral.error

    bounds = roundoff(pruned) + roundoff(whole)
    for epsilon, pruned_delta in zip(epsilons, pruned_deltas):
        assert abs(pruned_delta - whole.delta(epsilon)) <= bounds
    assert pruned_eps == pytest.approx(whole.epsilon(1e-5), rel=1e-5)
    # Both brackets are certified: they overlap, each within the requested precision.
    whole_bounds = whole.epsilon_bounds(1e-5)
    assert max(pruned_bounds[0], whole_bounds[0]) <= min(pruned_bounds[1], whole_bounds[1])
    for lower, upper in (pruned_bounds, whole_bounds):
        assert upper - lower <= precision * upper


@pytest.mark.parametrize(("sigma", "steps"), [(30.0, 2000), (200.0, 50_000), (60.0, 10**6)])
def test_pruned_gaussian_compositions_bracket_the_exact_curve(sigma: float, steps: int) -> None:
    accountant = PLDAccountant().compose(Gaussian(sigma), steps)
    lower, upper = accountant.epsilon_bounds(1e-6)
    exact = exact_epsilon_bisect(1e-6, math.sqrt(steps) / sigma)
    assert lower <= exact <= upper
    assert accountant.epsilon(1e-6) >= exact
