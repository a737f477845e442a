// Bulk standard normals of one noise stream (noise_stream.hpp): the hot loop of the fused
// clip-and-noise kernel. Every implementation (AVX-512 on 16 lanes, AVX2 on 8, portable on 1)
// instantiates the same template body of noise_stream.hpp, so all give the same bits as each
// other, as the CUDA kernels and as the pure-torch reference (python/dpsharp/torch/kernels.py).
#pragma once

#include <cstdint>

#include "dpsharp/clip.hpp"

namespace dpsharp::clip {

// The implementations, widest first; tests check that each gives the same bits.
enum class NormalsIsa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
bool normals_isa_supported(NormalsIsa isa) noexcept;
// The widest implementation this CPU runs (decided once).
NormalsIsa best_normals_isa() noexcept;

// z[j] = standard normal number first + j of the float32 / float64 stream of `stream`, for
// j in [0, count); first + count must not exceed kMaxNoiseElements. `isa` must be supported.
void normals_f32(NormalsIsa isa, const NoiseStream& stream, std::int64_t first,
                 std::int64_t count, float* z) noexcept;
void normals_f64(NormalsIsa isa, const NoiseStream& stream, std::int64_t first,
                 std::int64_t count, double* z) noexcept;

}  // namespace dpsharp::clip
