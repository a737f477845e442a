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
    SequentialSampler,
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


def _one_batch(loader):
    """The first non-empty batch of ``loader`` (drawn, so the next release is its)."""
    for x, y in loader:
        if len(y):
            return x, y
    raise AssertionError("no non-empty batch")


def test_the_engines_clipper_and_noise_release_only_through_the_optimizer() -> None:
    """A release called on the clipper directly (sigma 0 included), an armed release, or a
    noise stream rewound by hand would go out without the ledger: refused."""
    engine, model, optimizer, loader = private()
    x, y = _one_batch(loader)
    nn.functional.cross_entropy(model(x), y).backward()
    for release in (optimizer.clipper.release, optimizer.clipper.arm_release):
        with pytest.raises(RuntimeError, match="belongs to a DPOptimizer"):
            release(noise_multiplier=0.0, expected_batch_size=6.0, noise=optimizer.noise)
    assert all(p.grad is None for p in model.parameters()) and engine.accountant.is_empty
    state = optimizer.noise.state_dict()
    optimizer.step()  # the engine's own release goes out and is charged
    assert optimizer.releases == 1 and not engine.accountant.is_empty
    with pytest.raises(RuntimeError, match="rewind its stream"):
        optimizer.noise.load_state_dict(state)


@pytest.mark.parametrize("added", ["unfrozen layer", "extra tensor"])
def test_a_parameter_added_to_the_wrapped_optimizer_is_refused_before_the_charge(added) -> None:
    """optimizer.add_param_group refuses parameters the clipper does not handle; the wrapped
    torch optimizer's own add_param_group cannot. Such a parameter would be stepped with its
    raw gradient: the release is refused before anything is charged."""
    model = make_model()
    model[0].weight.requires_grad_(False)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
        PoissonDataLoader(make_dataset(), sample_rate=RATE, seed=3), noise_multiplier=SIGMA,
        max_grad_norm=1.0, delta=DELTA, seed=4)
    if added == "unfrozen layer":
        extra = model[0].weight
        extra.requires_grad_(True)
    else:
        extra = nn.Parameter(torch.ones(()))
    optimizer.original_optimizer.add_param_group({"params": [extra]})
    before = extra.detach().clone()
    x, y = _one_batch(loader)
    if added == "unfrozen layer":  # (a model parameter: its forward pass is refused first)
        with pytest.raises(RuntimeError, match=r"not when it was made private.*: 0\.weight"):
            model(x)
    else:
        (nn.functional.cross_entropy(model(x), y) * extra.sum()).backward()
        with pytest.raises(RuntimeError, match="without clipping or noise"):
            optimizer.step()
    assert engine.accountant.is_empty and optimizer.releases == 0
    assert torch.equal(extra.detach(), before)


def test_a_batch_whose_backward_pass_failed_is_not_released() -> None:
    """A non-finite per-example gradient in the second micro-batch of a release raises; a
    plain DPOptimizer (no loader to compare the example count with) then refuses to release
    the first micro-batch alone, which would depend on the failed examples' data."""
    model = nn.Linear(8, 2)
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                            max_grad_norm=1.0, expected_batch_size=16.0, module=model, seed=0)
    good, bad = torch.randn(8, 8), torch.randn(8, 8)
    bad[3, 0] = float("nan")
    labels = torch.zeros(8, dtype=torch.long)
    nn.functional.cross_entropy(model(good), labels).backward()
    with pytest.raises(FloatingPointError):
        nn.functional.cross_entropy(model(bad), labels).backward()
    with pytest.raises(RuntimeError, match="backward pass of this release failed"):
        optimizer.step()
    assert optimizer.releases == 0 and model.weight.grad is None
    optimizer.clipper.reset()  # the user drops the whole release and goes on
    nn.functional.cross_entropy(model(good), labels).backward()
    optimizer.step()
    assert optimizer.releases == 1


def test_float16_parameters_are_refused_before_anything_is_charged() -> None:
    """The release kernels write float32, float64 and bfloat16; a float16 model is refused at
    make_private, and one cast to float16 afterwards at its next release, before the charge."""
    engine = PrivacyEngine(accountant="rdp")
    half = make_model().half()
    with pytest.raises(ValueError, match="dtype torch.float16.*autocast"):
        engine.make_private(half, torch.optim.SGD(half.parameters(), lr=0.1),
                            PoissonDataLoader(make_dataset(), sample_rate=RATE, seed=3),
                            noise_multiplier=SIGMA, max_grad_norm=1.0, delta=DELTA)
    engine, model, optimizer, loader = private(batch_probe=False)
    x, y = _one_batch(loader)
    nn.functional.cross_entropy(model(x), y).backward()
    model.half()
    with pytest.raises(ValueError, match="dtype torch.float16"):
        optimizer.step()
    assert engine.accountant.is_empty and optimizer.releases == 0


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
class _EvenIndices(SequentialSampler):
    """A subclass of a default sampler that leaves out every odd record."""

    def __iter__(self):
        return iter(range(0, len(self.data_source), 2))


