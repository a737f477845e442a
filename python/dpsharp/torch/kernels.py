"""Torch adapters for the C++ kernels of ``dpsharp._core`` used by per-example clipping (the
pure-torch references of the noise and clip-and-noise kernels live in
:mod:`dpsharp.torch.kernel_references`, and are reachable here under the same names).

The kernels: fused clip / accumulate / noise passes and per-example squared norms
(cpp/src/clip.cpp, normals.cpp), Gram norms of linear layers on sequences (linear_norms.cpp),
embedding norms and clipped sums (embedding_norms.cpp), layer-norm affine gradients
(affine_grads.cpp), convolution patches and per-example weight gradients (patches.cpp,
conv_grads.cpp). They take raw addresses, shapes and a dtype code; this module checks
that every tensor is a contiguous CPU tensor of a supported dtype and the right size before
handing ``tensor.data_ptr()`` over, since the C++ side cannot check anything. CUDA tensors go to
the CUDA kernels (cpp/cuda/clip_kernels.cu, same noise stream and bits) on the caller's current
stream when ``_core`` was built with them, and raise RuntimeError when it was not (no silent
copy to the CPU).

Noise stream (cpp/include/dpsharp/noise_stream.hpp): the noise of parameter ``p`` at release
``r`` on rank ``k`` with 256-bit key ``K`` comes from the ChaCha8 blocks (Bernstein 2008; RFC
8439's state with block counter ``b`` and nonce ``(p, r, k)``) through a Box-Muller transform in
float32 (for float32 / bfloat16 parameters: 10 normals per block, element ``j`` is normal
``(j mod 160) // 16`` of block ``16 (j // 160) + j mod 16``) or in float64 (float64
parameters: 8 normals per block, chunks of 128). The reference functions replay exactly
the same IEEE operations in torch, so the kernel's noise equals the reference bit for bit; sums
over examples run in the same order, so those agree bit for bit too; only the squared-norm
kernel sums in a different order (agreement to ~1e-15 relative).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dpsharp._native import core as _core

if TYPE_CHECKING:
    import torch

__all__ = [
    "clip_accumulate_noise",
    "conv_patches",
    "conv_per_example_weight_grads",
    "cuda_built",
    "dtype_code",
    "embedding_clipped_sum",
    "embedding_sq_norms",
    "flat_clip_factors",
    "linear_norms_implementations",
    "linear_sequence_sq_norms",
    "per_example_dots",
    "per_example_sq_norms",
    "per_example_sq_norms_many",
    "reference_flat_clip_factors",
    "key_words",
    "layer_norm_affine_rows",
    "release_noise",
    "weighted_rows_float32_many",
]

_MASK32 = 0xFFFFFFFF
_KEY_BITS = 256


def key_words(key: int) -> list[int]:
    """The 8 little-endian 32-bit words of a noise key in [0, 2^256)."""
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError(f"key must be an int, got {type(key).__name__}")
    if not 0 <= key < 2**_KEY_BITS:
        raise ValueError(f"key must be in [0, 2^256), got {key}")
    return [(key >> (32 * i)) & _MASK32 for i in range(8)]


def dtype_code(dtype: torch.dtype) -> int:
    """The kernels' dtype code: 0 float32, 1 float64, 2 bfloat16 (ValueError otherwise)."""
    import torch

    codes = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
    if dtype not in codes:
        raise ValueError(
            f"dtype must be torch.float32, torch.float64 or torch.bfloat16, got {dtype}"
        )
    return codes[dtype]


_CUDA_BUILT: bool | None = None


def cuda_built() -> bool:
    """Whether ``dpsharp._core`` was built with the CUDA kernels (``-DDPSHARP_CUDA=ON``).

    Read once per process (the build does not change under it): every CUDA kernel call asks,
    and ``build_info()`` builds a dictionary each time."""
    global _CUDA_BUILT
    if _CUDA_BUILT is None:
        _CUDA_BUILT = bool(_core.build_info()["cuda"])
    return _CUDA_BUILT


def _require_cuda_kernels(name: str, tensor: torch.Tensor) -> None:
    """CUDA tensors go to the CUDA kernels; refuse loudly if they were not built (never copy a
    CUDA tensor to the CPU behind the caller's back)."""
    if not cuda_built():
        raise RuntimeError(
            f"{name} is a CUDA tensor ({tensor.device}) but dpsharp was built without its CUDA "
            "kernels (dpsharp._core.build_info()['cuda'] is False); reinstall with "
            "`pip install . -Ccmake.define.DPSHARP_CUDA=ON` on a machine with the CUDA "
            "toolkit, or move the model to the CPU"
        )


def _stream_of(tensor: torch.Tensor) -> int:
    """The raw handle of the current CUDA stream on ``tensor``'s device.

    torch's own accessor for the handle alone, where this torch has it: the public
    ``torch.cuda.current_stream(device)`` builds a Stream object and resolves the device
    through several Python calls, about 20 us a call under cProfile on an H200's host, and
    every CUDA kernel call of a clip step asks (GPT-2 small: about 350 calls a step)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = tensor.device.index
    if raw is not None and index is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(tensor.device).cuda_stream)


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A context with ``device`` the current CUDA device, for a kernel launch on its stream:
    no context at all where it is current already (the usual case; ``torch.cuda.device``
    exchanges the device twice on every call)."""
    import torch

    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _check(name: str, tensor: torch.Tensor, *, dtype: torch.dtype, numel: int,
           device: torch.device | None = None) -> None:
    if device is None:
        if tensor.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the CPU kernel, got {tensor.device}")
    elif tensor.device != device:
        raise ValueError(f"{name} must be on {device} like the output, got {tensor.device}")
    if tensor.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {tensor.dtype}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if tensor.numel() != numel:
        raise ValueError(f"{name} must have {numel} elements, got {tensor.numel()}")


