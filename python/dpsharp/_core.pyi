"""Type stubs for dpsharp's compiled core (cpp/bindings/*.cpp). Internal: the public API
wraps these functions and never returns _core types. tests/test_stubs.py checks that every
attribute of the built module has a stub here and that every stub exists in the module."""

from typing import Any, Sequence, overload

import numpy as np
import numpy.typing as npt

def build_info() -> dict[str, Any]:
    """How this module was built: version, build type, whether CUDA kernels are included."""

def parallel_backend() -> str:
    """'openmp' (the team of an OpenMP runtime already loaded, e.g. torch's) or 'std::thread'."""

@overload
def log_normal_cdf(x: float) -> float: ...
@overload
def log_normal_cdf(x: npt.ArrayLike) -> np.ndarray: ...
def reciprocal_rounded_up(x: float) -> float: ...

# --- privacy-loss distributions (cpp/bindings/bind_pld.cpp) ---------------------------------
def pld_discretize(
    mechanism: int,
    parameter: float,
    sampling_rate: float,
    grid_step: float,
    top_tail: float,
    bottom_tail: float,
    pessimistic: bool,
) -> tuple[int, np.ndarray, float]:
    """Discretise a privacy-loss distribution on the grid k * grid_step: (offset, mass,
    infinity_mass), mass[i] at loss (offset + i) * grid_step. mechanism: 0 Gaussian,
    1 Laplace, 2 Poisson remove, 3 Poisson add, 4 symmetrised sampled Gaussian."""

def pld_discretize_many(
    mechanism: int,
    parameters: Sequence[float],
    sampling_rate: float,
    grid_step: float,
    top_tail: float,
    bottom_tail: float,
    pessimistic: bool,
    threads: int = 1,
) -> list[tuple[int, np.ndarray, float]]:
    """pld_discretize(...) at each of ``parameters`` (one mechanism and sampling rate): the same
    values, with the work that does not depend on the parameter shared; ``threads`` split the
    grid points (the values do not depend on it)."""

def pld_log_mgf(
    mass: npt.ArrayLike, offset: int, grid_step: float, exponents: Sequence[float]
) -> np.ndarray:
    """log sum_k mass[k] e^{t (offset + k) grid_step} for each exponent t (-inf when the mass
    is 0): the log moment generating function of a discretised PLD's finite part."""

def pld_coarsen_optimistic(
    mass: npt.ArrayLike, offset: int, fine_step: float, factor: int
) -> tuple[int, np.ndarray]:
    """(offset, mass): the optimistic coarsening of masses at losses (offset + i) * fine_step onto
    the grid of step factor * fine_step (a mean-preserving contraction in y = e^{-loss}, see
    pld.hpp); negative entries count as 0."""

def pld_merge_onto_grid(
    losses: npt.ArrayLike,
    masses: npt.ArrayLike,
    lowest: int,
    size: int,
    grid_step: float,
    upward: bool,
) -> tuple[int, np.ndarray]:
    """(offset, mass): the optimistic merge of atoms (``masses`` at increasing ``losses``, +inf
    allowed) onto the grid of ``size`` points from loss lowest * grid_step, by mean-preserving
    merges in y = e^{-loss}: an upward sweep aiming above each atom (``upward``) or a downward one
    aiming below (see pld.hpp). Every loss must be at or above the bottom grid point."""

def pld_delta_crossing(
    mass: npt.ArrayLike,
    constant: float,
    decay: float,
    delta: float,
    clip_negative: bool,
    relative_slack: float = 0.0,
) -> tuple[int, float, float]:
    """(j, A, W): the smallest grid index j whose hockey-stick value A_j (1 + s) + constant -
    W_j (1 - s) is <= delta (-1 if none), with A and W at j - 1 when j > 0 (see pld.hpp)."""

