"""Every path around a privacy budget, reproduced and closed.

A budget is only as good as its accountant and its bookkeeping. Each test below drives the
engine (or the calibration) down one path that used to release more than the budget allowed,
or to call an approximation a guarantee, and checks the outcome against an independent
reference: the exact (epsilon, delta) curve of the composed Gaussian mechanism in mpmath
(Dong, Roth, Su 2019, Corollary 2.13; tests/_gaussian_reference.py), dp-accounting's PLD
accountant, or Opacus' Renyi curves -- never the engine's own number.

Runs use a Poisson loader with sampling rate 1, so every release is exactly the Gaussian
mechanism Gaussian(sigma) (mu = 1/sigma) and a ledger of releases and hand-composed Gaussian
events is exactly mu-GDP with mu^2 = sum 1/sigma_i^2: its true epsilon(delta) is known in
closed form.
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

import dpsharp  # noqa: E402
from _torch_training import train_steps  # noqa: E402
from dpsharp import calibrate  # noqa: E402
from dpsharp.accountants.gdp import GDPAccountant  # noqa: E402
from dpsharp.accountants.zcdp import ZCDPAccountant  # noqa: E402
from dpsharp.events import Gaussian, PoissonSampled  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    BudgetExhausted,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
)
from dpsharp.torch.schedules import TimeBased, ValidationBased, attach_schedule  # noqa: E402

from _gaussian_reference import exact_delta  # noqa: E402

pytestmark = pytest.mark.torch

DELTA = 1e-5


def _dataset(n: int = 8) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _private(
    accountant: str = "pld",
    *,
    sigma: float = 4.0,
    sample_rate: float = 1.0,
    n: int = 8,
    seed: int = 7,
    accountant_options: dict | None = None,
    **kwargs,
):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    engine = PrivacyEngine(accountant=accountant, accountant_options=accountant_options)
    loader = PoissonDataLoader(_dataset(n), sample_rate=sample_rate, seed=seed)
    model, optimizer, loader = engine.make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        loader,
        noise_multiplier=sigma,
        max_grad_norm=1.0,
        delta=kwargs.pop("delta", DELTA),
        seed=seed,
        **kwargs,
    )
    return engine, model, optimizer, loader


def _train(optimizer, loader, model, *, steps: int | None = None, limit: int = 2000) -> int:
    """Step until ``steps`` releases (or BudgetExhausted propagates); returns releases taken."""
    return train_steps(model, optimizer, loader, steps, limit=limit)


def _gaussian_mu(accountant) -> float:
    """mu of a ledger of Gaussian mechanisms (PoissonSampled at rate 1 or plain): the exact
    composition sqrt(sum count / sigma^2) (Dong, Roth, Su 2019, Corollary 3.3)."""
    total = 0.0
    for leaf, count in accountant.composed:
        if isinstance(leaf, PoissonSampled):
            assert leaf.sampling_probability == 1.0
            leaf = leaf.event
        assert isinstance(leaf, Gaussian)
        total += count / leaf.noise_multiplier**2
    return math.sqrt(total)


def _within(epsilon: float, mu: float) -> bool:
    """Whether the mu-GDP mechanism is (epsilon, DELTA)-DP: exact delta(epsilon) <= DELTA."""
    return exact_delta(epsilon, mu) <= DELTA


# --------------------------------------------------------------------------- certification
def test_certification_belongs_to_the_configured_instance() -> None:
    assert ZCDPAccountant(batching="reshuffle").certified is True
    assert ZCDPAccountant(batching="sample").certified is False
    assert GDPAccountant().certified is False
    assert dpsharp.accountant("pld").certified and dpsharp.accountant("rdp").certified
    # each answer carries its own flag: the CLT answer is not certified, an exact one is
    clt = GDPAccountant().compose(PoissonSampled(Gaussian(1.0), 0.1), 10).guarantee(DELTA)
    exact = GDPAccountant().compose(Gaussian(1.0), 10).guarantee(DELTA)
    assert clt.certified is False and exact.certified is True


def test_gdp_budget_needs_an_explicit_opt_in_and_is_labelled() -> None:
    """The regime where the CLT is far off (q = 0.1, sigma = 1): the CLT epsilon stops the run at the
    budget while the certified epsilon of the same ledger (dp-accounting's PLD) is far above."""
    budget = PrivacyBudget(3.0, DELTA)
    with pytest.raises(ValueError, match="not certified.*allow_approximation=True"):
        _private("gdp", sigma=1.0, sample_rate=0.1, n=60, budget=budget)
    with pytest.raises(ValueError, match="not certified.*allow_approximation=True"):
        _private("gdp", sigma=None, sample_rate=0.1, n=60, target_epsilon=3.0, epochs=2)
    engine, model, optimizer, loader = _private(
        "gdp", sigma=1.0, sample_rate=0.1, n=60, budget=budget, allow_approximation=True
    )
    with pytest.raises(BudgetExhausted, match="an approximation"):
        _train(optimizer, loader, model)
    report = engine.report()
    assert report.certified is False and "approximation" in report.note
    dp_accounting = pytest.importorskip("dp_accounting")
    peer = dp_accounting.pld.PLDAccountant()
    peer.compose(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), engine.steps
    )
    # why the opt-in is needed: the certified epsilon of what was released exceeds the budget
    assert peer.get_epsilon(DELTA) > 1.1 * budget.epsilon
    assert report.epsilon <= budget.epsilon


