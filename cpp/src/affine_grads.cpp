// Per-example gradients of a layer normalisation's affine parameters (affine_grads.hpp). The
// accumulation loop over the features is plain C++ built for AVX-512 / AVX2 / the baseline
// (vector_width.hpp); every build computes the same float64 sums in the same order.
#include "dpsharp/affine_grads.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "dpsharp/parallel.hpp"
#include "dpsharp/vector_width.hpp"

namespace dpsharp::affine_grads {
namespace {

// Adds row r of example i to the float64 accumulators: w_acc[n] += g[n] (x[n] - m) s and
// b_acc[n] += g[n] (either accumulator may be null).
template <typename Element>
__attribute__((always_inline)) inline void add_row(const Element* x, const Element* g, double m,
                                                   double s, std::int64_t features,
                                                   double* w_acc, double* b_acc) noexcept {
  if (w_acc) {
    for (std::int64_t n = 0; n < features; ++n) {
      w_acc[n] += static_cast<double>(g[n]) * ((static_cast<double>(x[n]) - m) * s);
    }
  }
  if (b_acc) {
    for (std::int64_t n = 0; n < features; ++n) b_acc[n] += static_cast<double>(g[n]);
  }
}

#define DPSHARP_ROW_BUILDS(Element, suffix)                                                  \
  __attribute__((always_inline)) inline void add_row_##suffix##_body(                       \
      const Element* x, const Element* g, double m, double s, std::int64_t features,         \
      double* w_acc, double* b_acc) noexcept {                                               \
    add_row<Element>(x, g, m, s, features, w_acc, b_acc);                                    \
  }                                                                                          \
  DPSHARP_WIDTH_BUILDS(add_row_##suffix,                                                     \
                       (const Element* x, const Element* g, double m, double s,              \
                        std::int64_t features, double* w_acc, double* b_acc),                \
                       (x, g, m, s, features, w_acc, b_acc))
DPSHARP_ROW_BUILDS(float, f32)
DPSHARP_ROW_BUILDS(double, f64)
#undef DPSHARP_ROW_BUILDS

template <typename Element>
void add_row_dispatch(Width width, const Element* x, const Element* g, double m, double s,
                      std::int64_t features, double* w_acc, double* b_acc) noexcept {
  if constexpr (std::is_same_v<Element, float>) {
    DPSHARP_WIDTH_DISPATCH(width, add_row_f32, x, g, m, s, features, w_acc, b_acc)
  } else {
    DPSHARP_WIDTH_DISPATCH(width, add_row_f64, x, g, m, s, features, w_acc, b_acc)
  }
}

}  // namespace

template <typename Element>
void layer_norm_rows(const Element* x, const Element* mean, const Element* rstd, const Element* g,
                     std::int64_t batch, std::int64_t rows, std::int64_t features,
                     Element* weight_rows, Element* bias_rows, int threads) {
  const Width width = vector_width();
  const std::int64_t per_example = std::max<std::int64_t>(1, rows * features);
  parallel_ranges(batch, std::max<std::int64_t>(1, (1 << 16) / per_example), threads,
                  [&](std::int64_t lo, std::int64_t hi) {
    std::vector<double> acc(static_cast<std::size_t>(2 * features));
    double* w_acc = weight_rows ? acc.data() : nullptr;
    double* b_acc = bias_rows ? acc.data() + features : nullptr;
    for (std::int64_t i = lo; i < hi; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t at = (i * rows + r) * features;
        add_row_dispatch(width, x + at, g + at, static_cast<double>(mean[i * rows + r]),
                         static_cast<double>(rstd[i * rows + r]), features, w_acc, b_acc);
      }
      for (std::int64_t n = 0; n < features; ++n) {
        if (w_acc) weight_rows[i * features + n] = static_cast<Element>(w_acc[n]);
        if (b_acc) bias_rows[i * features + n] = static_cast<Element>(b_acc[n]);
      }
    }
  });
}

template void layer_norm_rows<float>(const float*, const float*, const float*, const float*,
                                     std::int64_t, std::int64_t, std::int64_t, float*, float*,
                                     int);
template void layer_norm_rows<double>(const double*, const double*, const double*,
                                      const double*, std::int64_t, std::int64_t, std::int64_t,
                                      double*, double*, int);

}  // namespace dpsharp::affine_grads
