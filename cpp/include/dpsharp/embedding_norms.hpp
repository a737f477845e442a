// Per-example gradient norms and clipped sums of an embedding layer y_{i,t} = W[idx_{i,t}].
//
// Example i's gradient is g_i(W) = sum_t onehot(idx_{i,t}) gy_{i,t}^T: row v of it is the sum
// of the output gradients at the positions where example i looked up row v (Goodfellow 2015,
// "Efficient per-example gradient computations"). So
//   ||g_i(W)||^2 = sum_v ||sum_{t: idx_{i,t} = v} gy_{i,t}||^2
//                = sum_t ||gy_{i,t}||^2 + 2 sum_{t < s, idx_{i,t} = idx_{i,s}} gy_{i,t} . gy_{i,s},
// and the clipped sum sum_i c_i g_i(W) (book-keeping: Bu et al., ICML 2023) has row
//   out[v] = sum_{(i,t): idx_{i,t} = v} c_i gy_{i,t},
// with no per-example gradient ever formed. Positions that look up `padding_idx` contribute
// nothing (torch's embedding gives the padding row no gradient); padding_idx < 0 means none.
//
// Both kernels compute in float64 and do not depend on the thread count: the norms split the
// examples over threads (each example's sum is one thread's, in a fixed order), the clipped sum
// splits the rows of `out` (each row's sum runs over its positions in (i, t) order).
#pragma once

#include <cstdint>

namespace dpsharp::embedding_norms {

// Throws std::invalid_argument naming the first entry of indices[0, count) outside
// [0, num_rows). Both kernels call it before touching anything.
void check_indices(const std::int64_t* indices, std::int64_t count, std::int64_t num_rows);

// out[i] = ||g_i(W)||^2 (float64) for i < batch, with indices contiguous (batch, positions)
// and out_grads contiguous (batch, positions, features). Element is float or double. Groups
// the positions of one example by row (a sort of its `positions` indices) and sums each row's
// output gradients in float64 before squaring.
template <typename Element>
void per_example_sq_norms(const std::int64_t* indices, const Element* out_grads,
                          std::int64_t batch, std::int64_t positions, std::int64_t features,
                          std::int64_t num_rows, std::int64_t padding_idx, double* out,
                          int threads);

// out (num_rows, features), contiguous, every row written: row v = sum over the positions
// (i, t) with indices[i, t] = v of factors[i] * out_grads[i, t], in float64 in (i, t) order,
// rounded once to Element; rows nobody looked up (and the padding row) are zero. With
// `accumulate`, the sum starts from out's row instead (out[v] += ..., one rounding) and rows
// nobody looked up are left as they are.
template <typename Element>
void clipped_sum(const std::int64_t* indices, const Element* out_grads, const double* factors,
                 std::int64_t batch, std::int64_t positions, std::int64_t features,
                 std::int64_t num_rows, std::int64_t padding_idx, Element* out, bool accumulate,
                 int threads);

}  // namespace dpsharp::embedding_norms
