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


def test_product_error_is_the_formula_or_a_deep_cap() -> None:
    """The round-off bound of a product, on moduli from 1 down to far below the smallest double:
    never below the formula e^upper - e^lower + g_T e^lower (computed entries) or e^upper
    (others), plus the underflow slack, evaluated at every entry; equal to it bit for bit,
    evaluated at the ends of the sums' error intervals (upper raised, lower lowered in the
    spread and raised in the rounding term, by their evaluation slacks), where e^upper and
    e^lower are above e^-650; and where e^upper is below, the cap 1e-282 (1 + g_T) (with the
    margin and the slack), which is above e^-650 (1 + g_T)."""
    rng = np.random.default_rng(5)
    deep_entries = 0
    for _ in range(50):
        size = int(rng.integers(1, 3000))
        lower = -rng.exponential(float(rng.choice([1.0, 100.0, 900.0])), size)
        lower[rng.random(size) < 0.05] = -np.inf
        upper = np.logaddexp(lower, math.log(1e-15)) * float(rng.integers(1, 5000))
        lower = lower * 1.0
        upper = np.maximum(upper, lower)
        computed = rng.random(size) < 0.7
        count = int(rng.integers(1, 10**5))
        terms = int(rng.integers(1, 100))
        logs = numerics._LogModuli(upper, lower, count, terms, count * 1e-15)
        share = numerics.power_rounding(count)
        upper_slack, lower_slack = logs.slacks(upper, lower)
        assert np.all(upper_slack > 0.0) and np.all(lower_slack >= 0.0)
        assert np.all(lower_slack[np.isfinite(lower)] > 0.0)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            plain = np.where(
                computed,
                np.exp(upper) * -np.expm1(np.minimum(lower - upper, 0.0)) + share * np.exp(lower),
                np.exp(upper),
            ) * numerics._MARGIN + 1e-300
            raised = upper + upper_slack
            outer = np.exp(raised)
            inner = np.exp(lower + lower_slack)
            spread = outer * -np.expm1(np.minimum((lower - lower_slack) - raised, 0.0))
            rounding = share * inner
        expected = np.where(computed, spread + rounding, outer) * numerics._MARGIN + 1e-300
        got = numerics._product_error(logs, computed)
        assert np.all(got >= plain)
        assert np.all(got >= expected)
        normal = (upper > -650.0) & ((lower > -650.0) | ~computed)
        assert np.array_equal(got[normal], expected[normal])
        deep = (upper <= -650.0) & (upper > -746.0)
        deep_entries += int(deep.sum())
        cap = 1e-282 * (1.0 + share) * numerics._MARGIN + 1e-300
        assert np.all(got[deep] == cap)
        assert cap > math.exp(-650.0) * (1.0 + share)
        assert np.all(got[upper <= -746.0] == 1e-300)
    assert deep_entries > 100


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


def test_other_direction_is_checked_once_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query after every one of 40 more steps (from 1,500): the remove direction is composed
    at every step on the grid of the answer, the add direction only for the ends of the blocks
    of 32 steps the counts fall in (the composition of more steps bounds every count of its
    block, on the grid 16 times coarser; the block ending at 1,504 was composed by the query at
    1,500), never on the finer grids; every answer is the fresh accountant's, bit for bit."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1500)
    accountant.epsilon(1e-5)
    step = accountant._grid_step(0)
    composed: list[tuple[float, tuple[int, ...]]] = []
    real = pld.compose

    def recording(plds, counts, **kwargs):  # type: ignore[no-untyped-def]
        composed.append((plds[0].grid_step, tuple(counts)))
        return real(plds, counts, **kwargs)

    monkeypatch.setattr(pld, "compose", recording)
    answers = {}
    for steps in range(1501, 1541):
        accountant.compose(event)
        answers[steps] = accountant.epsilon(1e-5)
    monkeypatch.undo()
    assert pld._check_block(1501) == 32
    fine = [counts for grid, counts in composed if grid == step]
    coarse = [counts for grid, counts in composed if grid != step]
    assert fine == [(steps,) for steps in range(1501, 1541)]  # remove, once per step
    assert coarse == [(1536,), (1568,)]  # add: the ends of the blocks 1505-1568
    assert {grid for grid, _ in composed if grid != step} == {16 * step}
    for steps in (1501, 1504, 1505, 1540):
        assert answers[steps] == PLDAccountant().compose(event, steps).epsilon(1e-5)


