// Fused per-example clipping kernels for DP-SGD (Abadi et al. 2016, Algorithm 1): per-example
// squared norms, and one pass that scales per-example gradients by their clip factors, sums
// them, adds Gaussian noise drawn in-kernel (noise_stream.hpp), multiplies by 1/expected batch size
// and writes the result. Plain C++ over raw pointers: the torch side passes data_ptr()s of
// contiguous tensors; nothing here knows about Python or torch.
#pragma once

#include <cstdint>

#include "dpsharp/noise_stream.hpp"

namespace dpsharp::clip {

// Element types of the gradient buffers (the clip factors and norms are always float64).
enum class DType : int { kFloat32 = 0, kFloat64 = 1, kBFloat16 = 2 };

// Where one parameter's noise comes from: a 256-bit key and the counter words that keep
// (element, parameter, release, rank) distinct. See noise_stream.hpp.
using NoiseStream = noise::StreamKey;

// The most elements one parameter's noise stream holds (its 32-bit block counter).
constexpr std::int64_t kMaxNoiseElements =
    static_cast<std::int64_t>(noise::kF64ChunkElements) << 28;

// out[i] = sum_j per_example[i * numel + j]^2, accumulated in float64.
void per_example_sq_norms(const void* per_example, DType dtype, std::int64_t batch,
                          std::int64_t numel, double* out, int threads);

// out[i] = sum_j a[i * numel + j] * b[i * numel + j], products and sums in float64 (the ghost
// norm sum_{t,s} (A_i)_{ts} (G_i)_{ts} of two Gram matrices, without widened copies).
void per_example_dots(const void* a, const void* b, DType dtype, std::int64_t batch,
                      std::int64_t numel, double* out, int threads);

// out[j] = scale * (base[j] + sum_i factors[i] * per_example[i * numel + j] + noise_std * z_j)
// with z_j the j-th standard normal of `stream` (its float64 stream for float64 buffers, its
// float32 stream for float32 / bfloat16, converted exactly to float64). per_example may be null
// (batch ignored), base may be null (taken as 0) and may alias out; noise_std = 0 draws no
// noise. Sums over i run in order i = 0, 1, ... in float64, then one rounding to dtype.
// numel <= kMaxNoiseElements.
void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           int threads);

// The same with per_example of element type rows_dtype and base of base_dtype, where they
// differ from out's (dtype): float32 rows into a float64 base and out (a float64 sum of float32
// chunks), or a float64 base (and rows) into a float32 out (its noise the float32 stream: a
// float64 sum released with one rounding after the noise). Other mixes throw
// std::invalid_argument.
void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           int threads, DType rows_dtype, DType base_dtype);

// One parameter of a release: out = scale * (base + noise_std * z), z from the stream with
// parameter index `parameter` (base may be null: taken as 0; base may alias out).
struct ReleaseBuffer {
  const void* base;
  void* out;
  std::int64_t numel;  // <= kMaxNoiseElements
  DType dtype;
  std::uint32_t parameter;
  DType base_dtype;  // dtype, or float64 for a float32 out (one rounding after the noise)
};

// clip_accumulate_noise without per-example terms for `count` buffers at once (the release of
// every parameter of a model: one call, and the threads share the tiles of all buffers).
// stream.parameter is ignored (each buffer names its own).
void release_noise(const ReleaseBuffer* buffers, std::int64_t count, double noise_std,
                   const NoiseStream& stream, double scale, int threads);

// The raw standard normals z_first..z_{first+count-1} of a stream's float32 (out_f32) or
// float64 (out_f64; exactly one of the two is non-null) sequence, on up to `threads` threads.
void gaussian_noise(const NoiseStream& stream, std::int64_t first, std::int64_t count,
                    float* out_f32, double* out_f64, int threads);

}  // namespace dpsharp::clip
