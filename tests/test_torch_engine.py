"""PrivacyEngine, PrivacyBudget and checkpoints. Accounting references compose the same events by hand into a fresh accountant, or use
closed forms from the papers (zCDP of reshuffling rho = epochs / (2 sigma^2); the CLT mu)."""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import dpsharp  # noqa: E402
import importlib  # noqa: E402

# Register whatever accountant families this branch has (the shared accountants/__init__ may not
# import every module yet while the accountant branches are being merged).
for _module in ("pld", "rdp", "gdp", "zcdp"):
    try:
        importlib.import_module(f"dpsharp.accountants.{_module}")
    except ImportError:
        pass
from dpsharp.events import Gaussian, Neighbouring, PoissonSampled, Shuffled  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    BudgetExhausted,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
    ShuffledDataLoader,
)

pytestmark = pytest.mark.torch

POISSON_ACCOUNTANTS = [name for name in ("pld", "rdp", "gdp") if name in dpsharp.available()]
# Accountants whose every answer for a Poisson loader is a proven bound: the only ones that may
# enforce a budget without allow_approximation=True.
CERTIFIED_POISSON_ACCOUNTANTS = [name for name in ("pld", "rdp") if name in dpsharp.available()]


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def make_dataset(n: int = 60, seed: int = 1) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long())


def run(optimizer, loader, model, steps: int | None = None, epochs: int = 1) -> int:
    """Train; returns the number of optimizer steps taken."""
    taken = 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            if len(y):  # an empty Poisson batch: step() alone releases pure noise
                nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            taken += 1
            if steps is not None and taken == steps:
                return taken
    return taken


def private(accountant: str = "gdp", *, loader=None, sigma: float = 1.0, seed: int = 5, **kwargs):
    model = make_model()
    engine = PrivacyEngine(accountant=accountant)
    if loader is None:
        loader = PoissonDataLoader(make_dataset(), sample_rate=0.1, seed=seed)
    model, optimizer, loader = engine.make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        noise_multiplier=sigma,
        max_grad_norm=1.0,
        delta=kwargs.pop("delta", 1e-5),
        seed=seed,
        **kwargs,
    )
    return engine, model, optimizer, loader


@pytest.mark.parametrize("name", POISSON_ACCOUNTANTS)
def test_poisson_loader_events_match_composing_by_hand(name: str) -> None:
    engine, model, optimizer, loader = private(name, sigma=1.3)
    run(optimizer, loader, model, epochs=2)
    steps = 2 * loader.steps_per_epoch
    assert engine.steps == steps == optimizer.releases
    by_hand = dpsharp.accountant(name) if name == "gdp" else dpsharp.accountant(name, neighbouring="add_remove")
    by_hand.compose(PoissonSampled(Gaussian(1.3), 0.1), steps)
    assert engine.epsilon(1e-5) == by_hand.epsilon(1e-5)
    assert engine.accountant.composed == by_hand.composed


def test_shuffled_loader_charges_once_per_epoch_including_a_partial_one() -> None:
    loader = ShuffledDataLoader(make_dataset(), batch_size=16, seed=2)
    engine, model, optimizer, loader = private("zcdp", loader=loader, sigma=2.0)
    run(optimizer, loader, model, epochs=2)
    run(optimizer, loader, model, steps=1)  # first step of epoch 3 pays for the whole epoch
    assert engine.steps == 2 * 4 + 1
    by_hand = dpsharp.accountant("zcdp", neighbouring=engine.accountant.neighbouring)
    by_hand.compose(Shuffled(Gaussian(2.0), 16, 60), 3)
    assert engine.epsilon(1e-5) == by_hand.epsilon(1e-5)
    # stated under zero-out, and the report says so in words (not an add/remove guarantee)
    assert engine.accountant.neighbouring is Neighbouring.ZERO_OUT
    report = engine.report(1e-5)
    assert report.guarantee is not None and "zero-out" in report.guarantee
    assert "not an add/remove guarantee" in report.guarantee
    # Yu et al. 2019: reshuffling costs rho = epochs / (2 sigma^2)
    assert engine.zcdp_rho() == pytest.approx(3 / (2 * 2.0**2), rel=1e-12)