def test_one_more_step_reuses_directions_and_band_factors(monkeypatch: pytest.MonkeyPatch) -> None:
    """One more step of an event already composed, on the same circle: the directions and the
    exact-Gaussian test are not worked out again from the events (a function of the set of
    events), and the band's geometric-series factors are not recomputed (functions of the
    circle only); the answer is the fresh accountant's, bit for bit."""
    from dpsharp.accountants import _pld_band

    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1500)
    accountant.epsilon(1e-5)
    leaves: list[int] = []
    sines: list[int] = []
    real_leaves = PLDAccountant._leaves
    real_sin = np.sin

    def counting_leaves(self, leaf, direction):  # type: ignore[no-untyped-def]
        leaves.append(1)
        return real_leaves(self, leaf, direction)

    def counting_sin(values, *args, **kwargs):  # type: ignore[no-untyped-def]
        sines.append(int(np.size(values)))
        return real_sin(values, *args, **kwargs)

    monkeypatch.setattr(PLDAccountant, "_leaves", counting_leaves)
    monkeypatch.setattr(_pld_band.np, "sin", counting_sin)
    accountant.compose(event)
    incremental = accountant.epsilon(1e-5)
    monkeypatch.undo()
    remove = accountant._composed("remove", True, accountant._grid_step(0), 1e-12)
    assert remove.spectral is not None
    assert leaves == [] and sines == []
    assert incremental == PLDAccountant().compose(event, 1501).epsilon(1e-5)


def test_incremental_without_sampling_follows_the_closed_form() -> None:
    """q = 1: a query after every one of 60 steps of a Poisson-sampled Gaussian with q = 1 is
    the exact mu-GDP epsilon with mu = sqrt(k) / sigma (Dong, Roth, Su 2019, Cor. 3.3), solved
    here with scipy from delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), and the
    fresh accountant's answer."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    sigma, delta = 2.0, 1e-5
    event = PoissonSampled(Gaussian(sigma), 1.0)
    accountant = PLDAccountant()
    for steps in range(1, 61):
        accountant.compose(event)
        answer = accountant.epsilon(delta)
        mu = math.sqrt(steps) / sigma

        def excess(eps: float, mu: float = mu) -> float:
            return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
                         - delta)

        exact = brentq(excess, 0.0, 100.0, xtol=1e-14, rtol=1e-14)
        assert exact <= answer <= exact * (1 + 1e-9)
        if steps in (1, 17, 60):
            assert answer == PLDAccountant().compose(event, steps).epsilon(delta)


@pytest.mark.peers
def test_incremental_answers_bracket_dp_accounting() -> None:
    """A query after every step of a Poisson-subsampled Gaussian (q = 0.02, sigma = 0.8, both
    directions of add/remove): at 30 and 120 steps the answer is the fresh accountant's, bit for
    bit, at least dp-accounting 0.6.0's optimistic PLD epsilon at a grid step of 1e-3 (a lower
    bound of the exact epsilon up to its truncation) and at most its pessimistic one plus 0.2%;
    delta(1.0) likewise."""
    pld_module = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    q, sigma, delta = 0.02, 0.8, 1e-5
    event = PoissonSampled(Gaussian(sigma), q)

    def peer(steps: int, pessimistic: bool) -> object:
        one = pld_module.from_gaussian_mechanism(
            sigma, sampling_prob=q, pessimistic_estimate=pessimistic,
            value_discretization_interval=1e-3,
        )
        return one.self_compose(steps)

    accountant = PLDAccountant()
    for steps in range(1, 121):
        accountant.compose(event)
        answer = accountant.epsilon(delta)
        if steps in (30, 120):
            at_one = accountant.delta(1.0)
            fresh = PLDAccountant().compose(event, steps)
            assert answer == fresh.epsilon(delta) and at_one == fresh.delta(1.0)
            lower, upper = peer(steps, False), peer(steps, True)
            assert lower.get_epsilon_for_delta(delta) <= answer  # type: ignore[attr-defined]
            assert answer <= 1.002 * upper.get_epsilon_for_delta(  # type: ignore[attr-defined]
                delta
            )
            assert lower.get_delta_for_epsilon(1.0) <= at_one  # type: ignore[attr-defined]
            assert at_one <= 1.01 * upper.get_delta_for_epsilon(1.0)  # type: ignore[attr-defined]


def test_one_step_is_the_leaf_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """One step (the first query of an incremental run) is answered from the discretised PLD
    itself, with no transform (and so no round-off allowance): the answer is at least the exact
    one-step epsilon of the remove pair ((1 - q) N(0, 1) + q N(mu, 1) against N(0, 1), whose
    delta(eps) = (1 - q) Phi(-x) + q Phi(mu - x) - e^eps Phi(-x) at the loss threshold
    x = (log((e^eps - 1 + q) / q) + mu^2 / 2) / mu, solved with scipy) and within the precision
    of it, and the fresh accountant's answer (the add direction is smaller here)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def no_transform(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("one step needs no transform")

    q, sigma, delta = 0.01, 1.0, 1e-5
    mu = 1.0 / sigma

    def excess(eps: float) -> float:
        x = (math.log((math.expm1(eps) + q) / q) + mu * mu / 2) / mu
        return float((1 - q) * norm.sf(x) + q * norm.sf(x - mu) - math.exp(eps) * norm.sf(x)
                     - delta)

    exact = brentq(excess, 1e-9, 20.0, xtol=1e-15, rtol=1e-15)
    monkeypatch.setattr(numerics, "certified_forward", no_transform)
    monkeypatch.setattr(numerics, "certified_inverse", no_transform)
    event = PoissonSampled(Gaussian(sigma), q)
    accountant = PLDAccountant().compose(event)
    answer = accountant.epsilon(delta)
    assert exact <= answer <= exact * (1 + 1e-3)
    assert answer == PLDAccountant().compose(event, 1).epsilon(delta)


