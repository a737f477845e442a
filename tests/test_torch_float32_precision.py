"""Precision of float32 per-example clipping against a float64 per-example reference.

Reference: the per-example gradients of the same float32 weights and inputs computed by torch
itself in float64 (torch.func: vmap of grad of the one-example loss, i.e. batch-size-1
autograd), clipped with min(1, C / ||g_i||) (Abadi et al. 2016, Algorithm 1) and summed in
float64. The released clipped sum (noise 0) must be within 1e-5 relative of it, and within 10
times the error of plain float32 per-example autograd (the same torch.func computation in
float32, clipped and summed in float64) or a few float32 roundings (2^-22), whichever is
larger: the clipping path may not lose digits that per-example autograd keeps.

The long-reduction cases (a batch of many rows reduced by one float32 matrix product) are
where one float32 product over the whole batch lost digits (Higham, "Accuracy and Stability of
Numerical Algorithms", 2002, section 4.2: the error bound of recursive summation grows with
the number of terms; a per-example gradient sums only its own positions).
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402

pytestmark = pytest.mark.torch

FLOOR = 2.0**-22  # a few float32 roundings of the released tensor
# Long reductions (one clipped sum over ~10^4 to 10^6 rows): 16 float32 roundings, the error of
# one block of a blocked float32 sum (see check's docstring), independent of the batch size.
LONG_FLOOR = 2.0**-20


def per_example_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn,
                      dtype: torch.dtype) -> list[torch.Tensor]:
    """Per-example gradients (B, *p.shape) in ``dtype`` by torch.func (batch-size-1 autograd,
    vectorised), returned as float64."""
    ref = copy.deepcopy(model).to(dtype)
    names = [n for n, p in ref.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in ref.named_parameters() if p.requires_grad}
    xs = x.to(dtype) if x.is_floating_point() else x
    ys = y.to(dtype) if y.is_floating_point() else y

    def one(p, xi, yi):
        out = functional_call(ref, p, (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    grads = vmap(grad(one), in_dims=(None, 0, 0))(params, xs, ys)
    return [grads[n].to(torch.float64) for n in names]


def clipped_sums(per_example: list[torch.Tensor], bound: float,
                 norms: torch.Tensor | None = None) -> list[torch.Tensor]:
    """sum_i min(1, bound / norm_i) g_i, with the per-example gradients' own norms unless
    ``norms`` is given."""
    b = per_example[0].shape[0]
    sq = sum((g.reshape(b, -1) ** 2).sum(1) for g in per_example)
    factors = (bound / (sq.sqrt() if norms is None else norms)).clamp(max=1.0)
    return [(factors.reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0) for g in per_example]


def released(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn,
             bound: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """p.grad after a noiseless release of the clipped sum (expected batch size 1), and the
    per-example norms the clipper took its factors from."""
    m = copy.deepcopy(model)
    clipper = PerSampleClipper(m, max_grad_norm=bound, loss_reduction="sum")
    loss_fn(m(x), y).backward()
    norms = clipper.last_per_example_norms.clone()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    out = [p.grad.detach().to(torch.float64).clone() for p in clipper.parameters]
    clipper.remove()
    return out, norms


def check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, *,
          clipped: bool, floor: float = FLOOR) -> list[tuple[float, float]]:
    """Asserts the precision rule for every parameter; returns (error, float32 error).

    ``floor``: the error allowed whatever plain float32 autograd's (a few roundings; for long
    reductions over the batch, the error of one block of a blocked sum, which does not grow
    with the batch; Higham 2002, section 4.2)."""
    ref64 = per_example_grads(model, x, y, loss_fn, torch.float64)
    ref32 = per_example_grads(model, x, y, loss_fn, torch.float32)
    b = x.shape[0]
    norms = sum((g.reshape(b, -1) ** 2).sum(1) for g in ref64).sqrt()
    # active: every example above C; inactive: every example below C
    bound = float(norms.min()) * 0.5 if clipped else float(norms.max()) * 2.0
    assert bool((norms > bound).all()) if clipped else bool((norms < bound).all())
    got, reported = released(model, x, y, loss_fn, bound)
    # The clipper's norms are those of what it sums: of materialised float32 gradients, or on
    # the Gram path the float64 ghost norm raised by the clipped sum's round-off bound (at most
    # kappa_T R relative, R = sum_t ||a_t|| ||g_t|| / ||g_i||; see
    # LinearUsage.sq_norm_and_slack), within 1e-5 of the float64 norm here. The sums are
    # judged against the exact clipped sums with the factors those norms give.
    torch.testing.assert_close(reported, norms, rtol=1e-5, atol=0)
    exact = clipped_sums(ref64, bound, reported)
    baseline = clipped_sums(ref32, bound, reported)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    results = []
    for name, e, f, g in zip(names, exact, baseline, got):
        scale = float(e.norm())
        err = float((g - e).norm()) / scale
        err32 = float((f - e).norm()) / scale
        assert err <= 1e-5, f"{name}: relative error {err:.2e} > 1e-5"
        assert err <= max(10.0 * err32, floor), (
            f"{name}: relative error {err:.2e}, plain float32 per-example autograd {err32:.2e}")
        results.append((err, err32))
    return results


def ce_sum(out, y):
    return F.cross_entropy(out, y, reduction="sum")


def mse_sum(out, y):
    return F.mse_loss(out, y, reduction="sum")


def linear_sum(out, t):
    """sum_i t_i . out_i: a constant output gradient (the longest float32 accumulations)."""
    return (out * t).sum()


class Pooled(nn.Module):
    """A layer followed by a mean over every dimension after the first two (positions)."""

    def __init__(self, layer: nn.Module, *, channels_last: bool = False) -> None:
        super().__init__()
        self.layer = layer
        self.channels_last = channels_last

    def forward(self, x):
        z = self.layer(x)
        if self.channels_last:  # (B, ..., C) -> mean over the middle dimensions
            return z.reshape(z.shape[0], -1, z.shape[-1]).mean(1)
        return z.reshape(z.shape[0], z.shape[1], -1).mean(2) if z.dim() > 2 else z


class Gain(nn.Module):
    """x * gain + shift: parameters under names the clipper has no handler for (torch.func
    fallback)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.randn(features))
        self.shift = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.tanh(x * self.gain + self.shift)