def test_shuffled_loader_refuses_an_add_remove_accounting() -> None:
    """Reshuffled batches are no add/remove guarantee: asking the engine for one is refused
    with the reason; zero-out (the default) is accepted, and the old add/remove ledger of a
    reshuffling checkpoint is restated under zero-out with the same numbers."""
    model = make_model()
    engine = PrivacyEngine(accountant="pld", accountant_options={"neighbouring": "add_remove"})
    with pytest.raises(ValueError, match="batch boundaries") as info:
        engine.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1),
            ShuffledDataLoader(make_dataset(), batch_size=6, seed=2),
            noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5,
        )
    assert "Poisson" in str(info.value) and "zero_out" in str(info.value)
    loader = ShuffledDataLoader(make_dataset(), batch_size=6, seed=2)
    engine, model, optimizer, loader = private("pld", loader=loader, sigma=1.5)
    run(optimizer, loader, model, epochs=1)
    state = engine.state_dict()
    state["main"]["accountant"]["neighbouring"] = "add_remove"  # a checkpoint of old releases
    loader = ShuffledDataLoader(make_dataset(), batch_size=6, seed=2)
    resumed, model, optimizer, loader = private("pld", loader=loader, sigma=1.5)
    resumed.load_state_dict(state)
    assert resumed.accountant.neighbouring is Neighbouring.ZERO_OUT
    assert resumed.epsilon(1e-5) == engine.epsilon(1e-5)


def test_gdp_view_is_the_clt_mu() -> None:
    engine, model, optimizer, loader = private("gdp", sigma=1.1)
    run(optimizer, loader, model, epochs=3)
    steps = engine.steps
    # Bu et al. 2020: mu_CLT = q sqrt(T (exp(1/sigma^2) - 1))
    expected = 0.1 * math.sqrt(steps * math.expm1(1 / 1.1**2))
    assert float(engine.view("gdp").mu) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", CERTIFIED_POISSON_ACCOUNTANTS)
def test_budget_stops_before_the_first_step_that_would_exceed_it(name: str) -> None:
    # 3.0 leaves room for a few steps under every accountant (RDP already charges 2.13 for the
    # first step of q = 0.1, sigma = 1), so the stop is reached mid-training, not at step 0.
    budget = PrivacyBudget(epsilon=3.0, delta=1e-5)
    engine, model, optimizer, loader = private(name, sigma=1.0, budget=budget)
    with pytest.raises(BudgetExhausted, match="above the budget"):
        run(optimizer, loader, model, epochs=100)
    spent = engine.epsilon(budget.delta)
    assert 0.0 < spent <= budget.epsilon
    # the very next step would have exceeded it
    one_more = dpsharp.accountant(name) if name == "gdp" else dpsharp.accountant(name, neighbouring="add_remove")
    one_more.load_state_dict(engine.accountant.state_dict())
    one_more.compose(PoissonSampled(Gaussian(1.0), 0.1))
    assert one_more.epsilon(budget.delta) > budget.epsilon
    assert engine.steps_left() == 0 and not engine.within_budget()
    releases = optimizer.noise.releases
    assert optimizer.step_if_within_budget() is False
    assert optimizer.noise.releases == releases and engine.steps == optimizer.releases


@pytest.mark.parametrize("horizon", [None, 4])
def test_budget_steps_agree_with_calibrate_steps(monkeypatch, horizon) -> None:
    """The engine's cached allowance (re-searched every `horizon` steps) stops at exactly the
    step count dpsharp.calibrate.steps finds for the same budget."""
    calibrate = pytest.importorskip("dpsharp.calibrate")
    if horizon is not None:
        monkeypatch.setattr("dpsharp.torch.engine._ALLOWANCE_HORIZON", horizon)
    name = POISSON_ACCOUNTANTS[0]
    budget = PrivacyBudget(epsilon=3.0, delta=1e-5)
    engine, model, optimizer, loader = private(name, sigma=1.2, budget=budget)
    with pytest.raises(BudgetExhausted):
        run(optimizer, loader, model, epochs=200)
    expected = calibrate.steps(3.0, 1e-5, noise_multiplier=1.2, sampling_probability=0.1,
                               accountant=name, require_certified=False, max_steps=10_000)
    assert engine.steps == expected


