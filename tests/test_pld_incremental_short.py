"""The first steps of an incremental run (a query after every step of a short composition,
whose grid is refined, ``PLDAccountant._short_step``): one grid and one circle per power-of-two
bucket of step counts, answers equal to fresh compositions and as tight as a peer's."""

from __future__ import annotations

import math
import warnings

import pytest

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp.accountants import _pld_numerics as numerics

EVENT = PoissonSampled(Gaussian(1.0), 0.01)
DELTA = 1e-5


def test_short_run_moves_to_a_new_grid_once_per_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over the first 32 steps (q = 0.01, sigma = 1) the refined grid is the same for every
    count of a bucket (1, 2, 3, 4 alone, then 5-8, 9-16, 17-32): seven grids (the grid chosen
    for each count alone took ten values, each new one a discretisation and transforms of up
    to 730 000 points, about 88 ms per step over the first ten). Within a bucket the circle is
    the bucket's too, so a step of the remove direction transforms no leaf again: the only
    forward transforms on its circles are at a bucket's first composed step (one step is the
    leaf itself, with no transform). Every answer is the fresh accountant's, bit for bit."""
    forward_steps: set[int] = set()
    real = numerics.certified_forward
    step = 0

    def counting(values, size):  # type: ignore[no-untyped-def]
        if size >= 8192:  # the remove direction's refined circles (the add checks are coarse)
            forward_steps.add(step)
        return real(values, size)

    monkeypatch.setattr(numerics, "certified_forward", counting)
    accountant = PLDAccountant()
    grids: dict[int, float] = {}
    answers: dict[int, float] = {}
    for step in range(1, 33):
        accountant.compose(EVENT)
        answers[step] = accountant.epsilon(DELTA)
        grids[step] = accountant._grid_step()
    monkeypatch.undo()
    buckets = [[1], [2], [3], [4], [5, 6, 7, 8], list(range(9, 17)), list(range(17, 33))]
    assert len(set(grids.values())) == len(buckets)
    for bucket in buckets:
        assert {grids[count] for count in bucket} == {grids[bucket[0]]}
    assert forward_steps <= {2, 3, 4, 5, 9, 17}
    for count in (1, 2, 3, 7, 12, 32):
        assert answers[count] == PLDAccountant().compose(EVENT, count).epsilon(DELTA)


@pytest.mark.peers
def test_short_bucket_grids_stay_as_tight_as_dp_accounting() -> None:
    """The bucket's grid is up to twice the one a count alone would get: at 6, 12 and 40 steps
    (q = 0.01, sigma = 1, delta = 1e-5) the certified epsilon is still at least dp-accounting
    0.6.0's optimistic PLD epsilon at a grid step of 1e-4 (a lower bound of the exact epsilon
    up to its truncation) and within 2e-5 relative of its pessimistic one (measured: 2e-7
    below it at 6 and 12 steps, 1.0e-5 above it at 40 steps, on the formula's grid)."""
    pld_module = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    sigma, q = EVENT.event.noise_multiplier, EVENT.sampling_probability

    def peer(steps: int, pessimistic: bool) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            one = pld_module.from_gaussian_mechanism(
                sigma, sampling_prob=q, pessimistic_estimate=pessimistic,
                value_discretization_interval=1e-4,
            )
            return float(one.self_compose(steps).get_epsilon_for_delta(DELTA))

    for steps in (6, 12, 40):
        ours = PLDAccountant().compose(EVENT, steps).epsilon(DELTA)
        assert peer(steps, False) <= ours <= peer(steps, True) * (1 + 2e-5)



def test_losses_with_atoms_keep_the_grid_of_their_own_count() -> None:
    """Randomized response (p = 0.01, k = 3, replace one) has a privacy loss made of atoms,
    which the grid rounds to first order: a short composition of it keeps the refined grid of
    its own count (2, 3 and 4 steps: three grids), and one step stays as tight as before the
    buckets: its epsilon at delta = 1e-6 is at least the exact one, L + log(1 - delta / m) with
    L = log(m / (p / k)) the top atom and m = 1 - p + p/k its mass (the hockey-stick curve is
    m (1 - e^{eps - L}) just below L), and within 1e-6 relative of it (on the grid of 4 steps
    it was 8e-6 above)."""
    from dpsharp.events import RandomizedResponse

    p, k, delta = 0.01, 3, 1e-6
    event = RandomizedResponse(p, k)
    top_mass = 1 - p + p / k
    exact = math.log(top_mass / (p / k)) + math.log1p(-delta / top_mass)
    answer = PLDAccountant(neighbouring="replace_one").compose(event).epsilon(delta)
    assert exact <= answer <= exact * (1 + 1e-6)
    accountant = PLDAccountant(neighbouring="replace_one").compose(event)
    grids = {accountant.compose(event)._grid_step() for _ in range(3)}
    assert len(grids) == 3
