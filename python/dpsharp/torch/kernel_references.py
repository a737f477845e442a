"""Pure-torch references for the noise and clip-and-noise kernels of :mod:`dpsharp.torch.kernels`
(slow and exact; used by the tests and as the definition the kernels are checked against).

They replay the kernels' IEEE operations in torch: the ChaCha8 block function (Bernstein 2008;
RFC 8439, section 2.3, with 8 rounds), the float32 / float64 Box-Muller transforms of the noise
stream (cpp/include/dpsharp/noise_stream.hpp), and the clip / accumulate / noise pass, so that
a kernel's noise equals its reference bit for bit (the layout is described in
:mod:`dpsharp.torch.kernels`). The names are also reachable as ``dpsharp.torch.kernels.<name>``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dpsharp.torch.kernels import key_words

if TYPE_CHECKING:
    import torch

__all__ = [
    "reference_chacha_block",
    "reference_clip_accumulate_noise",
    "reference_gaussian",
    "reference_per_example_sq_norms",
]

_MASK32 = 0xFFFFFFFF

def _rotl(x: torch.Tensor, bits: int) -> torch.Tensor:
    return ((x << bits) | (x >> (32 - bits))) & _MASK32


def reference_chacha_block(key: int, block: torch.Tensor, parameter: int, release: int,
                           rank: int, *, rounds: int = 8) -> list[torch.Tensor]:
    """The 16 output words of the ChaCha block function (Bernstein 2008; RFC 8439 section 2.3
    for ``rounds=20``) of state [constants | key | block, parameter, release, rank], for an int64
    tensor of block counters (uint32 words held in int64)."""
    import torch

    block = block.to(torch.int64) & _MASK32
    const = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    scalars = const + key_words(key)
    initial = [torch.full_like(block, v) for v in scalars] + [
        block, *(torch.full_like(block, v & _MASK32) for v in (parameter, release, rank))]
    x = list(initial)

    def quarter(a: int, b: int, c: int, d: int) -> None:
        x[a] = (x[a] + x[b]) & _MASK32
        x[d] = _rotl(x[d] ^ x[a], 16)
        x[c] = (x[c] + x[d]) & _MASK32
        x[b] = _rotl(x[b] ^ x[c], 12)
        x[a] = (x[a] + x[b]) & _MASK32
        x[d] = _rotl(x[d] ^ x[a], 8)
        x[c] = (x[c] + x[d]) & _MASK32
        x[b] = _rotl(x[b] ^ x[c], 7)

    for _ in range(rounds // 2):
        quarter(0, 4, 8, 12)
        quarter(1, 5, 9, 13)
        quarter(2, 6, 10, 14)
        quarter(3, 7, 11, 15)
        quarter(0, 5, 10, 15)
        quarter(1, 6, 11, 12)
        quarter(2, 7, 8, 13)
        quarter(3, 4, 9, 14)
    return [(x[i] + initial[i]) & _MASK32 for i in range(16)]


def _f32(hex_literal: str) -> float:
    """A float32 constant of noise_stream.hpp, given as its exact hex value."""
    return float.fromhex(hex_literal)


def _bits_f32(t: torch.Tensor) -> torch.Tensor:
    """float32 tensor -> its IEEE bits as int64 in [0, 2^32)."""
    import torch

    return t.view(torch.int32).to(torch.int64) & _MASK32


def _from_bits_f32(bits: torch.Tensor) -> torch.Tensor:
    """int64 tensor of uint32 bit patterns -> float32 tensor."""
    import torch

    signed = torch.where(bits >= 2**31, bits - 2**32, bits)
    return signed.to(torch.int32).view(torch.float32)


def _sqrt_exact(t: torch.Tensor) -> torch.Tensor:
    """The correctly rounded IEEE square root (numpy's; torch's CPU sqrt is not always, in the
    last bit)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.sqrt(t.numpy()))


