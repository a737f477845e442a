// Flat clipping's per-example norms and clip factors from the per-layer squared-norm terms, in
// one pass over the batch (Abadi et al. 2016, Algorithm 1: g_i <- g_i / max(1, ||g_i|| / C)).
// What it replaces is a dozen tiny tensor operations per step (stack, sum, finiteness check,
// sqrt, clamp, divide, clamp) on B float64 values each, whose dispatch costs far more than the
// arithmetic. Plain C++ over raw pointers, like clip.hpp.
#pragma once

#include <cstdint>

namespace dpsharp::clip {

// One layer's contribution to ||g_i||^2: coef * x[i] * (y[i] + y_offset), or coef * x[i] when
// y is null. (A 2-D linear layer's weight and bias together: coef = loss scale^2,
// x = ||dL/dy_i||^2, y = ||a_i||^2, y_offset = 1, since ||g_i(W)||^2 + ||g_i(b)||^2 =
// ||dL/dy_i||^2 (||a_i||^2 + 1).)
struct SqNormTerm {
  const double* x;
  const double* y;  // may be null
  double y_offset;
  double coef;
};

// For i < batch: total_i = sum over terms k, in order k = 0, 1, ..., of
// coef_k * (x_k[i] * (y_k[i] + y_offset_k)) (coef_k * x_k[i] without y), each operation one
// IEEE double rounding; norms[i] = sqrt(total_i); factors[i] = min(1, bound / norms[i]), which
// is 1 for a zero norm (bound / 0 = inf). Returns false, with the outputs unspecified, if any
// total_i is NaN or infinite (a non-finite gradient, or squares that overflow). bound > 0.
bool flat_clip_factors(const SqNormTerm* terms, std::int64_t count, std::int64_t batch,
                       double bound, double* norms, double* factors) noexcept;

}  // namespace dpsharp::clip