def _threads(threads: int | None) -> int:
    import torch

    return max(1, int(torch.get_num_threads() if threads is None else threads))


def per_example_sq_norms(per_example: torch.Tensor, *, threads: int | None = None) -> torch.Tensor:
    """Squared L2 norm of each example's gradient, ``out[i] = sum_j g[i, j]^2``, in float64.

    ``per_example`` has shape (B, ...) and is flattened per example; float32/64/bf16.
    """
    import torch

    if (per_example.dtype is torch.float32 and per_example.dim() == 2
            and per_example.device.type == "cpu" and per_example.is_contiguous()):
        # The common case (a float32 (B, n) matrix; called for every layer on every step) with
        # no more checks than it needs.
        rows, numel = per_example.shape
        out = torch.empty(rows, dtype=torch.float64)
        _core.clip_per_example_sq_norms(per_example.data_ptr(), 0, rows, numel, out.data_ptr(),
                                        _threads(threads))
        return out
    if per_example.dim() < 1:
        raise ValueError("per_example must have a leading batch dimension")
    batch = int(per_example.shape[0])
    numel = per_example[0].numel() if batch else 0
    src = per_example.contiguous()
    if src.dtype == torch.float16:
        # float16 squares overflow above 256; the kernels read float32/64/bf16 exactly, so widen
        # (float16 -> float32 is exact). Sums run in float64 either way.
        src = src.float()
    if src.is_cuda:
        _require_cuda_kernels("per_example", src)
        _check("per_example", src, dtype=src.dtype, numel=batch * numel, device=src.device)
        if numel > _CUDA_NORM_SLICE:
            # the one-block-per-example kernel leaves most of the device idle on long rows
            # (materialised GPT-2-small gradients at batch 32 on an H100: 52 ms per step, as
            # many blocks as examples); the dot kernel's slices give every example many blocks
            return per_example_dots(src, src)
        out = torch.empty(batch, dtype=torch.float64, device=src.device)
        with _on_device(src.device):
            _core.cuda_clip_per_example_sq_norms(
                src.data_ptr(), dtype_code(src.dtype), batch, numel, out.data_ptr(),
                _stream_of(src),
            )
        return out
    _check("per_example", src, dtype=src.dtype, numel=batch * numel)
    out = torch.empty(batch, dtype=torch.float64)
    _core.clip_per_example_sq_norms(
        src.data_ptr(), dtype_code(src.dtype), batch, numel, out.data_ptr(), _threads(threads)
    )
    return out


# Elements per block of the CUDA per-example dot kernel's slices; rows longer than one slice take
# that kernel for their squared norms too.
_CUDA_NORM_SLICE = 1 << 16