def _reference_pair_f32(x0: torch.Tensor, x1: torch.Tensor,
                        x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gaussian_pair_f32 of noise_stream.hpp on int64 tensors of words, in float32 tensors (every
    operation a float32 IEEE operation, in the same order)."""
    import torch

    f32 = torch.float32

    def small(v: torch.Tensor) -> torch.Tensor:  # v < 2^31: exact below 2^24, else rounded
        return v.to(f32)

    w = small(x1 & 0x1FFFFF) * 2.0**-22 + small((x0 >> 1) | 1) * 2.0**-53
    y = torch.where((x1 & 0x80000000) != 0, w, 1.0 - w)
    near_one = y > _f32("0x1.6a09e6p-1")
    bits = _bits_f32(y)
    e = small(bits >> 23) - 127.0
    m = _from_bits_f32((bits & 0x7FFFFF) | 0x3F800000)
    big = m > _f32("0x1.6a09e6p+0")
    m = torch.where(big, m * 0.5, m)
    e = torch.where(big, e + 1.0, e)
    num = torch.where(near_one, 0.0 - w, m - 1.0)
    den = torch.where(near_one, 2.0 - w, m + 1.0)
    s = num / den
    s2 = s * s
    poly = torch.full_like(s, _f32("0x1.c71c72p-4"))
    for c in ("0x1.24924ap-3", "0x1.99999ap-3", "0x1.555556p-2"):
        poly = poly * s2 + _f32(c)
    two_s = s + s
    log_m = two_s + two_s * (s2 * poly)
    log_u = e * _f32("0x1.62e4p-1") + (e * _f32("0x1.7f7d1cp-20") + log_m)
    radius = _sqrt_exact(-2.0 * log_u)

    four_u = small(x2 >> 8) * 2.0**-22
    shifted = four_u + 12582912.0
    quadrant = _bits_f32(shifted)
    f = four_u - (shifted - 12582912.0)
    x = f * _f32("0x1.921fb6p+0")
    xx = x * x
    sp = torch.full_like(x, _f32("0x1.71de3ap-19"))
    for c in ("0x1.a01a02p-13", "0x1.111112p-7", "0x1.555556p-3"):
        sp = _f32(c) - xx * sp
    sin_x = x - x * (xx * sp)
    cp = torch.full_like(x, _f32("0x1.27e4fcp-22"))
    for c in ("0x1.a01a02p-16", "0x1.6c16c2p-10", "0x1.555556p-5", "0x1p-1"):
        cp = _f32(c) - xx * cp
    cos_x = 1.0 - xx * cp
    swap = (quadrant & 1) != 0
    sin_sign = (quadrant & 2) << 30
    cos_sign = ((quadrant + 1) & 2) << 30
    sin_v = _from_bits_f32(_bits_f32(torch.where(swap, cos_x, sin_x)) ^ sin_sign)
    cos_v = _from_bits_f32(_bits_f32(torch.where(swap, sin_x, cos_x)) ^ cos_sign)
    return radius * cos_v, radius * sin_v


def _reference_log_unit(u: torch.Tensor) -> torch.Tensor:
    import torch

    mantissa, exponent = torch.frexp(u)  # u = mantissa 2^exponent, mantissa in [1/2, 1)
    m = mantissa * 2.0
    e = (exponent - 1).to(torch.float64)
    big = m > 1.4142135623730951
    m = torch.where(big, m * 0.5, m)
    e = torch.where(big, e + 1.0, e)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    poly = torch.full_like(s, 1.0 / 21.0)
    for k in (19, 17, 15, 13, 11, 9, 7, 5, 3):
        poly = poly * s2 + 1.0 / k
    two_s = 2.0 * s
    return e * 0.6931471805599453 + (two_s + two_s * (s2 * poly))


def _reference_sincos_two_pi(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    four_u = 4.0 * u
    quadrant_f = (four_u + 6755399441055744.0) - 6755399441055744.0  # round to nearest even
    f = four_u - quadrant_f
    quadrant = quadrant_f.to(torch.int64) & 3
    x = f * 1.5707963267948966
    x2 = x * x
    sp = torch.full_like(x, -1.0 / math.factorial(17))
    for k, sign in ((15, 1), (13, -1), (11, 1), (9, -1), (7, 1), (5, -1), (3, 1)):
        sp = sp * x2 + sign / math.factorial(k)
    sin_x = x - x * (x2 * sp)
    cp = torch.full_like(x, 1.0 / math.factorial(18))
    for k, sign in ((16, -1), (14, 1), (12, -1), (10, 1), (8, -1), (6, 1), (4, -1), (2, 1)):
        cp = cp * x2 + sign / math.factorial(k)
    cos_x = 1.0 - x2 * cp
    swap = (quadrant & 1) == 1
    sign_sin = torch.where((quadrant == 2) | (quadrant == 3), -1.0, 1.0).to(torch.float64)
    sign_cos = torch.where((quadrant == 1) | (quadrant == 2), -1.0, 1.0).to(torch.float64)
    return sign_sin * torch.where(swap, cos_x, sin_x), sign_cos * torch.where(swap, sin_x, cos_x)


def _reference_pair_f64(x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor,
                        x3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gaussian_pair_f64 of noise_stream.hpp on int64 tensors of words, in float64."""
    import torch

    n = ((x1 & 0x1FFFFF) << 31) | (x0 >> 1) | 1
    w = n.to(torch.float64) * 2.0**-53  # exact: n < 2^52
    u = torch.where((x1 >> 31) != 0, w, 1.0 - w)
    radius = _sqrt_exact(-2.0 * _reference_log_unit(u))
    k = (x2 << 21) | (x3 >> 11)
    sin_v, cos_v = _reference_sincos_two_pi(k.to(torch.float64) * 2.0**-53)
    return radius * cos_v, radius * sin_v


def reference_gaussian(
    *, key: int, parameter: int, release: int, rank: int, numel: int,
    precision: str = "float32",
) -> torch.Tensor:
    """The first ``numel`` standard normals of a stream's float32 (a float32 tensor) or float64
    sequence, computed in pure torch with the kernels' operations and layout."""
    import torch

    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}")
    wide = precision == "float64"
    pairs, words_per_pair = (4, 4) if wide else (5, 3)
    chunk = 16 * 2 * pairs
    chunks = (numel + chunk - 1) // chunk
    block = torch.arange(16 * chunks, dtype=torch.int64)
    words = reference_chacha_block(key, block, parameter, release, rank)
    normals = []
    for q in range(pairs):
        group = words[words_per_pair * q: words_per_pair * (q + 1)]
        z_cos, z_sin = _reference_pair_f64(*group) if wide else _reference_pair_f32(*group)
        normals += [z_cos, z_sin]
    # normals[m][16 c + l] is element 16 m + l of chunk c
    stacked = torch.stack(normals).reshape(2 * pairs, chunks, 16).permute(1, 0, 2)
    return stacked.reshape(-1)[:numel].contiguous()


