"""The C++ per-example norm kernels of sequence linear layers and embeddings against float64
torch references built from explicit per-example gradients.

References (independent of the kernels' formulas): for a linear layer on sequences,
g_i(W) = sum_t g_it a_it^T = einsum('tp,td->pd') and g_i(b) = sum_t g_it (Goodfellow 2015),
squared and summed in float64; for an embedding, g_i(W) = onehot(idx_i)^T gy_i with the
padding column of the one-hot matrix zeroed (nn.Embedding gives the padding row no gradient),
and the clipped sum sum_i c_i g_i(W) formed from those per-example gradients.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from dpsharp.torch import kernels  # noqa: E402
from dpsharp.torch.layers import usages  # noqa: E402

pytestmark = pytest.mark.torch

RTOL = {torch.float32: 1e-5, torch.float64: 1e-12}
IMPLEMENTATIONS = kernels.linear_norms_implementations()


def linear_reference(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(||g_i(W)||_F^2, ||g_i(b)||^2) in float64 from the explicit per-example gradients."""
    a64, g64 = a.double(), g.double()
    per_example = torch.einsum("btp,btd->bpd", g64, a64)
    return (per_example**2).sum(dim=(1, 2)), (g64.sum(dim=1) ** 2).sum(dim=1)


def embedding_reference(idx: torch.Tensor, gy: torch.Tensor, num_rows: int,
                        padding_idx: int | None) -> torch.Tensor:
    """Per-example gradients (B, num_rows, d) in float64 via one-hot matrices."""
    batch = idx.shape[0]
    positions = math.prod(idx.shape[1:])
    flat = idx.reshape(batch, positions).long()
    onehot = nn.functional.one_hot(flat, num_rows).double()
    if padding_idx is not None:
        onehot[..., padding_idx % num_rows] = 0.0
    rows = gy.reshape(batch, positions, gy.shape[-1]).double()
    return torch.einsum("btv,btd->bvd", onehot, rows)


def assert_rel(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    assert got.dtype == torch.float64 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=rtol, atol=0.0)


def assert_within_condition(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor,
                            rtol: float) -> None:
    """|got - want| <= rtol * scale elementwise, where scale is the same sum of products taken
    over absolute values (the standard forward-error bound of a floating-point sum). A plain
    relative tolerance fails where the terms cancel: ||sum_t g_it||^2 of a one-output bias over a
    few positions can be 1e-4 of its terms, and float32 sums carry errors of eps times the terms,
    not times the result."""
    assert got.shape == want.shape == scale.shape
    error = (got.double() - want).abs()
    bound = rtol * scale
    worst = float((error / scale.clamp_min(1e-300)).max()) if error.numel() else 0.0
    assert bool((error <= bound).all()), f"error / scale reaches {worst:.3g} > rtol {rtol:g}"


# --------------------------------------------------------------------------- linear


# (B, T, d, p): T = 1, T not a multiple of either tile (3, 4), d and p not multiples of 16
# (masked tails) or below one vector, the bench transformer's shapes, B = 0.
LINEAR_SHAPES = [
    (3, 1, 5, 7),
    (2, 1, 1, 1),
    (4, 2, 3, 2),
    (3, 5, 7, 9),
    (2, 7, 17, 33),
    (2, 13, 16, 16),
    (5, 11, 130, 31),
    (2, 64, 128, 384),
    (2, 64, 512, 128),
    (0, 4, 8, 8),
    (0, 0, 3, 3),
]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", LINEAR_SHAPES)
def test_linear_sequence_norms_against_reference(shape, dtype, implementation):
    batch, seq, d, p = shape
    gen = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(batch, seq, d, generator=gen, dtype=dtype)
    g = torch.randn(batch, seq, p, generator=gen, dtype=dtype)
    weight_sq, bias_sq = kernels.linear_sequence_sq_norms(a, g, bias=True,
                                                          implementation=implementation)
    want_w, want_b = linear_reference(a, g)
    assert_rel(weight_sq, want_w, RTOL[dtype])
    assert bias_sq is not None
    assert_rel(bias_sq, want_b, RTOL[dtype])
    only_w, none = kernels.linear_sequence_sq_norms(a, g, bias=False,
                                                    implementation=implementation)
    assert none is None and torch.equal(only_w, weight_sq)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(0, 4), seq=st.integers(1, 21), d=st.integers(1, 40),
       p=st.integers(1, 40), double=st.booleans(),
       implementation=st.sampled_from(IMPLEMENTATIONS))
