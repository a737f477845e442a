"""Linear layers whose per-example gradients are materialised form them during the backward pass
and drop their stored input and output gradient there (LinearUsage.materialise_early), against
the float64 batch-size-1 autograd reference (Abadi et al. 2016, Algorithm 1): norms and
clipped sums to 1e-10, every clipped example within C (1 + 1e-6); float32 sums bit for bit
those of materialising at the end of the backward pass."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402
from dpsharp.torch.layers import usages  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def materialise_all(monkeypatch):
    """Every linear layer on sequences takes the materialised route."""
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight",
                        lambda self: int(self.a.shape[1]) > 1)


@pytest.fixture
def stored_at_sum(monkeypatch):
    """For each weight clipped sum of a linear layer: whether its stored input was dropped."""
    seen: list[tuple[int, bool]] = []
    original = usages.LinearUsage.clipped_sum

    def recording(self, p, factors):
        if p is self.weight:
            seen.append((id(p), self.a is None))
        return original(self, p, factors)

    monkeypatch.setattr(usages.LinearUsage, "clipped_sum", recording)
    return seen


def _sum_loss(out, i):
    """The summed loss of the examples in ``out`` (the reference passes one at a time)."""
    return (out ** 2).sum() + out.sum()


class _Twice(nn.Module):
    """One linear layer called on a sequence and on a single position (summed)."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 5, bias=bias)
        self.out = nn.Linear(5, 2)

    def forward(self, x):
        seq = self.inner(x)  # (B, T, 5)
        one = self.inner(x[:, 0])  # (B, 5): one position, never materialised early
        again = self.inner(-0.5 * x)  # a third call, its gradient partly cancelling the first
        return self.out(torch.tanh(seq) + one[:, None] + again)


@pytest.mark.parametrize("bias", [True, False])
def test_materialised_layers_drop_stored_tensors_and_match_reference(materialise_all,
                                                                    stored_at_sum, bias):
    from _clip_reference import check_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6, bias=bias), nn.Tanh(), nn.Linear(6, 4)).double()
    x = torch.randn(5, 7, 3, dtype=torch.float64)
    check_model(model, x, 5, _sum_loss, bound=0.2)
    assert len(stored_at_sum) == 2 and all(dropped for _, dropped in stored_at_sum)


def test_early_materialised_float32_sums_equal_late_ones_bit_for_bit(materialise_all,
                                                                     monkeypatch):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), nn.Tanh(),
                          nn.Linear(8, 3))
    x = torch.randn(6, 9, 8)

    def sums() -> list[torch.Tensor]:
        m = copy.deepcopy(model)
        clipper = PerSampleClipper(m, max_grad_norm=0.1)
        m(x).square().mean().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=6.0, noise=NoiseGenerator(0))
        out = [p.grad.clone() for p in clipper.parameters]
        clipper.remove()
        return out

    early = sums()
    monkeypatch.setattr(usages.LinearUsage, "materialise_early", lambda self, arena: False)
    late = sums()
    assert all(torch.equal(a, b) for a, b in zip(early, late))


@pytest.mark.parametrize("bias", [True, False])
def test_repeated_calls_merge_from_materialised_gradients(materialise_all, stored_at_sum,
                                                          bias):
    """Three calls of one layer (two on sequences, materialised early, one on a single
    position, not), the third partly cancelling the first: the merged per-example gradient
    is the sum of the three, as in the reference."""
    from _clip_reference import check_model

    torch.manual_seed(2)
    model = _Twice(bias).double()
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    check_model(model, x, 4, _sum_loss, bound=0.3)
    inner = id(model.inner.weight)
    assert [dropped for pid, dropped in stored_at_sum if pid == inner] == [True]


def test_tied_weights_keep_their_stored_tensors(materialise_all, stored_at_sum):
    """Two linear layers sharing one weight (their cross terms read the stored tensors) are
    not materialised early; norms and sums still match the reference."""
    from _clip_reference import check_model

    torch.manual_seed(3)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    model = nn.Sequential(first, nn.Tanh(), second, nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 6, 4, dtype=torch.float64)
    check_model(model, x, 5, _sum_loss, bound=0.25)
    shared = id(first.weight)
    assert stored_at_sum and not any(dropped for pid, dropped in stored_at_sum
                                     if pid == shared)


def test_accumulated_passes_and_two_clippers_in_one_backward(materialise_all):
    """Two clippers whose backward passes interleave (one loss over two models) share the
    early arena without reusing each other's memory, and two backward passes accumulate:
    every clipped sum equals the reference summed over both batches."""
    from _clip_reference import clipped_sums, per_example_grads

    torch.manual_seed(4)
    models = [nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
              for _ in range(2)]
    batches = [torch.randn(4, 6, 3, dtype=torch.float64) for _ in range(2)]
    bound = 0.2
    want: list[list[torch.Tensor]] = []
    for model in models:
        total = None
        for x in batches:
            _, sums = clipped_sums(per_example_grads(model, x, 4, _sum_loss), bound)
            total = sums if total is None else [a + b for a, b in zip(total, sums)]
        want.append(total)
    clippers = [PerSampleClipper(m, max_grad_norm=bound, loss_reduction="sum")
                for m in models]
    for x in batches:
        (_sum_loss(models[0](x), slice(None)) + _sum_loss(models[1](x), slice(None))).backward()
    for clipper, expected in zip(clippers, want):
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        for p, w in zip(clipper.parameters, expected):
            assert torch.allclose(p.grad, w, rtol=0, atol=1e-10), (p.grad - w).abs().max()


def test_per_layer_clipping_of_early_materialised_layers(materialise_all, stored_at_sum):
    """Per-layer clipping (Abadi et al. 2016, section 3.1; C_l = C / sqrt(L)): each parameter's
    clipped sum equals sum_i min(1, C_l / ||g_i(p)||) g_i(p) of the reference, and each
    clipped per-example gradient is within C_l (1 + 1e-6)."""
    from _clip_reference import per_example_grads

    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 4)).double()
    x = torch.randn(5, 7, 3, dtype=torch.float64)
    per_example = per_example_grads(model, x, 5, _sum_loss)
    clipper = PerSampleClipper(model, max_grad_norm=0.5, clipping="per_layer",
                               loss_reduction="sum")
    _sum_loss(model(x), slice(None)).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    bound = 0.5 / len(per_example) ** 0.5
    for p, g in zip(clipper.parameters, per_example):
        norms = g.reshape(g.shape[0], -1).norm(dim=1)
        factors = torch.clamp(bound / norms, max=1.0)
        want = (factors.reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0)
        assert torch.allclose(p.grad, want, rtol=0, atol=1e-10), (p.grad - want).abs().max()
        assert bool((factors * norms <= bound * (1 + 1e-6)).all())
    assert len(stored_at_sum) == 2 and all(dropped for _, dropped in stored_at_sum)
