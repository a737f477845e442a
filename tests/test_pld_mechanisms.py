"""Randomized response, the discrete Laplace mechanism and tree aggregation in the PLD and RDP
accountants, against references computed from the mechanisms' output distributions: the
hockey-stick divergence sum_o (P(o) - e^eps Q(o))_+ by brute force over every output of a
small composition, Renyi divergences as mpmath sums over the outputs, and the exact Gaussian
delta(eps) for tree aggregation."""

from __future__ import annotations

import itertools
import math
from typing import Any

import mpmath
import numpy as np
import pytest
from scipy.stats import norm

import dpsharp
from dpsharp.accountants import _pld_atoms
from dpsharp.events import (
    Composed,
    DiscreteLaplace,
    Neighbouring,
    RandomizedResponse,
    Repeated,
    SingleEpochTreeAggregation,
    event_from_dict,
    event_to_dict,
)


# ------------------------------------------------------------------ output distributions
def rr_law(p: float, k: int, value: int | None) -> list[float]:
    """Output law of k-ary randomized response on ``value`` (None: the null record, whose
    output is uniform)."""
    if value is None:
        return [1.0 / k] * k
    return [(1.0 - p) * (o == value) + p / k for o in range(k)]


def dl_law(a: float, shift: int, support: range) -> dict[int, float]:
    """P(shift + Z = z), Z discrete Laplace of parameter a, from its definition."""
    norm_const = math.tanh(a / 2.0)  # (1 - e^-a) / (1 + e^-a)
    return {z: norm_const * math.exp(-a * abs(z - shift)) for z in support}


def hockey_stick(pairs: list[tuple[list[float], list[float]]], eps: float) -> float:
    """delta(eps) of the product pair prod_i P_i against prod_i Q_i, by brute force over every
    output tuple (the definition: sum_o (P(o) - e^eps Q(o))_+)."""
    total = 0.0
    for outputs in itertools.product(*[range(len(p)) for p, _ in pairs]):
        p = math.prod(pair[0][o] for pair, o in zip(pairs, outputs))
        q = math.prod(pair[1][o] for pair, o in zip(pairs, outputs))
        total += max(p - math.exp(eps) * q, 0.0)
    return total


def renyi(p: list[float], q: list[float], order: float) -> float:
    """D_alpha(P || Q) = log(sum_o P^alpha Q^(1 - alpha)) / (alpha - 1), at 40 digits."""
    with mpmath.workdps(40):
        total = mpmath.fsum(
            mpmath.mpf(a) ** order * mpmath.mpf(b) ** (1 - order) for a, b in zip(p, q) if a > 0
        )
        return float(mpmath.log(total) / (order - 1))


def pld(neighbouring: str = "add_remove", **options: float) -> Any:
    return dpsharp.accountant("pld", neighbouring=neighbouring, **options)


# ------------------------------------------------------------------ events
def test_new_events_validate_and_round_trip() -> None:
    for event in (
        RandomizedResponse(0.3, 4),
        DiscreteLaplace(0.5, 3),
        SingleEpochTreeAggregation(1.5, (10, 40)),
    ):
        assert event_from_dict(event_to_dict(event)) == event
    with pytest.raises(ValueError, match=r"noise_parameter must be in \(0, 1\]"):
        RandomizedResponse(0.0, 3)
    with pytest.raises(ValueError, match="num_buckets must be an integer >= 2"):
        RandomizedResponse(0.5, 1)
    with pytest.raises(ValueError, match=r"noise_parameter must be in \(0, inf\)"):
        DiscreteLaplace(-1.0, 1)
    with pytest.raises(ValueError, match="sensitivity must be an integer >= 1"):
        DiscreteLaplace(1.0, 0)
    with pytest.raises(ValueError, match="step_counts must hold at least one epoch"):
        SingleEpochTreeAggregation(1.0, (0, 0))
    with pytest.raises(ValueError, match=r"step_counts\[1\] must be an integer >= 0"):
        SingleEpochTreeAggregation(1.0, (3, -1))
    # the relations of each analysis
    assert RandomizedResponse.allowed_neighbourings() == (
        Neighbouring.REPLACE_ONE, Neighbouring.ZERO_OUT)
    assert SingleEpochTreeAggregation.allowed_neighbourings() == (
        Neighbouring.ZERO_OUT, Neighbouring.REPLACE_ONE)
    with pytest.raises(ValueError, match="randomized response releases one bucket"):
        pld("add_remove").compose(RandomizedResponse(0.3, 3))
    # d = ceil(log2(n + 1)) (Kairouz et al. 2021, Appendix D)
    for steps in (1, 2, 3, 4, 7, 8, 1600):
        assert SingleEpochTreeAggregation(1.0, (steps,)).depth == math.ceil(math.log2(steps + 1))


