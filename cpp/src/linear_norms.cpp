// Per-example squared norms of a linear layer on sequences (linear_norms.hpp).
//
// One body (tile_dots, example_norms) is written over a small "lanes" type V that supplies a
// register type and five operations: zero, load, load of the first `count` elements (the rest
// zero: the masked tail of a row), fused multiply-add, and the horizontal sums of a tile's
// accumulators. The body is compiled three times, with V = 512-bit registers (AVX-512F),
// 256-bit registers (AVX2 + FMA) and four plain lanes (portable: the compiler vectorises it
// for the baseline ISA; a multiply and an add, no FMA), each inside a wrapper that carries the
// matching target attribute and is `flatten`ed, so that the body and V's operations are all
// inlined into it (V's operations need that target; the body on its own has none, which is
// also why -Wpsabi is silenced below: no vector ever crosses a call).
//
// Tiles: kTile x kTile pairs (t, s) with t in [t0, t0 + kTile), s in [s0, s0 + kTile),
// s0 >= t0, so that only the upper triangle of the two Gram matrices is visited. The tile's
// kTile^2 dot products of activation rows and of output-gradient rows are accumulated in
// kTile^2 registers (AVX-512: 4 x 4 = 16 of the 32 zmm registers, plus 8 for the rows), each
// row chunk loaded once per tile. Pairs below the diagonal of a diagonal tile and rows past
// the end of the sequence (the last block reads the last row again) get weight 0, the
// diagonal weight 1, the rest 2.
//
// Rounding: every Gram entry is accumulated in float64, float32 inputs included: the float32
// lane types load a row chunk and widen it to float64 lanes (exact), so each product x_k y_k
// of two float32 numbers is exact and only the float64 sums round. A Gram entry is a sum over
// the features per lane, then over the lanes in a fixed tree; the products P_ts Q_ts and their
// weighted sums are float64, per tile entry, then in a fixed order. (A float32 accumulator
// would round each entry by up to gamma_d ||a_t|| ||a_s||, gamma_d ~ d 2^-24, and where an
// example's positions cancel, sum_{t,s} P_ts Q_ts is far smaller than the entries it is formed
// from: a constructed 16-position example lost 9% of its squared norm, so its clipped
// contribution reached 1.047 C. In float64 the same bound is ~ d 2^-53 ||a_t|| ||a_s||.)
// -ffp-contract=off does not affect the explicit FMA intrinsics.
#include "dpsharp/linear_norms.hpp"

#include <algorithm>
#include <stdexcept>

