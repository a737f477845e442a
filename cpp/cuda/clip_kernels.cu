// CUDA kernels of clip_cuda.hpp: per-example squared norms and the fused
// scale-accumulate-noise-write pass with in-kernel noise (noise_stream.hpp: ChaCha8 and
// Box-Muller, the same functions the CPU runs).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dpsharp/clip_cuda.hpp"
#include "dpsharp/noise_stream.hpp"

namespace dpsharp::clip::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("dpsharp CUDA kernel ") + what + ": " +
                             cudaGetErrorString(err));
  }
}

__device__ __forceinline__ double load(const void* p, std::int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<double>(static_cast<const float*>(p)[i]);
    case DType::kFloat64:
      return static_cast<const double*>(p)[i];
    default: {
      const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i])
                                 << 16;
      return static_cast<double>(__uint_as_float(bits));
    }
  }
}

// Same rounding as the CPU kernel: double -> float (RN), then float -> bf16 (RNE, NaN quiet).
__device__ __forceinline__ void store(void* p, std::int64_t i, double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(p)[i] = __double2float_rn(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    default: {
      std::uint32_t bits = __float_as_uint(__double2float_rn(v));
      std::uint16_t r;
      if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        r = static_cast<std::uint16_t>((bits >> 16) | 0x40u);
      } else {
        bits += 0x7FFFu + ((bits >> 16) & 1u);
        r = static_cast<std::uint16_t>(bits >> 16);
      }
      static_cast<std::uint16_t*>(p)[i] = r;
    }
  }
}

constexpr int kNormThreads = 256;

