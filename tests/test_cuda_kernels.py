"""CUDA kernels (cpp/cuda/clip_kernels.cu) against the CPU kernels and the pure-torch reference.

Skipped without a CUDA device or without a CUDA build. Expected: the noise stream and the fused
clip-accumulate-noise pass equal the CPU kernel bit for bit (same ChaCha8 counters, same IEEE
operations, -fmad=false, same summation order over examples); squared norms agree to float64
summation-order error.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.cuda]


def _need_cuda() -> None:
    from dpsharp.torch import kernels

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not kernels.cuda_built():
        pytest.skip("dpsharp._core was built without DPSHARP_CUDA")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("numel", [3003, 200_003])  # one block per example; sliced rows
def test_sq_norms_match_cpu_and_reference(dtype: torch.dtype, numel: int) -> None:
    _need_cuda()
    from dpsharp.torch import kernels

    x = torch.randn(17, 3, numel // 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    cpu = kernels.per_example_sq_norms(x)
    gpu = kernels.per_example_sq_norms(x.cuda())
    assert gpu.is_cuda and gpu.dtype == torch.float64
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-13, atol=0)
    torch.testing.assert_close(gpu.cpu(), kernels.reference_per_example_sq_norms(x), rtol=1e-13,
                               atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("numel", [1, 2, 7, 4099])
def test_fused_pass_equals_cpu_bit_for_bit(dtype: torch.dtype, numel: int) -> None:
    _need_cuda()
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(numel)
    pe = torch.randn(9, numel, generator=gen).to(dtype)
    factors = torch.rand(9, generator=gen, dtype=torch.float64)
    base = torch.randn(numel, generator=gen).to(dtype)
    args = {"noise_std": 0.7, "key": 0x1234_5678_9ABC_DEF0, "parameter": 3, "release": 11,
            "rank": 1, "scale": 1.0 / 64}
    cpu = kernels.clip_accumulate_noise(base.clone(), per_example=pe, factors=factors,
                                        base=base.clone(), **args)
    out = base.clone().cuda()
    gpu = kernels.clip_accumulate_noise(out, per_example=pe.cuda(), factors=factors.cuda(),
                                        base=out, **args)
    torch.cuda.synchronize()
    assert torch.equal(gpu.cpu(), cpu)
    ref = kernels.reference_clip_accumulate_noise(base.clone(), per_example=pe, factors=factors,
                                                  base=base.clone(), **args)
    assert torch.equal(gpu.cpu(), ref)


@pytest.mark.parametrize(("precision", "dtype"),
                         [("float32", torch.float32), ("float64", torch.float64)])
def test_noise_stream_equals_cpu_stream(precision: str, dtype: torch.dtype) -> None:
    _need_cuda()
    from dpsharp._native import core
    from dpsharp.torch import kernels

    n = 100_003
    key = kernels.key_words(2**200 + 7)
    cpu = torch.from_numpy(core.gaussian_stream(key, 2, 5, 1, 0, n, precision))
    gpu = torch.empty(n, dtype=dtype, device="cuda")
    core.cuda_gaussian_noise(key, 2, 5, 1, n, precision, gpu.data_ptr(),
                             torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(gpu.cpu(), cpu)


def test_clipper_release_on_cuda_matches_cpu() -> None:
    _need_cuda()
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                    torch.nn.Linear(16, 4)).double()
    gpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                    torch.nn.Linear(16, 4)).double().cuda()
    gpu_model.load_state_dict(cpu_model.state_dict())
    x = torch.randn(32, 8, dtype=torch.float64)
    y = torch.randint(0, 4, (32,))
    grads = []
    for model, dev in ((cpu_model, "cpu"), (gpu_model, "cuda")):
        clipper = PerSampleClipper(model, max_grad_norm=0.5)
        torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev)).backward()
        clipper.release(noise_multiplier=1.0, expected_batch_size=32.0,
                        noise=NoiseGenerator(5))
        grads.append([p.grad.detach().cpu() for p in clipper.parameters])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def _release_buffers(count: int) -> list[tuple[int, torch.Tensor, str]]:
    """``count`` release buffers (stream index, values, base kind) of mixed dtypes and sizes:
    empty, shorter than one stream chunk, chunk-aligned and ragged, with no base, the out as
    its own base, or a separate base."""
    gen = torch.Generator().manual_seed(count)
    sizes = [0, 1, 159, 160, 161, 1281, 4099, 70_001]
    dtypes = [torch.float32, torch.float64, torch.bfloat16]
    kinds = ["none", "same", "separate"]
    return [(3 * k + 1, torch.randn(sizes[k % len(sizes)], generator=gen).to(dtypes[k % 3]),
             kinds[(k // 3) % 3]) for k in range(count)]


@pytest.mark.parametrize("count", [5, 150])  # one launch per dtype; several tables of 64
def test_release_of_many_buffers_equals_one_call_per_buffer_and_the_cpu(count: int) -> None:
    """kernels.release_noise sends a device's buffers to one multi-buffer kernel: each buffer's
    values equal, bit for bit, one clip_accumulate_noise call on it, on the GPU and on the
    CPU."""
    _need_cuda()
    from dpsharp.torch import kernels

    buffers = _release_buffers(count)
    args = {"noise_std": 0.9, "key": 2**130 + 17, "release": 6, "rank": 2, "scale": 1.0 / 48}

    def operands(device: str) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        outs, bases = [], []
        for _, values, kind in buffers:
            out = values.to(device).clone()
            outs.append(out)
            bases.append(None if kind == "none" else out if kind == "same"
                         else (2 * values).to(device))
        return outs, bases

    gpu_outs, gpu_bases = operands("cuda")
    kernels.release_noise(gpu_outs, gpu_bases, parameters=[k for k, _, _ in buffers], **args)
    one_outs, one_bases = operands("cuda")
    for (k, _, _), out, base in zip(buffers, one_outs, one_bases):
        kernels.clip_accumulate_noise(out, base=base, parameter=k, **args)
    cpu_outs, cpu_bases = operands("cpu")
    kernels.release_noise(cpu_outs, cpu_bases, parameters=[k for k, _, _ in buffers], **args)
    torch.cuda.synchronize()
    for got, one, cpu in zip(gpu_outs, one_outs, cpu_outs):
        assert torch.equal(got.cpu(), one.cpu())
        assert torch.equal(got.cpu(), cpu)


def test_release_of_many_buffers_refuses_bad_input() -> None:
    _need_cuda()
    from dpsharp.torch import kernels

    out = torch.zeros(10, device="cuda")
    with pytest.raises(ValueError, match=r"bases\[0\] must have dtype torch.float32"):
        kernels.release_noise([out], [torch.zeros(10, dtype=torch.float64, device="cuda")],
                              noise_std=1.0, key=1)
    with pytest.raises(ValueError, match=r"outs\[1\] must be contiguous"):
        kernels.release_noise([out, torch.zeros(4, 4, device="cuda").t()], [None, None],
                              noise_std=1.0, key=1)
    with pytest.raises(ValueError, match="dtype must be torch.float32"):
        kernels.release_noise([torch.zeros(3, dtype=torch.float16, device="cuda")], [None],
                              noise_std=1.0, key=1)
    with pytest.raises(ValueError, match=r"bases\[0\] must be on cuda"):
        kernels.release_noise([out], [torch.zeros(10)], noise_std=1.0, key=1)


@pytest.mark.parametrize("count", [3, 70])  # one launch; several tables of 32
def test_many_buffer_kernels_equal_one_call_per_buffer(count: int) -> None:
    """kernels.weighted_rows_float32_many equals weighted_rows_float32 with the weights scaled
    first, bit for bit, for float32 and bfloat16 rows of many sizes (empty and long ones
    included); kernels.per_example_sq_norms_many equals per_example_sq_norms to float64
    summation order."""
    _need_cuda()
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(count)
    sizes = [0, 1, 7, 768, 3000, 70_001, 300_000]
    batch = 5
    rows = [torch.randn(batch, sizes[k % len(sizes)], generator=gen)
            .to([torch.float32, torch.bfloat16][k % 2]).cuda() for k in range(count)]
    factors = torch.rand(batch, generator=gen, dtype=torch.float64).cuda()
    scales = [1.0 if k % 3 == 0 else 0.5 + k / 7 for k in range(count)]
    together = kernels.weighted_rows_float32_many(rows, factors, scales)
    norms = kernels.per_example_sq_norms_many(rows)
    torch.cuda.synchronize()
    assert norms.shape == (count, batch)
    for k, (r, scale) in enumerate(zip(rows, scales)):
        one = kernels.weighted_rows_float32(r, factors * scale)
        assert torch.equal(together[k], one)
        torch.testing.assert_close(norms[k], kernels.per_example_sq_norms(r), rtol=1e-13,
                                   atol=0)


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
def test_stored_rows_route_releases_what_layer_by_layer_does(amp, monkeypatch) -> None:
    """A transformer-like block (LayerNorm, linear layers on sequences with biases) and a
    convolution with a GroupNorm, on the GPU: the clip step's stored-rows route (the default
    there) releases the layer-by-layer route's gradients, to the float32 rounding of the
    latter's float32 products."""
    _need_cuda()
    from dpsharp.torch import NoiseGenerator, PerSampleClipper, clipper

    torch.manual_seed(0)
    seq = torch.randn(8, 32, 16).cuda()
    image = torch.randn(8, 3, 8, 8).cuda()
    y = torch.randint(0, 5, (8,)).cuda()
    released = []
    for batched in (True, False):
        monkeypatch.setattr(clipper, "_batches_rows",
                            (lambda params: True) if batched else (lambda params: False))
        torch.manual_seed(1)
        model = torch.nn.ModuleDict({
            "norm": torch.nn.LayerNorm(16), "up": torch.nn.Linear(16, 48),
            "down": torch.nn.Linear(48, 16), "conv": torch.nn.Conv2d(3, 8, 3, padding=1),
            "group": torch.nn.GroupNorm(4, 8), "head": torch.nn.Linear(16 + 8, 5)}).cuda()
        clip = PerSampleClipper(model, max_grad_norm=0.1)
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            h = model["down"](torch.relu(model["up"](model["norm"](seq)))).mean(dim=1)
            c = torch.relu(model["group"](model["conv"](image))).mean(dim=(2, 3))
            out = model["head"](torch.cat([h, c], dim=1))
        torch.nn.functional.cross_entropy(out.float(), y).backward()
        clip.release(noise_multiplier=0.5, expected_batch_size=8.0, noise=NoiseGenerator(3))
        released.append([p.grad.detach().double().cpu() for p in clip.parameters])
    for a, b in zip(*released):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_noise_stream_equals_pure_torch_reference(precision: str) -> None:
    """The CUDA noise stream against the pure-torch twin of its ChaCha8 / Box-Muller operations
    (kernels.reference_gaussian), bit for bit."""
    _need_cuda()
    from dpsharp._native import core
    from dpsharp.torch import kernels

    n = 4099
    dtype = torch.float64 if precision == "float64" else torch.float32
    gpu = torch.empty(n, dtype=dtype, device="cuda")
    core.cuda_gaussian_noise(kernels.key_words(99), 4, 13, 2, n, precision, gpu.data_ptr(),
                             torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    want = kernels.reference_gaussian(key=99, parameter=4, release=13, rank=2, numel=n,
                                      precision=precision)
    assert torch.equal(gpu.cpu(), want.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_noise_statistics(dtype: torch.dtype) -> None:
    """On zero input the released noise has mean 0 and standard deviation sigma * C (a 6-sigma
    band of the sample mean and a chi-square band of the sample variance), no lag-1 correlation,
    and a Kolmogorov-Smirnov test against N(0, 1) does not reject at 1e-4."""
    _need_cuda()
    from scipy import stats

    from dpsharp.torch import kernels

    n, std = 1 << 20, 2.5
    out = torch.zeros(n, dtype=dtype, device="cuda")
    kernels.clip_accumulate_noise(out, base=out, noise_std=std, key=7, parameter=1, release=2,
                                  rank=0, scale=1.0)
    z = out.double().cpu().numpy() / std
    assert abs(z.mean()) < 6.0 / n**0.5
    # var of the sample variance of N(0,1) is 2/(n-1); bf16 rounding adds ~1e-5 relative
    assert abs(z.var() - 1.0) < 6.0 * (2.0 / n) ** 0.5 + (1e-4 if dtype == torch.bfloat16 else 0)
    assert abs(float((z[1:] * z[:-1]).mean())) < 6.0 / n**0.5
    if dtype == torch.float32:
        assert stats.kstest(z[: 1 << 16], "norm").pvalue > 1e-4


def _per_example_reference(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                           bound: float, amp: torch.dtype | None) -> list[torch.Tensor]:
    """sum_i min(1, C / ||g_i||) g_i from batch-size-1 autograd on the same device and autocast
    setting, accumulated in float64."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            out = model(x[i:i + 1])
        torch.nn.functional.cross_entropy(out.float(), y[i:i + 1], reduction="sum").backward()
        grads = [p.grad.double() for p in params]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, bound / max(float(norm), 1e-300))
        for acc, g in zip(total, grads):
            acc += factor * g
    model.zero_grad(set_to_none=True)
    return total


@pytest.mark.parametrize("amp", [None, torch.bfloat16, torch.float16])
def test_clipped_sum_under_autocast_matches_per_example_autograd(amp: torch.dtype | None) -> None:
    """A conv + layer norm + linear model on CUDA, forward under autocast (bf16 / fp16) or in
    float32: with noise 0 the released clipped sum equals batch-size-1 autograd's clipped sum
    within the forward precision's rounding (float32: 1e-5 relative; bf16 / fp16: 3e-2 / 5e-3),
    and every example's clipped contribution has norm <= C (1 + 1e-6)."""
    _need_cuda()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(4, 8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 32), torch.nn.LayerNorm(32),
        torch.nn.GELU(), torch.nn.Linear(32, 5),
    ).cuda()
    x = torch.randn(12, 3, 6, 6, device="cuda")
    _assert_clipped_sum_matches_reference(model, x, bound=0.05, amp=amp)


def _assert_clipped_sum_matches_reference(model: torch.nn.Module, x: torch.Tensor, *,
                                          bound: float, amp: torch.dtype | None) -> None:
    """With noise 0 the released clipped sum of ``model`` on ``x`` (random labels of 5 classes)
    equals batch-size-1 autograd's within the forward precision's rounding (float32: 1e-5
    relative; bf16 / fp16: 3e-2 / 5e-3), and the sum of the batch's clipped contributions has
    norm <= batch * C (1 + 1e-6)."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    batch = x.shape[0]
    y = torch.randint(0, 5, (batch,), device=x.device)
    want = _per_example_reference(model, x, y, bound, amp)
    clipper = PerSampleClipper(model, max_grad_norm=bound, loss_reduction="sum")
    with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
        out = model(x)
    torch.nn.functional.cross_entropy(out.float(), y, reduction="sum").backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(3))
    got = [p.grad.double() for p in clipper.parameters]
    tol = {None: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}[amp]
    num = torch.sqrt(sum((a - b).pow(2).sum() for a, b in zip(got, want)))
    den = torch.sqrt(sum(b.pow(2).sum() for b in want))
    assert float(num / den) < tol
    assert float(torch.sqrt(sum(a.pow(2).sum() for a in got))) <= batch * bound * (1 + 1e-6)


class _SequenceModel(torch.nn.Module):
    """Embedding-free sequence model: linear maps on (B, T, d), mean over positions, head."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(width, hidden)
        self.outer = torch.nn.Linear(hidden, width)
        self.head = torch.nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.outer(torch.nn.functional.gelu(self.inner(x))).mean(dim=1))


