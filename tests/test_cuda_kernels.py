"""CUDA kernels (cpp/cuda/clip_kernels.cu) against the CPU kernels and the pure-torch reference.

Skipped without a CUDA device or without a CUDA build. Expected: the noise stream and the fused
clip-accumulate-noise pass equal the CPU kernel bit for bit (same ChaCha8 counters, same IEEE
operations, -fmad=false, same summation order over examples); squared norms agree to float64
summation-order error.
"""

from __future__ import annotations

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
def test_sq_norms_match_cpu_and_reference(dtype: torch.dtype) -> None:
    _need_cuda()
    from dpsharp.torch import kernels

    x = torch.randn(17, 3, 1001, generator=torch.Generator().manual_seed(0)).to(dtype)
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
