// Per-example gradients of the affine part of a layer normalisation, y = xhat * w + b with
// xhat = (x - mean) * rstd (Ba, Kiros, Hinton 2016), without forming xhat.
//
// With the input viewed as (batch, rows, features) (rows: every position the weight is shared
// over, e.g. a sequence; features: the normalised shape, which w and b have) and the statistics
// of each row, example i's gradients are
//   g_i(w)[n] = sum_r g[i, r, n] (x[i, r, n] - mean[i, r]) rstd[i, r]
//   g_i(b)[n] = sum_r g[i, r, n]
// computed in one pass over x and g, in float64, and rounded once to the element type. One
// thread per example: the result does not depend on the thread count.
#pragma once

#include <cstdint>

namespace dpsharp::affine_grads {

// weight_rows / bias_rows (batch x features, either may be null) from contiguous
// x, g (batch, rows, features) and mean, rstd (batch, rows). Element is float or double.
template <typename Element>
void layer_norm_rows(const Element* x, const Element* mean, const Element* rstd, const Element* g,
                     std::int64_t batch, std::int64_t rows, std::int64_t features,
                     Element* weight_rows, Element* bias_rows, int threads);

}  // namespace dpsharp::affine_grads