@pytest.mark.parametrize("amp", [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("seq", "width", "hidden"), [(4, 32, 48), (64, 8, 8)])
def test_sequence_linear_clipped_sum_under_autocast(amp: torch.dtype | None, seq: int,
                                                    width: int, hidden: int) -> None:
    """Linear layers on sequences on CUDA, on the Gram-norm path (seq 4, width 32: d p > T (d + p))
    and on the materialised path (seq 64, width 8), forward in float32 or under bf16 / fp16
    autocast (where the Gram matrices and per-example gradients are half-precision products
    accumulated in float32, the materialised ones kept in bfloat16 under bf16): the clipped sum
    equals batch-size-1 autograd's within the forward precision's rounding, and the sum's norm
    is at most batch * C."""
    _need_cuda()
    torch.manual_seed(1)
    model = _SequenceModel(width, hidden).cuda()
    x = torch.randn(10, seq, width, device="cuda")
    _assert_clipped_sum_matches_reference(model, x, bound=0.02, amp=amp)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_products_are_float32_sums_of_exact_products(dtype: torch.dtype) -> None:
    """The Gram matrices and per-example gradients of half-precision layers on CUDA are products
    of the half-precision operands with float32 accumulation: against the float64 product of the
    same values each entry is within the float32 summation bound K 2^-23 sum_k |a_k b_k| (a
    result rounded to the half type would be off by up to 2^-9 or 2^-12 relative)."""
    _need_cuda()
    from dpsharp.torch.layers.usages import _wide_bmm

    gen = torch.Generator().manual_seed(5)
    k = 300
    m1 = torch.randn(6, 40, k, generator=gen).to(dtype).cuda()
    m2 = torch.randn(6, k, 24, generator=gen).to(dtype).cuda()
    got = _wide_bmm(m1, m2)
    assert got.dtype == torch.float32
    want = torch.bmm(m1.double(), m2.double())
    bound = k * 2.0**-23 * torch.bmm(m1.double().abs(), m2.double().abs())
    assert bool(((got.double() - want).abs() <= bound).all())
    # and the result is not merely the half-precision product widened
    assert not torch.equal(got, torch.bmm(m1, m2).float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "numel"), [(1, 7), (5, 1000), (32, 300_001), (0, 10)])