def test_zcdp_random_sampling_budget_and_calibration_need_the_opt_in() -> None:
    options = {"batching": "sample"}
    with pytest.raises(ValueError, match="not certified.*allow_approximation=True"):
        _private("zcdp", sigma=2.0, sample_rate=0.01, n=400, accountant_options=options,
                 budget=PrivacyBudget(1.0, DELTA))
    with pytest.raises(ValueError, match="not certified.*allow_approximation=True"):
        _private("zcdp", sigma=None, sample_rate=0.01, n=400, accountant_options=options,
                 target_epsilon=1.0, epochs=2)
    engine, *_ = _private("zcdp", sigma=2.0, sample_rate=0.01, n=400, accountant_options=options,
                          budget=PrivacyBudget(1.0, DELTA), allow_approximation=True)
    assert engine.accountant.certified is False


def test_calibration_reads_the_configured_instance() -> None:
    """ZCDPAccountant(batching="sample") was calibrated on silently because the class said
    certified. sigma = 0.5, q = 1/32, 1000 steps: the zCDP random-sampling epsilon was 17.7
    while the run's certified epsilon is above 37 (dp-accounting PLD); that sigma is now
    refused outright (below the sigma >= 1 of the moment bound its P comes from)."""
    sample = lambda: ZCDPAccountant(batching="sample")  # noqa: E731
    with pytest.raises(ValueError, match="approximate.*allow_approximation=True"):
        calibrate.noise_multiplier(1.0, DELTA, steps=1000, sampling_probability=0.01,
                                   accountant=sample)
    with pytest.raises(ValueError, match="approximate.*allow_approximation=True"):
        calibrate.steps(17.7, DELTA, noise_multiplier=1.0, sampling_probability=1 / 32,
                        accountant=sample)
    with pytest.raises(dpsharp.UnsupportedEventError, match="stated for sigma >= 1"):
        calibrate.steps(17.7, DELTA, noise_multiplier=0.5, sampling_probability=1 / 32,
                        accountant=sample, allow_approximation=True, max_steps=5000)
    with pytest.raises(ValueError, match="approximate.*allow_approximation=True"):
        calibrate.sampling_probability(1.0, DELTA, noise_multiplier=2.0, steps=1000,
                                       accountant="gdp")
    with pytest.raises(TypeError, match="allow_approximation must be True or False"):
        calibrate.steps(17.7, DELTA, noise_multiplier=0.5, accountant="pld",
                        allow_approximation="yes")


