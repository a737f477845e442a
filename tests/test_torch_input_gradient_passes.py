"""Backward passes that compute no parameter gradient are not micro-batches.

Adversarial training (FGSM, PGD), input-gradient penalties and saliency maps take
``torch.autograd.grad(loss, inputs)``. That pass runs the model's backward but writes no
``.grad``; if the clipper clipped and counted it, every example would enter the release twice
(2 C per example). The sensitivity is measured against the definition: the largest change of
the noiseless release when one example is removed.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dpsharp.torch import NoiseGenerator, NoisySGD, PerSampleClipper  # noqa: E402

pytestmark = pytest.mark.torch


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 1))


def _fgsm_release(model: nn.Module, x: torch.Tensor, y: torch.Tensor, how: str) -> torch.Tensor:
    """One FGSM-style step with the input gradient taken ``how``; the noiseless release."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = NoisySGD(model, lr=1.0, noise_multiplier=0.0, max_grad_norm=1.0,
                         expected_batch_size=1.0, loss_reduction="sum")
    try:
        x = x.clone().requires_grad_(True)
        loss = ((model(x) - y) ** 2).sum() * 100
        if how == "grad":
            (gx,) = torch.autograd.grad(loss, x)
        else:  # backward restricted to the input
            loss.backward(inputs=[x])
            gx = x.grad
        x_adv = (x + 0.01 * gx.sign()).detach()
        ((model(x_adv) - y) ** 2).sum().mul(100).backward()
        assert optimizer.clipper.accumulated_batches == 1
        assert optimizer.clipper.accumulated_examples == x.shape[0]
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        # lr = 1: the parameter change is the released gradient
        return torch.cat([(b - p.detach()).double().reshape(-1)
                          for b, p in zip(before, model.parameters())])
    finally:
        optimizer.clipper.remove()
        model.load_state_dict(state)


@pytest.mark.parametrize("how", ["grad", "backward_inputs"])
def test_an_input_gradient_pass_adds_nothing(how: str) -> None:
    model = _model()
    x, y = torch.randn(4, 5) * 3, torch.randn(4, 1)
    full = _fgsm_release(model, x, y, how)
    worst = 0.0
    for j in range(4):
        keep = [i for i in range(4) if i != j]
        worst = max(worst, float((full - _fgsm_release(model, x[keep], y[keep], how)).norm()))
    assert worst <= 1.0 + 1e-6
    assert worst > 0.5  # the examples are clipped at C = 1: one of them moves the release


def test_a_backward_restricted_to_some_parameters_counts_only_their_layers() -> None:
    model = _model()
    clipper = PerSampleClipper(model, max_grad_norm=1e6, loss_reduction="sum")
    x = torch.randn(4, 5)
    last = model[2]
    model(x).sum().backward(inputs=[last.weight, last.bias])
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    # the first layer took no part in that pass: nothing of it is released
    assert not model[0].weight.grad.any()
    expected = torch.tanh(model[0](x)).sum(0)
    torch.testing.assert_close(last.weight.grad[0], expected.detach(), rtol=1e-5, atol=1e-6)
    clipper.remove()
