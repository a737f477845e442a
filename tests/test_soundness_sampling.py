"""Brute-force soundness of every sampling event's accounting.

For mechanisms small enough to enumerate -- a few clipped scalar records (values in [-1, 1],
clipping norm C = 1), Gaussian noise of standard deviation ``sigma`` on every released sum --
the output law is a Gaussian mixture over the sampling outcomes (all subsets for Poisson
sampling, all fixed-size subsets without replacement, all permutations for reshuffling). The
exact hockey-stick divergence

    delta(eps) = max over the two orders of E_P[(1 - e^eps q / p)_+]

(Balle and Wang 2018) of a pair of neighbouring datasets is computed here from those mixtures,
independently of dpsharp, and every accountant's certified delta(eps) for the event that
describes the mechanism must be at least the worst exact value over a grid of neighbouring
pairs:

* 1-dimensional outputs (one sampled step): the set {p > e^eps q} is a union of intervals whose
  end points are found by bracketing and Brent's method, and the integral of p - e^eps q over
  each interval is a sum of normal CDFs -- exact up to the root finding.
* one reshuffled epoch with two batches: the output (y1, y2) is rotated to
  u = (y1 + y2) / sqrt 2, v = (y1 - y2) / sqrt 2. Every permutation has the same total, so u
  is N(total / sqrt 2, sigma^2) independently of the mixture over v, and the expectation over u
  is the closed-form Gaussian hockey-stick divergence at the level the v-ratio sets; what is
  left is a smooth 1-dimensional integral over v, done by the trapezoidal rule on a fine grid
  (checked against the closed form of a single Gaussian and against adaptive quadrature).

The relations are those of :mod:`dpsharp.events`: add/remove one (D' = D plus a record),
zero-out (one record replaced by the null record, whose clipped contribution is 0) and replace
one (one record replaced by any value in [-1, 1]).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr

import dpsharp
from dpsharp.accountants.base import UnsupportedEventError
from dpsharp.events import Gaussian, PoissonSampled, SampledWithoutReplacement, Shuffled

#: Values of the record that differs; the other records take values in OTHERS.
GRID = (-1.0, -0.5, 0.0, 0.5, 1.0)
OTHERS = (-1.0, 0.0, 1.0)
EPSILONS = (0.25, 1.0, 2.0, 3.0)

Mixture = tuple[np.ndarray, np.ndarray]  # (component means, weights summing to 1)


# ------------------------------------------------------------------------- exact references
def gaussian_delta(eps: float | np.ndarray, mu: float) -> np.ndarray:
    """Closed form for N(0, 1) against N(mu, 1), mu > 0 (Balle and Wang 2018, Theorem 8),
    valid for every real eps: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    eps = np.asarray(eps, dtype=float)
    return np.maximum(
        ndtr(-eps / mu + mu / 2.0) - np.exp(eps + log_ndtr(-eps / mu - mu / 2.0)), 0.0
    )


def _mixture(values: Iterable[float], weights: Iterable[float] | None = None) -> Mixture:
    values = list(values)
    weights = [1.0] * len(values) if weights is None else list(weights)
    merged: dict[float, float] = {}
    for value, weight in zip(values, weights):
        key = round(value, 12)
        merged[key] = merged.get(key, 0.0) + weight
    means = np.array(sorted(merged))
    mass = np.array([merged[m] for m in means])
    return means, mass / mass.sum()


def _log_density(mixture: Mixture, x: np.ndarray, sigma: float) -> np.ndarray:
    """log of sum_i w_i exp(-(x - m_i)^2 / (2 sigma^2)) (the common 1/(sigma sqrt(2 pi))
    factor cancels in every ratio and is left out)."""
    means, weights = mixture
    z = (x[..., None] - means) / sigma
    exponent = -0.5 * z * z + np.log(weights)
    top = exponent.max(axis=-1)
    return top + np.log(np.exp(exponent - top[..., None]).sum(axis=-1))