__global__ void sq_norms_kernel(const void* per_example, DType dtype, std::int64_t numel,
                                double* out) {
  __shared__ double partial[kNormThreads];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * numel;
  double acc = 0.0;
  for (std::int64_t j = threadIdx.x; j < numel; j += kNormThreads) {
    const double v = load(per_example, row + j, dtype);
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kNormThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// One block per (example, slice): the slice's products a_j b_j summed in float64 by a
// grid-stride loop and a fixed-shape tree.
__global__ void dot_partials_kernel(const void* a, const void* b, DType dtype,
                                    std::int64_t numel, std::int64_t slice_len, double* partial) {
  __shared__ double sums[kNormThreads];
  const std::int64_t example = blockIdx.x;
  const std::int64_t lo = static_cast<std::int64_t>(blockIdx.y) * slice_len;
  const std::int64_t hi = lo + slice_len < numel ? lo + slice_len : numel;
  const std::int64_t row = example * numel;
  double acc = 0.0;
  for (std::int64_t j = lo + threadIdx.x; j < hi; j += kNormThreads) {
    acc = __dadd_rn(acc, __dmul_rn(load(a, row + j, dtype), load(b, row + j, dtype)));
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kNormThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[example * gridDim.y + blockIdx.y] = sums[0];
}

// out[j] = float32(sum_i factors[i] * rows[i * numel + j]): one thread per column j at a time
// (a grid-stride loop; consecutive threads read consecutive elements of each row), the products
// and the sum over i = 0, 1, ... in float64, one rounding to float32. The row dtype is a
// template parameter, so the load's dtype switch folds away.
template <DType kRow>
__global__ void weighted_rows_kernel(const void* rows, const double* factors, std::int64_t batch,
                                     std::int64_t numel, float* out) {
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < numel; j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (std::int64_t i = 0; i < batch; ++i) {
      acc = __dadd_rn(acc, __dmul_rn(factors[i], load(rows, i * numel + j, kRow)));
    }
    out[j] = __double2float_rn(acc);
  }
}

// One thread per block of the noise stream (noise_stream.hpp's layout): block b of chunk
// c = b / 16, lane l = b mod 16, owns elements c * chunk + 16 m + l, m < normals per block
// (10 for float32 / bfloat16 buffers, 8 for float64): the CPU's elements and normals exactly.
// Consecutive threads touch consecutive elements for each m (coalesced in runs of 16).
template <bool kFloat64>
__device__ __forceinline__ void block_noise(const NoiseStream& stream, std::uint32_t block,
                                            double (&z)[kFloat64 ? noise::kF64NormalsPerBlock
                                                                 : noise::kF32NormalsPerBlock]) {
  if constexpr (kFloat64) {
    noise::block_normals_f64(stream, block, z);
  } else {
    float zf[noise::kF32NormalsPerBlock];
    noise::block_normals_f32(stream, block, zf);
    for (int m = 0; m < noise::kF32NormalsPerBlock; ++m) z[m] = static_cast<double>(zf[m]);
  }
}

// The stream blocks of a buffer of numel elements, and the first element of block b (its
// others follow every kLanes elements).
template <bool kFloat64>
struct StreamLayout {
  static constexpr int kNormals =
      kFloat64 ? noise::kF64NormalsPerBlock : noise::kF32NormalsPerBlock;
  static constexpr std::int64_t kChunk = noise::kLanes * kNormals;
  __device__ static std::int64_t blocks(std::int64_t numel) {
    return (numel + kChunk - 1) / kChunk * noise::kLanes;
  }
  __device__ static std::int64_t first_element(std::int64_t b) {
    return (b / noise::kLanes) * kChunk + b % noise::kLanes;
  }
};

std::int64_t stream_blocks(std::int64_t numel, bool float64) {
  const std::int64_t chunk = float64 ? noise::kF64ChunkElements : noise::kF32ChunkElements;
  return (numel + chunk - 1) / chunk * noise::kLanes;
}

unsigned grid_for(std::int64_t work, int threads) {
  const std::int64_t blocks = (work + threads - 1) / threads;
  // Grid-stride loops: cap the grid (enough blocks to fill any current GPU many times over).
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

// An element as stored, without widening: float for float32 and bfloat16 buffers (bfloat16 ->
// float is exact), double for float64. Widened to double where it is used, exactly as load().
template <DType kDType>
using Stored = std::conditional_t<kDType == DType::kFloat64, double, float>;

template <DType kDType>
__device__ __forceinline__ Stored<kDType> load_stored(const void* p, std::int64_t i) {
  if constexpr (kDType == DType::kFloat64) {
    return static_cast<const double*>(p)[i];
  } else if constexpr (kDType == DType::kFloat32) {
    return static_cast<const float*>(p)[i];
  } else {
    return __uint_as_float(static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i])
                           << 16);
  }
}

// Up to kRowsTableBuffers row buffers of one multi-buffer call (norms or weighted sums), by
// value (1.6 KB of kernel parameters): buffer k holds `batch` rows of numel[k] elements.
constexpr int kRowsTableBuffers = 32;
struct RowsTable {
  const void* rows[kRowsTableBuffers];
  std::int64_t numel[kRowsTableBuffers];
  DType dtype[kRowsTableBuffers];
  double scale[kRowsTableBuffers];
  float* out[kRowsTableBuffers];
  std::int64_t first_column[kRowsTableBuffers + 1];  // weighted sums: columns numbered in turn
  int count;
};

// One block per (buffer k, example i, slice s) of the table: the slice s of example i's row of
// buffer k (numel[k] elements cut into `slices` equal slices) squared and summed in float64 by
// a grid-stride loop and a fixed-shape tree, as dot_partials_kernel does for one buffer;
// partial[(k * batch + i) * slices + s].
__global__ void sq_norm_partials_many_kernel(RowsTable table, std::int64_t batch, int slices,
                                             double* partial) {
  __shared__ double sums[kNormThreads];
  const std::int64_t block = blockIdx.x;
  const int k = static_cast<int>(block / (batch * slices));
  const std::int64_t example = (block / slices) % batch;
  const std::int64_t slice = block % slices;
  const std::int64_t numel = table.numel[k];
  const std::int64_t slice_len = (numel + slices - 1) / slices;
  const std::int64_t lo = slice * slice_len;
  const std::int64_t hi = lo + slice_len < numel ? lo + slice_len : numel;
  const std::int64_t row = example * numel;
  const DType dtype = table.dtype[k];
  double acc = 0.0;
  for (std::int64_t j = lo + threadIdx.x; j < hi; j += kNormThreads) {
    const double v = load(table.rows[k], row + j, dtype);
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kNormThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[block] = sums[0];
}

// weighted_rows_kernel over every column of a table of buffers of one row dtype: the thread of
// global column c finds its buffer k (binary search over first_column) and writes
// out[k][j] = float32(sum_i (factors[i] scale[k]) rows[k][i numel[k] + j]), j = c -
// first_column[k]: the weights' float64 product, then the products and the sum over i = 0, 1,
// ... in float64, one rounding, as weighted_rows_kernel does with the weights scaled first.
template <DType kRow>
__global__ void weighted_rows_many_kernel(RowsTable table, const double* factors,
                                          std::int64_t batch) {
  const std::int64_t columns = table.first_column[table.count];
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       c < columns; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    int lo = 0, hi = table.count - 1;  // the last k with first_column[k] <= c
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table.first_column[mid] <= c) lo = mid; else hi = mid - 1;
    }
    const std::int64_t numel = table.numel[lo];
    const std::int64_t j = c - table.first_column[lo];
    const double scale = table.scale[lo];
    const void* rows = table.rows[lo];
    double acc = 0.0;
    for (std::int64_t i = 0; i < batch; ++i) {
      acc = __dadd_rn(acc, __dmul_rn(__dmul_rn(factors[i], scale), load(rows, i * numel + j, kRow)));
    }
    table.out[lo][j] = __double2float_rn(acc);
  }
}

