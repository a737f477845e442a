// Fused clip / accumulate / noise kernels (see clip.hpp). Work is split by parallel_ranges
// (parallel.hpp: torch's OpenMP team when torch is loaded, else std::threads; the extension
// never links an OpenMP runtime of its own). Results do not depend on the thread count: every
// element's noise is a pure function of its counter and every element's sum runs over examples
// in order.
#include "dpsharp/clip.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "dpsharp/normals.hpp"
#include "dpsharp/parallel.hpp"
#include "dpsharp/vector_width.hpp"

namespace dpsharp::clip {
namespace {

// Elements per tile: a multiple of both noise chunk sizes (160 float32, 128 float64 normals), so
// that tiles start on chunk boundaries and no chunk is generated twice.
constexpr std::int64_t kTile = 640;
static_assert(kTile % noise::kF32ChunkElements == 0 && kTile % noise::kF64ChunkElements == 0);
constexpr std::int64_t kMinPerThread = 1 << 15;  // below this a thread costs more than it saves
// Reductions (squared norms, dots) cost well under a nanosecond per element, so a second
// thread only pays off on a larger share of the work (64k elements: ~10 us, against a few us
// to hand a block to torch's already-spinning OpenMP team; the MLP's layer inputs, 130-200k
// elements, are then split over 2 threads).
constexpr std::int64_t kMinReducePerThread = 1 << 16;

inline float bf16_to_float(std::uint16_t v) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even float -> bfloat16 (NaN kept quiet), as torch does.
inline std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static double load(const void* p, std::int64_t i) noexcept {
    return static_cast<double>(static_cast<const float*>(p)[i]);
  }
  static void store(void* p, std::int64_t i, double v) noexcept {
    static_cast<float*>(p)[i] = static_cast<float>(v);
  }
};
template <>
struct Elem<double> {
  static double load(const void* p, std::int64_t i) noexcept {
    return static_cast<const double*>(p)[i];
  }
  static void store(void* p, std::int64_t i, double v) noexcept {
    static_cast<double*>(p)[i] = v;
  }
};
struct BF16 {};
template <>
struct Elem<BF16> {
  static double load(const void* p, std::int64_t i) noexcept {
    return static_cast<double>(bf16_to_float(static_cast<const std::uint16_t*>(p)[i]));
  }
  static void store(void* p, std::int64_t i, double v) noexcept {
    static_cast<std::uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v));
  }
};

// One tile of clip_accumulate_noise: out[lo + j] for j < len, with the tile's normals already
// in z (float32 normals for float32 / bfloat16 buffers, float64 for float64).
struct TileArgs {
  const void* per_example;
  const double* factors;
  std::int64_t batch;
  const void* base;
  void* out;
  std::int64_t numel;
  double noise_std;
  double scale;
};

// out = scale * (base + noise_std * z) in one pass (no per-example rows: the release pass).
template <typename TBase, typename TOut, typename Z, bool kBase, bool kNoise>
__attribute__((always_inline)) inline void release_tile(const TileArgs& a, std::int64_t lo,
                                                       std::int64_t len, const Z* z) noexcept {
  const double std_dev = a.noise_std;
  const double scale = a.scale;
  for (std::int64_t j = 0; j < len; ++j) {
    double v = kBase ? Elem<TBase>::load(a.base, lo + j) : 0.0;
    if constexpr (kNoise) v += std_dev * static_cast<double>(z[j]);
    Elem<TOut>::store(a.out, lo + j, v * scale);
  }
}