def _scalar_log_density(mixture: Mixture, x: float, sigma: float) -> float:
    means, weights = mixture
    terms = [math.log(w) - 0.5 * ((x - m) / sigma) ** 2 for m, w in zip(means, weights)]
    top = max(terms)
    return top + math.log(math.fsum(math.exp(t - top) for t in terms))


def _mass(mixture: Mixture, low: float, high: float, sigma: float) -> float:
    means, weights = mixture
    return float(np.sum(weights * (ndtr((high - means) / sigma) - ndtr((low - means) / sigma))))


def _hockey_stick_1d_curve(
    p: Mixture, q: Mixture, sigma: float, epsilons: Sequence[float]
) -> np.ndarray:
    lo = min(p[0].min(), q[0].min()) - 14.0 * sigma
    hi = max(p[0].max(), q[0].max()) + 14.0 * sigma
    grid = np.linspace(lo, hi, 4001)
    ratio = _log_density(p, grid, sigma) - _log_density(q, grid, sigma)

    def f(t: float, eps: float) -> float:
        return _scalar_log_density(p, t, sigma) - _scalar_log_density(q, t, sigma) - eps

    result = []
    for eps in epsilons:
        values = ratio - eps
        cuts = [-math.inf]
        for i in np.flatnonzero(np.sign(values[:-1]) != np.sign(values[1:])):
            cuts.append(brentq(f, grid[i], grid[i + 1], args=(eps,), xtol=1e-14, rtol=1e-15))
        cuts.append(math.inf)
        total = 0.0
        for low, high in zip(cuts[:-1], cuts[1:]):
            if f((max(low, lo) + min(high, hi)) / 2.0, eps) > 0.0:
                total += _mass(p, low, high, sigma) - math.exp(eps) * _mass(q, low, high, sigma)
        result.append(max(total, 0.0))
    return np.array(result)


def hockey_stick_1d(p: Mixture, q: Mixture, sigma: float, eps: float) -> float:
    """E_P[(1 - e^eps q/p)_+] = integral of (p - e^eps q)_+ for 1-d Gaussian mixtures with a
    common standard deviation: exact up to the root finding of the crossings (located on a
    grid of 4001 points over the means +- 14 sigma, then by Brent's method)."""
    return float(_hockey_stick_1d_curve(p, q, sigma, [eps])[0])


def exact_delta_1d(p: Mixture, q: Mixture, sigma: float) -> np.ndarray:
    """max over both orders at every eps of EPSILONS."""
    return np.maximum(
        _hockey_stick_1d_curve(p, q, sigma, EPSILONS), _hockey_stick_1d_curve(q, p, sigma, EPSILONS)
    )


def _two_batch_laws(batch_sums: Counter[tuple[float, ...]]) -> tuple[float, Mixture]:
    """(u mean, v mixture) of a two-batch epoch: u = (s1 + s2)/sqrt 2, v = (s1 - s2)/sqrt 2."""
    totals = {round(sum(s), 12) for s in batch_sums}
    assert len(totals) == 1, "every permutation of one dataset has the same total"
    u = next(iter(totals)) / math.sqrt(2.0)
    v = _mixture(
        [(s[0] - s[1]) / math.sqrt(2.0) for s in batch_sums],
        [float(c) for c in batch_sums.values()],
    )
    return u, v


def _hockey_stick_two_batches_curve(
    p_sums: Counter[tuple[float, ...]],
    q_sums: Counter[tuple[float, ...]],
    sigma: float,
    epsilons: Sequence[float],
    points: int,
) -> np.ndarray:
    u_p, v_p = _two_batch_laws(p_sums)
    u_q, v_q = _two_batch_laws(q_sums)
    shift = abs(u_p - u_q) / sigma
    if shift == 0.0:
        return _hockey_stick_1d_curve(v_p, v_q, sigma, epsilons)
    lo = min(v_p[0].min(), v_q[0].min()) - 14.0 * sigma
    hi = max(v_p[0].max(), v_q[0].max()) + 14.0 * sigma
    v = np.linspace(lo, hi, points)
    log_p = _log_density(v_p, v, sigma)
    log_q = _log_density(v_q, v, sigma)
    # the density of v under P times the u-expectation at level eps + log(q/p)
    density = np.exp(log_p) / (sigma * math.sqrt(2.0 * math.pi))
    return np.array(
        [np.trapezoid(density * gaussian_delta(eps + log_q - log_p, shift), v) for eps in epsilons]
    )


