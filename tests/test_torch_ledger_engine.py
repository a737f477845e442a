"""A PrivacyEngine's ledger only grows within a process, and the privacy claim it reports covers
every release made from the model it was given.

* ``load_state_dict`` resumes a checkpoint into a fresh engine; an engine that has released
  refuses it (restoring an earlier state in the same run would drop releases already made, and
  choosing among checkpoints is post-processing of every release made).
* A model made private by one engine (or a copy of it) is refused by another, whose epsilon
  would count only its own releases.
* An accounting other than the loader's sampling (``allow_accounting_mismatch=True``) is never
  reported as certified, and its epsilon warns that it is not a bound for the loader.

Epsilons are checked against dp-accounting's PLD accountant (add/remove Poisson-subsampled
Gaussians) and, for reshuffling under zero-out, the exact Gaussian trade-off (Balle and Wang
2018, Theorem 8) of mu = sqrt(epochs) / sigma (Yu et al. 2019, Theorem 2).
"""

from __future__ import annotations

import copy
import io
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mpmath")  # the exact Gaussian reference

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from _gaussian_reference import exact_epsilon_bisect  # noqa: E402
from _peer_reference import poisson_gaussian_epsilon  # noqa: E402
from _torch_training import train_steps  # noqa: E402

from dpsharp.events import Gaussian, PoissonSampled  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    BudgetExhausted,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
    ShuffledDataLoader,
)

pytestmark = pytest.mark.torch

DELTA = 1e-5


# ------------------------------------------------------------------------------- references
# ------------------------------------------------------------------------------- helpers
def dataset(n: int, seed: int = 1) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long())


def new_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def private(model=None, *, n: int = 50, q: float = 0.2, sigma: float = 1.0, seed: int = 2,
            loader=None, momentum: float = 0.0, **options):
    model = new_model() if model is None else model
    engine = PrivacyEngine("pld")
    if loader is None:
        loader = PoissonDataLoader(dataset(n), sample_rate=q, seed=seed)
    options.setdefault("delta", DELTA)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum), loader,
        noise_multiplier=sigma, max_grad_norm=1.0, seed=seed + 1, batch_probe=False, **options)
    return engine, model, optimizer, loader


def train(optimizer, loader, model, steps: int) -> int:
    """Up to ``steps`` releases (fewer if the budget stops them); returns how many."""
    before = optimizer.releases
    try:
        train_steps(model, optimizer, loader, steps)
    except BudgetExhausted:
        pass
    return optimizer.releases - before


def checkpoint(engine, model, optimizer) -> dict:
    return copy.deepcopy({"engine": engine.state_dict(), "model": model.state_dict(),
                          "optimizer": optimizer.state_dict()})


# ------------------------------------------------------------------------------- rewinds
def test_an_engine_that_released_refuses_an_earlier_state_and_keeps_its_budget() -> None:
    """Budget (2, 1e-5), sigma 2, q 0.2: the budget stops the run; loading the state taken at
    the start had rewound the ledger, and 16 more releases went out under the same budget
    (all 32 cost 2.79 > 2) with the noise stream replayed."""
    budget = PrivacyBudget(2.0, DELTA)
    engine, model, optimizer, loader = private(sigma=2.0, budget=budget)
    start = copy.deepcopy(engine.state_dict())
    released = train(optimizer, loader, model, steps=1000)
    # the budget stopped it where the reference says it must
    assert poisson_gaussian_epsilon(0.2, 2.0, released, DELTA) <= budget.epsilon * (1 + 1e-3)
    assert poisson_gaussian_epsilon(0.2, 2.0, released + 1, DELTA) > budget.epsilon
    ledger, noise = list(engine.accountant.ledger), optimizer.noise.state_dict()
    with pytest.raises(RuntimeError, match=f"released {released} noisy gradients in this "
                       "process.*choosing among checkpoints is post-processing"):
        engine.load_state_dict(start)
    # nothing was restored: same ledger, same noise stream position, and the budget holds
    assert list(engine.accountant.ledger) == ledger
    assert optimizer.noise.state_dict() == noise
    assert not engine.within_budget() and engine.steps_left() == 0
    assert engine.steps == optimizer.releases == released
    reference = poisson_gaussian_epsilon(0.2, 2.0, released, DELTA)
    assert engine.epsilon() == pytest.approx(reference, rel=2e-3)


def test_restoring_the_best_checkpoint_keeps_the_ledger_of_every_release() -> None:
    """Checkpoints every epoch, the best chosen after 3 epochs: loading its engine state had
    reported the epsilon of 1 epoch though choosing it looked at all 3. Its weights (model and
    wrapped optimizer) restore, and the engine goes on counting every release."""
    engine, model, optimizer, loader = private(n=100, q=0.1, momentum=0.9)
    saved = []
    for _ in range(3):
        train(optimizer, loader, model, steps=loader.steps_per_epoch)
        saved.append(checkpoint(engine, model, optimizer))
    total = engine.steps
    assert total == 30
    best = saved[0]
    with pytest.raises(RuntimeError, match="restore only the weights"):
        engine.load_state_dict(best["engine"])
    model.load_state_dict(best["model"])
    optimizer.original_optimizer.load_state_dict(best["optimizer"])
    for name, value in model.state_dict().items():
        assert torch.equal(value, best["model"][name])
    report = engine.report()
    assert report.steps == total and report.certified
    reference = poisson_gaussian_epsilon(0.1, 1.0, total, DELTA)
    assert report.epsilon == pytest.approx(reference, rel=2e-3)
    # training on from the restored weights is accounted on top of every release made
    assert train(optimizer, loader, model, steps=2) == 2
    reference = poisson_gaussian_epsilon(0.1, 1.0, total + 2, DELTA)
    assert engine.epsilon() == pytest.approx(reference, rel=2e-3)