def test_weighted_rows_kernel_matches_float64(dtype: torch.dtype, batch: int, numel: int) -> None:
    """sum_i c_i r_i in float32 from float32 / bfloat16 rows: float64 products and sums, one
    rounding, so within 2^-24 relative of the float64 sum (plus float64 summation error), and for
    one example never above c ||r|| (1 + 2^-24)."""
    _need_cuda()
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(batch + numel)
    rows = torch.randn(batch, numel, generator=gen).to(dtype)
    factors = torch.rand(batch, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(
        -20, 20, (batch,), generator=gen).double()
    got = kernels.weighted_rows_float32(rows.cuda(), factors.cuda())
    assert got.dtype == torch.float32 and got.shape == (numel,)
    want = (factors[:, None] * rows.double()).sum(dim=0)
    magnitude = (factors[:, None] * rows.double().abs()).sum(dim=0)
    err = (got.double().cpu() - want).abs()
    assert bool((err <= 2.0**-24 * want.abs() + 64 * 2.0**-53 * magnitude + 1e-300).all())
    if batch == 1:
        assert float(got.double().norm()) <= float(factors[0]) * float(rows.double().norm()) * (
            1.0 + 2.0**-24)


def test_weighted_rows_kernel_refuses_bad_input() -> None:
    _need_cuda()
    from dpsharp.torch import kernels

    with pytest.raises(ValueError, match="rows must be a CUDA float32 or bfloat16"):
        kernels.weighted_rows_float32(torch.zeros(2, 3, device="cuda", dtype=torch.float64),
                                      torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="factors must have shape"):
        kernels.weighted_rows_float32(torch.zeros(2, 3, device="cuda"),
                                      torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("batch", "numel"), [(3, 1), (5, 1000), (4, 200_001), (0, 10)])
def test_per_example_dots_on_cuda_match_float64(dtype: torch.dtype, batch: int,
                                                numel: int) -> None:
    """sum_j a_ij b_ij per example on the GPU (one block per slice of 64 Ki elements, the slices
    summed in float64) against the float64 sum of the same values, and equal on a rerun."""
    _need_cuda()
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(batch * 7 + numel)
    a = torch.randn(batch, numel, generator=gen).to(dtype)
    b = torch.randn(batch, numel, generator=gen).to(dtype)
    got = kernels.per_example_dots(a.cuda(), b.cuda())
    assert got.is_cuda and got.dtype == torch.float64 and got.shape == (batch,)
    want = (a.double() * b.double()).sum(dim=1)
    scale = (a.double() * b.double()).abs().sum(dim=1)
    assert bool(((got.cpu() - want).abs() <= 1e-14 * scale + 1e-300).all())
    assert torch.equal(kernels.per_example_dots(a.cuda(), b.cuda()), got)


def test_float32_norm_products_stay_float32_with_tf32_enabled() -> None:
    """With TF32 enabled by the user, the float32 products behind the norms still meet the float32
    summation bound against float64 (TF32's 10-bit operands would miss it by orders of
    magnitude), and the user's setting is back afterwards."""
    _need_cuda()
    from dpsharp.torch.layers.usages import _wide_bmm

    gen = torch.Generator().manual_seed(6)
    k = 300
    m1 = torch.randn(4, 40, k, generator=gen).cuda()
    m2 = torch.randn(4, k, 24, generator=gen).cuda()
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        got = _wide_bmm(m1, m2)
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    want = torch.bmm(m1.double(), m2.double())
    bound = k * 2.0**-23 * torch.bmm(m1.double().abs(), m2.double().abs())
    assert bool(((got.double() - want).abs() <= bound).all())


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
def test_conv_gram_path_contribution_within_bound(amp: torch.dtype | None) -> None:
    """A convolution on the Gram path (few positions, many channels: O d > L (d + O)), one
    example at a time with noise 0: the released gradient is that example's clipped
    contribution, of norm <= C (1 + 1e-6) (its clipped sum runs in float64 on a GPU: cuDNN's
    float32 default would use TF32)."""
    _need_cuda()
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(128 * 4 * 4, 5)).cuda()
    worst = 0.0
    clipper = PerSampleClipper(model, max_grad_norm=1.0, loss_reduction="sum")
    noise = NoiseGenerator(0)
    for _ in range(4):
        x = torch.randn(1, 64, 4, 4, device="cuda") * 10
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            out = model(x)
        out.float().pow(2).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=noise)
        norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in clipper.parameters))
        worst = max(worst, float(norm))
    assert 0.99 < worst <= 1.0 + 1e-6


