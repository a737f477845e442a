"""Hypothesis properties of the RDP and moments accountants:
epsilon non-decreasing in steps and q, non-increasing in sigma; epsilon(delta) and
delta(epsilon) inverse; count / Repeated / Composed identical; state_dict round trip exact."""

from __future__ import annotations

import json

import pytest
from dpsharp import Composed, Gaussian, MomentsAccountant, PoissonSampled, RDPAccountant, Repeated
from hypothesis import given, settings
from hypothesis import strategies as st

ORDERS = [1.25, 1.5, 2.0, 3.0, 4.5, 8.0, 16.0, 32.0, 64.0, 256.0]
q_st = st.floats(1e-4, 1.0)
sigma_st = st.floats(0.5, 20.0)
steps_st = st.integers(1, 10**5)
delta_st = st.floats(1e-12, 0.5)
conversion_st = st.sampled_from(["tight", "classic"])
SETTINGS = settings(max_examples=25, deadline=None)


def make(conversion: str) -> RDPAccountant:
    return RDPAccountant(ORDERS, conversion)


@SETTINGS
@given(q=q_st, sigma=sigma_st, steps=steps_st, extra=st.integers(1, 10**4), delta=delta_st, conversion=conversion_st)
def test_monotone_in_steps(q: float, sigma: float, steps: int, extra: int, delta: float, conversion: str) -> None:
    event = PoissonSampled(Gaussian(sigma), q)
    fewer = make(conversion).compose(event, steps).epsilon(delta)
    more = make(conversion).compose(event, steps + extra).epsilon(delta)
    assert 0.0 <= fewer <= more


@SETTINGS
@given(q=q_st, factor=st.floats(1.0, 100.0), sigma=sigma_st, steps=steps_st, delta=delta_st, conversion=conversion_st)
def test_monotone_in_q(q: float, factor: float, sigma: float, steps: int, delta: float, conversion: str) -> None:
    larger_q = min(1.0, q * factor)
    low = make(conversion).compose(PoissonSampled(Gaussian(sigma), q), steps).epsilon(delta)
    high = make(conversion).compose(PoissonSampled(Gaussian(sigma), larger_q), steps).epsilon(delta)
    assert low <= high * (1 + 1e-12)


@SETTINGS
@given(q=q_st, sigma=sigma_st, factor=st.floats(1.0, 10.0), steps=steps_st, delta=delta_st)
def test_non_increasing_in_sigma(q: float, sigma: float, factor: float, steps: int, delta: float) -> None:
    noisy = MomentsAccountant().compose(PoissonSampled(Gaussian(sigma * factor), q), steps)
    less_noisy = MomentsAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
    assert noisy.epsilon(delta) <= less_noisy.epsilon(delta) * (1 + 1e-12)


@SETTINGS
@given(q=q_st, sigma=sigma_st, steps=steps_st, delta=delta_st, conversion=conversion_st)
def test_epsilon_delta_inverse(q: float, sigma: float, steps: int, delta: float, conversion: str) -> None:
    acc = make(conversion).compose(PoissonSampled(Gaussian(sigma), q), steps)
    eps = acc.epsilon(delta)
    if eps > 0.0:
        # the optimal order's bound is met with equality; another order's KL bound may be lower
        back = acc.delta(eps)
        assert back <= delta * (1 + 1e-9)
        if conversion == "classic":
            assert back == pytest.approx(delta, rel=1e-9)
        if 0.0 < back < 1.0:
            assert acc.epsilon(back) == pytest.approx(eps, rel=1e-9, abs=1e-12)


@SETTINGS
@given(
    events=st.lists(st.tuples(q_st, sigma_st), min_size=1, max_size=3),
    count=st.integers(0, 500),
    delta=delta_st,
)
def test_count_repeated_composed_state_dict_agree(events: list[tuple[float, float]], count: int, delta: float) -> None:
    leaves = [PoissonSampled(Gaussian(sigma), q) for q, sigma in events]
    by_count = RDPAccountant()
    for leaf in leaves:
        by_count.compose(leaf, count)
    by_repeated = RDPAccountant().compose(Repeated(Composed(tuple(reversed(leaves))), count))
    by_loop = RDPAccountant()
    for _ in range(min(count, 20)):
        by_loop.compose(Composed(tuple(leaves)))
    if count > 20:
        by_loop.compose(Composed(tuple(leaves)), count - 20)
    restored = RDPAccountant()
    restored.load_state_dict(json.loads(json.dumps(by_count.state_dict())))
    answers = {acc.epsilon(delta) for acc in (by_count, by_repeated, by_loop, restored)}
    assert len(answers) == 1
    assert by_count.delta(1.0) == restored.delta(1.0) == by_repeated.delta(1.0)