# --------------------------------------------------------------------------- the allowance
@pytest.mark.parametrize("name", ["pld", "rdp"])
def test_an_event_composed_mid_run_counts_at_once(name: str) -> None:
    """A hyperparameter search's cost composed into engine.accountant mid-run used to be
    ignored until the cached allowance ran out (the whole search's epsilon overshot)."""
    budget = PrivacyBudget(3.0, DELTA)
    engine, model, optimizer, loader = _private(name, sigma=6.0, budget=budget)
    _train(optimizer, loader, model, steps=3)
    assert engine.steps_left() > 3
    engine.accountant.compose(Gaussian(3.0))  # the search: mu = 1/3 on its own
    with pytest.raises(BudgetExhausted):
        _train(optimizer, loader, model)
    mu = _gaussian_mu(engine.accountant)
    assert mu == pytest.approx(math.sqrt(engine.steps / 36 + 1 / 9), rel=1e-12)
    assert _within(budget.epsilon, mu)
    # and the stop is not premature: one more release is over budget by the accountant that
    # enforces it
    more = dpsharp.accountant(name).compose(Gaussian(3.0)).compose(
        PoissonSampled(Gaussian(6.0), 1.0), engine.steps + 1
    )
    assert more.epsilon(DELTA) > budget.epsilon


def test_ledger_version_moves_with_every_change() -> None:
    from dpsharp.events import SampledWithoutReplacement

    acc = dpsharp.accountant("rdp")
    start = acc.version
    acc.compose(Gaussian(1.0), 0)
    with pytest.raises(dpsharp.UnsupportedEventError):  # a replace-one analysis: refused
        acc.compose(SampledWithoutReplacement(Gaussian(1.0), 2, 10))
    assert acc.version == start
    acc.compose(Gaussian(1.0))
    after_compose = acc.version
    assert after_compose != start
    acc.load_state_dict(acc.state_dict())
    assert acc.version != after_compose


# --------------------------------------------------------------------------- checkpoints
def test_a_stored_allowance_is_not_trusted_on_load() -> None:
    budget = PrivacyBudget(3.0, DELTA)
    engine, model, optimizer, loader = _private("rdp", sigma=8.0, budget=budget)
    _train(optimizer, loader, model, steps=10)
    engine.steps_left()
    state = copy.deepcopy(engine.state_dict())
    # an edited (or stale) allowance: a million further releases
    state["allowance"] = [dpsharp.events.event_to_dict(PoissonSampled(Gaussian(8.0), 1.0)),
                          10**6, 0]
    opt_state = copy.deepcopy(optimizer.state_dict())
    resumed, model2, optimizer2, loader2 = _private("rdp", sigma=8.0, budget=budget, seed=8)
    optimizer2.load_state_dict(opt_state)
    resumed.load_state_dict(state)
    with pytest.raises(BudgetExhausted):
        _train(optimizer2, loader2, model2)
    assert _within(budget.epsilon, _gaussian_mu(resumed.accountant))


def test_an_edited_ledger_is_refused_on_load() -> None:
    budget = PrivacyBudget(30.0, DELTA)
    engine, model, optimizer, loader = _private("rdp", sigma=4.0, budget=budget)
    _train(optimizer, loader, model, steps=12)
    state = copy.deepcopy(engine.state_dict())
    state["main"]["accountant"]["ledger"][0][1] = 2  # 12 releases, 2 events left in the ledger
    resumed, *_ = _private("rdp", sigma=4.0, budget=budget, seed=8)
    with pytest.raises(ValueError, match="inconsistent.*ledger holds 2 events but 12"):
        resumed.load_state_dict(state)


def test_restoring_the_optimizer_without_the_engine_is_refused() -> None:
    """7 releases, a checkpoint of the optimizer only, 8 more releases: 15 happened but a fresh
    engine would have accounted 8."""
    engine, model, optimizer, loader = _private("rdp", sigma=2.0)
    _train(optimizer, loader, model, steps=7)
    opt_state = copy.deepcopy(optimizer.state_dict())
    fresh, model2, optimizer2, loader2 = _private("rdp", sigma=2.0, seed=9)
    optimizer2.load_state_dict(opt_state)
    message = "released 7 noisy gradients but this engine accounted 0.*engine.load_state_dict"
    with pytest.raises(RuntimeError, match=message):
        _train(optimizer2, loader2, model2, steps=8)
    assert optimizer2.releases == 7  # nothing more went out
    with pytest.raises(RuntimeError, match=message):
        fresh.epsilon()
    with pytest.raises(RuntimeError, match=message):
        fresh.report()
    # restoring both from the same checkpoint is fine, into a loader that has drawn nothing
    # (loader2 drew the refused batch: loading a state into it would rewind its sampler)
    fresh, model2, optimizer2, loader2 = _private("rdp", sigma=2.0, seed=9)
    optimizer2.load_state_dict(opt_state)
    fresh.load_state_dict(engine.state_dict())
    _train(optimizer2, loader2, model2, steps=8)
    assert fresh.steps == 15 and sum(c for _, c in fresh.accountant.composed) == 15