def test_budget_is_recomputed_when_sigma_changes() -> None:
    # A sigma set by hand mid-run may depend on the outputs so far: the budget needs the run to
    # be declared adaptive (a Renyi filter on the 'rdp' accountant; tests/test_budget_soundness.py)
    budget = PrivacyBudget(epsilon=3.0, delta=1e-5)
    engine, model, optimizer, loader = private("rdp", sigma=2.0, budget=budget, adaptive_noise=True)
    run(optimizer, loader, model, steps=10)
    left_at_2 = engine.steps_left()
    optimizer.noise_multiplier = 1.2
    left_at_12 = engine.steps_left()
    assert 0 < left_at_12 < left_at_2
    with pytest.raises(BudgetExhausted):
        run(optimizer, loader, model, epochs=1000)
    with pytest.warns(UserWarning, match="chosen adaptively.*a reading, not a guarantee"):
        assert engine.epsilon(1e-5) <= 3.0
    events = dict(engine.accountant.composed)
    assert events[PoissonSampled(Gaussian(2.0), 0.1)] == 10
    assert events[PoissonSampled(Gaussian(1.2), 0.1)] == engine.steps - 10 == left_at_12


def test_shuffled_budget_counts_epochs() -> None:
    # zCDP of reshuffling with sigma = 4: rho per epoch 1/32; the budget allows whole epochs
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)
    loader = ShuffledDataLoader(make_dataset(), batch_size=15, seed=2)
    engine, model, optimizer, loader = private("zcdp", loader=loader, sigma=4.0, budget=budget)
    with pytest.raises(BudgetExhausted):
        run(optimizer, loader, model, epochs=100)
    epochs_paid = loader.epoch - 1  # the refused step was the first of a new epoch
    assert engine.steps == 4 * epochs_paid
    assert engine.epsilon(1e-5) <= 1.0
    more = dpsharp.accountant("zcdp", neighbouring=engine.accountant.neighbouring)
    more.compose(Shuffled(Gaussian(4.0), 15, 60), epochs_paid + 1)
    assert more.epsilon(1e-5) > 1.0


def test_zero_noise_is_not_private() -> None:
    engine, model, optimizer, loader = private("gdp", sigma=0.0)
    run(optimizer, loader, model, steps=2)
    assert engine.epsilon(1e-5) == math.inf
    engine, model, optimizer, loader = private("rdp", sigma=0.0, budget=PrivacyBudget(10.0, 1e-5))
    with pytest.raises(BudgetExhausted, match="noise_multiplier is 0"):
        run(optimizer, loader, model, steps=1)


def test_mismatched_accounting_is_refused_unless_overridden() -> None:
    loader = ShuffledDataLoader(make_dataset(), batch_size=6, seed=2)
    with pytest.raises(ValueError, match="allow_accounting_mismatch"):
        private("gdp", loader=loader, accounting="poisson")
    loader = ShuffledDataLoader(make_dataset(), batch_size=6, seed=2)
    engine, model, optimizer, loader = private(
        "gdp", loader=loader, accounting="poisson", allow_accounting_mismatch=True
    )
    run(optimizer, loader, model, epochs=2)
    report = engine.report(1e-5)
    assert report.accounting == "poisson" and report.sampling == "shuffle"
    as_poisson = dpsharp.accountant("gdp").compose(PoissonSampled(Gaussian(1.0), 0.1), 20)
    assert report.epsilon == as_poisson.epsilon(1e-5)
    # the honest accounting of reshuffling is stated under zero-out (no add/remove guarantee)
    honest = dpsharp.accountant(report.honest_accountant, neighbouring="zero_out")
    honest.compose(Shuffled(Gaussian(1.0), 6, 60), 2)
    assert report.honest_epsilon == honest.epsilon(1e-5)
    assert report.honest_epsilon > report.epsilon and "shuffle" in report.note


def test_an_accountant_that_cannot_account_the_loader_is_refused() -> None:
    loader = ShuffledDataLoader(make_dataset(), batch_size=6, seed=2)
    with pytest.raises(ValueError, match="cannot account 'shuffle' sampling"):
        private("gdp", loader=loader)