def weighted_rows_float32(rows: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``sum_i factors[i] * rows[i]`` in float32 for CUDA rows (B, ...) of float32 or bfloat16
    and float64 factors (B,): float64 products and sums in example order, rounded once (the
    CUDA kernel ``weighted_rows_to_float32``; each column read once, no widened copy). So for a
    single example the result is fl32(c r): within 2^-24 relative of the exact product."""
    import torch

    if not rows.is_cuda or rows.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"rows must be a CUDA float32 or bfloat16 tensor, got {rows.dtype} "
                         f"on {rows.device}")
    _require_cuda_kernels("rows", rows)
    batch = int(rows.shape[0])
    src = rows.contiguous()
    numel = src[0].numel() if batch else 0
    weights = factors.to(device=rows.device, dtype=torch.float64).contiguous()
    if weights.shape != (batch,):
        raise ValueError(f"factors must have shape ({batch},), got {tuple(factors.shape)}")
    out = torch.empty(rows.shape[1:], dtype=torch.float32, device=rows.device)
    if batch == 0:
        return out.zero_()
    with _on_device(rows.device):
        _core.cuda_clip_weighted_rows(src.data_ptr(), dtype_code(src.dtype), weights.data_ptr(),
                                      batch, numel, out.data_ptr(), _stream_of(src))
    return out


def per_example_dots(a: torch.Tensor, b: torch.Tensor, *,
                     threads: int | None = None) -> torch.Tensor:
    """``out[i] = sum_j a[i, j] b[i, j]`` in float64 (products and sums), shape (B,).

    ``a`` and ``b`` have the same shape (B, ...) and dtype and are flattened per example. The
    ghost norm of a linear layer on sequences is the dot of its two Gram matrices,
    ||g_i(W)||^2 = sum_{t,s} (A_i)_{ts} (G_i)_{ts} (Li et al., ICLR 2022, section 4); this
    reads the Grams once in their own dtype instead of widening both to float64 copies, on the
    CPU and (with the CUDA kernels built) on a GPU. float16, and CUDA tensors without the
    kernels, take a torch expression with the same meaning.
    """
    import torch

    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            f"a and b must have the same shape, dtype and device, got {tuple(a.shape)} "
            f"{a.dtype} {a.device} and {tuple(b.shape)} {b.dtype} {b.device}"
        )
    if a.dim() < 1:
        raise ValueError("a and b must have a leading batch dimension")
    batch = int(a.shape[0])
    if (a.is_cuda and a.dtype in (torch.float32, torch.float64, torch.bfloat16)
            and cuda_built()):
        # float64 products and sums read straight from the operands: one block per (example,
        # slice of at most 64 Ki elements), the slices of an example summed in order here.
        src_a, src_b = a.contiguous(), b.contiguous()
        numel = src_a[0].numel() if batch else 0
        slices = max(1, min(1024, -(-numel // _CUDA_NORM_SLICE)))
        partial = torch.empty(batch, slices, dtype=torch.float64, device=a.device)
        with _on_device(a.device):
            _core.cuda_clip_per_example_dot_partials(
                src_a.data_ptr(), src_b.data_ptr(), dtype_code(src_a.dtype), batch, numel,
                slices, partial.data_ptr(), _stream_of(src_a))
        return partial[:, 0] if slices == 1 else partial.sum(dim=1)
    if a.is_cuda or a.dtype not in (torch.float32, torch.float64, torch.bfloat16):
        flat_a = a.reshape(batch, -1).to(torch.float64)
        return (flat_a * b.reshape(batch, -1).to(torch.float64)).sum(dim=1)
    src_a, src_b = a.contiguous(), b.contiguous()
    numel = src_a[0].numel() if batch else 0
    out = torch.empty(batch, dtype=torch.float64)
    _core.clip_per_example_dots(src_a.data_ptr(), src_b.data_ptr(), dtype_code(src_a.dtype),
                                batch, numel, out.data_ptr(), _threads(threads))
    return out


def _rows_of_one_batch(name: str, rows: Sequence[torch.Tensor]) -> tuple[int, torch.device]:
    """The common batch size and device of a list of row buffers (B, ...), checked."""
    if not rows:
        raise ValueError(f"{name} must hold at least one tensor")
    batch, device = int(rows[0].shape[0]), rows[0].device
    for k, r in enumerate(rows):
        if r.dim() < 1 or int(r.shape[0]) != batch or r.device != device:
            raise ValueError(
                f"{name}[{k}] must have {batch} rows on {device} like {name}[0], got shape "
                f"{tuple(r.shape)} on {r.device}")
    return batch, device


def per_example_sq_norms_many(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """``out[k, i] = sum_j rows[k][i, j]^2`` in float64, shape (K, B), for K tensors of B rows
    each (flattened per example; float32, float64, bfloat16 or float16), on one device.

    CUDA tensors (with the CUDA kernels built) take one launch per 32 tensors, each row cut
    into the same number of slices (one block per tensor, example and slice, a fixed-shape
    float64 tree in each) and the slices summed here: a clip step's norms of every layer whose
    per-example gradients are stored rows, in place of one call (and its launches) per layer.
    Elsewhere :func:`per_example_sq_norms` of each tensor. The values agree with
    :func:`per_example_sq_norms` to float64 summation order."""
    import torch

    batch, device = _rows_of_one_batch("rows", rows)
    if not (device.type == "cuda" and cuda_built()):
        if batch == 0:
            return torch.zeros(len(rows), 0, dtype=torch.float64, device=device)
        return torch.stack([per_example_sq_norms(r) for r in rows])
    sources = [(r.float() if r.dtype == torch.float16 else r).contiguous() for r in rows]
    numels = [src[0].numel() if batch else 0 for src in sources]
    slices = max(1, min(64, -(-max(numels) // _CUDA_NORM_SLICE)))
    partial = torch.empty(len(rows), batch, slices, dtype=torch.float64, device=device)
    if batch == 0:
        return partial.sum(dim=2)
    with _on_device(device):
        _core.cuda_clip_sq_norm_partials_many(
            [src.data_ptr() for src in sources], [dtype_code(src.dtype) for src in sources],
            numels, batch, slices, partial.data_ptr(), _stream_of(sources[0]))
    return partial[:, :, 0] if slices == 1 else partial.sum(dim=2)


def weighted_rows_float32_many(rows: Sequence[torch.Tensor], factors: torch.Tensor,
                               scales: Sequence[float]) -> list[torch.Tensor]:
    """``[sum_i (factors[i] scales[k]) rows[k][i] for each k]`` in float32, each of
    ``rows[k].shape[1:]``, for K tensors of B rows of float32 or bfloat16 and float64 factors
    (B,): the weights' float64 product, float64 products and an in-order float64 sum, rounded
    once (:func:`weighted_rows_float32` with the weights scaled first, the same bits).

    CUDA tensors (with the CUDA kernels built) take one launch per row dtype and 32 tensors
    (every column of every tensor a thread); elsewhere the same IEEE operations in torch."""
    import torch

    batch, device = _rows_of_one_batch("rows", rows)
    if len(scales) != len(rows):
        raise ValueError(f"scales must have one entry per tensor ({len(rows)}), got "
                         f"{len(scales)}")
    for k, r in enumerate(rows):
        if r.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"rows[{k}] must be float32 or bfloat16, got {r.dtype}")
    weights = factors.to(device=device, dtype=torch.float64).contiguous()
    if weights.shape != (batch,):
        raise ValueError(f"factors must have shape ({batch},), got {tuple(factors.shape)}")
    outs = [torch.empty(r.shape[1:], dtype=torch.float32, device=device) for r in rows]
    if not (device.type == "cuda" and cuda_built()):
        for r, scale, out in zip(rows, scales, outs):
            total = torch.zeros(r.shape[1:], dtype=torch.float64, device=device)
            for i in range(batch):
                total = total + (weights[i] * float(scale)) * r[i].to(torch.float64)
            out.copy_(total)
        return outs
    if batch == 0:
        return [out.zero_() for out in outs]
    sources = [r.contiguous() for r in rows]
    with _on_device(device):
        _core.cuda_clip_weighted_rows_many(
            [src.data_ptr() for src in sources], [dtype_code(src.dtype) for src in sources],
            [src[0].numel() for src in sources], [float(scale) for scale in scales],
            [out.data_ptr() for out in outs], batch, weights.data_ptr(), _stream_of(weights))
    return outs


SqNormTerm = tuple["torch.Tensor", "torch.Tensor | None", float, float]
"""One layer's part of ||g_i||^2 under flat clipping: ``(x, y, y_offset, coef)`` stands for
``coef * x * (y + y_offset)`` (``coef * x`` when y is None), x and y float64 of shape (B,)."""


def _fused_factor_terms(terms: Sequence[SqNormTerm], batch: int) -> bool:
    """Whether the C++ kernel takes these terms: contiguous float64 CPU vectors of length B."""
    import torch

    for x, y, _, _ in terms:
        for t in (x, y):
            if t is not None and (t.dtype is not torch.float64 or t.device.type != "cpu"
                                  or t.dim() != 1 or t.shape[0] != batch
                                  or not t.is_contiguous()):
                return False
    return True


def flat_clip_factors(terms: Sequence[SqNormTerm], bound: float, batch: int,
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Flat clipping's per-example norms and clip factors (Abadi et al. 2016, Algorithm 1):
    ``norms = sqrt(sum_k coef_k x_k (y_k + y_offset_k))`` over the terms in order and
    ``factors = min(1, bound / norms)`` (1 for a zero norm), both float64 of shape (B,); None
    if a squared norm is NaN or infinite.

    One C++ pass (cpp/src/clip_factors.cpp) for float64 CPU vectors, instead of a dozen tiny
    tensor operations; anything else (CUDA) takes :func:`reference_flat_clip_factors`, which
    performs the same IEEE operations in the same order (the same bits, except that torch's CPU
    square root is not correctly rounded on every element: norms may differ in the last bit).
    """
    import torch

    if not (bound > 0.0 and math.isfinite(bound)):
        raise ValueError(f"bound must be positive and finite, got {bound!r}")
    if not terms or not _fused_factor_terms(terms, batch):
        return reference_flat_clip_factors(terms, bound, batch)
    norms = torch.empty(batch, dtype=torch.float64)
    factors = torch.empty(batch, dtype=torch.float64)
    packed = [(x.data_ptr(), 0 if y is None else y.data_ptr(), float(offset), float(coef))
              for x, y, offset, coef in terms]
    if not _core.clip_flat_factors(packed, batch, float(bound), norms.data_ptr(),
                                   factors.data_ptr()):
        return None
    return norms, factors


def reference_flat_clip_factors(terms: Sequence[SqNormTerm], bound: float, batch: int,
                                ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Pure-torch :func:`flat_clip_factors` (the same operations in the same order, less the
    additions of an offset of 0 and the multiplications by a coefficient of 1, which change no
    value: y >= 0, so y + 0 is y, and 1 x is x; on a GPU each is a kernel launch, for each of a
    model's layers on every step)."""
    import torch

    device = terms[0][0].device if terms else torch.device("cpu")
    total = torch.zeros(batch, dtype=torch.float64, device=device)
    for x, y, offset, coef in terms:
        term = x if y is None else x * (y + offset if offset != 0.0 else y)
        total = total + (term if coef == 1.0 else coef * term)
    # The entries are >= 0: a finite sum means every entry is finite.
    if not math.isfinite(float(total.sum())) and not bool(torch.isfinite(total).all()):
        return None
    norms = total.sqrt()
    # a tensor divided by a tensor: one correctly rounded division (``bound / norms`` with a
    # Python float computes reciprocal(norms) * bound, two roundings)
    return norms, torch.clamp(torch.full_like(norms, bound) / norms, max=1.0)


def _conv_geometry(x: torch.Tensor, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                   padding: tuple[int, ...], dilation: tuple[int, ...],
                   dtypes: tuple[torch.dtype, ...]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The contiguous input and the kernels' geometry (B, C, in_h, in_w, kh, kw, sh, sw, ph,
    pw, dh, dw, out_h, out_w) of a 1-D or 2-D convolution (1-D as height 1), checked."""
    spatial = x.dim() - 2
    if spatial not in (1, 2) or not (len(kernel_size) == len(stride) == len(padding)
                                     == len(dilation) == spatial):
        raise ValueError(
            f"x must be (B, C, L) or (B, C, H, W) with one kernel_size/stride/padding/dilation "
            f"entry per spatial dimension, got x of shape {tuple(x.shape)} and kernel_size "
            f"{kernel_size}"
        )
    if x.device.type != "cpu":
        raise ValueError(f"x must be a CPU tensor for the CPU kernel, got {x.device}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"x must have dtype {names}, got {x.dtype}")
    src = x.contiguous()
    b, c = int(src.shape[0]), int(src.shape[1])
    if spatial == 1:
        geometry = (1, int(src.shape[2]), 1, kernel_size[0], 1, stride[0], 0, padding[0], 1,
                    dilation[0])
    else:
        geometry = (int(src.shape[2]), int(src.shape[3]), kernel_size[0], kernel_size[1],
                    stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])
    in_h, in_w, kh, kw, sh, sw, ph, pw, dh, dw = (int(v) for v in geometry)
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError("kernel_size, stride and dilation must be >= 1 and padding >= 0")
    if in_h + 2 * ph < span_h or in_w + 2 * pw < span_w:
        raise ValueError(f"the padded input {tuple(x.shape[2:])} is smaller than the kernel")
    out_h = (in_h + 2 * ph - span_h) // sh + 1
    out_w = (in_w + 2 * pw - span_w) // sw + 1
    return src, (b, c, in_h, in_w, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w)


def conv_patches(x: torch.Tensor, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...], *,
                 threads: int | None = None) -> torch.Tensor:
    """Convolution patches (im2col) of a CPU input (B, C, *spatial), spatial 1-D or 2-D:
    shape (B, L, C * prod(kernel_size)) with L the number of output positions, the last
    dimension ordered like a convolution weight's (C, k_1, ..., k_s) and zeros where the
    kernel overlaps the padding. Equal to ``F.unfold(x, ...).transpose(1, 2)`` (2-D)."""
    import torch

    src, geometry = _conv_geometry(
        x, kernel_size, stride, padding, dilation,
        (torch.float16, torch.bfloat16, torch.float32, torch.float64))
    b, c, in_h, in_w, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w = geometry
    out = torch.empty(b, out_h * out_w, c * kh * kw, dtype=src.dtype)
    _core.conv_patches(src.data_ptr(), src.element_size(), b, c, in_h, in_w, kh, kw, sh, sw,
                       ph, pw, dh, dw, out.data_ptr(), _threads(threads))
    return out


def conv_per_example_weight_grads(x: torch.Tensor, out_grads: torch.Tensor,
                                  kernel_size: tuple[int, ...], stride: tuple[int, ...],
                                  padding: tuple[int, ...], dilation: tuple[int, ...], *,
                                  threads: int | None = None) -> torch.Tensor:
    """Per-example weight gradients of a convolution (groups = 1) on the CPU, float32/float64:
    ``out[b] = G_b P_b`` of shape (B, O, C * prod(kernel_size)), with G_b (O, L) the output
    gradient ``out_grads[b]`` flattened over its L positions and P_b (L, C * prod(kernel_size))
    the patches of ``x[b]`` (see :func:`conv_patches`). The C++ kernel builds one example's
    patches at a time in a per-thread scratch buffer (cpp/src/conv_grads.cpp): no patches of
    the batch, no batched matrix product of small matrices."""
    import torch

    src, geometry = _conv_geometry(x, kernel_size, stride, padding, dilation,
                                   (torch.float32, torch.float64))
    b, c, in_h, in_w, kh, kw, sh, sw, ph, pw, dh, dw, out_h, out_w = geometry
    if out_grads.dim() < 2 or out_grads.shape[0] != b:
        raise ValueError(
            f"out_grads must be (B, O, ...) with B = {b}, got {tuple(out_grads.shape)}")
    out_channels = int(out_grads.shape[1])
    grads = out_grads.contiguous()
    _check("out_grads", grads, dtype=src.dtype, numel=b * out_channels * out_h * out_w)
    out = torch.empty(b, out_channels, c * kh * kw, dtype=src.dtype)
    _core.conv_per_example_weight_grads(
        src.data_ptr(), grads.data_ptr(), dtype_code(src.dtype), b, c, in_h, in_w, kh, kw, sh,
        sw, ph, pw, dh, dw, out_channels, out.data_ptr(), _threads(threads))
    return out


def linear_norms_implementations() -> list[str]:
    """The implementations of :func:`linear_sequence_sq_norms` this CPU can run ('avx512',
    'avx2', 'portable'), the one ``implementation="auto"`` picks first."""
    return list(_core.linear_norms_implementations())


def linear_sequence_sq_norms(a: torch.Tensor, g: torch.Tensor, *, bias: bool,
                             threads: int | None = None, implementation: str = "auto",
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-example squared gradient norms of a linear layer y = x W^T + b on sequences.

    With the activations ``a`` (B, T, d) and the output gradients ``g`` (B, T, p) of example i
    as the rows a_it, g_it, its gradients are g_i(W) = sum_t g_it a_it^T and
    g_i(b) = sum_t g_it, and::

        weight_sq[i] = ||g_i(W)||_F^2 = sum_{t,s} (a_it . a_is)(g_it . g_is)
        bias_sq[i]   = ||g_i(b)||^2   = sum_{t,s} g_it . g_is

    (the Gram or "ghost" norm: Goodfellow 2015, "Efficient per-example gradient
    computations"; Li et al., ICLR 2022, "Large language models can be strong differentially
    private learners", section 4). The C++ kernel (cpp/src/linear_norms.cpp) visits the pairs
    t <= s once, in register tiles: dot products in float64 with fused multiply-adds (float32
    rows widened as they are loaded: exact products, float64 sums, so that the norm keeps its
    digits where an example's positions cancel), their products and sums in float64. No
    per-example gradient and no Gram matrix is formed; cost ~ B T^2 (d + p) / 2 multiply-adds.
    Examples are split over ``threads`` (default ``torch.get_num_threads()``), so the result
    does not depend on the thread count.

    ``a`` and ``g`` are CPU tensors of one dtype, float32 or float64, agreeing in B and T.
    ``implementation`` is 'auto' or one of :func:`linear_norms_implementations` (they agree
    to rounding, not bit for bit). Returns ``(weight_sq, bias_sq)``, float64 of shape (B,);
    ``bias_sq`` is None unless ``bias``.
    """
    import torch

    for name, t in (("a", a), ("g", g)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (batch, positions, features), got shape "
                             f"{tuple(t.shape)}")
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the CPU kernel, got {t.device}")
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} must have dtype torch.float32 or torch.float64, got "
                             f"{t.dtype}")
    if a.dtype != g.dtype:
        raise ValueError(f"a and g must have the same dtype, got {a.dtype} and {g.dtype}")
    if a.shape[:2] != g.shape[:2]:
        raise ValueError(f"a and g must agree in batch and positions, got shapes "
                         f"{tuple(a.shape)} and {tuple(g.shape)}")
    src_a, src_g = a.contiguous(), g.contiguous()
    batch, positions, in_features = (int(v) for v in src_a.shape)
    weight_sq = torch.empty(batch, dtype=torch.float64)
    bias_sq = torch.empty(batch, dtype=torch.float64) if bias else None
    _core.linear_sequence_sq_norms(
        src_a.data_ptr(), src_g.data_ptr(), dtype_code(src_a.dtype), batch, positions,
        in_features, int(src_g.shape[2]), weight_sq.data_ptr(),
        bias_sq.data_ptr() if bias_sq is not None and batch else 0, _threads(threads),
        implementation)
    return weight_sq, bias_sq


def _embedding_inputs(indices: torch.Tensor, out_grads: torch.Tensor, num_rows: int,
                      padding_idx: int | None,
                      ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """indices (B, ...) -> contiguous int64 (B, T); out_grads (B, ..., d) -> contiguous
    (B, T, d); padding_idx -> a row index or -1 (none), checked like nn.Embedding's."""
    import torch

    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 0:
        raise ValueError(f"num_rows must be an int >= 0, got {num_rows!r}")
    if indices.dim() < 1:
        raise ValueError("indices must have a leading batch dimension")
    if indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"indices must have dtype torch.int64 or torch.int32, got "
                         f"{indices.dtype}")
    if out_grads.dim() != indices.dim() + 1 or out_grads.shape[:-1] != indices.shape:
        raise ValueError(f"out_grads must have shape indices.shape + (features,) = "
                         f"{tuple(indices.shape)} + (features,), got {tuple(out_grads.shape)}")
    for name, t in (("indices", indices), ("out_grads", out_grads)):
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the CPU kernel, got {t.device}")
    if out_grads.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"out_grads must have dtype torch.float32 or torch.float64, got "
                         f"{out_grads.dtype}")
    pad = -1
    if padding_idx is not None:
        if not -num_rows <= padding_idx < num_rows:
            raise ValueError(f"padding_idx must be None or in [-{num_rows}, {num_rows}), got "
                             f"{padding_idx}")
        pad = padding_idx % num_rows
    batch = int(indices.shape[0])
    positions = math.prod(indices.shape[1:])
    idx = indices.reshape(batch, positions).to(torch.int64).contiguous()
    grads = out_grads.reshape(batch, positions, out_grads.shape[-1]).contiguous()
    return idx, grads, pad