def test_linear_sequence_norms_hypothesis_shapes(batch, seq, d, p, double, implementation):
    dtype = torch.float64 if double else torch.float32
    gen = torch.Generator().manual_seed(batch * 1_000_000 + seq * 10_000 + d * 100 + p)
    a = torch.randn(batch, seq, d, generator=gen, dtype=dtype)
    g = torch.randn(batch, seq, p, generator=gen, dtype=dtype)
    weight_sq, bias_sq = kernels.linear_sequence_sq_norms(a, g, bias=True,
                                                          implementation=implementation)
    want_w, want_b = linear_reference(a, g)
    scale_w, scale_b = linear_reference(a.abs(), g.abs())
    assert weight_sq.dtype == torch.float64
    assert_within_condition(weight_sq, want_w, scale_w, RTOL[dtype])
    assert bias_sq is not None
    assert_within_condition(bias_sq, want_b, scale_b, RTOL[dtype])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_sequence_norms_thread_count_does_not_change_bits(dtype, implementation):
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(37, 19, 45, generator=gen, dtype=dtype)
    g = torch.randn(37, 19, 70, generator=gen, dtype=dtype)
    one = kernels.linear_sequence_sq_norms(a, g, bias=True, threads=1,
                                           implementation=implementation)
    for threads in (2, 3):
        many = kernels.linear_sequence_sq_norms(a, g, bias=True, threads=threads,
                                                implementation=implementation)
        assert torch.equal(one[0], many[0])
        assert one[1] is not None and many[1] is not None
        assert torch.equal(one[1], many[1])


def test_linear_sequence_norms_implementations_agree_and_accept_strided_inputs():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(6, 40, 9, generator=gen).transpose(1, 2)  # (6, 9, 40), not contiguous
    g = torch.randn(6, 23, 9, generator=gen).transpose(1, 2)  # (6, 9, 23)
    assert not a.is_contiguous()
    want_w, want_b = linear_reference(a, g)
    for implementation in ["auto", *IMPLEMENTATIONS]:
        weight_sq, bias_sq = kernels.linear_sequence_sq_norms(a, g, bias=True,
                                                              implementation=implementation)
        assert_rel(weight_sq, want_w, 1e-5)
        assert bias_sq is not None
        assert_rel(bias_sq, want_b, 1e-5)


def test_linear_sequence_norms_bad_input():
    a, g = torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match="same dtype"):
        kernels.linear_sequence_sq_norms(a, g.double(), bias=True)
    with pytest.raises(ValueError, match="a must have dtype"):
        kernels.linear_sequence_sq_norms(a.half(), g.half(), bias=True)
    with pytest.raises(ValueError, match="g must have dtype"):
        kernels.linear_sequence_sq_norms(a, g.to(torch.int32), bias=True)
    with pytest.raises(ValueError, match="batch and positions"):
        kernels.linear_sequence_sq_norms(a, torch.randn(2, 4, 5), bias=True)
    with pytest.raises(ValueError, match="batch and positions"):
        kernels.linear_sequence_sq_norms(a, torch.randn(3, 3, 5), bias=True)
    with pytest.raises(ValueError, match="a must be 3-D"):
        kernels.linear_sequence_sq_norms(a[0], g, bias=True)
    with pytest.raises(ValueError, match="g must be 3-D"):
        kernels.linear_sequence_sq_norms(a, g[..., None], bias=True)
    with pytest.raises(ValueError, match="implementation"):
        kernels.linear_sequence_sq_norms(a, g, bias=True, implementation="sse9")


def test_linear_usage_uses_the_kernel_and_caches_weight_and_bias():
    gen = torch.Generator().manual_seed(11)
    layer = nn.Linear(12, 20)
    a = torch.randn(5, 9, 12, generator=gen)
    g = torch.randn(5, 9, 20, generator=gen)
    usage = usages.LinearUsage(layer.weight, layer.bias, a, g, scale=3.0)
    assert not usage._materialise_weight()
    want_w, want_b = linear_reference(a, g)
    assert_rel(usage.sq_norm(layer.weight), want_w * 9.0, 1e-5)
    cached = usage._sequence_sq
    assert cached is not None
    assert_rel(usage.sq_norm(layer.bias), want_b * 9.0, 1e-5)
    assert usage._sequence_sq is cached  # one kernel call for both