def hockey_stick_two_batches(
    p_sums: Counter[tuple[float, ...]],
    q_sums: Counter[tuple[float, ...]],
    sigma: float,
    eps: float,
    *,
    points: int = 4001,
) -> float:
    """E_P[(1 - e^eps q/p)_+] for two-batch outputs (see the module docstring)."""
    return float(_hockey_stick_two_batches_curve(p_sums, q_sums, sigma, [eps], points)[0])


def exact_delta_two_batches(
    p_sums: Counter[tuple[float, ...]], q_sums: Counter[tuple[float, ...]], sigma: float
) -> np.ndarray:
    """max over both orders at every eps of EPSILONS."""
    return np.maximum(
        _hockey_stick_two_batches_curve(p_sums, q_sums, sigma, EPSILONS, 4001),
        _hockey_stick_two_batches_curve(q_sums, p_sums, sigma, EPSILONS, 4001),
    )


# ------------------------------------------------------------------------- output laws
def shuffled_batch_sums(records: Sequence[float], batch_size: int) -> Counter[tuple[float, ...]]:
    """Batch sums of every permutation of ``records`` cut into consecutive batches of
    ``batch_size`` (the last may be smaller), with multiplicities."""
    sums: Counter[tuple[float, ...]] = Counter()
    for order in itertools.permutations(records):
        sums[
            tuple(
                round(sum(order[start : start + batch_size]), 12)
                for start in range(0, len(order), batch_size)
            )
        ] += 1
    return sums


def poisson_sum_law(records: Sequence[float], q: float) -> Mixture:
    values, weights = [], []
    for mask in itertools.product((0, 1), repeat=len(records)):
        values.append(sum(r for r, keep in zip(records, mask) if keep))
        weights.append(math.prod(q if keep else 1.0 - q for keep in mask))
    return _mixture(values, weights)


def without_replacement_sum_law(records: Sequence[float], sample_size: int) -> Mixture:
    return _mixture(sum(subset) for subset in itertools.combinations(records, sample_size))


def multisets(size: int) -> list[tuple[float, ...]]:
    """Every multiset of ``size`` values of OTHERS (the records that do not change)."""
    return list(itertools.combinations_with_replacement(OTHERS, size))


def accountant_deltas(acc: dpsharp.Accountant) -> np.ndarray:
    return np.array([acc.delta(eps) for eps in EPSILONS])


def _assert_sound(exact: np.ndarray, certified: np.ndarray, what: str) -> None:
    bad = exact > certified * (1.0 + 1e-9) + 1e-12
    assert not bad.any(), (
        f"{what}: exact delta {exact[bad]} above the certified {certified[bad]} at eps "
        f"{np.asarray(EPSILONS)[bad]}"
    )


# ------------------------------------------------------------------------- the integrators
def test_integrators_reproduce_the_closed_form_gaussian() -> None:
    """A single Gaussian against a shifted one: both integrators give the closed form."""
    for sigma, shift in ((1.0, 1.0), (0.7, 2.5), (2.0, 0.3)):
        for eps in (-0.5, 0.0, 0.5, 2.0, 4.0):
            exact = float(gaussian_delta(eps, shift / sigma))
            got = hockey_stick_1d(_mixture([shift]), _mixture([0.0]), sigma, eps)
            assert got == pytest.approx(exact, rel=1e-9, abs=1e-13)
    # two batches: N((2, 1)) against N((1, 0.5)), shift sqrt(1 + 1/4)
    p, q = Counter({(2.0, 1.0): 1}), Counter({(1.0, 0.5): 1})
    for sigma in (0.5, 1.0, 3.0):
        for eps in (0.0, 0.5, 2.0, 4.0):
            exact = float(gaussian_delta(eps, math.sqrt(1.25) / sigma))
            got = hockey_stick_two_batches(p, q, sigma, eps)
            assert got == pytest.approx(exact, rel=1e-8, abs=1e-12)