@pytest.mark.parametrize("sampler", [
    lambda n: SubsetRandomSampler(range(n // 2)),
    lambda n: WeightedRandomSampler([1.0] * n, n),
    lambda n: RandomSampler(range(n), replacement=True),
    lambda n: RandomSampler(range(n), num_samples=n // 2),
    # a default sampler over another "dataset" (the first half of the indices), and a subclass
    # that yields a subset: both were accepted, and the held-out records trained on
    lambda n: SequentialSampler(range(n // 2)),
    lambda n: _EvenIndices(range(n)),
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


@pytest.mark.parametrize("change", ["unfreeze", "add"])
def test_a_parameter_trainable_only_after_make_private_is_refused_at_the_forward(change) -> None:
    """A layer frozen when the model was made private and unfrozen later (or a module added
    later) has no patched layer and no refusing gradient hook: backward() handed it the exact,
    unclipped batch gradient, which a second plain optimizer applied with no noise while the
    engine reported a finite epsilon. The forward pass with gradients is now refused, naming
    the parameters; freezing them again restores training."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    engine = PrivacyEngine(accountant="rdp")
    loader = PoissonDataLoader(make_dataset(), sample_rate=RATE, seed=3)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model[2].parameters(), lr=0.1), loader, noise_multiplier=SIGMA,
        max_grad_norm=1.0, delta=DELTA, seed=4)
    x, y = next(iter(make_dataset(8)))[0].unsqueeze(0), torch.tensor([1])
    if change == "unfreeze":
        model[0].requires_grad_(True)
        names = "0.weight, 0.bias"
    else:
        model.add_module("extra", nn.Linear(2, 2))
        names = "extra.weight, extra.bias"
    with pytest.raises(RuntimeError, match=f"not when it was made private.*{names}"):
        model(x)
    with torch.no_grad():
        model(x)  # (no gradient: nothing to clip, nothing refused)
    if change == "unfreeze":
        model[0].requires_grad_(False)
    else:
        model.extra.requires_grad_(False)
    for features, labels in loader:
        nn.functional.cross_entropy(model(features), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
        break
    assert engine.steps == 1


def test_a_draw_the_optimizer_refuses_leaves_the_loader_where_it_was() -> None:
    """Drawing a new logical batch while the previous one awaits its release is refused; the
    refused draw used to advance the loader (its count of batches and last batch size), so the
    pending batch's release was then checked against the refused batch's size, and a checkpoint
    taken afterwards could not be resumed. The loader's counters now stay put: once the budget
    is raised the pending batch is released, and the checkpoint resumes."""
    budget = PrivacyBudget(1.0, DELTA)
    engine, model, optimizer, loader = private(budget=budget)
    iterator = iter(loader)
    with pytest.raises(BudgetExhausted):
        while True:
            x, y = next(iterator)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    drawn, size, releases = loader.logical_batches_drawn, loader.last_batch_size, engine.steps
    for _ in range(2):
        with pytest.raises(RuntimeError):
            next(iter(loader))  # a new batch while the pending one is not released
        assert (loader.logical_batches_drawn, loader.last_batch_size) == (drawn, size)
    engine.budget = PrivacyBudget(100.0, DELTA)
    optimizer.step()  # the pending batch, checked against its own size
    assert engine.steps == releases + 1 == loader.logical_batches_drawn
    state = engine.state_dict()
    resumed, *_ = private(budget=PrivacyBudget(100.0, DELTA))
    resumed.load_state_dict(state)
    assert resumed.steps == engine.steps


def test_copying_the_dp_optimizer_is_refused_with_the_reason() -> None:
    """copy.deepcopy(optimizer) failed with AttributeError: 'DPOptimizer' object has no
    attribute 'original_optimizer'; a copy would release outside the engine's ledger with the
    same noise stream, so it is refused, and the message says how to checkpoint instead."""
    _, _, optimizer, _ = private()
    for copier in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be copied.*state_dict"):
            copier(optimizer)
