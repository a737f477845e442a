"""Schedules driven by the PrivacyEngine: the engine applies the schedule
before each release, composes the sigma actually used, and stops at the budget.

Known values: Table II of Yu et al. 2019: rho_total = 0.78125,
reshuffling accounting, stop before the epoch whose cost would exceed the budget.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import dpsharp
from dpsharp.accountants.zcdp import zcdp_epsilon
from dpsharp.events import Gaussian, PoissonSampled, Shuffled
from dpsharp.torch import (
    BudgetExhausted,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
    ShuffledDataLoader,
)
from dpsharp.torch.schedules import (
    Constant,
    Exponential,
    Polynomial,
    StepDecay,
    TimeBased,
    ValidationBased,
    attach_schedule,
)
from torch import nn
from torch.utils.data import TensorDataset

pytestmark = pytest.mark.torch

RHO_TOTAL, DELTA = 0.78125, 1e-5


def _dataset(n: int = 8) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _private(schedule, *, sampling: str, budget=None, accountant="zcdp"):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    if sampling == "shuffle":
        loader = ShuffledDataLoader(_dataset(), batch_size=4, seed=1)  # 2 steps per epoch
    else:
        # q n = 20: an empty batch has probability 2^-40 (empty batches are the clipper's
        # concern, tested there).
        loader = PoissonDataLoader(_dataset(40), sample_rate=0.5, seed=1)
    engine = PrivacyEngine(accountant=accountant)
    model, optimizer, loader = engine.make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        noise_multiplier=schedule(0),
        max_grad_norm=1.0,
        delta=DELTA,
        budget=budget,
        seed=3,
    )
    handle = attach_schedule(engine, schedule)
    return engine, model, optimizer, loader, handle


def _train_until_exhausted(model, optimizer, loader, *, max_epochs: int) -> None:
    for _ in range(max_epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    raise AssertionError(f"the budget was not exhausted within {max_epochs} epochs")


@pytest.mark.parametrize(
    ("schedule", "epochs"),
    [
        (Constant(8), 100),
        (TimeBased(10, 0.05), 38),
        (StepDecay(10, 0.6, 10), 31),
        (Exponential(10, 0.01), 71),
        (Polynomial(10, 3, 2, 100), 44),
    ],
    ids=["uniform", "time", "step", "exp", "poly"],
)
def test_engine_stops_at_table_ii_epochs(schedule, epochs) -> None:
    """The rho budget is stated as the (epsilon, delta) the zCDP conversion gives for
    rho_total; epsilon(delta) is strictly increasing in rho, so the two budgets stop alike."""
    budget = PrivacyBudget(epsilon=zcdp_epsilon(RHO_TOTAL, DELTA), delta=DELTA)
    engine, model, optimizer, loader, handle = _private(schedule, sampling="shuffle", budget=budget)
    with pytest.raises(BudgetExhausted):
        _train_until_exhausted(model, optimizer, loader, max_epochs=200)
    trained = loader.epoch - 1  # the refused release was the first of a new epoch
    assert trained == epochs
    assert engine.steps == 2 * epochs
    assert engine.zcdp_rho() == pytest.approx(math.fsum(1 / (2 * schedule(t) ** 2) for t in range(epochs)), rel=1e-13)
    assert engine.zcdp_rho() <= RHO_TOTAL
    # Exactly the scheduled sigma was composed, once per epoch.
    expected: dict = {}
    for t in range(epochs):
        leaf = Shuffled(Gaussian(schedule(t)), 4, 8)
        expected[leaf] = expected.get(leaf, 0) + 1
    assert dict(engine.accountant.composed) == expected
    assert [s for _, _, s in handle.applied] == [schedule(r // 2) for r in range(2 * epochs)]


def test_per_step_schedule_composes_each_steps_sigma() -> None:
    schedule = TimeBased(3.0, 0.1, unit="step")
    name = "gdp"
    engine, model, optimizer, loader, _ = _private(schedule, sampling="poisson", accountant=name)
    steps = 0
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        steps += 1
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        steps += 1
    by_hand = dpsharp.accountant(name)
    for t in range(steps):
        by_hand.compose(PoissonSampled(Gaussian(schedule(t)), 0.5))
    assert dict(engine.accountant.composed) == dict(by_hand.composed)
    assert engine.epsilon(DELTA) == by_hand.epsilon(DELTA)


def test_validation_schedule_in_the_engine() -> None:
    schedule = ValidationBased(6.0, 0.5, m=1, threshold=0.0, period=1, validation_set="public")
    engine, model, optimizer, loader, _ = _private(schedule, sampling="shuffle")
    accuracies = [0.5, 0.5, 0.7]  # epoch 2 does not improve -> sigma 3 from epoch 3
    for accuracy in accuracies:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        schedule.observe(accuracy)
    # sigma after epoch 1: 6 (0.5 - 0 > 0), after epoch 2: 3 (0.5 - 0.5 <= 0), after 3: 3.
    assert dict(engine.accountant.composed) == {
        Shuffled(Gaussian(6.0), 4, 8): 2,
        Shuffled(Gaussian(3.0), 4, 8): 1,
    }
    # sigmas chosen from the run's outputs, no budget (no filter): the composed epsilon is a
    # reading, not a guarantee, and the report says so
    assert engine.adaptive_noise
    report = engine.report()
    assert report.certified is False and "chosen adaptively" in report.warning
    # ... and so do epsilon() and Opacus' get_epsilon(), which returned the reading silently
    for query in (engine.epsilon, engine.get_epsilon):
        with pytest.warns(UserWarning, match="chosen adaptively.*a reading, not a guarantee"):
            assert query(DELTA) == report.epsilon


def test_schedules_say_whether_they_are_adaptive() -> None:
    assert ValidationBased.adaptive is True
    for fixed in (Constant(8), TimeBased(10, 0.05), StepDecay(10, 0.6, 10), Exponential(10, 0.01),
                  Polynomial(10, 3, 2, 100)):
        assert fixed.adaptive is False


def test_adaptive_schedule_under_a_budget_needs_a_filter() -> None:
    """A ValidationBased schedule's sigma depends on accuracy of a model trained on the private
    data; a stop rule on the PLD accountant's epsilon(delta) is not proven for it (refused),
    the RDP accountant's Renyi filter is."""
    budget = PrivacyBudget(epsilon=3.0, delta=DELTA)

    def validation() -> ValidationBased:
        return ValidationBased(6.0, 0.5, m=1, threshold=0.0, period=1, validation_set="public")

    with pytest.raises(ValueError, match="privacy filter"):
        _private(validation(), sampling="poisson", budget=budget, accountant="pld")
    engine, model, optimizer, loader, _ = _private(
        validation(), sampling="poisson", budget=budget, accountant="rdp"
    )
    assert engine.adaptive_noise
    with pytest.raises(BudgetExhausted, match="Renyi filter"):
        _train_until_exhausted(model, optimizer, loader, max_epochs=500)
    report = engine.report()
    assert report.certified and report.epsilon == budget.epsilon
    # attached after the first release under a budget: refused (the filter must cover the run)
    engine, model, optimizer, loader, _ = _private(
        Constant(6.0), sampling="poisson", budget=budget, accountant="rdp"
    )
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        break
    with pytest.raises(RuntimeError, match="before the first release"):
        attach_schedule(engine, validation())


def test_step_schedule_refused_under_reshuffling() -> None:
    with pytest.raises(ValueError, match="schedule"):
        _private(TimeBased(3.0, 0.1, unit="step"), sampling="shuffle")
