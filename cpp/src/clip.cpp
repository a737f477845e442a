// Fused clip / accumulate / noise kernels (see clip.hpp). Work is split by parallel_ranges
// (parallel.hpp: torch's OpenMP team when torch is loaded, else std::threads; the extension
// never links an OpenMP runtime of its own). Results do not depend on the thread count: every
// element's noise is a pure function of its counter and every element's sum runs over examples
// in order.
#include "dpsharp/clip.hpp"

#include <algorithm>
#include <cstring>

#include "dpsharp/normals.hpp"
#include "dpsharp/parallel.hpp"

namespace dpsharp::clip {
namespace {

constexpr std::int64_t kTile = 512;             // elements per tile (even: whole noise pairs)
constexpr std::int64_t kMinPerThread = 1 << 15;  // below this a thread costs more than it saves
// Reductions (squared norms, dots) cost well under a nanosecond per element, so a second
// thread (started per call when no OpenMP team is there to borrow) only pays off on a much
// larger share of the work.
constexpr std::int64_t kMinReducePerThread = 1 << 18;

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

template <typename T>
void clip_accumulate_noise_typed(const void* per_example, const double* factors,
                                 std::int64_t batch, const void* base, void* out,
                                 std::int64_t numel, double noise_std, const NoiseStream& stream,
                                 double scale, int threads) {
  const std::int64_t tiles = (numel + kTile - 1) / kTile;
  const std::int64_t work_per_tile = kTile * (1 + (per_example ? batch : 0));
  parallel_ranges(tiles, std::max<std::int64_t>(1, kMinPerThread / work_per_tile), threads,
                  [&](std::int64_t tile_lo, std::int64_t tile_hi) {
    double acc[kTile];
    double z[kTile];
    for (std::int64_t tile = tile_lo; tile < tile_hi; ++tile) {
      const std::int64_t lo = tile * kTile;
      const std::int64_t len = std::min(kTile, numel - lo);
      if (base) {
        for (std::int64_t j = 0; j < len; ++j) acc[j] = Elem<T>::load(base, lo + j);
      } else {
        for (std::int64_t j = 0; j < len; ++j) acc[j] = 0.0;
      }
      if (per_example) {
        for (std::int64_t i = 0; i < batch; ++i) {
          const double c = factors[i];
          const std::int64_t row = i * numel + lo;
          for (std::int64_t j = 0; j < len; ++j) acc[j] += c * Elem<T>::load(per_example, row + j);
        }
      }
      if (noise_std != 0.0) {
        fill_normals(stream, lo, (len + 1) & ~std::int64_t{1}, z);
        for (std::int64_t j = 0; j < len; ++j) acc[j] += noise_std * z[j];
      }
      for (std::int64_t j = 0; j < len; ++j) Elem<T>::store(out, lo + j, acc[j] * scale);
    }
  });
}

template <typename T>
void dots_typed(const void* a, const void* b, std::int64_t batch, std::int64_t numel, double* out,
                int threads) {
  const std::int64_t grain =
      std::max<std::int64_t>(1, kMinReducePerThread / std::max<std::int64_t>(numel, 1));
  parallel_ranges(batch, grain,
                  threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const std::int64_t row = i * numel;
      std::int64_t j = 0;
      for (; j + 8 <= numel; j += 8) {
        for (int l = 0; l < 8; ++l) {
          lanes[l] += Elem<T>::load(a, row + j + l) * Elem<T>::load(b, row + j + l);
        }
      }
      for (; j < numel; ++j) lanes[0] += Elem<T>::load(a, row + j) * Elem<T>::load(b, row + j);
      out[i] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
               ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
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

void clip_accumulate_noise(const void* per_example, const double* factors, std::int64_t batch,
                           const void* base, void* out, DType dtype, std::int64_t numel,
                           double noise_std, const NoiseStream& stream, double scale,
                           int threads) {
  switch (dtype) {
    case DType::kFloat32:
      clip_accumulate_noise_typed<float>(per_example, factors, batch, base, out, numel, noise_std,
                                         stream, scale, threads);
      break;
    case DType::kFloat64:
      clip_accumulate_noise_typed<double>(per_example, factors, batch, base, out, numel,
                                          noise_std, stream, scale, threads);
      break;
    case DType::kBFloat16:
      clip_accumulate_noise_typed<BF16>(per_example, factors, batch, base, out, numel, noise_std,
                                        stream, scale, threads);
      break;
  }
}

void gaussian_noise(const NoiseStream& stream, std::int64_t numel, double* out, int threads) {
  const std::int64_t tiles = (numel + kTile - 1) / kTile;
  parallel_ranges(tiles, kMinPerThread / kTile, threads, [&](std::int64_t lo, std::int64_t hi) {
    double z[kTile];
    for (std::int64_t tile = lo; tile < hi; ++tile) {
      const std::int64_t first = tile * kTile;
      const std::int64_t len = std::min(kTile, numel - first);
      fill_normals(stream, first, (len + 1) & ~std::int64_t{1}, z);
      std::memcpy(out + first, z, static_cast<std::size_t>(len) * sizeof(double));
    }
  });
}

}  // namespace dpsharp::clip