def test_two_batch_integral_matches_adaptive_quadrature() -> None:
    """The trapezoidal v-integral of a genuine mixture against scipy's adaptive quadrature."""
    p = shuffled_batch_sums((1.0, 1.0, 1.0), 2)
    q = shuffled_batch_sums((1.0, 1.0, 1.0, -1.0), 2)
    u_p, v_p = _two_batch_laws(p)
    u_q, v_q = _two_batch_laws(q)
    shift = abs(u_p - u_q)

    def integrand(v: float) -> float:
        x = np.array([v])
        log_p, log_q = _log_density(v_p, x, 1.0)[0], _log_density(v_q, x, 1.0)[0]
        level = float(gaussian_delta(3.0 + log_q - log_p, shift))
        return math.exp(log_p) / math.sqrt(2 * math.pi) * level

    reference, error = quad(integrand, -15.0, 15.0, epsabs=1e-13, epsrel=1e-12, limit=400)
    assert error < 1e-10
    assert hockey_stick_two_batches(p, q, 1.0, 3.0) == pytest.approx(reference, rel=1e-8, abs=1e-13)


# ------------------------------------------------------------------------- reshuffling
def test_reshuffling_is_not_add_remove_private_as_a_gaussian() -> None:
    """D = {1, 1, 1} against D' = D + {-1}, batch size 2, noise std 1 on each batch sum: the
    added record moves another one into the second batch, so one epoch is far from the
    Gaussian(1) an add/remove parallel-composition argument would charge."""
    d = shuffled_batch_sums((1.0, 1.0, 1.0), 2)
    d_prime = shuffled_batch_sums((1.0, 1.0, 1.0, -1.0), 2)
    exact = max(
        hockey_stick_two_batches(d, d_prime, 1.0, 3.0),
        hockey_stick_two_batches(d_prime, d, 1.0, 3.0),
    )
    claimed = float(gaussian_delta(3.0, 1.0))  # what Shuffled(Gaussian(1)) under add/remove says
    assert claimed == pytest.approx(0.0015, abs=5e-5)
    assert exact == pytest.approx(0.092, abs=1e-3)
    assert exact > 50.0 * claimed
    # ... so no accountant may state Shuffled under add/remove any more
    event = Shuffled(Gaussian(1.0), 2, 4)
    for name in ("pld", "zcdp", "classic"):
        acc = dpsharp.accountant(name)
        assert not acc.supports(event)
        with pytest.raises(UnsupportedEventError, match="Poisson") as info:
            acc.compose(event)
        assert "zero_out" in str(info.value) and "batch boundaries" in str(info.value)
        assert acc.is_empty


