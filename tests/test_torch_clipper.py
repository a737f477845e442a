"""Per-example clipping (PerSampleClipper) against a batch-size-1 autograd reference.

Reference: for each example i, the gradient of the loss on the batch {x_i} alone computed by
plain autograd on an unpatched copy of the model; the clipped sum is
sum_i min(1, C / ||g_i||) g_i (Abadi et al. 2016, Algorithm 1) or its per-layer version
(section 3.1 of the same paper).
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dpsharp.torch import NoiseGenerator, PerSampleClipper, kernels  # noqa: E402

pytestmark = pytest.mark.torch


def per_example_reference(model, x, y, loss_fn):
    """Per-example gradients (list over params of (B, *shape)) by batch-size-1 autograd."""
    ref = copy.deepcopy(model)
    params = [p for p in ref.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        ref.zero_grad(set_to_none=True)
        loss_fn(ref(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                     for p in params])
    return [torch.stack([r[k] for r in rows]) for k in range(len(params))]


def clipped_reference(per_example, bounds, flat):
    sq = torch.stack([(g.double().reshape(g.shape[0], -1) ** 2).sum(1) for g in per_example], 1)
    if flat:
        norms = sq.sum(1).sqrt()
        f = torch.clamp(bounds / norms, max=1.0)
        factors = [f] * len(per_example)
    else:
        norms = sq.sqrt()
        factors = [torch.clamp(bounds[k] / norms[:, k], max=1.0) for k in range(len(per_example))]
    sums = [(fk.to(g.dtype).reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0)
            for fk, g in zip(factors, per_example)]
    return norms, sums


def run_clipper(model, x, y, loss_fn, *, max_grad_norm, clipping="flat", reduction="mean"):
    model.zero_grad(set_to_none=True)
    clipper = PerSampleClipper(model, max_grad_norm=max_grad_norm, clipping=clipping,
                               loss_reduction=reduction)
    loss_fn(model(x), y).backward()
    norms = clipper.last_per_example_norms.clone()
    for p in clipper.parameters:
        assert p.grad is None, "the plain gradient must not be computed"
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    sums = [p.grad.clone() for p in clipper.parameters]
    clipper.remove()
    return norms, sums


def mse(out, y):
    return F.mse_loss(out, y)


def ce(out, y):
    return F.cross_entropy(out, y)


def check(model, x, y, loss_fn, *, bound=0.7, clipping="flat", rtol=1e-5, reduction="mean"):
    if reduction == "sum":
        def loss_fn_used(out, t):
            return loss_fn(out, t) * out.shape[0]
    else:
        loss_fn_used = loss_fn
    per_example = per_example_reference(model, x, y, loss_fn_used)
    n = len(per_example)
    bounds = bound if clipping == "flat" else torch.full((n,), bound, dtype=torch.float64)
    ref_norms, ref_sums = clipped_reference(per_example, bounds, clipping == "flat")
    norms, sums = run_clipper(model, x, y, loss_fn_used,
                              max_grad_norm=bound if clipping == "flat" else [bound] * n,
                              clipping=clipping, reduction=reduction)
    torch.testing.assert_close(norms, ref_norms, rtol=rtol, atol=1e-7)
    for got, want in zip(sums, ref_sums):
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-6 * bound)


class SeqHead(nn.Module):
    """Embedding -> Linear over a sequence -> LayerNorm -> mean pool -> Linear."""

    def __init__(self, vocab=13, dim=6, classes=3, tie=False, padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.mix = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab if tie else classes, bias=not tie)
        if tie:
            self.out.weight = self.emb.weight

    def forward(self, idx):
        h = self.norm(torch.tanh(self.mix(self.emb(idx))))
        return self.out(h.mean(dim=1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def test_mlp_flat_and_per_layer():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    check(model, x, y, ce, bound=0.3)
    check(model, x, y, ce, bound=0.2, clipping="per_layer")
    check(model, x, y, ce, bound=1e9)  # no clipping at all: the plain per-example sum


def test_sum_reduction():
    model = nn.Sequential(nn.Linear(5, 3))
    x, y = torch.randn(7, 5), torch.randn(7, 3)
    check(model, x, y, mse, reduction="sum", bound=0.4)


@pytest.mark.parametrize("seq", [2, 40])  # short: Gram ghost norm; long: materialised
def test_linear_on_sequences_both_paths(seq):
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    x, y = torch.randn(5, seq, 4), torch.randn(5, seq, 2)
    check(model, x, y, mse, bound=0.05)


def test_embedding_repeated_indices_padding_and_layernorm():
    model = SeqHead(padding_idx=0)
    idx = torch.tensor([[1, 1, 2, 0, 5], [3, 0, 0, 3, 3], [7, 8, 9, 10, 11], [4, 4, 4, 4, 4]])
    y = torch.randint(0, 3, (4,))
    check(model, idx, y, ce, bound=0.5)


def test_tied_embedding_and_output_projection_summed_per_example():
    model = SeqHead(tie=True)
    assert model.out.weight is model.emb.weight
    idx = torch.randint(0, 13, (5, 4))
    y = torch.randint(0, 13, (5,))
    check(model, idx, y, ce, bound=0.5)


class TiedUses(nn.Module):
    """One weight used twice per example: ``emb-lin`` an embedding table that is also the
    output projection over every position (a language model's tied wte / lm_head), ``emb-emb``
    one table looked up by two index streams, ``lin-lin`` one weight in two linear layers with
    their own biases."""

    def __init__(self, kind: str, vocab: int = 11, dim: int = 5) -> None:
        super().__init__()
        self.kind = kind
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.mix = nn.Linear(dim, dim)
        if kind == "emb-lin":
            self.second = nn.Linear(dim, vocab, bias=False)
            self.second.weight = self.emb.weight
        elif kind == "emb-emb":
            self.second = nn.Embedding(vocab, dim, padding_idx=0)
            self.second.weight = self.emb.weight
        else:
            self.second = nn.Linear(dim, dim)
            self.second.weight = self.mix.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mix(self.emb(idx)))
        if self.kind == "emb-lin":
            return self.second(h)  # (B, T, vocab) logits
        if self.kind == "emb-emb":
            return h * self.second(idx.flip(1))
        return self.second(torch.tanh(h))


@pytest.mark.parametrize("kind", ["emb-lin", "emb-emb", "lin-lin"])
@pytest.mark.parametrize("materialise", [False, True])
def test_tied_weight_ghost_norm_forms_no_per_example_gradient(kind, materialise,
                                                              monkeypatch):
    """A tied weight's per-example norm is sum_u ||g_u||^2 + 2 sum_{u<v} <g_u, g_v> from the
    stored activations (usages.tied_cross_dot), with each linear use on its Gram path or with
    its own gradients materialised: no (B, V, d) sum of per-example gradients is formed, and
    norms and clipped sums equal the float64 batch-size-1 autograd reference to 1e-10."""
    from _clip_reference import check_model

    from dpsharp.torch.layers import usages

    def refuse(self, p):
        raise AssertionError("a per-example gradient of a tied weight was materialised")

    monkeypatch.setattr(usages.EmbeddingUsage, "per_example", refuse)
    monkeypatch.setattr(usages.LinearUsage, "per_example", refuse)
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: materialise)
    model = TiedUses(kind).double()
    idx = torch.randint(0, 11, (4, 7))
    idx[0, :3] = torch.tensor([3, 3, 0])  # a repeated row and a padding position
    target = torch.randn(4, 7, 11 if kind == "emb-lin" else 5, dtype=torch.float64)

    def loss(out, i):
        return ((out - target[i]) ** 2).sum()

    check_model(model, idx, 4, loss, bound=0.4)


@pytest.mark.parametrize("kind", ["emb-lin", "emb-emb", "lin-lin"])
def test_tied_weight_ghost_path_accumulates_over_backward_passes(kind):
    """Two backward passes into one release: each use of the tied weight adds its clipped sum
    into the accumulator in place; the release equals the float64 batch-size-1 reference."""
    from _clip_reference import clipped_sums, per_example_grads

    model = TiedUses(kind).double()
    idx = torch.randint(0, 11, (5, 6))
    target = torch.randn(5, 6, 11 if kind == "emb-lin" else 5, dtype=torch.float64)

    def loss(out, i):
        return ((out - target[i]) ** 2).sum()

    _, want = clipped_sums(per_example_grads(model, idx, 5, loss), 0.4)
    clipper = PerSampleClipper(model, max_grad_norm=0.4, loss_reduction="sum")
    for part in (slice(0, 2), slice(2, 5)):
        loss(model(idx[part]), part).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    for p, w in zip(clipper.parameters, want):
        assert torch.allclose(p.grad, w, rtol=0, atol=1e-10), (p.grad - w).abs().max()
    clipper.remove()


def test_tied_weight_ghost_norm_float32_within_plain_autograd_error():
    from _clip_reference import float32_error_ratio

    model = TiedUses("emb-lin", vocab=40, dim=8).double()
    idx = torch.randint(0, 40, (6, 30))
    target = torch.randn(6, 30, 40, dtype=torch.float64)

    def loss(out, i):
        return ((out - target[i]) ** 2).sum()

    ours, plain = float32_error_ratio(model, idx, 6, loss, bound=0.5)
    assert ours <= 8 * plain + 1e-7, (ours, plain)


def test_materialised_per_example_gradients_reuse_one_buffer_across_steps(monkeypatch):
    """Materialised per-example gradients of linear layers live in one buffer kept between
    clip steps (usages.arena_empty): a later step with the same shapes gets the same memory
    back (no fresh pages to fault in), a larger batch takes fresh memory for what does not fit
    and the next step a buffer of the new size, and the tensors of one step never overlap: the
    norms and clipped sums of every step equal the float64 batch-size-1 reference to 1e-10."""
    from _clip_reference import check_model

    from dpsharp.torch.layers import usages

    handed: list[list[tuple[int, int]]] = []
    original = usages.Arena.empty

    def recording(self, shape, dtype, device):
        out = original(self, shape, dtype, device)
        handed[-1].append((out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()))
        return out

    monkeypatch.setattr(usages.Arena, "empty", recording)
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: True)
    model = nn.Sequential(nn.Linear(3, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(),
                          nn.Linear(5, 2)).double()
    for batch in (2, 5, 5, 5, 3):
        handed.append([])
        x = torch.randn(batch, 6, 3, dtype=torch.float64)
        y = torch.randn(batch, 6, 2, dtype=torch.float64)

        def loss(out, i, y=y):
            return ((out - y[i]) ** 2).sum()

        check_model(model, x, batch, loss, bound=0.3)
        spans = sorted(handed[-1])
        assert len(spans) == 3
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    # batch 5 outgrew the buffer; from its second step on the same shapes get the same memory
    # again, and a smaller batch the start of the same buffer
    assert sorted(handed[3]) == sorted(handed[2])
    assert min(handed[4])[0] == min(handed[3])[0]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("d_in, d_out", [(2, 9), (9, 2)])
def test_materialised_gradients_formed_with_the_longer_rows(d_in, d_out, transposed,
                                                            monkeypatch):
    """Materialised per-example weight gradients are formed as G^T A (p, d) or A^T G (d, p),
    whichever has the longer rows (bmm runs up to 10x slower on short rows), for nn.Linear and
    for a transposed-weight layer; norms and clipped sums equal the float64 batch-size-1
    reference to 1e-10 in every orientation."""
    from _clip_reference import check_model

    from dpsharp.torch.layers import usages

    bases: list[tuple[int, ...]] = []
    original = usages.LinearUsage._weight_per_example

    def recording(self, arena=None):
        out = original(self, arena)
        bases.append(tuple(self._per_example_base.shape))
        assert self._per_example_base.is_contiguous()
        return out

    monkeypatch.setattr(usages.LinearUsage, "_weight_per_example", recording)
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: True)
    model = nn.Sequential(nn.Linear(3, d_in), nn.Tanh(), nn.Linear(d_in, d_out)).double()
    if transposed:  # y = x W + b with W stored (in, out), as GPT-2's Conv1D
        lin = model[2]

        class Transposed(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = nn.Parameter(lin.weight.detach().t().clone())
                self.bias = nn.Parameter(lin.bias.detach().clone())

            def forward(self, x):
                return x @ self.weight + self.bias

        model[2] = Transposed()
        from dpsharp.torch import clipper as clipper_module

        plain_classify = clipper_module._classify

        def classify(m):  # the transposed-weight linear path GPT-2's Conv1D takes
            return "hf_conv1d" if isinstance(m, Transposed) else plain_classify(m)

        monkeypatch.setattr(clipper_module, "_classify", classify)
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    y = torch.randn(4, 5, d_out, dtype=torch.float64)

    def loss(out, i):
        return ((out - y[i]) ** 2).sum()

    check_model(model, x, 4, loss, bound=0.3)
    b = 4
    want = (b, d_in, d_out) if d_in < d_out else (b, d_out, d_in)
    assert want in bases, bases


def test_layer_called_twice_is_summed_not_stacked():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    check(Twice(), torch.randn(5, 4), torch.randn(5, 4), mse, bound=0.3)


def test_layers_called_with_their_input_by_keyword():
    """``layer(input=x)`` (torch's keyword) reaches the patched Linear, Conv and Embedding
    forwards as ``layer(x)`` does; a second input is refused."""

    class Keywords(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 4)
            self.conv = nn.Conv1d(4, 4, 3, padding=1)
            self.lin = nn.Linear(4, 2)

        def forward(self, idx):
            h = self.conv(input=self.emb(input=idx).transpose(1, 2)).mean(dim=2)
            return self.lin(input=torch.tanh(h))

    check(Keywords(), torch.randint(0, 7, (5, 6)), torch.randn(5, 2), mse, bound=0.2)
    layer = nn.Linear(3, 2)
    clipper = PerSampleClipper(layer, max_grad_norm=1.0)
    with pytest.raises(TypeError, match="takes one input"):
        layer(torch.randn(2, 3), input=torch.randn(2, 3))
    clipper.remove()


def test_conv_groupnorm_cnn():
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
        nn.Conv2d(4, 3, 2, dilation=2), nn.Flatten(), nn.LazyLinear(5),
    )
    x = torch.randn(4, 2, 9, 9)
    model(x)  # materialise the lazy layer
    check(model, x, torch.randint(0, 5, (4,)), ce, bound=0.4)


def test_conv1d():
    model = nn.Sequential(nn.Conv1d(3, 4, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 5, 2))
    check(model, torch.randn(5, 3, 10), torch.randn(5, 2), mse, bound=0.2)


def test_frozen_and_mixed_parameters():
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    model[0].requires_grad_(False)  # frozen layer
    model[2].weight.requires_grad_(False)  # mixed: frozen weight, trainable bias
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    assert [id(p) for p in clipper.parameters] == [id(model[2].bias), id(model[4].weight),
                                                   id(model[4].bias)]
    clipper.remove()
    check(model, torch.randn(6, 5), torch.randn(6, 2), mse, bound=0.1)


def test_sequence_linear_frozen_weight_and_no_bias():
    """Sequences on the CPU Gram path: a layer with a frozen weight and a trainable bias (the
    bias norm from sum_t gy_t, no kernel), one without a bias (the kernel's weight norm only)
    and a plain one (weight and bias norms from one kernel call)."""
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4, bias=False), nn.Tanh(),
                          nn.Linear(4, 3))
    model[0].weight.requires_grad_(False)
    x, y = torch.randn(5, 7, 5), torch.randn(5, 7, 3)
    check(model, x, y, mse, bound=0.05)
    check(model, x, y, mse, bound=0.05, clipping="per_layer")


def test_sequence_linear_torch_gram_path(monkeypatch):
    """The torch Gram path (batched Gram matmuls; CUDA tensors, or CPUs without a vectorised
    build of the fused kernel) with its cost rule, on the CPU."""
    from dpsharp.torch.layers import usages

    monkeypatch.setattr(usages, "_vectorised_linear_norms", lambda: False)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 6))
    for layer in (model[0], model[2]):  # both on the Gram path: d p > T (d + p)
        usage = usages.LinearUsage(layer.weight, layer.bias, torch.zeros(1, 3, layer.in_features),
                                   torch.zeros(1, 3, layer.out_features))
        assert not usage._fused_sequence_norms() and not usage._materialise_weight()
    check(model, torch.randn(5, 3, 8), torch.randn(5, 3, 6), mse, bound=0.05)


def test_embedding_multidim_strided_int32_indices():
    class Grid(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(6, 4, padding_idx=2)
            self.out = nn.Linear(4, 3)

        def forward(self, idx):
            return self.out(self.emb(idx).mean(dim=(1, 2)))

    idx = torch.randint(0, 6, (3, 4, 5)).permute(2, 0, 1).to(torch.int32)  # (5, 3, 4), strided
    idx[0, 0, :] = 2
    idx[1] = 5
    check(Grid(), idx, torch.randint(0, 3, (5,)), ce, bound=0.3)


def test_fallback_module_uses_torch_func():
    class Scaled(nn.Module):  # not a supported type: per-example grads by vmap(vjp)
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.randn(4))
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(x * self.scale).sin()

    model = nn.Sequential(nn.Linear(3, 4), Scaled(), nn.Linear(4, 2))
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    assert ("Scaled", "fallback") in clipper.handled_modules
    clipper.remove()
    check(model, torch.randn(5, 3), torch.randn(5, 2), mse, bound=0.2)


def test_gradient_accumulation_over_virtual_batches():
    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    per_example = per_example_reference(model, x, y, mse)
    _, want = clipped_reference(per_example, 0.3, True)
    clipper = PerSampleClipper(model, max_grad_norm=0.3)
    for sl in (slice(0, 3), slice(3, 8)):
        mse(model(x[sl]), y[sl]).backward()
    assert clipper.accumulated_examples == 8 and clipper.accumulated_batches == 2
    clipper.release(noise_multiplier=0.0, expected_batch_size=4.0, noise=NoiseGenerator(0))
    for p, w in zip(clipper.parameters, want):
        torch.testing.assert_close(p.grad, w / 4.0, rtol=1e-5, atol=1e-7)
    assert clipper.accumulated_examples == 0 and clipper.accumulated_batches == 0


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 5), seq=st.integers(1, 6), d_in=st.integers(1, 6),
       d_out=st.integers(1, 6), bias=st.booleans(), bound=st.floats(0.01, 10.0))
def test_linear_hypothesis_shapes(batch, seq, d_in, d_out, bias, bound):
    """Every shape, in float64: in float32 the residual out - y of a near fit is formed with
    cancellation (0.005 from values near 1 at batch 4, seq 1, d_in 2, d_out 1), and the batch
    and batch-size-1 forwards round it differently by 1.5e-5 relative, beyond the 1e-5 the
    comparison allows (both within float32 of the float64 norm)."""
    torch.manual_seed(batch * 1000 + seq * 100 + d_in * 10 + d_out)
    model = nn.Sequential(nn.Linear(d_in, d_out, bias=bias)).double()
    x = torch.randn(batch, seq, d_in, dtype=torch.float64)
    y = torch.randn(batch, seq, d_out, dtype=torch.float64)
    check(model, x, y, mse, bound=bound)


@pytest.mark.parametrize("scale", [1e4, 65504.0, 1e8])
def test_clipped_norms_bounded_for_huge_gradients(scale):
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x = torch.randn(10, 6, dtype=torch.float64) * scale
    y = torch.randn(10, 3, dtype=torch.float64) * scale
    per_example = per_example_reference(model, x, y, mse)
    bound = 0.5
    clipper = PerSampleClipper(model, max_grad_norm=bound)
    mse(model(x), y).backward()
    norms = clipper.last_per_example_norms
    assert bool((norms > bound * 10).all())  # the gradients really are huge
    factors = torch.clamp(bound / norms, max=1.0)
    clipped = torch.cat([(factors.reshape(-1, *[1] * (g.dim() - 1)) * g).reshape(10, -1)
                         for g in per_example], dim=1)
    assert float(clipped.norm(dim=1).max()) <= bound * (1 + 1e-6)
    # the clipped sum obeys the triangle inequality: ||sum|| <= B C
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    total = math.sqrt(sum(float((p.grad ** 2).sum()) for p in clipper.parameters))
    assert total <= 10 * bound * (1 + 1e-6)


def test_swap_one_example_changes_sum_by_at_most_2c():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(6, 4, dtype=torch.float64) * 100
    y = torch.randn(6, 2, dtype=torch.float64)
    sums = []
    for xb in (x, torch.cat([x[:5], torch.randn(1, 4, dtype=torch.float64) * 1e3])):
        m = copy.deepcopy(model)
        clipper = PerSampleClipper(m, max_grad_norm=1.0, loss_reduction="sum")
        F.mse_loss(m(xb), y, reduction="sum").backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        sums.append(torch.cat([p.grad.reshape(-1) for p in clipper.parameters]))
    assert float((sums[0] - sums[1]).norm()) <= 2.0 * (1 + 1e-6)


@pytest.mark.parametrize("layer", [nn.BatchNorm1d(4), nn.BatchNorm2d(4),
                                   nn.InstanceNorm2d(4, track_running_stats=True)])
def test_cross_example_layers_refused(layer):
    model = nn.Sequential(nn.Linear(4, 4), layer)
    with pytest.raises(ValueError, match="GroupNorm"):
        PerSampleClipper(model, max_grad_norm=1.0)
    assert "forward" not in model[0].__dict__  # nothing patched on refusal


def test_bad_arguments():
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="max_grad_norm"):
        PerSampleClipper(model, max_grad_norm=0.0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        PerSampleClipper(model, max_grad_norm=float("nan"))
    with pytest.raises(ValueError, match="clipping"):
        PerSampleClipper(model, max_grad_norm=1.0, clipping="adaptive")
    with pytest.raises(ValueError, match="loss_reduction"):
        PerSampleClipper(model, max_grad_norm=1.0, loss_reduction="none")
    with pytest.raises(ValueError, match="one bound per trainable parameter"):
        PerSampleClipper(model, max_grad_norm=[1.0], clipping="per_layer")
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="expected_batch_size"):
        clipper.release(noise_multiplier=1.0, expected_batch_size=0.0, noise=NoiseGenerator(0))
    with pytest.raises(ValueError, match="noise_multiplier"):
        clipper.release(noise_multiplier=-1.0, expected_batch_size=1.0, noise=NoiseGenerator(0))


def test_non_finite_gradients_raise():
    model = nn.Linear(3, 1)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    x = torch.tensor([[1.0, 2.0, float("inf")], [1.0, 1.0, 1.0]])
    with pytest.raises(FloatingPointError, match="not finite"):
        model(x).sum().backward()


def test_remove_restores_plain_gradients_and_no_grad_forward_untouched():
    model = nn.Linear(3, 2)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with torch.no_grad():
        model(torch.randn(4, 3))
    assert clipper.accumulated_batches == 0
    clipper.remove()
    model(torch.randn(4, 3)).sum().backward()
    assert model.weight.grad is not None


def test_per_layer_overall_bound_and_even_split():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    clipper = PerSampleClipper(model, max_grad_norm=[1.0, 2.0, 2.0, 4.0], clipping="per_layer")
    assert clipper.overall_bound == pytest.approx(5.0)
    clipper.remove()
    clipper = PerSampleClipper(model, max_grad_norm=2.0, clipping="per_layer")
    assert clipper.max_grad_norm == pytest.approx([1.0] * 4)
    assert clipper.overall_bound == pytest.approx(2.0)


def test_import_dpsharp_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, dpsharp, dpsharp.torch; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind", ["linear-seq", "conv", "embedding", "layernorm"])
def test_empty_batch_backward_accumulates_nothing(kind: str) -> None:
    """An empty Poisson sample runs forward/backward with 0 rows: nothing is accumulated and the
    release is pure noise."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(0)
    if kind == "linear-seq":
        model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(4, 3))
        x = torch.zeros(0, 5, 4)
    elif kind == "conv":
        model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.Flatten(), torch.nn.Linear(12, 2))
        x = torch.zeros(0, 2, 4, 4)
    elif kind == "embedding":
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))
        x = torch.zeros(0, 3, dtype=torch.long)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        x = torch.zeros(0, 4)
    clipper = PerSampleClipper(model, max_grad_norm=1.0, loss_reduction="sum")
    model(x).sum().backward()
    assert clipper.accumulated_examples == 0
    clipper.release(noise_multiplier=2.0, expected_batch_size=4.0, noise=NoiseGenerator(seed=1))
    for p in clipper.parameters:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize(("shape", "normalized"), [((6, 5), (5,)), ((4, 3, 2, 5), (2, 5))])
