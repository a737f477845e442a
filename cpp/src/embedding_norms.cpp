// Embedding per-example norms and clipped sums (embedding_norms.hpp).
//
// The loops are plain C++ over float64 lanes that the compiler vectorises; the per-thread
// bodies are compiled three times (AVX-512, AVX2, baseline) and picked at run time. No FMA
// (-ffp-contract=off) and a fixed lane count, so every build gives the same bits.
#include "dpsharp/embedding_norms.hpp"

#include <algorithm>
#include <atomic>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpsharp/parallel.hpp"

namespace dpsharp::embedding_norms {
namespace {

// Elements touched per call below which a second thread costs more than it saves.
constexpr std::int64_t kMinElementsPerThread = std::int64_t{1} << 15;
constexpr int kLanes = 8;

// sum_j row[j]^2 in float64, over kLanes lanes then a fixed tree.
template <typename Element>
__attribute__((always_inline)) inline double row_sq_norm(const Element* row,
                                                         std::int64_t features) noexcept {
  double lanes[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= features; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double v = static_cast<double>(row[j + l]);
      lanes[l] += v * v;
    }
  }
  for (int l = 0; j < features; ++j, ++l) {
    const double v = static_cast<double>(row[j]);
    lanes[l] += v * v;
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// The same for a float64 scratch row.
__attribute__((always_inline)) inline double sum_sq(const double* row,
                                                    std::int64_t features) noexcept {
  return row_sq_norm(row, features);
}

// Per-example norms of examples [lo, hi). `order` is scratch for `positions` entries and
// `row_sum` for `features`.
template <typename Element>
__attribute__((always_inline)) inline void norms_range(
    const std::int64_t* indices, const Element* out_grads, std::int64_t lo, std::int64_t hi,
    std::int64_t positions, std::int64_t features, std::int64_t padding_idx, double* out,
    std::int64_t* order, double* row_sum) noexcept {
  for (std::int64_t i = lo; i < hi; ++i) {
    const std::int64_t* idx = indices + i * positions;
    const Element* rows = out_grads + i * positions * features;
    std::int64_t count = 0;
    for (std::int64_t t = 0; t < positions; ++t) {
      if (idx[t] != padding_idx) order[count++] = t;
    }
    // Group equal indices; ties by position, so the order (hence every sum) is fixed.
    std::sort(order, order + count, [idx](std::int64_t x, std::int64_t y) {
      return idx[x] < idx[y] || (idx[x] == idx[y] && x < y);
    });
    double total = 0.0;
    for (std::int64_t begin = 0; begin < count;) {
      std::int64_t end = begin + 1;
      while (end < count && idx[order[end]] == idx[order[begin]]) ++end;
      if (end - begin == 1) {
        total += row_sq_norm(rows + order[begin] * features, features);
      } else {
        for (std::int64_t j = 0; j < features; ++j) row_sum[j] = 0.0;
        for (std::int64_t k = begin; k < end; ++k) {
          const Element* row = rows + order[k] * features;
          for (std::int64_t j = 0; j < features; ++j) row_sum[j] += static_cast<double>(row[j]);
        }
        total += sum_sq(row_sum, features);
      }
      begin = end;
    }
    out[i] = total;
  }
}

// Rows [lo, hi) of the clipped sum from the positions grouped by row (row_start, by_row).
template <typename Element>
__attribute__((always_inline)) inline void rows_range(
    const Element* out_grads, const double* factors, std::int64_t positions,
    std::int64_t features, const std::int64_t* row_start, const std::int64_t* by_row,
    std::int64_t lo, std::int64_t hi, Element* out, double* row_sum, bool accumulate) noexcept {
  for (std::int64_t v = lo; v < hi; ++v) {
    Element* dst = out + v * features;
    const std::int64_t begin = row_start[v];
    const std::int64_t end = row_start[v + 1];
    if (begin == end) {
      if (!accumulate) std::fill(dst, dst + features, Element{0});
      continue;
    }
    if (end - begin == 1) {
      const std::int64_t q = by_row[begin];
      const double c = factors[q / positions];
      const Element* src = out_grads + q * features;
      if (accumulate) {
        for (std::int64_t j = 0; j < features; ++j) {
          dst[j] = static_cast<Element>(static_cast<double>(dst[j]) +
                                        c * static_cast<double>(src[j]));
        }
      } else {
        for (std::int64_t j = 0; j < features; ++j) {
          dst[j] = static_cast<Element>(c * static_cast<double>(src[j]));
        }
      }
      continue;
    }
    if (accumulate) {
      for (std::int64_t j = 0; j < features; ++j) row_sum[j] = static_cast<double>(dst[j]);
    } else {
      for (std::int64_t j = 0; j < features; ++j) row_sum[j] = 0.0;
    }
    for (std::int64_t k = begin; k < end; ++k) {
      const std::int64_t q = by_row[k];
      const double c = factors[q / positions];
      const Element* src = out_grads + q * features;
      for (std::int64_t j = 0; j < features; ++j) row_sum[j] += c * static_cast<double>(src[j]);
    }
    for (std::int64_t j = 0; j < features; ++j) dst[j] = static_cast<Element>(row_sum[j]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename Element>
__attribute__((target("avx512f"))) void norms_range_avx512(
    const std::int64_t* indices, const Element* out_grads, std::int64_t lo, std::int64_t hi,
    std::int64_t positions, std::int64_t features, std::int64_t padding_idx, double* out,
    std::int64_t* order, double* row_sum) noexcept {
  norms_range(indices, out_grads, lo, hi, positions, features, padding_idx, out, order,
              row_sum);
}
template <typename Element>
__attribute__((target("avx2"))) void norms_range_avx2(
    const std::int64_t* indices, const Element* out_grads, std::int64_t lo, std::int64_t hi,
    std::int64_t positions, std::int64_t features, std::int64_t padding_idx, double* out,
    std::int64_t* order, double* row_sum) noexcept {
  norms_range(indices, out_grads, lo, hi, positions, features, padding_idx, out, order,
              row_sum);
}
template <typename Element>
__attribute__((target("avx512f"))) void rows_range_avx512(
    const Element* out_grads, const double* factors, std::int64_t positions,
    std::int64_t features, const std::int64_t* row_start, const std::int64_t* by_row,
    std::int64_t lo, std::int64_t hi, Element* out, double* row_sum, bool accumulate) noexcept {
  rows_range(out_grads, factors, positions, features, row_start, by_row, lo, hi, out, row_sum,
             accumulate);
}
template <typename Element>
__attribute__((target("avx2"))) void rows_range_avx2(
    const Element* out_grads, const double* factors, std::int64_t positions,
    std::int64_t features, const std::int64_t* row_start, const std::int64_t* by_row,
    std::int64_t lo, std::int64_t hi, Element* out, double* row_sum, bool accumulate) noexcept {
  rows_range(out_grads, factors, positions, features, row_start, by_row, lo, hi, out, row_sum,
             accumulate);
}
#endif

// 2: AVX-512, 1: AVX2, 0: baseline.
int isa_level() noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int level = __builtin_cpu_supports("avx512f") ? 2
                           : __builtin_cpu_supports("avx2")  ? 1
                                                             : 0;
  return level;
#else
  return 0;
#endif
}

template <typename Element>
void norms_dispatch(const std::int64_t* indices, const Element* out_grads, std::int64_t lo,
                    std::int64_t hi, std::int64_t positions, std::int64_t features,
                    std::int64_t padding_idx, double* out, std::int64_t* order,
                    double* row_sum) noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  const int level = isa_level();
  if (level == 2) {
    return norms_range_avx512(indices, out_grads, lo, hi, positions, features, padding_idx, out,
                              order, row_sum);
  }
  if (level == 1) {
    return norms_range_avx2(indices, out_grads, lo, hi, positions, features, padding_idx, out,
                            order, row_sum);
  }
#endif
  norms_range(indices, out_grads, lo, hi, positions, features, padding_idx, out, order,
              row_sum);
}

template <typename Element>
void rows_dispatch(const Element* out_grads, const double* factors, std::int64_t positions,
                   std::int64_t features, const std::int64_t* row_start,
                   const std::int64_t* by_row, std::int64_t lo, std::int64_t hi, Element* out,
                   double* row_sum, bool accumulate) noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  const int level = isa_level();
  if (level == 2) {
    return rows_range_avx512(out_grads, factors, positions, features, row_start, by_row, lo,
                             hi, out, row_sum, accumulate);
  }
  if (level == 1) {
    return rows_range_avx2(out_grads, factors, positions, features, row_start, by_row, lo, hi,
                           out, row_sum, accumulate);
  }
#endif
  rows_range(out_grads, factors, positions, features, row_start, by_row, lo, hi, out, row_sum,
             accumulate);
}

}  // namespace

void check_indices(const std::int64_t* indices, std::int64_t count, std::int64_t num_rows) {
  for (std::int64_t q = 0; q < count; ++q) {
    if (indices[q] < 0 || indices[q] >= num_rows) {
      throw std::invalid_argument("indices must lie in [0, " + std::to_string(num_rows) +
                                  "), the rows of the weight; found " +
                                  std::to_string(indices[q]) + " at flat position " +
                                  std::to_string(q));
    }
  }
}

template <typename Element>
void per_example_sq_norms(const std::int64_t* indices, const Element* out_grads,
                          std::int64_t batch, std::int64_t positions, std::int64_t features,
                          std::int64_t num_rows, std::int64_t padding_idx, double* out,
                          int threads) {
  check_indices(indices, batch * positions, num_rows);
  const std::int64_t per_example = std::max<std::int64_t>(1, positions * (features + 8));
  // parallel_ranges' work must not throw (it may run on an OpenMP team): a failed scratch
  // allocation is reported after the join instead.
  std::atomic<bool> out_of_memory{false};
  parallel_ranges(batch, std::max<std::int64_t>(1, kMinElementsPerThread / per_example), threads,
                  [&](std::int64_t lo, std::int64_t hi) {
    std::vector<std::int64_t> order;
    std::vector<double> row_sum;
    try {
      order.resize(static_cast<std::size_t>(positions));
      row_sum.resize(static_cast<std::size_t>(features));
    } catch (const std::bad_alloc&) {
      out_of_memory.store(true, std::memory_order_relaxed);
      return;
    }
    norms_dispatch(indices, out_grads, lo, hi, positions, features, padding_idx, out,
                   order.data(), row_sum.data());
  });
  if (out_of_memory.load()) throw std::bad_alloc();
}

template <typename Element>
void clipped_sum(const std::int64_t* indices, const Element* out_grads, const double* factors,
                 std::int64_t batch, std::int64_t positions, std::int64_t features,
                 std::int64_t num_rows, std::int64_t padding_idx, Element* out, bool accumulate,
                 int threads) {
  const std::int64_t count = batch * positions;
  check_indices(indices, count, num_rows);
  // The positions grouped by row, each group in (i, t) order (a counting sort):
  // by_row[row_start[v] .. row_start[v + 1]) are the flat positions that look up row v.
  std::vector<std::int64_t> row_start(static_cast<std::size_t>(num_rows) + 1, 0);
  for (std::int64_t q = 0; q < count; ++q) {
    if (indices[q] != padding_idx) ++row_start[static_cast<std::size_t>(indices[q]) + 1];
  }
  for (std::int64_t v = 0; v < num_rows; ++v) row_start[v + 1] += row_start[v];
  std::vector<std::int64_t> by_row(static_cast<std::size_t>(row_start[num_rows]));
  {
    std::vector<std::int64_t> cursor(row_start.begin(), row_start.end() - 1);
    for (std::int64_t q = 0; q < count; ++q) {
      if (indices[q] != padding_idx) by_row[cursor[indices[q]]++] = q;
    }
  }
  std::atomic<bool> out_of_memory{false};
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinElementsPerThread / std::max<std::int64_t>(features, 1));
  parallel_ranges(num_rows, grain, threads, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<double> row_sum;
    try {
      row_sum.resize(static_cast<std::size_t>(features));
    } catch (const std::bad_alloc&) {
      out_of_memory.store(true, std::memory_order_relaxed);
      return;
    }
    rows_dispatch(out_grads, factors, positions, features, row_start.data(), by_row.data(), lo,
                  hi, out, row_sum.data(), accumulate);
  });
  if (out_of_memory.load()) throw std::bad_alloc();
}

template void per_example_sq_norms<float>(const std::int64_t*, const float*, std::int64_t,
                                          std::int64_t, std::int64_t, std::int64_t,
                                          std::int64_t, double*, int);
template void per_example_sq_norms<double>(const std::int64_t*, const double*, std::int64_t,
                                           std::int64_t, std::int64_t, std::int64_t,
                                           std::int64_t, double*, int);
template void clipped_sum<float>(const std::int64_t*, const float*, const double*, std::int64_t,
                                 std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*,
                                 bool, int);
template void clipped_sum<double>(const std::int64_t*, const double*, const double*,
                                  std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                  std::int64_t, double*, bool, int);

}  // namespace dpsharp::embedding_norms