def test_one_more_step_works_on_the_band_prefix_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One more step on the same circle (1,500 -> 1,501 steps, held as a band): the candidate
    test, the log-moduli and the product's round-off bound run on a prefix of the half-circle
    (the suffix maxima of the leaf's squared moduli and log-moduli show where no frequency can
    pass), not on all of it; the answer is the fresh accountant's, bit for bit."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    accountant = PLDAccountant().compose(event, 1500)
    accountant.epsilon(1e-5)
    sizes: list[int] = []
    real = numerics._live_product_error

    def recording(logs, computed):  # type: ignore[no-untyped-def]
        sizes.append(int(logs.upper.size))
        return real(logs, computed)

    monkeypatch.setattr(numerics, "_live_product_error", recording)
    accountant.compose(event)
    incremental = accountant.epsilon(1e-5)
    monkeypatch.undo()
    remove = accountant._composed("remove", True, accountant._grid_step(0), 1e-12)
    assert remove.spectral is not None
    assert sizes and max(sizes) < (remove.size // 2 + 1) // 8
    assert incremental == PLDAccountant().compose(event, 1501).epsilon(1e-5)


def test_prefixes_hold_every_passing_frequency() -> None:
    """The prefixes against brute force, on random leaf spectra (moduli spread over 300 orders
    of magnitude, not monotone) and counts: every frequency whose squared modulus passes a
    threshold lies below ``prefix_above``, and the prefix ends at one that passes; every
    frequency whose summed log-moduli (as the composition sums them) exceed -746 lies below
    ``_live_reach``."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        size = int(rng.choice([64, 240, 960]))
        half = size // 2 + 1
        leaves = []
        for _ in range(int(rng.integers(1, 4))):
            decay = np.exp(-rng.exponential(float(rng.choice([0.05, 1.0, 20.0])), half).cumsum())
            transform = decay * np.exp(2j * np.pi * rng.random(half)) * rng.random(half)
            squared = transform.real**2 + transform.imag**2
            leaves.append(numerics.LeafSpectrum(size, transform, squared, 1e-15))
        counts = [int(c) for c in rng.integers(1, 5000, len(leaves))]
        for leaf in leaves:
            threshold = float(np.exp(-rng.uniform(0.0, 700.0)))
            prefix = leaf.prefix_above(half, threshold)
            passing = np.flatnonzero(leaf.modulus_squared > threshold)
            assert prefix == (int(passing[-1]) + 1 if passing.size else 0)
        live = numerics._live_reach(leaves, counts, half)
        upper = sum(count * leaf.log_moduli(half)[0] for count, leaf in zip(counts, leaves))
        assert np.all(upper[live:] <= -746.0)


def test_round_off_bound_on_the_prefix_covers_the_whole_sum() -> None:
    """The noise and mass-error bounds of a composition whose bound is summed over its live
    prefix (plus the underflow slack times all the weights) against the same bound summed over
    every frequency of the half-circle as the module docstring writes it (by hand here, from
    the leaf's log-moduli): never below it, and within 1e-6 of it."""
    event = PoissonSampled(Gaussian(1.0), 0.01)
    for steps in (300, 1500):
        accountant = PLDAccountant().compose(event, steps)
        step = accountant._grid_step(0)
        tail = pld._tail_for(1e-5, 1e-3)
        result = accountant._composed("remove", True, step, tail)
        cache = next(c for key, c in accountant._caches.items()
                     if key[0] == "remove" and key[1] == step)
        (leaf,) = cache.spectra[True].values()
        half = leaf.transform.size
        upper, lower = leaf.log_moduli(half)
        computed = np.zeros(half, dtype=bool)
        kept_mass = accountant._composed("remove", True, step, tail)
        band = kept_mass.spectral.coefficients.size if kept_mass.spectral is not None else None
        # Where the product is formed: every entry whose log-modulus sum passes -800.
        with np.errstate(divide="ignore"):
            log_modulus = (0.5 * steps) * np.log(leaf.modulus_squared)
        computed[log_modulus > -800.0] = True
        if band is not None:
            computed &= np.arange(half) < band
        positive = steps * numerics._positive_log_bound(
            leaf.transform[0], max(leaf.error, leaf.direct_error)
        )
        logs = numerics._LogModuli(steps * upper, steps * lower, steps, 1, positive)
        error = numerics._product_error(logs, computed)
        multiplicity, weight = numerics._frequency_weights(result.size, step, half)
        noise = float((multiplicity * weight * error).sum())
        assert result.noise >= noise * numerics._MARGIN * (1 - 1e-12)
        if result.spectral is None:  # (a band adds its rotation's bound on top)
            assert result.noise <= noise * numerics._MARGIN * (1 + 1e-6)
