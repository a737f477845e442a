"""Compositions that are exactly Gaussian (no sampling): the tight accountant answers with the
closed form of mu-GDP, mu = sqrt(sum_i c_i / sigma_i^2) (Dong, Roth, Su 2019, Cor. 3.3 and
2.13), not with a grid and FFTs.

References, independent of the code under test: the root of delta_mu(eps) = delta found by
mpmath at 60 digits, delta_mu(eps) at 60 digits, and dp-accounting 0.6.0's PLD accountant (whose
Gaussian PLD is a pessimistic discretisation: never below the exact epsilon)."""

from __future__ import annotations

import math

import mpmath
import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled, SampledWithoutReplacement
from dpsharp.events import Event


def exact_delta(eps: float, mu2: mpmath.mpf) -> mpmath.mpf:
    with mpmath.workdps(60):
        mu = mpmath.sqrt(mu2)
        e = mpmath.mpf(eps)
        return mpmath.ncdf(-e / mu + mu / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu - mu / 2)


def exact_epsilon(delta: float, mu2: mpmath.mpf) -> float:
    with mpmath.workdps(60):
        mu = mpmath.sqrt(mu2)
        guess = mu2 / 2 + mu * mpmath.sqrt(2 * mpmath.log(1 / mpmath.mpf(delta)))
        root = mpmath.findroot(
            lambda e: mpmath.log(exact_delta(e, mu2)) - mpmath.log(delta), (guess / 4, guess * 2),
            solver="anderson",
        )
        return float(root)


def mu_squared(parts: list[tuple[float, int]]) -> mpmath.mpf:
    with mpmath.workdps(60):
        return mpmath.fsum(mpmath.mpf(count) / mpmath.mpf(sigma) ** 2 for sigma, count in parts)


CASES: list[tuple[list[tuple[Event, int]], list[tuple[float, int]]]] = [
    ([(Gaussian(1.0), 1000)], [(1.0, 1000)]),
    ([(Gaussian(4.0), 10_000)], [(4.0, 10_000)]),
    (
        [(Gaussian(0.8), 10), (PoissonSampled(Gaussian(1.5), 1.0), 300), (Gaussian(30.0), 7)],
        [(0.8, 10), (1.5, 300), (30.0, 7)],
    ),
]
#: Under replace one (a full sample without replacement is the Gaussian itself; the noise
#: multiplier is relative to the sensitivity under the accountant's relation, as for the grid).
REPLACE_ONE = ([(SampledWithoutReplacement(Gaussian(2.0), 100, 100), 50), (Gaussian(3.0), 9)],
               [(2.0, 50), (3.0, 9)])


def composed(events: list[tuple[Event, int]], **options: object) -> PLDAccountant:
    accountant = PLDAccountant(**options)  # type: ignore[arg-type]
    for event, count in events:
        accountant.compose(event, count)
    return accountant


@pytest.mark.parametrize(("events", "parts"), CASES)
@pytest.mark.parametrize("delta", [1e-5, 1e-10])
def test_epsilon_is_the_closed_form(
    events: list[tuple[Event, int]], parts: list[tuple[float, int]], delta: float
) -> None:
    exact = exact_epsilon(delta, mu_squared(parts))
    accountant = composed(events)
    upper = accountant.epsilon(delta)
    assert exact <= upper <= exact * (1 + 1e-12)
    lower, bracket_upper = accountant.epsilon_bounds(delta)
    assert bracket_upper == upper  # one composition, one number
    assert exact * (1 - 1e-12) <= lower <= exact
    assert accountant.guarantee(delta).epsilon == upper


@pytest.mark.parametrize(("events", "parts"), CASES)
def test_delta_is_the_closed_form(
    events: list[tuple[Event, int]], parts: list[tuple[float, int]]
) -> None:
    mu2 = mu_squared(parts)
    accountant = composed(events)
    for eps in (0.1, 1.0, 5.0):
        exact = float(exact_delta(eps, mu2))
        assert exact <= accountant.delta(eps) <= exact * (1 + 1e-12)
        lower, upper = accountant.delta_bounds(eps)
        assert lower <= exact <= upper
        assert upper - lower <= 1e-12 * exact