def test_layernorm_flat_and_multi_dim_normalized_shape(shape, normalized):
    model = nn.Sequential(nn.Linear(shape[-1], shape[-1]), nn.LayerNorm(normalized), nn.Tanh(),
                          nn.Flatten(), nn.Linear(math.prod(shape[1:]), 3))
    with torch.no_grad():  # non-trivial affine parameters
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    check(model, torch.randn(shape), torch.randn(shape[0], 3), mse, bound=0.3)


# ---- arm_release: the release done at the end of the backward pass --------------------------
class _Unused(nn.Module):
    """An MLP with a layer the forward never calls (its parameters get pure noise)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 3)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _armed_and_plain(make_model, x, y, loss_fn, *, clipping="flat", sigma=1.3, batch=6.0,
                     dtype=torch.float64):


    grads = []
    for armed in (False, True):
        torch.manual_seed(99)
        model = make_model().to(dtype)
        n_params = len([p for p in model.parameters() if p.requires_grad])
        bound = 0.7 if clipping == "flat" else [0.7] * n_params
        clipper = PerSampleClipper(model, max_grad_norm=bound, clipping=clipping)
        gen = NoiseGenerator(31)
        if armed:
            clipper.arm_release(noise_multiplier=sigma, expected_batch_size=batch, noise=gen)
        loss_fn(model(x), y).backward()
        if not armed:
            clipper.release(noise_multiplier=sigma, expected_batch_size=batch, noise=gen)
        grads.append([p.grad.clone() for p in clipper.parameters])
    return grads


@pytest.mark.parametrize("clipping", ["flat", "per_layer"])
@pytest.mark.parametrize("model_kind", ["mlp", "seq", "tied", "conv", "unused"])
def test_armed_release_equals_release_after_backward(model_kind, clipping):
    """Same noise (same key and streams), same clipped sums, same fused release kernel as
    release(): the same bits."""
    ce = nn.functional.cross_entropy
    if model_kind == "mlp":
        make, x, y = (lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)),
                      torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,)))
    elif model_kind == "seq":
        make, x, y = SeqHead, torch.randint(0, 13, (6, 9)), torch.randint(0, 3, (6,))
    elif model_kind == "tied":
        make, x, y = (lambda: SeqHead(tie=True), torch.randint(0, 13, (6, 4)),
                      torch.randint(0, 13, (6,)))
    elif model_kind == "conv":
        make, x, y = (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(),
                                            nn.Linear(3 * 4 * 4, 3)),
                      torch.randn(6, 2, 6, 6, dtype=torch.float64), torch.randint(0, 3, (6,)))
    else:
        make, x, y = _Unused, torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,))
    plain, armed = _armed_and_plain(make, x, y, ce, clipping=clipping)
    for a, b in zip(plain, armed):
        assert torch.equal(b, a)


def test_armed_release_float32_is_bitwise_the_release():
    make = lambda: nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 4))  # noqa: E731
    x, y = torch.randn(16, 20), torch.randint(0, 4, (16,))
    plain, armed = _armed_and_plain(make, x, y, nn.functional.cross_entropy,
                                    dtype=torch.float32, batch=16.0)
    for a, b in zip(plain, armed):
        assert torch.equal(b, a)


def test_armed_release_without_backward_is_the_armed_pure_noise_release():


    model = nn.Linear(4, 3).double()
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    gen = NoiseGenerator(5)
    clipper.arm_release(noise_multiplier=2.0, expected_batch_size=8.0, noise=gen)
    assert gen.releases == 1  # the key is drawn when arming
    with pytest.raises(ValueError, match="armed release"):
        clipper.release(noise_multiplier=1.0, expected_batch_size=8.0, noise=gen)
    clipper.release(noise_multiplier=2.0, expected_batch_size=8.0, noise=gen)
    assert gen.releases == 1  # the armed key went out, no new one was drawn
    want = kernels.reference_gaussian(key=5, parameter=0, release=0, rank=0, numel=12,
                                      precision="float64") * 2.0 / 8.0
    torch.testing.assert_close(model.weight.grad.reshape(-1), want, rtol=1e-12, atol=0.0)


def test_arm_release_misuse_is_refused():


    model = nn.Linear(4, 3)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    gen = NoiseGenerator(5)
    x, y = torch.randn(3, 4), torch.randint(0, 3, (3,))
    clipper.arm_release(noise_multiplier=1.0, expected_batch_size=3.0, noise=gen)
    with pytest.raises(RuntimeError, match="already armed"):
        clipper.arm_release(noise_multiplier=1.0, expected_batch_size=3.0, noise=gen)
    nn.functional.cross_entropy(model(x), y).backward()
    assert model.weight.grad is not None and clipper.accumulated_batches == 0
    with pytest.raises(RuntimeError, match="already went out"):
        clipper.release(noise_multiplier=1.0, expected_batch_size=3.0, noise=gen)
    nn.functional.cross_entropy(model(x), y).backward()  # not armed: accumulates
    with pytest.raises(RuntimeError, match="already accumulated"):
        clipper.arm_release(noise_multiplier=1.0, expected_batch_size=3.0, noise=gen)
    clipper.release(noise_multiplier=1.0, expected_batch_size=3.0, noise=gen)
    clipper.arm_release(noise_multiplier=1.0, expected_batch_size=3.0, noise=gen)
    clipper.reset()  # disarms
    nn.functional.cross_entropy(model(x), y).backward()
    assert clipper.accumulated_batches == 1
    with pytest.raises(ValueError, match="noise_multiplier"):
        clipper.arm_release(noise_multiplier=-1.0, expected_batch_size=3.0, noise=gen)
    with pytest.raises(TypeError, match="NoiseGenerator"):
        clipper.arm_release(noise_multiplier=1.0, expected_batch_size=3.0, noise=5)


# ------------------------------------------------------------------ the batch dimension
# The clipper takes dimension 0 of every layer input as the batch. A sequence-first model
# (seq, batch, ...) would be clipped per position, and one example's contribution to the
# clipped sum would not be bounded by C.

class TokenModel(nn.Module):
    """Embedding -> Linear -> tanh -> mean over positions: logits of shape (batch, classes).
    ``batch_first=False`` takes (seq, batch) index tensors, as sequence-first layers do."""

    def __init__(self, *, batch_first: bool, vocab: int = 20, dim: int = 6,
                 classes: int = 3, pool: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.pool = pool  # False: per-position logits, pooled by the caller
        self.emb = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(self.emb(idx)))
        return h.mean(dim=1 if self.batch_first else 0) if self.pool else h


class TransposingModel(nn.Module):
    """Takes (batch, seq, features) and runs its linear layers sequence-first, (seq, batch,
    features), like a batch-first wrapper around nn.TransformerEncoderLayer(batch_first=False)
    would."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x.transpose(0, 1)))  # (seq, batch, 8)
        return self.fc2(h).mean(dim=0)


