"""Fused clip-and-noise kernels against their pure-torch references, and the statistics of
the in-kernel Gaussian noise.

Provenance: Philox4x32-10 known answers are the Random123 kat_vectors (Salmon et al., SC 2011);
the noise is checked against N(0, (sigma C / B)^2) with a chi-square interval on the variance,
a z-test on the mean and a Kolmogorov-Smirnov test (scipy.stats)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from scipy import stats  # noqa: E402
from torch import nn  # noqa: E402

from dpsharp._native import core  # noqa: E402
from dpsharp.torch import NoiseGenerator, PerSampleClipper, kernels  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ],
)
def test_philox_known_answers_kernel_and_reference(counter, key, expected):
    assert tuple(core.philox4x32_10(*counter, *key)) == expected
    ref = kernels.reference_philox4x32_10(tuple(torch.tensor([c]) for c in counter), *key)
    assert tuple(int(r.item()) for r in ref) == expected


@pytest.mark.parametrize("numel", [1, 7, 512, 1025, 70001])
def test_gaussian_stream_equals_reference_bit_for_bit(numel):
    key = 0x0123456789ABCDEF
    got = torch.from_numpy(core.philox_gaussian(key, 3, 17, 2, numel, 2))
    want = kernels.reference_gaussian(key=key, parameter=3, release=17, rank=2, numel=numel)
    assert torch.equal(got, want)


IMPLEMENTATIONS = core.normals_implementations()


def test_the_kernels_use_the_widest_implementation_and_portable_always_exists():
    assert IMPLEMENTATIONS[-1] == "portable"
    assert set(IMPLEMENTATIONS) <= {"avx512", "avx2", "portable"}
    with pytest.raises(ValueError, match="implementation must be"):
        core.philox_gaussian_with("sse9", 1, 0, 0, 0, 0, 2)
    with pytest.raises(ValueError, match="even"):
        core.philox_gaussian_with("portable", 1, 0, 0, 0, 1, 2)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize(("first", "count"),
                         [(0, 2), (0, 14), (0, 16), (2, 30), (512, 1000), (0, 4098), (6, 258)])
def test_every_generator_implementation_equals_the_reference(implementation, first, count):
    """AVX-512, AVX2 and the portable vector code each replay the torch reference bit for bit,
    including the counts that leave remainders for the narrower code paths (the AVX-512 loop
    takes 8 pairs at a time, AVX2 4, the rest is scalar)."""
    got = core.philox_gaussian_with(implementation, 0xDEADBEEF12345, 3, 17, 2, first, count)
    reference = kernels.reference_gaussian(key=0xDEADBEEF12345, parameter=3, release=17, rank=2,
                                           numel=first + count)
    assert np.array_equal(got, reference.numpy()[first:])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_generator_implementations_agree_where_the_pair_counter_wraps(implementation):
    first = 2 * (2**32 - 20)  # pairs 2^32 - 20 .. 2^32 + 43 wrap to 0 .. 43 (counter word mod 2^32)
    got = core.philox_gaussian_with(implementation, 5, 1, 2, 0, first, 128)
    portable = core.philox_gaussian_with("portable", 5, 1, 2, 0, first, 128)
    assert np.array_equal(got, portable)
    head = kernels.reference_gaussian(key=5, parameter=1, release=2, rank=0, numel=88)
    assert np.array_equal(got[40:], head.numpy())


def test_polynomial_log_and_sincos_are_accurate():
    u = torch.rand(100000, dtype=torch.float64).clamp_min(1e-300)
    u = torch.cat([u, torch.tensor([1.0, 2.0**-53, 0.5, 0.70710678118654757])])
    log_ref = torch.log(u)
    assert float(((kernels._reference_log_unit(u) - log_ref).abs()
                  / log_ref.abs().clamp_min(1e-300)).max()) < 1e-15 or float(
        (kernels._reference_log_unit(u) - log_ref).abs().max()) < 4e-16
    v = torch.rand(100000, dtype=torch.float64)
    s, c = kernels._reference_sincos_two_pi(v)
    assert float((s - torch.sin(2 * math.pi * v)).abs().max()) < 1e-14
    assert float((c - torch.cos(2 * math.pi * v)).abs().max()) < 1e-14


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_clip_accumulate_noise_equals_reference(dtype):
    torch.manual_seed(0)
    batch, shape = 5, (37, 29)
    per_example = (torch.randn(batch, *shape, dtype=torch.float64) * 3).to(dtype)
    factors = torch.rand(batch, dtype=torch.float64)
    base = torch.randn(shape, dtype=torch.float64).to(dtype)
    kwargs = dict(per_example=per_example, factors=factors, base=base, noise_std=0.7, key=99,
                  parameter=4, release=11, rank=1, scale=1 / 3)
    want = kernels.reference_clip_accumulate_noise(base, **kwargs)
    out = torch.empty(shape, dtype=dtype)
    kernels.clip_accumulate_noise(out, **kwargs, threads=2)
    assert torch.equal(out, want)  # same operation order: bit for bit
    # in-place accumulation (base aliases out) and no-noise / no-base variants
    out2 = base.clone()
    kernels.clip_accumulate_noise(out2, per_example=per_example, factors=factors, base=out2)
    assert torch.equal(out2, kernels.reference_clip_accumulate_noise(
        base, per_example=per_example, factors=factors, base=base))
    out3 = torch.empty(shape, dtype=dtype)
    kernels.clip_accumulate_noise(out3, noise_std=2.0, key=5, parameter=1, release=2)
    assert torch.equal(out3, kernels.reference_clip_accumulate_noise(
        out3, noise_std=2.0, key=5, parameter=1, release=2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sq_norm_kernel_matches_reference(dtype):
    torch.manual_seed(1)
    per_example = torch.randn(9, 13, 7, dtype=torch.float64).to(dtype) * 50
    got = kernels.per_example_sq_norms(per_example, threads=2)
    want = kernels.reference_per_example_sq_norms(per_example)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0.0)


def test_kernel_checks_arguments():
    out = torch.empty(4)
    with pytest.raises(ValueError, match="dtype"):
        kernels.clip_accumulate_noise(torch.empty(4, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.clip_accumulate_noise(torch.empty(4, 4).t())
    with pytest.raises(ValueError, match="factors"):
        kernels.clip_accumulate_noise(out, per_example=torch.empty(2, 4))
    with pytest.raises(ValueError, match="noise_std"):
        kernels.clip_accumulate_noise(out, noise_std=float("nan"))
    with pytest.raises(ValueError, match="elements"):
        kernels.clip_accumulate_noise(out, base=torch.empty(5))


def _release_noise(model, *, sigma, bound, batch, releases, seed=7):
    """Gradients written by `releases` releases with nothing accumulated (zero gradients)."""
    clipper = PerSampleClipper(model, max_grad_norm=bound)
    gen = NoiseGenerator(seed)
    draws = []
    for _ in range(releases):
        clipper.release(noise_multiplier=sigma, expected_batch_size=batch, noise=gen)
        draws.append([p.grad.detach().double().reshape(-1).clone() for p in clipper.parameters])
    clipper.remove()
    return draws


def test_noise_statistics_on_zero_gradients():
    sigma, bound, batch = 1.3, 0.8, 16.0
    model = nn.Sequential(nn.Linear(100, 200), nn.Linear(200, 50))
    draws = _release_noise(model, sigma=sigma, bound=bound, batch=batch, releases=3)
    std = sigma * bound / batch  # noise on the clipped SUM, divided by the expected batch
    z = torch.cat([torch.cat(d) for d in draws]) / std
    n = z.numel()
    assert abs(float(z.mean())) < 4.0 / math.sqrt(n)
    ss = float((z**2).sum())
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], df=n)
    assert lo < ss < hi
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    # no correlation between neighbouring coordinates (incl. the two outputs of one
    # Box-Muller pair), across parameters, or across steps
    flat0 = torch.cat(draws[0]) / std
    flat1 = torch.cat(draws[1]) / std
    m = flat0.numel()
    for a, b in ((flat0[0::2], flat0[1::2]), (flat0[:-1], flat0[1:]), (flat0, flat1),
                 (draws[0][0][:10000] / std, draws[0][2][:10000] / std)):
        r = float(np.corrcoef(a.numpy(), b.numpy())[0, 1])
        assert abs(r) < 5.0 / math.sqrt(min(a.numel(), m))


def test_noise_never_repeats_across_parameters_steps_and_ranks():
    model = nn.Sequential(nn.Linear(30, 40), nn.Linear(40, 30)).double()  # no float32 ties
    values = []
    for rank in (0, 1):
        clipper = PerSampleClipper(model, max_grad_norm=1.0)
        gen = NoiseGenerator(3, rank=rank)
        for _ in range(3):
            clipper.release(noise_multiplier=1.0, expected_batch_size=1.0, noise=gen)
            values.extend(p.grad.double().reshape(-1).tolist() for p in clipper.parameters)
        clipper.remove()
    flat = [v for chunk in values for v in chunk]
    assert len(set(flat)) == len(flat)


def test_seeded_stream_reproducible_and_resumes_without_repeating():
    a = NoiseGenerator(11)
    keys = [a.next_release() for _ in range(3)]
    b = NoiseGenerator(11)
    b.next_release()
    state = b.state_dict()
    c = NoiseGenerator(0)
    c.load_state_dict(state)
    assert c.releases == 1
    assert [c.next_release(), c.next_release()] == keys[1:]


def test_secure_mode_refuses_seed_and_draws_fresh_keys():
    with pytest.raises(ValueError, match="seed"):
        NoiseGenerator(5, secure=True)
    gen = NoiseGenerator(secure=True)
    assert gen.secure and gen.state_dict()["seed"] is None
    keys = {gen.next_release().key for _ in range(50)}
    assert len(keys) == 50  # fresh 64-bit CSPRNG key at every release
    with pytest.raises(ValueError, match="secure"):
        NoiseGenerator(1).load_state_dict(gen.state_dict())


def test_bad_generator_arguments():
    with pytest.raises(ValueError, match="seed"):
        NoiseGenerator(-1)
    with pytest.raises(ValueError, match="seed"):
        NoiseGenerator(2**64)
    with pytest.raises(TypeError, match="seed"):
        NoiseGenerator(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank"):
        NoiseGenerator(1, rank=2**32)


def test_empty_batch_release_writes_pure_noise_with_expected_batch_normaliser():
    model = nn.Linear(50, 40)
    clipper = PerSampleClipper(model, max_grad_norm=2.0)
    gen = NoiseGenerator(21)
    clipper.release(noise_multiplier=1.5, expected_batch_size=8.0, noise=gen)
    got = torch.cat([p.grad.reshape(-1).double() for p in clipper.parameters])
    want = torch.cat([
        kernels.reference_gaussian(key=21, parameter=k, release=0, rank=0, numel=p.numel())
        for k, p in enumerate(clipper.parameters)
    ]) * (1.5 * 2.0) / 8.0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
