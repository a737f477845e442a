"""The CPU kernels' threads (cpp/include/dpsharp/parallel.hpp): with torch imported they run on
torch's own OpenMP team, without it on std::threads, and in both cases the results are the
same bits whatever the thread count. The sizes are chosen above the kernels' per-thread
minimum (2^15 elements of noise, 2^18 of reductions), so a second thread really takes part;
the bit-for-bit references are the pure-torch replays of
python/dpsharp/torch/kernel_references.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from dpsharp._native import core  # noqa: E402
from dpsharp.torch import kernels  # noqa: E402

pytestmark = pytest.mark.torch

LINUX = sys.platform.startswith("linux")
NOISE_NUMEL = 2**19 + 6  # 820 tiles of 640 elements and a partial one: both threads get blocks


@pytest.mark.skipif(not LINUX, reason="torch's OpenMP runtime is libgomp on Linux")
def test_kernels_use_torchs_openmp_team_once_torch_is_loaded():
    assert core.parallel_backend() == "openmp"


def test_without_torch_the_kernels_start_threads_and_give_the_same_noise(tmp_path):
    """A process that never imports torch has no OpenMP runtime to borrow: std::threads, and
    the noise stream is the same bits as on torch's team, at 1 and 2 threads."""
    out = tmp_path / "z.npy"
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import dpsharp._core as core
        assert "torch" not in sys.modules
        assert core.parallel_backend() == "std::thread", core.parallel_backend()
        key = [7, 0, 0, 0, 0, 0, 0, 0]
        np.save({str(out)!r}, core.gaussian_stream(key, 3, 11, 1, 0, {NOISE_NUMEL}, threads=2))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    from_threads = np.load(out)
    key = kernels.key_words(7)
    on_team = core.gaussian_stream(key, 3, 11, 1, 0, NOISE_NUMEL, threads=2)
    serial = core.gaussian_stream(key, 3, 11, 1, 0, NOISE_NUMEL, threads=1)
    assert np.array_equal(from_threads, serial)
    assert np.array_equal(on_team, serial)
    reference = kernels.reference_gaussian(key=7, parameter=3, release=11, rank=1, numel=4096)
    assert np.array_equal(serial[:4096], reference.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernel_is_bit_identical_at_one_and_two_threads(dtype):
    torch.manual_seed(3)
    batch, numel = 4, 3 * 2**15 + 10
    per_example = (torch.randn(batch, numel, dtype=torch.float64) * 2).to(dtype)
    factors = torch.rand(batch, dtype=torch.float64)
    base = torch.randn(numel, dtype=torch.float64).to(dtype)
    kwargs = dict(per_example=per_example, factors=factors, base=base, noise_std=1.3, key=5,
                  parameter=2, release=9, rank=0, scale=1 / 256)
    want = kernels.reference_clip_accumulate_noise(base, **kwargs)
    for threads in (1, 2):
        out = torch.empty(numel, dtype=dtype)
        kernels.clip_accumulate_noise(out, **kwargs, threads=threads)
        assert torch.equal(out, want), f"threads={threads}"


def test_reductions_are_bit_identical_at_one_and_two_threads():
    torch.manual_seed(4)
    a = torch.randn(6, 2**18 + 3)
    b = torch.randn(6, 2**18 + 3)
    one = kernels.per_example_dots(a, b, threads=1)
    two = kernels.per_example_dots(a, b, threads=2)
    assert torch.equal(one, two)
    exact = (a.double() * b.double()).sum(dim=1)
    torch.testing.assert_close(two, exact, rtol=1e-12, atol=1e-9)
    assert torch.equal(kernels.per_example_sq_norms(a, threads=2),
                       kernels.per_example_sq_norms(a, threads=1))


def test_kernels_called_from_several_python_threads_at_once():
    """Each calling thread gets its own team (the GIL is released inside the kernels); the
    results are those of a serial call."""
    key = kernels.key_words(1)
    expected = core.gaussian_stream(key, 0, 0, 0, 0, NOISE_NUMEL, threads=1)
    results: dict[int, np.ndarray] = {}

    def work(index: int) -> None:
        for _ in range(3):
            results[index] = core.gaussian_stream(key, 0, 0, 0, 0, NOISE_NUMEL, threads=2)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3]
    for z in results.values():
        assert np.array_equal(z, expected)