def token_data(n: int = 12, seq: int = 5, seed: int = 0):
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 20, (n, seq), generator=g)
    return TensorDataset(idx, torch.randint(0, 3, (n,), generator=g))


def test_sequence_first_model_with_a_loader_is_refused_before_any_release() -> None:
    from dpsharp.torch import DPOptimizer, ShuffledDataLoader

    torch.manual_seed(0)
    # input, every layer and the output are sequence-first (5 rows in dimension 0): only the
    # loader knows the batch has 6 examples
    model = TokenModel(batch_first=False, pool=False)
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model,
                      noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=6,
                      noise=NoiseGenerator(0))
    loader = ShuffledDataLoader(token_data(), batch_size=6, seed=1)
    opt.attach_loader(loader)
    idx, y = next(iter(loader))  # (6, 5): batch-first from the loader
    opt.zero_grad()
    F.cross_entropy(model(idx.t()).mean(0), y).backward()  # fed sequence-first: (5, 6)
    with pytest.raises(ValueError, match="batch_first") as info:
        opt.step()
    message = str(info.value)
    assert "5 examples" in message and "6 examples" in message
    assert "per position" in message
    assert opt.releases == 0
    assert all(p.grad is None for p in model.parameters())


def test_layers_that_see_another_batch_than_the_model_input_are_refused() -> None:
    torch.manual_seed(1)
    model = TransposingModel()
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    x = torch.randn(6, 5, 4)  # (batch 6, seq 5): the layers see 5 rows in dimension 0
    with pytest.raises(ValueError, match="batch_first") as info:
        F.mse_loss(model(x), torch.randn(6, 3)).backward()
    assert "batch of 5" in str(info.value) and "has 6" in str(info.value)
    assert clipper.accumulated_examples == 0
    # the batch-first model of the same layers is accepted
    clipper.remove()
    seq = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    clipper = PerSampleClipper(seq, max_grad_norm=1.0)
    F.mse_loss(seq(x).mean(1), torch.randn(6, 3)).backward()
    assert clipper.accumulated_examples == 6