#include "dpsharp/parallel.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define DPSHARP_NORMS_X86 1
#include <immintrin.h>
#else
#define DPSHARP_NORMS_X86 0
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12 flags the intentionally undefined pass-through operand of its own avx512fintrin.h
// unpack intrinsics (a known false positive, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dpsharp::linear_norms {
namespace {

// Multiply-adds per call below which a second thread costs more than it saves.
constexpr std::int64_t kMinWorkPerThread = std::int64_t{1} << 18;

// products[e] += w[e] * (P[e] * Q[e]) and out_grams[e] += w[e] * Q[e] in float64, e < n.
inline void accumulate_entries(const double* gram_a, const double* gram_g, const double* w,
                               double* products, double* out_grams, int n) noexcept {
  for (int e = 0; e < n; ++e) {
    products[e] += w[e] * (gram_a[e] * gram_g[e]);
    out_grams[e] += w[e] * gram_g[e];
  }
}

// Four plain float64 lanes (loads widen float32); the compiler maps them onto whatever vectors
// the baseline ISA has.
template <typename Element>
struct PortableLanes {
  static constexpr int kLanes = 4;
  static constexpr int kTile = 3;
  struct Vec {
    double lane[kLanes];
  };
  static Vec zero() noexcept { return Vec{}; }
  static Vec load(const Element* p) noexcept {
    Vec v;
    for (int l = 0; l < kLanes; ++l) v.lane[l] = static_cast<double>(p[l]);
    return v;
  }
  static Vec load_first(const Element* p, std::int64_t count) noexcept {
    Vec v{};
    for (int l = 0; l < count; ++l) v.lane[l] = static_cast<double>(p[l]);
    return v;
  }
  static Vec fma(Vec x, Vec y, Vec acc) noexcept {
    for (int l = 0; l < kLanes; ++l) acc.lane[l] += x.lane[l] * y.lane[l];
    return acc;
  }
  static void sums(const Vec* acc, double* out) noexcept {
    for (int e = 0; e < kTile * kTile; ++e) {
      out[e] = (acc[e].lane[0] + acc[e].lane[1]) + (acc[e].lane[2] + acc[e].lane[3]);
    }
  }
  static void accumulate(const double* gram_a, const double* gram_g, const double* w,
                         double* products, double* out_grams) noexcept {
    accumulate_entries(gram_a, gram_g, w, products, out_grams, kTile * kTile);
  }
};

#if DPSHARP_NORMS_X86
#define DPSHARP_AVX2 __attribute__((target("avx2,fma")))
#define DPSHARP_AVX512 __attribute__((target("avx512f,fma")))

template <typename Element>
struct Avx2Lanes;

template <>
struct Avx2Lanes<double> {
  static constexpr int kLanes = 4;
  static constexpr int kTile = 3;
  using Vec = __m256d;
  DPSHARP_AVX2 static Vec zero() noexcept { return _mm256_setzero_pd(); }
  DPSHARP_AVX2 static Vec load(const double* p) noexcept { return _mm256_loadu_pd(p); }
  DPSHARP_AVX2 static Vec load_first(const double* p, std::int64_t count) noexcept {
    const __m256i mask =
        _mm256_cmpgt_epi64(_mm256_set1_epi64x(count), _mm256_setr_epi64x(0, 1, 2, 3));
    return _mm256_maskload_pd(p, mask);
  }
  DPSHARP_AVX2 static Vec fma(Vec x, Vec y, Vec acc) noexcept {
    return _mm256_fmadd_pd(x, y, acc);
  }
  DPSHARP_AVX2 static void sums(const Vec* acc, double* out) noexcept {
    for (int e = 0; e < kTile * kTile; ++e) {
      __m128d h = _mm_add_pd(_mm256_castpd256_pd128(acc[e]), _mm256_extractf128_pd(acc[e], 1));
      h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
      out[e] = _mm_cvtsd_f64(h);
    }
  }
  DPSHARP_AVX2 static void accumulate(const double* gram_a, const double* gram_g,
                                      const double* w, double* products,
                                      double* out_grams) noexcept {
    accumulate_entries(gram_a, gram_g, w, products, out_grams, kTile * kTile);
  }
};

// float32 rows widened to four float64 lanes per load (exact), so the Gram entries are float64
// sums of exact products; everything else is the float64 kernel's.
template <>
struct Avx2Lanes<float> : Avx2Lanes<double> {
  DPSHARP_AVX2 static Vec load(const float* p) noexcept {
    return _mm256_cvtps_pd(_mm_loadu_ps(p));
  }
  DPSHARP_AVX2 static Vec load_first(const float* p, std::int64_t count) noexcept {
    const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(count)),
                                         _mm_setr_epi32(0, 1, 2, 3));
    return _mm256_cvtps_pd(_mm_maskload_ps(p, mask));
  }
};

template <typename Element>
struct Avx512Lanes;

