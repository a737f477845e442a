// Per-example convolution weight gradients (conv_grads.hpp).
//
// The product out_b (O x R) = G_b (O x L) P_b (L x R) is computed in tiles of kRows output
// channels by kCols patch columns whose accumulators stay in registers: for each position p,
// one row of P_b (kCols contiguous elements) is loaded once and used for kRows channels. The
// inner loops are plain C++ that the compiler vectorises; the body is compiled three times
// (AVX-512, AVX2, baseline) and picked at run time. No FMA: -ffp-contract=off keeps one
// rounding per multiply and add, so every build computes the same sums.
#include "dpsharp/conv_grads.hpp"

#include <algorithm>
#include <atomic>
#include <new>
#include <vector>

#include "dpsharp/parallel.hpp"

namespace dpsharp::conv_grads {
namespace {

constexpr std::int64_t kRows = 4;

template <typename Element>
constexpr std::int64_t kCols = 256 / sizeof(Element);  // 64 floats or 32 doubles: 4 zmm

// c (rows x cols, leading dimension ldc) = a (rows x inner, leading dimension lda) times
// b (inner x cols, leading dimension ldb), for a full kRows x kCols tile.
template <typename Element>
__attribute__((always_inline)) inline void full_tile(const Element* a, std::int64_t lda,
                                                     const Element* b, std::int64_t ldb,
                                                     std::int64_t inner, Element* c,
                                                     std::int64_t ldc) noexcept {
  constexpr std::int64_t cols = kCols<Element>;
  Element acc[kRows][cols] = {};
  for (std::int64_t p = 0; p < inner; ++p) {
    const Element* b_row = b + p * ldb;
    for (std::int64_t r = 0; r < kRows; ++r) {
      const Element scale = a[r * lda + p];
      for (std::int64_t j = 0; j < cols; ++j) acc[r][j] += scale * b_row[j];
    }
  }
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (std::int64_t j = 0; j < cols; ++j) c[r * ldc + j] = acc[r][j];
  }
}

// Any tile (the edges): the same sums in the same order, without the register blocking.
template <typename Element>
inline void edge_tile(const Element* a, std::int64_t lda, const Element* b, std::int64_t ldb,
                      std::int64_t inner, Element* c, std::int64_t ldc, std::int64_t rows,
                      std::int64_t cols) noexcept {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < cols; ++j) c[r * ldc + j] = Element{0};
    for (std::int64_t p = 0; p < inner; ++p) {
      const Element scale = a[r * lda + p];
      const Element* b_row = b + p * ldb;
      for (std::int64_t j = 0; j < cols; ++j) c[r * ldc + j] += scale * b_row[j];
    }
  }
}

template <typename Element>
__attribute__((always_inline)) inline void small_product(const Element* a, const Element* b,
                                                         Element* c, std::int64_t rows,
                                                         std::int64_t inner,
                                                         std::int64_t cols) noexcept {
  constexpr std::int64_t tile_cols = kCols<Element>;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const std::int64_t tile_rows = std::min(kRows, rows - r0);
    for (std::int64_t j0 = 0; j0 < cols; j0 += tile_cols) {
      const std::int64_t width = std::min(tile_cols, cols - j0);
      if (tile_rows == kRows && width == tile_cols) {
        full_tile(a + r0 * inner, inner, b + j0, cols, inner, c + r0 * cols + j0, cols);
      } else {
        edge_tile(a + r0 * inner, inner, b + j0, cols, inner, c + r0 * cols + j0, cols,
                  tile_rows, width);
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename Element>
__attribute__((target("avx512f"))) void small_product_avx512(const Element* a, const Element* b,
                                                             Element* c, std::int64_t rows,
                                                             std::int64_t inner,
                                                             std::int64_t cols) noexcept {
  small_product(a, b, c, rows, inner, cols);
}
template <typename Element>
__attribute__((target("avx2"))) void small_product_avx2(const Element* a, const Element* b,
                                                        Element* c, std::int64_t rows,
                                                        std::int64_t inner,
                                                        std::int64_t cols) noexcept {
  small_product(a, b, c, rows, inner, cols);
}
#endif

template <typename Element>
void small_product_dispatch(const Element* a, const Element* b, Element* c, std::int64_t rows,
                            std::int64_t inner, std::int64_t cols) noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int level = __builtin_cpu_supports("avx512f") ? 2
                           : __builtin_cpu_supports("avx2")  ? 1
                                                             : 0;
  if (level == 2) return small_product_avx512(a, b, c, rows, inner, cols);
  if (level == 1) return small_product_avx2(a, b, c, rows, inner, cols);
#endif
  small_product(a, b, c, rows, inner, cols);
}

}  // namespace

template <typename Element>
void per_example_weight_grads(const Element* in, const Element* out_grads,
                              const patches::ConvGeometry& g, std::int64_t out_channels,
                              Element* out, int threads) {
  const std::int64_t positions = g.out_h * g.out_w;
  const std::int64_t row = g.channels * g.kernel_h * g.kernel_w;
  const std::int64_t image = g.channels * g.in_h * g.in_w;
  // Work per example ~ out_channels * positions * row multiply-adds: a second thread from
  // about 2^18 of them.
  const std::int64_t work = std::max<std::int64_t>(1, out_channels * positions * row);
  // parallel_ranges' work must not throw (it may run on an OpenMP team): a failed scratch
  // allocation is reported after the join instead.
  std::atomic<bool> out_of_memory{false};
  parallel_ranges(g.batch, std::max<std::int64_t>(1, (1 << 18) / work), threads,
                  [&](std::int64_t lo, std::int64_t hi) {
    std::vector<Element> patch_matrix;
    try {
      patch_matrix.resize(static_cast<std::size_t>(positions * row));
    } catch (const std::bad_alloc&) {
      out_of_memory.store(true, std::memory_order_relaxed);
      return;
    }
    for (std::int64_t b = lo; b < hi; ++b) {
      patches::example_patches(in + b * image, g, patch_matrix.data());
      small_product_dispatch(out_grads + b * out_channels * positions, patch_matrix.data(),
                             out + b * out_channels * row, out_channels, positions, row);
    }
  });
  if (out_of_memory.load()) throw std::bad_alloc();
}

template void per_example_weight_grads<float>(const float*, const float*,
                                              const patches::ConvGeometry&, std::int64_t,
                                              float*, int);
template void per_example_weight_grads<double>(const double*, const double*,
                                               const patches::ConvGeometry&, std::int64_t,
                                               double*, int);

}  // namespace dpsharp::conv_grads