// TIn: the per-example rows' element type; TBase: base's; TOut: out's (the noise z is out's
// stream). Every sum in float64, one rounding to TOut.
template <typename TIn, typename TBase, typename TOut, typename Z>
__attribute__((always_inline)) inline void tile_body(const TileArgs& a, std::int64_t lo,
                                                    std::int64_t len, const Z* z) noexcept {
  if (!a.per_example) {
    if (a.base && z) {
      release_tile<TBase, TOut, Z, true, true>(a, lo, len, z);
    } else if (z) {
      release_tile<TBase, TOut, Z, false, true>(a, lo, len, z);
    } else if (a.base) {
      release_tile<TBase, TOut, Z, true, false>(a, lo, len, z);
    } else {
      release_tile<TBase, TOut, Z, false, false>(a, lo, len, z);
    }
    return;
  }
  double acc[kTile];
  if (a.base) {
    for (std::int64_t j = 0; j < len; ++j) acc[j] = Elem<TBase>::load(a.base, lo + j);
  } else {
    for (std::int64_t j = 0; j < len; ++j) acc[j] = 0.0;
  }
  for (std::int64_t i = 0; i < a.batch; ++i) {
    const double c = a.factors[i];
    const std::int64_t row = i * a.numel + lo;
    for (std::int64_t j = 0; j < len; ++j) acc[j] += c * Elem<TIn>::load(a.per_example, row + j);
  }
  if (z) {
    const double std_dev = a.noise_std;
    for (std::int64_t j = 0; j < len; ++j) acc[j] += std_dev * static_cast<double>(z[j]);
  }
  const double scale = a.scale;
  for (std::int64_t j = 0; j < len; ++j) Elem<TOut>::store(a.out, lo + j, acc[j] * scale);
}

#define DPSHARP_TILE_BUILDS(TIn, TBase, TOut, Z, suffix)                                     \
  __attribute__((always_inline)) inline void tile_##suffix##_body(                           \
      const TileArgs& a, std::int64_t lo, std::int64_t len, const Z* z) noexcept {           \
    tile_body<TIn, TBase, TOut, Z>(a, lo, len, z);                                           \
  }                                                                                          \
  DPSHARP_WIDTH_BUILDS(tile_##suffix,                                                        \
                       (const TileArgs& a, std::int64_t lo, std::int64_t len, const Z* z),   \
                       (a, lo, len, z))
DPSHARP_TILE_BUILDS(float, float, float, float, f32)
DPSHARP_TILE_BUILDS(double, double, double, double, f64)
DPSHARP_TILE_BUILDS(BF16, BF16, BF16, float, bf16)
// float32 rows added into a float64 sum (chunks of a clipped sum kept in float64)
DPSHARP_TILE_BUILDS(float, double, double, double, f32_into_f64)
// a float64 sum released into a float32 buffer (its noise the float32 stream)
DPSHARP_TILE_BUILDS(double, double, float, float, f64_into_f32)
#undef DPSHARP_TILE_BUILDS

// The element types of one call: rows, base, out.
enum class Mix { kSame, kF32IntoF64, kF64IntoF32 };

// T is out's element type.
template <typename T, Mix kMix, typename Z>
void run_tile(Width width, const TileArgs& a, std::int64_t lo, std::int64_t len,
              const Z* z) noexcept {
  if constexpr (kMix == Mix::kF32IntoF64) {
    DPSHARP_WIDTH_DISPATCH(width, tile_f32_into_f64, a, lo, len, z)
  } else if constexpr (kMix == Mix::kF64IntoF32) {
    DPSHARP_WIDTH_DISPATCH(width, tile_f64_into_f32, a, lo, len, z)
  } else if constexpr (std::is_same_v<T, float>) {
    DPSHARP_WIDTH_DISPATCH(width, tile_f32, a, lo, len, z)
  } else if constexpr (std::is_same_v<T, double>) {
    DPSHARP_WIDTH_DISPATCH(width, tile_f64, a, lo, len, z)
  } else {
    DPSHARP_WIDTH_DISPATCH(width, tile_bf16, a, lo, len, z)
  }
}

