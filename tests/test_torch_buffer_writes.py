"""Buffers written by the training forward are refused.

The released model carries its buffers without noise. A module that stores statistics of its
inputs in a buffer (a running maximum, a quantisation observer's min/max) copies data into the
released state_dict: one record's secret feature value appeared there verbatim. The clipper
watches every buffer and refuses a backward pass after a forward that wrote one.
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dpsharp.torch import NoiseGenerator, PerSampleClipper, PrivacyEngine  # noqa: E402
from dpsharp.torch.buffers import BufferWatch  # noqa: E402

pytestmark = pytest.mark.torch


class RunningMax(nn.Module):
    """Keeps the largest input seen per feature: data copied into a buffer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("seen_max", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen_max = torch.maximum(self.seen_max, x.detach().amax(0))
        return x


class InPlaceRunningMax(RunningMax):
    """The same statistic written through ``.data``, which autograd's version counter misses."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen_max.data.copy_(torch.maximum(self.seen_max, x.detach().amax(0)))
        return x


@pytest.mark.parametrize("statistic", [RunningMax, InPlaceRunningMax])
def test_a_running_statistic_is_refused_before_anything_is_released(statistic) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(statistic(4), nn.Linear(4, 1))
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    x = torch.randn(8, 4)
    x[3, 2] = 123.456
    with pytest.raises(RuntimeError, match=r"buffers \['0.seen_max'\] were written"):
        model(x).sum().backward()
    # the release of the refused batch is refused as a whole (a failed pass); dropped with
    # reset(), a noiseless release carries nothing of it
    with pytest.raises(RuntimeError, match="backward pass of this release failed"):
        clipper.release(noise_multiplier=0.0, expected_batch_size=8.0, noise=NoiseGenerator(0))
    clipper.reset()
    clipper.release(noise_multiplier=0.0, expected_batch_size=8.0, noise=NoiseGenerator(0))
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    clipper.remove()


def test_a_quantisation_observer_is_refused_under_the_engine() -> None:
    torch.manual_seed(0)
    observer = torch.ao.quantization.FakeQuantize(
        observer=torch.ao.quantization.MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    model = nn.Sequential(observer, nn.Linear(4, 1))
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    # The observer's scale follows the batch's range, so the first-batch probe refuses the
    # model as mixing examples (in its training mode); without the probe, the observer's
    # buffer writes are refused at the backward pass.
    for probe, error, match in ((True, ValueError, "mixes examples"),
                                (False, RuntimeError, "activation_post_process")):
        engine, fresh = PrivacyEngine(), copy.deepcopy(model)
        private_model, optimizer, private_loader = engine.make_private(
            fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), loader,
            max_grad_norm=1.0, noise_multiplier=5.0, delta=1e-5, seed=0, batch_probe=probe)
        xb, yb = next(iter(private_loader))
        with pytest.raises(error, match=match):
            ((private_model(xb) - yb) ** 2).mean().backward()
        assert engine.accountant.is_empty


class CallCounter(nn.Module):
    """Counts its training forwards in a buffer: written every step, but no data in it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
        return x


def test_a_buffer_without_data_can_be_declared_public() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(CallCounter(), nn.Linear(4, 1))
    x = torch.randn(8, 4)
    watched = PerSampleClipper(model, max_grad_norm=1.0)
    with pytest.raises(RuntimeError, match=r"\['0.calls'\]"):
        model(x).sum().backward()
    watched.remove()
    for p in model.parameters():
        p.grad = None
    clipper = PerSampleClipper(model, max_grad_norm=1.0, public_buffers=["0.calls"])
    model(x).sum().backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=8.0, noise=NoiseGenerator(0))
    assert model[1].weight.grad is not None and model[1].weight.grad.any()
    clipper.remove()


def test_constant_buffers_and_moves_between_dtypes_are_accepted() -> None:
    class Shifted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("offset", torch.tensor([0.5, float("nan"), -1.0, 2.0]))
            self.linear = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x + torch.nan_to_num(self.offset))

    model = Shifted()
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    model.double()  # the buffer is replaced by a converted copy of the same values
    x = torch.randn(8, 4, dtype=torch.float64)
    model(x).sum().backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=8.0, noise=NoiseGenerator(0))
    assert torch.isfinite(model.linear.weight.grad).all()
    clipper.remove()


def test_public_buffers_are_checked() -> None:
    model = nn.Sequential(RunningMax(4), nn.Linear(4, 1))
    with pytest.raises(ValueError, match="not buffers of the model"):
        BufferWatch(model, ["0.seen_min"])
    with pytest.raises(TypeError, match="not one str"):
        BufferWatch(model, "0.seen_max")
    assert BufferWatch(model, ["0.seen_max"]).changed() == []


def test_make_private_passes_public_buffers_to_its_clipper() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(CallCounter(), nn.Linear(4, 1))
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader, max_grad_norm=1.0,
        noise_multiplier=1.0, delta=1e-5, seed=0, public_buffers=["0.calls"])
    for xb, yb in loader:
        ((model(xb) - yb) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert optimizer.releases >= 1
    assert int(model[0].calls) >= optimizer.releases