template <>
struct Avx512Lanes<double> {
  static constexpr int kLanes = 8;
  static constexpr int kTile = 4;
  using Vec = __m512d;
  DPSHARP_AVX512 static Vec zero() noexcept { return _mm512_setzero_pd(); }
  DPSHARP_AVX512 static Vec load(const double* p) noexcept { return _mm512_loadu_pd(p); }
  DPSHARP_AVX512 static Vec load_first(const double* p, std::int64_t count) noexcept {
    return _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << count) - 1u), p);
  }
  DPSHARP_AVX512 static Vec fma(Vec x, Vec y, Vec acc) noexcept {
    return _mm512_fmadd_pd(x, y, acc);
  }
  // Per 128-bit block k: [a_2k + a_2k+1, b_2k + b_2k+1].
  DPSHARP_AVX512 static Vec pair_sums(Vec a, Vec b) noexcept {
    return _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
  }
  DPSHARP_AVX512 static Vec block_sums(Vec u0, Vec u1) noexcept {
    return _mm512_add_pd(_mm512_shuffle_f64x2(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // out[e] = sum of the 8 lanes of acc[e], e < 16, eight accumulators per reduction tree.
  DPSHARP_AVX512 static void sums(const Vec* acc, double* out) noexcept {
    for (int half = 0; half < 2; ++half) {
      const Vec* h = acc + 8 * half;
      const Vec v0 = block_sums(pair_sums(h[0], h[1]), pair_sums(h[2], h[3]));
      const Vec v1 = block_sums(pair_sums(h[4], h[5]), pair_sums(h[6], h[7]));
      _mm512_storeu_pd(out + 8 * half, block_sums(v0, v1));
    }
  }
  DPSHARP_AVX512 static void accumulate(const double* gram_a, const double* gram_g,
                                        const double* w, double* products,
                                        double* out_grams) noexcept {
    for (int half = 0; half < 2; ++half) {
      const __m512d pa = _mm512_loadu_pd(gram_a + 8 * half);
      const __m512d pg = _mm512_loadu_pd(gram_g + 8 * half);
      const __m512d weight = _mm512_loadu_pd(w + 8 * half);
      _mm512_storeu_pd(products + 8 * half,
                       _mm512_add_pd(_mm512_loadu_pd(products + 8 * half),
                                     _mm512_mul_pd(weight, _mm512_mul_pd(pa, pg))));
      _mm512_storeu_pd(out_grams + 8 * half,
                       _mm512_add_pd(_mm512_loadu_pd(out_grams + 8 * half),
                                     _mm512_mul_pd(weight, pg)));
    }
  }
};
// float32 rows widened to eight float64 lanes per load (exact); see Avx2Lanes<float>.
template <>
struct Avx512Lanes<float> : Avx512Lanes<double> {
  DPSHARP_AVX512 static Vec load(const float* p) noexcept {
    return _mm512_cvtps_pd(_mm256_loadu_ps(p));
  }
  DPSHARP_AVX512 static Vec load_first(const float* p, std::int64_t count) noexcept {
    const __m512 head = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1u), p);
    return _mm512_cvtps_pd(_mm512_castps512_ps256(head));
  }
};
#endif  // DPSHARP_NORMS_X86

// out[r * kTile + c] = x_r . y_c over `width` elements, for the kTile rows x_r = x[r] and y_c.
template <class V, typename Element>
inline void tile_dots(const Element* const* x, const Element* const* y, std::int64_t width,
                      double* out) noexcept {
  constexpr int kTile = V::kTile;
  typename V::Vec acc[kTile * kTile];
  for (auto& entry : acc) entry = V::zero();
  std::int64_t k = 0;
  for (; k + V::kLanes <= width; k += V::kLanes) {
    typename V::Vec xs[kTile];
    typename V::Vec ys[kTile];
    for (int r = 0; r < kTile; ++r) xs[r] = V::load(x[r] + k);
    for (int c = 0; c < kTile; ++c) ys[c] = V::load(y[c] + k);
    for (int r = 0; r < kTile; ++r) {
      for (int c = 0; c < kTile; ++c) acc[r * kTile + c] = V::fma(xs[r], ys[c], acc[r * kTile + c]);
    }
  }
  if (k < width) {
    typename V::Vec xs[kTile];
    typename V::Vec ys[kTile];
    for (int r = 0; r < kTile; ++r) xs[r] = V::load_first(x[r] + k, width - k);
    for (int c = 0; c < kTile; ++c) ys[c] = V::load_first(y[c] + k, width - k);
    for (int r = 0; r < kTile; ++r) {
      for (int c = 0; c < kTile; ++c) acc[r * kTile + c] = V::fma(xs[r], ys[c], acc[r * kTile + c]);
    }
  }
  V::sums(acc, out);
}

// How often the pair (t, s) of an upper-triangle tile counts in sum_{t,s}: twice above the
// diagonal (the tile stands for (s, t) too), once on it, never below it or past the end.
inline double pair_weight(std::int64_t t, std::int64_t s, std::int64_t positions) noexcept {
  if (t >= positions || s >= positions || s < t) return 0.0;
  return s == t ? 1.0 : 2.0;
}

