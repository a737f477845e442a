"""A clipped parameter used outside its layer is refused, not silently dropped.

The clipper writes each clipped parameter's gradient at the release, from its patched layer's
per-example gradients. A functional use of the same parameter (``F.linear(x, layer.weight)``)
would add a gradient that is neither clipped nor released: the released gradient would be
wrong (51% off in the measured case) with no error.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = nn.functional

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402

pytestmark = pytest.mark.torch


class FunctionalUse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 5)
        self.out = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lin(x) + 5 * F.linear(x, self.lin.weight))


def test_a_functional_use_of_a_clipped_weight_is_refused() -> None:
    torch.manual_seed(0)
    model = FunctionalUse()
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with pytest.raises(RuntimeError, match="'lin.weight' received a gradient outside its layer"):
        model(torch.randn(4, 5)).pow(2).sum().backward()
    clipper.remove()
    # without the clipper the same model trains as plain PyTorch
    model(torch.randn(4, 5)).pow(2).sum().backward()
    assert model.lin.weight.grad is not None


def test_the_layers_own_calls_are_accepted_and_released_exactly() -> None:
    # C large enough that nothing is clipped: the release is the plain gradient
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    x = torch.randn(4, 5, dtype=torch.float64)
    model(x).pow(2).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    clipper = PerSampleClipper(model, max_grad_norm=1e9, loss_reduction="sum")
    model(x).pow(2).sum().backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    for p, expected in zip(model.parameters(), plain):
        torch.testing.assert_close(p.grad, expected, rtol=1e-12, atol=1e-12)
    clipper.remove()


def test_the_clipper_works_on_after_a_refused_pass() -> None:
    # The refused pass is dropped whole, and so is the release it belonged to (releasing the
    # other passes would depend on the refused examples' data) until reset(); then the next
    # passes are clipped and released as usual.
    torch.manual_seed(0)
    model = FunctionalUse()
    clipper = PerSampleClipper(model, max_grad_norm=1e9, loss_reduction="sum")
    with pytest.raises(RuntimeError, match="outside its layer"):
        model(torch.randn(4, 5)).pow(2).sum().backward()
    x = torch.randn(4, 5)
    model.out(model.lin(x)).pow(2).sum().backward()
    with pytest.raises(RuntimeError, match="backward pass of this release failed"):
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    clipper.reset()
    model.out(model.lin(x)).pow(2).sum().backward()
    assert clipper.accumulated_batches == 1
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    released = model.lin.weight.grad.clone()
    clipper.remove()
    for p in model.parameters():
        p.grad = None
    model.out(model.lin(x)).pow(2).sum().backward()
    torch.testing.assert_close(released, model.lin.weight.grad, rtol=1e-5, atol=1e-6)


def test_a_backward_pass_that_fails_midway_is_dropped_and_training_goes_on() -> None:
    # An exception inside a backward pass (here a hook on an activation; out of memory in
    # practice) skips the pass's end-of-pass step. Its release is refused until reset(); the
    # next pass must be clipped as usual.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 1))
    clipper = PerSampleClipper(model, max_grad_norm=1e9, loss_reduction="sum")
    hidden = model[1](model[0](torch.randn(4, 5)))
    hidden.register_hook(lambda grad: (_ for _ in ()).throw(MemoryError("simulated")))
    with pytest.raises(MemoryError):
        model[2](hidden).pow(2).sum().backward()
    x = torch.randn(4, 5)
    model(x).pow(2).sum().backward()
    with pytest.raises(RuntimeError, match="backward pass of this release failed"):
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    clipper.reset()
    model(x).pow(2).sum().backward()
    assert clipper.accumulated_batches == 1
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    released = [p.grad.clone() for p in model.parameters()]
    clipper.remove()
    for p in model.parameters():
        p.grad = None
    model(x).pow(2).sum().backward()
    for got, p in zip(released, model.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-6)
