"""The fused sequence-linear kernel's float32-block accumulation against exact references, and
the round-off bound the clipper raises its norms by where it takes that accumulation
(usages.blocked_gram_roundoff, usages._FUSED_GRAM_ACCUMULATION = 'float32_blocks').

The reference is exact: float32 numbers are integers times 2^-149, so the per-example gradient
sum_t g_t a_t^T and its squared norm are computed in Python integers. The kernel's error must
stay within kappa S^2 + mu_a S_g^2 + mu_g S_a^2 + mu_ag for every input: Gaussian rows,
positions that cancel, rows built so that every float32 addition after a block's first drops
its product (the worst case of the float32 blocks), and rows whose products underflow float32.
At the clipper, an example built to lose a sizeable part of its norm to the float32 blocks
contributes more than C (1 + 1e-6) without the bound and at most that with it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.torch

TOLERANCE = 1e-6  # the clipping's documented relative tolerance
SCALE_EXPONENT = 149  # float32 numbers are integers times 2^-149


def exact_sq_norms(a: torch.Tensor, g: torch.Tensor) -> list[Fraction]:
    """||sum_t g_t a_t^T||_F^2 per example, exactly, for float32 a (B, T, d) and g (B, T, p)."""
    out = []
    for i in range(a.shape[0]):
        ints_a = np.array([[int(v) for v in row] for row in
                           (a[i].double().numpy() * 2.0**SCALE_EXPONENT)], dtype=object)
        ints_g = np.array([[int(v) for v in row] for row in
                           (g[i].double().numpy() * 2.0**SCALE_EXPONENT)], dtype=object)
        grad = ints_g.T.dot(ints_a)  # (p, d), scaled by 2^(2 * 149)
        total = sum(int(v) * int(v) for v in grad.reshape(-1))
        out.append(Fraction(total, 2 ** (4 * SCALE_EXPONENT)))
    return out


def bound_of(a: torch.Tensor, g: torch.Tensor) -> list[Fraction]:
    """kappa S^2 + mu_a S_g^2 + mu_g S_a^2 + mu_ag per example (blocked_gram_roundoff), with
    the sums of row norms taken in float64 and raised by 1e-12 (upper bounds)."""
    from dpsharp.torch.layers import usages

    _, positions, d = a.shape
    kappa, mu_a, mu_g, mu_ag = usages.blocked_gram_roundoff(d, int(g.shape[2]), positions)
    norm_a = a.double().pow(2).sum(dim=2).sqrt()
    norm_g = g.double().pow(2).sum(dim=2).sqrt()
    up = 1.0 + 1e-12
    s = (norm_a * norm_g).sum(dim=1) * up
    s_a, s_g = norm_a.sum(dim=1) * up, norm_g.sum(dim=1) * up
    total = kappa * s * s + mu_a * s_g * s_g + mu_g * s_a * s_a + mu_ag
    return [Fraction(float(v)) for v in total]


def cancelling_positions(gen: torch.Generator, positions: int, d: int, p: int,
                         noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """a_t = a0 + noise n_t, g_t = +-g0 + noise m_t (alternating): the per-position gradients
    cancel up to O(noise). float32 (1, T, d), (1, T, p)."""
    a0 = torch.randn(d, generator=gen, dtype=torch.float64)
    g0 = torch.randn(p, generator=gen, dtype=torch.float64)
    signs = torch.tensor([1.0, -1.0] * (positions // 2), dtype=torch.float64)
    a = a0 + noise * torch.randn(positions, d, generator=gen, dtype=torch.float64)
    g = signs[:, None] * g0 + noise * torch.randn(positions, p, generator=gen,
                                                  dtype=torch.float64)
    return a.float().unsqueeze(0), g.float().unsqueeze(0)


def dropping_pair(d: int, p: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two positions a_1 = b + x, a_2 = b - x, g_2 = -g_1: the gradient is 2 g_1 x^T, but in
    the float32 blocks every product of x is dropped. b is 1 on the first 16 features of every
    8 m (a lane's first two products in a block of the AVX2 and portable builds, its first on
    AVX-512) and 0 elsewhere; x is 0 there and sqrt(0.9 2^-24) elsewhere, so that each of its
    products (0.9 2^-24) is under half a unit in the last place of a lane's running sum (1 or
    2) and every addition returns the sum unchanged. (1, 2, d), (1, 2, p) float32."""
    from dpsharp.torch import kernels

    period = 8 * kernels.linear_norms_block_steps()
    big = (torch.arange(d) % period) < 16
    x = torch.where(big, 0.0, math.sqrt(0.9 * 2.0**-24)).float()
    b = big.float()
    g1 = torch.randn(p, generator=gen)
    return torch.stack([b + x, b - x]).unsqueeze(0), torch.stack([g1, -g1]).unsqueeze(0)


def cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for batch, seq, d, p in [(3, 7, 33, 65), (2, 16, 300, 129), (2, 5, 1, 1), (2, 40, 1000, 17),
                             (2, 9, 128, 8)]:
        out.append((f"gaussian {seq}x{d}x{p}", torch.randn(batch, seq, d, generator=gen),
                    torch.randn(batch, seq, p, generator=gen)))
    for noise in (1e-2, 1e-4):
        a, g = cancelling_positions(gen, 16, 64, 64, noise)
        out.append((f"cancelling {noise}", a, g))
    for d in (256, 1000):
        a, g = dropping_pair(d, 24, gen)
        out.append((f"dropping {d}", a, g))
    # products below float32's smallest normal (activations ~2^-70, gradients ~2^-50)
    out.append(("underflow", torch.randn(2, 6, 40, generator=gen) * 2.0**-70,
                torch.randn(2, 6, 30, generator=gen) * 2.0**-50))
    return out


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_float32_blocks_stay_within_their_bound(case):
    from dpsharp.torch import kernels

    _, a, g = case
    want = exact_sq_norms(a, g)
    bound = bound_of(a, g)
    for implementation in kernels.linear_norms_implementations():
        got, _ = kernels.linear_sequence_sq_norms(a, g, bias=False,
                                                  implementation=implementation,
                                                  accumulation="float32_blocks")
        for i, w in enumerate(want):
            assert abs(Fraction(float(got[i])) - w) <= bound[i], (implementation, i)


def test_the_bound_is_close_to_the_worst_case():
    """On the dropping pair the float32 blocks lose the whole norm (the computed norm is 0),
    and that loss is more than a tenth of the bound: kappa is not loose by orders."""
    from dpsharp.torch import kernels

    a, g = dropping_pair(1000, 24, torch.Generator().manual_seed(1))
    want = exact_sq_norms(a, g)[0]  # R^2 = S^2 / want is about 3e5
    bound = bound_of(a, g)[0]
    for implementation in kernels.linear_norms_implementations():
        got, _ = kernels.linear_sequence_sq_norms(a, g, bias=False,
                                                  implementation=implementation,
                                                  accumulation="float32_blocks")
        assert float(got[0]) == 0.0
        assert want > bound / 10
        got64, _ = kernels.linear_sequence_sq_norms(a, g, bias=False,
                                                    implementation=implementation,
                                                    accumulation="float64")
        assert abs(Fraction(float(got64[0])) - want) <= want * Fraction(1, 10**6)


def test_underflow_terms_of_the_bound_are_needed():
    """Two equal positions of activations ~2^-76: every float32 product underflows to 0, so
    the computed norm is 0 and kappa S^2 alone (about 2.4e-6 of the true norm) does not cover
    the loss; the underflow terms mu do."""
    from dpsharp.torch import kernels
    from dpsharp.torch.layers import usages

    a = torch.full((1, 2, 8), 2.0**-76)
    g = torch.full((1, 2, 3), 1.0)
    want = exact_sq_norms(a, g)[0]
    kappa, *_ = usages.blocked_gram_roundoff(8, 3, 2)
    s = float((a.double().norm(dim=2) * g.double().norm(dim=2)).sum())
    got, _ = kernels.linear_sequence_sq_norms(a, g, bias=False, accumulation="float32_blocks")
    assert float(got[0]) == 0.0 and want > 0
    assert want > Fraction(kappa * s * s)
    assert want <= bound_of(a, g)[0]


def test_accumulation_is_validated():
    from dpsharp.torch import kernels

    a, g = torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match="accumulation"):
        kernels.linear_sequence_sq_norms(a, g, bias=True, accumulation="float16")


def test_float64_inputs_and_the_default_accumulate_in_float64():
    """float64 inputs ignore the accumulation (both give the float64 kernel's bits), and float32
    inputs take 'float64' unless told otherwise."""
    from dpsharp.torch import kernels

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(3, 11, 70, generator=gen, dtype=torch.float64)
    g = torch.randn(3, 11, 50, generator=gen, dtype=torch.float64)
    blocks, _ = kernels.linear_sequence_sq_norms(a, g, bias=False, accumulation="float32_blocks")
    wide, _ = kernels.linear_sequence_sq_norms(a, g, bias=False, accumulation="float64")
    assert torch.equal(blocks, wide)
    a32, g32 = a.float(), g.float()
    default, _ = kernels.linear_sequence_sq_norms(a32, g32, bias=False)
    wide, _ = kernels.linear_sequence_sq_norms(a32, g32, bias=False, accumulation="float64")
    assert torch.equal(default, wide)


# ------------------------------------------------------------------------------ at the clipper


