"""Every release an engine charges is a fresh, forward draw of the loader it accounts.

The engine charges each release as one draw of the loader ``make_private`` returned (its
sampling rate, batch size and epoch counter). Nothing reachable through the public API of the
loader or the optimizer may swap that loader, rewind its sampler or change its sampling behind
the engine's back: each such path is refused here, and the epsilon of a run that iterates the
accounted loader is checked against an independent reference (the exact Gaussian trade-off of
Balle and Wang 2018, Theorem 8, or dp-accounting's PLD accountant).
"""

from __future__ import annotations

import collections
import math

import pytest

torch = pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")
pytest.importorskip("mpmath")  # the exact Gaussian reference

from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from _gaussian_reference import exact_epsilon_bisect  # noqa: E402
from _peer_reference import poisson_gaussian_epsilon  # noqa: E402

from dpsharp.events import Gaussian, PoissonSampled, Shuffled  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    DPOptimizer,
    PoissonDataLoader,
    PrivacyEngine,
    ShuffledDataLoader,
    WithoutReplacementDataLoader,
)

pytestmark = pytest.mark.torch

DELTA = 1e-5


# ------------------------------------------------------------------------------- helpers
def dataset(n: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.arange(n))


def private(loader, sigma: float = 1.0, **options):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    engine = PrivacyEngine("pld")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader, noise_multiplier=sigma,
        max_grad_norm=1.0, delta=DELTA, seed=2, batch_probe=False, **options)
    return engine, model, optimizer, loader


def release(model, optimizer, batch) -> list[int]:
    x, index = batch
    if len(x):
        model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return index.tolist()


def epoch(model, optimizer, loader) -> list[list[int]]:
    return [release(model, optimizer, batch) for batch in loader]


# ------------------------------------------------------------------------- attach_loader
@pytest.mark.peers
def test_another_poisson_loader_cannot_be_attached_under_an_engine() -> None:
    """q = 0.05 accounted; a loader with q = 0.5 attached and trained on would release 20
    steps of epsilon 15.1 under a ledger saying 2.0. It is refused; the accounted loader,
    iterated, gives dp-accounting's epsilon for what it ran."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.05,
                                                                 seed=1))
    other = PoissonDataLoader(dataset(100), sample_rate=0.5, seed=3)
    with pytest.raises(RuntimeError, match="attach_loader refused.*make_private"):
        optimizer.attach_loader(other)
    assert optimizer.loader is loader
    assert engine.steps == 0 and engine.accountant.is_empty

    epoch(model, optimizer, loader)
    assert engine.steps == 20
    assert engine.accountant.composed == ((PoissonSampled(Gaussian(1.0), 0.05), 20),)
    reference = poisson_gaussian_epsilon(0.05, 1.0, 20, DELTA)
    assert engine.epsilon(DELTA) == pytest.approx(reference, rel=2e-2)


def test_reshuffling_epochs_come_from_the_accounted_loader_and_are_each_charged() -> None:
    """A loader re-created every epoch and attached (5 epochs under a ledger of 1, epsilon
    4.38 reported for 11.48) is refused; iterating the returned loader for 5 epochs uses every
    record once per epoch and charges 5 epochs: the exact Gaussian with mu = sqrt(5) / sigma."""
    engine, model, optimizer, loader = private(ShuffledDataLoader(dataset(100), batch_size=20,
                                                                  seed=1))
    with pytest.raises(RuntimeError, match="attach_loader refused"):
        optimizer.attach_loader(ShuffledDataLoader(dataset(100), batch_size=20, seed=10))
    orders = []
    for number in range(5):
        batches = epoch(model, optimizer, loader)
        used = collections.Counter(i for batch in batches for i in batch)
        assert sorted(used) == list(range(100)) and set(used.values()) == {1}
        assert loader.epoch == number + 1
        orders.append([i for batch in batches for i in batch])
    assert len({tuple(order) for order in orders}) == 5  # a fresh permutation every epoch
    assert engine.steps == 25
    assert engine.accountant.composed == ((Shuffled(Gaussian(1.0), 20, 100), 5),)
    exact = exact_epsilon_bisect(DELTA, math.sqrt(5) / 1.0)
    assert exact == pytest.approx(11.48, abs=5e-3)
    assert exact <= engine.epsilon(DELTA) <= exact * (1 + 1e-2)


@pytest.mark.peers
def test_replacing_the_engines_loader_is_refused_at_the_next_release() -> None:
    """engine.loader replaced by a q = 0.01 loader while the attached q = 0.5 loader is
    iterated used to charge PoissonSampled(Gaussian(1), 0.01) for q = 0.5 draws (epsilon 0.25
    reported for 2 steps). Nothing is released until the accounted loader is back."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.5,
                                                                 seed=1))
    engine.loader = PoissonDataLoader(dataset(100), sample_rate=0.01, seed=3)
    batches = iter(loader)
    x, _ = next(batches)
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match="was engine.loader replaced"):
        optimizer.step()
    assert optimizer.releases == 0 and engine.accountant.is_empty
    engine.loader = loader
    optimizer.step()
    optimizer.zero_grad()
    release(model, optimizer, next(batches))
    assert engine.accountant.composed == ((PoissonSampled(Gaussian(1.0), 0.5), 2),)
    reference = poisson_gaussian_epsilon(0.5, 1.0, 2, DELTA)
    assert engine.epsilon(DELTA) == pytest.approx(reference, rel=2e-2)