// Tile `tile` of one buffer: its normals into z (when noise_std != 0), then the tile loops.
// float64 outputs take the float64 noise stream, the others the float32 one.
template <typename T>
using NoiseOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T, Mix kMix = Mix::kSame>
void process_tile(Width width, NormalsIsa isa, const TileArgs& args, const NoiseStream& stream,
                  std::int64_t tile, NoiseOf<T>* z) noexcept {
  const std::int64_t lo = tile * kTile;
  const std::int64_t len = std::min(kTile, args.numel - lo);
  const NoiseOf<T>* noise = nullptr;
  if (args.noise_std != 0.0) {
    if constexpr (std::is_same_v<T, double>) {
      normals_f64(isa, stream, lo, len, z);
    } else {
      normals_f32(isa, stream, lo, len, z);
    }
    noise = z;
  }
  run_tile<T, kMix, NoiseOf<T>>(width, args, lo, len, noise);
}

template <typename T, Mix kMix = Mix::kSame>
void clip_accumulate_noise_typed(const TileArgs& args, const NoiseStream& stream, int threads) {
  const Width width = vector_width();
  const NormalsIsa isa = best_normals_isa();
  const std::int64_t tiles = (args.numel + kTile - 1) / kTile;
  const std::int64_t work_per_tile = kTile * (1 + (args.per_example ? args.batch : 0));
  parallel_ranges(tiles, std::max<std::int64_t>(1, kMinPerThread / work_per_tile), threads,
                  [&](std::int64_t tile_lo, std::int64_t tile_hi) {
    alignas(64) NoiseOf<T> z[kTile];
    for (std::int64_t tile = tile_lo; tile < tile_hi; ++tile) {
      process_tile<T, kMix>(width, isa, args, stream, tile, z);
    }
  });
}

// Per-example dot products: 32 float64 lanes per example (four independent 8-lane sums, so the
// additions are not one serial chain), summed in a fixed order (the loop vectorises to four
// 512-bit or eight 256-bit registers of doubles in the wider builds).
constexpr int kDotLanes = 32;

// kSquares: b == a (squared norms), each element loaded and widened once.
template <typename T, bool kSquares>
__attribute__((always_inline)) inline double lane_product(const void* a, const void* b,
                                                          std::int64_t k) noexcept {
  const double x = Elem<T>::load(a, k);
  return kSquares ? x * x : x * Elem<T>::load(b, k);
}

template <typename T, bool kSquares>
__attribute__((always_inline)) inline void dots_rows(const void* a, const void* b,
                                                     std::int64_t numel, double* out,
                                                     std::int64_t lo, std::int64_t hi) noexcept {
  for (std::int64_t i = lo; i < hi; ++i) {
    double lanes[kDotLanes] = {};
    const std::int64_t row = i * numel;
    std::int64_t j = 0;
    for (; j + kDotLanes <= numel; j += kDotLanes) {
      for (int l = 0; l < kDotLanes; ++l) lanes[l] += lane_product<T, kSquares>(a, b, row + j + l);
    }
    for (int l = 0; j < numel; ++j, ++l) lanes[l] += lane_product<T, kSquares>(a, b, row + j);
    // pairwise, in a fixed order
    for (int width = kDotLanes / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    out[i] = lanes[0];
  }
}

#define DPSHARP_DOTS_BUILDS(T, suffix)                                                     \
  __attribute__((always_inline)) inline void dots_##suffix##_body(                         \
      const void* a, const void* b, std::int64_t numel, double* out, std::int64_t lo,        \
      std::int64_t hi) noexcept {                                                            \
    if (a == b) {                                                                          \
      dots_rows<T, true>(a, b, numel, out, lo, hi);                                        \
    } else {                                                                               \
      dots_rows<T, false>(a, b, numel, out, lo, hi);                                       \
    }                                                                                      \
  }                                                                                        \
  DPSHARP_WIDTH_BUILDS(dots_##suffix,                                                      \
                       (const void* a, const void* b, std::int64_t numel, double* out,     \
                        std::int64_t lo, std::int64_t hi),                                 \
                       (a, b, numel, out, lo, hi))
