// Fused clip / accumulate / noise kernels (see clip.hpp). Work is split over std::thread
// (not OpenMP: the extension must not bring a second OpenMP runtime next to torch's). Results
// do not depend on the thread count: every element's noise is a pure function of its counter
// and every element's sum runs over examples in order.
#include "dpsharp/clip.hpp"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "dpsharp/philox.hpp"

namespace dpsharp::clip {
namespace {

constexpr std::int64_t kTile = 512;             // elements per tile (even: whole noise pairs)
constexpr std::int64_t kMinPerThread = 1 << 15;  // below this a thread costs more than it saves

template <typename Work>
void parallel_ranges(std::int64_t count, std::int64_t grain, int threads, Work&& work) {
  std::int64_t useful = std::max<std::int64_t>(1, count / std::max<std::int64_t>(grain, 1));
  const int n_threads = static_cast<int>(std::min<std::int64_t>(std::max(threads, 1), useful));
  if (n_threads <= 1) {
    work(std::int64_t{0}, count);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n_threads - 1));
  const std::int64_t chunk = (count + n_threads - 1) / n_threads;
  for (int t = 1; t < n_threads; ++t) {
    const std::int64_t lo = std::min(count, chunk * t);
    const std::int64_t hi = std::min(count, lo + chunk);
    pool.emplace_back([&work, lo, hi] { work(lo, hi); });
  }
  work(std::int64_t{0}, std::min(count, chunk));
  for (auto& th : pool) th.join();
}

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

// ---- SIMD twin of philox.hpp ---------------------------------------------------------------
// The same IEEE operations as the scalar functions in philox.hpp, on 4 lanes at a time with
// GCC/Clang vector extensions (lowered to SSE2 / AVX2 / NEON as available; no -ffast-math, no
// FMA contraction). Because every step is an exactly specified IEEE operation or an exact bit
// manipulation, the lanes produce bit for bit the scalar (and CUDA, and torch reference) values.
#if defined(__GNUC__)
#define DPSHARP_SIMD_NORMALS 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // these helpers are internal and always inlined
using VecD = double __attribute__((vector_size(32)));
using VecU = std::uint64_t __attribute__((vector_size(32)));
using VecI = std::int64_t __attribute__((vector_size(32)));

__attribute__((always_inline)) inline VecD bits_to_double(VecU bits) noexcept {
  VecD out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
__attribute__((always_inline)) inline VecU double_to_bits(VecD v) noexcept {
  VecU out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}
// Exact conversion of integers < 2^52 held in 64-bit lanes (the 2^52 trick).
__attribute__((always_inline)) inline VecD small_u64_to_double(VecU v) noexcept {
  const VecU magic = VecU{} + 0x4330000000000000ull;
  return bits_to_double(v | magic) - 4503599627370496.0;
}

__attribute__((always_inline)) inline VecU double_to_small_u64(VecD v) noexcept {  // exact for integers in [0, 2^52)
  return double_to_bits(v + 4503599627370496.0) & 0x000FFFFFFFFFFFFFull;
}

// c * m for c, m < 2^32 without a 64-bit lane multiply (SSE2/AVX2 have none): the two partial
// products c * m_lo and c * m_hi (16-bit halves of m) are below 2^48, hence exact in doubles.
__attribute__((always_inline)) inline VecU mul_u32_wide(VecU c, std::uint32_t m) noexcept {
  const VecD cd = small_u64_to_double(c);
  const VecU lo = double_to_small_u64(cd * static_cast<double>(m & 0xFFFFu));
  const VecU hi = double_to_small_u64(cd * static_cast<double>(m >> 16));
  return lo + (hi << 16);
}

__attribute__((always_inline)) inline void philox_lanes(VecU& c0, VecU& c1, VecU& c2, VecU& c3, std::uint32_t key0,
                         std::uint32_t key1) noexcept {
  const VecU mask = VecU{} + 0xFFFFFFFFull;
  for (int round = 0; round < 10; ++round) {
    const VecU p0 = mul_u32_wide(c0, 0xD2511F53u);  // < 2^64: exact in 64-bit lanes
    const VecU p1 = mul_u32_wide(c2, 0xCD9E8D57u);
    const std::uint64_t k0 = static_cast<std::uint32_t>(key0 + static_cast<std::uint32_t>(round) * 0x9E3779B9u);
    const std::uint64_t k1 = static_cast<std::uint32_t>(key1 + static_cast<std::uint32_t>(round) * 0xBB67AE85u);
    const VecU n0 = (p1 >> 32) ^ c1 ^ k0;
    const VecU n2 = (p0 >> 32) ^ c3 ^ k1;
    c1 = p1 & mask;
    c3 = p0 & mask;
    c0 = n0;
    c2 = n2;
  }
}

__attribute__((always_inline)) inline VecD log_unit_lanes(VecD u) noexcept {
  VecU bits = double_to_bits(u);
  VecD exponent = small_u64_to_double((bits >> 52) & 0x7FFull) - 1023.0;
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  VecD m = bits_to_double(bits);
  const VecI big = m > 1.4142135623730951;
  m = big ? m * 0.5 : m;
  exponent = big ? exponent + 1.0 : exponent;
  const VecD s = (m - 1.0) / (m + 1.0);
  const VecD s2 = s * s;
  VecD poly = VecD{} + 1.0 / 21.0;
  poly = poly * s2 + 1.0 / 19.0;
  poly = poly * s2 + 1.0 / 17.0;
  poly = poly * s2 + 1.0 / 15.0;
  poly = poly * s2 + 1.0 / 13.0;
  poly = poly * s2 + 1.0 / 11.0;
  poly = poly * s2 + 1.0 / 9.0;
  poly = poly * s2 + 1.0 / 7.0;
  poly = poly * s2 + 1.0 / 5.0;
  poly = poly * s2 + 1.0 / 3.0;
  const VecD log_m = 2.0 * s + 2.0 * s * (s2 * poly);
  return exponent * 0.6931471805599453 + log_m;
}

__attribute__((always_inline)) inline void sincos_two_pi_lanes(VecD u, VecD& sin_out, VecD& cos_out) noexcept {
  const VecD four_u = 4.0 * u;
  const VecD quadrant_f = (four_u + 6755399441055744.0) - 6755399441055744.0;
  const VecD f = four_u - quadrant_f;
  const VecD quadrant = quadrant_f >= 4.0 ? quadrant_f - 4.0 : quadrant_f;
  const VecD x = f * 1.5707963267948966;
  const VecD x2 = x * x;
  VecD sp = VecD{} - 1.0 / 355687428096000.0;
  sp = sp * x2 + 1.0 / 1307674368000.0;
  sp = sp * x2 - 1.0 / 6227020800.0;
  sp = sp * x2 + 1.0 / 39916800.0;
  sp = sp * x2 - 1.0 / 362880.0;
  sp = sp * x2 + 1.0 / 5040.0;
  sp = sp * x2 - 1.0 / 120.0;
  sp = sp * x2 + 1.0 / 6.0;
  const VecD sin_x = x - x * (x2 * sp);
  VecD cp = VecD{} + 1.0 / 6402373705728000.0;
  cp = cp * x2 - 1.0 / 20922789888000.0;
  cp = cp * x2 + 1.0 / 87178291200.0;
  cp = cp * x2 - 1.0 / 479001600.0;
  cp = cp * x2 + 1.0 / 3628800.0;
  cp = cp * x2 - 1.0 / 40320.0;
  cp = cp * x2 + 1.0 / 720.0;
  cp = cp * x2 - 1.0 / 24.0;
  cp = cp * x2 + 1.0 / 2.0;
  const VecD cos_x = 1.0 - x2 * cp;
  const VecI swap = (quadrant == 1.0) | (quadrant == 3.0);
  const VecD sign_sin = quadrant >= 2.0 ? VecD{} - 1.0 : VecD{} + 1.0;
  const VecD sign_cos = ((quadrant == 1.0) | (quadrant == 2.0)) ? VecD{} - 1.0 : VecD{} + 1.0;
  sin_out = sign_sin * (swap ? cos_x : sin_x);
  cos_out = sign_cos * (swap ? sin_x : cos_x);
}
#endif

// Standard normals for elements [first, first + count) (first even, count even) into z.
// Compiled twice on x86-64 (AVX2 and baseline), picked at load time; both give the same bits.
#if defined(DPSHARP_SIMD_NORMALS) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
void fill_normals(const NoiseStream& s, std::int64_t first, std::int64_t count,
                  double* z) noexcept {
  const std::int64_t pairs = count / 2;
  const std::uint32_t pair0 = static_cast<std::uint32_t>(first / 2);
  std::int64_t k = 0;
#if defined(DPSHARP_SIMD_NORMALS)
  constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
  for (; k + 4 <= pairs; k += 4) {
    const std::uint64_t base = pair0 + static_cast<std::uint32_t>(k);
    VecU c0 = VecU{base, base + 1, base + 2, base + 3} & 0xFFFFFFFFull;
    VecU c1 = VecU{} + s.parameter;
    VecU c2 = VecU{} + s.release;
    VecU c3 = VecU{} + s.rank;
    philox_lanes(c0, c1, c2, c3, s.key0, s.key1);
    const VecD k1 = small_u64_to_double(c0) * 2097152.0 + small_u64_to_double(c1 >> 11);
    const VecD k2 = small_u64_to_double(c2) * 2097152.0 + small_u64_to_double(c3 >> 11);
    const VecD u1 = (k1 + 1.0) * kTwoPowMinus53;
    const VecD u2 = k2 * kTwoPowMinus53;
    const VecD radius2 = -2.0 * log_unit_lanes(u1);
    VecD radius;
    for (int l = 0; l < 4; ++l) radius[l] = std::sqrt(radius2[l]);
    VecD sn, cs;
    sincos_two_pi_lanes(u2, sn, cs);
    const VecD z0 = radius * cs;
    const VecD z1 = radius * sn;
    for (int l = 0; l < 4; ++l) {
      z[2 * (k + l)] = z0[l];
      z[2 * (k + l) + 1] = z1[l];
    }
  }
#endif
  for (; k < pairs; ++k) {
    philox::gaussian_pair(s.key0, s.key1, pair0 + static_cast<std::uint32_t>(k), s.parameter,
                          s.release, s.rank, z[2 * k], z[2 * k + 1]);
  }
}
#if defined(DPSHARP_SIMD_NORMALS)
#pragma GCC diagnostic pop
#endif

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
void sq_norms_typed(const void* per_example, std::int64_t batch, std::int64_t numel, double* out,
                    int threads) {
  parallel_ranges(batch, std::max<std::int64_t>(1, kMinPerThread / std::max<std::int64_t>(numel, 1)),
                  threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const std::int64_t row = i * numel;
      std::int64_t j = 0;
      for (; j + 8 <= numel; j += 8) {
        for (int l = 0; l < 8; ++l) {
          const double v = Elem<T>::load(per_example, row + j + l);
          lanes[l] += v * v;
        }
      }
      for (; j < numel; ++j) {
        const double v = Elem<T>::load(per_example, row + j);
        lanes[0] += v * v;
      }
      out[i] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
               ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
  });
}

}  // namespace

void per_example_sq_norms(const void* per_example, DType dtype, std::int64_t batch,
                          std::int64_t numel, double* out, int threads) {
  switch (dtype) {
    case DType::kFloat32: sq_norms_typed<float>(per_example, batch, numel, out, threads); break;
    case DType::kFloat64: sq_norms_typed<double>(per_example, batch, numel, out, threads); break;
    case DType::kBFloat16: sq_norms_typed<BF16>(per_example, batch, numel, out, threads); break;
  }
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