// The buffer's dtype and whether per-example rows are accumulated are template parameters, so
// that the noise-only release (the common call: no rows, base = out) compiles to a kernel
// without the row loop and the dtype switches: 46 instead of 76 registers per thread (float32)
// and a fully unrolled element loop (bench/noise_kernel_variants.cu's simplified kernel: 1,439
// against 1,020 GB/s on an H200). Each thread first issues the loads of its block's base
// elements and only then draws the block's normals, so that the memory latency is hidden behind
// the arithmetic: with the loads after the draw, 76% of the warps' stall cycles on an H100 were
// waits for those loads (Nsight Compute; bench/noise_kernel_variants.cu compares both orders).
// The operations on each element, and their order, are the same, so are the bits.
//
// accumulate_noise_block is the work of one thread on stream block b of one buffer, shared by
// the one-buffer kernel and the release of many buffers (release_noise_kernel), so that both
// write the same bits.
template <DType kDType, bool kPerExample>
__device__ __forceinline__ void accumulate_noise_block(const void* per_example,
                                                       const double* factors, std::int64_t batch,
                                                       const void* base, void* out,
                                                       std::int64_t numel, double noise_std,
                                                       const NoiseStream& stream, double scale,
                                                       std::int64_t b) {
  constexpr bool kFloat64 = kDType == DType::kFloat64;
  using Layout = StreamLayout<kFloat64>;
  constexpr int kNormals = Layout::kNormals;
  const std::int64_t first = Layout::first_element(b);
  Stored<kDType> stored[kNormals];
#pragma unroll
  for (int m = 0; m < kNormals; ++m) {
    const std::int64_t j = first + noise::kLanes * m;
    stored[m] = (base != nullptr && j < numel) ? load_stored<kDType>(base, j) : Stored<kDType>(0);
  }
  double z[kNormals];
  if (noise_std != 0.0) block_noise<kFloat64>(stream, static_cast<std::uint32_t>(b), z);
#pragma unroll
  for (int m = 0; m < kNormals; ++m) {
    const std::int64_t j = first + noise::kLanes * m;
    if (j < numel) {
      double acc = static_cast<double>(stored[m]);
      if constexpr (kPerExample) {
        for (std::int64_t i = 0; i < batch; ++i) {
          acc = __dadd_rn(acc, __dmul_rn(factors[i], load(per_example, i * numel + j, kDType)));
        }
      }
      if (noise_std != 0.0) acc = __dadd_rn(acc, __dmul_rn(noise_std, z[m]));
      store(out, j, __dmul_rn(acc, scale), kDType);
    }
  }
}

template <DType kDType, bool kPerExample>
__global__ void clip_accumulate_noise_kernel(const void* per_example, const double* factors,
                                             std::int64_t batch, const void* base, void* out,
                                             std::int64_t numel, double noise_std,
                                             NoiseStream stream, double scale) {
  const std::int64_t blocks = StreamLayout<kDType == DType::kFloat64>::blocks(numel);
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < blocks; b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    accumulate_noise_block<kDType, kPerExample>(per_example, factors, batch, base, out, numel,
                                                noise_std, stream, scale, b);
  }
}

