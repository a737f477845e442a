// Per-example squared gradient norms of a linear layer y = x W^T + b applied to sequences,
// without materialising the per-example gradients or the Gram matrices.
//
// For example i with activations A_i (T x d) and output gradients G_i (T x p), both row-major,
// the per-example gradients are g_i(W) = G_i^T A_i and g_i(b) = sum_t g_t, so
//   ||g_i(W)||_F^2 = sum_{t,s} (a_t . a_s)(g_t . g_s) = <A_i A_i^T, G_i G_i^T>_F
//   ||g_i(b)||^2   = sum_{t,s} (g_t . g_s)
// (Goodfellow 2015, "Efficient per-example gradient computations"; the "ghost norm" of
// Li et al., ICLR 2022, "Large language models can be strong differentially private
// learners", section 4). The kernel visits the pairs t <= s in small square tiles (off-diagonal
// pairs counted twice), computes the tile's dot products a_t . a_s and g_t . g_s in float64
// (float32 rows are widened as they are loaded, so every product is exact) with fused
// multiply-adds, register-blocked and vectorised over the features, and accumulates the
// weighted products in float64. Cost per example ~ T^2 (d + p) / 2
// multiply-adds and no memory beyond the inputs. (A float32 variant, FMA lanes summing blocks of
// 16 products flushed to float64, with the norm raised by that arithmetic's a-priori bound, ran
// 1.3-1.8x faster on AVX2 but moved whole DP steps of the bench transformers by less than their
// noise, and its bound, about 1.2e-6 T of the squared norm, clipped contributions visibly below
// C; it was not kept.)
//
// Each example is computed by one thread, so the result does not depend on the thread count.
// The AVX-512, AVX2 and portable builds of the kernel round differently (different tile
// shapes and lane counts): results agree to float rounding, not bit for bit.
#pragma once

#include <cstdint>

namespace dpsharp::linear_norms {

enum class Isa { kAvx512, kAvx2, kPortable };

// Whether this CPU can run the implementation `isa`.
bool isa_supported(Isa isa) noexcept;

// The best implementation this CPU supports (AVX-512, then AVX2, then portable).
Isa best_isa() noexcept;

// weight_sq[i] = sum_{t,s} (a_it . a_is)(g_it . g_is) for i < batch, and, when bias_sq is not
// null, bias_sq[i] = sum_{t,s} g_it . g_is, with a contiguous (batch, positions, in_features)
// and g contiguous (batch, positions, out_features). Element is float or double; any sizes
// >= 0. `isa` must be supported (isa_supported).
template <typename Element>
void sequence_sq_norms(Isa isa, const Element* a, const Element* g, std::int64_t batch,
                       std::int64_t positions, std::int64_t in_features,
                       std::int64_t out_features, double* weight_sq, double* bias_sq,
                       int threads);

}  // namespace dpsharp::linear_norms