def test_reattaching_the_accounted_loader_keeps_the_pending_batch() -> None:
    """Re-attaching the same loader used to forget a drawn, unreleased batch, so the next one
    could be drawn without releasing it: a skipped (possibly data-dependent) release."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.2,
                                                                 seed=1))
    iterator = iter(loader)
    next(iterator)
    optimizer.attach_loader(loader)  # no-op
    with pytest.raises(RuntimeError, match="new logical batch was drawn before"):
        next(iterator)


def test_an_optimizer_without_an_engine_can_still_change_loaders() -> None:
    model = nn.Linear(4, 2)
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                            max_grad_norm=1.0, expected_batch_size=10.0, module=model, seed=0)
    first = ShuffledDataLoader(dataset(40), batch_size=10, seed=1)
    second = ShuffledDataLoader(dataset(40), batch_size=10, seed=2)
    optimizer.attach_loader(first)
    assert not optimizer.accounted
    release(model, optimizer, next(iter(first)))
    optimizer.attach_loader(second)
    assert optimizer.loader is second
    assert len(epoch(model, optimizer, second)) == 4
    assert optimizer.releases == 5


# --------------------------------------------------------------------- loader rewinds
def test_a_reshuffled_epoch_cannot_be_replayed_by_restoring_the_loader() -> None:
    """A state saved before training, restored after each epoch, used every record 3 times
    under a ledger of one epoch (1.99 reported, 3.71 true). Refused; three epochs of the same
    loader are charged as three: mu = sqrt(3) / 2."""
    engine, model, optimizer, loader = private(ShuffledDataLoader(dataset(40), batch_size=10,
                                                                  seed=1), sigma=2.0)
    initial = loader.state_dict()
    first = epoch(model, optimizer, loader)
    with pytest.raises(RuntimeError, match="load_state_dict refused.*drawn 4 logical batches"):
        loader.load_state_dict(initial)
    assert loader.epoch == 1 and loader.position == 4  # nothing was loaded
    second, third = epoch(model, optimizer, loader), epoch(model, optimizer, loader)
    assert first != second != third
    assert engine.accountant.composed == ((Shuffled(Gaussian(2.0), 10, 40), 3),)
    exact = exact_epsilon_bisect(DELTA, math.sqrt(3) / 2.0)
    assert exact == pytest.approx(3.7086, abs=5e-4)
    assert exact <= engine.epsilon(DELTA) <= exact * (1 + 1e-2)


def test_the_position_cannot_be_moved_back_mid_epoch() -> None:
    """position edited back to 0 in a state of this epoch would re-release 20 of 40 records
    in an epoch charged once."""
    engine, model, optimizer, loader = private(ShuffledDataLoader(dataset(40), batch_size=10,
                                                                  seed=1), sigma=2.0)
    iterator = iter(loader)
    used = [release(model, optimizer, next(iterator)) for _ in range(2)]
    rewound = dict(loader.state_dict(), position=0)
    with pytest.raises(RuntimeError, match="load_state_dict refused"):
        loader.load_state_dict(rewound)
    used += [release(model, optimizer, batch) for batch in loader]
    counts = collections.Counter(i for batch in used for i in batch)
    assert sorted(counts) == list(range(40)) and set(counts.values()) == {1}
    assert engine.accountant.composed == ((Shuffled(Gaussian(2.0), 10, 40), 1),)


@pytest.mark.peers
def test_poisson_masks_cannot_be_replayed() -> None:
    """The seeded sampler restored to its start replayed all 20 masks, each charged as an
    independent draw (2.47 reported; masks used twice are PoissonSampled(Gaussian(1/sqrt2))
    x 20, epsilon 4.54). Refused; a second pass draws new masks and is charged as 20 more."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.05,
                                                                 seed=1))
    initial = loader.state_dict()
    first = epoch(model, optimizer, loader)
    with pytest.raises(RuntimeError, match="load_state_dict refused"):
        loader.load_state_dict(initial)
    second = epoch(model, optimizer, loader)
    assert sum(a == b for a, b in zip(first, second)) < 10  # fresh masks (mostly non-empty)
    assert engine.accountant.composed == ((PoissonSampled(Gaussian(1.0), 0.05), 40),)
    reference = poisson_gaussian_epsilon(0.05, 1.0, 40, DELTA)
    assert engine.epsilon(DELTA) == pytest.approx(reference, rel=2e-2)