def test_a_checkpoint_resumes_into_a_fresh_engine_and_a_ledger_only_grows() -> None:
    engine, model, optimizer, loader = private()
    train(optimizer, loader, model, steps=7)
    early = checkpoint(engine, model, optimizer)
    train(optimizer, loader, model, steps=5)
    late = checkpoint(engine, model, optimizer)

    fresh, model2, optimizer2, loader2 = private(seed=9)
    model2.load_state_dict(late["model"])
    optimizer2.load_state_dict(late["optimizer"])
    fresh.load_state_dict(late["engine"])
    fresh.load_state_dict(late["engine"])  # the same again: nothing released in between
    assert fresh.steps == 12
    assert fresh.epsilon() == pytest.approx(poisson_gaussian_epsilon(0.2, 1.0, 12, DELTA), rel=2e-3)
    # an earlier checkpoint over a later one would shrink the ledger: refused, nothing restored
    ledger, loader_state = list(fresh.accountant.ledger), loader2.state_dict()
    with pytest.raises(ValueError, match="lacks 12 x PoissonSampled.*shrink the ledger"):
        fresh.load_state_dict(early["engine"])
    assert list(fresh.accountant.ledger) == ledger and loader2.state_dict() == loader_state
    assert fresh.steps == optimizer2.releases == 12
    assert train(optimizer2, loader2, model2, steps=3) == 3
    assert fresh.epsilon() == pytest.approx(poisson_gaussian_epsilon(0.2, 1.0, 15, DELTA), rel=2e-3)
    with pytest.raises(RuntimeError, match="released 3 noisy gradients in this process"):
        fresh.load_state_dict(late["engine"])

    # events composed by hand (the cost of a search) would be dropped by a load: refused
    searched, *_ = private(seed=11)
    searched.accountant.compose(PoissonSampled(Gaussian(1.0), 0.5), 10)
    with pytest.raises(RuntimeError, match="composed into engine.accountant by hand.*first"):
        searched.load_state_dict(late["engine"])
    assert sum(count for _, count in searched.accountant.composed) == 10


def test_replacing_the_live_accountants_state_with_an_earlier_one_is_detected() -> None:
    """engine.accountant is live (events composed into it by hand count at once); loading an
    earlier state into it had rewound the ledger under the engine: 8 releases reported as 3."""
    engine, model, optimizer, loader = private()
    train(optimizer, loader, model, steps=3)
    early = copy.deepcopy(engine.accountant.state_dict())
    train(optimizer, loader, model, steps=5)
    engine.accountant.compose(PoissonSampled(Gaussian(2.0), 0.5), 4)  # growing by hand is fine
    assert train(optimizer, loader, model, steps=1) == 1
    engine.accountant.load_state_dict(early)
    with pytest.raises(RuntimeError, match="lost 6 x PoissonSampled.*A ledger only grows"):
        engine.epsilon()
    with pytest.raises(RuntimeError, match="ledger lost"):
        train(optimizer, loader, model, steps=1)
    assert optimizer.releases == engine.steps == 9  # nothing more went out


def test_a_refused_checkpoint_restores_nothing() -> None:
    """A checkpoint refused by a check made after its ledger and sampler state were loaded (an
    epoch charge its loader does not show) had left the ledger loaded; a retry with the
    genuine checkpoint must then be accepted."""
    loader = ShuffledDataLoader(dataset(40), batch_size=10, seed=1)
    engine, model, optimizer, loader = private(loader=loader)
    train(optimizer, loader, model, steps=6)  # two epochs begun, two charged
    genuine = checkpoint(engine, model, optimizer)
    tampered = copy.deepcopy(genuine)
    tampered["engine"]["main"]["last_epoch_charge"][0] = 5

    fresh, model2, optimizer2, loader2 = private(loader=ShuffledDataLoader(dataset(40),
                                                                         batch_size=10, seed=4))
    optimizer2.load_state_dict(genuine["optimizer"])
    before = loader2.state_dict()
    with pytest.raises(ValueError, match="epoch 5 was paid"):
        fresh.load_state_dict(tampered["engine"])
    assert fresh.accountant.is_empty and loader2.state_dict() == before
    fresh.load_state_dict(genuine["engine"])
    assert fresh.steps == 6 and loader2.epoch == 2
    # two reshuffled epochs under zero-out: mu = sqrt(2) / sigma
    assert fresh.epsilon() == pytest.approx(exact_epsilon_bisect(DELTA, math.sqrt(2.0)), rel=2e-3)


