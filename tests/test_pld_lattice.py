"""The exact composition of finitely-valued privacy losses (accountants/_pld_lattice.py), the
route of PLDAccountant for randomized response and discrete Laplace ledgers.

References, computed here independently of dpsharp's atoms:

* brute force: the output laws of the mechanisms themselves on a pair of neighbouring datasets
  (k-ary randomized response of Warner 1965 / Kairouz, Oh, Viswanath 2014 on a record and on
  another record or the null record; the discrete Laplace mechanism of Ghosh, Roughgarden,
  Sundararajan 2009 on f(D) = 0 and 1, its tails beyond +-60 / a summed in closed form), every
  output sequence of a short composition enumerated, and the hockey-stick divergence
  sum_o (P(o) - e^eps Q(o))_+ taken at 40 digits in both orders;
* binomial sums at 40 digits for long compositions of randomized response under zero-out.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest

from dpsharp import Gaussian, PLDAccountant
from dpsharp.accountants import _pld_atoms, _pld_lattice
from dpsharp.events import DiscreteLaplace, RandomizedResponse


def _rr_laws(p: float, k: int, relation: str) -> tuple[list[mpmath.mpf], list[mpmath.mpf]]:
    """Output laws of k-ary randomized response (noise p) on a record in bucket 0 and on its
    neighbour: a record in bucket 1 (replace one) or the null record, released uniformly
    (zero-out)."""
    p_, k_ = mpmath.mpf(p), mpmath.mpf(k)
    first = [1 - p_ + p_ / k_ if o == 0 else p_ / k_ for o in range(k)]
    if relation == "replace_one":
        second = [1 - p_ + p_ / k_ if o == 1 else p_ / k_ for o in range(k)]
    else:
        second = [1 / k_] * k
    return first, second


def _discrete_laplace_laws(a: float, s: int) -> tuple[list[mpmath.mpf], list[mpmath.mpf], int]:
    """The laws of Z and Z + s on [-R, R + s] (R = ceil(60 / a)), each with its two tails beyond
    folded into an extra outcome at each end (a post-processing of the pair: the divergence of
    the folded pair is at most the exact one and, the tails holding e^-60 of the mass, within
    about 1e-26 of it)."""
    a_ = mpmath.mpf(a)
    reach = math.ceil(60 / a)
    norm = (1 - mpmath.exp(-a_)) / (1 + mpmath.exp(-a_))

    def law(shift: int) -> list[mpmath.mpf]:
        inner = [norm * mpmath.exp(-a_ * abs(z - shift)) for z in range(-reach, reach + s + 1)]
        below = norm * mpmath.exp(-a_ * (reach + 1 + shift)) / (1 - mpmath.exp(-a_))
        above = norm * mpmath.exp(-a_ * (reach + s + 1 - shift)) / (1 - mpmath.exp(-a_))
        return [below, *inner, above]

    return law(0), law(s), reach


def _brute_force_delta(laws: list[tuple[list[mpmath.mpf], list[mpmath.mpf]]],
                       epsilon: float) -> mpmath.mpf:
    """max over the two orders of sum over output sequences of (P(o) - e^eps Q(o))_+, for the
    composition of the listed releases (each a pair of laws)."""
    with mpmath.workdps(40):
        e = mpmath.exp(mpmath.mpf(epsilon))
        worst = mpmath.mpf(0)
        for swap in (False, True):
            total = mpmath.mpf(0)
            for outputs in itertools.product(*(range(len(first)) for first, _ in laws)):
                p = q = mpmath.mpf(1)
                for (first, second), o in zip(laws, outputs):
                    p *= second[o] if swap else first[o]
                    q *= first[o] if swap else second[o]
                total += max(p - e * q, 0)
            worst = max(worst, total)
        return worst


@pytest.mark.parametrize("relation", ["replace_one", "zero_out"])
def test_randomized_response_brackets_the_brute_force_divergence(relation: str) -> None:
    """Four releases of two randomized responses (3 and 5 buckets) on one pair of neighbouring
    datasets: delta_bounds holds the divergence of the enumerated output sequences at every
    epsilon, within 1e-11 relative, and epsilon_bounds holds the epsilon where it crosses."""
    releases = [(0.4, 3), (0.4, 3), (0.7, 5), (0.7, 5)]
    accountant = PLDAccountant(neighbouring=relation)
    for p, k in releases:
        accountant.compose(RandomizedResponse(p, k))
    assert accountant._exact_lattice() is not None
    laws = [_rr_laws(p, k, relation) for p, k in releases]
    for epsilon in (0.0, 0.3, 1.0, 2.5, 4.0):
        exact = _brute_force_delta(laws, epsilon)
        lower, upper = accountant.delta_bounds(epsilon)
        assert lower <= exact <= upper
        assert upper - lower <= 1e-11 * max(float(exact), 1e-300)
    for delta in (1e-2, 1e-4):
        lower, upper = accountant.epsilon_bounds(delta)
        assert upper == accountant.epsilon(delta)
        assert _brute_force_delta(laws, lower) >= delta * (1 - 1e-9)
        assert _brute_force_delta(laws, upper) <= delta
        assert upper - lower <= 1e-9 * upper


def test_discrete_laplace_brackets_the_brute_force_divergence() -> None:
    """A release of the discrete Laplace mechanism (a = 1, s = 2) and one of (a = 2, s = 1),
    the outputs enumerated: delta_bounds holds the divergence at every epsilon."""
    releases = [(1.0, 2), (2.0, 1)]
    accountant = PLDAccountant()
    for a, s in releases:
        accountant.compose(DiscreteLaplace(a, s))
    assert accountant._exact_lattice() is not None
    laws = [_discrete_laplace_laws(a, s)[:2] for a, s in releases]
    for epsilon in (0.5, 1.5, 3.0, 3.9):
        exact = _brute_force_delta(laws, epsilon)
        lower, upper = accountant.delta_bounds(epsilon)
        # (the folded reference is below the exact divergence by at most its tails, 1e-26)
        assert lower <= exact + mpmath.mpf(10) ** -25 and exact <= upper
        assert upper - lower <= 1e-11 * float(exact)


def _zero_out_rr_epsilon(p: float, k: int, count: int, delta: float) -> tuple[float, float]:
    """The exact epsilon(delta) of ``count`` releases of randomized response under zero-out,
    bisected at 40 digits on the binomial sums of both directions (R(x) against U and back):
    the two ends of the last bisection interval."""
    with mpmath.workdps(40):
        p_, k_ = mpmath.mpf(p), mpmath.mpf(k)
        own, other = 1 - p_ + p_ / k_, p_ / k_
        directions = [  # (loss of the own bucket, of another, their masses)
            (mpmath.log(own * k_), mpmath.log(other * k_), own, (k_ - 1) * other),
            (-mpmath.log(own * k_), -mpmath.log(other * k_), 1 / k_, (k_ - 1) / k_),
        ]

        terms = [[(j * high + (count - j) * low,
                   mpmath.binomial(count, j) * m_high**j * m_low ** (count - j))
                  for j in range(count + 1)] for high, low, m_high, m_low in directions]

        def worst_delta(eps: mpmath.mpf) -> mpmath.mpf:
            return max(mpmath.fsum(mass * (1 - mpmath.exp(eps - loss))
                                   for loss, mass in direction if loss > eps)
                       for direction in terms)

        low, high = mpmath.mpf(0), mpmath.mpf(count) * directions[0][0]
        for _ in range(70):
            middle = (low + high) / 2
            low, high = (middle, high) if worst_delta(middle) > delta else (low, middle)
        return float(low), float(high)


@pytest.mark.parametrize("delta", [1e-6, 1e-10, 1e-30])
def test_long_zero_out_randomized_response_is_exact_at_every_delta(delta: float) -> None:
    """500 releases of randomized response (p = 0.99, 10 buckets) under zero-out: the bracket
    holds the exact epsilon and is about 1e-11 wide. On the grid the upper bound was 0.8%
    above it at delta = 1e-10 (a bracket of 2%), and the FFT could not certify 1e-11 at all (the
    support bound, 43.1, nine times the exact 4.94)."""
    accountant = PLDAccountant(neighbouring="zero_out").compose(RandomizedResponse(0.99, 10), 500)
    lower, upper = accountant.epsilon_bounds(delta)
    exact_low, exact_high = _zero_out_rr_epsilon(0.99, 10, 500, delta)
    assert lower <= exact_low and exact_high <= upper
    assert upper - lower <= 1e-10 * upper


def test_lattice_answers_do_not_depend_on_the_order_of_composition() -> None:
    """The distinct mechanisms are taken in a canonical order: composing them in another order
    gives the same floats."""
    events = [(RandomizedResponse(0.3, 4), 7), (DiscreteLaplace(0.5, 1), 9),
              (RandomizedResponse(0.6, 2), 11)]
    answers = []
    for order in itertools.permutations(events):
        accountant = PLDAccountant(neighbouring="zero_out")
        for event, count in order:
            accountant.compose(event, count)
        answers.append((accountant.epsilon(1e-7), accountant.epsilon_bounds(1e-9),
                        accountant.delta_bounds(2.0)))
    assert all(answer == answers[0] for answer in answers)


def test_lattice_route_is_taken_only_for_few_atom_outcomes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond MAX_OUTCOMES composed outcomes, or with any event whose loss is not finitely
    valued, the accountant composes on its grid: its certified bracket holds the lattice's
    (computed with the cap raised; the lattice itself is checked against brute force above)."""
    assert _pld_lattice.outcomes([(np.zeros(3), np.zeros(3), np.ones(3), 722)]) <= _pld_lattice.MAX_OUTCOMES
    assert _pld_lattice.outcomes([(np.zeros(3), np.zeros(3), np.ones(3), 723)]) > _pld_lattice.MAX_OUTCOMES
    fewer = PLDAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.5, 3), 722)
    assert fewer._exact_lattice() is not None
    many = PLDAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.5, 3), 723)
    assert many._exact_lattice() is None
    grid_lower, grid_upper = many.epsilon_bounds(1e-6)
    monkeypatch.setattr(_pld_lattice, "MAX_OUTCOMES", 1 << 19)
    exact = PLDAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.5, 3), 723)
    assert exact._exact_lattice() is not None
    exact_lower, exact_upper = exact.epsilon_bounds(1e-6)
    assert exact_upper - exact_lower <= 1e-10 * exact_upper
    assert grid_lower <= exact_lower and exact_upper <= grid_upper
    mixed = PLDAccountant(neighbouring="replace_one").compose(RandomizedResponse(0.5, 3), 10)
    mixed.compose(Gaussian(4.0))
    assert mixed._exact_lattice() is None


def test_outcome_table_is_every_multinomial_count() -> None:
    """The enumerated count vectors are all C(c + a - 1, a - 1) vectors of a parts summing to c,
    once each, and their multinomial probabilities sum to 1."""
    for count, parts in ((0, 3), (5, 1), (6, 3), (4, 5)):
        vectors = _pld_lattice._count_vectors(count, parts)
        assert vectors.shape == (math.comb(count + parts - 1, parts - 1), parts)
        assert np.all(vectors.sum(axis=1) == count) and np.all(vectors >= 0)
        assert len({tuple(row) for row in vectors.tolist()}) == vectors.shape[0]
    losses, masses = _pld_atoms.atoms(_pld_atoms.RR_REPLACE, 0.3, 5.0)
    composed = _pld_lattice._Outcomes.of_leaf(losses, losses, masses, 40)
    assert math.fsum(np.exp(composed.log_mass).tolist()) == pytest.approx(1.0, abs=1e-13)