# ------------------------------------------------------------------ atoms
@pytest.mark.parametrize("relation", ["replace_one", "zero_out"])
@pytest.mark.parametrize(("p", "k"), [(0.3, 3), (0.05, 20), (1e-3, 2), (1.0, 5)])
def test_randomized_response_atoms_are_the_loss_of_its_outputs(
    relation: str, p: float, k: int
) -> None:
    neighbour = 1 if relation == "replace_one" else None
    pairs = {"remove": (rr_law(p, k, 0), rr_law(p, k, neighbour)),
             "add": (rr_law(p, k, neighbour), rr_law(p, k, 0))}
    for direction, (law_p, law_q) in pairs.items():
        key = _pld_atoms.leaf_key(RandomizedResponse(p, k), Neighbouring(relation), direction)
        losses, masses = _pld_atoms.atoms(*key)
        expected: dict[float, float] = {}
        for a, b in zip(law_p, law_q):
            loss = round(math.log(a / b), 9)
            expected[loss] = expected.get(loss, 0.0) + a
        got: dict[float, float] = {}
        for loss, mass in zip(losses.tolist(), masses.tolist()):
            got[round(loss, 9)] = got.get(round(loss, 9), 0.0) + mass
        assert got.keys() == {key for key, mass in expected.items() if mass > 0}
        for loss, mass in expected.items():
            assert got.get(loss, 0.0) == pytest.approx(mass, rel=1e-12, abs=1e-300)


def test_discretised_atoms_bracket_every_delta() -> None:
    # pessimistic: a mean-preserving spread of e^{-L} (delta only grows); optimistic: losses
    # rounded down (delta only shrinks); both checked on the exact hockey-stick curve
    event = RandomizedResponse(0.2, 6)
    law_p, law_q = rr_law(0.2, 6, 0), rr_law(0.2, 6, 1)
    key = _pld_atoms.leaf_key(event, Neighbouring.REPLACE_ONE, "remove")
    for h in (0.1, 0.013, 1e-3):
        up = _pld_atoms.discretise_atoms(*key, h, True)
        down = _pld_atoms.discretise_atoms(*key, h, False)
        for eps in np.linspace(0.0, 3.5, 15):
            exact = hockey_stick([(law_p, law_q)], eps)

            def delta(result: tuple[int, np.ndarray, float]) -> float:
                offset, mass, _ = result
                losses = (offset + np.arange(mass.size)) * h
                return float(np.sum(mass * np.maximum(1.0 - np.exp(eps - losses), 0.0)))

            assert delta(down) <= exact + 1e-15 <= delta(up) + 2e-15
            assert delta(up) - exact <= h * h  # second order in the grid step
        # the spread keeps E[e^{-L}] = sum_o Q(o) = 1
        offset, mass, _ = up
        assert float(np.sum(mass * np.exp(-(offset + np.arange(mass.size)) * h))) == (
            pytest.approx(1.0, rel=1e-12))


