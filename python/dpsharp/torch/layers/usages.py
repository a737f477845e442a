"""Per-example gradient book-keeping for one call of one layer (a *usage*).

A usage holds what the backward pass left behind for one call of a layer (its input
activations and the gradient of its output) and can answer, for each trainable parameter of the
layer:

* ``sq_norm(p)``: the squared norm of each example's gradient of ``p``, shape (B,), float64,
  without materialising the per-example gradients where that is cheaper (ghost norm), raised
  by a bound on the round-off with which ``clipped_sum`` forms that example's part where the
  two compute it differently (``sq_norm_and_slack``), so that a clip factor taken from it
  bounds what is actually summed;
* ``per_example(p)``: the per-example gradients, shape (B, *p.shape) (used for tied weights);
* ``clipped_sum(p, factors)``: ``sum_i factors[i] * g_i(p)``, shape ``p.shape``, by
  book-keeping (one contraction with the stored tensors; Bu et al., ICML 2023).

The stored output gradients are those of the *loss*: with a mean-reduced loss they are the
per-example gradients divided by the batch size. Every usage carries that factor as ``scale``
(g_i = scale * what the stored tensors give) and applies it to the float64 norms
(``scale^2``) and to the clip factors (``factors * scale``), so no scaled copy of an output
gradient is ever made.

Per-example gradients follow from the chain rule per example: for y = x W^T + b on a sequence,
g_i(W) = sum_t gy_{i,t} x_{i,t}^T, so ||g_i(W)||^2 = sum_{t,s} (x_{i,t}.x_{i,s})(gy_{i,t}.gy_{i,s})
(the Gram / ghost norm of Goodfellow 2015 and Li et al. 2022) and
||g_i(b)||^2 = ||sum_t gy_{i,t}||^2. On the CPU one fused kernel computes the weight's from the
pairs t <= s (B T^2 (d + p) / 2 multiply-adds, no Gram matrix); elsewhere two batched Gram
matmuls do (B T^2 (d + p)); both accumulate the Gram entries in float64, which the norm needs
where an example's positions cancel. Materialising g_i(W) instead costs B T d p plus writing
and reading B d p elements; each layer picks the cheaper (LinearUsage._materialise_weight).
Embeddings on the CPU have fused kernels too (rows grouped per example for the norms, per row
for the clipped sum). Convolutions are the same contraction over their patches (im2col), which
never exist for the whole batch at once: their per-example gradients come from a fused kernel
that builds one example's patches at a time (CPU) or from patches per chunk of examples, and on
the Gram path their clipped sum is one ordinary convolution weight gradient with the output
gradient scaled per example.

A parameter used by several layers (tied weights: a language model's input embedding that is
also its output projection) has the sum of the uses' gradients as its per-example gradient.
Its norm is sum_u ||g_i^u||^2 + 2 sum_{u<v} <g_i^u, g_i^v>, each cross term formed from the
stored tensors of the two uses (:func:`tied_cross_dot`), and its clipped sum is each use's own
book-keeping contraction, added into one tensor.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from dpsharp.torch import kernels

if TYPE_CHECKING:
    import torch

__all__ = ["AffineUsage", "Arena", "BlockUsage", "ConvUsage", "EmbeddingUsage", "LinearUsage",
           "PerExampleUsage", "TransposedLinearUsage", "Usage", "arena_empty",
           "begin_backward_pass", "conv_patches", "early_arena", "tied_cross_dot", "tied_sq_norm",
           "weighted_sum"]

# Elements of the patch / Gram scratch built at once (per chunk of examples): 512 KiB of
# float32, small enough to stay in cache between being written and read, and out of the
# allocator's mmap path (a fresh multi-megabyte buffer costs its page faults on every step).
_CHUNK_ELEMENTS = 1 << 17
# The same on a GPU, where the cache argument does not hold and each chunk costs a few kernel
# launches: 16 Mi elements (64 MiB of float32) per chunk. At the CPU's size a ResNet-18 layer
# of 32x32 positions (patches of 576 elements per position) went one example per chunk, 256
# chunks per layer: 549 examples/s against 20,051 non-private on an H200 (bench/bench_gpu.py).
_DEVICE_CHUNK_ELEMENTS = 1 << 24

# Per-example weight gradients formed at once by a Gram-route clipped sum
# (LinearUsage._per_example_product_sum): 2 MiB of float32, two examples of the bench
# transformers' feed-forward layers (one per chunk ran 10-20% slower: more passes over the
# float64 total).
_PRODUCT_CHUNK_ELEMENTS = 1 << 19

# Linear layers on sequences, CPU: how many multiply-adds of the fused Gram-norm kernel cost as
# much as one element of materialised per-example gradient (written, squared, read back by the
# clipped sum); measured, see LinearUsage._materialise_weight.
_GRAM_PER_MATERIALISED = 40

# Linear layers on sequences whose stored tensors are bfloat16 (autocast) on a device with
# mixed-precision products (GPUs): materialise the per-example gradients, in bfloat16, while
# they take at most this many times the memory of the example's stored input and output
# gradient, d p <= ratio T (d + p) (see LinearUsage._materialise_weight).
_HALF_MATERIALISED_PER_STORED = 3


@functools.lru_cache(maxsize=None)
def _vectorised_linear_norms() -> bool:
    """Whether this CPU runs a vectorised build (AVX-512 or AVX2) of the fused sequence-linear
    norm kernel. Its portable build (four plain lanes, no FMA) is slower than torch's batched
    Gram matmuls, so without one the Gram norms stay on the torch path."""
    return kernels.linear_norms_implementations()[0] != "portable"


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 -> float32 (exact); other dtypes unchanged."""
    import torch

    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


