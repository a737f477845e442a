"""What the clipper and the optimizer know about a release stays true when the model changes
dtype after them, or when a step raises after its noisy gradient was written."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dpsharp.torch import NoiseGenerator, PerSampleClipper, PrivacyEngine  # noqa: E402
from dpsharp.torch.clipping import AdaptiveQuantileClipping  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_cast_to_bfloat16_after_the_clipper_keeps_the_bound() -> None:
    # bfloat16 parameters get clip factors lowered by 1 / (1 + 4 2^-8) for the roundings of
    # their sum, gradient and noise; a model cast after the clipper was built must get it too
    torch.manual_seed(0)
    worst = 0.0
    for _ in range(200):
        norm = nn.LayerNorm(16)
        with torch.no_grad():
            norm.weight.normal_()
            norm.bias.normal_()
        x, g = torch.randn(1, 16), torch.randn(1, 16) * 10
        clipper = PerSampleClipper(norm, max_grad_norm=1.0, loss_reduction="sum")
        norm.to(torch.bfloat16)
        (norm(x.to(torch.bfloat16)).float() * g).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        released = torch.cat([p.grad.double().reshape(-1) for p in clipper.parameters])
        worst = max(worst, float(released.norm()))
        clipper.remove()
    assert worst <= 1.0 + 1e-6
    assert worst > 0.9  # the examples are clipped: the bound is what is measured


def test_a_step_that_raises_after_its_release_counts_that_release() -> None:
    # An adaptive clipping rule whose bound update overflows (a huge learning rate) raises after
    # the noisy gradient is in p.grad. The release must count as done and be charged: retrying
    # the same lot is refused rather than released a second time without a charge.
    torch.manual_seed(0)
    x, y = torch.randn(64, 4) * 100, torch.randn(64, 1)
    model = nn.Linear(4, 1)
    engine = PrivacyEngine(accountant="rdp")
    rule = AdaptiveQuantileClipping(target_quantile=0.5, learning_rate=3000.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader, max_grad_norm=1e-3,
        noise_multiplier=1.0, delta=1e-5, clipping=rule, seed=1, batch_probe=False)
    xb, yb = next(iter(loader))
    ((model(xb) - yb) ** 2).mean().backward()
    with pytest.raises((OverflowError, FloatingPointError)):
        optimizer.step()
    assert optimizer.releases == 1
    assert sum(count for _, count in engine.accountant.composed) == 1
    optimizer.zero_grad()
    rule.learning_rate = 0.2
    ((model(xb) - yb) ** 2).mean().backward()
    with pytest.raises(RuntimeError, match="called twice for one batch"):
        optimizer.step()
    assert optimizer.releases == 1