def test_batch_first_model_trains_and_releases_the_clipped_sum() -> None:
    from dpsharp.torch import DPOptimizer, ShuffledDataLoader

    torch.manual_seed(2)
    model = TokenModel(batch_first=True)
    reference_model = copy.deepcopy(model)
    bound = 0.05
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), module=model,
                      noise_multiplier=0.0, max_grad_norm=bound, expected_batch_size=6,
                      noise=NoiseGenerator(0))
    loader = ShuffledDataLoader(token_data(), batch_size=6, seed=1)
    opt.attach_loader(loader)
    for idx, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(idx), y).backward()
        opt.step()
        # noise 0, learning rate 0: p.grad is the clipped sum / 6 of this batch
        per_example = per_example_reference(reference_model, idx, y, ce)
        _, sums = clipped_reference(per_example, torch.tensor(bound, dtype=torch.float64),
                                    True)
        for p, s in zip(model.parameters(), sums):
            torch.testing.assert_close(p.grad, s / 6, rtol=1e-5, atol=1e-8)
    assert opt.releases == 2


def _clipped_sum(model: nn.Module, idx: torch.Tensor, y: torch.Tensor,
                 bound: float) -> torch.Tensor:
    """The released clipped sum (noise 0), flattened over all parameters, float64."""
    m = copy.deepcopy(model)
    clipper = PerSampleClipper(m, max_grad_norm=bound, loss_reduction="sum")
    F.cross_entropy(m(idx), y, reduction="sum").backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    out = torch.cat([p.grad.reshape(-1).double() for p in clipper.parameters])
    clipper.remove()
    return out