DPSHARP_DOTS_BUILDS(float, f32)
DPSHARP_DOTS_BUILDS(double, f64)
DPSHARP_DOTS_BUILDS(BF16, bf16)
#undef DPSHARP_DOTS_BUILDS

template <typename T>
void dots_typed(const void* a, const void* b, std::int64_t batch, std::int64_t numel, double* out,
                int threads) {
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinReducePerThread / std::max<std::int64_t>(numel, 1));
  const Width width = vector_width();
  parallel_ranges(batch, grain, threads, [&](std::int64_t lo, std::int64_t hi) {
    if constexpr (std::is_same_v<T, float>) {
      DPSHARP_WIDTH_DISPATCH(width, dots_f32, a, b, numel, out, lo, hi)
    } else if constexpr (std::is_same_v<T, double>) {
      DPSHARP_WIDTH_DISPATCH(width, dots_f64, a, b, numel, out, lo, hi)
    } else {
      DPSHARP_WIDTH_DISPATCH(width, dots_bf16, a, b, numel, out, lo, hi)
    }
  });
}

}  // namespace

void per_example_dots(const void* a, const void* b, DType dtype, std::int64_t batch,
                      std::int64_t numel, double* out, int threads) {
  switch (dtype) {
    case DType::kFloat32: dots_typed<float>(a, b, batch, numel, out, threads); break;
    case DType::kFloat64: dots_typed<double>(a, b, batch, numel, out, threads); break;
    case DType::kBFloat16: dots_typed<BF16>(a, b, batch, numel, out, threads); break;
  }
}

void per_example_sq_norms(const void* per_example, DType dtype, std::int64_t batch,
                          std::int64_t numel, double* out, int threads) {
  // ||x_i||^2 = <x_i, x_i>: the same lanes and summation order as per_example_dots.
  per_example_dots(per_example, per_example, dtype, batch, numel, out, threads);
}

namespace {

// The mix of element types of one call (rows, base, out), or throws for one with no build.
// Absent rows take base's type, an absent base the type the call's other operands need.
Mix mix_of(bool rows, bool base, DType rows_dtype, DType base_dtype, DType out_dtype) {
  if (!base) base_dtype = rows && rows_dtype != out_dtype ? DType::kFloat64 : out_dtype;
  if (!rows) rows_dtype = base_dtype;
  if (rows_dtype == base_dtype && base_dtype == out_dtype) return Mix::kSame;
  if (rows_dtype == DType::kFloat32 && base_dtype == DType::kFloat64 &&
      out_dtype == DType::kFloat64) {
    return Mix::kF32IntoF64;
  }
  if (rows_dtype == DType::kFloat64 && base_dtype == DType::kFloat64 &&
      out_dtype == DType::kFloat32) {
    return Mix::kF64IntoF32;
  }
  throw std::invalid_argument(
      "clip_accumulate_noise: the element types of per_example, base and out must be equal, "
      "or float32 rows into a float64 base and out, or a float64 base (and rows) into a "
      "float32 out");
}

}  // namespace

void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           int threads) {
  clip_accumulate_noise(per_example, factors, batch, base, out, dtype, numel, noise_std, stream,
                        scale, threads, dtype, dtype);
}

void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           int threads, DType rows_dtype, DType base_dtype) {
  const TileArgs args{per_example, factors, batch, base, out, numel, noise_std, scale};
  switch (mix_of(per_example != nullptr, base != nullptr, rows_dtype, base_dtype, dtype)) {
    case Mix::kF32IntoF64:
      clip_accumulate_noise_typed<double, Mix::kF32IntoF64>(args, stream, threads);
      return;
    case Mix::kF64IntoF32:
      clip_accumulate_noise_typed<float, Mix::kF64IntoF32>(args, stream, threads);
      return;
    case Mix::kSame: break;
  }
  switch (dtype) {
    case DType::kFloat32: clip_accumulate_noise_typed<float>(args, stream, threads); break;
    case DType::kFloat64: clip_accumulate_noise_typed<double>(args, stream, threads); break;
    case DType::kBFloat16: clip_accumulate_noise_typed<BF16>(args, stream, threads); break;
  }
}