def test_a_fresh_loader_resumes_and_then_refuses() -> None:
    """Resuming is for a loader that has drawn nothing (loading twice before drawing is fine);
    it continues exactly where the checkpointed loader stopped."""
    source = PoissonDataLoader(dataset(50), sample_rate=0.1, seed=4)
    iterator = iter(source)
    for _ in range(3):
        next(iterator)
    state = source.state_dict()
    expected = [batch[1].tolist() for batch in source]
    resumed = PoissonDataLoader(dataset(50), sample_rate=0.1, seed=99)
    resumed.load_state_dict(state)
    resumed.load_state_dict(state)
    assert [batch[1].tolist() for batch in resumed] == expected
    with pytest.raises(RuntimeError, match="load_state_dict refused"):
        resumed.load_state_dict(state)


def test_the_optimizer_refuses_a_draw_count_that_went_back() -> None:
    """A second guard, in the optimizer: every batch it releases must raise the loader's draw
    count. Reached here only by resetting a private counter (the public path is refused)."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.2,
                                                                 seed=1))
    initial = loader.state_dict()
    epoch(model, optimizer, loader)
    loader._drawn_here = 0
    loader.load_state_dict(initial)
    with pytest.raises(RuntimeError, match="draw count went back from 5 to 1"):
        next(iter(loader))
    assert engine.steps == 5


# ---------------------------------------------------------------- sampling parameters
@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: ShuffledDataLoader(dataset(40), batch_size=20, seed=1), "batch_size"),
        (lambda: WithoutReplacementDataLoader(dataset(40), batch_size=20, seed=1), "batch_size"),
        (lambda: ShuffledDataLoader(dataset(40), batch_size=20, seed=1), "dataset_size"),
        (lambda: PoissonDataLoader(dataset(40), sample_rate=0.2, seed=1), "dataset_size"),
        (lambda: PoissonDataLoader(dataset(40), sample_rate=0.2, seed=1), "dataset"),
        (lambda: PoissonDataLoader(dataset(40), sample_rate=0.2, seed=1), "sample_rate"),
    ],
)
def test_sampling_parameters_are_read_only(make, name: str) -> None:
    loader = make()
    before = getattr(loader, name)
    with pytest.raises(AttributeError):
        setattr(loader, name, dataset(10) if name == "dataset" else 10)
    assert getattr(loader, name) is before


def test_lowering_the_batch_size_mid_epoch_is_refused() -> None:
    """batch_size 20 -> 10 after the first batch re-sliced the epoch's permutation at
    position * 10, releasing 10 of 40 records twice in an epoch charged once."""
    engine, model, optimizer, loader = private(ShuffledDataLoader(dataset(40), batch_size=20,
                                                                  seed=1), sigma=2.0)
    used = []
    for number, batch in enumerate(loader):
        used.append(release(model, optimizer, batch))
        if number == 0:
            with pytest.raises(AttributeError, match="batch_size is fixed.*make_private"):
                loader.batch_size = 10
    counts = collections.Counter(i for batch in used for i in batch)
    assert sorted(counts) == list(range(40)) and set(counts.values()) == {1}
    assert engine.accountant.composed == ((Shuffled(Gaussian(2.0), 20, 40), 1),)


# ------------------------------------------------------------------------ max_grad_norm
def test_setting_max_grad_norm_moves_the_clipping_bound() -> None:
    """optimizer.max_grad_norm = 100 used to change nothing (the clipper kept C = 1). Now the
    per-example gradients x_i (loss x_i . w, norms 10..40 < 100) pass unclipped: with no
    noise the release is sum_i x_i / B, computed here without the clipper."""
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    x = x / x.norm(dim=1, keepdim=True) * torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    model = nn.Linear(3, 1, bias=False)
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
                            max_grad_norm=1.0, expected_batch_size=4.0, module=model,
                            loss_reduction="sum", seed=0)
    optimizer.max_grad_norm = 100.0
    assert optimizer.max_grad_norm == 100.0 and optimizer.clipper.max_grad_norm == 100.0
    model(x).sum().backward()
    optimizer.step()
    torch.testing.assert_close(model.weight.grad, x.sum(0, keepdim=True) / 4.0,
                               rtol=1e-6, atol=1e-6)


def test_the_noise_scales_with_the_new_bound() -> None:
    """Zero gradients, sigma = 1, C set to 100: the released p.grad is N(0, (sigma C / B)^2)
    per coordinate, std 25 for B = 4 (chi-square 99.9% band for 2000 coordinates)."""
    model = nn.Linear(2000, 1, bias=False)
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                            max_grad_norm=1.0, expected_batch_size=4.0, module=model, seed=3)
    optimizer.max_grad_norm = 100.0
    (model(torch.zeros(4, 2000)) * 0.0).sum().backward()
    optimizer.step()
    values = model.weight.grad.double().flatten()
    k = values.numel()
    statistic = float((values**2).sum() / 25.0**2)
    assert stats.chi2.ppf(5e-4, k) < statistic < stats.chi2.ppf(1 - 5e-4, k)


def test_max_grad_norm_under_an_engine_leaves_the_accounting_alone() -> None:
    """sigma = noise std / C is what a release's privacy depends on: the ledger is unchanged
    and the change is not an adaptive choice of noise."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.1,
                                                                 seed=1))
    batches = iter(loader)
    release(model, optimizer, next(batches))
    optimizer.max_grad_norm = 5.0
    assert optimizer.clipper.max_grad_norm == 5.0 and optimizer.clipper.overall_bound == 5.0
    release(model, optimizer, next(batches))
    assert not optimizer.noise_chosen_online
    assert engine.accountant.composed == ((PoissonSampled(Gaussian(1.0), 0.1), 2),)