def embedding_sq_norms(indices: torch.Tensor, out_grads: torch.Tensor, *, num_rows: int,
                       padding_idx: int | None = None,
                       threads: int | None = None) -> torch.Tensor:
    """Per-example squared gradient norms of an embedding y[i, ...] = W[indices[i, ...]].

    Example i's gradient is g_i(W) = sum_t onehot(idx_it) gy_it^T (Goodfellow 2015): rows it
    looked up several times add up, so::

        ||g_i(W)||^2 = sum_v ||sum_{t: idx_it = v} gy_it||^2
                     = sum_t ||gy_it||^2 + 2 sum_{t < s, idx_it = idx_is} gy_it . gy_is.

    The C++ kernel (cpp/src/embedding_norms.cpp) groups each example's positions by row (a
    sort of its indices) and sums in float64; positions that look up ``padding_idx`` count
    for nothing (nn.Embedding gives the padding row no gradient). ``indices`` is (B, ...)
    int64 or int32 (any strides), ``out_grads`` has shape ``indices.shape + (d,)``, float32
    or float64, CPU. An index outside [0, num_rows) raises ValueError. Returns float64 (B,),
    independent of ``threads`` (examples are split over them).
    """
    import torch

    idx, grads, pad = _embedding_inputs(indices, out_grads, num_rows, padding_idx)
    batch, positions, features = (int(v) for v in grads.shape)
    out = torch.empty(batch, dtype=torch.float64)
    _core.embedding_sq_norms(idx.data_ptr(), grads.data_ptr(), dtype_code(grads.dtype), batch,
                             positions, features, num_rows, pad, out.data_ptr(),
                             _threads(threads))
    return out