void release_noise(const ReleaseBuffer* buffers, std::int64_t count, double noise_std,
                   const NoiseStream& stream, double scale, int threads) {
  for (std::int64_t b = 0; b < count; ++b) {
    const ReleaseBuffer& buffer = buffers[b];
    if (buffer.base && buffer.base_dtype != buffer.dtype &&
        mix_of(false, true, buffer.base_dtype, buffer.base_dtype, buffer.dtype) !=
            Mix::kF64IntoF32) {
      throw std::invalid_argument("release_noise: a base's element type must be its out's, or "
                                  "float64 into a float32 out");
    }
  }
  // The tiles of all buffers form one index space (prefix sums of their tile counts), so that
  // threads share the work evenly however the parameters are sized.
  std::vector<std::int64_t> first_tile(static_cast<std::size_t>(count) + 1, 0);
  for (std::int64_t b = 0; b < count; ++b) {
    const std::int64_t tiles = (buffers[b].numel + kTile - 1) / kTile;
    first_tile[static_cast<std::size_t>(b) + 1] = first_tile[static_cast<std::size_t>(b)] + tiles;
  }
  const Width width = vector_width();
  const NormalsIsa isa = best_normals_isa();
  parallel_ranges(first_tile.back(), std::max<std::int64_t>(1, kMinPerThread / kTile), threads,
                  [&](std::int64_t lo, std::int64_t hi) {
    alignas(64) double z[kTile];  // float32 noise uses the first half
    auto b = static_cast<std::int64_t>(
        std::upper_bound(first_tile.begin(), first_tile.end(), lo) - first_tile.begin() - 1);
    for (std::int64_t tile = lo; tile < hi; ++tile) {
      while (tile >= first_tile[static_cast<std::size_t>(b) + 1]) ++b;
      const ReleaseBuffer& buffer = buffers[b];
      const TileArgs args{nullptr, nullptr, 0, buffer.base, buffer.out, buffer.numel,
                          noise_std, scale};
      NoiseStream s = stream;
      s.parameter = buffer.parameter;
      const std::int64_t local = tile - first_tile[static_cast<std::size_t>(b)];
      if (buffer.base && buffer.base_dtype != buffer.dtype) {  // checked by the caller
        process_tile<float, Mix::kF64IntoF32>(width, isa, args, s, local,
                                              reinterpret_cast<float*>(z));
        continue;
      }
      switch (buffer.dtype) {
        case DType::kFloat32:
          process_tile<float>(width, isa, args, s, local, reinterpret_cast<float*>(z));
          break;
        case DType::kFloat64: process_tile<double>(width, isa, args, s, local, z); break;
        case DType::kBFloat16:
          process_tile<BF16>(width, isa, args, s, local, reinterpret_cast<float*>(z));
          break;
      }
    }
  });
}

void gaussian_noise(const NoiseStream& stream, std::int64_t first, std::int64_t count,
                    float* out_f32, double* out_f64, int threads) {
  const NormalsIsa isa = best_normals_isa();
  // Ranges of whole tiles from `first` (aligned to chunks when first is): pure functions of
  // their indices, so the split over threads does not change the bits.
  const std::int64_t tiles = (count + kTile - 1) / kTile;
  parallel_ranges(tiles, kMinPerThread / kTile, threads, [&](std::int64_t lo, std::int64_t hi) {
    const std::int64_t begin = lo * kTile;
    const std::int64_t len = std::min(hi * kTile, count) - begin;
    if (out_f32) {
      normals_f32(isa, stream, first + begin, len, out_f32 + begin);
    } else {
      normals_f64(isa, stream, first + begin, len, out_f64 + begin);
    }
  });
}

}  // namespace dpsharp::clip