def test_max_grad_norm_refusals() -> None:
    model = nn.Linear(3, 1)
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                            max_grad_norm=1.0, expected_batch_size=4.0, module=model, seed=0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        optimizer.max_grad_norm = -1.0
    model(torch.randn(4, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="between releases"):
        optimizer.max_grad_norm = 2.0  # mid-lot: the lot was clipped at 1
    assert optimizer.max_grad_norm == 1.0

    layered = nn.Linear(3, 1)
    per_layer = DPOptimizer(torch.optim.SGD(layered.parameters(), lr=0.1), noise_multiplier=1.0,
                            max_grad_norm=[1.0, 1.0], clipping="per_layer",
                            expected_batch_size=4.0, module=layered, seed=0)
    with pytest.raises(ValueError, match="only for flat clipping"):
        per_layer.max_grad_norm = 2.0

    adaptive_model = nn.Linear(3, 1)
    adaptive = DPOptimizer(torch.optim.SGD(adaptive_model.parameters(), lr=0.1),
                           noise_multiplier=1.0, max_grad_norm=1.0, clipping="adaptive",
                           expected_batch_size=40.0, module=adaptive_model, seed=0)
    with pytest.raises(RuntimeError, match="adaptive clipping rule"):
        adaptive.max_grad_norm = 2.0


def test_an_optimizer_that_released_refuses_a_checkpoint_under_an_engine() -> None:
    """Loading a checkpoint into an optimizer that has released in this process rewound its
    noise stream (the next releases would repeat noise already released); the engine then
    refused everything after. Now the load itself is refused and nothing changes; the wrapped
    torch optimizer's state still loads."""
    engine, model, optimizer, loader = private(PoissonDataLoader(dataset(100), sample_rate=0.2,
                                                                 seed=3))
    batches = iter(loader)
    release(model, optimizer, next(batches))
    saved = optimizer.state_dict()
    release(model, optimizer, next(batches))
    noise = optimizer.noise.state_dict()
    refusal = "load_state_dict refused: this optimizer has released 2"
    with pytest.raises(RuntimeError, match=refusal):
        optimizer.load_state_dict(saved)
    assert optimizer.releases == 2 and optimizer.noise.state_dict() == noise
    optimizer.original_optimizer.load_state_dict(
        {k: v for k, v in saved.items() if k != "dpsharp"})
    release(model, optimizer, next(batches))
    assert engine.steps == optimizer.releases == 3
