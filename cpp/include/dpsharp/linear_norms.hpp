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
// pairs counted twice), computes the tile's dot products a_t . a_s and g_t . g_s with fused
// multiply-adds, register-blocked and vectorised over the features, and accumulates the
// weighted products in float64. Cost per example ~ T^2 (d + p) / 2 multiply-adds and no
// memory beyond the inputs.
//
// The dot products (Gram entries) are accumulated either
//   kFloat32Blocks (float32 inputs only): in float32 lanes over blocks of m = kFloat32BlockSteps
//     products per lane, each block's lanes summed in float32 (a tree of at most 4 levels) and
//     the blocks' sums added in float64, so that a Gram entry x . y of n features errs by at
//     most
//       kappa_n sum_k |x_k y_k| + (1 + kappa_n) n 2^-150 <= kappa_n ||x|| ||y|| + ...,
//       kappa_n = (1 + gamma_{m+4}(2^-24)) (1 + gamma_{ceil(n / (8 m))}(2^-53)) - 1,
//     gamma_k(u) = k u / (1 - k u) (Higham 2002, "Accuracy and Stability of Numerical
//     Algorithms", 2nd ed., eq. (3.4) and Lemma 3.1: every product passes through at most
//     m + 4 float32 roundings, fused or not, and, every build having at least 8 lanes, at most
//     ceil(n / (8 m)) float64 ones; the n 2^-150 is float32's underflow, at most half its
//     smallest subnormal spacing once per product, as additions that underflow are exact), or
//   kFloat64: in float64 (float32 rows widened as they are loaded: every product exact), so
//     that an entry errs by at most gamma_n(2^-53) ||x|| ||y||.
// float64 inputs always take kFloat64. The float32 blocks run faster (twice the lanes per
// register, no conversion per load); a product or sum past float32's range gives a non-finite
// result, which a caller recomputes with kFloat64.
//
// Each example is computed by one thread, so the result does not depend on the thread count.
// The AVX-512, AVX2 and portable builds of the kernel round differently (different tile
// shapes and lane counts, the same block length m and the same bound): results agree to
// float rounding, not bit for bit.
#pragma once

#include <cstdint>

namespace dpsharp::linear_norms {

enum class Isa { kAvx512, kAvx2, kPortable };

// How the Gram entries are accumulated (see above).
enum class Accumulation { kFloat32Blocks, kFloat64 };

// Products per float32 lane in one block of kFloat32Blocks accumulation (the m of the bound).
inline constexpr int kFloat32BlockSteps = 16;

// Whether this CPU can run the implementation `isa`.
bool isa_supported(Isa isa) noexcept;

// The best implementation this CPU supports (AVX-512, then AVX2, then portable).
Isa best_isa() noexcept;

// weight_sq[i] = sum_{t,s} (a_it . a_is)(g_it . g_is) for i < batch, and, when bias_sq is not
// null, bias_sq[i] = sum_{t,s} g_it . g_is, with a contiguous (batch, positions, in_features)
// and g contiguous (batch, positions, out_features). Element is float or double; any sizes
// >= 0. `isa` must be supported (isa_supported). `accumulation` applies to float32 inputs.
template <typename Element>
void sequence_sq_norms(Isa isa, Accumulation accumulation, const Element* a, const Element* g,
                       std::int64_t batch, std::int64_t positions, std::int64_t in_features,
                       std::int64_t out_features, double* weight_sq, double* bias_sq,
                       int threads);

}  // namespace dpsharp::linear_norms
