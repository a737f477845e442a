// Where the CUDA noise pass spends its time (bench/bench_gpu.py measures the production kernel;
// this separates its parts). Each variant writes out[j] = scale * (out[j] + sigma * z_j) over N
// float32 elements with the stream layout of cpp/cuda/clip_kernels.cu, or a part of that work:
//   production   float64 arithmetic and one rounding, as clip_kernels.cu (bit-exact to the CPU):
//                each thread loads its block's elements first, then draws the block's normals
//   loads_late   the same with each element loaded after the draw (the earlier order)
//   bounds4      production under __launch_bounds__(256, 4) (at most 64 registers per thread)
//   chacha_only  the ChaCha8 words only (their sum per block written), no Box-Muller
//   copy         out[j] = scale * out[j] (the memory traffic alone)
// Build and run on a CUDA machine from the repository root:
//   nvcc -std=c++17 -O3 -arch=sm_90 -fmad=false -Icpp/include bench/noise_kernel_variants.cu \
//        -o /tmp/noise_variants && /tmp/noise_variants
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "dpsharp/noise_stream.hpp"

using dpsharp::noise::StreamKey;
namespace noise = dpsharp::noise;
constexpr int kN = noise::kF32NormalsPerBlock;

template <int kMinBlocks, bool kLoadFirst>
__global__ void __launch_bounds__(256, kMinBlocks)
    noise_pass(float* out, std::int64_t numel, double sigma, StreamKey s, double scale) {
  const std::int64_t blocks = (numel + noise::kF32ChunkElements - 1) /
                              noise::kF32ChunkElements * noise::kLanes;
  for (std::int64_t b = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; b < blocks;
       b += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t first = (b / noise::kLanes) * noise::kF32ChunkElements + b % noise::kLanes;
    float stored[kN];
    if constexpr (kLoadFirst) {
#pragma unroll
      for (int m = 0; m < kN; ++m) {
        const std::int64_t j = first + noise::kLanes * m;
        stored[m] = j < numel ? out[j] : 0.0f;
      }
    }
    float z[kN];
    noise::block_normals_f32(s, static_cast<std::uint32_t>(b), z);
#pragma unroll
    for (int m = 0; m < kN; ++m) {
      const std::int64_t j = first + noise::kLanes * m;
      if (j < numel) {
        const float x = kLoadFirst ? stored[m] : out[j];
        const double acc = __dadd_rn(double(x), __dmul_rn(sigma, double(z[m])));
        out[j] = __double2float_rn(__dmul_rn(acc, scale));
      }
    }
  }
}

__global__ void chacha_only(float* out, std::int64_t numel, StreamKey s) {
  const std::int64_t blocks = (numel + noise::kF32ChunkElements - 1) /
                              noise::kF32ChunkElements * noise::kLanes;
  for (std::int64_t b = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; b < blocks;
       b += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint32_t w[16];
    noise::chacha_block<noise::kChaChaRounds>(s, static_cast<std::uint32_t>(b), w);
    std::uint32_t acc = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) acc += w[i];
    out[b] = static_cast<float>(acc);  // keep the words live; writes numel/10 elements
  }
}

__global__ void copy_pass(float* out, std::int64_t numel, float scale) {
  for (std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; j < numel;
       j += std::int64_t(gridDim.x) * blockDim.x) {
    out[j] *= scale;
  }
}

template <typename Launch>
float best_ms(Launch launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e30f;
  for (int rep = 0; rep < 12; ++rep) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (rep >= 2 && ms < best) best = ms;
  }
  return best;
}

int main() {
  const std::int64_t n = std::int64_t(1) << 28;
  float* out = nullptr;
  if (cudaMalloc(&out, n * sizeof(float)) != cudaSuccess) return 1;
  cudaMemset(out, 0, n * sizeof(float));
  StreamKey s{};
  for (int i = 0; i < 8; ++i) s.key[i] = 0x9E3779B9u * (i + 1);
  const std::int64_t blocks = (n + noise::kF32ChunkElements - 1) / noise::kF32ChunkElements *
                              noise::kLanes;
  const unsigned grid = static_cast<unsigned>((blocks + 255) / 256 < 65536 ? (blocks + 255) / 256
                                                                            : 65536);
  const double bytes = 8.0 * double(n);
  struct Row { const char* name; float ms; };
  Row rows[] = {
      {"production", best_ms([&] { noise_pass<1, true><<<grid, 256>>>(out, n, 1.0, s, 0.5); })},
      {"loads_late", best_ms([&] { noise_pass<1, false><<<grid, 256>>>(out, n, 1.0, s, 0.5); })},
      {"bounds4", best_ms([&] { noise_pass<4, true><<<grid, 256>>>(out, n, 1.0, s, 0.5); })},
      {"chacha_only", best_ms([&] { chacha_only<<<grid, 256>>>(out, n, s); })},
      {"copy", best_ms([&] { copy_pass<<<65536, 256>>>(out, n, 0.5f); })},
  };
  if (cudaGetLastError() != cudaSuccess) return 2;
  std::printf("N = %lld float32 elements; GB/s counts 8 bytes per element\n", (long long)n);
  for (const Row& r : rows) {
    std::printf("%-12s %8.3f ms  %7.0f GB/s  %6.1f G normals/s\n", r.name, r.ms,
                bytes / (r.ms * 1e6), double(n) / (r.ms * 1e6));
  }
  cudaFree(out);
  return 0;
}