def pld_certified_rfft(
    values: npt.ArrayLike, size: int, threads: int = 1
) -> npt.NDArray[np.complex128]:
    """rfft(values, size) by the transform of pld.hpp (certified_rfft), with an a priori
    componentwise error bound; ``threads`` share the work (the bits do not depend on it)."""

def pld_certified_rfft_pair(
    first: npt.ArrayLike, second: npt.ArrayLike, size: int, threads: int = 1
) -> tuple[npt.NDArray[np.complex128], npt.NDArray[np.complex128]]:
    """(rfft(first, size), rfft(second, size)) by one complex transform of first + i second
    (pld.hpp certified_rfft_pair); componentwise error bound on the sum of the two l1 norms."""

def pld_certified_irfft(
    spectrum: npt.ArrayLike, size: int, threads: int = 1
) -> npt.NDArray[np.float64]:
    """irfft(spectrum, size) by the transform of pld.hpp (certified_irfft), with an a priori
    normwise error bound; ``threads`` share the work (the bits do not depend on it)."""

def pld_multiply_factor(
    product: npt.NDArray[np.complex128],
    upper: npt.NDArray[np.float64],
    lower: npt.NDArray[np.float64],
    factor: npt.ArrayLike,
    live: int,
    count: int,
    error: float,
    cutoff: float,
) -> int:
    """In place: on the live prefix [0, live), ``upper += count log(|factor| + error)`` and
    ``lower += count log |factor|`` (moduli rounded up); with a cutoff (not NaN) the prefix then
    shrinks to end at the last ``upper`` above it; on that prefix ``product *= factor ** count``
    (repeated squaring). Returns the new live prefix (multiply_factor in pld.hpp)."""

def pld_certified_band_dft(
    values: npt.ArrayLike, size: int, reach: int, threads: int = 1
) -> npt.NDArray[np.complex128]:
    """The first `reach` entries of rfft(values, size) by direct summation (pld.hpp:
    certified_band_dft), with an a priori componentwise error bound; ``threads`` share the
    frequencies (the bits do not depend on it)."""

def pld_band_suffix_sums(
    plain: npt.ArrayLike, discounted: npt.ArrayLike, total: float, size: int, grid_step: float, index: int
) -> tuple[float, float]:
    """(A_K, W_K) of a composition held as a band of low frequencies (see pld.hpp: BandTerms;
    plain and discounted are the terms P_f, Q_f as float64 pairs (re, im))."""

def pld_band_crossing(
    plain: npt.ArrayLike,
    discounted: npt.ArrayLike,
    total: float,
    size: int,
    grid_step: float,
    first: int,
    constant: float,
    delta: float,
) -> tuple[int, float, float]:
    """(j, A_{j-1}, W_{j-1}): the first index j >= first with A_j + constant - W_j <= delta for a
    composition held as a band (-1 if none; (first, nan, nan) if it holds at first)."""

def pld_log_hockey_stick(mechanism: int, parameter: float, sampling_rate: float, loss: float) -> float:
    """log delta(eps = loss) of the continuous dominating pair (-inf when delta is 0)."""