class EmbedConvNorm(nn.Module):
    """Embedding -> Conv1d -> ReLU -> LayerNorm -> mean over positions -> Linear."""

    def __init__(self, vocab: int = 50, dim: int = 16, hidden: int = 24, classes: int = 5,
                 padding_idx: int | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.conv = nn.Conv1d(dim, hidden, 3, padding=1)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, idx):
        z = F.relu(self.conv(self.emb(idx).transpose(1, 2))).transpose(1, 2)
        return self.head(self.norm(z).mean(1))


class Block(nn.Module):
    """A pre-LN residual MLP block on sequences with a GroupNorm'd convolutional stem."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv1d(dim, dim, 3, padding=1)
        self.gn = nn.GroupNorm(4, dim)
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.gain = Gain(dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):  # x: (B, T, dim)
        h = self.gn(self.stem(x.transpose(1, 2))).transpose(1, 2)
        h = h + self.fc2(F.gelu(self.fc1(self.ln(h))))
        return self.head(self.gain(h).mean(1))


def _layers():
    g = torch.Generator().manual_seed(0)
    B = 12
    return {
        "linear": (nn.Linear(10, 4), torch.randn(B, 10, generator=g),
                   torch.randn(B, 4, generator=g), mse_sum),
        "linear_sequence_gram": (Pooled(nn.Linear(12, 12), channels_last=True),
                                 torch.randn(B, 6, 12, generator=g),
                                 torch.randn(B, 12, generator=g), mse_sum),
        "linear_sequence_materialised": (Pooled(nn.Linear(4, 3), channels_last=True),
                                         torch.randn(B, 64, 4, generator=g),
                                         torch.randn(B, 3, generator=g), mse_sum),
        "conv1d": (Pooled(nn.Conv1d(3, 5, 3, padding=1)), torch.randn(B, 3, 20, generator=g),
                   torch.randn(B, 5, generator=g), mse_sum),
        "conv1d_gram": (Pooled(nn.Conv1d(32, 64, 3, padding=1)),
                        torch.randn(B, 32, 4, generator=g), torch.randn(B, 64, generator=g),
                        mse_sum),
        "conv2d": (Pooled(nn.Conv2d(2, 4, 3, stride=2, padding=1)),
                   torch.randn(B, 2, 9, 9, generator=g), torch.randn(B, 4, generator=g),
                   mse_sum),
        "embedding": (Pooled(nn.Embedding(7, 5, padding_idx=0), channels_last=True),
                      torch.randint(0, 7, (B, 30), generator=g),
                      torch.randn(B, 5, generator=g), mse_sum),
        "layernorm": (Pooled(nn.LayerNorm(6), channels_last=True),
                      torch.randn(B, 8, 6, generator=g) * 3 + 1,
                      torch.randn(B, 6, generator=g), mse_sum),
        "groupnorm": (Pooled(nn.GroupNorm(2, 6)), torch.randn(B, 6, 5, 5, generator=g) + 2,
                      torch.randn(B, 6, generator=g), mse_sum),
        "fallback": (Gain(6), torch.randn(B, 6, generator=g), torch.randn(B, 6, generator=g),
                     mse_sum),
    }


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("name", list(_layers()))
def test_every_layer_alone_matches_the_float64_reference(name: str, clipped: bool) -> None:
    torch.manual_seed(1)
    model, x, y, loss_fn = _layers()[name]
    # LayerNorm / GroupNorm start at weight 1, bias 0: move them off the special point
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    check(model, x, y, loss_fn, clipped=clipped)


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_conv_layernorm_model_matches_the_float64_reference(
        clipped: bool, padding_idx: int | None) -> None:
    torch.manual_seed(2)
    model = EmbedConvNorm(padding_idx=padding_idx)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 50, (32, 12), generator=g)
    y = torch.randint(0, 5, (32,), generator=g)
    results = check(model, x, y, ce_sum, clipped=clipped)
    # the embedding and the LayerNorm weight (the worst two in an outside measurement)
    assert max(results[0][0], results[3][0]) < 1e-6


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "unclipped"])
def test_composed_block_matches_the_float64_reference(clipped: bool) -> None:
    torch.manual_seed(4)
    model = Block()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 10, 16, generator=g)
    y = torch.randn(16, 3, generator=g)
    check(model, x, y, mse_sum, clipped=clipped)


# Long reductions: many rows of one float32 matrix product (or one convolution weight
# gradient) per clipped sum. Positive activations and a constant output gradient make float32
# rounding errors add up instead of cancelling, the worst case for a long float32 sum.

def test_linear_layer_on_a_large_batch_sums_in_blocks() -> None:
    torch.manual_seed(6)
    model = nn.Linear(8, 8)
    x = torch.rand(16384, 8)
    t = torch.rand(16384, 8)
    check(model, x, t, linear_sum, clipped=True, floor=LONG_FLOOR)


@pytest.mark.slow
def test_linear_layer_on_long_sequences_gram_path_sums_in_blocks() -> None:
    # 2^16 examples of 16 positions: one clipped sum over 2^20 rows
    torch.manual_seed(7)
    model = Pooled(nn.Linear(8, 8), channels_last=True)
    x = torch.rand(65536, 16, 8)
    t = torch.rand(65536, 8)
    check(model, x, t, linear_sum, clipped=True, floor=LONG_FLOOR)


@pytest.mark.slow
def test_convolution_gram_path_sums_in_blocks() -> None:
    torch.manual_seed(8)
    model = Pooled(nn.Conv1d(64, 128, 3, padding=1))
    x = torch.rand(2048, 64, 16)
    t = torch.rand(2048, 128)
    check(model, x, t, linear_sum, clipped=True, floor=LONG_FLOOR)


def test_blocked_product_equals_float64_product_to_float32_rounding() -> None:
    """The blocked product against a float64 product of the same float32 operands, in both
    of its forms (fresh and accumulating into a base)."""
    from dpsharp.torch.layers.usages import _SUM_BLOCK_ROWS, _blocked_product

    g = torch.Generator().manual_seed(9)
    rows = 3 * _SUM_BLOCK_ROWS + 17
    m1 = torch.rand(5, rows, generator=g)
    m2 = torch.rand(rows, 3, generator=g)
    base = torch.rand(5, 3, generator=g)
    exact = m1.double() @ m2.double()
    fresh = _blocked_product(m1, m2)
    assert fresh.dtype == torch.float32
    assert float(((fresh.double() - exact) / exact).abs().max()) < 2e-6
    into = base.clone()
    assert _blocked_product(m1, m2, base=into) is into
    want = exact + base.double()
    assert float(((into.double() - want) / want).abs().max()) < 2e-6
    assert math.isclose(float(_blocked_product(m1[:, :10], m2[:10]).sum()),
                        float((m1[:, :10].double() @ m2[:10].double()).sum()), rel_tol=1e-6)


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "unclipped"])
def test_embedding_torch_path_sums_each_row_in_float64(monkeypatch, clipped: bool) -> None:
    """The embedding clipped sum that devices other than the CPU take (a torch index
    accumulation), run here on the CPU: three rows looked up at 2^18 positions of the batch.
    A float32 index_add_ added them one by one (1.4e-4 relative error)."""
    from dpsharp.torch.layers.usages import EmbeddingUsage

    monkeypatch.setattr(EmbeddingUsage, "_fused", lambda self: False)
    torch.manual_seed(10)
    model = Pooled(nn.Embedding(4, 16, padding_idx=0), channels_last=True)
    with torch.no_grad():
        model.layer.weight.abs_()
    g = torch.Generator().manual_seed(11)
    idx = torch.randint(0, 4, (64, 4096), generator=g)
    t = torch.rand(64, 16, generator=g)
    check(model, idx, t, linear_sum, clipped=clipped)


def test_embedding_conv_layernorm_model_on_the_torch_embedding_path(monkeypatch) -> None:
    from dpsharp.torch.layers.usages import EmbeddingUsage

    monkeypatch.setattr(EmbeddingUsage, "_fused", lambda self: False)
    torch.manual_seed(2)
    model = EmbedConvNorm(vocab=8, padding_idx=0)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 8, (32, 64), generator=g)
    y = torch.randint(0, 5, (32,), generator=g)
    check(model, x, y, ce_sum, clipped=True)