// Software prefetch of the next example's rows into L2, a few cache lines per tile, so that
// they arrive from memory while this example is computed. (The activations and output
// gradients were written long before, in the backward pass, and are rarely still in cache; the
// first sweep over an example would otherwise wait on memory: 0.3-0.6 ms per call at the bench
// transformer's shapes.)
class NextExample {
 public:
  NextExample() noexcept = default;
  NextExample(const void* a, std::int64_t a_bytes, const void* g, std::int64_t g_bytes,
              std::int64_t steps) noexcept
      : a_(static_cast<const char*>(a)),
        g_(static_cast<const char*>(g)),
        a_bytes_(a_bytes),
        total_bytes_(a_bytes + g_bytes),
        per_step_(((a_bytes + g_bytes) / kLine + steps) / std::max<std::int64_t>(steps, 1)) {}

  void step() noexcept {
    for (std::int64_t k = 0; k < per_step_ && offset_ < total_bytes_; ++k, offset_ += kLine) {
#if defined(__GNUC__)
      const char* line = offset_ < a_bytes_ ? a_ + offset_ : g_ + (offset_ - a_bytes_);
      __builtin_prefetch(line, 0, 2);
#endif
    }
  }

 private:
  static constexpr std::int64_t kLine = 64;
  const char* a_ = nullptr;
  const char* g_ = nullptr;
  std::int64_t a_bytes_ = 0;
  std::int64_t total_bytes_ = 0;
  std::int64_t per_step_ = 0;
  std::int64_t offset_ = 0;
};

template <class V, typename Element>
inline void example_norms(const Element* a, const Element* g, std::int64_t positions,
                          std::int64_t in_features, std::int64_t out_features, double* weight_sq,
                          double* bias_sq, NextExample& next) noexcept {
  constexpr int kTile = V::kTile;
  constexpr int kEntries = kTile * kTile;
  // Float64 sums per tile entry of w_ts P_ts Q_ts and w_ts Q_ts, summed over the entries in a
  // fixed order at the end.
  double products[kEntries] = {};
  double out_grams[kEntries] = {};
  double edge_weights[kEntries];
  double interior_weights[kEntries];
  for (auto& w : interior_weights) w = 2.0;
  double gram_a[kEntries];
  double gram_g[kEntries];
  const Element* a_t[kTile];
  const Element* g_t[kTile];
  const Element* a_s[kTile];
  const Element* g_s[kTile];
  for (std::int64_t t0 = 0; t0 < positions; t0 += kTile) {
    for (int r = 0; r < kTile; ++r) {
      const std::int64_t row = std::min<std::int64_t>(t0 + r, positions - 1);
      a_t[r] = a + row * in_features;
      g_t[r] = g + row * out_features;
    }
    for (std::int64_t s0 = t0; s0 < positions; s0 += kTile) {
      for (int c = 0; c < kTile; ++c) {
        const std::int64_t row = std::min<std::int64_t>(s0 + c, positions - 1);
        a_s[c] = a + row * in_features;
        g_s[c] = g + row * out_features;
      }
      tile_dots<V>(a_t, a_s, in_features, gram_a);
      tile_dots<V>(g_t, g_s, out_features, gram_g);
      // Interior tiles (s0 > t0, every row real) hold only pairs above the diagonal.
      const double* weights = interior_weights;
      if (s0 == t0 || s0 + kTile > positions) {
        for (int e = 0; e < kEntries; ++e) {
          edge_weights[e] = pair_weight(t0 + e / kTile, s0 + e % kTile, positions);
        }
        weights = edge_weights;
      }
      V::accumulate(gram_a, gram_g, weights, products, out_grams);
      next.step();
    }
  }
  double weight_total = 0.0;
  double bias_total = 0.0;
  for (int e = 0; e < kEntries; ++e) {
    weight_total += products[e];
    bias_total += out_grams[e];
  }
  *weight_sq = weight_total;
  if (bias_sq != nullptr) *bias_sq = bias_total;
}

struct Shape {
  std::int64_t positions, in_features, out_features;
};

