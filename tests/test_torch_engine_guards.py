"""Ways around the engine's accounting, each closed: a budget changed after make_private, a
second optimizer or clipper on a model an engine made private, a clip rule that does not clip,
a torch sampler dropped by the DP loader, and checkpoints whose ledger or loader do not match
their own record. Reference values are fresh accountants fed the same events by hand."""

from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import (  # noqa: E402
    DataLoader,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

import dpsharp  # noqa: E402
from _torch_training import train_steps as train  # noqa: E402
from dpsharp.events import Gaussian, PoissonSampled  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    BudgetExhausted,
    DPOptimizer,
    NoisySGD,
    PerSampleClipper,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
)
from dpsharp.torch.data import from_dataloader  # noqa: E402

pytestmark = pytest.mark.torch

SIGMA, RATE, DELTA = 1.0, 0.1, 1e-5


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def make_dataset(n: int = 60) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long())


def private(accountant: str = "rdp", *, rate: float = RATE, sigma: float = SIGMA, **kwargs):
    model = make_model()
    engine = PrivacyEngine(accountant=accountant)
    loader = PoissonDataLoader(make_dataset(), sample_rate=rate, seed=3)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader, noise_multiplier=sigma,
        max_grad_norm=1.0, delta=DELTA, seed=4, **kwargs)
    return engine, model, optimizer, loader


def composed_by_hand(steps: int, *, rate: float = RATE) -> float:
    reference = dpsharp.accountant("rdp", neighbouring="add_remove")
    reference.compose(PoissonSampled(Gaussian(SIGMA), rate), steps)
    return reference.epsilon(DELTA)


# ------------------------------------------------------------------------- budget changes
def test_a_budget_tightened_mid_run_stops_the_next_release() -> None:
    engine, model, optimizer, loader = private(budget=PrivacyBudget(50.0, DELTA))
    train(model, optimizer, loader, 3)
    spent = engine.epsilon()
    assert spent == composed_by_hand(3)
    assert engine.steps_left() > 10
    # Room for no further step: the reference with one more step is above it.
    tighter = PrivacyBudget(spent + 1e-3, DELTA)
    assert composed_by_hand(4) > tighter.epsilon
    engine.budget = tighter
    assert engine.budget is tighter
    assert engine.steps_left() == 0 and not engine.within_budget()
    with pytest.raises(BudgetExhausted, match="above the budget"):
        train(model, optimizer, loader, 1)
    assert engine.steps == 3 and engine.epsilon() == spent


def test_a_budget_set_mid_run_allows_what_a_fresh_engine_with_it_allows() -> None:
    engine, model, optimizer, loader = private()
    train(model, optimizer, loader, 2)
    assert engine.steps_left() == float("inf")
    budget = PrivacyBudget(composed_by_hand(7) + 1e-9, DELTA)
    engine.budget = budget
    assert engine.steps_left() == 5  # 2 spent, 7 fit, the 8th does not
    assert composed_by_hand(8) > budget.epsilon
    engine.budget = None
    assert engine.steps_left() == float("inf")


def test_budget_assignment_is_checked_like_make_private() -> None:
    with pytest.raises(TypeError, match="PrivacyBudget"):
        private()[0].budget = (3.0, 1e-5)
    with pytest.raises(RuntimeError, match="make_private"):
        PrivacyEngine().budget = PrivacyBudget(3.0, DELTA)
    # An uncertified accountant enforces nothing without allow_approximation=True.
    gdp_engine = private("gdp")[0]
    with pytest.raises(ValueError, match="not certified"):
        gdp_engine.budget = PrivacyBudget(3.0, DELTA)
    assert gdp_engine.budget is None
    # A privacy filter's budget is fixed before the first release.
    engine, model, optimizer, loader = private(budget=PrivacyBudget(20.0, DELTA), adaptive_noise=True)
    train(model, optimizer, loader, 1)
    with pytest.raises(ValueError, match="privacy filter's budget is fixed"):
        engine.budget = PrivacyBudget(10.0, DELTA)
    assert engine.budget == PrivacyBudget(20.0, DELTA)
    # ... and an adaptive run needs an accountant with a filter for any budget.
    engine = private("pld", adaptive_noise=True)[0]
    with pytest.raises(ValueError, match="privacy filter"):
        engine.budget = PrivacyBudget(10.0, DELTA)


# ------------------------------------------------------------- releases outside the engine
def test_a_second_optimizer_on_the_engines_clipper_is_refused() -> None:
    engine, model, optimizer, loader = private()
    with pytest.raises(ValueError, match="already belongs to another DPOptimizer"):
        DPOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), noise_multiplier=0.0,
                    max_grad_norm=1.0, expected_batch_size=6.0, clipper=optimizer.clipper)