@pytest.mark.parametrize("sigma", [1.0, 2.0])
@pytest.mark.parametrize("size", [3, 4])
def test_reshuffling_under_zero_out_is_sound(size: int, sigma: float) -> None:
    """Every D = R + {x}, D' = R + {0} over the grid: the exact delta of one epoch (batch size
    2) is at most what the PLD and zCDP accountants certify for Shuffled(Gaussian(sigma))."""
    batch = 2
    event = Shuffled(Gaussian(sigma), batch, size)
    certified = {
        name: accountant_deltas(dpsharp.accountant(name, neighbouring="zero_out").compose(event))
        for name in ("pld", "zcdp")
    }
    worst = np.zeros(len(EPSILONS))
    for rest in multisets(size - 1):
        for x in GRID:
            if x == 0.0:
                continue
            d = shuffled_batch_sums(rest + (x,), batch)
            d_prime = shuffled_batch_sums(rest + (0.0,), batch)
            exact = exact_delta_two_batches(d, d_prime, sigma)
            worst = np.maximum(worst, exact)
    for name, deltas in certified.items():
        _assert_sound(worst, deltas, f"zero-out Shuffled, {name}")
    assert worst.max() > 0.0


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_reshuffling_under_replace_one_is_sound(sigma: float) -> None:
    """Every D = R + {x}, D' = R + {x'} over the grid (4 records, batch size 2): the exact
    delta is at most what is certified for Shuffled(Gaussian(sigma / 2)) under replace one
    (noise std sigma against the sensitivity 2 of the clipped sum)."""
    size, batch = 4, 2
    event = Shuffled(Gaussian(sigma / 2.0), batch, size)
    certified = {
        name: accountant_deltas(dpsharp.accountant(name, neighbouring="replace_one").compose(event))
        for name in ("pld", "zcdp")
    }
    worst = np.zeros(len(EPSILONS))
    for rest in multisets(size - 1):
        for x, x_prime in itertools.combinations(GRID, 2):
            d = shuffled_batch_sums(rest + (x,), batch)
            d_prime = shuffled_batch_sums(rest + (x_prime,), batch)
            exact = exact_delta_two_batches(d, d_prime, sigma)
            worst = np.maximum(worst, exact)
    for name, deltas in certified.items():
        _assert_sound(worst, deltas, f"replace-one Shuffled, {name}")
    assert worst.max() > 0.0


def test_one_batch_epoch_is_exactly_the_gaussian_bracket() -> None:
    """With one batch (batch size = dataset size) an epoch is the Gaussian mechanism, so the
    worst zero-out pair attains the accounted value: the PLD bracket contains the exact delta."""
    sigma = 1.0
    acc = dpsharp.accountant("pld", neighbouring="zero_out")
    acc.compose(Shuffled(Gaussian(sigma), 2, 2))
    exacts = exact_delta_1d(_mixture([1.0 + 1.0]), _mixture([1.0 + 0.0]), sigma)
    for eps, exact in zip(EPSILONS, exacts):
        assert exact == pytest.approx(float(gaussian_delta(eps, 1.0)), rel=1e-9)
        if eps != 1.0:
            continue
        lower, upper = acc.delta_bounds(eps)
        assert lower * (1 - 1e-9) <= exact <= upper * (1 + 1e-9)


# ------------------------------------------------------------------------- Poisson sampling
@pytest.mark.parametrize("q", [0.2, 0.5])
@pytest.mark.parametrize("relation", ["add_remove", "zero_out"])
def test_poisson_sampling_is_sound(q: float, relation: str) -> None:
    """D = R + {x} against R (add/remove) or R + {0} (zero-out), 3 other records on the grid,
    all 2^n subsets enumerated: exact delta <= the PLD's and RDP's certified delta."""
    sigma = 1.0
    event = PoissonSampled(Gaussian(sigma), q)
    certified = {
        name: accountant_deltas(dpsharp.accountant(name, neighbouring=relation).compose(event))
        for name in ("pld", "rdp")
    }
    worst = np.zeros(len(EPSILONS))
    for rest in multisets(3):
        for x in GRID:
            if x == 0.0:
                continue
            other = rest if relation == "add_remove" else rest + (0.0,)
            p = poisson_sum_law(rest + (x,), q)
            q_law = poisson_sum_law(other, q)
            exact = exact_delta_1d(p, q_law, sigma)
            worst = np.maximum(worst, exact)
    for name, deltas in certified.items():
        _assert_sound(worst, deltas, f"{relation} PoissonSampled, {name}")
    if q != 0.5:
        return
    # the worst pair (R all zero, x = 1) is the dominating pair: the PLD bracket holds it
    pld = dpsharp.accountant("pld", neighbouring=relation).compose(event)
    lower, upper = pld.delta_bounds(1.0)
    assert lower * (1 - 1e-9) <= worst[EPSILONS.index(1.0)] <= upper * (1 + 1e-9)