// Up to kReleaseTableBuffers buffers of one dtype, passed to the kernel by value (2.3 KB, under
// the 4 KB a kernel's parameters may take): their stream blocks numbered one after the other,
// buffer k owning blocks first_block[k] .. first_block[k + 1] - 1.
constexpr int kReleaseTableBuffers = 64;
struct ReleaseTable {
  std::int64_t first_block[kReleaseTableBuffers + 1];
  const void* base[kReleaseTableBuffers];
  void* out[kReleaseTableBuffers];
  std::int64_t numel[kReleaseTableBuffers];
  std::uint32_t parameter[kReleaseTableBuffers];
  int count;
};

// The release of a table of buffers in one launch: the thread of global block b finds its
// buffer (binary search over first_block) and does that buffer's block b - first_block[k], with
// the buffer's own stream (its parameter index), exactly as the one-buffer kernel would.
template <DType kDType>
__global__ void release_noise_kernel(ReleaseTable table, double noise_std, NoiseStream stream,
                                     double scale) {
  const std::int64_t blocks = table.first_block[table.count];
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < blocks; b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    int lo = 0, hi = table.count - 1;  // the last k with first_block[k] <= b
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table.first_block[mid] <= b) lo = mid; else hi = mid - 1;
    }
    NoiseStream own = stream;
    own.parameter = table.parameter[lo];
    accumulate_noise_block<kDType, false>(nullptr, nullptr, 0, table.base[lo], table.out[lo],
                                          table.numel[lo], noise_std, own, scale,
                                          b - table.first_block[lo]);
  }
}

template <DType kDType>
void launch_release_table(const ReleaseTable& table, double noise_std, const NoiseStream& stream,
                          double scale, cudaStream_t s) {
  constexpr int kThreads = 256;
  release_noise_kernel<kDType><<<grid_for(table.first_block[table.count], kThreads), kThreads, 0,
                                 s>>>(table, noise_std, stream, scale);
}

template <DType kDType, bool kPerExample>
void launch_clip_accumulate_noise(const void* per_example, const double* factors,
                                  std::int64_t batch, const void* base, void* out,
                                  std::int64_t numel, double noise_std,
                                  const NoiseStream& stream, double scale, cudaStream_t s) {
  constexpr int kThreads = 256;
  const unsigned grid = grid_for(stream_blocks(numel, kDType == DType::kFloat64), kThreads);
  clip_accumulate_noise_kernel<kDType, kPerExample><<<grid, kThreads, 0, s>>>(
      per_example, factors, batch, base, out, numel, noise_std, stream, scale);
}

template <DType kDType>
void launch_for_dtype(const void* per_example, const double* factors, std::int64_t batch,
                      const void* base, void* out, std::int64_t numel, double noise_std,
                      const NoiseStream& stream, double scale, cudaStream_t s) {
  if (per_example != nullptr && batch > 0) {
    launch_clip_accumulate_noise<kDType, true>(per_example, factors, batch, base, out, numel,
                                               noise_std, stream, scale, s);
  } else {
    launch_clip_accumulate_noise<kDType, false>(nullptr, nullptr, 0, base, out, numel,
                                                noise_std, stream, scale, s);
  }
}

template <bool kFloat64>
__global__ void gaussian_kernel(NoiseStream stream, std::int64_t numel, void* out) {
  using Layout = StreamLayout<kFloat64>;
  constexpr int kNormals = Layout::kNormals;
  const std::int64_t blocks = Layout::blocks(numel);
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < blocks; b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t first = Layout::first_element(b);
    double z[kNormals];
    block_noise<kFloat64>(stream, static_cast<std::uint32_t>(b), z);
    for (int m = 0; m < kNormals; ++m) {
      const std::int64_t j = first + noise::kLanes * m;
      if (j >= numel) break;
      if constexpr (kFloat64) {
        static_cast<double*>(out)[j] = z[m];
      } else {
        static_cast<float*>(out)[j] = static_cast<float>(z[m]);  // exact: a float32 normal
      }
    }
  }
}


}  // namespace

void per_example_sq_norms(const void* per_example, DType dtype, std::int64_t batch,
                          std::int64_t numel, double* out, void* stream) {
  if (batch <= 0) return;
  if (batch > 2147483647) throw std::invalid_argument("batch must be < 2^31 on CUDA");
  auto s = static_cast<cudaStream_t>(stream);
  sq_norms_kernel<<<static_cast<unsigned>(batch), kNormThreads, 0, s>>>(per_example, dtype,
                                                                        numel, out);
  check(cudaGetLastError(), "per_example_sq_norms launch");
}

