// Counter-based Gaussian noise: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011) plus a Box-Muller transform built only from IEEE
// basic operations (+, -, *, /, sqrt) and exact bit manipulation.
//
// Why hand-written log/sin/cos: (1) they vectorise (glibc's do not without -ffast-math), which
// makes drawing noise for a million parameters cost about as much as reading them; (2) a
// sequence of correctly rounded basic operations gives the same bits on every IEEE machine,
// so this header compiled by nvcc (with -fmad=false) yields the same noise stream as the CPU
// and as the pure-torch reference in python/dpsharp/torch/kernels.py, which replays exactly
// these operations in float64. Accuracy: a few ulp, far below any statistical effect.
//
// Stream layout. The key is 64 bits (seed, or a fresh CSPRNG draw per release in secure mode).
// The counter is (pair index, parameter index, release counter, rank): element j of parameter
// p at release r on rank k is the (j mod 2) output of the Box-Muller pair j/2 of block
// (j/2, p, r, k). Distinct (element, parameter, release, rank) never share a block, so noise
// is never reused across steps, parameters or ranks.
//
// Uniforms use 53 bits: u1 = (k + 1) 2^-53 in (0, 1], u2 = k' 2^-53 in [0, 1). The largest
// |z| reachable is sqrt(-2 ln 2^-53) = 8.57; the Gaussian mass beyond it is 1e-17.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define DPSHARP_HD __host__ __device__
#else
#define DPSHARP_HD
#endif
#if defined(__GNUC__) && !defined(__CUDACC__)
#define DPSHARP_SERIES_INLINE __attribute__((always_inline)) inline
#else
#define DPSHARP_SERIES_INLINE inline
#endif

namespace dpsharp::philox {

struct Block {
  std::uint32_t v[4];
};

DPSHARP_HD inline void mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                 std::uint32_t& lo) noexcept {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b);
  hi = static_cast<std::uint32_t>(product >> 32);
  lo = static_cast<std::uint32_t>(product);
}

// Philox4x32 with 10 rounds, the Random123 constants.
DPSHARP_HD inline Block philox4x32_10(Block counter, std::uint32_t key0,
                                      std::uint32_t key1) noexcept {
  constexpr std::uint32_t kMul0 = 0xD2511F53u;
  constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
  std::uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  // Ten rounds written out (no inner loop, so a loop over counters vectorises); the key is
  // bumped between rounds.
#define DPSHARP_PHILOX_ROUND(k0, k1)                       \
  {                                                        \
    std::uint32_t hi0, lo0, hi1, lo1;                      \
    mulhilo32(kMul0, c0, hi0, lo0);                        \
    mulhilo32(kMul1, c2, hi1, lo1);                        \
    c0 = hi1 ^ c1 ^ (k0);                                  \
    c1 = lo1;                                              \
    c2 = hi0 ^ c3 ^ (k1);                                  \
    c3 = lo0;                                              \
  }
  DPSHARP_PHILOX_ROUND(key0, key1)
  DPSHARP_PHILOX_ROUND(key0 + 1u * kWeyl0, key1 + 1u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 2u * kWeyl0, key1 + 2u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 3u * kWeyl0, key1 + 3u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 4u * kWeyl0, key1 + 4u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 5u * kWeyl0, key1 + 5u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 6u * kWeyl0, key1 + 6u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 7u * kWeyl0, key1 + 7u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 8u * kWeyl0, key1 + 8u * kWeyl1)
  DPSHARP_PHILOX_ROUND(key0 + 9u * kWeyl0, key1 + 9u * kWeyl1)
#undef DPSHARP_PHILOX_ROUND
  return Block{{c0, c1, c2, c3}};
}

// Exact uint32 -> double through the signed conversion (which has a vector instruction).
DPSHARP_HD inline double u32_to_double(std::uint32_t v) noexcept {
  return static_cast<double>(static_cast<std::int32_t>(v ^ 0x80000000u)) + 2147483648.0;
}

// 53-bit uniforms from one block: u1 in (0, 1] (safe for log), u2 in [0, 1).
DPSHARP_HD inline void block_uniforms(const Block& b, double& u1, double& u2) noexcept {
  // k = hi 2^21 + (lo >> 11) < 2^53, assembled from exact uint32 -> double conversions (these
  // vectorise; a uint64 -> double conversion does not before AVX-512).
  constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
  const double k1 = u32_to_double(b.v[0]) * 2097152.0 +
                    static_cast<double>(static_cast<std::int32_t>(b.v[1] >> 11));
  const double k2 = u32_to_double(b.v[2]) * 2097152.0 +
                    static_cast<double>(static_cast<std::int32_t>(b.v[3] >> 11));
  u1 = (k1 + 1.0) * kTwoPowMinus53;
  u2 = k2 * kTwoPowMinus53;
}

// The series of log_unit and sincos_two_pi, as templates over the element type: double here,
// and the 4-lane vector types of normals.cpp, so that every implementation evaluates the same
// IEEE operations in the same order (T{} + c and T{} - c are exactly c and -c).

// log m = 2 s + 2 s (s^2 poly(s^2)), poly = sum_k s^(2k) / (2k + 3), to s^21.
template <typename T>
DPSHARP_HD DPSHARP_SERIES_INLINE T log_series(const T s, const T s2) noexcept {
  T poly = T{} + 1.0 / 21.0;
  poly = poly * s2 + 1.0 / 19.0;
  poly = poly * s2 + 1.0 / 17.0;
  poly = poly * s2 + 1.0 / 15.0;
  poly = poly * s2 + 1.0 / 13.0;
  poly = poly * s2 + 1.0 / 11.0;
  poly = poly * s2 + 1.0 / 9.0;
  poly = poly * s2 + 1.0 / 7.0;
  poly = poly * s2 + 1.0 / 5.0;
  poly = poly * s2 + 1.0 / 3.0;
  return 2.0 * s + 2.0 * s * (s2 * poly);
}