def embedding_clipped_sum(indices: torch.Tensor, out_grads: torch.Tensor,
                          factors: torch.Tensor, *, num_rows: int,
                          padding_idx: int | None = None, out: torch.Tensor | None = None,
                          threads: int | None = None) -> torch.Tensor:
    """The clipped sum sum_i factors[i] g_i(W) of an embedding's per-example gradients
    (book-keeping, Bu et al., ICML 2023: no per-example gradient is formed)::

        out[v] = sum_{(i, t): idx_it = v, v != padding_idx} factors[i] gy_it.

    A fresh (num_rows, d) tensor of ``out_grads``' dtype: the C++ kernel groups the positions
    by row (a counting sort), then writes every row once, summing its positions in (i, t)
    order in float64 and rounding once (zeros where no position looks the row up). Rows are
    split over ``threads``, so the result does not depend on the thread count. ``factors``
    is float64 (B,); the other arguments are as for :func:`embedding_sq_norms`. With ``out``
    (contiguous (num_rows, d) of ``out_grads``' dtype) the sum is added to it in place (each
    looked-up row summed in float64 from its old value and rounded once) and ``out`` returned.
    """
    import torch

    idx, grads, pad = _embedding_inputs(indices, out_grads, num_rows, padding_idx)
    batch, positions, features = (int(v) for v in grads.shape)
    _check("factors", factors, dtype=torch.float64, numel=batch)
    if factors.dim() != 1:
        raise ValueError(f"factors must be 1-D (B,), got shape {tuple(factors.shape)}")
    accumulate = out is not None
    if out is None:
        out = torch.empty(num_rows, features, dtype=grads.dtype)
    else:
        _check("out", out, dtype=grads.dtype, numel=num_rows * features)
    _core.embedding_clipped_sum(idx.data_ptr(), grads.data_ptr(), factors.data_ptr(),
                                dtype_code(grads.dtype), batch, positions, features, num_rows,
                                pad, out.data_ptr(), accumulate, _threads(threads))
    return out