def _round_to(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    import torch

    if dtype == torch.bfloat16:
        return value.to(torch.float32).to(torch.bfloat16)  # the kernel's double -> float -> bf16
    return value.to(dtype)


def reference_per_example_sq_norms(per_example: torch.Tensor) -> torch.Tensor:
    """Float64 squared norms of each example's flattened gradient."""
    import torch

    flat = per_example.reshape(per_example.shape[0], -1).to(torch.float64)
    return (flat * flat).sum(dim=1)


def reference_clip_accumulate_noise(
    like: torch.Tensor,
    *,
    per_example: torch.Tensor | None = None,
    factors: torch.Tensor | None = None,
    base: torch.Tensor | None = None,
    noise_std: float = 0.0,
    key: int = 0,
    parameter: int = 0,
    release: int = 0,
    rank: int = 0,
    scale: float = 1.0,
) -> torch.Tensor:
    """Pure-torch twin of :func:`clip_accumulate_noise` (same operation order), returning a new
    tensor shaped and typed like ``like``."""
    import torch

    acc = (
        base.reshape(-1).to(torch.float64).clone()
        if base is not None
        else torch.zeros(like.numel(), dtype=torch.float64)
    )
    if per_example is not None:
        assert factors is not None
        rows = per_example.reshape(per_example.shape[0], -1).to(torch.float64)
        for i in range(rows.shape[0]):
            acc = acc + factors[i].item() * rows[i]
    if noise_std != 0.0:
        z = reference_gaussian(
            key=key, parameter=parameter, release=release, rank=rank, numel=like.numel(),
            precision="float64" if like.dtype == torch.float64 else "float32",
        )
        acc = acc + noise_std * z.to(torch.float64)
    return _round_to(acc * scale, like.dtype).reshape(like.shape)