def test_full_sample_without_replacement_is_the_gaussian() -> None:
    events, parts = REPLACE_ONE
    exact = exact_epsilon(1e-6, mu_squared(parts))
    epsilon = composed(events, neighbouring="replace_one").epsilon(1e-6)
    assert exact <= epsilon <= exact * (1 + 1e-12)


def test_tiny_delta_and_huge_step_counts_need_no_fft() -> None:
    """No FFT round-off floor: delta = 1e-100, and 10^15 steps (whose FFT composition the
    accountant must refuse at any delta below 0.1, see test_pld_roundoff.py)."""
    exact = exact_epsilon(1e-100, mu_squared([(1.0, 1000)]))
    epsilon = PLDAccountant().compose(Gaussian(1.0), 1000).epsilon(1e-100)
    assert exact <= epsilon <= exact * (1 + 1e-12)
    steps = 10**15
    exact = exact_epsilon(1e-5, mu_squared([(1e8, steps)]))
    epsilon = PLDAccountant().compose(Gaussian(1e8), steps).epsilon(1e-5)
    assert exact <= epsilon <= exact * (1 + 1e-12)


def test_gdp_mu_is_exact() -> None:
    accountant = composed(CASES[2][0])
    exact = float(mpmath.sqrt(mu_squared(CASES[2][1])))
    assert accountant.gdp_mu() == pytest.approx(exact, rel=1e-15)


def test_sampled_compositions_still_go_through_the_grid() -> None:
    """A subsampled step breaks the closed form: its epsilon is below that of the Gaussians
    without sampling (amplification), and certified above the exact Gaussian part alone."""
    plain = [(Gaussian(1.0), 100)]
    with_sampled = plain + [(PoissonSampled(Gaussian(1.0), 0.01), 1000)]
    only_plain = exact_epsilon(1e-5, mu_squared([(1.0, 100)]))
    all_plain = exact_epsilon(1e-5, mu_squared([(1.0, 1100)]))
    epsilon = composed(with_sampled).epsilon(1e-5)
    assert only_plain < epsilon < all_plain


@pytest.mark.peers
@pytest.mark.parametrize(("sigma", "steps"), [(2.0, 10), (4.0, 100)])
def test_against_dp_accounting(sigma: float, steps: int) -> None:
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld_accountant = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    peer = pld_accountant.PLDAccountant(value_discretization_interval=1e-4)
    peer.compose(dp_event.GaussianDpEvent(sigma), steps)
    theirs = peer.get_epsilon(1e-5)
    ours = PLDAccountant().compose(Gaussian(sigma), steps).epsilon(1e-5)
    assert ours <= theirs  # exact, against a pessimistic discretisation
    assert ours == pytest.approx(theirs, rel=1e-6)
    assert math.isclose(ours, exact_epsilon(1e-5, mu_squared([(sigma, steps)])), rel_tol=1e-12)



@pytest.mark.parametrize("epsilon", [200.0, 1e4, 1e300])
def test_delta_far_in_the_tail_is_the_smallest_double(epsilon):
    """mu = sqrt(10): the exact delta at these epsilons is below Phi(-epsilon/mu + mu/2), at
    most Phi(-61.7) < 1e-800 (mpmath), so the certified upper bound is the smallest positive
    double; before, epsilon 1e300 raised OverflowError inside mpmath's erfc."""
    accountant = PLDAccountant().compose(Gaussian(1.0), 10)
    mu = mpmath.sqrt(10)
    assert mpmath.ncdf(-mpmath.mpf(200.0) / mu + mu / 2) < mpmath.mpf("1e-800")
    assert accountant.delta(epsilon) == math.nextafter(0.0, 1.0)