# ------------------------------------------------------------------ PLD against brute force
@pytest.mark.parametrize(
    ("relation", "p", "k", "count"),
    [("replace_one", 0.3, 3, 1), ("replace_one", 0.4, 3, 3), ("zero_out", 0.6, 4, 3)],
)
def test_randomized_response_pld_brackets_the_exact_delta(
    relation: str, p: float, k: int, count: int
) -> None:
    neighbour = 1 if relation == "replace_one" else None
    remove = [(rr_law(p, k, 0), rr_law(p, k, neighbour))] * count
    add = [(b, a) for a, b in remove]
    accountant = pld(relation).compose(RandomizedResponse(p, k), count)
    for eps in (0.0, 1.0, 2.5):
        exact = max(hockey_stick(remove, eps), hockey_stick(add, eps))
        lower, upper = accountant.delta_bounds(eps)
        assert lower <= exact + 1e-12
        assert exact <= upper + 1e-12
        assert upper - exact <= 2e-4 * max(exact, 1e-3)
    for delta in (1e-6, 0.05):
        eps_upper = accountant.epsilon(delta)
        # certified: the exact delta at the reported epsilon is at most delta
        exact = max(hockey_stick(remove, eps_upper), hockey_stick(add, eps_upper))
        assert exact <= delta * (1 + 1e-9)
        # and tight: slightly below it, the exact delta exceeds delta
        below = eps_upper - 2e-4 * max(eps_upper, 1.0)
        assert max(hockey_stick(remove, below), hockey_stick(add, below)) > delta


def test_randomized_response_is_pure_dp_at_its_largest_loss() -> None:
    # replace one: loss at most log((1 - p + p/k) / (p/k)) = log(8) for p = 0.3, k = 3; the
    # reported epsilon at a tiny delta is within one grid step of it and never below
    accountant = pld("replace_one").compose(RandomizedResponse(0.3, 3))
    epsilon = accountant.epsilon(1e-12)
    assert math.log(8.0) - 1.3e-11 <= epsilon <= math.log(8.0) + 1e-4


def test_discrete_laplace_composition_against_brute_force() -> None:
    # 3 x DL(a = 1, s = 1) and 2 x DL(a = 0.5, s = 2): five independent pairs on integer
    # outputs, truncated at |z| <= 40 (the mass beyond is below 1e-8 and bounds the error)
    support = range(-40, 41)

    def pair(a: float, s: int) -> tuple[list[float], list[float]]:
        p = dl_law(a, 0, support)
        q = dl_law(a, s, support)
        return [p[z] for z in support], [q[z] for z in support]

    # brute force over the output tuples would be 81^5; group each pair by its loss first
    def loss_law(a: float, s: int) -> dict[float, float]:
        p, q = pair(a, s)
        law: dict[float, float] = {}
        for x, y in zip(p, q):
            loss = round(math.log(x / y), 12)
            law[loss] = law.get(loss, 0.0) + x
        return law

    laws = [loss_law(1.0, 1)] * 3 + [loss_law(0.5, 2)] * 2
    composed = {0.0: 1.0}
    for law in laws:
        nxt: dict[float, float] = {}
        for l1, m1 in composed.items():
            for l2, m2 in law.items():
                key = round(l1 + l2, 12)
                nxt[key] = nxt.get(key, 0.0) + m1 * m2
        composed = nxt
    accountant = pld().compose(
        Composed((Repeated(DiscreteLaplace(1.0, 1), 3), Repeated(DiscreteLaplace(0.5, 2), 2)))
    )
    for eps in (0.0, 2.0, 4.9):
        exact = sum(m * max(1.0 - math.exp(eps - loss), 0.0) for loss, m in composed.items())
        lower, upper = accountant.delta_bounds(eps)
        assert lower - 1e-8 <= exact <= upper + 1e-8
        assert upper - exact <= 1e-4 * exact + 1e-8
    # pure DP: every loss is at most 3 * 1 + 2 * 1 = 5; the pessimistic grid moves the top
    # atom up by less than a grid step per leaf, and delta is exactly 0 beyond the support
    assert accountant.delta(5.0) <= 1e-9
    assert accountant.delta(5.0 + 1e-3) == 0.0
    assert 5.0 - 1e-3 <= accountant.epsilon(1e-9) <= 5.0 + 1e-3