def test_empty_poisson_batch_is_a_noisy_step() -> None:
    loader = PoissonDataLoader(make_dataset(), sample_rate=1e-9, steps_per_epoch=3, seed=1)
    engine, model, optimizer, loader = private("gdp", loader=loader, sigma=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    for x, y in loader:
        assert len(x) == 0
        optimizer.zero_grad()
        optimizer.step()  # no backward on an empty batch: still a release of pure noise
    assert engine.steps == 3 == optimizer.noise.releases
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert dict(engine.accountant.composed) == {PoissonSampled(Gaussian(1.0), 1e-9): 3}


def test_backward_on_an_empty_poisson_batch_then_step() -> None:
    loader = PoissonDataLoader(make_dataset(), sample_rate=1e-9, steps_per_epoch=2, seed=1)
    engine, model, optimizer, loader = private("gdp", loader=loader, sigma=1.0)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        optimizer.step()
    assert engine.steps == 2 == optimizer.noise.releases


def test_skipped_accumulated_and_repeated_steps_raise() -> None:
    engine, model, optimizer, loader = private("gdp")
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(RuntimeError, match="before optimizer.step\\(\\) released the previous"):
        next(iterator)  # the first batch was never released
    engine, model, optimizer, loader = private("gdp", loader=PoissonDataLoader(make_dataset(), sample_rate=0.5, seed=3))
    x, y = next(iter(loader))
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    with pytest.raises(RuntimeError, match="twice for one batch"):
        optimizer.step()


def test_virtual_batches_through_the_loader_release_once_per_logical_batch() -> None:
    loader = PoissonDataLoader(make_dataset(), sample_rate=0.5, steps_per_epoch=4, seed=3,
                               max_physical_batch_size=7)
    engine, model, optimizer, loader = private("gdp", loader=loader)
    physical = run(optimizer, loader, model, epochs=1)
    assert physical > 4 and engine.steps == 4 == optimizer.noise.releases


def test_checkpoint_round_trip_matches_the_uninterrupted_run() -> None:
    budget = PrivacyBudget(epsilon=50.0, delta=1e-5)
    engine, model, optimizer, loader = private("rdp", sigma=1.0, budget=budget, seed=21)
    run(optimizer, loader, model, epochs=3)
    uninterrupted = (engine.epsilon(1e-5), optimizer.noise.state_dict(), [p.detach().clone() for p in model.parameters()])

    engine, model, optimizer, loader = private("rdp", sigma=1.0, budget=budget, seed=21)
    run(optimizer, loader, model, steps=loader.steps_per_epoch + 4)  # stop mid-epoch
    checkpoint = copy.deepcopy({
        "engine": engine.state_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
    })
    resumed_engine, resumed_model, resumed_opt, resumed_loader = private("rdp", sigma=1.0, budget=budget, seed=999)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    resumed_engine.load_state_dict(checkpoint["engine"])
    assert resumed_engine.epsilon(1e-5) == engine.epsilon(1e-5)
    remaining = 3 * resumed_loader.steps_per_epoch - resumed_engine.steps
    run(resumed_opt, resumed_loader, resumed_model, steps=remaining, epochs=2)
    assert resumed_engine.steps == 3 * resumed_loader.steps_per_epoch
    assert resumed_engine.epsilon(1e-5) == uninterrupted[0]
    assert resumed_opt.noise.state_dict() == uninterrupted[1]
    for a, b in zip(resumed_model.parameters(), uninterrupted[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_adaptive_clipping_bound_resumes_from_the_engine_checkpoint() -> None:
    """The adaptive bound C_t (Andrew et al. 2021) is part of the run's state: the engine's
    checkpoint alone resumes the uninterrupted run (bound, parameters, ledger), and an
    optimizer state from an earlier checkpoint loaded first cannot leave a stale bound."""
    def start(seed: int = 21):
        loader = PoissonDataLoader(make_dataset(), sample_rate=0.25, seed=seed)
        return private("rdp", sigma=1.0, seed=seed, clipping="adaptive", loader=loader)

    engine, model, optimizer, loader = start()
    run(optimizer, loader, model, steps=3)
    early = copy.deepcopy(optimizer.state_dict())
    run(optimizer, loader, model, steps=loader.steps_per_epoch)
    checkpoint = copy.deepcopy({"engine": engine.state_dict(), "model": model.state_dict()})
    bound_at_checkpoint = optimizer.max_grad_norm
    assert bound_at_checkpoint != 1.0  # the bound moved
    run(optimizer, loader, model, steps=5)
    uninterrupted = (optimizer.max_grad_norm, [p.detach().clone() for p in model.parameters()],
                     list(engine.accountant.ledger), engine.epsilon(1e-5))

    for stale_optimizer in (False, True):
        resumed_engine, resumed_model, resumed_opt, resumed_loader = start(seed=999)
        resumed_model.load_state_dict(checkpoint["model"])
        if stale_optimizer:
            resumed_opt.load_state_dict(early)
        resumed_engine.load_state_dict(checkpoint["engine"])
        assert resumed_opt.max_grad_norm == bound_at_checkpoint
        assert resumed_opt.clipper.max_grad_norm == bound_at_checkpoint
        run(resumed_opt, resumed_loader, resumed_model, steps=5)
        assert resumed_opt.max_grad_norm == uninterrupted[0]
        for a, b in zip(resumed_model.parameters(), uninterrupted[1]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert list(resumed_engine.accountant.ledger) == uninterrupted[2]
        assert resumed_engine.epsilon(1e-5) == uninterrupted[3]

    flat_engine = private("rdp", sigma=1.0, seed=21)[0]
    with pytest.raises(ValueError, match="differ in clip rule"):
        flat_engine.load_state_dict(checkpoint["engine"])
    tampered = copy.deepcopy(checkpoint["engine"])
    tampered["clipping"]["bound"] = float("nan")
    fresh_engine = start()[0]
    with pytest.raises(ValueError, match="clipping bound"):
        fresh_engine.load_state_dict(tampered)
    assert fresh_engine.accountant.is_empty and fresh_engine.steps == 0  # nothing restored


def test_calibrated_noise_meets_the_target_epsilon() -> None:
    pytest.importorskip("dpsharp.calibrate")
    name = next((n for n in ("pld", "rdp") if n in dpsharp.available()), None)
    if name is None:
        pytest.skip("no certified Poisson accountant on this branch yet")
    model = make_model()
    engine = PrivacyEngine(accountant=name)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        PoissonDataLoader(make_dataset(), sample_rate=0.1, seed=1),
        target_epsilon=2.0, delta=1e-5, epochs=3, max_grad_norm=1.0, seed=1,
    )
    run(optimizer, loader, model, epochs=3)
    assert 2.0 * (1 - 2e-3) <= engine.epsilon(1e-5) <= 2.0


def test_plain_dataloader_is_replaced_by_poisson_sampling() -> None:
    plain = DataLoader(make_dataset(), batch_size=12, shuffle=True)
    engine, model, optimizer, loader = private("gdp", loader=plain)
    assert isinstance(loader, PoissonDataLoader) and loader.sample_rate == 12 / 60
    assert optimizer.expected_batch_size == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"noise_multiplier": -1.0}, ValueError, "noise_multiplier must be in \\[0, inf\\)"),
        ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm must be in \\(0, inf\\)"),
        ({"max_grad_norm": -2.0}, ValueError, "max_grad_norm must be in \\(0, inf\\)"),
        ({"noise_multiplier": None}, ValueError, "exactly one of noise_multiplier and target_epsilon"),
        ({"target_epsilon": 1.0}, ValueError, "exactly one of noise_multiplier and target_epsilon"),
        ({"delta": 0.0}, ValueError, "delta must be in \\(0, 1\\)"),
    ],
)
def test_bad_make_private_arguments(kwargs, error, message) -> None:
    model = make_model()
    args = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-5}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        PrivacyEngine(accountant="gdp").make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1),
            PoissonDataLoader(make_dataset(), sample_rate=0.1), **args
        )


def test_foreign_optimizer_and_batchnorm_are_refused_at_make_private() -> None:
    model, other = make_model(), make_model(1)
    with pytest.raises(ValueError, match="not a parameter of module"):
        PrivacyEngine(accountant="gdp").make_private(
            model, torch.optim.SGD(other.parameters(), lr=0.1),
            PoissonDataLoader(make_dataset(), sample_rate=0.1),
            noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5,
        )
    bn = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    with pytest.raises(ValueError, match="BatchNorm"):
        PrivacyEngine(accountant="gdp").make_private(
            bn, torch.optim.SGD(bn.parameters(), lr=0.1),
            PoissonDataLoader(make_dataset(), sample_rate=0.1),
            noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5,
        )


def test_budget_validation() -> None:
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\)"):
        PrivacyBudget(1.0, 1.0)
    with pytest.raises(ValueError, match="epsilon must be in \\[0, inf\\)"):
        PrivacyBudget(-1.0, 1e-5)