void per_example_dot_partials(const void* a, const void* b, DType dtype, std::int64_t batch,
                              std::int64_t numel, int slices, double* partial, void* stream) {
  if (batch <= 0) return;
  if (batch > 2147483647) throw std::invalid_argument("batch must be < 2^31 on CUDA");
  if (slices < 1 || slices > 65535) throw std::invalid_argument("slices must be in [1, 65535]");
  const std::int64_t slice_len = numel > 0 ? (numel + slices - 1) / slices : 0;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(slices));
  dot_partials_kernel<<<grid, kNormThreads, 0, s>>>(a, b, dtype, numel, slice_len, partial);
  check(cudaGetLastError(), "per_example_dot_partials launch");
}

void weighted_rows_to_float32(const void* rows, DType row_dtype, const double* factors,
                              std::int64_t batch, std::int64_t numel, float* out, void* stream) {
  if (numel <= 0) return;
  if (row_dtype == DType::kFloat64) {
    throw std::invalid_argument("weighted_rows_to_float32 reads float32 or bfloat16 rows");
  }
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = grid_for(numel, kThreads);
  if (row_dtype == DType::kBFloat16) {
    weighted_rows_kernel<DType::kBFloat16><<<grid, kThreads, 0, s>>>(rows, factors, batch, numel,
                                                                     out);
  } else {
    weighted_rows_kernel<DType::kFloat32><<<grid, kThreads, 0, s>>>(rows, factors, batch, numel,
                                                                    out);
  }
  check(cudaGetLastError(), "weighted_rows_to_float32 launch");
}

void per_example_sq_norms_many(const RowsBuffer* buffers, std::int64_t count,
                               std::int64_t batch, int slices, double* partial, void* stream) {
  if (count <= 0 || batch <= 0) return;
  if (slices < 1 || slices > 1024) throw std::invalid_argument("slices must be in [1, 1024]");
  if (batch * slices * kRowsTableBuffers > 2147483647) {
    throw std::invalid_argument("batch * slices must be < 2^26 on CUDA");
  }
  auto s = static_cast<cudaStream_t>(stream);
  for (std::int64_t first = 0; first < count; first += kRowsTableBuffers) {
    RowsTable table{};
    table.count = static_cast<int>(count - first < kRowsTableBuffers ? count - first
                                                                      : kRowsTableBuffers);
    for (int k = 0; k < table.count; ++k) {
      const RowsBuffer& buffer = buffers[first + k];
      if (buffer.numel < 0) throw std::invalid_argument("numel must be >= 0");
      table.rows[k] = buffer.rows;
      table.numel[k] = buffer.numel;
      table.dtype[k] = buffer.dtype;
    }
    const std::int64_t blocks = static_cast<std::int64_t>(table.count) * batch * slices;
    sq_norm_partials_many_kernel<<<static_cast<unsigned>(blocks), kNormThreads, 0, s>>>(
        table, batch, slices, partial + first * batch * slices);
    check(cudaGetLastError(), "per_example_sq_norms_many launch");
  }
}

void weighted_rows_many(const RowsBuffer* buffers, std::int64_t count, std::int64_t batch,
                        const double* factors, void* stream) {
  if (count <= 0) return;
  for (std::int64_t k = 0; k < count; ++k) {
    if (buffers[k].numel < 0) throw std::invalid_argument("numel must be >= 0");
    if (buffers[k].dtype == DType::kFloat64) {
      throw std::invalid_argument("weighted_rows_many reads float32 or bfloat16 rows");
    }
  }
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(stream);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    RowsTable table{};
    const auto flush = [&] {
      const std::int64_t columns = table.first_column[table.count];
      if (table.count > 0 && columns > 0) {
        if (dtype == DType::kBFloat16) {
          weighted_rows_many_kernel<DType::kBFloat16>
              <<<grid_for(columns, kThreads), kThreads, 0, s>>>(table, factors, batch);
        } else {
          weighted_rows_many_kernel<DType::kFloat32>
              <<<grid_for(columns, kThreads), kThreads, 0, s>>>(table, factors, batch);
        }
        check(cudaGetLastError(), "weighted_rows_many launch");
      }
      table.count = 0;
    };
    for (std::int64_t k = 0; k < count; ++k) {
      const RowsBuffer& buffer = buffers[k];
      if (buffer.dtype != dtype || buffer.numel == 0) continue;
      const int slot = table.count;
      table.rows[slot] = buffer.rows;
      table.numel[slot] = buffer.numel;
      table.dtype[slot] = buffer.dtype;
      table.scale[slot] = buffer.scale;
      table.out[slot] = buffer.out;
      table.first_column[slot + 1] = table.first_column[slot] + buffer.numel;
      table.count = slot + 1;
      if (table.count == kRowsTableBuffers) flush();
    }
    flush();
  }
}

