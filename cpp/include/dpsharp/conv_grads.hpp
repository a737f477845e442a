// Per-example weight gradients of a convolution (groups = 1) without a batch of patches: for
// every example b, out_b = G_b P_b, with G_b its (out_channels x positions) output gradient and
// P_b its (positions x channels * kernel_h * kernel_w) patch matrix (patches.hpp), which is
// built for one example at a time in a per-thread scratch buffer and multiplied there by a
// register-blocked small matrix product. This replaces "patches of a chunk of examples, then a
// batched matrix product" (several small library calls per chunk). Sums over positions run in
// order in the element type (like torch's float32 matmuls); each example is computed by one
// thread, so the result does not depend on the thread count.
#pragma once

#include <cstdint>

#include "dpsharp/patches.hpp"

namespace dpsharp::conv_grads {

// out[b, o, r] = sum_p out_grads[b, o, p] * patches_b[p, r] for b < geometry.batch,
// o < out_channels, r < channels * kernel_h * kernel_w, p < out_h * out_w. in is the
// contiguous (batch, channels, in_h, in_w) input, out_grads the contiguous
// (batch, out_channels, out_h, out_w) output gradient, out contiguous. Element is float or
// double. Throws std::bad_alloc if a thread's scratch (out_h * out_w * channels * kernel_h *
// kernel_w elements) cannot be allocated.
template <typename Element>
void per_example_weight_grads(const Element* in, const Element* out_grads,
                              const patches::ConvGeometry& geometry, std::int64_t out_channels,
                              Element* out, int threads);

}  // namespace dpsharp::conv_grads