@pytest.mark.parametrize(("seq", "d", "p", "materialise"), [
    (64, 128, 384, False), (64, 128, 128, False), (64, 128, 512, False), (64, 512, 128, False),
    (2, 4, 3, False), (40, 4, 3, True), (128, 128, 128, True), (64, 64, 64, True),
    (1, 4096, 4096, False),
])
def test_linear_cost_rule_on_the_cpu(seq, d, p, materialise):
    """T^2 (d + p) / 2 > 40 d p materialises (see LinearUsage._materialise_weight)."""
    usage = usages.LinearUsage(None, None, torch.zeros(1, seq, d), torch.zeros(1, seq, p))
    assert usage._materialise_weight() is materialise


# --------------------------------------------------------------------------- embedding


def embedding_case(batch, positions, num_rows, features, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, num_rows, (batch, positions), generator=gen)
    gy = torch.randn(batch, positions, features, generator=gen, dtype=dtype)
    factors = torch.rand(batch, generator=gen, dtype=torch.float64)
    return idx, gy, factors


def check_embedding(idx, gy, factors, num_rows, padding_idx, dtype, threads=None):
    per_example = embedding_reference(idx, gy, num_rows, padding_idx)
    per_example_abs = embedding_reference(idx, gy.abs(), num_rows, padding_idx)
    norms = kernels.embedding_sq_norms(idx, gy, num_rows=num_rows, padding_idx=padding_idx,
                                       threads=threads)
    assert norms.dtype == torch.float64
    # repeated rows sum within an example, and examples sum in the clipped sum: both may cancel
    assert_within_condition(norms, (per_example**2).sum(dim=(1, 2)),
                            (per_example_abs**2).sum(dim=(1, 2)), RTOL[dtype])
    summed = kernels.embedding_clipped_sum(idx, gy, factors, num_rows=num_rows,
                                           padding_idx=padding_idx, threads=threads)
    assert summed.dtype == dtype and summed.shape == (num_rows, gy.shape[-1])
    want = (factors[:, None, None] * per_example).sum(dim=0)
    want_scale = (factors.abs()[:, None, None] * per_example_abs).sum(dim=0)
    assert_within_condition(summed, want, want_scale, RTOL[dtype])
    if padding_idx is not None:
        assert not summed[padding_idx].any()
    # accumulating into an existing buffer: its rows plus the clipped sum, the rows nobody
    # looked up (and the padding row) untouched
    start = torch.randn(num_rows, gy.shape[-1], dtype=torch.float64).to(dtype)
    added = kernels.embedding_clipped_sum(idx, gy, factors, num_rows=num_rows,
                                          padding_idx=padding_idx, out=start.clone(),
                                          threads=threads)
    magnitude = float(start.double().abs().max() + want.abs().max()) if want.numel() else 1.0
    torch.testing.assert_close(added.double(), start.double() + want, rtol=RTOL[dtype],
                               atol=RTOL[dtype] * magnitude)  # sums may cancel
    looked_up = torch.zeros(num_rows, dtype=torch.bool)
    looked_up[idx.reshape(-1).remainder(max(num_rows, 1))] = True
    if padding_idx is not None:
        looked_up[padding_idx] = False
    assert torch.equal(added[~looked_up], start[~looked_up])
    return norms, summed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("padding_idx", [None, 0, 3, -1])
@pytest.mark.parametrize(("batch", "positions", "num_rows", "features"), [
    (6, 9, 5, 7),      # many repeats within an example
    (4, 64, 10_000, 33),  # few repeats, features not a multiple of 8
    (3, 1, 4, 16),
    (5, 40, 1, 3),     # every position looks up the only row
    (0, 5, 6, 4),
    (3, 0, 6, 4),
])
def test_embedding_kernels_against_reference(batch, positions, num_rows, features, padding_idx,
                                             dtype):
    if padding_idx is not None and padding_idx >= num_rows:
        padding_idx = num_rows - 1  # the one-row table: its only row
    idx, gy, factors = embedding_case(batch, positions, num_rows, features, dtype,
                                      batch + positions + num_rows)
    if padding_idx is not None and batch and positions:
        idx[0, 0] = padding_idx % num_rows  # at least one padding position
    check_embedding(idx, gy, factors, num_rows, padding_idx, dtype)


