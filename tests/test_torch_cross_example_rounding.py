"""One example's cancelling positions must not round another example's contribution.

A linear layer's clipped sum on sequences is one matrix product over the rows of every
example. An example whose two positions cancel (a_1 g_1^T = -a_2 g_2^T, large) has a small
gradient but large rows: its clip factor is set by the round-off slack of its norm, and its
scaled rows reach about C / kappa. Accumulated in float32, every other example's part added to
running sums of that size was rounded to their spacing: one ordinary example moved the release
by 1.010 C. The sensitivity is measured against the definition: the change of the noiseless
release when the ordinary example is removed.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402
from dpsharp.torch.layers import usages  # noqa: E402

pytestmark = pytest.mark.torch


def _release(layer: nn.Linear, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    layer.weight.grad = None
    clipper = PerSampleClipper(layer, max_grad_norm=1.0, loss_reduction="sum")
    try:
        (layer(a) * g).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        return layer.weight.grad.double().clone()
    finally:
        clipper.remove()


@pytest.mark.parametrize("width", [8, 256])
def test_a_cancelling_example_does_not_round_an_ordinary_one(width: int, monkeypatch) -> None:
    # the Gram route (a product over all rows), whatever the cost rule would choose
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: False)
    layer = nn.Linear(width, width, bias=False)
    worst = 0.0
    for k in range(32, 128):
        magnitude = 10.0 ** (k / 16)
        a = torch.zeros(2, 2, width)
        g = torch.zeros(2, 2, width)
        # the ordinary example: gradient 3 (0.95 e0 e0^T + 0.312 e1 e1^T), clipped to C = 1
        a[0, 0, 0], g[0, 0, 0] = 1.0, 3 * 0.95
        a[0, 1, 1], g[0, 1, 1] = 1.0, 3 * math.sqrt(1 - 0.95**2)
        # the cancelling one: two positions whose products cancel exactly
        a[1, 0, 0], g[1, 0, 0] = magnitude, magnitude
        a[1, 1, 0], g[1, 1, 0] = magnitude, -magnitude
        both = _release(layer, a, g)
        alone = _release(layer, a[1:], g[1:])
        worst = max(worst, float((both - alone).norm()))
    assert worst <= 1.0 + 1e-6
    assert worst > 0.99  # the ordinary example is clipped to C: that is what is measured


class _TiedLanguageModel(nn.Module):
    """An embedding tied to its output layer, the two uses fed separately."""

    def __init__(self, vocabulary: int, width: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor):
        return self.embedding(tokens), self.head(hidden)


@pytest.mark.parametrize(("adversaries", "tolerance"), [(1, 1e-6), (32, 1e-4)])
def test_examples_whose_tied_uses_cancel_do_not_round_an_ordinary_one(
        adversaries: int, tolerance: float) -> None:
    # Each adversarial example's embedding use and head use cancel (tied gradient 0), so its
    # clip factor came from the round-off slack alone and each use's part was about 1.6e6 C:
    # the ordinary example's part of the head's batch sum was rounded to that spacing (1.048 C
    # beside one such example, 32 C beside 128). The norm of a tied parameter is now at least
    # sum_u ||g^u|| / 4; what remains is the float32 rounding of sums of parts of a few C.
    vocabulary, width = 8, 4
    model = _TiedLanguageModel(vocabulary, width)
    batch = 1 + adversaries

    def release(rows: list[int], tokens, embedding_grads, hidden, head_grads) -> torch.Tensor:
        model.embedding.weight.grad = None
        clipper = PerSampleClipper(model, max_grad_norm=1.0, loss_reduction="sum")
        try:
            e, h = model(tokens[rows], hidden[rows])
            ((e * embedding_grads[rows]).sum() + (h * head_grads[rows]).sum()).backward()
            clipper.release(noise_multiplier=0.0, expected_batch_size=1.0,
                            noise=NoiseGenerator(0))
            return model.embedding.weight.grad.double().clone()
        finally:
            clipper.remove()

    worst = 0.0
    for k in range(384, 800, 16):
        m = math.sqrt(10.0 ** (k / 64))
        tokens = torch.zeros(batch, 1, dtype=torch.long)
        embedding_grads = torch.zeros(batch, 1, width)
        hidden = torch.zeros(batch, 1, width)
        head_grads = torch.zeros(batch, 1, vocabulary)
        # the ordinary example (first): head gradient 3 (0.95 e0 e0^T + 0.312 e1 e0^T)
        hidden[0, 0, 0] = 1.0
        head_grads[0, 0, 0], head_grads[0, 0, 1] = 3 * 0.95, 3 * math.sqrt(1 - 0.95**2)
        for j in range(1, batch):
            mj = m * (1 + 0.001 * j)
            embedding_grads[j, 0, 0] = mj * mj  # row 0 looked up: + mj^2 e0 e0^T
            hidden[j, 0, 0], head_grads[j, 0, 0] = mj, -mj  # the head: - mj^2 e0 e0^T
        data = (tokens, embedding_grads, hidden, head_grads)
        both = release(list(range(batch)), *data)
        without = release(list(range(1, batch)), *data)
        worst = max(worst, float((both - without).norm()))
    assert worst <= 1.0 + tolerance
    assert worst > 0.99


def test_a_convolution_keeps_each_example_in_its_own_product(monkeypatch) -> None:
    # The convolution's Gram route formed its clipped sum by one float32 weight-gradient
    # convolution per block of examples: nineteen examples whose first and last positions
    # cancel rounded the ordinary example's part of the same block (1.0006 C).
    monkeypatch.setattr(usages.ConvUsage, "_materialise_weight", lambda self: False)
    positions, width, batch, magnitude = 200, 8, 20, 316.0
    conv = nn.Conv1d(width, width, 1, bias=False)
    x = torch.zeros(batch, width, positions)
    g = torch.zeros(batch, width, positions)
    # the ordinary example: gradient 3 (0.8 e00 + 0.6 e11), clipped to C = 1
    x[0, 0, 0], g[0, 0, 0] = 1.0, 3 * 0.8
    x[0, 1, 1], g[0, 1, 1] = 1.0, 3 * 0.6
    for j in range(1, batch):
        s = magnitude * (1 + 0.001 * (j - 1))
        x[j, 0, 0], g[j, 0, 0] = s, s
        x[j, 0, -1], g[j, 0, -1] = s, -s

    def release(rows: list[int]) -> torch.Tensor:
        conv.weight.grad = None
        clipper = PerSampleClipper(conv, max_grad_norm=1.0, loss_reduction="sum")
        try:
            (conv(x[rows]) * g[rows]).sum().backward()
            clipper.release(noise_multiplier=0.0, expected_batch_size=1.0,
                            noise=NoiseGenerator(0))
            return conv.weight.grad.double().clone()
        finally:
            clipper.remove()

    moved = float((release(list(range(batch))) - release(list(range(1, batch)))).norm())
    assert 0.99 < moved <= 1.0 + 1e-6


def _noise_base_of_bias(n: int, dtype: torch.dtype, monkeypatch) -> float:
    """The value the release adds the noise to for the bias of a Linear(1, 1) of ``dtype``
    after a batch of ``n`` examples whose bias gradients all point the same way (1000 each,
    clipped to C = 1): what the Gaussian mechanism's sensitivity is about."""
    from dpsharp.torch import clipper as clipper_module

    seen: dict[str, object] = {}
    release_noise = clipper_module.kernels.release_noise

    def spy(outs, bases, **options):
        seen["bases"] = [None if b is None else b.detach().double().clone() for b in bases]
        seen["parameters"] = list(options["parameters"])
        return release_noise(outs, bases, **options)

    monkeypatch.setattr(clipper_module.kernels, "release_noise", spy)
    layer = nn.Linear(1, 1).to(dtype)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    clipper = PerSampleClipper(layer, max_grad_norm=1.0, loss_reduction="sum")
    try:
        (layer(torch.zeros(n, 1, dtype=dtype)).sum() * 1000.0).backward()
        clipper.release(noise_multiplier=1.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        assert layer.bias.grad.dtype == dtype
        index = next(k for k, p in enumerate(clipper.parameters) if p is layer.bias)
        return float(seen["bases"][seen["parameters"].index(index)])
    finally:
        clipper.remove()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_summed_gradient_is_not_rounded_to_half_precision_before_the_noise(
        dtype, monkeypatch) -> None:
    """Removing one of about 1,000 aligned examples (sensitivity C = 1 by definition) must
    move the value the noise is added to by at most C (1 + 1e-6). A bfloat16 sum of 1,000
    has a spacing of 8: rounded before the noise it moved by up to 8 C. The sum is
    accumulated in float32 and rounded to bfloat16 once, after the noise."""
    worst = 0.0
    for n in range(1030, 1050):
        worst = max(worst, abs(_noise_base_of_bias(n, dtype, monkeypatch)
                               - _noise_base_of_bias(n - 1, dtype, monkeypatch)))
    assert 0.98 < worst <= 1.0 + 1e-6