def test_tree_aggregation_is_its_equivalent_gaussian() -> None:
    # 1600 steps: d = 11 released nodes hold a record, each with noise sigma = 8.83: the
    # Gaussian mechanism with mu = sqrt(11) / 8.83 (exact delta(eps), Balle and Wang 2018)
    event = SingleEpochTreeAggregation(8.83, (1600,))
    mu = math.sqrt(11) / 8.83
    accountant = pld("zero_out").compose(event)
    for eps in (0.1, 0.5, 1.0):
        exact = norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)
        lower, upper = accountant.delta_bounds(eps)
        assert lower <= exact <= upper
        assert upper - exact <= 1e-3 * exact
    with pytest.raises(ValueError, match="tree aggregation is analysed"):
        pld("add_remove").compose(event)


# ------------------------------------------------------------------ RDP
@pytest.mark.parametrize("relation", ["replace_one", "zero_out"])
def test_randomized_response_rdp_is_the_exact_divergence(relation: str) -> None:
    p, k = 0.3, 5
    neighbour = 1 if relation == "replace_one" else None
    law_p, law_q = rr_law(p, k, 0), rr_law(p, k, neighbour)
    orders = [1.5, 2.0, 7.25, 64.0]
    accountant = dpsharp.accountant("rdp", orders=orders, neighbouring=relation)
    accountant.compose(RandomizedResponse(p, k), 2)
    expected = [2 * max(renyi(law_p, law_q, a), renyi(law_q, law_p, a)) for a in orders]
    np.testing.assert_allclose(accountant.rdp(), expected, rtol=1e-12)
    # the limits: KL at order 1, the largest loss at inf
    kl = sum(a * math.log(a / b) for a, b in zip(law_p, law_q))
    kl = max(kl, sum(b * math.log(b / a) for a, b in zip(law_p, law_q)))
    key = _pld_atoms.leaf_key(RandomizedResponse(p, k), Neighbouring(relation), "remove")
    curve = _pld_atoms.event_rdp(RandomizedResponse(p, k), Neighbouring(relation),
                                 [1.0, 1.0 + 1e-9, math.inf])
    assert curve[0] == pytest.approx(kl, rel=1e-12)
    assert curve[1] == pytest.approx(kl, rel=1e-7)
    largest = max(max(math.log(a / b), math.log(b / a)) for a, b in zip(law_p, law_q))
    assert curve[2] == pytest.approx(largest, rel=1e-14)
    assert key[0] in _pld_atoms.ATOM_MECHANISMS


@pytest.mark.parametrize("relation", ["replace_one", "zero_out"])
@pytest.mark.parametrize("p", [0.3, 0.999999, 1.0 - 1e-12])
def test_randomized_response_rdp_is_not_below_the_exact_divergence(relation: str,
                                                                    p: float) -> None:
    """The Renyi divergence of randomized response from its output laws at 60 digits (mpmath,
    the laws' closed forms on the given double p; Mironov 2017, Definition 3). As p -> 1 the
    divergence is a sum whose first-order terms cancel: it read 5.7e-5 relative below exact at
    p = 1 - 1e-12 (replace one) and 9e-11 at p = 0.999999 (zero out). Now at or above, and
    within 1e-12 relative wherever the cancellation is mild (p = 0.3)."""
    k = 3
    orders = [1.01, 1.5, 10.0]
    with mpmath.workdps(60):
        r = mpmath.mpf(p)

        def law(value: int | None) -> list[Any]:
            return [(1 - r) * (o == value) + r / k if value is not None else 1 / mpmath.mpf(k)
                    for o in range(k)]

        def divergence(first: list[Any], second: list[Any], order: float) -> Any:
            a = mpmath.mpf(order)
            return mpmath.log(mpmath.fsum(x**a * y ** (1 - a)
                                          for x, y in zip(first, second))) / (a - 1)

        law_p, law_q = law(0), law(1 if relation == "replace_one" else None)
        exact = [max(divergence(law_p, law_q, a), divergence(law_q, law_p, a)) for a in orders]
    got = dpsharp.accountant("rdp", orders=orders, neighbouring=relation).compose(
        RandomizedResponse(p, k)).rdp()
    for value, reference in zip(got, exact):
        assert value >= reference, (value, float(reference))
        if p == 0.3:
            assert value <= reference * (1 + 1e-12)


