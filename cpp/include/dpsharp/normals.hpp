// Bulk standard normals of one counter-based noise stream (philox.hpp): the hot loop of the
// fused clip-and-noise kernel, vectorised. Every implementation (AVX-512 and AVX2 intrinsics,
// portable GCC vector extensions, scalar) evaluates exactly the IEEE operations of philox.hpp,
// so all give the same bits as the scalar header, the CUDA kernels and the pure-torch reference
// (python/dpsharp/torch/kernels.py).
#pragma once

#include <cstdint>

#include "dpsharp/clip.hpp"

namespace dpsharp::clip {

// z[j] = standard normal number (first + j) of `stream`, for j in [0, count). first and count
// must be even (whole Box-Muller pairs); pair indices wrap modulo 2^32 like the counter word.
// Uses the widest instruction set of this CPU (AVX-512, AVX2, else portable vector code).
void fill_normals(const NoiseStream& stream, std::int64_t first, std::int64_t count,
                  double* z) noexcept;

// The implementations, for tests that check each gives the same bits.
enum class NormalsIsa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
bool normals_isa_supported(NormalsIsa isa) noexcept;
// fill_normals with the given implementation, which must be supported.
void fill_normals_with(NormalsIsa isa, const NoiseStream& stream, std::int64_t first,
                       std::int64_t count, double* z) noexcept;

}  // namespace dpsharp::clip