def contribution_of_one_example(model, run_backward, bound: float) -> tuple[float, float]:
    """(norm of the released gradient, norm the clipper used) for a batch of one, C = bound,
    noise 0."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    clipper = PerSampleClipper(model, max_grad_norm=bound)
    run_backward()
    used = float(clipper.last_per_example_norms[0])
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    released = float(torch.sqrt(sum(q.grad.double().pow(2).sum() for q in clipper.parameters)))
    clipper.remove()
    return released, used


def dropping_example() -> tuple[torch.Tensor, torch.Tensor]:
    """Four positions: the dropping pair on the first 256 activation / 24 gradient features,
    and two equal ordinary positions on the other 128 / 24, sized so that the pair holds about
    1e-4 of the squared norm (lost by the float32 blocks) while the bound stays under the
    float64 recompute threshold (the float32 blocks are used). (1, 4, 384), (1, 4, 48)."""
    gen = torch.Generator().manual_seed(2)
    a_pair, g_pair = dropping_pair(256, 24, gen)
    b = torch.randn(128, generator=gen)
    h = torch.randn(24, generator=gen)
    a = torch.zeros(1, 4, 384)
    g = torch.zeros(1, 4, 48)
    a[0, :2, :256], g[0, :2, :24] = a_pair[0], g_pair[0]
    a[0, 2:, 256:], g[0, 2:, 24:] = b, h
    lost = float(exact_sq_norms(a[:, :2], g[:, :2])[0])
    kept = float(exact_sq_norms(a[:, 2:], g[:, 2:])[0])
    g[0, 2:, 24:] *= math.sqrt(1e4 * lost / kept)  # the pair: 1e-4 of the squared norm
    return a, g


def test_the_blocked_bound_is_needed_at_the_clipper(monkeypatch):
    from dpsharp.torch import kernels
    from dpsharp.torch.layers import usages

    if not usages._vectorised_linear_norms():
        pytest.skip("no vectorised build of the fused kernel on this CPU")
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: False)
    monkeypatch.setattr(usages, "_FUSED_GRAM_ACCUMULATION", "float32_blocks")
    a, g = dropping_example()
    true = math.sqrt(float(exact_sq_norms(a, g)[0]))
    calls = []
    original = kernels.linear_sequence_sq_norms

    def spy(*args, **kwargs):
        calls.append(kwargs.get("accumulation", "float64"))
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "linear_sequence_sq_norms", spy)
    model = torch.nn.Linear(384, 48, bias=False)
    released, used = contribution_of_one_example(
        model, lambda: (model(a) * g).sum().backward(), bound=0.5 * true)
    assert calls == ["float32_blocks"]  # no float64 recompute: the bound was used
    assert used >= true
    assert 0.99 * 0.5 * true < released <= 0.5 * true * (1.0 + TOLERANCE)

    monkeypatch.setattr(usages, "blocked_gram_roundoff", lambda d, p, t: (0.0, 0.0, 0.0, 0.0))
    model.weight.grad = None
    released, used = contribution_of_one_example(
        model, lambda: (model(a) * g).sum().backward(), bound=0.5 * true)
    assert used < true * (1.0 - 2 * TOLERANCE)
    assert released > 0.5 * true * (1.0 + 10 * TOLERANCE)


def test_overflow_underflow_and_cancellation_are_recomputed_in_float64(monkeypatch):
    """A batch of four: ordinary rows; activations of 1e20 (float32 products overflow: the
    blocks give inf or NaN); activations of 2^-76 (products underflow: the blocks lose most
    of the norm); positions
    that cancel (the bound is many times the norm). The last three are recomputed with float64
    Grams: every norm is at least the exact one and within 1e-3 of it."""
    from dpsharp.torch import kernels
    from dpsharp.torch.layers import usages

    if not usages._vectorised_linear_norms():
        pytest.skip("no vectorised build of the fused kernel on this CPU")
    monkeypatch.setattr(usages.LinearUsage, "_materialise_weight", lambda self: False)
    monkeypatch.setattr(usages, "_FUSED_GRAM_ACCUMULATION", "float32_blocks")
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 16, 64, generator=gen)
    g = torch.randn(4, 16, 32, generator=gen)
    a[1] *= 1e20
    a[2] *= 2.0**-76
    a[3:], g[3:] = cancelling_positions(gen, 16, 64, 32, noise=1e-4)
    want = exact_sq_norms(a, g)
    blocks, _ = kernels.linear_sequence_sq_norms(a, g, bias=False, accumulation="float32_blocks")
    assert not math.isfinite(float(blocks[1]))
    assert abs(float(blocks[2]) - float(want[2])) > 0.1 * float(want[2])
    calls = []
    original = kernels.linear_sequence_sq_norms

    def spy(x, y, **kwargs):
        calls.append((kwargs.get("accumulation", "float64"), int(x.shape[0])))
        return original(x, y, **kwargs)

    monkeypatch.setattr(kernels, "linear_sequence_sq_norms", spy)
    layer = torch.nn.Linear(64, 32, bias=False)
    usage = usages.LinearUsage(layer.weight, None, a, g)
    used, _ = usage.sq_norm_and_slack(layer.weight)  # the norm before the clipped sum's slack
    assert calls == [("float32_blocks", 4), ("float64", 3)]
    for i in range(4):
        assert Fraction(float(used[i])) >= want[i]
        assert float(used[i]) <= float(want[i]) * (1.0 + 1e-3)
