// The noise stream of DP-SGD releases: a counter-based generator (ChaCha with 8 rounds) and a
// Box-Muller transform computed at the precision of the parameter it is added to.
//
// Why this design:
// * ChaCha (Bernstein, "ChaCha, a variant of Salsa20", 2008; block function and state layout of
//   RFC 8439, section 2.3) is a stream cipher: with a secret 256-bit key its output cannot be
//   told from random bits, so in secure mode (a fresh key from the OS CSPRNG per release) the
//   noise is cryptographically unpredictable. Eight rounds (4 double rounds): the best known
//   attacks reach 7 rounds (Aumasson, "Too much crypto", 2019), and Go's runtime random source
//   uses ChaCha8. It is counter-based (any element's noise is a pure function of its counter,
//   so no state is carried and threads, GPUs and ranks never coordinate), and it is only 32-bit
//   additions, xors and rotations, which vectorise on every CPU and GPU.
// * Box-Muller from basic IEEE operations (+, -, *, /, sqrt) and exact bit manipulation, never
//   libm: the same operation sequence gives the same bits on every IEEE machine, so the CPU
//   implementations (one template body instantiated for 16, 8 and 1 lanes), the CUDA kernels
//   (this header under nvcc with -fmad=false) and the pure-torch reference in
//   python/dpsharp/torch/kernels.py all produce the same noise.
// * float32 / bfloat16 parameters get float32 arithmetic, float64 parameters float64: the noise
//   is accurate to a few ulp of the precision it is rounded to anyway (the fused kernel adds it
//   in float64 and rounds once), and the float32 transform runs on twice the lanes.
//
// Stream layout. Key: 8 words (256 bits). Block b of stream (parameter p, release r, rank k):
// the ChaCha8 block function of state [constants | key | b, p, r, k] (RFC 8439's state with
// the 32-bit block counter b and the 96-bit nonce (p, r, k)), 16 output words o[0..15].
// * float32 stream: pair q = 0..4 of block b uses words (o[3q], o[3q+1], o[3q+2]) (o[15] is
//   unused) and gives normals 2q (r cos) and 2q + 1 (r sin): 10 normals per block. Element j
//   of the parameter is normal m = (j mod 160) / 16 of block b = 16 (j / 160) + j mod 16, i.e.
//   chunks of 160 elements interleave 16 consecutive blocks (one SIMD lane per block: a
//   16-lane register holds normal m of 16 blocks, stored contiguously).
// * float64 stream: pair q = 0..3 uses words o[4q..4q+3]: 8 normals per block, chunks of 128
//   elements, element j is normal (j mod 128) / 16 of block 16 (j / 128) + j mod 16.
// Distinct (element, parameter, release, rank) never share a block word, so noise is never
// reused across steps, parameters or ranks. The block counter is 32 bits: at most
// 160 * 2^28 (float32) / 128 * 2^28 (float64) elements per parameter.
//
// Uniforms. Per pair, w = n 2^-53 with n = ((x1 & 0x1FFFFF) << 31) | (x0 >> 1) | 1 an odd 52-bit
// integer (so w is the midpoint of a cell of width 2^-52 in (0, 1/2)), and the top bit t of x1
// picks U = w (t = 1) or U = 1 - w (t = 0): U is uniform over the cell midpoints of (0, 1),
// symmetric, never 0 or 1. E = -ln U is computed from w itself in both cases (-ln w or
// -log1p(-w)), so both ends keep full relative precision: the tail reaches
// |z| <= sqrt(2 ln 2^53) = 8.57 (Gaussian mass beyond: 1e-17 per coordinate) and the radius
// near 0 is resolved to sqrt(2 * 2^-53). The angle is 24 bits (float32) or 53 bits (float64).
// In float32, w is formed as fl(fl(x1 & 0x1FFFFF) 2^-22 + fl((x0 >> 1) | 1) 2^-53): n 2^-53 to
// within two roundings (both conversions from non-negative 32-bit signed integers, the
// correctly rounded conversion every instruction set has).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DPSHARP_HD __host__ __device__
#define DPSHARP_NOISE_INLINE __forceinline__
#elif defined(__GNUC__)
#define DPSHARP_HD
#define DPSHARP_NOISE_INLINE __attribute__((always_inline)) inline
#else
#define DPSHARP_HD
#define DPSHARP_NOISE_INLINE inline
#endif