// sin x, Taylor series to x^17.
template <typename T>
DPSHARP_HD DPSHARP_SERIES_INLINE T sin_series(const T x, const T x2) noexcept {
  T sp = T{} - 1.0 / 355687428096000.0;  // -1/17!
  sp = sp * x2 + 1.0 / 1307674368000.0;   // 1/15!
  sp = sp * x2 - 1.0 / 6227020800.0;      // -1/13!
  sp = sp * x2 + 1.0 / 39916800.0;        // 1/11!
  sp = sp * x2 - 1.0 / 362880.0;          // -1/9!
  sp = sp * x2 + 1.0 / 5040.0;            // 1/7!
  sp = sp * x2 - 1.0 / 120.0;             // -1/5!
  sp = sp * x2 + 1.0 / 6.0;               // 1/3!  (sign applied below)
  return x - x * (x2 * sp);
}

// cos x, Taylor series to x^18.
template <typename T>
DPSHARP_HD DPSHARP_SERIES_INLINE T cos_series(const T x2) noexcept {
  T cp = T{} + 1.0 / 6402373705728000.0;  // 1/18!
  cp = cp * x2 - 1.0 / 20922789888000.0;  // -1/16!
  cp = cp * x2 + 1.0 / 87178291200.0;     // 1/14!
  cp = cp * x2 - 1.0 / 479001600.0;       // -1/12!
  cp = cp * x2 + 1.0 / 3628800.0;         // 1/10!
  cp = cp * x2 - 1.0 / 40320.0;           // -1/8!
  cp = cp * x2 + 1.0 / 720.0;             // 1/6!
  cp = cp * x2 - 1.0 / 24.0;              // -1/4!
  cp = cp * x2 + 1.0 / 2.0;               // 1/2!  (sign applied below)
  return 1.0 - x2 * cp;
}

// Natural log of u in (0, 1] (normal numbers only; u >= 2^-53 here). u = m 2^e with
// m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.1716, series to
// s^21 (truncation error < 1e-17 relative).
DPSHARP_HD inline double log_unit(double u) noexcept {
  std::uint64_t bits;
  std::memcpy(&bits, &u, sizeof bits);
  // The biased exponent as a double via the 2^52 trick (exact, and vectorises).
  const std::uint64_t exponent_bits = ((bits >> 52) & 0x7FFu) | 0x4330000000000000ull;
  double biased;
  std::memcpy(&biased, &exponent_bits, sizeof biased);
  double exponent = (biased - 4503599627370496.0) - 1023.0;
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  double m;
  std::memcpy(&m, &bits, sizeof m);
  const bool big = m > 1.4142135623730951;
  m = big ? m * 0.5 : m;
  exponent = big ? exponent + 1.0 : exponent;
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  const double log_m = log_series(s, s2);
  return exponent * 0.6931471805599453 + log_m;
}

// sin and cos of 2 pi u for u in [0, 1): the quadrant comes exactly from 4u, the remainder
// f in [-1/2, 1/2] is exact, x = f pi/2 in [-pi/4, pi/4]; Taylor series to x^17 / x^18.
DPSHARP_HD inline void sincos_two_pi(double u, double& sin_out, double& cos_out) noexcept {
  const double four_u = 4.0 * u;
  // Quadrant = 4u rounded to nearest (ties to even) by the 1.5 * 2^52 trick, exact for
  // |4u| < 2^51 under IEEE arithmetic (never compile with -ffast-math, which would fold it).
  const double quadrant_f = (four_u + 6755399441055744.0) - 6755399441055744.0;  // 0..4
  const double f = four_u - quadrant_f;
  const double quadrant = quadrant_f >= 4.0 ? quadrant_f - 4.0 : quadrant_f;
  const double x = f * 1.5707963267948966;
  const double x2 = x * x;
  const double sin_x = sin_series(x, x2);
  const double cos_x = cos_series(x2);
  // Rotate by quadrant * pi/2 (branch-free so loops vectorise).
  const bool swap = (quadrant == 1.0) | (quadrant == 3.0);
  const double sign_sin = quadrant >= 2.0 ? -1.0 : 1.0;
  const double sign_cos = ((quadrant == 1.0) | (quadrant == 2.0)) ? -1.0 : 1.0;
  const double s_raw = swap ? cos_x : sin_x;
  const double c_raw = swap ? sin_x : cos_x;
  sin_out = sign_sin * s_raw;
  cos_out = sign_cos * c_raw;
}

// Two independent standard normals from block (pair, parameter, release, rank).
DPSHARP_HD inline void gaussian_pair(std::uint32_t key0, std::uint32_t key1, std::uint32_t pair,
                                     std::uint32_t parameter, std::uint32_t release,
                                     std::uint32_t rank, double& z0, double& z1) noexcept {
  const Block b = philox4x32_10(Block{{pair, parameter, release, rank}}, key0, key1);
  double u1, u2;
  block_uniforms(b, u1, u2);
  const double radius = std::sqrt(-2.0 * log_unit(u1));
  double s, c;
  sincos_two_pi(u2, s, c);
  z0 = radius * c;
  z1 = radius * s;
}

}  // namespace dpsharp::philox