def test_discrete_laplace_rdp_is_the_exact_divergence() -> None:
    a, s = 0.7, 3
    support = range(-80, 84)
    law_p = [dl_law(a, 0, support)[z] for z in support]
    law_q = [dl_law(a, s, support)[z] for z in support]
    orders = [1.25, 2.0, 10.0, 200.0]
    accountant = dpsharp.accountant("rdp", orders=orders)
    accountant.compose(DiscreteLaplace(a, s))
    np.testing.assert_allclose(
        accountant.rdp(), [renyi(law_p, law_q, order) for order in orders], rtol=1e-9
    )


def test_tree_aggregation_rdp() -> None:
    accountant = dpsharp.accountant("rdp", orders=[2.0, 10.0], neighbouring="zero_out")
    accountant.compose(SingleEpochTreeAggregation(2.0, (10, 40, 30)))
    # d = ceil(log2(41)) = 6: alpha d / (2 sigma^2)
    np.testing.assert_allclose(accountant.rdp(), [2.0 * 6 / 8.0, 10.0 * 6 / 8.0], rtol=1e-15)


@pytest.mark.parametrize("buckets", [2, 10**6, 10**18])
def test_randomized_response_total_variation_is_not_below_the_exact_value(buckets: int) -> None:
    """Replace one, delta(0) = P(own) - P(other) = 1 - p exactly (the two lists differ in one
    answer's bucket). The own bucket's mass was formed as 1 - p (k - 1) / k, which lost p / k
    to cancellation: at p = 1 - 2^-53, k = 1e18 delta(0) read 1% below 1 - p."""
    p = 1.0 - 1e-16
    acc = dpsharp.PLDAccountant(neighbouring="replace_one").compose(
        RandomizedResponse(p, buckets))
    exact = 1 - mpmath.mpf(p)
    assert exact <= acc.delta(0.0) <= exact * (1 + 1e-9)


@pytest.mark.parametrize("scale", [0.1, 1 / 3, 7e-5, 30.0, 2.0**-300 * 3.3, 1e100 / 7])
@pytest.mark.parametrize("sensitivity", [1, 2, 51, 700])
def test_discrete_laplace_loss_brackets_hold_the_exact_products(
        scale: float, sensitivity: int) -> None:
    """The brackets of the losses a m of the discrete Laplace atoms, from the exact rounding
    error of each double product (vectorised), against the products at 60 digits: each
    bracket holds its exact loss, and is one double wide exactly when the product is
    inexact."""
    _, masses = _pld_atoms.atoms(_pld_atoms.DISCRETE_LAPLACE, scale, sensitivity)
    below, above = _pld_atoms.atom_loss_brackets(_pld_atoms.DISCRETE_LAPLACE, scale, sensitivity)
    factors = [sensitivity, *(sensitivity - 2 * x for x in range(1, sensitivity)), -sensitivity]
    _, every_mass = _pld_atoms._every_atom(_pld_atoms.DISCRETE_LAPLACE, scale, sensitivity)
    kept = [m for m, mass in zip(factors, every_mass) if mass > 0.0]
    assert len(kept) == len(below) == len(masses)
    with mpmath.workdps(60):
        for low, high, m in zip(below, above, kept):
            exact = mpmath.mpf(scale) * m
            assert mpmath.mpf(float(low)) <= exact <= mpmath.mpf(float(high))
            assert (low == high) == (mpmath.mpf(float(low)) == exact)
            assert high <= np.nextafter(low, np.inf)