# --- Renyi DP (cpp/bindings/bind_rdp.cpp) ---------------------------------------------------
def rdp_poisson_gaussian(
    sampling_probability: float, noise_multiplier: float, orders: npt.ArrayLike
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian (add/remove one) at each order."""

def rdp_poisson_gaussian_log_a_minus_one(
    sampling_probability: float,
    noise_multiplier: float,
    order: float,
    use_quadrature: bool = False,
    method: int = 0,
) -> float:
    """log(A_alpha - 1) of the Poisson-subsampled Gaussian; method (quadrature only): 0 = the
    trapezoidal rule where it certifies, else Gauss-Kronrod; 1 = trapezoidal only (NaN where it
    cannot certify); 2 = Gauss-Kronrod only."""

def rdp_convex_lower_bound(
    points: npt.ArrayLike, log_moment: npt.ArrayLike, at: npt.ArrayLike
) -> np.ndarray:
    """Lower bound on a convex, non-decreasing K with K(1) = 0 from its values at points."""

def rdp_search_orders(
    points: npt.ArrayLike,
    grid_at: npt.ArrayLike,
    orders: npt.ArrayLike,
    integer: npt.ArrayLike,
    terms: list[tuple[float, np.ndarray, float, float, float, bool]],
    target: float,
    kind: int,
    want_delta: bool,
    fractional_per_round: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(known mask over the grid, composed curve at the known orders) of an RDP answer; lazy
    terms' values are evaluated in place where the answer needs them."""

def rdp_gaussian(noise_multiplier: float, orders: npt.ArrayLike) -> np.ndarray:
    """RDP of the Gaussian mechanism."""

def rdp_laplace(scale: float, orders: npt.ArrayLike) -> np.ndarray:
    """RDP of the Laplace mechanism."""

def rdp_sampled_without_replacement_gaussian(
    sampling_rate: float, noise_multiplier: float, orders: npt.ArrayLike
) -> np.ndarray:
    """Upper bound on the RDP of a Gaussian on a subsample without replacement (replace one)."""

def rdp_epsilon(orders: npt.ArrayLike, rdp: npt.ArrayLike, delta: float, kind: int) -> tuple[float, int]:
    """(epsilon, index of the optimal order); kind 0 = classic, 1 = tight."""

def rdp_delta(orders: npt.ArrayLike, rdp: npt.ArrayLike, epsilon: float, kind: int) -> tuple[float, int]:
    """(delta, index of the optimal order); kind 0 = classic, 1 = tight."""

# --- per-example norm kernels (cpp/bindings/bind_norms.cpp) ---------------------------------
def linear_norms_implementations() -> list[str]:
    """Implementations of the sequence-linear norm kernel this CPU runs ('avx512', 'avx2',
    'portable'); 'auto' picks the first."""

def linear_sequence_sq_norms(
    a: int,
    g: int,
    dtype_code: int,
    batch: int,
    positions: int,
    in_features: int,
    out_features: int,
    weight_sq: int,
    bias_sq: int,
    threads: int,
    implementation: str = "auto",
) -> None:
    """weight_sq[i] = sum_{t,s} (a_it . a_is)(g_it . g_is) and, unless bias_sq is 0,
    bias_sq[i] = sum_{t,s} g_it . g_is (float64), for contiguous float32/64 a (batch,
    positions, in_features) and g (batch, positions, out_features)."""

def embedding_sq_norms(
    indices: int,
    out_grads: int,
    dtype_code: int,
    batch: int,
    positions: int,
    features: int,
    num_rows: int,
    padding_idx: int,
    out: int,
    accumulate: bool,
    threads: int,
) -> None:
    """out[i] = ||sum_t onehot(indices[i, t]) out_grads[i, t]^T||^2 (float64); positions
    looking up padding_idx (< 0: none) left out; ValueError for an index outside
    [0, num_rows)."""

def embedding_clipped_sum(
    indices: int,
    out_grads: int,
    factors: int,
    dtype_code: int,
    batch: int,
    positions: int,
    features: int,
    num_rows: int,
    padding_idx: int,
    out: int,
    threads: int,
) -> None:
    """out (num_rows, features), every row written: row v = sum of factors[i] out_grads[i, t]
    over the positions with indices[i, t] = v (float64, in order); ValueError for an index
    outside [0, num_rows)."""

# --- clip-and-noise kernels (cpp/bindings/bind_clip.cpp) -------------------------------------
# Pointers are raw addresses (tensor.data_ptr()) of contiguous buffers; dtype codes are those of
# dpsharp.torch.kernels.
def clip_per_example_sq_norms(
    per_example: int, dtype_code: int, batch: int, numel: int, out: int, threads: int
) -> None:
    """out[i] = sum_j g[i, j]^2 in float64 over a contiguous (batch, numel) buffer."""

def clip_flat_factors(
    terms: list[tuple[int, int, float, float]], batch: int, bound: float, norms: int,
    factors: int
) -> bool:
    """Flat clipping's norms and factors from squared-norm terms (x, y or 0, y_offset, coef) of
    float64 (batch,) buffers: norms = sqrt(sum coef x (y + y_offset)), factors =
    min(1, bound / norms). False if a squared norm is not finite."""

def clip_per_example_dots(
    a: int, b: int, dtype_code: int, batch: int, numel: int, out: int, threads: int
) -> None:
    """out[i] = sum_j a[i, j] b[i, j] in float64 over two contiguous (batch, numel) buffers."""

def conv_patches(
    input: int,
    element_size: int,
    batch: int,
    channels: int,
    in_h: int,
    in_w: int,
    kernel_h: int,
    kernel_w: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    out: int,
    threads: int,
) -> None:
    """Convolution patches (B, out_h * out_w, C * kernel_h * kernel_w) of a contiguous
    (B, C, in_h, in_w) input (im2col), written into a contiguous buffer of that size."""

def conv_per_example_weight_grads(
    input: int,
    out_grads: int,
    dtype_code: int,
    batch: int,
    channels: int,
    in_h: int,
    in_w: int,
    kernel_h: int,
    kernel_w: int,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    out_channels: int,
    out: int,
    threads: int,
) -> None:
    """Per-example convolution weight gradients (B, out_channels, C * kernel_h * kernel_w) of a
    contiguous (B, C, in_h, in_w) input and (B, out_channels, out_h, out_w) output gradient
    (float32 or float64), written into a contiguous buffer of that size."""

def clip_accumulate_noise(
    per_example: int,
    factors: int,
    batch: int,
    base: int,
    out: int,
    dtype_code: int,
    numel: int,
    noise_std: float,
    key: Sequence[int],
    parameter: int,
    release: int,
    rank: int,
    scale: float,
    threads: int,
    rows_dtype_code: int = -1,
    base_dtype_code: int = -1,
) -> None:
    """out = scale * (base + sum_i factors[i] g[i] + noise_std * z), z the ChaCha8 noise stream
    of key (8 words), parameter, release, rank; rows / base dtype codes -1 mean out's (the
    mixes: float32 rows into a float64 base and out, a float64 base into a float32 out)."""

def layer_norm_affine_rows(
    x: int,
    mean: int,
    rstd: int,
    g: int,
    dtype_code: int,
    batch: int,
    rows: int,
    features: int,
    weight_rows: int,
    bias_rows: int,
    threads: int,
) -> None:
    """Per-example layer-norm affine gradients (float64 sums; a 0 address skips an output)."""

def clip_release_noise(
    outs: Sequence[int],
    bases: Sequence[int],
    numels: Sequence[int],
    dtype_codes: Sequence[int],
    parameters: Sequence[int],
    noise_std: float,
    key: Sequence[int],
    release: int,
    rank: int,
    scale: float,
    threads: int,
    base_dtype_codes: Sequence[int] = (),
) -> None:
    """For every buffer b: outs[b] = scale * (bases[b] + noise_std * z), z the noise stream of
    parameter index parameters[b] (base_dtype_codes, when given: float64 bases of float32 outs
    allowed)."""

def gaussian_stream(
    key: Sequence[int],
    parameter: int,
    release: int,
    rank: int,
    first: int,
    count: int,
    precision: str = "float32",
    threads: int = 1,
) -> npt.NDArray[np.float32] | npt.NDArray[np.float64]:
    """Standard normals first .. first + count - 1 of a stream's float32 or float64 sequence."""

def normals_implementations() -> list[str]:
    """Implementations of the bulk normal generator this CPU runs, the kernels' choice first."""

def gaussian_stream_with(
    implementation: str,
    key: Sequence[int],
    parameter: int,
    release: int,
    rank: int,
    first: int,
    count: int,
    precision: str = "float32",
) -> npt.NDArray[np.float32] | npt.NDArray[np.float64]:
    """Normals first .. first + count - 1 of one stream from one implementation (tests)."""

def chacha_block(
    key: Sequence[int], block: int, parameter: int, release: int, rank: int, rounds: int = 8
) -> tuple[int, ...]:
    """One ChaCha block (16 words; RFC 8439's block function for rounds = 20)."""

# --- CUDA kernels (cpp/bindings/bind_clip_cuda.cpp) ---------------------------------------------
# cuda_device_count always exists (0 when built without CUDA); the cuda_clip_* and
# cuda_gaussian_noise entry points exist only when build_info()["cuda"] is True.
def cuda_device_count() -> int:
    """Visible CUDA devices (0 without a device, a driver, or a CUDA build)."""

def cuda_clip_per_example_sq_norms(
    per_example: int, dtype_code: int, batch: int, numel: int, out: int, stream: int
) -> None:
    """CUDA: out[i] = sum_j g[i, j]^2 in float64 (device addresses, caller's stream)."""

def cuda_clip_per_example_dot_partials(
    a: int, b: int, dtype_code: int, batch: int, numel: int, slices: int, partial: int,
    stream: int,
) -> None:
    """CUDA: partial[i * slices + s] = sum over slice s of example i of a_j b_j, float64
    (device addresses, caller's stream)."""

def cuda_clip_weighted_rows(
    rows: int, dtype_code: int, factors: int, batch: int, numel: int, out: int, stream: int
) -> None:
    """CUDA: out[j] = float32(sum_i factors[i] rows[i, j]) in float64, float32 or bfloat16 rows
    (device addresses, caller's stream)."""

def cuda_clip_accumulate_noise(
    per_example: int,
    factors: int,
    batch: int,
    base: int,
    out: int,
    dtype_code: int,
    numel: int,
    noise_std: float,
    key: Sequence[int],
    parameter: int,
    release: int,
    rank: int,
    scale: float,
    stream: int,
) -> None:
    """CUDA: out = scale * (base + sum_i factors[i] g_i + noise_std z), z the in-kernel noise
    stream (same bits as the CPU kernel)."""

def cuda_clip_sq_norm_partials_many(
    rows: Sequence[int],
    dtype_codes: Sequence[int],
    numels: Sequence[int],
    batch: int,
    slices: int,
    partial: int,
    stream: int,
) -> None:
    """CUDA: partial[(k * batch + i) * slices + s] = the float64 sum of squares over slice s of
    example i's row of buffer k, every buffer in one launch per 32 buffers."""

def cuda_clip_weighted_rows_many(
    rows: Sequence[int],
    dtype_codes: Sequence[int],
    numels: Sequence[int],
    scales: Sequence[float],
    outs: Sequence[int],
    batch: int,
    factors: int,
    stream: int,
) -> None:
    """CUDA: outs[k][j] = float32(sum_i (factors[i] scales[k]) rows[k][i, j]) in float64 for
    float32 or bfloat16 rows, every buffer in one launch per row dtype and 32 buffers."""

def cuda_clip_release_noise(
    outs: Sequence[int],
    bases: Sequence[int],
    numels: Sequence[int],
    dtype_codes: Sequence[int],
    parameters: Sequence[int],
    noise_std: float,
    key: Sequence[int],
    release: int,
    rank: int,
    scale: float,
    stream: int,
) -> None:
    """CUDA: outs[b] = scale * (bases[b] + noise_std z_b) for every buffer b, z_b the noise
    stream of parameter index parameters[b] (base address 0: absent), in one launch per dtype
    and 64 buffers, with the bits of one cuda_clip_accumulate_noise call per buffer."""

def cuda_gaussian_noise(
    key: Sequence[int],
    parameter: int,
    release: int,
    rank: int,
    numel: int,
    precision: str,
    out: int,
    stream: int,
) -> None:
    """CUDA: the raw standard normals of a stream's float32 or float64 sequence."""
