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