# --------------------------------------------------------------------------- charge first
@pytest.mark.parametrize(("name", "options"), [("gdp", None)])
def test_a_noise_whose_square_underflows_is_accounted_as_no_privacy(name, options) -> None:
    """sigma = 1e-200: 1/sigma^2 overflowed into a ZeroDivisionError after the noiseless
    gradient was already in p.grad. Now the charge is made first and is +inf."""
    engine, model, optimizer, loader = _private(
        name, sigma=1e-200, sample_rate=0.01 if name == "zcdp" else 1.0,
        n=400 if name == "zcdp" else 8, accountant_options=options,
    )
    _train(optimizer, loader, model, steps=1)
    assert engine.steps == 1 and sum(c for _, c in engine.accountant.composed) == 1
    assert engine.epsilon(DELTA) == math.inf


def test_an_accounting_error_releases_nothing(monkeypatch) -> None:
    engine, model, optimizer, loader = _private("rdp", sigma=2.0)

    def broken(event, count=1):
        raise ArithmeticError("accounting failed")

    monkeypatch.setattr(engine.accountant, "compose", broken)
    x, y = next(iter(loader))
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ArithmeticError, match="accounting failed"):
        optimizer.step()
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.releases == 0 and optimizer.noise.releases == 0
    monkeypatch.undo()
    optimizer.step()  # the same lot, now accounted and released once
    assert optimizer.releases == 1 and dict(engine.accountant.composed) == {
        PoissonSampled(Gaussian(2.0), 1.0): 1
    }


# --------------------------------------------------------------------------- adaptive noise
def test_adaptive_noise_with_a_pld_budget_is_refused() -> None:
    budget = PrivacyBudget(3.0, DELTA)
    with pytest.raises(ValueError, match="privacy filter.*'pld' has none"):
        _private("pld", budget=budget, adaptive_noise=True)
    engine, *_ = _private("pld", budget=budget)
    schedule = ValidationBased(4.0, 0.5, m=1, threshold=0.0, period=1, validation_set="public")
    with pytest.raises(ValueError, match="privacy filter.*'pld' has none"):
        attach_schedule(engine, schedule)
    # a schedule fixed in advance is ordinary composition
    attach_schedule(engine, TimeBased(4.0, 0.1))
    assert not engine.adaptive_noise


def test_a_sigma_changed_by_hand_under_a_budget_is_refused() -> None:
    engine, model, optimizer, loader = _private("pld", budget=PrivacyBudget(3.0, DELTA))
    _train(optimizer, loader, model, steps=3)
    optimizer.noise_multiplier = 3.0
    with pytest.raises(RuntimeError, match="chosen adaptively.*adaptive_noise=True"):
        _train(optimizer, loader, model, steps=1)
    assert optimizer.releases == 3