# ------------------------------------------------------------------------- without replacement
@pytest.mark.parametrize("sample_size", [1, 2])
def test_sampling_without_replacement_under_replace_one_is_sound(sample_size: int) -> None:
    """D = R + {x} against R + {x'} (4 records on the grid), every subset of ``sample_size``
    enumerated: exact delta <= what PLD and RDP certify for
    SampledWithoutReplacement(Gaussian(sigma / 2)) under replace one."""
    sigma, size = 1.0, 4
    event = SampledWithoutReplacement(Gaussian(sigma / 2.0), sample_size, size)
    certified = {
        name: accountant_deltas(dpsharp.accountant(name, neighbouring="replace_one").compose(event))
        for name in ("pld", "rdp")
    }
    worst = np.zeros(len(EPSILONS))
    for rest in multisets(size - 1):
        for x, x_prime in itertools.combinations(GRID, 2):
            p = without_replacement_sum_law(rest + (x,), sample_size)
            q_law = without_replacement_sum_law(rest + (x_prime,), sample_size)
            exact = exact_delta_1d(p, q_law, sigma)
            worst = np.maximum(worst, exact)
    for name, deltas in certified.items():
        _assert_sound(worst, deltas, f"replace-one SampledWithoutReplacement, {name}")
    assert worst.max() > 0.0


# ------------------------------------------------------------------------- the descriptions
def test_every_accountant_accepts_zero_out_where_its_analysis_holds() -> None:
    """Zero-out is a relation of every accountant; Poisson steps give the add/remove numbers
    there (a null record in a Poisson sample is an absent one), and checkpoints keep it."""
    poisson = PoissonSampled(Gaussian(1.0), 0.1)
    for name in dpsharp.available():
        acc = dpsharp.accountant(name, neighbouring="zero_out")
        assert acc.neighbouring.value == "zero_out"
        assert acc.supports(Gaussian(1.0))
        assert not acc.supports(SampledWithoutReplacement(Gaussian(1.0), 2, 10))
    for name in ("pld", "rdp"):
        zero = dpsharp.accountant(name, neighbouring="zero_out").compose(poisson, 20)
        add = dpsharp.accountant(name).compose(poisson, 20)
        assert zero.epsilon(1e-5) == add.epsilon(1e-5)
        restored = dpsharp.accountant(name, neighbouring="zero_out")
        restored.load_state_dict(zero.state_dict())
        assert restored.epsilon(1e-5) == zero.epsilon(1e-5)
        with pytest.raises(ValueError, match="zero_out"):
            dpsharp.accountant(name).load_state_dict(zero.state_dict())


def test_dpsgd_run_states_reshuffling_under_zero_out() -> None:
    """``dpsharp epsilon --sampling shuffle``: zero-out by default, with the same epoch event
    (so the same numbers for a given sigma), the relation stated in words; add/remove refused."""
    from dpsharp._dpsgd import DPSGDRun

    run = DPSGDRun(10000, 100, 400 * 100, 6.0, "shuffle")
    assert run.neighbouring.value == "zero_out"
    assert run.event == Shuffled(Gaussian(6.0), 100, 10000) and run.count == 400
    assert run.accountant_options("pld") == {"neighbouring": "zero_out"}
    assert "zero (null) example" in run.assumption() and "not an add/remove" in run.assumption()
    # Yu et al. 2019's 400 reshuffled epochs at sigma = 6: Bun-Steinke epsilon 21.551
    zcdp = dpsharp.accountant("zcdp", **run.accountant_options("zcdp"))
    zcdp.compose(run.event, run.count)
    assert round(zcdp.epsilon_bun_steinke(1e-5), 3) == 21.551  # type: ignore[attr-defined]
    replace = DPSGDRun(10000, 100, 100, 6.0, "shuffle", "replace_one")
    assert replace.event == Shuffled(Gaussian(3.0), 100, 10000)
    with pytest.raises(UnsupportedEventError, match="batch boundaries"):
        DPSGDRun(10000, 100, 100, 6.0, "shuffle", "add_remove")
    assert DPSGDRun(10000, 100, 100, 6.0).neighbouring.value == "add_remove"
    assert "adding or removing one example" in DPSGDRun(10000, 100, 100, 6.0).assumption()
