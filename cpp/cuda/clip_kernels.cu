// CUDA kernels of clip_cuda.hpp: per-example squared norms and the fused
// scale-accumulate-noise-write pass with in-kernel Philox noise (philox.hpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dpsharp/clip_cuda.hpp"
#include "dpsharp/philox.hpp"

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

// One thread per Box-Muller pair: elements 2k and 2k + 1 share block (k, parameter, release,
// rank), exactly as on the CPU.
__global__ void clip_accumulate_noise_kernel(const void* per_example, const double* factors,
                                             std::int64_t batch, const void* base, void* out,
                                             DType dtype, std::int64_t numel, double noise_std,
                                             NoiseStream stream, double scale) {
  const std::int64_t pairs = (numel + 1) / 2;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < pairs; k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j0 = 2 * k;
    const bool two = j0 + 1 < numel;
    double a0 = base ? load(base, j0, dtype) : 0.0;
    double a1 = (base && two) ? load(base, j0 + 1, dtype) : 0.0;
    if (per_example) {
      for (std::int64_t i = 0; i < batch; ++i) {
        const double c = factors[i];
        const std::int64_t row = i * numel;
        a0 = __dadd_rn(a0, __dmul_rn(c, load(per_example, row + j0, dtype)));
        if (two) a1 = __dadd_rn(a1, __dmul_rn(c, load(per_example, row + j0 + 1, dtype)));
      }
    }
    if (noise_std != 0.0) {
      double z0, z1;
      philox::gaussian_pair(stream.key0, stream.key1, static_cast<std::uint32_t>(k),
                            stream.parameter, stream.release, stream.rank, z0, z1);
      a0 = __dadd_rn(a0, __dmul_rn(noise_std, z0));
      a1 = __dadd_rn(a1, __dmul_rn(noise_std, z1));
    }
    store(out, j0, __dmul_rn(a0, scale), dtype);
    if (two) store(out, j0 + 1, __dmul_rn(a1, scale), dtype);
  }
}

__global__ void gaussian_kernel(NoiseStream stream, std::int64_t numel, double* out) {
  const std::int64_t pairs = (numel + 1) / 2;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < pairs; k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double z0, z1;
    philox::gaussian_pair(stream.key0, stream.key1, static_cast<std::uint32_t>(k),
                          stream.parameter, stream.release, stream.rank, z0, z1);
    out[2 * k] = z0;
    if (2 * k + 1 < numel) out[2 * k + 1] = z1;
  }
}

unsigned grid_for(std::int64_t work, int threads) {
  const std::int64_t blocks = (work + threads - 1) / threads;
  // Grid-stride loops: cap the grid (enough blocks to fill any current GPU many times over).
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
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

void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           void* cuda_stream) {
  if (numel <= 0) return;
  if ((numel + 1) / 2 > 4294967296LL) {
    throw std::invalid_argument("numel must be < 2^33 (the pair index is one 32-bit word)");
  }
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(cuda_stream);
  clip_accumulate_noise_kernel<<<grid_for((numel + 1) / 2, kThreads), kThreads, 0, s>>>(
      per_example, factors, batch, base, out, dtype, numel, noise_std, stream, scale);
  check(cudaGetLastError(), "clip_accumulate_noise launch");
}

void gaussian_noise(const NoiseStream& stream, std::int64_t numel, double* out,
                    void* cuda_stream) {
  if (numel <= 0) return;
  constexpr int kThreads = 256;
  auto s = static_cast<cudaStream_t>(cuda_stream);
  gaussian_kernel<<<grid_for((numel + 1) / 2, kThreads), kThreads, 0, s>>>(stream, numel, out);
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
