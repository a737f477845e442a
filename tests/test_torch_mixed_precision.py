"""Per-example norms under mixed precision (float16 / bfloat16 activations and output
gradients, as autocast produces): computed from float32-widened values and summed in float64,
so they never overflow where the float16 arithmetic would (|x| > 256 squares past 65504).
Reference: the float64 norm of the exactly widened inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [1, 3, 40])
def test_linear_ghost_norms_do_not_overflow(dtype: torch.dtype, seq: int) -> None:
    from dpsharp.torch.layers.usages import LinearUsage

    g = torch.Generator().manual_seed(seq)
    weight = torch.nn.Parameter(torch.zeros(6, 5))
    bias = torch.nn.Parameter(torch.zeros(6))
    a = (torch.randn(4, seq, 5, generator=g) * 400).to(dtype)  # squares overflow float16
    gy = (torch.randn(4, seq, 6, generator=g) * 300).to(dtype)
    usage = LinearUsage(weight, bias, a, gy)
    a64, g64 = a.double(), gy.double()
    want_w = torch.einsum("btp,btd->bpd", g64, a64).pow(2).sum(dim=(1, 2))
    want_b = g64.sum(dim=1).pow(2).sum(dim=1)
    got_w, got_b = usage.sq_norm(weight), usage.sq_norm(bias)
    assert got_w.dtype == got_b.dtype == torch.float64
    assert bool(torch.isfinite(got_w).all()) and bool(torch.isfinite(got_b).all())
    # float32 products of exactly widened inputs: relative error ~1e-6.
    torch.testing.assert_close(got_w, want_w, rtol=2e-5, atol=0)
    torch.testing.assert_close(got_b, want_b, rtol=2e-5, atol=0)
    if dtype == torch.float16:  # the unwidened float16 arithmetic would have overflowed
        assert not bool(torch.isfinite((a * a).sum(dim=-1)).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_norms_of_low_precision_per_example_gradients(dtype: torch.dtype) -> None:
    from dpsharp.torch import kernels

    x = (torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(1)) * 500).to(dtype)
    got = kernels.per_example_sq_norms(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, x.double().pow(2).sum(dim=(1, 2)), rtol=1e-14, atol=0)


def test_cuda_tensors_without_cuda_kernels_are_refused() -> None:
    from dpsharp.torch import kernels

    if kernels.cuda_built():
        pytest.skip("this build has the CUDA kernels")
    with pytest.raises(RuntimeError, match="built without its CUDA kernels"):
        kernels._require_cuda_kernels("out", torch.empty(1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_clipper_under_autocast_keeps_norms_finite(dtype: torch.dtype) -> None:
    """End to end under CPU autocast: inputs large enough that float16 squares overflow; the
    per-example norms stay finite and match the float32 (no autocast) norms to the low
    precision's forward error, and the released gradient has the parameters' dtype."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 4, 6, generator=torch.Generator().manual_seed(2)) * 300
    y = torch.randint(0, 3, (5, 4))
    clipper = PerSampleClipper(model, max_grad_norm=1.0)

    def loss_of(out: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.float().reshape(-1, 3), y.reshape(-1))

    loss_of(model(x)).backward()
    want = clipper.last_per_example_norms.clone()
    clipper.reset()
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
    assert out.dtype == dtype
    loss_of(out).backward()
    got = clipper.last_per_example_norms
    assert got.dtype == torch.float64 and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, rtol=5e-2, atol=0)
    clipper.release(noise_multiplier=1.0, expected_batch_size=5.0, noise=NoiseGenerator(1))
    assert all(p.grad.dtype == p.dtype and bool(torch.isfinite(p.grad).all())
               for p in clipper.parameters)


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq", [1, 16])
def test_clipped_contribution_under_autocast_stays_within_bound(amp, seq) -> None:
    """One example, noise 0: the released gradient is that example's clipped contribution, whose
    norm must stay <= C (1 + 1e-6) under autocast as in float32. (A clip factor, or an
    activation scaled by it, rounded to half precision left it up to 0.35% above C.)"""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    worst = 0.0
    for seed in range(12):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 48))
        x = torch.randn(1, seq, 64) * 10
        target = torch.randn(1, seq, 48)
        clipper = PerSampleClipper(model, max_grad_norm=1.0)
        with torch.autocast("cpu", dtype=amp):
            out = model(x)
        ((out.float() - target) ** 2).sum().backward()
        clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
        norm = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in clipper.parameters)))
        worst = max(worst, norm)
    assert 0.99 < worst <= 1.0 + 1e-6