def test_a_new_clipper_on_a_model_an_engine_made_private_is_refused() -> None:
    engine, model, optimizer, loader = private()
    with pytest.raises(ValueError, match="made private by a PrivacyEngine"):
        NoisySGD(model, lr=1.0, noise_multiplier=0.0, max_grad_norm=1.0, expected_batch_size=6.0)
    with pytest.raises(ValueError, match="made private by a PrivacyEngine"):
        PerSampleClipper(model, max_grad_norm=1.0)


def test_a_clip_rule_whose_factors_do_not_clip_is_refused_before_accumulating() -> None:
    class NoClipping:
        structure = "flat"

        def observe(self, norms, bound) -> None:
            pass

        def factors(self, norms, bound):
            return torch.ones_like(norms)

    model = make_model()
    clipper = PerSampleClipper(model, max_grad_norm=1e-3, rule=NoClipping())
    x, y = make_dataset(8).tensors
    with pytest.raises(RuntimeError, match="above the clipping bound"):
        nn.functional.cross_entropy(model(x), y).backward()
    assert clipper.accumulated_batches == 0


# -------------------------------------------------------------------------- torch samplers
@pytest.mark.parametrize("sampler", [
    lambda n: SubsetRandomSampler(range(n // 2)),
    lambda n: WeightedRandomSampler([1.0] * n, n),
    lambda n: RandomSampler(range(n), replacement=True),
    lambda n: RandomSampler(range(n), num_samples=n // 2),
])
def test_a_sampler_the_dp_loader_would_drop_is_refused(sampler) -> None:
    dataset = make_dataset()
    plain = DataLoader(dataset, batch_size=6, sampler=sampler(len(dataset)))
    with pytest.raises(ValueError, match="Subset"):
        from_dataloader(plain, sampling="poisson")


def test_default_samplers_over_the_whole_dataset_are_accepted() -> None:
    dataset = make_dataset()
    for plain in (DataLoader(dataset, batch_size=6, shuffle=True), DataLoader(dataset, batch_size=6)):
        assert from_dataloader(plain, sampling="poisson").sample_rate == 6 / 60


# ------------------------------------------------------------------------------ checkpoints
def checkpoint_after(steps: int, **kwargs) -> dict:
    engine, model, optimizer, loader = private(budget=PrivacyBudget(50.0, DELTA), **kwargs)
    train(model, optimizer, loader, steps)
    return copy.deepcopy(engine.state_dict())


def test_a_ledger_of_another_sampling_rate_is_refused() -> None:
    # A whole checkpoint of another rate is refused by its loader's configuration; here only
    # the ledger comes from that run (as many events, each cheaper at the rate 0.05).
    state = checkpoint_after(4)
    state["main"] = checkpoint_after(4, rate=0.05)["main"]
    engine = private(budget=PrivacyBudget(50.0, DELTA))[0]
    with pytest.raises(ValueError, match="another run"):
        engine.load_state_dict(state)
    assert engine.steps == 0 and engine.accountant.is_empty  # nothing restored


def test_a_checkpoint_whose_ledger_was_edited_is_refused() -> None:
    state = checkpoint_after(4)
    edited = copy.deepcopy(state)
    ledger = edited["main"]["accountant"]["ledger"]
    assert len(ledger) == 1 and ledger[0][1] == 4
    ledger[0][0]["event"]["noise_multiplier"] = 50.0  # four much cheaper events
    engine = private(budget=PrivacyBudget(50.0, DELTA))[0]
    with pytest.raises(ValueError, match="lacks events"):
        engine.load_state_dict(edited)
    # The unedited checkpoint resumes with the uninterrupted run's epsilon.
    engine.load_state_dict(state)
    assert engine.steps == 4 and engine.epsilon() == composed_by_hand(4)


def test_a_checkpoint_emptied_but_for_its_loader_is_refused() -> None:
    state = checkpoint_after(5)
    emptied = copy.deepcopy(state)
    emptied["releases"] = 0
    emptied["main"]["charged"] = 0
    emptied["main"]["charges"] = []
    emptied["main"]["accountant"]["ledger"] = []
    engine = private(budget=PrivacyBudget(50.0, DELTA))[0]
    with pytest.raises(ValueError, match="drawn 5 logical batches but its engine made 0"):
        engine.load_state_dict(emptied)
    # The record of charges must add up to the charge count.
    miscounted = copy.deepcopy(state)
    miscounted["main"]["charges"] = [[SIGMA, 4]]
    with pytest.raises(ValueError, match="record of their noise multipliers counts 4"):
        private(budget=PrivacyBudget(50.0, DELTA))[0].load_state_dict(miscounted)


def test_a_checkpoints_noise_multiplier_that_differs_is_logged(caplog) -> None:
    state = checkpoint_after(3)
    engine, model, optimizer, loader = private(sigma=3.0, budget=PrivacyBudget(50.0, DELTA))
    with caplog.at_level(logging.WARNING, logger="dpsharp.torch.engine"):
        engine.load_state_dict(state)
    assert optimizer.noise_multiplier == SIGMA
    assert "resumed at the checkpoint's noise multiplier 1.0, not the 3.0" in caplog.text