namespace dpsharp::noise {

// Where one parameter's noise comes from.
struct StreamKey {
  std::uint32_t key[8];
  std::uint32_t parameter;
  std::uint32_t release;
  std::uint32_t rank;
};

constexpr int kLanes = 16;                 // blocks interleaved per chunk
constexpr int kF32PairsPerBlock = 5;
constexpr int kF32NormalsPerBlock = 10;
constexpr int kF32ChunkElements = kLanes * kF32NormalsPerBlock;  // 160
constexpr int kF64PairsPerBlock = 4;
constexpr int kF64NormalsPerBlock = 8;
constexpr int kF64ChunkElements = kLanes * kF64NormalsPerBlock;  // 128
constexpr int kChaChaRounds = 8;

// ---- scalar lane operations -----------------------------------------------------------------
// The template bodies below are written against these free functions; normals.cpp provides the
// same set for 16-lane (AVX-512) and 8-lane (AVX2) vector types. Scalar lanes: uint32_t words,
// float values, bool masks.
template <int kBits>
DPSHARP_HD DPSHARP_NOISE_INLINE std::uint32_t rotl(std::uint32_t x) noexcept {
  return (x << kBits) | (x >> (32 - kBits));
}
DPSHARP_HD DPSHARP_NOISE_INLINE float as_float(std::uint32_t bits) noexcept {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
DPSHARP_HD DPSHARP_NOISE_INLINE std::uint32_t as_bits(float f) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
// Values below 2^31: exact below 2^24, above that rounded to nearest even.
DPSHARP_HD DPSHARP_NOISE_INLINE float small_to_float(std::uint32_t v) noexcept {
  return static_cast<float>(static_cast<std::int32_t>(v));
}
DPSHARP_HD DPSHARP_NOISE_INLINE float select(bool m, float a, float b) noexcept {
  return m ? a : b;
}
// a where the top bit of `m` is set, else b (one blend instruction on x86, which selects by the
// top bit of each lane).
DPSHARP_HD DPSHARP_NOISE_INLINE float select_top_bit(std::uint32_t m, float a, float b) noexcept {
  return (m >> 31) != 0u ? a : b;
}
DPSHARP_HD DPSHARP_NOISE_INLINE float lane_sqrt(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// ---- ChaCha ---------------------------------------------------------------------------------
template <typename U>
DPSHARP_HD DPSHARP_NOISE_INLINE void quarter_round(U& a, U& b, U& c, U& d) noexcept {
  a = a + b;
  d = rotl<16>(d ^ a);
  c = c + d;
  b = rotl<12>(b ^ c);
  a = a + b;
  d = rotl<8>(d ^ a);
  c = c + d;
  b = rotl<7>(b ^ c);
}

// The ChaCha block function with kRounds rounds (RFC 8439 section 2.3 for kRounds = 20) for
// one block per lane: state [constants | key | block, parameter, release, rank].
template <int kRounds, typename U>
DPSHARP_HD DPSHARP_NOISE_INLINE void chacha_block(const StreamKey& s, U block, U (&out)[16])
    noexcept {
  const U initial[16] = {U(0x61707865u), U(0x3320646eu), U(0x79622d32u), U(0x6b206574u),
                         U(s.key[0]),     U(s.key[1]),     U(s.key[2]),     U(s.key[3]),
                         U(s.key[4]),     U(s.key[5]),     U(s.key[6]),     U(s.key[7]),
                         block,           U(s.parameter),  U(s.release),    U(s.rank)};
  U x[16];
  for (int i = 0; i < 16; ++i) x[i] = initial[i];
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__clang__)
#pragma GCC unroll 10
#endif
  for (int round = 0; round < kRounds; round += 2) {
    quarter_round(x[0], x[4], x[8], x[12]);
    quarter_round(x[1], x[5], x[9], x[13]);
    quarter_round(x[2], x[6], x[10], x[14]);
    quarter_round(x[3], x[7], x[11], x[15]);
    quarter_round(x[0], x[5], x[10], x[15]);
    quarter_round(x[1], x[6], x[11], x[12]);
    quarter_round(x[2], x[7], x[8], x[13]);
    quarter_round(x[3], x[4], x[9], x[14]);
  }
  for (int i = 0; i < 16; ++i) out[i] = x[i] + initial[i];
}

// ---- float32 Box-Muller -------------------------------------------------------------------
// Constants as exact float32 values (hex literals: no decimal-to-float rounding to disagree on).
namespace f32 {
constexpr float kTwoPowMinus22 = 0x1p-22f;
constexpr float kTwoPowMinus53 = 0x1p-53f;
constexpr float kTwoPowMinus24 = 0x1p-24f;
constexpr float kSqrtHalf = 0x1.6a09e6p-1f;        // float(sqrt 1/2)
// The bits of the float just above float(sqrt 1/2): mantissas in [this, 2 * this) are
// [sqrt(1/2), float(sqrt 2)] (float(sqrt 2) = 0x1.6a09e6p+0 included).
constexpr std::uint32_t kMantissaFloorBits = 0x3F3504F4u;
constexpr float kLn2Hi = 0x1.62e4p-1f;             // 17 bits: e * kLn2Hi is exact
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;          // float(ln 2 - kLn2Hi)
constexpr float kHalfPi = 0x1.921fb6p+0f;          // float(pi / 2)
constexpr float kRoundMagic = 12582912.0f;         // 1.5 * 2^23
// 1/3, 1/5, 1/7, 1/9 (each the float32 quotient 1.0f / k)
constexpr float kInv3 = 0x1.555556p-2f;
constexpr float kInv5 = 0x1.99999ap-3f;
constexpr float kInv7 = 0x1.24924ap-3f;
constexpr float kInv9 = 0x1.c71c72p-4f;
// 1/3!, 1/5!, 1/7!, 1/9! and 1/2!, 1/4!, ..., 1/10! (float32-rounded)
constexpr float kInvFact3 = 0x1.555556p-3f;
constexpr float kInvFact5 = 0x1.111112p-7f;
constexpr float kInvFact7 = 0x1.a01a02p-13f;
constexpr float kInvFact9 = 0x1.71de3ap-19f;
constexpr float kInvFact2 = 0x1p-1f;
constexpr float kInvFact4 = 0x1.555556p-5f;
constexpr float kInvFact6 = 0x1.6c16c2p-10f;
constexpr float kInvFact8 = 0x1.a01a02p-16f;
constexpr float kInvFact10 = 0x1.27e4fcp-22f;
}  // namespace f32

// Two independent standard normals (r cos theta, r sin theta) from the words (x0, x1, x2) of
// one pair, in float32. U: lane of uint32 words; F: lane of floats (see the layout comment).
//
// -ln U: U = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with s = (m - 1)/(m + 1),
// |s| <= 0.1716, series to s^9 (the first omitted term, 2 s^11 / 11, is under 2e-9 of ln m).
// m and e come from the bits of y = w (tail branch, t = 1) or y = fl(1 - w) (t = 0). Where
// y > sqrt(1/2) (only for t = 0: w < 0.293) that gives m = y, e = 0, and s is formed from w
// itself, s = -w / (2 - w), because fl(1 - w) has lost w's low bits (for w < 2^-24, all of
// them); elsewhere fl(1 - w) is within 2^-25 of 1 - w and U >= 1/2, so -ln U keeps a relative
// error of a few 2^-24.
// sin / cos of 2 pi u, u = (x2 >> 8) 2^-24: quadrant n = round(4u) from the 1.5 * 2^23 trick
// (its bits hold n), remainder f = 4u - n in [-1/2, 1/2] exact, x = f pi/2 in [-pi/4, pi/4],
// Taylor series to x^9 (sin) and x^10 (cos) (truncation < 2e-9), then the rotation by n pi/2.
template <typename U, typename F>
DPSHARP_HD DPSHARP_NOISE_INLINE void gaussian_pair_f32(U x0, U x1, U x2, F& z_cos, F& z_sin)
    noexcept {
  using namespace f32;
  const F w = small_to_float(x1 & U(0x1FFFFFu)) * F(kTwoPowMinus22) +
              small_to_float((x0 >> 1) | U(1u)) * F(kTwoPowMinus53);
  const F y = select_top_bit(x1, w, F(1.0f) - w);
  const auto near_one = y > F(kSqrtHalf);
  // y = m 2^e with m in [sqrt(1/2), sqrt(2)): m's bits are those of y's mantissa placed above
  // kMantissaFloorBits (the float just above sqrt(1/2), so that m <= float(sqrt 2)), e the
  // exponent that makes up the difference (y < 1, so the sum below never wraps).
  const U shifted_bits = as_bits(y) + U(0x3F800000u - kMantissaFloorBits);
  const F e = small_to_float(shifted_bits >> 23) - F(127.0f);
  const F m = as_float((shifted_bits & U(0x7FFFFFu)) + U(kMantissaFloorBits));
  const F num = select(near_one, F(0.0f) - w, m - F(1.0f));
  const F den = select(near_one, F(2.0f) - w, m + F(1.0f));
  const F s = num / den;
  const F s2 = s * s;
  F poly = F(kInv9);
  poly = poly * s2 + F(kInv7);
  poly = poly * s2 + F(kInv5);
  poly = poly * s2 + F(kInv3);
  const F two_s = s + s;
  const F log_m = two_s + two_s * (s2 * poly);
  const F log_u = e * F(kLn2Hi) + (e * F(kLn2Lo) + log_m);
  const F radius = lane_sqrt(F(-2.0f) * log_u);

  const F four_u = small_to_float(x2 >> 8) * F(kTwoPowMinus24 * 4.0f);
  const F shifted = four_u + F(kRoundMagic);
  const U quadrant = as_bits(shifted);  // low two bits: round(4u) mod 4
  const F f = four_u - (shifted - F(kRoundMagic));
  const F x = f * F(kHalfPi);
  const F xx = x * x;
  F sp = F(kInvFact9);
  sp = F(kInvFact7) - xx * sp;
  sp = F(kInvFact5) - xx * sp;
  sp = F(kInvFact3) - xx * sp;
  const F sin_x = x - x * (xx * sp);
  F cp = F(kInvFact10);
  cp = F(kInvFact8) - xx * cp;
  cp = F(kInvFact6) - xx * cp;
  cp = F(kInvFact4) - xx * cp;
  cp = F(kInvFact2) - xx * cp;
  const F cos_x = F(1.0f) - xx * cp;
  const U swap = quadrant << 31;                          // odd quadrants: top bit set
  const U sin_sign = (quadrant & U(2u)) << 30;            // quadrants 2, 3
  const U cos_sign = ((quadrant + U(1u)) & U(2u)) << 30;  // quadrants 1, 2
  const F sin_v = as_float(as_bits(select_top_bit(swap, cos_x, sin_x)) ^ sin_sign);
  const F cos_v = as_float(as_bits(select_top_bit(swap, sin_x, cos_x)) ^ cos_sign);
  z_cos = radius * cos_v;
  z_sin = radius * sin_v;
}

// ---- float64 Box-Muller ------------------------------------------------------------------
// Scalar lanes: uint64_t bits, double values, bool masks (normals.cpp adds 8-lane AVX-512 ones).
DPSHARP_HD DPSHARP_NOISE_INLINE double as_double(std::uint64_t bits) noexcept {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}
DPSHARP_HD DPSHARP_NOISE_INLINE std::uint64_t as_bits(double d) noexcept {
  std::uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}
// Exact for values below 2^53.
DPSHARP_HD DPSHARP_NOISE_INLINE double small_to_double(std::uint64_t v) noexcept {
  return static_cast<double>(static_cast<std::int64_t>(v));
}
DPSHARP_HD DPSHARP_NOISE_INLINE bool nonzero(std::uint64_t v) noexcept { return v != 0u; }
DPSHARP_HD DPSHARP_NOISE_INLINE double select(bool m, double a, double b) noexcept {
  return m ? a : b;
}
DPSHARP_HD DPSHARP_NOISE_INLINE double lane_sqrt(double x) noexcept {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Natural log of u in (0, 1) (u >= 2^-53): u = m 2^e, m in [sqrt(1/2), sqrt(2)),
// ln m = 2 atanh s, s = (m - 1)/(m + 1), |s| <= 0.1716, series to s^21 (< 1e-17 relative).
template <typename D>
DPSHARP_HD DPSHARP_NOISE_INLINE D log_unit(D u) noexcept {
  using U64 = decltype(as_bits(u));
  const U64 bits = as_bits(u);
  D exponent = small_to_double((bits >> 52) & U64(0x7FFu)) - D(1023.0);
  D m = as_double((bits & U64(0x000FFFFFFFFFFFFFull)) | U64(0x3FF0000000000000ull));  // [1, 2)
  const auto big = m > D(1.4142135623730951);
  m = select(big, m * D(0.5), m);
  exponent = select(big, exponent + D(1.0), exponent);
  const D s = (m - D(1.0)) / (m + D(1.0));
  const D s2 = s * s;
  D poly = D(1.0 / 21.0);
  poly = poly * s2 + D(1.0 / 19.0);
  poly = poly * s2 + D(1.0 / 17.0);
  poly = poly * s2 + D(1.0 / 15.0);
  poly = poly * s2 + D(1.0 / 13.0);
  poly = poly * s2 + D(1.0 / 11.0);
  poly = poly * s2 + D(1.0 / 9.0);
  poly = poly * s2 + D(1.0 / 7.0);
  poly = poly * s2 + D(1.0 / 5.0);
  poly = poly * s2 + D(1.0 / 3.0);
  const D two_s = D(2.0) * s;
  return exponent * D(0.6931471805599453) + (two_s + two_s * (s2 * poly));
}

// sin and cos of 2 pi u for u in [0, 1): quadrant n = round(4u) (1.5 * 2^52 trick), exact
// remainder f = 4u - n in [-1/2, 1/2], x = f pi/2, Taylor series to x^17 / x^18.
template <typename D>
DPSHARP_HD DPSHARP_NOISE_INLINE void sincos_two_pi(D u, D& sin_out, D& cos_out) noexcept {
  const D four_u = D(4.0) * u;
  const D quadrant_f = (four_u + D(6755399441055744.0)) - D(6755399441055744.0);  // 0..4
  const D f = four_u - quadrant_f;
  const D quadrant = select(quadrant_f >= D(4.0), quadrant_f - D(4.0), quadrant_f);
  const D x = f * D(1.5707963267948966);
  const D x2 = x * x;
  D sp = D(-1.0 / 355687428096000.0);    // -1/17!
  sp = sp * x2 + D(1.0 / 1307674368000.0);  // 1/15!
  sp = sp * x2 - D(1.0 / 6227020800.0);     // -1/13!
  sp = sp * x2 + D(1.0 / 39916800.0);       // 1/11!
  sp = sp * x2 - D(1.0 / 362880.0);         // -1/9!
  sp = sp * x2 + D(1.0 / 5040.0);           // 1/7!
  sp = sp * x2 - D(1.0 / 120.0);            // -1/5!
  sp = sp * x2 + D(1.0 / 6.0);              // 1/3!
  const D sin_x = x - x * (x2 * sp);
  D cp = D(1.0 / 6402373705728000.0);  // 1/18!
  cp = cp * x2 - D(1.0 / 20922789888000.0);
  cp = cp * x2 + D(1.0 / 87178291200.0);
  cp = cp * x2 - D(1.0 / 479001600.0);
  cp = cp * x2 + D(1.0 / 3628800.0);
  cp = cp * x2 - D(1.0 / 40320.0);
  cp = cp * x2 + D(1.0 / 720.0);
  cp = cp * x2 - D(1.0 / 24.0);
  cp = cp * x2 + D(1.0 / 2.0);
  const D cos_x = D(1.0) - x2 * cp;
  const auto swap = (quadrant == D(1.0)) | (quadrant == D(3.0));
  const D sign_sin = select(quadrant >= D(2.0), D(-1.0), D(1.0));
  const D sign_cos = select((quadrant == D(1.0)) | (quadrant == D(2.0)), D(-1.0), D(1.0));
  sin_out = sign_sin * select(swap, cos_x, sin_x);
  cos_out = sign_cos * select(swap, sin_x, cos_x);
}

// Two standard normals in float64 from the words (x0, x1, x2, x3) of one pair (32-bit values
// held in 64-bit lanes): U as in the float32 transform but exact (w = n 2^-53, 1 - w exact),
// the angle u = 53 bits of (x2, x3).
template <typename U64, typename D>
DPSHARP_HD DPSHARP_NOISE_INLINE void gaussian_pair_f64(U64 x0, U64 x1, U64 x2, U64 x3, D& z_cos,
                                                       D& z_sin) noexcept {
  const U64 n = ((x1 & U64(0x1FFFFFu)) << 31) | (x0 >> 1) | U64(1u);
  const D w = small_to_double(n) * D(0x1p-53);
  const D u = select(nonzero(x1 >> 31), w, D(1.0) - w);
  const D radius = lane_sqrt(D(-2.0) * log_unit(u));
  const U64 k = (x2 << 21) | (x3 >> 11);
  D s, c;
  sincos_two_pi(small_to_double(k) * D(0x1p-53), s, c);
  z_cos = radius * c;
  z_sin = radius * s;
}

// ---- one block's normals (scalar; the CUDA kernels and the portable CPU path) --------------
// out[m] = normal m of block `block` (m < 10 for float32, m < 8 for float64).
DPSHARP_HD inline void block_normals_f32(const StreamKey& s, std::uint32_t block,
                                         float (&out)[kF32NormalsPerBlock]) noexcept {
  std::uint32_t words[16];
  chacha_block<kChaChaRounds>(s, block, words);
  for (int q = 0; q < kF32PairsPerBlock; ++q) {
    gaussian_pair_f32(words[3 * q], words[3 * q + 1], words[3 * q + 2], out[2 * q],
                      out[2 * q + 1]);
  }
}

DPSHARP_HD inline void block_normals_f64(const StreamKey& s, std::uint32_t block,
                                         double (&out)[kF64NormalsPerBlock]) noexcept {
  std::uint32_t words[16];
  chacha_block<kChaChaRounds>(s, block, words);
  for (int q = 0; q < kF64PairsPerBlock; ++q) {
    gaussian_pair_f64<std::uint64_t, double>(words[4 * q], words[4 * q + 1], words[4 * q + 2],
                                             words[4 * q + 3], out[2 * q], out[2 * q + 1]);
  }
}

}  // namespace dpsharp::noise