# ------------------------------------------------------------------------------- two engines
def test_a_model_made_private_is_refused_by_a_second_engine() -> None:
    """A second make_private on the model had been accepted: the first engine could no longer
    step, and the second engine's epsilon counted 5 of the model's 10 releases."""
    first, model, optimizer, loader = private()
    assert train(optimizer, loader, model, steps=5) == 5
    for other in (model, nn.Sequential(model), model[0], copy.deepcopy(model)):
        with pytest.raises(ValueError, match="already made private by a PrivacyEngine"):
            private(other, seed=7)
    # the first engine goes on, and its epsilon covers every release of the model
    assert train(optimizer, loader, model, steps=5) == 5
    assert first.steps == 10
    assert first.epsilon() == pytest.approx(poisson_gaussian_epsilon(0.2, 1.0, 10, DELTA), rel=2e-3)
    # a freshly built model (here with these weights) is a new, separately accounted run
    rebuilt = new_model(seed=3)
    rebuilt.load_state_dict(model.state_dict())
    second, rebuilt, optimizer2, loader2 = private(rebuilt, seed=7)
    assert train(optimizer2, loader2, rebuilt, steps=2) == 2 and second.steps == 2


def test_the_private_marker_leaves_state_dict_copies_and_pickles_usable() -> None:
    plain = new_model()
    engine, model, optimizer, loader = private(new_model())
    assert list(model.state_dict()) == list(plain.state_dict())
    for name, value in model.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name])
    copied = copy.deepcopy(model)  # a copy keeps it: its weights carry the same releases
    with pytest.raises(ValueError, match="already made private"):
        private(copied)
    optimizer.clipper.remove()  # the clipping layers' forwards do not pickle; the marker does
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, model.state_dict()[name])
    # a pickle reaches a new process, where a resume loads the engine's checkpoint: accepted
    resumed, loaded, optimizer2, loader2 = private(loaded, seed=7)
    assert train(optimizer2, loader2, loaded, steps=1) == 1


# ------------------------------------------------------------------------------- mismatch
def test_a_mismatched_accounting_is_not_certified_and_its_epsilon_warns() -> None:
    """Poisson accounting on a reshuffling loader: reported certified=True under add/remove,
    and get_epsilon gave its 2.85 without a word, where the loader's sampling costs 4.38."""
    loader = ShuffledDataLoader(dataset(100), batch_size=10, seed=1)
    engine, model, optimizer, loader = private(loader=loader, accounting="poisson",
                                               allow_accounting_mismatch=True)
    train(optimizer, loader, model, steps=loader.steps_per_epoch)
    report = engine.report()
    assert report.certified is False
    assert "not a bound for its 'shuffle' sampling" in report.guarantee
    assert "not a bound for the loader's actual sampling" in report.warning
    assert report.epsilon == pytest.approx(poisson_gaussian_epsilon(0.1, 1.0, 10, DELTA), rel=2e-3)
    # the loader's own sampling: one reshuffled epoch under zero-out is 1-GDP at sigma 1
    assert report.honest_epsilon == pytest.approx(exact_epsilon_bisect(DELTA, 1.0), rel=2e-3)
    assert report.honest_certified is True and report.honest_epsilon > report.epsilon
    for query in (engine.get_epsilon, engine.epsilon):
        with pytest.warns(UserWarning, match="not a bound for the loader's actual sampling"):
            assert query(DELTA) == report.epsilon

    # the loader's own accounting: certified, and its epsilon does not warn
    loader = ShuffledDataLoader(dataset(100), batch_size=10, seed=1)
    honest, model, optimizer, loader = private(loader=loader)
    train(optimizer, loader, model, steps=loader.steps_per_epoch)
    report = honest.report()
    assert report.certified and report.warning is None and "not a bound" not in report.guarantee
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact = exact_epsilon_bisect(DELTA, 1.0)
        assert honest.get_epsilon(DELTA) == pytest.approx(exact, rel=2e-3)


def test_a_budget_on_a_mismatched_accounting_is_refused() -> None:
    """A budget enforced on the requested (Poisson) accounting of a reshuffling loader stopped
    the run where that number reached the budget, while the loader's own sampling had cost far
    more: refused at make_private and when set afterwards. The loader's own accounting takes the
    same budget."""
    budget = PrivacyBudget(3.0, DELTA)
    loader = ShuffledDataLoader(dataset(100), batch_size=10, seed=1)
    with pytest.raises(ValueError, match="budget is enforced on a bound for the loader's own"):
        private(loader=loader, accounting="poisson", allow_accounting_mismatch=True,
                budget=budget)
    loader = ShuffledDataLoader(dataset(100), batch_size=10, seed=1)
    engine, *_ = private(loader=loader, accounting="poisson", allow_accounting_mismatch=True)
    with pytest.raises(ValueError, match="'poisson' accounting asked for"):
        engine.budget = budget
    assert engine.budget is None
    loader = ShuffledDataLoader(dataset(100), batch_size=10, seed=1)
    honest, *_ = private(loader=loader, budget=budget)
    assert honest.budget == budget
