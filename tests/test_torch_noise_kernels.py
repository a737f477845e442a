"""Fused clip-and-noise kernels against their pure-torch references, and the statistics of
the in-kernel Gaussian noise.

Provenance: the ChaCha20 block of RFC 8439 (section 2.3.2); the float32 transform against the same
pairs in float64 with libm; the noise is checked against N(0, (sigma C / B)^2) with a chi-square interval on the variance,
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


# RFC 8439 section 2.3.2: the ChaCha20 block function test vector (key 00 01 .. 1f, block
# counter 1, nonce 00:00:00:09:00:00:00:4a:00:00:00:00), the state after the final addition.
RFC8439_KEY = int.from_bytes(bytes(range(32)), "little")
RFC8439_NONCE = (0x09000000, 0x4A000000, 0x00000000)
RFC8439_BLOCK = (
    0xE4E7F110, 0x15593BD1, 0x1FDD0F50, 0xC47120A3, 0xC7F4D1C7, 0x0368C033, 0x9AAA2204, 0x4E6CD4C3,
    0x466482D2, 0x09AA9F07, 0x05D7C214, 0xA2028BD9, 0xD19C12B5, 0xB94E16DE, 0xE883D0CB, 0x4E3C50A2,
)


def test_chacha20_block_matches_rfc8439_in_kernel_and_reference():
    words = kernels.key_words(RFC8439_KEY)
    assert core.chacha_block(words, 1, *RFC8439_NONCE, 20) == RFC8439_BLOCK
    ref = kernels.reference_chacha_block(RFC8439_KEY, torch.tensor([1]), *RFC8439_NONCE,
                                         rounds=20)
    assert tuple(int(w.item()) for w in ref) == RFC8439_BLOCK


def test_chacha8_kernel_equals_reference_and_differs_from_chacha20():
    key = 0x9E3779B97F4A7C15F39CC0605CEDC8341082276BF3A27251F86C6A11D0C18E95
    blocks = torch.tensor([0, 1, 2**31, 2**32 - 1])
    ref = kernels.reference_chacha_block(key, blocks, 7, 2**32 - 1, 3)
    for i, b in enumerate(blocks.tolist()):
        got = core.chacha_block(kernels.key_words(key), b, 7, 2**32 - 1, 3)
        assert got == tuple(int(w[i].item()) for w in ref)
        assert got != core.chacha_block(kernels.key_words(key), b, 7, 2**32 - 1, 3, 20)
    with pytest.raises(ValueError, match="rounds"):
        core.chacha_block(kernels.key_words(key), 0, 0, 0, 0, 12)


def test_key_words_are_little_endian_and_checked():
    assert kernels.key_words(0x0123456789ABCDEF) == [0x89ABCDEF, 0x01234567] + [0] * 6
    assert kernels.key_words(2**256 - 1) == [0xFFFFFFFF] * 8
    with pytest.raises(ValueError, match="key"):
        kernels.key_words(2**256)
    with pytest.raises(ValueError, match="key"):
        kernels.key_words(-1)
    with pytest.raises(TypeError, match="key"):
        kernels.key_words(1.0)  # type: ignore[arg-type]


KEY = 0xD1B54A32D192ED03_81DC4A77A89C21B0_0123456789ABCDEF_FEDCBA9876543210


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("numel", [1, 7, 128, 160, 161, 1025, 70001])
def test_gaussian_stream_equals_reference_bit_for_bit(precision, numel):
    got = core.gaussian_stream(kernels.key_words(KEY), 3, 17, 2, 0, numel, precision, 2)
    want = kernels.reference_gaussian(key=KEY, parameter=3, release=17, rank=2, numel=numel,
                                      precision=precision)
    assert got.dtype == (np.float64 if precision == "float64" else np.float32)
    assert np.array_equal(got, want.numpy())


IMPLEMENTATIONS = core.normals_implementations()


def test_the_kernels_use_the_widest_implementation_and_portable_always_exists():
    assert IMPLEMENTATIONS[-1] == "portable"
    assert set(IMPLEMENTATIONS) <= {"avx512", "avx2", "portable"}
    words = kernels.key_words(1)
    with pytest.raises(ValueError, match="implementation must be"):
        core.gaussian_stream_with("sse9", words, 0, 0, 0, 0, 2)
    with pytest.raises(ValueError, match="precision"):
        core.gaussian_stream_with("portable", words, 0, 0, 0, 0, 2, "float16")
    with pytest.raises(ValueError, match=">= 0"):
        core.gaussian_stream(words, 0, 0, 0, -1, 2)
    with pytest.raises(ValueError, match="block counter"):
        core.gaussian_stream(words, 0, 0, 0, 128 * 2**28 - 1, 2)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize(("first", "count"),
                         [(0, 1), (0, 16), (0, 160), (3, 300), (160, 320), (127, 1000),
                          (640, 4099)])
def test_every_generator_implementation_equals_the_reference(implementation, precision, first,
                                                              count):
    """AVX-512 (16 lanes), AVX2 (8) and the portable code (1) each replay the torch reference bit
    for bit, including ranges that start and end inside a chunk."""
    got = core.gaussian_stream_with(implementation, kernels.key_words(KEY), 3, 17, 2, first,
                                    count, precision)
    reference = kernels.reference_gaussian(key=KEY, parameter=3, release=17, rank=2,
                                           numel=first + count, precision=precision)
    assert np.array_equal(got, reference.numpy()[first:])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_generator_at_the_end_of_the_block_counter(implementation):
    """The last elements a parameter can have (128 * 2^28: the float64 stream's block counter
    reaches 2^32 - 1) equal the scalar code, which the reference pins down at the start."""
    words = kernels.key_words(5)
    for precision, chunk in (("float32", 160), ("float64", 128)):
        first = 128 * 2**28 - 2 * chunk
        got = core.gaussian_stream_with(implementation, words, 1, 2, 0, first, 2 * chunk,
                                        precision)
        portable = core.gaussian_stream_with("portable", words, 1, 2, 0, first, 2 * chunk,
                                             precision)
        assert np.array_equal(got, portable)
        assert np.isfinite(got).all()


def _exact_pairs(words: list[torch.Tensor], pairs: int, per_pair: int):
    """(U, angle) of every pair of the blocks, computed exactly in float64 from the words."""
    us, angles = [], []
    for q in range(pairs):
        x0, x1, x2 = words[per_pair * q: per_pair * q + 3]
        n = ((x1 & 0x1FFFFF) << 31) | (x0 >> 1) | 1
        w = n.double() * 2.0**-53
        us.append(torch.where((x1 >> 31) != 0, w, 1.0 - w))
        angles.append((x2 >> 8).double() * 2.0**-24)
    return torch.cat(us), torch.cat(angles)


def test_float32_transform_is_accurate_to_a_few_float32_ulp():
    """The float32 Box-Muller against the same pairs in float64 with libm (torch): the radius and
    the normals agree to a few float32 ulp over 1.6 million pairs, including the tail
    (U near 2^-53) and the centre (U near 1)."""
    blocks = torch.arange(2**18, dtype=torch.int64)
    words = kernels.reference_chacha_block(KEY, blocks, 0, 0, 0)
    u, angle = _exact_pairs(words, 5, 3)
    radius = torch.sqrt(-2.0 * torch.log(u))
    want = torch.stack([radius * torch.cos(2 * math.pi * angle),
                        radius * torch.sin(2 * math.pi * angle)], dim=1)
    pairs = [kernels._reference_pair_f32(*words[3 * q: 3 * q + 3]) for q in range(5)]
    got = torch.stack([torch.cat([c for c, _ in pairs]), torch.cat([s for _, s in pairs])],
                      dim=1).double()
    # error relative to the radius (z itself may be near 0 where cos theta is)
    err = ((got - want).abs() / radius.unsqueeze(1)).max()
    assert float(err) < 8 * 2.0**-24
    # the ends of U: the words that give U = 2^-53 (tail) and U = 1 - 2^-53 (centre)
    x0 = torch.tensor([0, 0], dtype=torch.int64)
    x1 = torch.tensor([0x80000000, 0], dtype=torch.int64)
    x2 = torch.tensor([0, 0], dtype=torch.int64)
    z_cos, _ = kernels._reference_pair_f32(x0, x1, x2)
    assert float(z_cos[0]) == pytest.approx(math.sqrt(-2 * math.log(2.0**-53)), rel=1e-6)
    assert float(z_cos[1]) == pytest.approx(math.sqrt(-2 * math.log1p(-(2.0**-53))), rel=1e-6)


def test_float64_transform_is_accurate():
    u = torch.rand(100000, dtype=torch.float64).clamp_min(1e-300)
    u = torch.cat([u, torch.tensor([1.0, 2.0**-53, 0.5, 0.70710678118654757])])
    log_ref = torch.log(u)
    err = (kernels._reference_log_unit(u) - log_ref).abs()
    assert bool((err <= 1e-15 * log_ref.abs() + 4e-16).all())
    v = torch.rand(100000, dtype=torch.float64)
    s, c = kernels._reference_sincos_two_pi(v)
    assert float((s - torch.sin(2 * math.pi * v)).abs().max()) < 1e-14
    assert float((c - torch.cos(2 * math.pi * v)).abs().max()) < 1e-14


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_stream_moments_tails_and_distribution(precision):
    """4 million normals of one stream: mean, variance (chi-square interval), fourth moment,
    the mass beyond 3 and 4.5 sigma against the exact Gaussian values (binomial intervals), and
    a Kolmogorov-Smirnov test."""
    n = 4_000_000
    z = core.gaussian_stream(kernels.key_words(KEY), 0, 0, 0, 0, n, precision, 2)
    z = z.astype(np.float64)
    assert abs(z.mean()) < 4.5 / math.sqrt(n)
    lo, hi = stats.chi2.ppf([1e-4, 1 - 1e-4], df=n)
    assert lo < float((z * z).sum()) < hi
    assert abs(float((z**4).mean()) - 3.0) < 4.5 * math.sqrt(96.0 / n)  # Var(z^4) = 105 - 9
    for t in (3.0, 4.5):
        p = 2 * stats.norm.sf(t)
        count = int((np.abs(z) > t).sum())
        assert abs(count - n * p) < 4.5 * math.sqrt(n * p * (1 - p)) + 1
    assert stats.kstest(z[:500_000], "norm").pvalue > 1e-4


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


def test_clip_accumulate_noise_mixed_dtypes():
    """The two CPU mixes, bit for bit against float64 arithmetic in the kernel's order: float32
    rows added into a float64 sum (no rounding of the rows' part), and a float64 sum released
    into float32 with its noise added before the one rounding (the float32 stream, as a float32
    release draws it). Every other mix is refused."""
    torch.manual_seed(2)
    batch, shape = 3, (41, 17)
    rows = torch.randn(batch, *shape) * 5
    factors = torch.rand(batch, dtype=torch.float64)
    total = torch.randn(shape, dtype=torch.float64)
    want = total.clone()
    for i in range(batch):
        want = want + factors[i].item() * rows[i].to(torch.float64)
    kernels.clip_accumulate_noise(total, per_example=rows, factors=factors, base=total,
                                  threads=2)
    assert total.dtype == torch.float64 and torch.equal(total, want)
    # no base: the sum from zero, still in float64
    fresh = torch.empty(shape, dtype=torch.float64)
    kernels.clip_accumulate_noise(fresh, per_example=rows, factors=factors)
    assert torch.equal(fresh, kernels.reference_clip_accumulate_noise(
        fresh, per_example=rows, factors=factors))
    # float64 sum -> float32 release: round(scale * (sum + std z)) with z the float32 stream
    z = kernels.reference_gaussian(key=8, parameter=3, release=4, rank=0, numel=total.numel(),
                                   precision="float32").to(torch.float64).reshape(shape)
    out = torch.empty(shape)
    kernels.clip_accumulate_noise(out, base=total, noise_std=0.9, key=8, parameter=3, release=4,
                                  scale=0.125)
    assert torch.equal(out, ((total + 0.9 * z) * 0.125).to(torch.float32))
    for kwargs in (dict(per_example=rows.to(torch.bfloat16), factors=factors),
                   dict(per_example=rows, factors=factors, base=total)):
        with pytest.raises(ValueError):
            kernels.clip_accumulate_noise(torch.empty(shape), **kwargs)
    with pytest.raises(ValueError):
        kernels.clip_accumulate_noise(torch.empty(shape, dtype=torch.float64),
                                      base=torch.randn(shape))


@pytest.mark.parametrize("noise_std", [0.7, 0.0])
def test_release_noise_equals_reference_for_every_buffer(noise_std):
    """The multi-buffer release pass (the clipper's release: scale * (base + std * z_k)) against
    the pure-torch reference per buffer, bit for bit: bases aliasing the output, separate bases,
    no base; float32 / float64 / bfloat16 buffers in one call; sizes off the tile boundary."""
    torch.manual_seed(3)
    shapes_dtypes = [((37, 29), torch.float32), ((1000,), torch.float64), ((5, 7), torch.bfloat16),
                     ((641,), torch.float32), ((3,), torch.float32)]
    bases = [torch.randn(shape, dtype=torch.float64).to(dtype) for shape, dtype in shapes_dtypes]
    outs = [bases[0].clone(), torch.empty(1000, dtype=torch.float64),
            torch.empty(5, 7, dtype=torch.bfloat16), torch.empty(641), bases[4].clone()]
    given = [outs[0], bases[1], None, None, outs[4]]  # aliased, separate, none, none, aliased
    parameters = [4, 0, 9, 2, 7]
    wants = [kernels.reference_clip_accumulate_noise(
        out, base=None if g is None else bases[i], noise_std=noise_std, key=123, parameter=k,
        release=5, rank=2, scale=0.25) for i, (out, g, k) in enumerate(zip(outs, given, parameters))]
    kernels.release_noise(outs, given, noise_std=noise_std, key=123, release=5, rank=2,
                          scale=0.25, parameters=parameters, threads=2)
    for out, want in zip(outs, wants):
        assert torch.equal(out, want)
    # a float64 base released into a float32 buffer: the noise before the one rounding
    wide_base = torch.randn(37, 29, dtype=torch.float64)
    out = torch.empty(37, 29)
    kernels.release_noise([out], [wide_base], noise_std=noise_std, key=123, release=5,
                          parameters=[4])
    assert torch.equal(out, kernels.reference_clip_accumulate_noise(
        out, base=wide_base, noise_std=noise_std, key=123, parameter=4, release=5))


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
    assert len(keys) == 50  # fresh 256-bit CSPRNG key at every release
    assert max(keys) >= 2**128  # the whole key, not only its low 64 bits
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
    ]).double() * (1.5 * 2.0) / 8.0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