@functools.lru_cache(maxsize=None)
def _bmm_has_out_dtype(device_type: str) -> bool:
    """Whether this torch has ``torch.bmm(..., out_dtype=torch.float32)`` for half-precision
    operands on ``device_type`` (CUDA since torch 2.8; not on the CPU)."""
    import torch

    try:
        probe = torch.ones(1, 1, 1, dtype=torch.bfloat16, device=device_type)
        return torch.bmm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _wide_bmm(m1: torch.Tensor, m2: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.bmm(m1, m2)`` of float32-widened operands, in float32 (other dtypes: the plain
    product).

    float16 / bfloat16 operands on a device whose torch offers ``out_dtype`` are multiplied as
    they are, with float32 accumulation and a float32 result (the tensor cores' mixed-precision
    product): the product of two bfloat16 (8-bit significand) or float16 (11-bit) numbers is
    exact in float32 (24 bits), so this computes the same sum of exact products in float32 as
    the product of widened copies, without writing the copies, and at the half-precision
    matrix rate (a GPT-2-small layer under bf16 autocast: its Gram matrices in float32 ran at
    about a tenth of the non-private backward's rate on an H200). Elsewhere the operands are
    widened first; float32 operands on a GPU where the user enabled TF32 (or a lowered matmul
    precision) are multiplied in float64 (:func:`_float64_bmm`), so that the per-example
    gradients keep float32 accuracy (their norms and sums read the stored values, so soundness
    does not depend on it). ``out``, when given, receives the float32 (or plain) product."""
    import torch

    half = (torch.float16, torch.bfloat16)
    if m1.dtype in half and m1.dtype == m2.dtype and _bmm_has_out_dtype(m1.device.type):
        product = torch.bmm(m1, m2, out_dtype=torch.float32)
        return product if out is None else out.copy_(product)
    if (m1.is_cuda and m1.dtype == torch.float32 and m2.dtype == torch.float32
            and _float32_operand_roundoff(m1.device)):
        product = _float64_bmm(m1, m2)
        return product.to(torch.float32) if out is None else out.copy_(product)
    return torch.bmm(_wide(m1), _wide(m2), out=out)


def _gram_bmm(m1: torch.Tensor, m2: torch.Tensor) -> torch.Tensor:
    """A batch of Gram matrices for a ghost norm, accumulated and returned in float64 on every
    device and for every input precision (:func:`_float64_bmm`).

    The ghost norm sum_{t,s} (a_t . a_s)(g_t . g_s) is a float64 dot of two Grams whose terms
    cancel where an example's positions do, so an entry's rounding error is amplified by the
    ratio (sum_t ||a_t|| ||g_t||)^2 / ||g_i||^2, unbounded in the worst case. A float32 sum
    errs by up to about d 2^-24 ||a_t|| ||a_s|| per entry: a constructed 16-position example
    (d = p = 64) lost 26% of its squared norm through float32 Grams, so its clipped
    contribution reached 1.16 C; the tensor cores' float32 accumulation of half-precision
    products is no better. Float64 sums of the exact products lower the per-entry error to
    about d 2^-53 ||a_t|| ||a_s||."""
    return _float64_bmm(m1, m2)


def _float64_bmm(m1: torch.Tensor, m2: torch.Tensor) -> torch.Tensor:
    """``torch.bmm`` of float32 / float16 / bfloat16 operands computed and returned in float64
    (callers round it once where they want float32): the products of such numbers are exact in
    float64 and the sums keep 53 bits.
    On a GPU a float32 product would follow the process-wide TF32 setting (operands rounded to
    10-bit significands, norms about 1e-3 off, for a user who enabled it), and its float32
    sums lose digits where an example's positions cancel; float64 is immune to both, and on
    the data-centre GPUs it runs at about the float32 (non-tensor-core) rate."""
    import torch

    return torch.bmm(m1.to(torch.float64), m2.to(torch.float64))


def _wide_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``_wide(t).sum(dim)`` without the widened copy: half precision summed with a float32
    accumulator and result (torch's ``dtype=`` reduction), other dtypes as they are."""
    import torch

    if t.dtype in (torch.float16, torch.bfloat16):
        return t.sum(dim=dim, dtype=torch.float32)
    return t.sum(dim=dim)


def _float32_operand_roundoff(device: torch.device) -> float:
    """The relative rounding a float32 matrix product or convolution may apply to its operands
    on ``device`` under the process-wide settings: 0 for IEEE float32 products; 2^-10 where
    TF32 may be used (10-bit significands, rounding direction not documented, so a whole unit
    in the last place); 2^-7 where bfloat16 may be (7-bit significands). Both of torch's
    precision interfaces are read: the legacy ones (``torch.set_float32_matmul_precision``,
    ``torch.backends.cuda.matmul.allow_tf32``), which torch refuses to read once the newer
    per-backend ``fp32_precision`` settings were used, and those newer ones (global, CUDA
    matmul; oneDNN matmul and convolution on the CPU)."""
    import torch

    backends = torch.backends
    if device.type == "cuda":
        holders = [backends, backends.cuda.matmul]
    else:
        holders = [backends, getattr(backends, "mkldnn", None),
                   getattr(getattr(backends, "mkldnn", None), "matmul", None),
                   getattr(getattr(backends, "mkldnn", None), "conv", None)]
    settings = [getattr(h, "fp32_precision", None) for h in holders if h is not None]
    try:
        settings.append({"highest": "ieee", "high": "tf32", "medium": "bf16"}.get(
            torch.get_float32_matmul_precision(), "bf16"))
        if device.type == "cuda" and backends.cuda.matmul.allow_tf32:
            settings.append("tf32")
    except RuntimeError:  # the newer interface is in use: its settings above decide
        pass
    if "bf16" in settings or (device.type != "cuda" and "tf32" in settings):
        return 2.0**-7  # the CPU's backends may meet a lowered precision with bfloat16
    return 2.0**-10 if "tf32" in settings else 0.0


def _unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p for a dtype with a p-bit significand (float64, float32, bfloat16, float16)."""
    import torch

    return {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8,
            torch.float16: 2.0**-11}[dtype]


def _raised(sq: torch.Tensor, slack: torch.Tensor | None) -> torch.Tensor:
    """(||g_i|| + e_i)^2 for squared norms ``sq`` and round-off slacks e_i (None: 0): the norm a
    clip factor must be taken from so that the contribution actually summed stays within C
    (see :meth:`Usage.sq_norm_and_slack`)."""
    return sq if slack is None else (sq.sqrt() + slack) ** 2


def _gamma(n: int, unit: float) -> float:
    """gamma_n = n u / (1 - n u) (Higham 2002, section 3.1), for n u < 1/2."""
    if n * unit >= 0.5:
        raise ValueError(f"{n} terms are too many for the round-off bound in this precision")
    return n * unit / (1.0 - n * unit)


def product_roundoff_factor(terms: int, dtype: torch.dtype, device: torch.device) -> float:
    """kappa with |fl(sum_k x_k y_k) - sum_k x_k y_k| <= kappa sum_k |x_k y_k| for a matrix
    product's entries of ``terms`` products, ``terms + 3`` counting the rounding of a factor,
    of the operand scaled by it and of a float64 sum of blocks rounded back, in ``dtype``
    (float16 / bfloat16 operands are widened to float32 first) on ``device``.

    For recursive summation in any order, fused multiply-adds included,
    |fl(sum) - sum| <= gamma_n sum |x_k y_k| with gamma_n = n u / (1 - n u) (Higham 2002,
    "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1, eq. (3.4) and
    Lemma 3.1); operands rounded to a significand with unit roundoff v before the products
    multiply every product by at most (1 + v)^2. So kappa = (1 + v)^2 (1 + gamma_{n+3}) - 1,
    with u = 2^-53 for float64 and 2^-24 for float32, 2^-23 where the operands are rounded
    (TF32 / bfloat16 products run on tensor cores, which may truncate: Fasi, Higham, Mikaitis,
    Pranesh 2021, "Numerical behavior of NVIDIA tensor cores"), v from
    :func:`_float32_operand_roundoff`."""
    import torch

    if dtype == torch.float64:
        unit, operand = 2.0**-53, 0.0
    else:
        operand = _float32_operand_roundoff(device)
        unit = 2.0**-23 if operand else 2.0**-24
    return (1.0 + operand) ** 2 * (1.0 + _gamma(terms + 3, unit)) - 1.0


def gram_roundoff_factor(features_a: int, features_g: int, positions: int) -> float:
    """kappa with |computed - exact| <= kappa S^2 for a ghost norm sum_{t,s} A_ts G_ts formed
    from float64 Grams, S = sum_t ||a_t|| ||g_t||: each entry A_ts a float64 sum of
    ``features_a`` exact products errs by at most gamma_d ||a_t|| ||a_s|| (likewise G_ts),
    and the float64 dot of the two T x T Grams by gamma_{T^2 + 1} sum |A_ts G_ts|; with
    |A_ts| <= ||a_t|| ||a_s||, every term is at most its bound times
    ||a_t|| ||a_s|| ||g_t|| ||g_s||, whose sum over (t, s) is S^2. So
    kappa = (1 + gamma_d)(1 + gamma_p)(1 + gamma_{T^2+1}) - 1, u = 2^-53. Where positions
    cancel, S^2 is R^2 times the norm (R = S / ||g_i||): a Gram loses ~d 2^-53 R^2 of it, which
    this covers (typical R^2 is about T: a relative 10^-13)."""
    unit = 2.0**-53
    return ((1.0 + _gamma(features_a, unit)) * (1.0 + _gamma(features_g, unit))
            * (1.0 + _gamma(positions * positions + 1, unit)) - 1.0)


def split_product_roundoff_factor(terms: int) -> float:
    """kappa of :func:`product_roundoff_factor` for the split bfloat16 clipped sum
    (:meth:`LinearUsage._split_bf16_clipped_sum`): the scale, the clip factor and their product
    with the output gradient rounded in float32 ((1 + 2^-24)^3), the split hi + lo within
    2^-16 relative of that product, and each example's 2 T exact products summed with float32
    accumulation on tensor cores, which may truncate (gamma_{2T} with u = 2^-23; Fasi, Higham,
    Mikaitis, Pranesh 2021, "Numerical behavior of NVIDIA tensor cores"), times the bound
    sum (|hi| + |lo|) |a| <= (1 + 2^-7) sum |y| |a| (|lo| <= 2^-8 |y|, |hi| <= (1 + 2^-8) |y|)."""
    split = (1.0 + 2.0**-24) ** 4 * (1.0 + 2.0**-16)  # and the float32 result's rounding
    return split - 1.0 + split * (1.0 + 2.0**-7) * _gamma(2 * terms, 2.0**-23)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(B, ...) -> contiguous (B, n) without a copy when already contiguous."""
    return t.reshape(t.shape[0], -1)


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """values (B,) viewed to broadcast against like (B, ...)."""
    return values.reshape((values.shape[0],) + (1,) * (like.dim() - 1))


def _chunk(batch: int, per_example_elements: int, *, on_cpu: bool = True) -> int:
    budget = _CHUNK_ELEMENTS if on_cpu else _DEVICE_CHUNK_ELEMENTS
    return max(1, min(batch, budget // max(per_example_elements, 1)))


_SCRATCH = threading.local()
_SCRATCH_MIN_ELEMENTS = 1 << 15


def _overflow_capped_factors(factors: torch.Tensor, scale: float, dtype: torch.dtype,
                             largest: torch.Tensor, products: torch.Tensor) -> torch.Tensor:
    """The clip factors (float64, (B,)) lowered where needed so that a float32 clipped sum
    cannot overflow: c_i |scale|, c_i |scale| L_i and c_i |scale| S_i at most a quarter of
    float32's largest value over B, for L_i a bound on the entries of the example's part of the
    operand the factors scale (the largest norm of its rows, which the round-off bounds have
    already computed: no further pass over the operand) and S_i = sum_t ||a_t|| ||g_t|| (which
    bounds every partial sum of the product). A lowered factor shrinks the example's whole
    contribution, so the bound holds; it binds at magnitudes near 10^38 (automatic clipping of a
    vanishing gradient: c = C / ||g_i|| of 10^40 times an activation of order 1 gave an inf
    release). Products in float64 (``dtype``) pass through."""
    import torch

    if dtype == torch.float64 or int(factors.shape[0]) == 0:
        return factors
    limit = torch.finfo(torch.float32).max / (4.0 * int(factors.shape[0]))
    magnitude = torch.maximum(largest, products).clamp_min(1.0) * abs(scale)
    return torch.minimum(factors, limit / magnitude)


def _flush_subnormal(weights: torch.Tensor) -> torch.Tensor:
    """Set to zero, in place, the clip weights (factor times loss scale, already rounded to a
    reduced dtype) that fell below the dtype's normal range, and return them.

    Below the smallest normal number (2^-126 in float32 and bfloat16) a value keeps fewer
    significant bits: float32 rounds 1.0e-45 up to 2^-149 = 1.40e-45, and a weight rounded up
    scales the example's whole contribution with it (one example released 1.40 C, and 1.86 C
    through an MSE loss on one crafted record, each gradient finite). The round-off bounds
    assume a relative unit round-off of 2^-24, which only normal numbers have. A weight that
    small belongs to an example whose gradient norm exceeds C 2^126 / scale; dropping that
    example's contribution is within its bound. The clipper zeroes such factors for every use
    of an example at once (``PerSampleClipper``): this catches the weights that overflow capping
    lowered further."""
    import torch

    if weights.dtype == torch.float64:
        return weights
    return weights.masked_fill_(weights.abs() < torch.finfo(weights.dtype).tiny, 0.0)


def _scaled_rows(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``rows * weights[:, None]`` for a 2-D ``rows`` (N, k), written into this thread's scratch
    buffer (kept between calls, grown as needed) rather than a fresh tensor: a clipped sum's
    scaled operand is megabytes on every layer of every step, and a fresh allocation of that
    size costs its page faults each time (the allocator returns such blocks to the system).
    The result is only valid until the next call on this thread: use it before (the clipped
    sum's matrix product does)."""
    import torch

    numel = rows.numel()
    if numel < _SCRATCH_MIN_ELEMENTS:  # below the allocator's mmap threshold anyway
        return rows * weights[:, None]
    buffer = getattr(_SCRATCH, "buffer", None)
    if (buffer is None or buffer.numel() < numel or buffer.dtype != rows.dtype
            or buffer.device != rows.device):
        buffer = torch.empty(max(numel, 1), dtype=rows.dtype, device=rows.device)
        _SCRATCH.buffer = buffer
    out = buffer[:numel].view(rows.shape)
    return torch.mul(rows, weights[:, None], out=out)


_ARENA_ALIGN = 16  # elements: 64-byte alignment of every tensor handed out (float32)


class Arena:
    """Memory for per-example gradients that live only until the end of one clip step (from
    their norms to their clipped sum), carved from buffers kept between steps, one per
    (dtype, device), each sized to the largest step seen.

    Materialised per-example gradients are the largest transient tensors of a step (GPT-2 of
    bench/bench_transformers.py: 40 MB per step). Freshly allocated, each step pays their page
    faults again: blocks this large are returned to the system when freed (glibc's mmap
    threshold, or the heap trimmed from its top) and every page is faulted in anew on first
    write, which cost 3 microseconds per 4 KiB page on the 2-core bench machine (about 10 ms
    per step for those 40 MB). A request that does not fit the buffer gets fresh memory (the
    first step, or a larger batch), and the next step gets a buffer of the size this one
    needed. A tensor handed out is valid until the next :meth:`begin`. CPU only: other devices'
    caching allocators keep their memory already."""

    def __init__(self) -> None:
        # (dtype, device) -> [buffer or None, elements handed out, elements wanted]
        self._buffers: dict[Any, list[Any]] = {}
        self._open: set[int] = set()  # owners whose pass is under way (open_pass)

    def open_pass(self, owner: int) -> None:
        """``owner`` starts handing out tensors for one pass: :meth:`begin` first if no other
        owner's pass is under way (two clippers whose backward passes interleave share the
        buffers without reusing each other's memory; what does not fit gets fresh memory)."""
        if not self._open:
            self.begin()
        self._open.add(owner)

    def close_pass(self, owner: int) -> None:
        """``owner``'s pass is over: its tensors may be handed out again from the next
        :meth:`open_pass` on."""
        self._open.discard(owner)

    def begin(self) -> None:
        """The tensors handed out since the last call are no longer in use: hand their memory
        out again. A buffer that was too small is dropped here, and one of the size the last
        step needed is made at the next request (never two buffers alive at once)."""
        for entry in self._buffers.values():
            buffer, used = entry[0], entry[1]
            if buffer is None or used > buffer.numel():
                entry[0] = None
                entry[2] = max(entry[2], used)
            entry[1] = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of ``shape``, valid until the next :meth:`begin`."""
        import torch

        if torch.device(device).type != "cpu":
            return torch.empty(shape, dtype=dtype, device=device)
        numel = math.prod(shape)
        entry = self._buffers.setdefault((dtype, torch.device(device)), [None, 0, 0])
        buffer, offset, wanted = entry
        if buffer is None and wanted > 0:
            buffer = entry[0] = torch.empty(wanted, dtype=dtype, device=device)
        end = offset + numel
        entry[1] = end + (-end) % _ARENA_ALIGN
        if buffer is None or end > buffer.numel():
            return torch.empty(shape, dtype=dtype, device=device)
        return buffer[offset:end].view(shape)


_ARENA = threading.local()


def _thread_arena() -> Arena:
    arena = getattr(_ARENA, "arena", None)
    if arena is None:
        arena = _ARENA.arena = Arena()
    return arena


def early_arena() -> Arena:
    """This thread's arena for per-example gradients materialised during a backward pass
    (:meth:`LinearUsage.materialise_early`), held until the pass's clip step is over; its
    users bracket each pass with :meth:`Arena.open_pass` and :meth:`Arena.close_pass`."""
    arena = getattr(_ARENA, "early", None)
    if arena is None:
        arena = _ARENA.early = Arena()
    return arena


def begin_backward_pass() -> None:
    """Mark the start of a clip step on this thread: the tensors :func:`arena_empty` handed
    out during the previous one are no longer in use, and its memory is handed out again
    (:meth:`Arena.begin` of this thread's arena)."""
    _thread_arena().begin()


def arena_empty(shape: tuple[int, ...], dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """An uninitialised tensor for a per-example gradient that lives only until the end of the
    clip step, from this thread's :class:`Arena`: valid until :func:`begin_backward_pass` on
    this thread (the clipper calls it when a backward pass ends, before the usages of that
    pass are read)."""
    return _thread_arena().empty(shape, dtype, device)


_MEMO = threading.local()


class RowTerm(NamedTuple):
    """One parameter's per-example gradients as stored rows (:meth:`Usage.row_terms`): its
    squared norm is ``s2 ||rows[i]||^2`` and its clipped sum ``finish(sum_i c_i scale
    rows[i])`` for clip factors c (the sum in float32, of ``rows.shape[1:]``)."""

    param: Any
    rows: Any  # torch.Tensor (B, ...), float32 or bfloat16
    s2: float
    scale: float
    finish: Callable[[Any], Any]


def _reshaped(total: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``total`` in a parameter's shape (a :class:`RowTerm`'s ``finish`` for rows that are the
    parameter's per-example gradients flattened or in its own shape)."""
    return total.reshape(shape)


def _stored_rows(rows: torch.Tensor) -> bool:
    """Whether ``rows`` can be measured and summed as stored rows (:class:`RowTerm`): float32 or
    bfloat16 (float64 models keep their float64 weighted sums)."""
    import torch

    return rows.dtype in (torch.float32, torch.bfloat16)


def _memo_of(factors: torch.Tensor) -> dict[Any, torch.Tensor]:
    """This thread's memo of tensors derived from ``factors`` (emptied when a clip step hands
    over another factors tensor: it keeps the latest one only)."""
    entry = getattr(_MEMO, "entry", None)
    if entry is None or entry[0] is not factors:
        entry = _MEMO.entry = (factors, {})
    return entry[1]


def _scaled_factors(factors: torch.Tensor, scale: float, dtype: torch.dtype,
                    repeat: int) -> torch.Tensor:
    """``factors * scale`` in ``dtype``, each entry repeated ``repeat`` times, computed once per
    (factors tensor, scale, dtype, repeat) on this thread: under flat clipping every layer of a
    backward pass uses the same factors, usually the same scale and dtype, so one clip step
    forms them once instead of once per layer (the memo keeps the latest factors tensor)."""
    memo = _memo_of(factors)
    key = (scale, dtype, repeat)
    weights = memo.get(key)
    if weights is None:
        import torch

        # the float64 product rounded once into the stored tensors' dtype, in one operation;
        # a factor past the dtype's range (automatic clipping without stability: C / ||g_i||
        # for a gradient of norm 4e-40 is 2.5e39) is lowered to its largest finite value, so
        # that the contribution shrinks instead of becoming inf
        weights = torch.mul(factors, scale,
                            out=torch.empty(factors.shape, dtype=dtype, device=factors.device))
        finite = torch.finfo(dtype).max
        weights.clamp_(-finite, finite)
        _flush_subnormal(weights)
        if repeat != 1:
            weights = weights.repeat_interleave(repeat)
        memo[key] = weights
    return weights


def _factor_product(factors: torch.Tensor, scale: float) -> torch.Tensor:
    """``factors * scale`` in float64 (``factors`` itself for a scale of 1), computed once per
    (factors tensor, scale) on this thread, in the memo of :func:`_scaled_factors`: the
    weights of every bfloat16 weighted sum of a clip step (GPT-2 small: 49 a step, one tensor
    operation each otherwise)."""
    if scale == 1.0:
        return factors
    memo = _memo_of(factors)
    key = (scale, "float64 product")
    weights = memo.get(key)
    if weights is None:
        weights = memo[key] = factors * scale
    return weights


def _device_weighted_sum(rows: torch.Tensor, weights: torch.Tensor,
                         out: torch.Tensor | None = None, *, scale: float = 1.0) -> torch.Tensor:
    """sum_i scale weights[i] * rows[i] (``out +=`` it in place when given) for float32 /
    float64 rows (B, ...) on a GPU, flattened: the weights scaled and rounded once to the rows'
    dtype (:func:`_scaled_factors`, formed once per clip step for all the layers that share
    the factors, scale and dtype), then one
    (1, B) x (B, n) matrix product per block of :data:`_SUM_BLOCK_ROWS` examples, blocks summed
    in float64 (:func:`_blocked_product`), as the linear layers' clipped sums are. The fused
    CUDA kernel instead runs one thread per ten columns, serially over the batch: with few
    columns (a ResNet-18 layer's 36,864 weights per example at batch 256) too few threads to
    hide the loads' latency (its weighted sums took a third of a DP step on an H200)."""
    import torch

    batch = int(rows.shape[0])
    flat = rows.reshape(batch, -1)
    if rows.dtype == torch.float32 and _float32_operand_roundoff(rows.device):
        # TF32 (or a lowered matmul precision) would round the rows to 10-bit significands,
        # 2^-10 of a contribution that nothing bounds: float64 products then (0.04% above C
        # measured through a LayerNorm, emulated)
        flat = flat.to(torch.float64)
    row_weights = _scaled_factors(weights, scale, flat.dtype, 1).reshape(1, batch)
    if out is None:
        return _blocked_product(row_weights, flat).reshape(-1).to(rows.dtype)
    if flat.dtype != out.dtype:  # the float64 product added to out, rounded once
        total = _blocked_product(row_weights, flat).reshape(out.shape)
        return out.copy_(total.add_(out.to(torch.float64)))
    _blocked_product(row_weights, flat, base=out.view(1, -1))
    return out


def _materialises_in_bfloat16(device_type: str) -> bool:
    """Whether bfloat16 per-example gradients are materialised in bfloat16 on ``device_type``
    and summed by :func:`_bfloat16_weighted_sum` (:meth:`LinearUsage._half_per_example`):
    where torch multiplies bfloat16 matrices with float32 accumulation and result."""
    return _bmm_has_out_dtype(device_type)


def _bfloat16_weighted_sum(rows: torch.Tensor, weights: torch.Tensor, *,
                           scale: float = 1.0) -> torch.Tensor:
    """sum_i w_i rows[i], w_i = scale weights[i] in float64 (:func:`_factor_product`), in
    float32 for bfloat16 rows (B, ...) and float64 weights (B,): float64 products and sums,
    rounded once to float32, so a single example's part is
    within 2^-24 relative of c r (a tied weight's uses, each rounded once, stay within the tied
    norm's slack however they cancel).

    With the CUDA kernels built, :func:`dpsharp.torch.kernels.weighted_rows_float32`, which
    reads each bfloat16 element once (torch ran a mixed-precision product of the same shape in
    an sm75 CUTLASS kernel on an H100: GPT-2 small's weighted sums at batch 32 took 30 ms of a
    step that way). Elsewhere one float64 matrix product per block of columns (2^24 float64
    elements of widened rows at a time)."""
    import torch

    weights = _factor_product(weights, scale)
    if rows.is_cuda and kernels.cuda_built():
        return kernels.weighted_rows_float32(rows, weights)
    batch = int(rows.shape[0])
    flat = rows.reshape(batch, -1)
    wide = weights.to(device=rows.device, dtype=torch.float64).reshape(1, batch)
    out = torch.empty(flat.shape[1], dtype=torch.float32, device=rows.device)
    step = max(1, (1 << 24) // max(batch, 1))
    for lo in range(0, int(flat.shape[1]), step):
        hi = min(int(flat.shape[1]), lo + step)
        out[lo:hi] = torch.mm(wide, flat[:, lo:hi].to(torch.float64))[0]
    return out.reshape(rows.shape[1:])


def weighted_sum(rows: torch.Tensor, weights: torch.Tensor, *,
                 scale: float = 1.0) -> torch.Tensor:
    """sum_i scale weights[i] * rows[i] for rows (B, ...) and float64 weights (B,), the
    product scale weights[i] formed first in float64 (a usage passes the clip step's shared
    factors and its loss scale, so that on a GPU the scaled weights are formed once per step
    for every layer that shares them, not once per layer): on a GPU one
    matrix product (float32 / float64 rows, :func:`_device_weighted_sum`; bfloat16 rows,
    :func:`_bfloat16_weighted_sum`, in float32), elsewhere the fused kernel (float64 sums, in
    order) for the dtypes it reads, a torch reduction otherwise (float16)."""
    import torch

    rows = rows.contiguous()
    if rows.dtype == torch.bfloat16 and _materialises_in_bfloat16(rows.device.type):
        return _bfloat16_weighted_sum(rows, weights, scale=scale)
    if rows.is_cuda and rows.dtype in (torch.float32, torch.float64):
        return _device_weighted_sum(rows, weights, scale=scale).reshape(rows.shape[1:])
    if scale != 1.0:
        weights = weights * scale
    if rows.dtype in (torch.float32, torch.float64, torch.bfloat16):
        out = torch.empty(rows.shape[1:], dtype=rows.dtype, device=rows.device)
        return kernels.clip_accumulate_noise(out, per_example=rows,
                                             factors=weights.to(torch.float64).contiguous())
    # float16 (normal only above 6e-5): the products in float32, the factors rounded once to
    # it; the sum rounded once back
    wide = rows.to(torch.float32)
    return (_per_row(_flush_subnormal(weights.to(torch.float32)), wide) * wide).sum(dim=0).to(
        rows.dtype)


# Clipped sums reduce over the whole batch (B T rows of a linear layer on sequences, B L
# positions of a convolution on the Gram path) where a per-example gradient reduces over one
# example's T positions only. One float32 product over that many rows loses digits: BLAS
# accumulates a long reduction with a small output in order in float32, so its error grows with
# the length (a (K, 8)^T (K, 8) product of positive entries: 4.5e-7 relative at K = 1,024,
# 5.9e-6 at 10^5, 1.5e-4 at 10^6; oneDNN's convolution weight gradient: 8.5e-7 at 4,096
# positions, 1.3e-5 at 262,144). Longer reductions are cut into blocks of this many rows, each
# block one float32 product, the blocks summed in float64 and rounded once: blocked summation,
# whose error bound grows with the block's length, not the batch's (Higham, "Accuracy and
# Stability of Numerical Algorithms", 2nd ed. 2002, section 4.2). The bench models' layers
# (MLP: 256 rows; transformer: 64 x 64 = 4,096) stay one product.
_SUM_BLOCK_ROWS = 4096


def _blocked_product(m1: torch.Tensor, m2: torch.Tensor,
                     base: torch.Tensor | None = None, *, wide: bool = False) -> torch.Tensor:
    """``m1 @ m2`` (``base += m1 @ m2`` in place when given) for m1 (n, K), m2 (K, k): one
    matrix product when K fits a block of :data:`_SUM_BLOCK_ROWS` rows or the operands are
    float64, else one float32 product per block of K, the blocks (and ``base``) summed in
    float64 and rounded once. ``wide``: every block's product in float64 instead (the float32
    operands widened block by block, their products exact), for the clipped sums whose rows
    mix examples with cancelling positions (:func:`_wide_blocked_product`)."""
    import torch

    if wide and m1.dtype != torch.float64:
        return _wide_blocked_product(m1, m2, base)
    rows = int(m1.shape[1])
    if rows <= _SUM_BLOCK_ROWS or m1.dtype == torch.float64:
        return torch.mm(m1, m2) if base is None else base.addmm_(m1, m2)
    part = torch.empty((m1.shape[0], m2.shape[1]), dtype=m1.dtype, device=m1.device)
    total = None if base is None else base.to(torch.float64)
    for lo in range(0, rows, _SUM_BLOCK_ROWS):
        hi = min(rows, lo + _SUM_BLOCK_ROWS)
        torch.mm(m1[:, lo:hi], m2[lo:hi], out=part)
        total = part.to(torch.float64) if total is None else total.add_(part)
    assert total is not None
    if base is None:
        return total.to(m1.dtype)
    return base.copy_(total)


# Widened blocks of _wide_blocked_product hold at most this many float64 entries per operand.
_WIDE_BLOCK_ENTRIES = 1 << 24


def _wide_blocked_product(m1: torch.Tensor, m2: torch.Tensor,
                          base: torch.Tensor | None) -> torch.Tensor:
    """``m1 @ m2`` (or ``base += m1 @ m2``) accumulated in float64 over the whole reduction,
    rounded once to ``m1``'s dtype.

    A linear layer's clipped sum on sequences is one product over the B T rows of all
    examples. In float32, one example whose positions cancel (a_1 g_1^T = -a_2 g_2^T, huge)
    drives the running sums to magnitudes C / kappa, where kappa ~ T 2^-24 is its norm's
    round-off slack, and every other example's part added to them is rounded to that
    magnitude's spacing (about C / 10): one ordinary example moved the release by 1.010 C.
    In float64 that spacing is 2^-29 times smaller. Blocks of at most
    :data:`_WIDE_BLOCK_ENTRIES` entries per widened operand bound the transient memory."""
    import torch

    rows = int(m1.shape[1])
    width = max(int(m1.shape[0]), int(m2.shape[1]), 1)
    step = max(1, min(rows, _WIDE_BLOCK_ENTRIES // width))
    total = (torch.zeros((m1.shape[0], m2.shape[1]), dtype=torch.float64, device=m1.device)
             if base is None else base.to(torch.float64))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        total.addmm_(m1[:, lo:hi].to(torch.float64), m2[lo:hi].to(torch.float64))
    if base is None:
        return total.to(m1.dtype)
    return base.copy_(total)


def conv_patches(x: torch.Tensor, kernel: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...]) -> torch.Tensor:
    """Convolution patches (B, L, C * prod(kernel)) ordered like the weight's (C, k...) dims:
    the C++ kernel on the CPU; elsewhere torch's im2col for 2-D kernels (``F.unfold``, whose
    (B, C * prod(kernel), L) result is returned as a transposed view: the matrix products that
    read the patches take either layout), strided views and one copy for 1-D ones."""
    if x.device.type == "cpu":
        return kernels.conv_patches(x, kernel, stride, padding, dilation)
    return _device_conv_patches(x, kernel, stride, padding, dilation)


def _device_conv_patches(x: torch.Tensor, kernel: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[int, ...], dilation: tuple[int, ...]) -> torch.Tensor:
    """:func:`conv_patches` off the CPU (any device; the tests run it on the CPU too). For 2-D
    kernels ``F.unfold`` of the batch as one image of B C channels: one im2col pass, where the
    strided view below costs a permuted gather copy (a ResNet-18 step's patches took 10 ms of
    its 66 ms on an H200 that way)."""
    import torch.nn.functional as F

    if len(kernel) == 2:
        # The batch folded into the channels: torch's im2col launches one kernel per example
        # of its input (10,240 launches per ResNet-18 step at batch 256), one here.
        batch, channels = int(x.shape[0]), int(x.shape[1])
        cols = F.unfold(x.reshape(1, batch * channels, *x.shape[2:]), kernel,
                        dilation=dilation, padding=padding, stride=stride)
        return cols.reshape(batch, channels * math.prod(kernel), -1).transpose(1, 2)
    pad: list[int] = []
    for p_ in reversed(padding):
        pad += [p_, p_]
    view = F.pad(x, pad) if any(padding) else x
    spatial = len(kernel)
    for dim_offset in range(spatial):
        k, st, dl = kernel[dim_offset], stride[dim_offset], dilation[dim_offset]
        view = view.unfold(2 + dim_offset, (k - 1) * dl + 1, st)
        if dl > 1:
            view = view[..., ::dl]
    # view: (B, C, out_1..out_s, k_1..k_s) -> (B, out..., C, k...)
    b, c = x.shape[0], x.shape[1]
    out_dims = list(range(2, 2 + spatial))
    k_dims = list(range(2 + spatial, 2 + 2 * spatial))
    view = view.permute(0, *out_dims, 1, *k_dims)
    positions = math.prod(view.shape[1:1 + spatial])
    return view.reshape(b, positions, c * math.prod(kernel))


class Usage:
    """Base class: one call of one layer, after its backward."""

    batch_size: int
    scale: float = 1.0

    def params(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        return kernels.per_example_sq_norms(self.per_example(p).contiguous())

    def sq_norm_and_slack(self, p: torch.nn.Parameter
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(||g_i(p)||^2, e_i): the per-example squared norm of the gradient and a bound e_i
        (float64 (B,), None for 0) on ||fl(S) - c_i g_i(p)|| / c_i, the round-off with which
        :meth:`clipped_sum` forms example i's part c_i g_i(p) of its sum S (one example in the
        batch). :meth:`sq_norm` is (||g_i(p)|| + e_i)^2, so a clip factor taken from it keeps
        the contribution that is actually summed within the bound. 0 here: the base class sums
        the very per-example gradients whose norm it reports."""
        return self.sq_norm(p), None

    def flat_sq_norm_term(self, params: list[torch.nn.Parameter]) -> kernels.SqNormTerm:
        """sum_p ||g_i(p)||^2 over ``params`` (some of this usage's parameters) as a term
        ``(x, y, y_offset, coef)`` of :func:`dpsharp.torch.kernels.flat_clip_factors`
        (``coef * x * (y + y_offset)``, x and y float64 (B,)): what flat clipping needs of the
        usage. Here the plain sum (y None, coef 1)."""
        total = self.sq_norm(params[0])
        for p in params[1:]:
            total = total + self.sq_norm(p)
        return total, None, 0.0, 1.0

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        raise NotImplementedError

    def row_terms(self, params: list[torch.nn.Parameter]) -> list[RowTerm] | None:
        """For every parameter of ``params``, its per-example gradients as stored rows, where
        the usage's norm and clipped sum of each are exactly those of the rows (no slack):
        ``||g_i(p)||^2 = s2 ||rows[i]||^2`` and ``clipped_sum(p, c) = finish(sum_i c_i scale
        rows[i])``. The clipper then measures and sums the rows of all such usages of a step at
        once (:func:`dpsharp.torch.kernels.per_example_sq_norms_many`,
        :func:`dpsharp.torch.kernels.weighted_rows_float32_many`). None where any of them is
        formed otherwise (here: always)."""
        return None

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        return weighted_sum(self.per_example(p), factors)

    def add_clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor,
                        out: torch.Tensor) -> None:
        """``out += clipped_sum(p, factors)`` in place (``out`` shaped like ``p``)."""
        contribution = self.clipped_sum(p, factors)
        out.add_(contribution.reshape(out.shape).to(out.dtype))


class _WeightBiasUsage(Usage):
    """A layer with a weight and an optional bias whose per-example gradients are ``scale``
    times ``_weight_per_example()`` (B rows, reshaped to the weight) and
    ``_bias_per_example()``."""

    bias: torch.nn.Parameter | None

    def _weight_per_example(self) -> torch.Tensor:
        raise NotImplementedError

    def _bias_per_example(self) -> torch.Tensor:
        raise NotImplementedError

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        if p is self.bias:
            return self._bias_per_example() * self.scale
        # bfloat16 gradients (LinearUsage._half_per_example) are widened before scaling
        return _wide(self._weight_per_example()).reshape((self.batch_size, *p.shape)) * self.scale


class LinearUsage(_WeightBiasUsage):
    """y = x W^T + b with x of shape (B, T, d), gy of shape (B, T, p) (T = 1 for 2-D inputs);
    the per-example gradients are ``scale`` times those of the stored tensors.

    ``weight`` / ``bias`` are the parameters (None when frozen).
    """

    def __init__(self, weight: torch.nn.Parameter | None, bias: torch.nn.Parameter | None,
                 activations: torch.Tensor, out_grads: torch.Tensor, scale: float = 1.0, *,
                 input_sq: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.a = activations
        self.g = out_grads
        self.scale = float(scale)
        self.batch_size = int(activations.shape[0])
        self.positions = int(activations.shape[1])  # T (kept when a and g are dropped)
        # unscaled per-example weight gradients in the weight's layout ((B, p, d) here), maybe
        # a transposed view of _per_example_base, the contiguous tensor bmm formed
        self._per_example_weight: torch.Tensor | None = None
        self._per_example_base: torch.Tensor | None = None
        self._per_example_transposed = False  # _per_example_weight is a transposed view
        self._per_example_width = 0  # the unpadded row length of _per_example_base
        self._bias_rows: torch.Tensor | None = None  # unscaled sum_t gy_t, (B, p)
        self._g_sq: torch.Tensor | None = None  # T = 1: ||gy_i||^2 (float64)
        # T = 1: ||a_i||^2 (float64), when the layer's forward already took it
        self._a_sq = input_sq if activations.shape[1] == 1 else None
        # T > 1 on the CPU Gram path: the weight's unscaled squared norms from the fused kernel
        self._sequence_sq: torch.Tensor | None = None
        # sum_t ||a_t|| ||g_t|| and the rows' squared norms (B, T): see _position_products
        self._products: torch.Tensor | None = None
        self._row_sq: tuple[torch.Tensor, torch.Tensor] | None = None
        self._matrices: tuple[torch.Tensor, torch.Tensor] | None = None  # see _rows2d

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    @staticmethod
    def merge(usages: list[LinearUsage]) -> LinearUsage:
        """Several calls of one layer in one backward = one call on the concatenated sequence
        (g_i(W) is a sum over positions, so the per-example gradient is summed, not stacked)."""
        import torch

        first = usages[0]
        if any(u.a is None for u in usages):
            return LinearUsage._merge_materialised(usages)
        return type(first)(first.weight, first.bias, torch.cat([u.a for u in usages], dim=1),
                           torch.cat([u.g for u in usages], dim=1), first.scale)

    @staticmethod
    def _merge_materialised(usages: list[LinearUsage]) -> LinearUsage:
        """:meth:`merge` where some calls materialised their per-example gradients already and
        dropped their stored tensors (:meth:`materialise_early`): every call's per-example
        gradients (and bias rows) materialised, and summed. The merged usage's norms and
        clipped sums read these sums, so what is summed is what is measured, as for one
        materialised call."""
        import copy

        for u in usages:
            if u.scale != usages[0].scale:
                raise ValueError("calls of one layer with different loss scales in one pass")
            u._weight_per_example()
            if u.bias is not None:
                u._bias_per_example()
        first = usages[0]
        merged = copy.copy(first)
        base = first._per_example_base
        assert base is not None
        total = base.clone()
        for u in usages[1:]:
            assert u._per_example_base is not None
            total.add_(u._per_example_base)
        merged._per_example_base = total
        rows = total[:, :, :first._per_example_width] if (
            total.shape[2] != first._per_example_width) else total
        merged._per_example_weight = rows.transpose(1, 2) if first._per_example_transposed \
            else rows
        if first.bias is not None:
            bias_rows = first._bias_per_example().clone()
            for u in usages[1:]:
                bias_rows.add_(u._bias_per_example())
            merged._bias_rows = bias_rows
        merged.positions = sum(u.positions for u in usages)
        merged.a = merged.g = None  # type: ignore[assignment]
        merged._matrices = None
        merged._sequence_sq = merged._products = merged._row_sq = None
        merged._g_sq = merged._a_sq = None
        return merged

    def _materialise_weight(self) -> bool:
        """Materialise g_i(W) (p x d per example) or take the Gram path (T > 1 only).

        Both paths make one product of T d p multiply-adds per example (the materialised
        gradients by a batched matmul, or the clipped sum by one large matmul). On top of that
        the Gram path computes the norms from the pairs t <= s, ~ T^2 (d + p) / 2 multiply-adds
        (on the CPU in the fused kernel), and the materialised path writes, squares and re-reads
        p d elements per example. On the CPU (bench/bench_norm_kernels.py, "cost rule": norms
        plus clipped sums of weight and bias at 1 thread, (d, p) from (32, 512) to (512, 128),
        T from 8 to 256) the two break even at T^2 (d + p) / 2 = 12 to 24 times d p since the
        kernel accumulates its Gram entries in float64 (25 to 50 times with the float32
        accumulation it had before, which was unsound where positions cancel). Materialising
        also keeps B d p elements per layer until the clip factors are known: at the break-even
        the bench GPT-2 (bench/bench_transformers.py) took 1.52x the non-private step's peak
        memory, against 1.16x with the rule at 40. So materialise when
        T^2 (d + p) / 2 > 40 d p, trading up to 1.8x on such a layer's norm and clipped sum for
        the memory. (Since the Gram route's float32 clipped sum accumulates across examples in
        float64, :meth:`_per_example_product_sum`, the trade is larger: materialising the
        bench encoder's feed-forward layers, rule 20, took 1.13x against 1.35x the
        non-private step's time, one process, 1 thread, and 1.5x-1.7x its peak memory.)
        Elsewhere (other devices, or a CPU without AVX2) the Gram norms are two batched
        float64 matmuls over all T^2 pairs, and the old rule d p <= T (d + p) stays.
        """
        _, seq, d = self.a.shape
        p = self.g.shape[2]
        if seq <= 1:
            return False
        if self._fused_sequence_norms():
            return seq * seq * (d + p) > 2 * _GRAM_PER_MATERIALISED * d * p
        if self._half_per_example():
            return d * p <= _HALF_MATERIALISED_PER_STORED * seq * (d + p)
        return seq * d * p <= seq * seq * (d + p)

    def _half_per_example(self) -> bool:
        """Whether materialised per-example weight gradients are formed and kept in bfloat16:
        bfloat16 stored tensors (autocast) on a device whose torch multiplies them with float32
        accumulation (GPUs).

        Such a gradient is one tensor-core product per example, rounded once to bfloat16, the
        precision autocast gives the layer's ordinary weight gradient. Soundness needs no
        round-off bound here: the norm is measured on the stored values (float64 sums of their
        squares) and the clipped sum reads the same values (:func:`_bfloat16_weighted_sum`:
        float64 sums rounded once to float32), so what is summed is what was measured. The
        Gram path instead needs float64 Grams and a split product, each with its bound (GPT-2
        small under bf16 autocast on an H200: 0.33x of the non-private step's throughput that
        way). The rule trades memory for it: bfloat16 gradients up to
        :data:`_HALF_MATERIALISED_PER_STORED` times the example's stored input and output
        gradient."""
        import torch

        return (self.a.dtype == torch.bfloat16 and self.g.dtype == torch.bfloat16
                and _materialises_in_bfloat16(self.g.device.type))

    def _fused_sequence_norms(self) -> bool:
        """Whether the Gram-path norms come from the fused CPU kernel (a CPU tensor and a
        vectorised build of the kernel for this CPU)."""
        return self.a.device.type == "cpu" and _vectorised_linear_norms()

    def _sequence_norms(self) -> torch.Tensor:
        """Unscaled weight squared norms for T > 1 from one call of the fused kernel
        (:func:`dpsharp.torch.kernels.linear_sequence_sq_norms`)."""
        if self._sequence_sq is None:
            self._sequence_sq = kernels.linear_sequence_sq_norms(
                _wide(self.a), _wide(self.g), bias=False)[0]
        return self._sequence_sq

    # The weight's layout: (p, d) for nn.Linear, (d, p) for a transposed weight (Conv1D).
    _weight_is_pd = True

    def _weight_per_example(self, arena: Arena | None = None) -> torch.Tensor:
        """g_i(W) for every example (unscaled), in the weight's layout (maybe a view), formed
        in ``arena`` (default: this thread's, :func:`arena_empty`).

        bmm forms either G_i^T A_i, (p, d), or its transpose A_i^T G_i, (d, p), whichever has
        the longer rows: a product with short rows runs up to 10x slower on the CPU (a LoRA
        adapter's up-projection, d = 8 -> p = 1024 on 128 positions, batch 8: 4.4 ms as
        (p, d), 0.44 ms as (d, p), 1 thread). The contiguous product is
        :attr:`_per_example_base`; norms and clipped sums read it in its own layout.

        bfloat16 gradients (:meth:`_half_per_example`) whose rows are not a multiple of 8
        elements long are formed with their rows zero-padded to one (the operand that gives the
        rows padded likewise), a view of them returned: torch multiplies misaligned bfloat16
        matrices with slower kernels (GPT-2's 50,257-wide head on an H100 and an H200: sm75
        CUTLASS kernels). The zero columns change neither norms nor sums."""
        import torch
        import torch.nn.functional as F

        if self._per_example_weight is None:
            g, a = self.g, self.a
            b, d, p = g.shape[0], a.shape[2], g.shape[2]
            half = self._half_per_example()  # bfloat16 gradients, see _half_per_example
            # otherwise half-precision operands give float32 gradients
            dtype = g.dtype if half else _wide(g[:0]).dtype
            product = torch.bmm if half else _wide_bmm
            width = max(d, p)  # the product's rows
            pad = -width % 8 if half else 0
            if d >= p:
                out = (arena.empty if arena is not None else arena_empty)(
                    (b, p, d + pad), dtype, g.device)
                base = product(g.transpose(1, 2), F.pad(a, (0, pad)) if pad else a, out=out)
            else:
                out = (arena.empty if arena is not None else arena_empty)(
                    (b, d, p + pad), dtype, g.device)
                base = product(a.transpose(1, 2), F.pad(g, (0, pad)) if pad else g, out=out)
            self._per_example_base = base
            self._per_example_width = width
            rows = base[:, :, :width] if pad else base
            self._per_example_transposed = (d >= p) != self._weight_is_pd
            self._per_example_weight = (rows.transpose(1, 2) if self._per_example_transposed
                                        else rows)
        return self._per_example_weight

    def _materialised_clipped_sum(self, p: torch.nn.Parameter,
                                  factors: torch.Tensor) -> torch.Tensor:
        """sum_i scale factors[i] g_i(W) from the materialised gradients, contiguous, p's
        shape."""
        base = self._per_example_base
        assert base is not None and self._per_example_weight is not None
        return self._materialised_result(weighted_sum(base, factors, scale=self.scale), p)

    def _materialised_result(self, total: torch.Tensor, p: torch.nn.Parameter) -> torch.Tensor:
        """The weight's clipped sum, contiguous, in p's shape, from ``total``, a sum over the
        materialised gradients in their stored layout (:attr:`_per_example_base`, rows maybe
        padded)."""
        if total.shape[-1] != self._per_example_width:  # rows padded (_weight_per_example)
            total = total[:, :self._per_example_width]
        if self._per_example_transposed:
            total = total.t()
        return total.contiguous().reshape(p.shape)

    def row_terms(self, params: list[torch.nn.Parameter]) -> list[RowTerm] | None:
        """Stored rows (:meth:`Usage.row_terms`) where the layer runs on sequences (T > 1)
        and its weight's per-example gradients are materialised (now, where the cost rule picks
        them, as :meth:`sq_norm_and_slack` would): the weight's are those gradients in their
        stored layout, the bias's the per-example sums sum_t g_t; both are what this usage's
        own norms and clipped sums read."""
        if self.positions <= 1:
            return None
        needs_weight = any(p is self.weight for p in params)
        if needs_weight and self._per_example_weight is None and not self._materialise_weight():
            return None
        s2 = self.scale * self.scale
        terms = []
        for p in params:
            if p is self.bias:
                rows = self._bias_per_example()
                finish: Callable[[Any], Any] = functools.partial(_reshaped, shape=p.shape)
            else:
                self._weight_per_example()
                rows = self._per_example_base
                finish = functools.partial(self._materialised_result, p=p)
            if rows is None or not _stored_rows(rows):
                return None
            terms.append(RowTerm(p, rows, s2, self.scale, finish))
        return terms

    def _bias_per_example(self) -> torch.Tensor:
        if self._bias_rows is None:  # summed over positions in float32 at least
            self._bias_rows = (_wide(self.g[:, 0]) if self.g.shape[1] == 1
                               else _wide_sum(self.g, dim=1))
        return self._bias_rows

    def out_grad_sq(self) -> torch.Tensor:
        """T = 1: ||gy_i||^2 in float64 (computed once)."""
        if self._g_sq is None:
            self._g_sq = kernels.per_example_sq_norms(self.g[:, 0])
        return self._g_sq

    def _input_sq(self) -> torch.Tensor:
        if self._a_sq is None:
            self._a_sq = kernels.per_example_sq_norms(self.a[:, 0])
        return self._a_sq

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        return _raised(*self.sq_norm_and_slack(p))

    def sq_norm_and_slack(self, p: torch.nn.Parameter
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The squared norm and the clipped sum's round-off bound (see
        :meth:`Usage.sq_norm_and_slack`).

        The bias's clipped sum and norm both read the per-example rows sum_t g_t, and a
        materialised weight's both read the stored per-example gradients, so those sum what
        they measure (slack None). On the Gram path the norm is the ghost norm (float64
        Grams, close to exact) while the clipped sum is one float32 matrix product over all
        positions, whose part for example i errs by up to
        kappa_T sum_t ||g_t|| ||a_t|| (:func:`product_roundoff_factor`): where an example's
        positions cancel, sum_t ||g_t|| ||a_t|| is many times ||g_i(W)||, and an unprotected
        clip factor let a constructed 16-position example contribute 1.0000033 C. That bound is
        the slack. With one position the product has a single term per example, so its
        rounding (at most 3 units of the last place) stays within the clipping's
        1 + 1e-6 tolerance, and the slack is kept only where a lowered float32 matmul
        precision (TF32, bfloat16) rounds the operands. The Gram path's norm itself is raised
        by its float64 Grams' round-off bound (:func:`gram_roundoff_factor`): without it,
        positions that cancel exactly in float64 (a 262,144-feature layer, two positions) gave
        a norm of 0 and a contribution of 2 C."""
        s2 = self.scale * self.scale
        if p is self.bias:
            if self.positions == 1:
                return self.out_grad_sq() * s2, None
            return kernels.per_example_sq_norms(self._bias_per_example()) * s2, None
        positions = self.positions
        # materialised (by the rule below, or by tied_sq_norm): the norm of the stored values,
        # which the clipped sum reads (the norm does not see the layout)
        if self._per_example_weight is not None or (positions > 1 and self._materialise_weight()):
            self._weight_per_example()
            return kernels.per_example_sq_norms(self._per_example_base) * s2, None
        if positions == 1:  # ||a_i g_i^T||_F^2 = ||a_i||^2 ||g_i||^2
            sq = self._input_sq() * self.out_grad_sq() * s2
            if self._product_kappa() <= 2.0**-21:
                return sq, None
            return sq, sq.sqrt() * self._product_kappa()
        if self._fused_sequence_norms():
            sq = self._sequence_norms()
        else:
            gram_a = _gram_bmm(self.a, self.a.transpose(1, 2))
            gram_g = _gram_bmm(self.g, self.g.transpose(1, 2))
            sq = kernels.per_example_dots(gram_a, gram_g)
        products = self._position_products()
        # the float64 Grams' own round-off, raised onto the norm (gram_roundoff_factor)
        gram_kappa = gram_roundoff_factor(int(self.a.shape[2]), int(self.g.shape[2]),
                                          positions)
        sq = (sq + gram_kappa * products.square()) * s2
        return sq, products * (self._product_kappa() * abs(self.scale))

    def _product_kappa(self) -> float:
        """:func:`product_roundoff_factor` of the clipped sum's matrix product for one
        example (T terms: its positions; at most a block of :data:`_SUM_BLOCK_ROWS`), or
        :func:`split_product_roundoff_factor` where the clipped sum takes the split bfloat16
        route (:meth:`_split_bf16_route`)."""
        terms = min(int(self.a.shape[1]), _SUM_BLOCK_ROWS)
        if self._split_bf16_route():
            return split_product_roundoff_factor(terms)
        return product_roundoff_factor(terms, _wide(self.g[:0]).dtype, self.g.device)

    def _split_bf16_route(self) -> bool:
        """Whether the weight's clipped sum is formed on the tensor cores from a split
        bfloat16 operand (:meth:`_split_bf16_clipped_sum`): bfloat16 stored tensors (autocast)
        on a device whose torch multiplies them with float32 accumulation, and the weight not
        materialised."""
        import torch

        return (self.a.dtype == torch.bfloat16 and self.g.dtype == torch.bfloat16
                and _bmm_has_out_dtype(self.g.device.type)
                and self._per_example_weight is None and not self._materialise_weight())

    def _split_bf16_clipped_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """sum_i c_i g_i(W) in float32, the weight's layout, from bfloat16 stored tensors at the
        tensor-core rate.

        The clip-scaled output gradients y_t = scale c_i g_t (float32) are split into two
        bfloat16 parts, hi = bf16(y) and lo = bf16(y - hi), so that |y - hi - lo| <= 2^-16 |y|
        (8-bit significands; bfloat16 has float32's exponent range, so nothing overflows or
        underflows that float32 would not); sum_t (hi_t + lo_t) a_t^T is then two
        ``torch.bmm(..., out_dtype=torch.float32)`` products (exact products, float32
        accumulation), per block of :data:`_SUM_BLOCK_ROWS` positions, the blocks summed in
        float64. A single bfloat16 operand would err by 2^-9 relative (0.35% of C measured);
        float32 copies of the operands run off the tensor cores (GPT-2 under bf16 autocast on
        an H200: 253 examples/s that way, 270 with the split). The bound is
        :func:`split_product_roundoff_factor`."""
        import torch

        g, a = self._rows2d()  # (B T, p), (B T, d), bfloat16
        factors = self._capped_factors(factors, activations=False)
        weights = _scaled_factors(factors, self.scale, torch.float32, int(self.g.shape[1]))
        rows = int(g.shape[0])
        total: torch.Tensor | None = None
        for lo_row in range(0, max(rows, 1), _SUM_BLOCK_ROWS):
            hi_row = min(rows, lo_row + _SUM_BLOCK_ROWS)
            scaled = g[lo_row:hi_row].float() * weights[lo_row:hi_row, None]
            high = scaled.to(torch.bfloat16)
            low = (scaled - high.float()).to(torch.bfloat16)
            block_a = a[lo_row:hi_row].unsqueeze(0)
            part = (torch.bmm(high.t().unsqueeze(0), block_a, out_dtype=torch.float32)[0]
                    + torch.bmm(low.t().unsqueeze(0), block_a, out_dtype=torch.float32)[0])
            if rows <= _SUM_BLOCK_ROWS:
                total = part
                break
            total = part.double() if total is None else total.add_(part)
        assert total is not None
        total = total.float()  # (p, d)
        return total if self._weight_is_pd else total.t()

    def _position_products(self) -> torch.Tensor:
        """sum_t ||a_t|| ||g_t|| per example, float64 (B,), unscaled: the row norms in float64
        (:func:`dpsharp.torch.kernels.per_example_sq_norms` of the rows), their products summed
        in float64 and raised by 1e-12 relative to cover that arithmetic's own rounding (a
        bound only needs to be above the sum)."""
        if self._products is None:
            batch, positions = int(self.a.shape[0]), int(self.a.shape[1])
            rows = batch * positions
            a_sq = kernels.per_example_sq_norms(
                self.a.reshape(rows, self.a.shape[2]).contiguous()).reshape(batch, positions)
            g_sq = kernels.per_example_sq_norms(
                self.g.reshape(rows, self.g.shape[2]).contiguous()).reshape(batch, positions)
            self._row_sq = (a_sq, g_sq)
            self._products = (a_sq * g_sq).sqrt().sum(dim=1) * (1.0 + 1e-12)
        return self._products

    def _capped_factors(self, factors: torch.Tensor, *, activations: bool) -> torch.Tensor:
        """:func:`_overflow_capped_factors` for a clipped sum that scales the stored activations
        (``activations``) or output gradients, their entries bounded by the largest row norm."""
        products = self._position_products()
        assert self._row_sq is not None
        rows_sq = self._row_sq[0 if activations else 1]
        return _overflow_capped_factors(factors, self.scale, _wide(self.g[:0]).dtype,
                                        rows_sq.amax(dim=1).sqrt(), products)

    def flat_sq_norm_term(self, params: list[torch.nn.Parameter]) -> kernels.SqNormTerm:
        if self.positions == 1 and (all(q is not self.weight for q in params)
                                     or self._product_kappa() <= 2.0**-21):
            # One position per example: ||g_i(W)||^2 = ||gy_i||^2 ||a_i||^2 and
            # ||g_i(b)||^2 = ||gy_i||^2, so the term needs only the two vectors of norms (where
            # the weight's clipped sum needs no slack, see sq_norm_and_slack).
            s2 = self.scale * self.scale
            if len(params) == 2:
                return self.out_grad_sq(), self._input_sq(), 1.0, s2
            if params[0] is self.weight:
                return self.out_grad_sq(), self._input_sq(), 0.0, s2
            return self.out_grad_sq(), None, 0.0, s2
        return super().flat_sq_norm_term(params)

    def _clipped_product(self, p: torch.nn.Parameter,
                         factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """For the weight: (m1, m2) with sum_i c_i g_i(W) = m1 @ m2, the clipped sum as one
        matrix product of the stored tensors, one of them scaled per example; None where the
        clipped sum is formed otherwise (materialised per-example gradients)."""
        if self._per_example_weight is not None:
            return None
        g, a = self._rows2d()
        scale_a = a.shape[1] < g.shape[1]  # scale the smaller of the two stored tensors
        weights = self._row_weights(self._capped_factors(factors, activations=scale_a))
        if scale_a:
            return g.t(), _scaled_rows(a, weights)
        return _scaled_rows(g, weights).t(), a

    def _mixes_cancelling_rows(self) -> bool:
        """Whether the weight's clipped sum, one product over all examples' rows, must
        accumulate in float64 (:func:`_wide_blocked_product`): when an example has more than
        one position, whose products may cancel. With one position per example each row is
        the example's whole (rank-one) gradient, whose clipped part is at most C."""
        return int(self.a.shape[1]) > 1

    def _rows2d(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(G, A): the output gradients (B T, p) and activations (B T, d) as matrices (views)."""
        if self._matrices is None:
            self._matrices = (self.g.reshape(-1, self.g.shape[2]),
                              self.a.reshape(-1, self.a.shape[2]))
        return self._matrices

    def _row_weights(self, factors: torch.Tensor) -> torch.Tensor:
        """scale * factors[i] for every row of :meth:`_rows2d` (each example's factor repeated
        over its positions), in the stored tensors' dtype (see :func:`_scaled_factors`)."""
        return _scaled_factors(factors, self.scale, self.g.dtype, int(self.g.shape[1]))

    def release_stored(self) -> None:
        """Drop the stored input and output gradient once the weight's per-example gradients
        are materialised in bfloat16 (:meth:`_half_per_example`) and the bias's rows formed:
        the norms and clipped sums read only those from then on, and every layer's stored
        tensors held to the end of the clip step added their size to its peak memory. The
        clipper calls it once the usage's norms are taken and no other usage shares its
        parameters. Anything else is left as it is."""
        if self._per_example_weight is None or self.a is None or not self._half_per_example():
            return
        if self.bias is not None:
            self._bias_per_example()
        self.a = self.g = None  # type: ignore[assignment]
        self._matrices = None

    def materialise_early(self, arena: Arena) -> bool:
        """Materialise the weight's per-example gradients now, in the backward pass, where the
        cost rule (:meth:`_materialise_weight`) picks them anyway, form the bias's rows, and
        drop the stored input and output gradient; True if it did.

        Only float32 / float64 stored tensors on the CPU, sequences (T > 1) and a trainable
        weight. The gradients and rows are exactly those the clip step would form at the end
        of the backward pass (the same products of the same tensors), and from then on its
        norms and clipped sums read only them. What changes is the memory: the input and
        output gradient (T (d + p) elements per example) are freed here instead of at the end
        of the clip step, while the rest of the backward pass runs (the attention
        projections of the encoder in bench/bench_transformers.py: 6 MiB per layer; its peak
        memory in training fell from 100 to 88 MiB, median of 5 runs of each, alternating).
        ``arena`` holds the gradients until its owner's next pass. The caller must know that
        no other usage of the pass reads this one's stored tensors (a tied weight's cross terms
        do); several calls of one layer are merged from the materialised gradients
        (:meth:`merge`)."""
        import torch

        if (self.weight is None or self.a is None or self.positions <= 1
                or self.a.device.type != "cpu" or self._per_example_weight is not None
                or self.a.dtype not in (torch.float32, torch.float64)
                or self.g.dtype != self.a.dtype or not self._materialise_weight()):
            return False
        self._weight_per_example(arena)
        if self.bias is not None:
            self._bias_per_example()
        self.a = self.g = None  # type: ignore[assignment]
        self._matrices = None
        return True

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        import torch

        if p is self.bias:
            # the per-example bias gradients sum_t g_it (B rows, float32 at least) against the
            # float64 factors, summed over the batch in float64 (not a float32 matrix-vector
            # product over all B T positions; see _SUM_BLOCK_ROWS)
            return weighted_sum(self._bias_per_example(), factors, scale=self.scale)
        if self._per_example_weight is not None:
            return self._materialised_clipped_sum(p, factors)
        if self.g.dtype in (torch.float32, torch.float64):
            summed = self._per_example_product_sum(factors)
            if summed is not None:
                return summed.to(self.g.dtype).reshape(p.shape)
            product = self._clipped_product(p, factors)
            assert product is not None
            return _blocked_product(*product, wide=self._mixes_cancelling_rows()).reshape(
                p.shape)
        # float16 / bfloat16 stored tensors (autocast): the float32 arithmetic above on widened
        # copies. A clip factor, or an operand scaled by it, rounded to half precision would
        # leave a clipped contribution up to 2^-9 above its bound (0.35% measured under bf16
        # autocast), and a half-precision product rounds its result the same way.
        if self._split_bf16_route():
            return self._split_bf16_clipped_sum(factors).reshape(p.shape)
        widened = type(self)(self.weight, self.bias, _wide(self.a), _wide(self.g), self.scale)
        return widened.clipped_sum(p, factors)

    def add_clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor,
                        out: torch.Tensor) -> None:
        """``out += clipped_sum(p, factors)``: the weight's matrix product (and the
        bias's matrix-vector product) accumulate into ``out`` directly, no intermediate."""
        import torch

        if (self.g is not None and self.g.dtype == out.dtype and out.is_contiguous()
                and out.dtype in (torch.float32, torch.float64)):
            if p is self.bias:
                rows = self._bias_per_example().contiguous()
                if rows.is_cuda:
                    _device_weighted_sum(rows, factors, out=out, scale=self.scale)
                    return
                kernels.clip_accumulate_noise(out, per_example=rows,
                                              factors=(factors * self.scale).contiguous(),
                                              base=out)
                return
            summed = self._per_example_product_sum(factors, base=out)
            if summed is not None and summed.shape == out.shape:
                out.copy_(summed)
                return
            product = self._clipped_product(p, factors)
            if product is not None and out.dim() == 2:
                _blocked_product(*product, base=out, wide=self._mixes_cancelling_rows())
                return
        super().add_clipped_sum(p, factors, out)

    def _per_example_product_sum(self, factors: torch.Tensor,
                                 base: torch.Tensor | None = None) -> torch.Tensor | None:
        """The weight's clipped sum on the Gram route (``base`` + sum_i scale c_i g_i(W)),
        float64 in the weight's layout, from one float32 product per example; None where this
        route does not apply (the caller then takes the float64 product over all rows).

        Each example's g_i(W) = G_i^T A_i is formed by its own float32 product of T terms per
        entry, a chunk of examples at a time in a scratch buffer (no per-example gradient is
        kept), and added with its weight into the float64 total
        (:func:`dpsharp.torch.kernels.clip_accumulate_noise`, float32 rows into a float64
        sum). So no example's positions share a float32 running sum or a rounding with
        another example's: the cancelling example of :func:`_wide_blocked_product` only rounds its
        own part, by at most gamma_{T+3} sum_t ||a_t|| ||g_t|| (Higham 2002, section 3.1),
        the slack its norm carries already (:meth:`sq_norm_and_slack`,
        :func:`product_roundoff_factor` of T terms). The products are the non-private
        weight gradient's multiply-adds in float32, where the float64 product over all rows
        cost 2-3x that (the bench encoder's feed-forward layers at 1 thread). CPU, float32
        stored tensors, 1 < T <= :data:`_SUM_BLOCK_ROWS` (the slack's terms), and per-example
        gradients whose entries stay far inside float32's range (sum_t ||a_t|| ||g_t|| below
        1e37); factors capped as the matrix product's are (:meth:`_capped_factors`)."""
        import torch

        a, g = self.a, self.g
        if (a is None or a.device.type != "cpu" or a.dtype != torch.float32
                or g.dtype != torch.float32 or not 1 < self.positions <= _SUM_BLOCK_ROWS
                or int(a.shape[0]) == 0):
            return None
        products = self._position_products()
        if not bool(products.max() < 1e37):
            return None
        weights = (self._capped_factors(factors, activations=False) * self.scale).to(
            torch.float64).contiguous()
        b, d, p = int(a.shape[0]), int(a.shape[2]), int(g.shape[2])
        shape = (p, d) if self._weight_is_pd else (d, p)
        total = (torch.zeros(shape, dtype=torch.float64) if base is None
                 else base.reshape(shape).to(torch.float64))
        n = max(1, min(b, _PRODUCT_CHUNK_ELEMENTS // max(d * p, 1)))
        chunk = torch.empty((n, *shape), dtype=torch.float32)
        for lo in range(0, b, n):
            hi = min(b, lo + n)
            out = chunk[:hi - lo]
            if self._weight_is_pd:
                torch.bmm(g[lo:hi].transpose(1, 2), a[lo:hi], out=out)
            else:
                torch.bmm(a[lo:hi].transpose(1, 2), g[lo:hi], out=out)
            # the chunk's float32 products added into the float64 total, example by example
            kernels.clip_accumulate_noise(total, per_example=out, factors=weights[lo:hi],
                                          base=total)
        return total


class ConvUsage(_WeightBiasUsage):
    """A convolution (groups = 1, zero padding): the input x (B, C, *spatial) and the output
    gradient (B, O, L) over the L output positions. The weight's per-example gradient is the
    linear-layer one over the patches P_i (L x d, d = C * prod(kernel)): g_i(W) = G_i P_i. The
    patches of the batch are never kept. Where the per-example gradients are small enough
    (see :meth:`_materialise_weight`) they are made and kept (on the CPU by the fused kernel
    :func:`dpsharp.torch.kernels.conv_per_example_weight_grads`, one example's patches at a
    time; elsewhere from patches per chunk of examples), else the Gram norm is used, with
    patches per chunk of examples, and the clipped sum sum_i c_i G_i P_i is one convolution
    weight gradient."""

    def __init__(self, module: Any, weight: torch.nn.Parameter | None,
                 bias: torch.nn.Parameter | None, inputs: torch.Tensor,
                 out_grads: torch.Tensor, scale: float = 1.0) -> None:
        self.weight = weight
        self.bias = bias
        self.x = inputs
        self._out_grad_shape = tuple(out_grads.shape)  # (B, O, *spatial)
        self.g = out_grads.reshape(out_grads.shape[0], out_grads.shape[1],
                                   math.prod(out_grads.shape[2:]))  # (B, O, L)
        self.scale = float(scale)
        self.batch_size = int(inputs.shape[0])
        kernel = tuple(module.kernel_size)
        self._geometry = (kernel, tuple(module.stride), tuple(module.padding),
                          tuple(module.dilation))
        self._row = int(inputs.shape[1]) * math.prod(kernel)  # d = C * prod(kernel)
        self._bias_rows: torch.Tensor | None = None
        self._per_example_weight: torch.Tensor | None = None  # unscaled (B, O, d)
        # sum_l ||g_l|| ||P_l|| and the largest ||g_l|| per example: see _position_products
        self._products: torch.Tensor | None = None
        self._largest_out_grad: torch.Tensor | None = None

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    def _patches(self, lo: int, hi: int) -> torch.Tensor:
        """Patches of examples lo..hi in the input's dtype (half precision stays half: the
        products below widen it, see :func:`_wide_bmm`)."""
        return conv_patches(self.x[lo:hi], *self._geometry)

    def _fused_kernel(self) -> bool:
        """Whether the per-example weight gradients come from the fused C++ kernel (CPU)."""
        return self.x.device.type == "cpu"

    def _materialise_weight(self) -> bool:
        """Materialise g_i(W) (O x d per example) or take the Gram path.

        Compute: materialising costs L O d multiply-adds for the norms and nothing more for
        the clipped sum (a weighted sum of the stored gradients); the Gram path costs
        L^2 (d + O) for the norms plus L O d for the clipped sum (a convolution weight
        gradient). So materialising is the faster one whenever its memory, O d per example,
        is acceptable: up to L (d + O) (the patches and output gradient of an example, what
        the Gram path handles per example), or twice that where the fused CPU kernel makes
        the per-example gradients without patches (bench CNN's second layer, O d = 1.14
        L (d + O): 7.5 -> 3.5 ms per step at 1 thread)."""
        out_channels, positions = self.g.shape[1], self.g.shape[2]
        allowance = 2 if self._fused_kernel() else 1
        return out_channels * self._row <= allowance * positions * (self._row + out_channels)

    def _step(self, per_example_elements: int) -> int:
        return _chunk(self.batch_size, per_example_elements,
                      on_cpu=self.x.device.type == "cpu")

    def _weight_per_example(self) -> torch.Tensor:
        import torch

        if self._per_example_weight is None and self._fused_kernel():
            # x and g share one dtype (the layer's backward records them so)
            self._per_example_weight = kernels.conv_per_example_weight_grads(
                _wide(self.x), _wide(self.g), *self._geometry)
        if self._per_example_weight is None:
            b, out_channels, positions = self.g.shape
            g = self.g
            half = self._half_per_example()  # bfloat16 gradients, as for linear layers
            dtype = g.dtype if half else _wide(g[:0]).dtype
            product = torch.bmm if half else _wide_bmm
            pe = torch.empty(b, out_channels, self._row, dtype=dtype, device=g.device)
            step = self._step(positions * self._row)
            for lo in range(0, b, step):
                hi = min(b, lo + step)
                product(g[lo:hi], self._patches(lo, hi), out=pe[lo:hi])
            self._per_example_weight = pe
        return self._per_example_weight

    def _half_per_example(self) -> bool:
        """Whether materialised per-example weight gradients are formed and kept in bfloat16,
        as :meth:`LinearUsage._half_per_example` decides for linear layers (bfloat16 input and
        output gradient under autocast, off the CPU's fused kernel, on a device with
        mixed-precision products): their norms are measured on the stored values and the
        clipped sum reads the same values, so no round-off bound is needed, and they take half
        the memory of float32 ones."""
        import torch

        return (self.x.dtype == torch.bfloat16 and self.g.dtype == torch.bfloat16
                and not self._fused_kernel() and _materialises_in_bfloat16(self.x.device.type))

    def _bias_per_example(self) -> torch.Tensor:
        if self._bias_rows is None:  # summed over positions in float32 at least
            self._bias_rows = _wide_sum(self.g, dim=2)
        return self._bias_rows

    def _ghost_sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The squared norm of g_i(p), scaled, as measured (no slack)."""
        import torch

        s2 = self.scale * self.scale
        if p is self.bias:
            return kernels.per_example_sq_norms(self._bias_per_example()) * s2
        if self._materialise_weight():
            return kernels.per_example_sq_norms(self._weight_per_example()) * s2
        b, _, positions = self.g.shape
        out = torch.empty(b, dtype=torch.float64, device=self.g.device)
        step = self._step(positions * (self._row + positions))
        for lo in range(0, b, step):
            hi = min(b, lo + step)
            patches = self._patches(lo, hi)  # (n, L, d)
            g = self.g[lo:hi]  # (n, O, L)
            gram_p = _gram_bmm(patches, patches.transpose(1, 2))
            gram_g = _gram_bmm(g.transpose(1, 2), g)
            out[lo:hi] = kernels.per_example_dots(gram_p, gram_g)
        return out * s2

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        return _raised(*self.sq_norm_and_slack(p))

    def sq_norm_and_slack(self, p: torch.nn.Parameter
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`LinearUsage.sq_norm_and_slack`: the bias's norm and clipped sum read the
        same per-example rows, a materialised weight's the same stored gradients (slack None);
        on the Gram path the norm is raised by its Grams' round-off bound
        (:func:`gram_roundoff_factor`) and the clipped sum is a convolution weight gradient,
        whose part for example i errs by up to kappa_L sum_l ||g_l|| ||P_l||
        (:func:`product_roundoff_factor` over the L positions; P_l the patch at position l), in
        float64 on a GPU and in float32 on the CPU. (A constructed 16-position example,
        positions cancelling, contributed 1.000003 C without it; one whose positions cancel
        exactly in float64, 27.9 C through the GPU route, emulated.)"""
        import torch

        sq = self._ghost_sq_norm(p)
        if p is self.bias or self._per_example_weight is not None or self._materialise_weight():
            return sq, None
        positions = int(self.g.shape[2])
        products = self._position_products()
        gram_kappa = gram_roundoff_factor(self._row, int(self.g.shape[1]), positions)
        sq = sq + gram_kappa * products.square() * (self.scale * self.scale)
        # the clipped sum: float64 on a GPU (see clipped_sum), the widened dtype on the CPU
        dtype = torch.float64 if self.x.is_cuda else _wide(self.x[:0]).dtype
        kappa = product_roundoff_factor(positions, dtype, self.x.device)
        return sq, products * (kappa * abs(self.scale))

    def _position_products(self) -> torch.Tensor:
        """sum_l ||g_l|| ||P_l|| per example, float64 (B,), unscaled (computed once): ||P_l||^2
        is the window sum (a convolution with a kernel of ones, same stride, padding,
        dilation) of the input's squares summed over the channels, all in float64, raised by
        1e-12 relative like :meth:`LinearUsage._position_products`. (Summing the squares in
        float32 is faster, a ResNet-18 step on an H200 about a tenth, but squares below 1e-38
        underflow to 0 and above 1e38 overflow: a constructed example's bound vanished and it
        contributed 1000 C.)"""
        import torch
        import torch.nn.functional as F

        if self._products is None:
            kernel, stride, padding, dilation = self._geometry
            channel_sq = self.x.to(torch.float64).square().sum(dim=1, keepdim=True)
            ones = torch.ones((1, 1, *kernel), dtype=torch.float64, device=self.x.device)
            conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(kernel)]
            patch_sq = conv(channel_sq, ones, None, stride, padding, dilation)
            patch_sq = patch_sq.reshape(self.batch_size, -1)
            g_sq = self.g.to(torch.float64).square().sum(dim=1)  # (B, L)
            self._largest_out_grad = g_sq.amax(dim=1).sqrt()  # bounds its entries
            self._products = ((patch_sq.clamp_min(0.0) * g_sq).sqrt().sum(dim=1)
                              * (1.0 + 1e-12))
        return self._products

    def row_terms(self, params: list[torch.nn.Parameter]) -> list[RowTerm] | None:
        """Stored rows (:meth:`Usage.row_terms`) where the weight's per-example gradients are
        materialised (now, where the cost rule picks them, as :meth:`sq_norm_and_slack`
        would), and the bias's per-example sums over positions."""
        if (any(p is self.weight for p in params) and self._per_example_weight is None
                and not self._materialise_weight()):
            return None
        s2 = self.scale * self.scale
        terms = []
        for p in params:
            rows = self._bias_per_example() if p is self.bias else self._weight_per_example()
            if not _stored_rows(rows):
                return None
            terms.append(RowTerm(p, rows, s2, self.scale,
                                 functools.partial(_reshaped, shape=p.shape)))
        return terms

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        import torch

        if p is self.bias:  # B rows summed in float64
            return weighted_sum(self._bias_per_example(), factors, scale=self.scale)
        if self._per_example_weight is not None or self._materialise_weight():
            return weighted_sum(self._weight_per_example(), factors,
                                scale=self.scale).reshape(p.shape)
        # sum_i c_i G_i P_i is this convolution's ordinary weight gradient for the output
        # gradient scaled per example, c_i G_i: one call of torch's convolution backward (no
        # patches; on the CPU oneDNN's kernel, 1.2-2.9x faster than a patch-by-patch matmul
        # on the bench CNN's second layer) per block of examples of about _SUM_BLOCK_ROWS
        # positions, the blocks summed in float64 (a float32 reduction over all B L
        # positions at once loses digits; see _SUM_BLOCK_ROWS). Half-precision inputs are
        # widened to float32 like everywhere else here. On a GPU the whole sum runs in float64:
        # cuDNN's float32 convolutions use TF32 by default (torch.backends.cudnn.allow_tf32),
        # operands rounded to 10-bit significands, which would put an example's clipped
        # contribution about 1e-5 relative above its bound (and more where positions cancel).
        x, g = _wide(self.x), _wide(self.g)
        result_dtype = x.dtype
        if x.is_cuda and x.dtype != torch.float64:
            x, g = x.to(torch.float64), g.to(torch.float64)
        # lowered where a float32 product could overflow (_overflow_capped_factors)
        products = self._position_products()
        assert self._largest_out_grad is not None
        weights = _overflow_capped_factors(factors, self.scale, g.dtype,
                                           self._largest_out_grad, products) * self.scale
        scaled = (g * _flush_subnormal(weights.to(g.dtype))[:, None, None]).reshape(
            self._out_grad_shape)
        kernel, stride, padding, dilation = self._geometry
        weight = p.detach().to(x.dtype)
        batch = self.batch_size
        # In float32 (the CPU), one example per product: in a block of several, one example
        # whose positions cancel (a large clip factor, terms near C / kappa) shared the
        # backend's float32 running sums with the others and rounded their parts to its
        # spacing (1.0006 C for one ordinary example, L = 200, 19 such examples). Alone, each
        # example's product errs only by the slack its norm carries; the sum is in float64.
        step = batch if x.dtype == torch.float64 else 1
        total: torch.Tensor | None = None
        for lo in range(0, batch, step):
            hi = min(batch, lo + step)
            _, grad_weight, _ = torch.ops.aten.convolution_backward(
                scaled[lo:hi], x[lo:hi], weight, None, list(stride), list(padding),
                list(dilation), False, [0] * len(kernel), 1, [False, True, False])
            if step >= batch:
                return grad_weight.to(result_dtype)
            total = (grad_weight.to(torch.float64) if total is None
                     else total.add_(grad_weight))
        if total is None:  # an empty batch
            return torch.zeros(p.shape, dtype=result_dtype, device=x.device)
        return total.to(result_dtype)


# Embeddings off the CPU avoid torch.unique (its output size costs a device synchronisation on
# every embedding of every step): the norm is a masked Gram matrix (T^2 d multiply-adds per
# example) while T^2 <= this many times the row width d (T = 256 at any d >= 64), and the
# clipped sum goes through a float64 table of the whole weight up to this many elements
# (512 MiB); beyond either, the rows are grouped by torch.unique.
_EMBEDDING_GRAM_PER_ROW = 1024
_EMBEDDING_FLOAT64_TABLE = 1 << 26


class EmbeddingUsage(Usage):
    """y[i, t] = W[idx[i, t]]: g_i(W) = sum_t onehot(idx_{i,t}) gy_{i,t}^T (rows with repeated
    indices add up; the padding row gets no gradient).

    On the CPU both the norms and the clipped sum come from fused kernels
    (:func:`dpsharp.torch.kernels.embedding_sq_norms`, :func:`~dpsharp.torch.kernels.
    embedding_clipped_sum`) that group positions by row and leave the padding positions out
    themselves; other devices use torch's unique / index_add on the output gradients with the
    padding positions zeroed.
    """

    def __init__(self, weight: torch.nn.Parameter, indices: torch.Tensor,
                 out_grads: torch.Tensor, padding_idx: int | None, scale: float = 1.0) -> None:
        self.weight = weight
        self.scale = float(scale)
        self.batch_size = int(indices.shape[0])
        self.padding_idx = padding_idx
        self.idx = indices.reshape(self.batch_size, math.prod(indices.shape[1:]))
        self._out_grads = out_grads.reshape(self.batch_size, self.idx.shape[1],
                                            out_grads.shape[-1])
        self._masked: torch.Tensor | None = None

    @property
    def g(self) -> torch.Tensor:
        """The output gradients (B, T, d) with the padding positions zeroed (made on first
        use: the CPU kernels do not need it)."""
        if self._masked is None:
            g = self._out_grads
            if self.padding_idx is not None:
                g = g * (self.idx != self.padding_idx).unsqueeze(-1).to(g.dtype)
            self._masked = g
        return self._masked

    def params(self) -> list[torch.nn.Parameter]:
        return [self.weight]

    def _fused(self) -> bool:
        return self._out_grads.device.type == "cpu"

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        return _raised(*self.sq_norm_and_slack(p))

    def sq_norm_and_slack(self, p: torch.nn.Parameter) -> tuple[torch.Tensor, torch.Tensor]:
        """The squared norm raised by its own round-off bound, and the clipped sum's (see
        :meth:`Usage.sq_norm_and_slack`). Every route sums each looked-up row's positions in
        float64 (the CPU kernels, the masked float64 Gram, the float64 index_add) and the
        clipped sum does the same, so with S = sum_t ||gy_t|| (the positions' float64 row
        norms): a row sum errs by gamma_T times the sum of its positions' norms, the masked
        Gram's entries by gamma_d ||gy_t|| ||gy_s|| and its dot by gamma_{T^2+1}
        (:func:`gram_roundoff_factor` with S^2 bounding both), and the clipped sum by
        gamma_{T+1} S before its one rounding to float32. Without the norm's bound, positions
        of one row that cancel exactly in float64 gave a norm of 0 and a contribution of
        1000 C through the masked Gram."""
        sq = self._measured_sq_norm(p)
        batch, positions, features = (int(v) for v in self._out_grads.shape)
        rows_sq = kernels.per_example_sq_norms(
            self._out_grads.reshape(batch * positions, features).contiguous())
        products = rows_sq.sqrt().reshape(batch, positions).sum(dim=1) * (1.0 + 1e-12)
        unit = 2.0**-53
        kappa = max(gram_roundoff_factor(0, features, positions),
                    2.0 * _gamma(positions, unit) + _gamma(positions, unit) ** 2)
        sq = sq + kappa * products.square() * (self.scale * self.scale)
        return sq, products * (_gamma(positions + 1, unit) * abs(self.scale))

    def _measured_sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The squared norms as computed, scaled, before the round-off bound."""
        import torch

        num_rows = p.shape[0]
        s2 = self.scale * self.scale
        if self._fused():
            return kernels.embedding_sq_norms(self.idx, _wide(self._out_grads),
                                              num_rows=num_rows,
                                              padding_idx=self.padding_idx) * s2
        b, t, d = self.g.shape
        if t * t <= _EMBEDDING_GRAM_PER_ROW * d:
            # ||g_i||^2 = sum_{t,s} [idx_t = idx_s] gy_t . gy_s (padding positions are zero in
            # g): a Gram matrix masked by index equality. No torch.unique, whose output size
            # costs a device synchronisation, on every embedding of every step.
            # float64: the products of the (float32 or narrower) rows are exact and the sums
            # keep 53 bits, so positions of one row whose gradients cancel still give its
            # norm (a float32 Gram underestimated such a norm by 60%)
            g64 = self.g.to(torch.float64)
            gram = torch.bmm(g64, g64.transpose(1, 2))
            same = (self.idx.unsqueeze(2) == self.idx.unsqueeze(1)).to(gram.dtype)
            return kernels.per_example_dots(gram, same) * s2
        keys = (torch.arange(b, device=self.idx.device).unsqueeze(1) * num_rows
                + self.idx).reshape(-1)
        unique_keys, inverse = torch.unique(keys, return_inverse=True)
        if unique_keys.numel() == keys.numel():
            # No row repeats within an example: the example's gradient rows are its output
            # gradients, and its squared norm is the sum of theirs.
            rows_sq = kernels.per_example_sq_norms(self.g.reshape(b * t, d))
            return rows_sq.reshape(b, t).sum(dim=1) * s2
        rows = torch.zeros(unique_keys.numel(), d, dtype=torch.float64, device=self.g.device)
        rows.index_add_(0, inverse, self.g.reshape(-1, d).double())
        row_sq = (rows * rows).sum(dim=1)
        out = torch.zeros(b, dtype=torch.float64, device=self.g.device)
        return out.index_add_(0, unique_keys // num_rows, row_sq) * s2

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        import torch

        b, t, d = self.g.shape
        out = torch.zeros(b, p.shape[0], d, dtype=self.g.dtype, device=self.g.device)
        out.scatter_add_(1, self.idx.unsqueeze(-1).expand(b, t, d), self.g)
        return out * self.scale

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        import torch

        if self._fused():
            # float64 weights; each row summed in float64 and rounded once.
            weights = (factors.to(torch.float64) * self.scale).contiguous()
            out = kernels.embedding_clipped_sum(self.idx, _wide(self._out_grads), weights,
                                                num_rows=p.shape[0],
                                                padding_idx=self.padding_idx)
            return out.to(self._out_grads.dtype)
        # Other devices: the rows looked up, each summed over its positions in float64 and
        # rounded once, like the CPU kernel. (A float32 index_add_ into the weight's shape adds
        # a row's positions one by one in float32: a row looked up at 10^5 positions of a batch
        # came out 1.4e-4 off, where a per-example gradient sums only its own positions.)
        d = self.g.shape[2]
        weights = factors.to(torch.float64) * self.scale
        scaled = (self.g.to(torch.float64) * weights[:, None, None]).reshape(-1, d)
        if p.numel() <= _EMBEDDING_FLOAT64_TABLE:
            # Every position added into a float64 table of the whole weight, rounded once: no
            # torch.unique (a device synchronisation); rows nobody looked up stay zero.
            table = torch.zeros(p.shape, dtype=torch.float64, device=self.g.device)
            table.index_add_(0, self.idx.reshape(-1), scaled)
            return table.to(self.g.dtype)
        rows, inverse = torch.unique(self.idx.reshape(-1), return_inverse=True)
        sums = torch.zeros(rows.numel(), d, dtype=torch.float64, device=self.g.device)
        sums.index_add_(0, inverse, scaled)
        out = torch.zeros(p.shape, dtype=self.g.dtype, device=self.g.device)
        out[rows] = sums.to(self.g.dtype)
        return out

    def add_clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor,
                        out: torch.Tensor) -> None:
        """The rows looked up get their clipped sums added in place (no (num_rows, d)
        intermediate: an embedding's gradient is mostly rows nobody looked up)."""
        import torch

        if (self._fused() and out.dtype == _wide(self._out_grads).dtype
                and out.is_contiguous()):
            weights = (factors.to(torch.float64) * self.scale).contiguous()
            kernels.embedding_clipped_sum(self.idx, _wide(self._out_grads), weights,
                                          num_rows=p.shape[0], padding_idx=self.padding_idx,
                                          out=out)
            return
        super().add_clipped_sum(p, factors, out)


class AffineUsage(Usage):
    """y = xhat * w + b (the affine part of LayerNorm / GroupNorm), w broadcast over
    ``reduce_dims`` of xhat (all dims but the batch and the parameter's own).

    The per-example gradients g_i(w) = sum_r gy_{i,r} xhat_{i,r} and g_i(b) = sum_r gy_{i,r}
    (sums over ``reduce_dims``) are only the size of the parameters per example, so they are
    formed when the usage is recorded and the normalised input and output gradient (each the
    size of the layer's activations) are not kept until the end of the backward pass.
    """

    def __init__(self, weight: torch.nn.Parameter | None, bias: torch.nn.Parameter | None,
                 normalised: torch.Tensor, out_grads: torch.Tensor,
                 reduce_dims: tuple[int, ...], scale: float = 1.0) -> None:
        self.weight = weight
        self.bias = bias
        self.scale = float(scale)
        self.batch_size = int(out_grads.shape[0])
        self._rows: dict[int, torch.Tensor] = {}  # unscaled per-example gradients by id(p)
        for p in self.params():
            src = out_grads * normalised if p is weight else out_grads
            if reduce_dims:
                src = src.sum(dim=reduce_dims)
            self._rows[id(p)] = src.reshape((self.batch_size, *p.shape)).contiguous()

    @classmethod
    def from_rows(cls, weight: torch.nn.Parameter | None, bias: torch.nn.Parameter | None,
                  weight_rows: torch.Tensor | None, bias_rows: torch.Tensor | None,
                  scale: float = 1.0) -> AffineUsage:
        """A usage from per-example gradient rows (B, *p.shape) computed elsewhere (unscaled;
        given for the parameters that are not None)."""
        usage = cls.__new__(cls)
        usage.weight = weight
        usage.bias = bias
        usage.scale = float(scale)
        usage._rows = {}
        for p, rows in ((weight, weight_rows), (bias, bias_rows)):
            if p is not None:
                assert rows is not None
                usage._rows[id(p)] = rows
                usage.batch_size = int(rows.shape[0])
        return usage

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    def _unscaled(self, p: torch.nn.Parameter) -> torch.Tensor:
        return self._rows[id(p)]

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        return kernels.per_example_sq_norms(self._unscaled(p)) * (self.scale * self.scale)

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        return self._unscaled(p) * self.scale

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        return weighted_sum(self._unscaled(p), factors, scale=self.scale)

    def row_terms(self, params: list[torch.nn.Parameter]) -> list[RowTerm] | None:
        """The per-example gradient rows formed at record time (:meth:`Usage.row_terms`)."""
        s2 = self.scale * self.scale
        terms = []
        for p in params:
            rows = self._unscaled(p)
            if not _stored_rows(rows):
                return None
            terms.append(RowTerm(p, rows, s2, self.scale,
                                 functools.partial(_reshaped, shape=p.shape)))
        return terms


class PerExampleUsage(Usage):
    """Per-example gradients that were materialised directly (the torch.func fallback)."""

    def __init__(self, grads: dict[int, tuple[torch.nn.Parameter, torch.Tensor]],
                 batch_size: int) -> None:
        self.grads = grads
        self.batch_size = batch_size

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p, _ in self.grads.values()]

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        return self.grads[id(p)][1]


class TransposedLinearUsage(LinearUsage):
    """y = x W + b with the weight stored transposed, W of shape (d, p) (the ``Conv1D`` of
    Hugging Face's GPT-2): the linear map of :class:`LinearUsage` with g_i(W) =
    sum_t x_{i,t} gy_{i,t}^T, the transpose of the nn.Linear gradient. Norms are those of
    :class:`LinearUsage` (a transpose keeps the Frobenius norm); the per-example gradients are
    formed in the faster orientation and handed out in the (d, p) layout, and the clipped sum
    is formed in the (d, p) layout directly."""

    _weight_is_pd = False

    def _clipped_product(self, p: torch.nn.Parameter,
                         factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        product = super()._clipped_product(p, factors)
        if product is None:
            return None
        m1, m2 = product  # m1 @ m2 = sum_i c_i g_i(W)^T, (p, d): transpose both factors
        return m2.t(), m1.t()


class BlockUsage(Usage):
    """One call of a layer made of several linear maps whose weights and biases are disjoint
    blocks of rows of a few parameters (the packed query / key / value projection of
    nn.MultiheadAttention applied to different inputs, or its separate projection weights
    sharing one packed bias).

    Each part is a :class:`LinearUsage` whose ``weight`` / ``bias`` are stand-ins (views of the
    blocks) mapped to ``(parameter, rows)``, rows a slice of the parameter's dimension 0 (None:
    all of it). The blocks of one parameter are disjoint, so an example's gradient is the
    blocks' gradients side by side:

        ||g_i(P)||^2 = sum_blocks ||g_i(block)||^2,   sum_i c_i g_i(P) = [sum_i c_i g_i(block)]

    (each block's norm a ghost norm of its linear map, each block's clipped sum one
    book-keeping contraction). Parts arrive one by one during the backward pass (:meth:`add`);
    the clipper reads the usage only once the backward pass has finished.
    """

    def __init__(self) -> None:
        self.parts: list[tuple[Usage, dict[int, tuple[Any, Any]]]] = []
        self.batch_size = -1
        self._params: list[Any] = []

    def add(self, usage: Usage, targets: dict[int, tuple[Any, Any]]) -> bool:
        """Add one part: ``targets`` maps id(stand-in) -> (parameter, rows) for the part's
        trainable stand-ins. Returns True for the first part (the caller records the usage)."""
        first = not self.parts
        if first:
            self.batch_size = usage.batch_size
        self.parts.append((usage, targets))
        for param, _ in targets.values():
            if all(param is not q for q in self._params):
                self._params.append(param)
        return first

    def params(self) -> list[torch.nn.Parameter]:
        return list(self._params)

    def _blocks(self, p: torch.nn.Parameter) -> list[tuple[Usage, Any, Any]]:
        """(part, stand-in, rows) for every block of ``p``."""
        out = []
        for usage, targets in self.parts:
            for stand_in in usage.params():
                param, rows = targets.get(id(stand_in), (None, None))
                if param is p:
                    out.append((usage, stand_in, rows))
        return out

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        total: torch.Tensor | None = None
        for usage, stand_in, _ in self._blocks(p):
            sq = usage.sq_norm(stand_in)
            total = sq if total is None else total + sq
        assert total is not None
        return total

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        import torch

        blocks = self._blocks(p)
        if len(blocks) == 1 and blocks[0][2] is None:
            usage, stand_in, _ = blocks[0]
            return usage.per_example(stand_in).reshape((self.batch_size, *p.shape))
        out: torch.Tensor | None = None
        for usage, stand_in, rows in blocks:
            pe = usage.per_example(stand_in)
            if out is None:
                out = torch.zeros((self.batch_size, *p.shape), dtype=pe.dtype, device=pe.device)
            out[:, rows if rows is not None else slice(None)] = pe.reshape(
                (self.batch_size, *stand_in.shape))
        assert out is not None
        return out

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        import torch

        blocks = self._blocks(p)
        if len(blocks) == 1 and blocks[0][2] is None:
            usage, stand_in, _ = blocks[0]
            return usage.clipped_sum(stand_in, factors).reshape(p.shape)
        out = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        for usage, stand_in, rows in blocks:
            part = usage.clipped_sum(stand_in, factors)
            out[rows if rows is not None else slice(None)] = part.reshape(stand_in.shape)
        return out


# ---------------------------------------------------------------------------- tied weights
def _common(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors widened (float16 / bfloat16 -> float32) and promoted to one dtype."""
    import torch

    wide = [_wide(t) for t in tensors]
    dtype = wide[0].dtype
    for t in wide[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return [t.to(dtype) for t in wide]


def _plain_linear(u: Usage, p: torch.nn.Parameter) -> bool:
    """u is a linear map y = x W^T (+ b) whose weight W is ``p`` (not a transposed-weight
    layer, not a block of a packed parameter)."""
    return type(u) is LinearUsage and u.weight is p


def _cross_covered(u: Usage, v: Usage, p: torch.nn.Parameter) -> bool:
    """Whether :func:`tied_cross_dot` covers the pair (u, v) of usages of ``p``."""
    for w in (u, v):
        if isinstance(w, EmbeddingUsage) and w.weight is p:
            continue
        if not _plain_linear(w, p):
            return False
        assert isinstance(w, LinearUsage)
        if tuple(p.shape) != (w.g.shape[2], w.a.shape[2]):
            return False
    return True


def tied_cross_dot(u: Usage, v: Usage, p: torch.nn.Parameter) -> torch.Tensor | None:
    """<g_i^u(p), g_i^v(p)> (Frobenius inner product) for every example i, float64 (B,), for
    two usages u, v of one tied parameter ``p``, without forming either per-example gradient;
    None for a pair this does not cover (the caller then materialises the gradients).

    A tied parameter's per-example gradient is the sum over its usages, so
    ||g_i||^2 = sum_u ||g_i^u||^2 + 2 sum_{u < v} <g_i^u, g_i^v>: the norms come from each
    usage's own ghost norm and the cross terms from here. Notation, for example i: a linear
    usage y_s = W x_s (+ b) over positions s has input rows x_s and output gradients gy_s,
    so g^lin = sum_s gy_s x_s^T (Goodfellow 2015); an embedding usage y_t = W[k_t] has
    indices k_t and output gradients h_t (zero at padding positions), so
    g^emb = sum_t e_{k_t} h_t^T, e_k the k-th unit vector. Then, by bilinearity of
    <., .> and <e_k h^T, M> = h . M[k] (row k of M):

    * embedding and linear (the tied input embedding and output projection of a language
      model):
      <g^emb, g^lin> = sum_t h_t . g^lin[k_t] = sum_t sum_s gy_s[k_t] (x_s . h_t),
      i.e. the dot of the (S x T) matrix X H^T with the (S x T) matrix of output-gradient
      entries gy_s[k_t] gathered at the looked-up rows: S T (d + 1) multiply-adds, no
      (V x d) gradient. Where the linear usage has materialised g^lin already (its own cost
      rule, LinearUsage._materialise_weight), the first form is used: its rows at k_t
      against h_t (T d);
    * two embeddings: <g^emb1, g^emb2> = sum_{t,t'} [k_t = k'_t'] (h_t . h'_t');
    * two linear usages (one weight, other biases): <gy x^T, gy' x'^T> summed over s, s' is
      sum_{s,s'} (gy_s . gy'_s') (x_s . x'_s'), the dot of G G'^T and X X'^T (the ghost norm
      of Li et al., ICLR 2022, applied to two different usages).

    Both usages' loss scales multiply the result. The inner products between positions are
    float64 Gram matrices (:func:`_gram_bmm`: the usages' gradients may cancel, and a float32
    entry's rounding would be amplified as in a ghost norm), their dot is float64
    (:func:`dpsharp.torch.kernels.per_example_dots`); products with materialised gradients
    read them in their stored (widened) dtype.
    """
    import torch

    if isinstance(v, EmbeddingUsage) and not isinstance(u, EmbeddingUsage):
        u, v = v, u
    scale = u.scale * v.scale
    if isinstance(u, EmbeddingUsage) and u.weight is p:
        idx = u.idx.to(torch.int64)
        batch, positions = (int(n) for n in idx.shape)
        if isinstance(v, EmbeddingUsage) and v.weight is p:
            h, h2 = _common(u.g, v.g)
            same = (idx.unsqueeze(2) == v.idx.to(torch.int64).unsqueeze(1)).to(torch.float64)
            return kernels.per_example_dots(_gram_bmm(h, h2.transpose(1, 2)), same) * scale
        if not _plain_linear(v, p) or tuple(p.shape) != (v.g.shape[2], v.a.shape[2]):
            return None
        assert isinstance(v, LinearUsage)
        if v._per_example_weight is not None:
            # the looked-up rows first, then widened: a bfloat16 head's gradients widened
            # whole would be a (B, V, d) float32 copy (4.9 GB for GPT-2 at batch 32)
            m = v._per_example_weight
            rows = torch.gather(m, 1, idx.unsqueeze(2).expand(batch, positions, m.shape[2]))
            h, rows = _common(u.g, rows)
            return kernels.per_example_dots(rows, h) * scale
        h, x, gy = _common(u.g, v.a, v.g)
        inner = _gram_bmm(x, h.transpose(1, 2))  # (B, S, T): x_s . h_t
        gathered = torch.gather(gy, 2, idx.unsqueeze(1).expand(batch, gy.shape[1], positions))
        return kernels.per_example_dots(inner, gathered.to(torch.float64).contiguous()) * scale
    if _plain_linear(u, p) and _plain_linear(v, p):
        assert isinstance(u, LinearUsage) and isinstance(v, LinearUsage)
        if u._per_example_weight is not None and v._per_example_weight is not None:
            m1, m2 = u._per_example_weight, v._per_example_weight
            if m1.dtype != m2.dtype or m1.dtype == torch.float16:
                m1, m2 = _common(m1, m2)  # (per_example_dots reads bfloat16 as it is)
            return kernels.per_example_dots(m1, m2) * scale
        x1, g1, x2, g2 = _common(u.a, u.g, v.a, v.g)
        return kernels.per_example_dots(_gram_bmm(g1, g2.transpose(1, 2)),
                                        _gram_bmm(x1, x2.transpose(1, 2))) * scale
    return None


# The largest factor by which the uses of a tied parameter may cancel in one example before
# its clip factor is taken from sum_u ||g_i^u|| / this instead of its tied norm (tied_sq_norm).
_TIED_CANCELLATION_LIMIT = 4.0


def tied_sq_norm(p: torch.nn.Parameter, usages: list[Usage]) -> torch.Tensor | None:
    """||sum_u g_i^u(p)||^2 for every example, float64 (B,), for a parameter used by several
    usages: sum_u ||g_i^u||^2 + 2 sum_{u < v} <g_i^u, g_i^v> (:func:`tied_cross_dot`), clamped
    at 0 against round-off (a NaN stays NaN), then raised to (||.|| + sum_u e_u)^2 by the
    usages' clipped-sum round-off bounds e_u (:meth:`Usage.sq_norm_and_slack`; the parameter's
    clipped sum is the sum of theirs, so their errors add), and at least
    (sum_u ||g_i^u|| / :data:`_TIED_CANCELLATION_LIMIT`)^2. None when a pair is not covered."""
    import torch

    pairs = [(u, v) for k, u in enumerate(usages) for v in usages[k + 1:]]
    if not all(_cross_covered(u, v, p) for u, v in pairs):
        return None
    # A materialised use's gradient is its stored values (rounded: bfloat16, or a float32
    # product), and its norm and clipped sum read them; a cross term with another linear use
    # must read the same values, so where one linear use materialises, all of them do (two
    # linear uses whose gradients cancel, one materialised and the other's cross term taken
    # from exact Grams, released 1614 C under bf16 and 168 C with float32 products).
    linear = [u for u in usages if isinstance(u, LinearUsage)]
    if len(linear) > 1 and any(u._per_example_weight is not None
                               or (int(u.a.shape[1]) > 1 and u._materialise_weight())
                               for u in linear):
        for u in linear:
            u._weight_per_example()
    # first: a usage may materialise its gradients
    norms_and_slacks = [u.sq_norm_and_slack(p) for u in usages]
    norms = [sq for sq, _ in norms_and_slacks]
    # Each use's clipped sum is rounded to the parameter's dtype and added into one running
    # sum, k uses in all: each addition rounds relative to the whole partial sum, so one use's
    # part may be rounded up to k + 2 times by u ||g_i^u|| (and the others' by theirs), on top
    # of its own slack. Where the uses cancel each other, ||g_i^u|| is many times the tied norm
    # (an embedding tied to an output projection whose gradients cancel contributed 1.0019 C
    # without these terms; one row looked up 128 times, 1.0000072 C with 4 u per use).
    unit = _unit_roundoff(p.dtype) * (len(usages) + 3)
    slacks = [unit * sq.clamp_min(0.0).sqrt() + (0.0 if e is None else e)
              for sq, e in norms_and_slacks]
    crosses = [tied_cross_dot(u, v, p) for u, v in pairs]
    total = norms[0]
    for n in norms[1:]:
        total = total + n
    for c in crosses:
        assert c is not None
        total = total + 2.0 * c
    raised = _raised(total.clamp_min(0.0), sum(slacks[1:], slacks[0]))
    # Each use's clipped sum is summed over the whole batch (in the parameter's dtype) before
    # the uses are added. An example whose uses cancel each other has a small tied norm, so a
    # large clip factor, while each use's part c ||g_i^u|| is huge: every other example's part
    # of that use was rounded to the spacing of those running sums (an ordinary example moved
    # the release by 32 C beside 128 such examples of an embedding tied to its output layer).
    # The norm is therefore at least sum_u ||g_i^u|| / _TIED_CANCELLATION_LIMIT, so that each
    # use's part stays within _TIED_CANCELLATION_LIMIT C, as an untied layer's within C.
    uses = norms[0].clamp_min(0.0).sqrt()
    for n in norms[1:]:
        uses = uses + n.clamp_min(0.0).sqrt()
    return torch.maximum(raised, (uses / _TIED_CANCELLATION_LIMIT).square())