def clip_accumulate_noise(
    out: torch.Tensor,
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
    threads: int | None = None,
) -> torch.Tensor:
    """``out = scale * (base + sum_i factors[i] * per_example[i] + noise_std * z)``, in place.

    ``z`` is the noise stream (key, parameter, release, rank) (see the module docstring): its
    float64 sequence for float64 ``out``, its float32 sequence otherwise (exactly widened);
    ``base`` may be ``out`` itself (accumulate in place) or None (zero); ``per_example`` has
    shape (B, *out.shape) with float64 ``factors`` of shape (B,). Arithmetic in float64, one
    rounding to ``out.dtype`` at the end. Returns ``out``.

    ``per_example`` and ``base`` have ``out``'s dtype, except on the CPU in two mixes: float32
    ``per_example`` into a float64 ``out`` (and base), a float64 sum of float32 chunks; and a
    float64 ``base`` (and ``per_example``) into a float32 ``out``, a float64 sum released with
    its noise and one rounding to float32.
    """
    import torch

    if not (math.isfinite(noise_std) and noise_std >= 0.0):
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    numel = out.numel()
    device = None
    if out.is_cuda:
        _require_cuda_kernels("out", out)
        device = out.device
    _check("out", out, dtype=out.dtype, numel=numel, device=device)
    code = dtype_code(out.dtype)
    # the other operands' dtype: out's, or the one mix this out allows on the CPU
    other = {torch.float32: torch.float64, torch.float64: torch.float32}.get(out.dtype)
    pe_ptr = 0
    f_ptr = 0
    batch = 0
    rows_dtype = base_dtype = out.dtype
    if per_example is not None:
        if factors is None:
            raise ValueError("factors must be given with per_example")
        batch = int(per_example.shape[0])
        rows_dtype = (per_example.dtype if device is None and per_example.dtype == other
                      else out.dtype)
        _check("per_example", per_example, dtype=rows_dtype, numel=batch * numel,
               device=device)
        _check("factors", factors, dtype=torch.float64, numel=batch, device=device)
        pe_ptr = per_example.data_ptr()
        f_ptr = factors.data_ptr()
    b_ptr = 0
    if base is not None:
        base_dtype = (torch.float64 if device is None and base.dtype == torch.float64
                      else out.dtype)
        _check("base", base, dtype=base_dtype, numel=numel, device=device)
        b_ptr = base.data_ptr()
    # any other mix is refused by the kernel (ValueError)
    mixed = (rows_dtype, base_dtype) != (out.dtype, out.dtype)
    if device is not None:
        with _on_device(device):
            _core.cuda_clip_accumulate_noise(
                pe_ptr, f_ptr, batch, b_ptr, out.data_ptr(), code, numel, float(noise_std),
                key_words(key), int(parameter) & _MASK32,
                int(release) & _MASK32, int(rank) & _MASK32, float(scale), _stream_of(out),
            )
        return out
    _core.clip_accumulate_noise(
        pe_ptr, f_ptr, batch, b_ptr, out.data_ptr(), code, numel, float(noise_std),
        key_words(key), int(parameter) & _MASK32, int(release) & _MASK32,
        int(rank) & _MASK32, float(scale), _threads(threads),
        dtype_code(rows_dtype) if mixed else -1, dtype_code(base_dtype) if mixed else -1,
    )
    return out