def test_a_sigma_set_back_before_the_next_release_is_not_adaptive() -> None:
    """A sigma changed after a release and set back before the next one leaves every released
    sigma the one fixed in advance: nothing was chosen online, and the budget goes on (the
    adaptive flag was sticky from the assignment, refusing every later release). A release
    that would use a changed sigma is refused, as above, before anything is released; set
    back, the run goes on as fixed in advance."""
    budget = PrivacyBudget(20.0, DELTA)
    engine, model, optimizer, loader = _private("pld", budget=budget)
    _train(optimizer, loader, model, steps=3)
    optimizer.noise_multiplier = 3.0
    optimizer.noise_multiplier = 4.0  # (the value released so far)
    _train(optimizer, loader, model, steps=2)
    assert optimizer.releases == 5 and not engine.adaptive_noise
    optimizer.noise_multiplier = 3.0
    with pytest.raises(RuntimeError, match="chosen adaptively.*adaptive_noise=True"):
        _train(optimizer, loader, model, steps=1)
    assert optimizer.releases == 5
    optimizer.noise_multiplier = 4.0
    optimizer.step()  # the refused batch, released at the sigma fixed in advance
    _train(optimizer, loader, model, steps=1)
    assert optimizer.releases == 7 and not engine.adaptive_noise
    assert engine.report().certified
    assert dict(engine.accountant.composed) == {PoissonSampled(Gaussian(4.0), 1.0): 7}


def test_adaptive_noise_without_a_budget_is_reported_uncertified() -> None:
    engine, model, optimizer, loader = _private("pld", sigma=4.0)
    _train(optimizer, loader, model, steps=3)
    assert engine.report().certified is True
    optimizer.noise_multiplier = 3.0
    _train(optimizer, loader, model, steps=2)
    report = engine.report()
    assert report.certified is False and "chosen adaptively" in report.warning


def _opacus_rdp(sigmas: dict[float, int], orders) -> "list[float]":
    from opacus.accountants.analysis import rdp as opacus_rdp

    total = [0.0] * len(orders)
    for sigma, count in sigmas.items():
        curve = opacus_rdp.compute_rdp(q=1.0, noise_multiplier=sigma, steps=count, orders=orders)
        total = [a + float(b) for a, b in zip(total, curve)]
    return total


def _filter_admits(curve, orders, budget: PrivacyBudget) -> bool:
    """The Renyi filter's condition with delta split over the orders (engine docstring)."""
    for order, spent in zip(orders, curve):
        log_c = (order - 1) * math.log1p(-1 / order) - math.log(order)
        bound = budget.epsilon - (math.log(len(orders) / budget.delta) + log_c) / (order - 1)
        if spent <= bound:
            return True
    return False


def test_adaptive_noise_under_a_renyi_filter() -> None:
    """sigma chosen from the training loss (an output of earlier releases): the budget is a
    Renyi filter. Checked with Opacus' Renyi curves of the realised sigmas: the filter admits
    the ledger and would not admit the refused release."""
    pytest.importorskip("opacus")
    orders = [2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0]
    budget = PrivacyBudget(4.0, DELTA)
    engine, model, optimizer, loader = _private(
        "rdp", sigma=6.0, budget=budget, adaptive_noise=True,
        accountant_options={"orders": orders},
    )
    used: dict[float, int] = {}
    losses: list[float] = []
    with pytest.raises(BudgetExhausted, match="Renyi filter"):
        while True:
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                # the next sigma depends on the outputs so far
                sigma = 5.0 if losses and loss.item() < losses[-1] else 6.0
                optimizer.noise_multiplier = sigma
                optimizer.step()
                used[sigma] = used.get(sigma, 0) + 1
                losses.append(loss.item())
    refused = sigma  # the step that raised was not counted in ``used``
    assert sum(used.values()) == engine.steps
    assert _filter_admits(_opacus_rdp(used, orders), orders, budget)
    over = dict(used)
    over[refused] = over.get(refused, 0) + 1
    assert not _filter_admits(_opacus_rdp(over, orders), orders, budget)
    report = engine.report()
    assert report.certified is True and report.epsilon == budget.epsilon
    assert "Renyi filter" in report.note
    # the filter guarantee holds for any realisation: in particular, the realised ledger (fixed
    # after the fact, a Gaussian mechanism) is within the budget by the exact curve
    assert _within(budget.epsilon, math.sqrt(sum(c / s**2 for s, c in used.items())))
    # the filter proves (4, 1e-5) only: a statement at a smaller delta is a reading
    assert engine.report(DELTA / 10).certified is False
    # and an event composed by hand past the filter leaves the ledger outside what it proves
    engine.accountant.compose(Gaussian(0.5))
    report = engine.report()
    assert report.certified is False and report.epsilon > budget.epsilon