template <class V, typename Element>
inline void examples(const Element* a, const Element* g, const Shape& shape, std::int64_t lo,
                     std::int64_t hi, double* weight_sq, double* bias_sq) noexcept {
  const std::int64_t a_stride = shape.positions * shape.in_features;
  const std::int64_t g_stride = shape.positions * shape.out_features;
  const std::int64_t blocks = (shape.positions + V::kTile - 1) / V::kTile;
  const std::int64_t tiles = blocks * (blocks + 1) / 2;
  for (std::int64_t i = lo; i < hi; ++i) {
    NextExample next;
    if (i + 1 < hi) {
      next = NextExample(a + (i + 1) * a_stride,
                         a_stride * static_cast<std::int64_t>(sizeof(Element)),
                         g + (i + 1) * g_stride,
                         g_stride * static_cast<std::int64_t>(sizeof(Element)), tiles);
    }
    example_norms<V>(a + i * a_stride, g + i * g_stride, shape.positions, shape.in_features,
                     shape.out_features, weight_sq + i, bias_sq != nullptr ? bias_sq + i : nullptr,
                     next);
  }
}

#if DPSHARP_NORMS_X86
template <typename Element>
__attribute__((target("avx512f,fma"), flatten)) void examples_avx512(
    const Element* a, const Element* g, const Shape& shape, std::int64_t lo, std::int64_t hi,
    double* weight_sq, double* bias_sq) noexcept {
  examples<Avx512Lanes<Element>>(a, g, shape, lo, hi, weight_sq, bias_sq);
}

template <typename Element>
__attribute__((target("avx2,fma"), flatten)) void examples_avx2(
    const Element* a, const Element* g, const Shape& shape, std::int64_t lo, std::int64_t hi,
    double* weight_sq, double* bias_sq) noexcept {
  examples<Avx2Lanes<Element>>(a, g, shape, lo, hi, weight_sq, bias_sq);
}
#endif

template <typename Element>
__attribute__((flatten)) void examples_portable(const Element* a, const Element* g,
                                                const Shape& shape, std::int64_t lo,
                                                std::int64_t hi, double* weight_sq,
                                                double* bias_sq) noexcept {
  examples<PortableLanes<Element>>(a, g, shape, lo, hi, weight_sq, bias_sq);
}

}  // namespace

bool isa_supported(Isa isa) noexcept {
  switch (isa) {
    case Isa::kPortable:
      return true;
#if DPSHARP_NORMS_X86
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    default:
      return false;
  }
}

Isa best_isa() noexcept {
  static const Isa best = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                          : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                                      : Isa::kPortable;
  return best;
}

template <typename Element>
void sequence_sq_norms(Isa isa, const Element* a, const Element* g, std::int64_t batch,
                       std::int64_t positions, std::int64_t in_features,
                       std::int64_t out_features, double* weight_sq, double* bias_sq,
                       int threads) {
  if (!isa_supported(isa)) {
    throw std::invalid_argument("linear_norms: implementation not supported by this CPU");
  }
  const Shape shape{positions, in_features, out_features};
  // Threads claim runs of up to 4 consecutive examples (parallel_ranges hands out blocks of
  // about count / (16 threads) items: 2 examples at the bench's B = 64 on 2 threads), so that
  // the next-example prefetch covers all but the first example of each run.
  const std::int64_t run = std::clamp<std::int64_t>(batch / (4 * std::max(threads, 1)), 1, 4);
  const std::int64_t runs = (batch + run - 1) / run;
  const std::int64_t work = std::max<std::int64_t>(
      1, run * positions * (positions + 1) / 2 * (in_features + out_features));
  const std::int64_t grain = std::max<std::int64_t>(1, kMinWorkPerThread / work);
  parallel_ranges(runs, grain, threads, [&](std::int64_t run_lo, std::int64_t run_hi) {
    const std::int64_t lo = run_lo * run;
    const std::int64_t hi = std::min(batch, run_hi * run);
    switch (isa) {
#if DPSHARP_NORMS_X86
      case Isa::kAvx512:
        examples_avx512(a, g, shape, lo, hi, weight_sq, bias_sq);
        return;
      case Isa::kAvx2:
        examples_avx2(a, g, shape, lo, hi, weight_sq, bias_sq);
        return;
#endif
      default:
        examples_portable(a, g, shape, lo, hi, weight_sq, bias_sq);
        return;
    }
  });
}

template void sequence_sq_norms<float>(Isa, const float*, const float*, std::int64_t,
                                       std::int64_t, std::int64_t, std::int64_t, double*,
                                       double*, int);
template void sequence_sq_norms<double>(Isa, const double*, const double*, std::int64_t,
                                        std::int64_t, std::int64_t, std::int64_t, double*,
                                        double*, int);

}  // namespace dpsharp::linear_norms