def test_embedding_kernels_repeated_rows_and_padding_by_hand():
    idx = torch.tensor([[1, 1, 2, 0, 5], [3, 0, 0, 3, 3], [7, 8, 9, 10, 11], [4, 4, 4, 4, 4]])
    gy = torch.arange(4 * 5 * 2, dtype=torch.float64).reshape(4, 5, 2) / 10.0
    factors = torch.tensor([1.0, 0.5, 0.25, 2.0], dtype=torch.float64)
    norms, summed = check_embedding(idx, gy, factors, 13, 0, torch.float64)
    # example 3 looks up row 4 five times: its gradient row is the sum of its five rows
    row = gy[3].sum(dim=0)
    assert norms[3].item() == pytest.approx(float((row**2).sum()), rel=1e-15)
    torch.testing.assert_close(summed[4], 2.0 * row, rtol=1e-15, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedding_kernels_strided_multidim_and_int32_indices(dtype):
    gen = torch.Generator().manual_seed(5)
    base = torch.randint(0, 7, (3, 4, 5), generator=gen)
    idx = base.permute(2, 0, 1)  # (5, 3, 4), not contiguous
    assert not idx.is_contiguous()
    gy = torch.randn(4, 3, 5, 6, generator=gen, dtype=dtype).permute(2, 1, 0, 3)  # (5, 3, 4, 6)
    factors = torch.rand(5, generator=gen, dtype=torch.float64)
    norms, summed = check_embedding(idx, gy, factors, 7, 2, dtype)
    norms32, summed32 = check_embedding(idx.to(torch.int32), gy, factors, 7, 2, dtype)
    assert torch.equal(norms, norms32) and torch.equal(summed, summed32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedding_kernels_thread_count_does_not_change_bits(dtype):
    idx, gy, factors = embedding_case(33, 50, 40, 70, dtype, 9)
    idx[:, ::7] = 3
    one = check_embedding(idx, gy, factors, 40, 1, dtype, threads=1)
    for threads in (2, 3):
        many = (kernels.embedding_sq_norms(idx, gy, num_rows=40, padding_idx=1,
                                           threads=threads),
                kernels.embedding_clipped_sum(idx, gy, factors, num_rows=40, padding_idx=1,
                                              threads=threads))
        assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(0, 5), positions=st.integers(0, 30), num_rows=st.integers(1, 12),
       features=st.integers(1, 20), pad=st.one_of(st.none(), st.integers(0, 11)),
       double=st.booleans())
def test_embedding_kernels_hypothesis_shapes(batch, positions, num_rows, features, pad, double):
    dtype = torch.float64 if double else torch.float32
    padding_idx = None if pad is None else pad % num_rows
    idx, gy, factors = embedding_case(batch, positions, num_rows, features, dtype,
                                      batch * 10_000 + positions * 100 + num_rows)
    check_embedding(idx, gy, factors, num_rows, padding_idx, dtype)


def test_embedding_kernels_bad_input():
    idx = torch.tensor([[0, 1, 2], [2, 1, 0]])
    gy = torch.randn(2, 3, 4)
    factors = torch.ones(2, dtype=torch.float64)
    for bad_value in (3, -1, 1 << 40):
        bad = idx.clone()
        bad[1, 2] = bad_value
        with pytest.raises(ValueError, match="indices must lie in"):
            kernels.embedding_sq_norms(bad, gy, num_rows=3)
        with pytest.raises(ValueError, match="indices must lie in"):
            kernels.embedding_clipped_sum(bad, gy, factors, num_rows=3)
    with pytest.raises(ValueError, match="indices must have dtype"):
        kernels.embedding_sq_norms(idx.double(), gy, num_rows=3)
    with pytest.raises(ValueError, match="out_grads must have dtype"):
        kernels.embedding_sq_norms(idx, gy.half(), num_rows=3)
    with pytest.raises(ValueError, match="out_grads must have shape"):
        kernels.embedding_sq_norms(idx, gy[:, :2], num_rows=3)
    with pytest.raises(ValueError, match="out_grads must have shape"):
        kernels.embedding_sq_norms(idx, gy[0], num_rows=3)
    with pytest.raises(ValueError, match="num_rows"):
        kernels.embedding_sq_norms(idx, gy, num_rows=-1)
    with pytest.raises(ValueError, match="padding_idx"):
        kernels.embedding_sq_norms(idx, gy, num_rows=3, padding_idx=3)
    with pytest.raises(ValueError, match="factors must have dtype"):
        kernels.embedding_clipped_sum(idx, gy, factors.float(), num_rows=3)
    with pytest.raises(ValueError, match="factors must have 2 elements"):
        kernels.embedding_clipped_sum(idx, gy, torch.ones(3, dtype=torch.float64), num_rows=3)
    with pytest.raises(ValueError, match="indices must have a leading batch"):
        kernels.embedding_sq_norms(idx[0, 0], gy[0, 0], num_rows=3)


def test_embedding_usage_cpu_kernels_match_torch_path():
    """The usage's CPU kernels and its torch path (unique / index_add, used on other devices)
    give the same norms and clipped sums."""
    gen = torch.Generator().manual_seed(2)
    emb = nn.Embedding(9, 5, padding_idx=4)
    idx = torch.randint(0, 9, (6, 11), generator=gen)
    idx[:, :3] = 4
    idx[0, 5:] = 7
    gy = torch.randn(6, 11, 5, generator=gen)
    factors = torch.rand(6, generator=gen, dtype=torch.float64)
    fused = usages.EmbeddingUsage(emb.weight, idx, gy, 4, scale=2.0)
    plain = usages.EmbeddingUsage(emb.weight, idx, gy, 4, scale=2.0)
    plain._fused = lambda: False  # type: ignore[method-assign]
    torch.testing.assert_close(fused.sq_norm(emb.weight), plain.sq_norm(emb.weight),
                               rtol=1e-6, atol=0.0)
    torch.testing.assert_close(fused.clipped_sum(emb.weight, factors),
                               plain.clipped_sum(emb.weight, factors), rtol=1e-5, atol=1e-6)


# ---- layer-norm affine gradients ------------------------------------------------------------
# Reference: autograd of y = layer_norm(x) * w + b for each example alone, in float64, i.e. the
# per-example gradients of w and b themselves (not the kernel's formula).


def _layer_norm_reference(x: torch.Tensor, gy: torch.Tensor,
                          normalized_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.ones(normalized_shape, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(normalized_shape, dtype=torch.float64, requires_grad=True)
    rows_w, rows_b = [], []
    for i in range(x.shape[0]):
        y = nn.functional.layer_norm(x[i:i + 1].double(), normalized_shape, w, b, eps=1e-5)
        gw, gb = torch.autograd.grad(y, (w, b), gy[i:i + 1].double())
        rows_w.append(gw)
        rows_b.append(gb)
    return torch.stack(rows_w), torch.stack(rows_b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "normalized_dims"),
                         [((5, 7, 13), 1), ((3, 4, 6, 5), 2), ((4, 9), 1), ((2, 1, 33), 1)])
def test_layer_norm_affine_rows_equal_per_example_autograd(dtype, shape, normalized_dims):
    torch.manual_seed(sum(shape))
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 1).to(dtype)
    gy = torch.randn(shape, dtype=torch.float64).to(dtype)
    normalized_shape = tuple(shape[len(shape) - normalized_dims:])
    _, mean, rstd = torch.native_layer_norm(x, normalized_shape, None, None, 1e-5)
    w_rows, b_rows = kernels.layer_norm_affine_rows(x, mean, rstd, gy, normalized_dims)
    want_w, want_b = _layer_norm_reference(x, gy, normalized_shape)
    assert w_rows.dtype == dtype and w_rows.shape == (shape[0], *normalized_shape)
    torch.testing.assert_close(w_rows.double(), want_w, rtol=RTOL[dtype], atol=RTOL[dtype])
    torch.testing.assert_close(b_rows.double(), want_b, rtol=RTOL[dtype], atol=RTOL[dtype])
    only_w, none_b = kernels.layer_norm_affine_rows(x, mean, rstd, gy, normalized_dims,
                                                    bias=False)
    assert none_b is None and torch.equal(only_w, w_rows)


def test_layer_norm_affine_rows_thread_count_and_strided_input():
    torch.manual_seed(9)
    x = torch.randn(16, 40, 96)
    gy = torch.randn(16, 96, 40).transpose(1, 2)  # strided: made contiguous by the adapter
    _, mean, rstd = torch.native_layer_norm(x, (96,), None, None, 1e-5)
    one = kernels.layer_norm_affine_rows(x, mean, rstd, gy, 1, threads=1)
    two = kernels.layer_norm_affine_rows(x, mean, rstd, gy, 1, threads=2)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    empty = kernels.layer_norm_affine_rows(x[:0], mean[:0], rstd[:0], gy[:0], 1)
    assert empty[0].shape == (0, 96)


def test_layer_norm_affine_rows_bad_input():
    x = torch.randn(2, 3, 4)
    _, mean, rstd = torch.native_layer_norm(x, (4,), None, None, 1e-5)
    with pytest.raises(ValueError, match="one shape and dtype"):
        kernels.layer_norm_affine_rows(x, mean, rstd, x.double(), 1)
    with pytest.raises(ValueError, match="float32 or float64"):
        kernels.layer_norm_affine_rows(x.half(), mean, rstd, x.half(), 1)
    with pytest.raises(ValueError, match="normalized_dims"):
        kernels.layer_norm_affine_rows(x, mean, rstd, x, 3)
    with pytest.raises(ValueError, match="mean"):
        kernels.layer_norm_affine_rows(x, mean[:1], rstd, x, 1)
