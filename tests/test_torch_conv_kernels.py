"""The C++ convolution-patch (im2col) and per-example dot kernels against torch references.

References: ``torch.nn.functional.unfold`` (torch's own im2col) for the patches, transposed to
(B, L, C * prod(kernel)); float64 torch products and sums for the dots. The convolution usage's
Gram (ghost) path and its chunking are checked end to end against a batch-size-1 autograd
reference in the clipper.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dpsharp.torch import NoiseGenerator, PerSampleClipper, kernels  # noqa: E402
from dpsharp.torch.layers import usages  # noqa: E402

pytestmark = pytest.mark.torch

DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def unfold_reference(x, kernel, stride, padding, dilation):
    """F.unfold (B, C*k_h*k_w, L) -> (B, L, C*k_h*k_w); 1-D inputs as height-1 images."""
    if x.dim() == 3:
        x = x.unsqueeze(2)
        kernel, stride, dilation = ((1,) + tuple(t) for t in (kernel, stride, dilation))
        padding = (0,) + tuple(padding)
    cols = F.unfold(x.double(), kernel, dilation=dilation, padding=padding, stride=stride)
    return cols.transpose(1, 2).to(x.dtype)


# (C, H, W, kernel, stride, padding, dilation): every specialised kernel width (1-5, 7, 8) and
# the generic one (6, 9), rows that cross the padding, strides and dilations.
GEOMETRIES_2D = [
    (1, 28, 28, (8, 8), (2, 2), (3, 3), (1, 1)),
    (16, 13, 13, (4, 4), (2, 2), (0, 0), (1, 1)),
    (3, 9, 10, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 7, 8, (2, 3), (2, 1), (0, 2), (2, 1)),
    (4, 6, 11, (1, 5), (1, 3), (1, 0), (1, 2)),
    (2, 12, 12, (7, 7), (3, 2), (3, 3), (1, 1)),
    (1, 5, 15, (1, 1), (1, 1), (0, 0), (1, 1)),
    (3, 10, 20, (2, 6), (1, 2), (1, 2), (2, 2)),
    (2, 11, 14, (3, 9), (2, 1), (0, 4), (1, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", GEOMETRIES_2D)
def test_conv_patches_2d_equal_unfold(dtype, geometry):
    c, h, w, kernel, stride, padding, dilation = geometry
    torch.manual_seed(0)
    x = torch.randn(3, c, h, w, dtype=torch.float64).to(dtype)
    got = kernels.conv_patches(x, kernel, stride, padding, dilation, threads=2)
    want = unfold_reference(x, kernel, stride, padding, dilation)
    assert got.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("length", "kernel", "stride", "padding", "dilation"),
    [(10, 3, 2, 1, 1), (17, 5, 1, 2, 3), (8, 8, 1, 0, 1), (9, 1, 4, 0, 1), (12, 6, 3, 4, 2)],
)
def test_conv_patches_1d_equal_unfold(dtype, length, kernel, stride, padding, dilation):
    torch.manual_seed(1)
    x = torch.randn(4, 3, length, dtype=torch.float64).to(dtype)
    got = kernels.conv_patches(x, (kernel,), (stride,), (padding,), (dilation,))
    want = unfold_reference(x, (kernel,), (stride,), (padding,), (dilation,))
    assert torch.equal(got, want)


def test_conv_patches_non_contiguous_input_and_many_examples():
    torch.manual_seed(2)
    # channels_last storage and a batch large enough to be split over threads
    x = torch.randn(64, 5, 9, 9).to(memory_format=torch.channels_last)
    got = kernels.conv_patches(x, (3, 3), (1, 1), (1, 1), (1, 1), threads=2)
    assert torch.equal(got, unfold_reference(x.contiguous(), (3, 3), (1, 1), (1, 1), (1, 1)))


def test_conv_patches_empty_batch():
    x = torch.empty(0, 2, 6, 6)
    got = kernels.conv_patches(x, (3, 3), (1, 1), (0, 0), (1, 1))
    assert got.shape == (0, 16, 18)
    got_1d = kernels.conv_patches(torch.empty(0, 2, 6), (3,), (2,), (1,), (1,))
    assert got_1d.shape == (0, 3, 6)


def test_conv_patches_bad_arguments():
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match="x must be"):
        kernels.conv_patches(torch.randn(2, 3, 4, 4, 4), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
    with pytest.raises(ValueError, match="kernel_size"):
        kernels.conv_patches(x, (3,), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="kernel_size, stride and dilation must be >= 1"):
        kernels.conv_patches(x, (0, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="stride"):
        kernels.conv_patches(x, (3, 3), (1, 0), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="padding >= 0"):
        kernels.conv_patches(x, (3, 3), (1, 1), (-1, 0), (1, 1))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        kernels.conv_patches(x, (5, 5), (1, 1), (0, 0), (3, 3))
    with pytest.raises(ValueError, match="dtype"):
        kernels.conv_patches(x.to(torch.int32), (3, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="CPU"):
        kernels.conv_patches(x.to("meta"), (3, 3), (1, 1), (0, 0), (1, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 1), (7, 3, 5), (3, 64, 64), (40, 1001)])
def test_per_example_dots_equal_float64_torch(dtype, shape):
    torch.manual_seed(3)
    a = (torch.randn(shape, dtype=torch.float64) * 30).to(dtype)
    b = (torch.randn(shape, dtype=torch.float64) * 30).to(dtype)
    got = kernels.per_example_dots(a, b, threads=2)
    want = (a.double() * b.double()).reshape(shape[0], -1).sum(dim=1)
    assert got.dtype == torch.float64
    # float64 products of exactly representable inputs; only the summation order differs
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)


def test_per_example_dots_empty_and_float16():
    assert kernels.per_example_dots(torch.empty(0, 4), torch.empty(0, 4)).shape == (0,)
    a = torch.randn(3, 10).half()
    want = (a.double() * a.double()).sum(dim=1)
    torch.testing.assert_close(kernels.per_example_dots(a, a), want, rtol=1e-12, atol=0.0)


def test_per_example_dots_bad_arguments():
    with pytest.raises(ValueError, match="same shape"):
        kernels.per_example_dots(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="same shape, dtype"):
        kernels.per_example_dots(torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch dimension"):
        kernels.per_example_dots(torch.tensor(1.0), torch.tensor(2.0))


# --------------------------------------------------------------------------- per-example grads
def conv_weight_grads_reference(x, g, conv_kwargs, one_d):
    """Each example's weight gradient from torch's own convolution backward, in float64."""
    conv_backward = torch.nn.grad.conv1d_weight if one_d else torch.nn.grad.conv2d_weight
    kernel = conv_kwargs.pop("kernel_size")
    weight_shape = (g.shape[1], x.shape[1], *kernel)
    rows = [conv_backward(x[i : i + 1].double(), weight_shape, g[i : i + 1].double(),
                          **conv_kwargs).reshape(g.shape[1], -1) for i in range(x.shape[0])]
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("channels", "out_channels", "spatial", "conv_kwargs"),
    [
        (1, 16, (28, 28), dict(kernel_size=(8, 8), stride=(2, 2), padding=(3, 3))),  # bench CNN
        (16, 32, (13, 13), dict(kernel_size=(4, 4), stride=(2, 2), padding=(0, 0))),
        # edge tiles: out_channels not a multiple of 4, rows not a multiple of 64 / 32
        (3, 5, (7, 6), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1))),
        (7, 9, (11,), dict(kernel_size=(3,), stride=(2,), padding=(2,), dilation=(3,))),
        (2, 1, (1, 1), dict(kernel_size=(1, 1), stride=(1, 1), padding=(0, 0))),
    ],
)
def test_conv_per_example_weight_grads_against_torch_per_example(dtype, channels, out_channels,
                                                                 spatial, conv_kwargs):
    torch.manual_seed(7)
    one_d = len(spatial) == 1
    conv = nn.Conv1d if one_d else nn.Conv2d
    layer = conv(channels, out_channels, **conv_kwargs).to(dtype)
    x = torch.randn(6, channels, *spatial, dtype=dtype)
    g = torch.randn_like(layer(x))
    geometry = tuple(tuple(conv_kwargs.get(k, (1,) * len(spatial)))
                     for k in ("kernel_size", "stride", "padding", "dilation"))
    got = kernels.conv_per_example_weight_grads(x, g, *geometry, threads=2)
    want = conv_weight_grads_reference(x, g, dict(conv_kwargs), one_d)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 2e-6 if dtype == torch.float32 else 1e-13
    scale = float(want.abs().max())
    assert float((got.double() - want).abs().max()) <= tol * scale
    # each example is summed by one thread in a fixed order: the same bits on 1 thread
    assert torch.equal(got, kernels.conv_per_example_weight_grads(x, g, *geometry, threads=1))


def test_conv_per_example_weight_grads_bad_input():
    x, g = torch.randn(2, 3, 5, 5), torch.randn(2, 4, 3, 3)
    geometry = ((3, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="dtype float32, float64"):
        kernels.conv_per_example_weight_grads(x.bfloat16(), g.bfloat16(), *geometry)
    with pytest.raises(ValueError, match="out_grads must have dtype"):
        kernels.conv_per_example_weight_grads(x, g.double(), *geometry)
    with pytest.raises(ValueError, match="out_grads must have 72 elements"):
        kernels.conv_per_example_weight_grads(x, g[:, :, :2], *geometry)
    with pytest.raises(ValueError, match="B = 2"):
        kernels.conv_per_example_weight_grads(x, g[:1], *geometry)
    with pytest.raises(ValueError, match="smaller than the kernel"):
        kernels.conv_per_example_weight_grads(x, g, (7, 7), (1, 1), (0, 0), (1, 1))


# --------------------------------------------------------------------------- through the clipper
def per_example_reference(model, x, y):
    ref = copy.deepcopy(model)
    params = [p for p in ref.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        ref.zero_grad(set_to_none=True)
        F.mse_loss(ref(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append([p.grad.clone() for p in params])
    return [torch.stack([r[k] for r in rows]) for k in range(len(params))]


@pytest.mark.parametrize("chunk_elements", [1 << 17, 1])
@pytest.mark.parametrize(
    ("make_layer", "spatial"),
    [
        # O d > 2 L (d + O): the Gram (ghost) norm and the clipped sum as a weight gradient
        (lambda: nn.Conv2d(8, 16, 3, padding=1, stride=2), (4, 4)),
        (lambda: nn.Conv1d(6, 12, 4, dilation=2), (9,)),
        # O d <= L (d + O): materialised per-example gradients
        (lambda: nn.Conv2d(2, 3, (2, 3), padding=(1, 0), dilation=(1, 2)), (6, 7)),
        # L (d + O) < O d <= 2 L (d + O): materialised because the fused CPU kernel makes them
        (lambda: nn.Conv2d(4, 8, 3, padding=1, stride=2), (4, 4)),
    ],
)
def test_conv_usage_paths_against_batch_size_one_reference(monkeypatch, make_layer, spatial,
                                                           chunk_elements):
    # chunk_elements = 1: one example per chunk, so the chunk loops run more than once
    monkeypatch.setattr(usages, "_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(4)
    layer = make_layer()
    model = nn.Sequential(layer, nn.Flatten())
    x = torch.randn(5, layer.in_channels, *spatial)
    y = torch.randn_like(model(x))
    per_example = per_example_reference(model, x, y)
    bound = 0.05
    norms_ref = torch.stack([(g.double().reshape(5, -1) ** 2).sum(1)
                             for g in per_example]).sum(0).sqrt()
    factors = torch.clamp(bound / norms_ref, max=1.0)
    sums_ref = [(factors.to(g.dtype).reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0)
                for g in per_example]
    clipper = PerSampleClipper(model, max_grad_norm=bound)
    F.mse_loss(model(x), y).backward()
    torch.testing.assert_close(clipper.last_per_example_norms, norms_ref, rtol=1e-5, atol=1e-8)
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    for p, want in zip(clipper.parameters, sums_ref):
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-7)
    assert bool((factors < 1).any()), "the bound must clip some examples"
