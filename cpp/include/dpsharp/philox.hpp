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
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kMul0, counter.v[0], hi0, lo0);
    mulhilo32(kMul1, counter.v[2], hi1, lo1);
    const Block next{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    counter = next;
  }
  return counter;
}

// 53-bit uniforms from one block: u1 in (0, 1] (safe for log), u2 in [0, 1).
DPSHARP_HD inline void block_uniforms(const Block& b, double& u1, double& u2) noexcept {
  constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
  const std::uint64_t k1 = (static_cast<std::uint64_t>(b.v[0]) << 21) | (b.v[1] >> 11);
  const std::uint64_t k2 = (static_cast<std::uint64_t>(b.v[2]) << 21) | (b.v[3] >> 11);
  u1 = static_cast<double>(k1 + 1) * kTwoPowMinus53;
  u2 = static_cast<double>(k2) * kTwoPowMinus53;
}

// Natural log of u in (0, 1] (normal numbers only; u >= 2^-53 here). u = m 2^e with
// m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.1716, series to
// s^21 (truncation error < 1e-17 relative).
DPSHARP_HD inline double log_unit(double u) noexcept {
  std::uint64_t bits;
  std::memcpy(&bits, &u, sizeof bits);
  double exponent = static_cast<double>(static_cast<std::int64_t>((bits >> 52) & 0x7FFu) - 1023);
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  double m;
  std::memcpy(&m, &bits, sizeof m);
  if (m > 1.4142135623730951) {
    m = m * 0.5;
    exponent = exponent + 1.0;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double poly = 1.0 / 21.0;
  poly = poly * s2 + 1.0 / 19.0;
  poly = poly * s2 + 1.0 / 17.0;
  poly = poly * s2 + 1.0 / 15.0;
  poly = poly * s2 + 1.0 / 13.0;
  poly = poly * s2 + 1.0 / 11.0;
  poly = poly * s2 + 1.0 / 9.0;
  poly = poly * s2 + 1.0 / 7.0;
  poly = poly * s2 + 1.0 / 5.0;
  poly = poly * s2 + 1.0 / 3.0;
  const double log_m = 2.0 * s + 2.0 * s * (s2 * poly);
  return exponent * 0.6931471805599453 + log_m;
}

// sin and cos of 2 pi u for u in [0, 1): the quadrant comes exactly from 4u, the remainder
// f in [-1/2, 1/2] is exact, x = f pi/2 in [-pi/4, pi/4]; Taylor series to x^17 / x^18.
DPSHARP_HD inline void sincos_two_pi(double u, double& sin_out, double& cos_out) noexcept {
  const double four_u = 4.0 * u;
  const double quadrant_f = static_cast<double>(static_cast<std::int64_t>(four_u + 0.5));
  const double f = four_u - quadrant_f;
  const int quadrant = static_cast<int>(quadrant_f) & 3;
  const double x = f * 1.5707963267948966;
  const double x2 = x * x;
  double sp = -1.0 / 355687428096000.0;      // -1/17!
  sp = sp * x2 + 1.0 / 1307674368000.0;      // 1/15!
  sp = sp * x2 - 1.0 / 6227020800.0;         // -1/13!
  sp = sp * x2 + 1.0 / 39916800.0;           // 1/11!
  sp = sp * x2 - 1.0 / 362880.0;             // -1/9!
  sp = sp * x2 + 1.0 / 5040.0;               // 1/7!
  sp = sp * x2 - 1.0 / 120.0;                // -1/5!
  sp = sp * x2 + 1.0 / 6.0;                  // 1/3!  (sign applied below)
  const double sin_x = x - x * (x2 * sp);
  double cp = 1.0 / 6402373705728000.0;      // 1/18!
  cp = cp * x2 - 1.0 / 20922789888000.0;     // -1/16!
  cp = cp * x2 + 1.0 / 87178291200.0;        // 1/14!
  cp = cp * x2 - 1.0 / 479001600.0;          // -1/12!
  cp = cp * x2 + 1.0 / 3628800.0;            // 1/10!
  cp = cp * x2 - 1.0 / 40320.0;              // -1/8!
  cp = cp * x2 + 1.0 / 720.0;                // 1/6!
  cp = cp * x2 - 1.0 / 24.0;                 // -1/4!
  cp = cp * x2 + 1.0 / 2.0;                  // 1/2!  (sign applied below)
  const double cos_x = 1.0 - x2 * cp;
  // Rotate by quadrant * pi/2 (branch-free so loops vectorise).
  const double sel_swap = static_cast<double>(quadrant & 1);
  const double sign_sin = (quadrant == 2 || quadrant == 3) ? -1.0 : 1.0;
  const double sign_cos = (quadrant == 1 || quadrant == 2) ? -1.0 : 1.0;
  const double s_raw = sel_swap != 0.0 ? cos_x : sin_x;
  const double c_raw = sel_swap != 0.0 ? sin_x : cos_x;
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