void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           void* cuda_stream) {
  if (numel <= 0) return;
  if (numel > kMaxNoiseElements) {
    throw std::invalid_argument("numel must be <= 128 * 2^28 (the noise block counter)");
  }
  auto s = static_cast<cudaStream_t>(cuda_stream);
  switch (dtype) {
    case DType::kFloat32:
      launch_for_dtype<DType::kFloat32>(per_example, factors, batch, base, out, numel, noise_std,
                                        stream, scale, s);
      break;
    case DType::kFloat64:
      launch_for_dtype<DType::kFloat64>(per_example, factors, batch, base, out, numel, noise_std,
                                        stream, scale, s);
      break;
    default:
      launch_for_dtype<DType::kBFloat16>(per_example, factors, batch, base, out, numel,
                                         noise_std, stream, scale, s);
  }
  check(cudaGetLastError(), "clip_accumulate_noise launch");
}

void release_noise(const ReleaseBuffer* buffers, std::int64_t count, double noise_std,
                   const NoiseStream& stream, double scale, void* cuda_stream) {
  for (std::int64_t k = 0; k < count; ++k) {
    if (buffers[k].numel < 0 || buffers[k].numel > kMaxNoiseElements) {
      throw std::invalid_argument("numel must be in [0, 128 * 2^28] (the noise block counter)");
    }
    if (buffers[k].base_dtype != buffers[k].dtype) {
      throw std::invalid_argument("on CUDA a release buffer's base has its out's dtype");
    }
  }
  auto s = static_cast<cudaStream_t>(cuda_stream);
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    ReleaseTable table{};
    const auto flush = [&] {
      if (table.count == 0 || table.first_block[table.count] == 0) {
        table.count = 0;
        return;
      }
      switch (dtype) {
        case DType::kFloat32:
          launch_release_table<DType::kFloat32>(table, noise_std, stream, scale, s);
          break;
        case DType::kFloat64:
          launch_release_table<DType::kFloat64>(table, noise_std, stream, scale, s);
          break;
        default:
          launch_release_table<DType::kBFloat16>(table, noise_std, stream, scale, s);
      }
      check(cudaGetLastError(), "release_noise launch");
      table.count = 0;
    };
    for (std::int64_t k = 0; k < count; ++k) {
      const ReleaseBuffer& buffer = buffers[k];
      if (buffer.dtype != dtype || buffer.numel == 0) continue;
      const int slot = table.count;
      table.first_block[slot + 1] =
          table.first_block[slot] + stream_blocks(buffer.numel, dtype == DType::kFloat64);
      table.base[slot] = buffer.base;
      table.out[slot] = buffer.out;
      table.numel[slot] = buffer.numel;
      table.parameter[slot] = buffer.parameter;
      table.count = slot + 1;
      if (table.count == kReleaseTableBuffers) flush();
    }
    flush();
  }
}

void gaussian_noise(const NoiseStream& stream, std::int64_t numel, bool float64, void* out,
                    void* cuda_stream) {
  if (numel <= 0) return;
  if (numel > kMaxNoiseElements) {
    throw std::invalid_argument("numel must be <= 128 * 2^28 (the noise block counter)");
  }
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(cuda_stream);
  if (float64) {
    gaussian_kernel<true><<<grid_for(stream_blocks(numel, true), kThreads), kThreads, 0, s>>>(
        stream, numel, out);
  } else {
    gaussian_kernel<false><<<grid_for(stream_blocks(numel, false), kThreads), kThreads, 0, s>>>(
        stream, numel, out);
  }
  check(cudaGetLastError(), "gaussian_noise launch");
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

}  // namespace dpsharp::clip::cuda
