"""Incremental accounting (a query after every step): the work of one more step of an event
already composed, and its answer against a fresh accountant's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp.accountants import _pld_numerics as numerics
from dpsharp.accountants import pld


def test_incremental_step_discretises_nothing_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """One more step of an event already composed (same grid, same truncation bucket): no leaf
    is discretised again (the short-composition check reuses its leaf sizes), and the answer
    is the fresh accountant's, bit for bit."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1800)
    accountant.epsilon(1e-5)
    calls: list[int] = []
    real = pld._discretize

    def counting(keys, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(keys))
        return real(keys, *args, **kwargs)

    monkeypatch.setattr(pld, "_discretize", counting)
    accountant.compose(event)
    incremental = accountant.epsilon(1e-5)
    assert sum(calls) == 0
    monkeypatch.setattr(pld, "_discretize", real)
    assert incremental == PLDAccountant().compose(event, 1801).epsilon(1e-5)


def test_incremental_step_reuses_count_independent_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """One more step on the same circle: the frequency weights of the round-off bound and the
    logarithms of the leaf spectra's moduli (functions of the circle and the leaf only) are
    not computed again, and the answer is still the fresh accountant's, bit for bit."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1500)
    accountant.epsilon(1e-5)
    weights: list[int] = []
    logs: list[int] = []
    real_weights = numerics._frequency_weights_uncached
    real_log = np.log

    def counting_weights(*args, **kwargs):  # type: ignore[no-untyped-def]
        weights.append(1)
        return real_weights(*args, **kwargs)

    def counting_log(values, *args, **kwargs):  # type: ignore[no-untyped-def]
        logs.append(int(np.size(values)))
        return real_log(values, *args, **kwargs)

    monkeypatch.setattr(numerics, "_frequency_weights_uncached", counting_weights)
    monkeypatch.setattr(numerics.np, "log", counting_log)
    accountant.compose(event)
    incremental = accountant.epsilon(1e-5)
    monkeypatch.undo()
    assert weights == []
    # Only the band's logarithms are taken (a few hundred entries), not the circle's.
    circle = max(r.size for r in accountant._bounds_at(0, 1e-12, True))
    assert sum(logs) < circle // 4
    assert incremental == PLDAccountant().compose(event, 1501).epsilon(1e-5)


def test_product_error_skips_only_exact_zeros() -> None:
    """The round-off bound of a product, evaluated only where e^upper is representable, equals
    the formula e^upper - e^lower + g_T e^lower (computed entries) or e^upper (others), plus
    the underflow slack, evaluated at every entry, bit for bit; on moduli from 1 down to far
    below the smallest double."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        size = int(rng.integers(1, 3000))
        lower = -rng.exponential(float(rng.choice([1.0, 100.0, 900.0])), size)
        lower[rng.random(size) < 0.05] = -np.inf
        upper = np.logaddexp(lower, math.log(1e-15)) * float(rng.integers(1, 5000))
        lower = lower * 1.0
        upper = np.maximum(upper, lower)
        computed = rng.random(size) < 0.7
        count = int(rng.integers(1, 10**5))
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            outer = np.exp(upper)
            inner = np.exp(lower)
            spread = outer * -np.expm1(np.minimum(lower - upper, 0.0))
            rounding = numerics.power_rounding(count) * inner
        expected = np.where(computed, spread + rounding, outer) * numerics._MARGIN + 1e-300
        got = numerics._product_error(upper, lower, count, computed)
        assert np.array_equal(got, expected)


def test_fresh_long_query_discretises_each_leaf_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh query on a long run (T = 2 10^5: the short-composition check looks at the leaf
    sizes and keeps the step): no leaf is discretised twice with the same arguments (the
    check's PLDs are those the composition uses), the add direction is not discretised on the
    fine grid when the remove direction already decides the step, and the answer is that of an
    accountant whose check discretised afresh."""
    event = PoissonSampled(Gaussian(0.6), 5e-4)
    calls: list[tuple[pld._Leaf, float, float, bool]] = []
    real = pld._discretize

    def counting(keys, grid_step, tail, pessimistic):  # type: ignore[no-untyped-def]
        calls.extend((key, grid_step, tail, pessimistic) for key in keys)
        return real(keys, grid_step, tail, pessimistic)

    monkeypatch.setattr(pld, "_discretize", counting)
    accountant = PLDAccountant().compose(event, 200_000)
    answer = accountant.epsilon(1e-5)
    assert len(calls) == len(set(calls)) == 2
    monkeypatch.setattr(pld, "_discretize", real)
    separate = PLDAccountant().compose(event, 200_000)
    separate._grid_step(0)  # the check runs first; its kept PLDs are then dropped
    separate._short_plds.clear()
    assert separate.epsilon(1e-5) == answer


def test_lower_bound_skips_a_direction_certified_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """epsilon_bounds on a schedule of 100 distinct Poisson-subsampled Gaussians (more than the
    64 up to which the grid is refined): the add direction's certified upper bound (the coarse
    pass of the upper bound's query) is below the remove direction's lower bound, so its
    optimistic composition is skipped, and the lower bound is still the maximum over both
    directions' optimistic compositions (formed here in full)."""
    events = [PoissonSampled(Gaussian(float(s)), 0.02) for s in np.linspace(0.7, 1.2, 100)]

    def schedule() -> PLDAccountant:
        accountant = PLDAccountant(1e-2)
        for event in events:
            accountant.compose(event, 3)
        return accountant

    accountant = schedule()
    upper = accountant.epsilon(1e-5)
    composed: list[tuple[str, bool]] = []
    real = PLDAccountant._composed

    def recording(self, direction, pessimistic, *args, **kwargs):  # type: ignore[no-untyped-def]
        composed.append((direction, pessimistic))
        return real(self, direction, pessimistic, *args, **kwargs)

    monkeypatch.setattr(PLDAccountant, "_composed", recording)
    lower, bound = accountant.epsilon_bounds(1e-5)
    monkeypatch.undo()
    assert bound == upper and ("add", False) not in composed
    tail = pld._tail_for(1e-5, 1e-2)
    every = schedule()._bounds_at(0, tail, False)
    assert len(every) == 2
    assert lower == max(r.epsilon(1e-5, pessimistic=False) for r in every)