@pytest.mark.parametrize("batch_first", [True, False])
def test_each_example_moves_the_clipped_sum_by_at_most_c(batch_first: bool) -> None:
    """Brute force (Tramer et al. 2022, "Debugging differential privacy"): remove each example
    in turn and measure how far the noiseless clipped sum moves; that is the example's
    contribution, which clipping bounds by C. A sequence-first model is refused instead (it
    would be clipped per position: removing one example changes every position's row)."""
    torch.manual_seed(3)
    model = TokenModel(batch_first=batch_first)
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 20, (7, 5), generator=g)
    y = torch.randint(0, 3, (7,), generator=g)
    bound = 0.05  # every example clipped
    with torch.no_grad():
        model.emb.weight.mul_(10.0)
    if not batch_first:
        with pytest.raises(ValueError, match="batch_first"):
            full = _clipped_sum(model, idx.t(), y, bound)
            for j in range(7):  # the contributions are unbounded: the check must refuse
                keep = [i for i in range(7) if i != j]
                moved = float((full - _clipped_sum(model, idx[keep].t(), y[keep], bound))
                              .norm())
                assert moved <= bound * (1 + 1e-6)
        return
    full = _clipped_sum(model, idx, y, bound)
    for j in range(7):
        keep = [i for i in range(7) if i != j]
        moved = float((full - _clipped_sum(model, idx[keep], y[keep], bound)).norm())
        assert moved <= bound * (1 + 1e-6)
        assert moved >= bound * (1 - 1e-4)  # clipped to exactly C