@contextlib.contextmanager
def _tf32(enabled: bool):
    """TF32 matmuls enabled or not for the block, the user's setting restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _released_over_bound(model, run_backward, bound: float) -> float:
    """One example, noise 0: the float64 norm of the released gradient over C = bound."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    clipper = PerSampleClipper(model, max_grad_norm=bound)
    run_backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in clipper.parameters))
    clipper.remove()
    return float(norm) / bound


def _cancelling_example(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One example of 16 positions (d = p = 64) whose gradient's positions nearly cancel:
    inputs a0 + noise, output gradients alternating +-g0 + noise."""
    a0, g0 = torch.randn(64, generator=gen), torch.randn(64, generator=gen)
    signs = torch.tensor([1.0, -1.0] * 8)
    a = (a0 + 1e-2 * torch.randn(16, 64, generator=gen)).unsqueeze(0).cuda()
    g = (100 * (signs[:, None] * g0 + 1e-2 * torch.randn(16, 64, generator=gen))
         ).unsqueeze(0).cuda()
    return a, g


@pytest.mark.parametrize("amp", [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tf32", [False, True])
def test_linear_gram_path_contribution_within_bound_where_positions_cancel(amp, tf32,
                                                                           monkeypatch) -> None:
    """The constructed cancelling example of tests/test_soundness_clipping_roundoff.py on a GPU
    (a linear layer on its Gram path: float64 Grams, the clipped sum's round-off bound added to
    the norm, with TF32 enabled or not): one example, noise 0, contribution <= C (1 + 1e-6).
    (With float32 Grams and no bound it reached 1.16 C in float32 emulation.) With TF32 the
    clipped sum's operands lose 13 bits, and the bound, amplified by this example's
    cancellation, clips it to about 0.8 C: sound, and the price of TF32 here."""
    _need_cuda()
    from dpsharp.torch.layers import usages

    # under bf16 this layer would materialise bfloat16 gradients (tested below): the Gram path
    monkeypatch.setattr(usages, "_HALF_MATERIALISED_PER_STORED", 0)
    worst = _worst_cancelling_release(7, amp, tf32)
    assert (0.5 if tf32 else 0.99) < worst <= 1.0 + 1e-6


def _worst_cancelling_release(seed: int, amp: torch.dtype | None, tf32: bool) -> float:
    """The largest released norm over C = 1 (:func:`_released_over_bound`) of 10 cancelling
    examples (:func:`_cancelling_example`), each through a fresh nn.Linear(64, 64), forward in
    float32 or under autocast ``amp``, with TF32 enabled or not."""
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    with _tf32(tf32):
        for _ in range(10):
            a, g = _cancelling_example(gen)
            model = torch.nn.Linear(64, 64).cuda()

            def backward() -> None:
                with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                    out = model(a)
                (out.float() * g).sum().backward()

            worst = max(worst, _released_over_bound(model, backward, 1.0))
    return worst


@pytest.mark.parametrize("tf32", [False, True])
def test_bfloat16_materialised_contribution_within_bound_where_positions_cancel(
        tf32, monkeypatch) -> None:
    """The same cancelling examples under bf16 autocast on the route that materialises
    bfloat16 per-example gradients (d p <= 3 T (d + p)): the norm is measured on the stored
    gradients and the weighted sum reads the same values (float64 sums rounded once), so one
    example's contribution stays within C (1 + 1e-6) with no round-off slack: at least 0.99 C
    even with TF32 enabled (which does not touch bfloat16 products)."""
    _need_cuda()
    from dpsharp.torch import kernels
    from dpsharp.torch.layers import usages

    calls = []
    original = usages._bfloat16_weighted_sum
    original_many = kernels.weighted_rows_float32_many

    def counted(rows, weights, **options):
        calls.append(rows.shape)
        return original(rows, weights, **options)

    def counted_many(rows, factors, scales):  # the clip step's stored-rows route
        calls.extend(r.shape for r in rows if r.dtype == torch.bfloat16)
        return original_many(rows, factors, scales)

    monkeypatch.setattr(usages, "_bfloat16_weighted_sum", counted)
    monkeypatch.setattr(kernels, "weighted_rows_float32_many", counted_many)
    worst = _worst_cancelling_release(9, torch.bfloat16, tf32)
    assert calls  # the weight took the bfloat16 route
    assert 0.99 < worst <= 1.0 + 1e-6


@pytest.mark.parametrize("tf32", [False, True])
def test_weighted_sums_keep_the_bound_with_tf32(tf32) -> None:
    """Biases and LayerNorm rows are summed on a GPU by float64 sums (the stored-rows route's
    kernel) or, layer by layer, by a (1, B) x (B, n) product that runs in float64 with TF32
    enabled (a float32 product would round the rows to 10-bit significands: 0.04% above C,
    emulated). One example, noise 0: contribution <= C (1 + 1e-6)."""
    _need_cuda()
    gen = torch.Generator().manual_seed(11)
    worst = 0.0
    with _tf32(tf32):
        for _ in range(20):
            model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64)).cuda()
            x = torch.randn(1, 8, 64, generator=gen).cuda()
            t = torch.randn(1, 8, 64, generator=gen).cuda()
            worst = max(worst, _released_over_bound(
                model, lambda: (model(x) * t).sum().backward(), 1e-3))
    assert 0.9 < worst <= 1.0 + 1e-6
