// CUDA versions of the clip kernels (clip.hpp), built only with -DDPSHARP_CUDA=ON
// (cpp/cuda/clip_kernels.cu). This header includes no CUDA header: pointers are raw device
// addresses (torch data_ptr()) and the stream is the caller's cudaStream_t passed as void*
// (torch.cuda.current_stream().cuda_stream), so the launches are ordered with the caller's work
// and nothing synchronises. Errors (launch failures) throw std::runtime_error.
//
// Same contracts, and for clip_accumulate_noise the same bits, as the CPU kernels: the noise is
// noise_stream.hpp evaluated in-kernel (the header is __host__ __device__ under nvcc, compiled
// with -fmad=false so no multiply-add is contracted), the sum over examples runs in order
// i = 0, 1, ... in float64, and the result is rounded once to the output dtype.
#pragma once

#include <cstdint>

#include "dpsharp/clip.hpp"

namespace dpsharp::clip::cuda {

// out[i] = sum_j per_example[i * numel + j]^2 in float64 (device buffers). One block per example,
// a fixed-shape tree reduction: deterministic (run to run), equal to the CPU value up to float64
// summation order.
void per_example_sq_norms(const void* per_example, DType dtype, std::int64_t batch,
                          std::int64_t numel, double* out, void* stream);

// partial[i * slices + s] = sum_{j in slice s} a[i * numel + j] * b[i * numel + j] in float64
// (products and sums), the numel elements of each example cut into `slices` equal contiguous
// slices, one block per (example, slice), a fixed-shape tree reduction in each: deterministic.
// The caller sums each example's slices (in a fixed order). slices in [1, 65535].
void per_example_dot_partials(const void* a, const void* b, DType dtype, std::int64_t batch,
                              std::int64_t numel, int slices, double* partial, void* stream);

// out[j] = float32(sum_i factors[i] * rows[i * numel + j]) for float32 or bfloat16 rows (B,
// numel), float64 factors (device buffers): float64 products and sums in order i = 0, 1, ...,
// one rounding to float32 (a clipped sum of materialised bfloat16 per-example gradients).
void weighted_rows_to_float32(const void* rows, DType row_dtype, const double* factors,
                              std::int64_t batch, std::int64_t numel, float* out, void* stream);

// One buffer of the multi-buffer norms and weighted sums below: `batch` rows of numel elements
// (device memory, float32 or bfloat16; float64 too for the norms), the weighted sum's scale and
// its float32 output (numel elements; unused by the norms).
struct RowsBuffer {
  const void* rows;
  DType dtype;
  std::int64_t numel;
  double scale;
  float* out;
};

// per_example_dot_partials(rows, rows) of `count` buffers in one launch per 32 buffers:
// partial[(k * batch + i) * slices + s] = sum over slice s of example i's row of buffer k of
// its squares, in float64 (each row cut into `slices` equal slices, a fixed-shape tree in each:
// deterministic). slices in [1, 1024].
void per_example_sq_norms_many(const RowsBuffer* buffers, std::int64_t count,
                               std::int64_t batch, int slices, double* partial, void* stream);

// weighted_rows_to_float32 of `count` buffers with weights factors[i] * scale[k] (their float64
// product), in one launch per row dtype and 32 buffers: the bits of one call per buffer with
// the weights multiplied first. Outputs must not overlap the rows or each other.
void weighted_rows_many(const RowsBuffer* buffers, std::int64_t count, std::int64_t batch,
                        const double* factors, void* stream);

// out[j] = scale * (base[j] + sum_i factors[i] * per_example[i * numel + j] + noise_std * z_j);
// factors is a device float64 buffer; per_example / base may be null; base may alias out.
void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           void* cuda_stream);

// clip_accumulate_noise without per-example terms for `count` buffers (clip.hpp's ReleaseBuffer,
// base_dtype equal to dtype) in one launch per dtype and 64 buffers: a model's whole release,
// with the bits of one clip_accumulate_noise call per buffer. The buffers must not overlap one
// another (a base may alias its own out).
void release_noise(const ReleaseBuffer* buffers, std::int64_t count, double noise_std,
                   const NoiseStream& stream, double scale, void* cuda_stream);

// The raw standard normals z_0..z_{numel-1} of a stream's float64 sequence (float64 = true, into
// a device double buffer) or float32 sequence (into a device float buffer), for tests.
void gaussian_noise(const NoiseStream& stream, std::int64_t numel, bool float64, void* out,
                    void* cuda_stream);

// Number of visible CUDA devices (0 when none or no driver).
int device_count();

}  // namespace dpsharp::clip::cuda