def layer_norm_affine_rows(
    x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, out_grads: torch.Tensor,
    normalized_dims: int, *, weight: bool = True, bias: bool = True,
    threads: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-example gradients of a layer norm's affine weight and bias (Ba et al. 2016),
    ``g_i(w) = sum_r gy[i, r] * (x[i, r] - mean[i, r]) * rstd[i, r]`` and
    ``g_i(b) = sum_r gy[i, r]``, summed over every dimension but the batch and the last
    ``normalized_dims`` (float64 sums, one rounding), without forming the normalised input.

    ``x`` and ``out_grads`` (B, ..., *normalized_shape) of one dtype (float32 / float64, CPU),
    ``mean`` and ``rstd`` the per-row statistics of ``torch.native_layer_norm``. Returns
    (weight rows, bias rows) of shape (B, *normalized_shape), None where not asked for.
    """
    import torch

    if x.shape != out_grads.shape or x.dtype != out_grads.dtype:
        raise ValueError(f"x and out_grads must have one shape and dtype, got {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(out_grads.shape)} {out_grads.dtype}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"x must have dtype float32 or float64, got {x.dtype}")
    if not 1 <= normalized_dims < x.dim():
        raise ValueError(f"normalized_dims must be in [1, {x.dim() - 1}], got {normalized_dims}")
    batch = int(x.shape[0])
    features = math.prod(x.shape[x.dim() - normalized_dims:])
    rows = math.prod(x.shape[1:x.dim() - normalized_dims])
    src_x, src_g = x.contiguous(), out_grads.contiguous()
    src_mean = mean.to(x.dtype).contiguous()
    src_rstd = rstd.to(x.dtype).contiguous()
    for name, t in (("x", src_x), ("out_grads", src_g)):
        _check(name, t, dtype=x.dtype, numel=batch * rows * features)
    for name, t in (("mean", src_mean), ("rstd", src_rstd)):
        _check(name, t, dtype=x.dtype, numel=batch * rows)
    shape = (batch, *x.shape[x.dim() - normalized_dims:])
    w_rows = torch.empty(shape, dtype=x.dtype) if weight else None
    b_rows = torch.empty(shape, dtype=x.dtype) if bias else None
    _core.layer_norm_affine_rows(
        src_x.data_ptr(), src_mean.data_ptr(), src_rstd.data_ptr(), src_g.data_ptr(),
        dtype_code(x.dtype), batch, rows, features,
        0 if w_rows is None else w_rows.data_ptr(), 0 if b_rows is None else b_rows.data_ptr(),
        _threads(threads),
    )
    return w_rows, b_rows


def release_noise(
    outs: Sequence[torch.Tensor],
    bases: Sequence[torch.Tensor | None],
    *,
    noise_std: float,
    key: int,
    release: int = 0,
    rank: int = 0,
    scale: float = 1.0,
    parameters: Sequence[int] | None = None,
    threads: int | None = None,
) -> None:
    """``outs[k] = scale * (bases[k] + noise_std * z_k)`` in place for every k, with ``z_k`` the
    noise stream of parameter index ``parameters[k]`` (default k; see
    :func:`clip_accumulate_noise`; ``bases[k]`` may be ``outs[k]`` or None, and on the CPU a
    float64 base of a float32 out: the noise added in float64, one rounding). One C++ call for
    all CPU buffers, processed in the order given (whose tiles the threads share), and one
    call for the CUDA buffers of each device (one launch per dtype and 64 buffers; a launch per
    buffer cost about 30 us of host time each, 4.7 ms of a GPT-2 small step's 148 parameters
    on an H200, where their noise takes 0.6 ms of the GPU's). A CUDA buffer's base has its
    out's dtype. The buffers must not overlap one another (a base may be its own out)."""
    import torch

    if len(outs) != len(bases):
        raise ValueError(f"outs and bases must have the same length, got {len(outs)} and "
                         f"{len(bases)}")
    indices = list(range(len(outs))) if parameters is None else [int(k) for k in parameters]
    if len(indices) != len(outs) or len(set(indices)) != len(indices):
        raise ValueError("parameters must give one distinct stream index per buffer")
    if not (math.isfinite(noise_std) and noise_std >= 0.0):
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    cpu: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []
    cuda: dict[torch.device, list[tuple[int, torch.Tensor, torch.Tensor | None]]] = {}
    for position, (k, out, base) in enumerate(zip(indices, outs, bases)):
        if out.is_cuda:
            _require_cuda_kernels(f"outs[{position}]", out)
            dtype_code(out.dtype)  # refuses float16 and non-floating outs by name
            _check(f"outs[{position}]", out, dtype=out.dtype, numel=out.numel(),
                   device=out.device)
            if base is not None and base is not out:
                _check(f"bases[{position}]", base, dtype=out.dtype, numel=out.numel(),
                       device=out.device)
            cuda.setdefault(out.device, []).append((k, out, base))
            continue
        _check(f"outs[{position}]", out, dtype=out.dtype, numel=out.numel())
        if base is not None and base is not out:
            wide = out.dtype == torch.float32 and base.dtype == torch.float64
            _check(f"bases[{position}]", base, dtype=torch.float64 if wide else out.dtype,
                   numel=out.numel())
        cpu.append((k, out, base))
    words = key_words(key)
    for device, group in cuda.items():
        with _on_device(device):
            _core.cuda_clip_release_noise(
                [out.data_ptr() for _, out, _ in group],
                [0 if base is None else base.data_ptr() for _, _, base in group],
                [out.numel() for _, out, _ in group],
                [dtype_code(out.dtype) for _, out, _ in group],
                [k & _MASK32 for k, _, _ in group],
                float(noise_std), words, int(release) & _MASK32, int(rank) & _MASK32,
                float(scale), _stream_of(group[0][1]))
    if not cpu:
        return
    _core.clip_release_noise(
        [out.data_ptr() for _, out, _ in cpu],
        [0 if base is None else base.data_ptr() for _, _, base in cpu],
        [out.numel() for _, out, _ in cpu],
        [dtype_code(out.dtype) for _, out, _ in cpu],
        [k for k, _, _ in cpu],
        float(noise_std), words, int(release) & _MASK32, int(rank) & _MASK32,
        float(scale), _threads(threads),
        [dtype_code(out.dtype if base is None else base.dtype) for _, out, base in cpu],
    )


def __getattr__(name: str) -> object:
    """The pure-torch references (``reference_gaussian``, ...) under this module's name, loaded
    from :mod:`dpsharp.torch.kernel_references` on first use (PEP 562)."""
    from dpsharp.torch import kernel_references

    try:
        return getattr(kernel_references, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
