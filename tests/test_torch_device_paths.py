"""The device-side helpers of the clipper, run here on CPU tensors (the functions do not depend on
the device; tests/test_cuda_kernels.py runs them on a GPU):

* ``_device_weighted_sum``: sum_i w_i rows[i] as blocked float32 / float64 matrix products,
  against the float64 sum of the same values;
* ``_as_autocast_reads``: the input a layer's product reads under autocast (torch's cast rule).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("batch", [1, 7, 256, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_device_weighted_sum_matches_float64_sum(batch: int, dtype: torch.dtype) -> None:
    """float32 rows: within the blocked summation bound (4,096-example blocks in float32, blocks
    added in float64) of the exact sum of the float32-rounded weights times the rows; float64
    rows: to float64 rounding. Also the in-place form (out += sum)."""
    from dpsharp.torch.layers.usages import _device_weighted_sum

    gen = torch.Generator().manual_seed(batch)
    rows = torch.randn(batch, 3, 5, generator=gen).to(dtype)
    weights = torch.rand(batch, generator=gen, dtype=torch.float64)
    got = _device_weighted_sum(rows, weights)
    assert got.dtype == dtype and got.shape == (15,)
    w = weights.to(dtype).double()  # the weights are rounded once to the rows' dtype
    exact = (w[:, None] * rows.reshape(batch, -1).double()).sum(dim=0)
    magnitude = (w[:, None] * rows.reshape(batch, -1).double()).abs().sum(dim=0)
    unit = 2.0**-24 if dtype == torch.float32 else 2.0**-53
    bound = (min(batch, 4096) + 2) * unit * magnitude + unit * exact.abs()
    assert bool(((got.double() - exact).abs() <= bound).all())
    base = torch.randn(15, generator=gen).to(dtype)
    out = base.clone()
    assert _device_weighted_sum(rows, weights, out=out) is out
    assert bool(((out.double() - base.double() - exact).abs()
                 <= bound + 2 * unit * (base.double().abs() + exact.abs())).all())


def test_autocast_reads_follow_torch_cast_rule() -> None:
    """Under CPU autocast (bfloat16) a float32 input is read as bfloat16, a float64 input and an
    integer input as they are; outside autocast nothing is cast. The weight gradient of a linear
    layer under autocast is the product with exactly that cast input."""
    from dpsharp.torch.layers.functions import _as_autocast_reads

    x32 = torch.randn(4, 3)
    x64 = x32.double()
    idx = torch.arange(4)
    assert _as_autocast_reads(x32) is x32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = _as_autocast_reads(x32)
        assert cast.dtype == torch.bfloat16 and torch.equal(cast, x32.to(torch.bfloat16))
        assert _as_autocast_reads(x64) is x64
        assert _as_autocast_reads(idx) is idx
        # torch's own product under autocast: its weight gradient is g^T x_cast
        w = torch.randn(2, 3, requires_grad=True)
        out = torch.nn.functional.linear(x32, w)
    g = torch.randn(4, 2).to(out.dtype)
    out.backward(g)
    want = (g.t() @ cast).float()
    torch.testing.assert_close(w.grad, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("shape", "kernel", "stride", "padding", "dilation"),
    [((3, 4, 9, 10), (3, 3), (1, 1), (1, 1), (1, 1)),
     ((2, 2, 7, 8), (2, 3), (2, 1), (0, 2), (2, 1)),
     ((2, 3, 12, 12), (7, 7), (3, 2), (3, 3), (1, 1)),
     ((4, 3, 17), (5,), (1,), (2,), (3,)),
     ((3, 2, 12), (6,), (3,), (4,), (2,))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_conv_patches_equal_cpu_kernel(shape, kernel, stride, padding, dilation,
                                              dtype) -> None:
    """The patches the clipper builds off the CPU (im2col for 2-D kernels, a strided gather for
    1-D ones) equal the C++ kernel's, which builds them position by position, and read the
    same through the product that uses them, G_i P_i."""
    from dpsharp.torch import kernels
    from dpsharp.torch.layers.usages import _device_conv_patches

    gen = torch.Generator().manual_seed(len(shape) + kernel[0])
    x = torch.randn(*shape, generator=gen).to(dtype)
    got = _device_conv_patches(x, kernel, stride, padding, dilation)
    want = kernels.conv_patches(x, kernel, stride, padding, dilation)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)
    # the transposed-view layout reads correctly through a batched product (the product's
    # kernel may differ by layout, so to rounding, not bit for bit)
    g = torch.randn(shape[0], 5, want.shape[1], generator=gen).to(dtype)
    torch.testing.assert_close(torch.bmm(g, got), torch.bmm(g, want))


@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_device_embedding_paths_equal_fused_cpu_kernels(padding_idx, dtype) -> None:
    """The embedding norms and clipped sums the clipper computes off the CPU (a Gram matrix
    masked by index equality; a float64 table) against the CPU kernels, which group positions
    by row, on indices with repeats within an example and the padding row."""
    from dpsharp.torch.layers.usages import EmbeddingUsage

    gen = torch.Generator().manual_seed(3)
    weight = torch.nn.Parameter(torch.randn(11, 6, generator=gen).to(dtype))
    idx = torch.randint(0, 11, (5, 9), generator=gen)
    idx[0, :3] = 4  # a row repeated within an example
    out_grads = torch.randn(5, 9, 6, generator=gen).to(dtype)
    factors = torch.rand(5, generator=gen, dtype=torch.float64)

    fused = EmbeddingUsage(weight, idx, out_grads, padding_idx, scale=0.5)
    device_path = EmbeddingUsage(weight, idx, out_grads, padding_idx, scale=0.5)
    device_path._fused = lambda: False  # the code path other devices take
    rtol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(device_path.sq_norm(weight), fused.sq_norm(weight), rtol=rtol,
                               atol=0)
    torch.testing.assert_close(device_path.clipped_sum(weight, factors),
                               fused.clipped_sum(weight, factors), rtol=rtol, atol=1e-12)
    # and both against the definition: per-example gradient rows summed in float64
    rows = torch.zeros(5, 11, 6, dtype=torch.float64)
    keep = (idx != padding_idx) if padding_idx is not None else torch.ones_like(idx, dtype=bool)
    rows.index_put_((torch.arange(5)[:, None].expand(5, 9)[keep], idx[keep]),
                    0.5 * out_grads[keep].double(), accumulate=True)
    torch.testing.assert_close(device_path.sq_norm(weight), rows.pow(2).sum(dim=(1, 2)),
                               rtol=rtol, atol=0)


def test_device_embedding_norm_holds_where_positions_cancel() -> None:
    """One row looked up at every position with output gradients that nearly cancel (+g, -g,
    ... plus 1e-3 noise): the off-CPU norm (masked Gram) equals the float64 norm of the summed
    row. (In float32 the Gram underestimated it by 60%, letting the clipped contribution reach
    1.57 C.)"""
    from dpsharp.torch.layers.usages import EmbeddingUsage

    gen = torch.Generator().manual_seed(0)
    t, d = 64, 64
    worst = 1.0
    for _ in range(20):
        g0 = torch.randn(d, generator=gen)
        signs = torch.tensor([1.0, -1.0] * (t // 2))
        gy = (signs[:, None] * g0 + 1e-3 * torch.randn(t, d, generator=gen)).unsqueeze(0)
        weight = torch.nn.Parameter(torch.zeros(10, d))
        usage = EmbeddingUsage(weight, torch.full((1, t), 7), gy, None)
        usage._fused = lambda: False
        got = float(usage.sq_norm(weight)[0])
        want = float(gy.double().sum(dim=1).pow(2).sum())
        worst = min(worst, got / want)
    assert worst > 1.0 - 2e-6  # a norm within 1e-6 of the float64 one


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_per_example_gradients_are_float32_products(dtype) -> None:
    """A linear layer's per-example gradients from half-precision stored tensors (autocast) are
    float32 sums of the exact products, equal to the float64 product within float32 rounding
    (the clipped sum of a tied weight reads them)."""
    from dpsharp.torch.layers.usages import LinearUsage

    gen = torch.Generator().manual_seed(9)
    weight = torch.nn.Parameter(torch.randn(6, 5, generator=gen))
    a = torch.randn(3, 4, 5, generator=gen).to(dtype)
    g = torch.randn(3, 4, 6, generator=gen).to(dtype)
    got = LinearUsage(weight, None, a, g).per_example(weight)
    assert got.dtype == torch.float32 and got.shape == (3, 6, 5)
    want = torch.bmm(g.double().transpose(1, 2), a.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
