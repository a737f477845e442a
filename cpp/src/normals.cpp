// Bulk standard normals (normals.hpp). One body, noise_stream.hpp's templates, instantiated on
// three lane types:
//
// * 16 lanes of AVX-512 (F + DQ + VL): 16 ChaCha blocks per register, one chunk of the stream
//   per block function call; 512-bit rotations are single instructions.
// * 8 lanes of AVX2: two half chunks per chunk (rotations as two shifts and an or).
// * 1 lane of plain C++ (uint32_t / float / bool): the portable implementation, and the same
//   functions nvcc compiles for the CUDA kernels.
//
// Each lane operation below is one IEEE operation or an exact bit manipulation (no FMA: the
// targets do not enable it and the build passes -ffp-contract=off), so every implementation
// evaluates the same operations on the same values and produces the same bits.
//
// The float64 stream shares the vectorised ChaCha blocks and runs noise_stream.hpp's float64
// transform on 8 (AVX-512) or 4 (AVX2) double lanes; the portable build runs it per lane.
#include "dpsharp/normals.hpp"

#include <algorithm>
#include <cstring>

#include "dpsharp/noise_stream.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DPSHARP_X86_NORMALS 1
// The vector-typed helpers below are internal and always inlined: no vector-argument ABI to keep.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace dpsharp::clip {
namespace {

using noise::StreamKey;
constexpr int kLanes = noise::kLanes;

// Stores of one lane (the vector types' overloads are found by argument-dependent lookup).
DPSHARP_NOISE_INLINE void store(float* p, float v) noexcept { *p = v; }
DPSHARP_NOISE_INLINE void store_words(std::uint32_t* p, std::uint32_t v) noexcept { *p = v; }
template <typename U>
DPSHARP_NOISE_INLINE U load_words(const std::uint32_t* p);
template <>
DPSHARP_NOISE_INLINE std::uint32_t load_words<std::uint32_t>(const std::uint32_t* p) {
  return *p;
}

// Whole chunks [chunk, chunk + chunks) of the float32 stream into out (160 floats per chunk),
// kWidth lanes at a time. Lane::index() holds 0, 1, ..., kWidth - 1; store(p, v) writes kWidth
// floats.
template <typename U, typename F, int kWidth>
DPSHARP_NOISE_INLINE void f32_chunks(const StreamKey& s, std::int64_t chunk, std::int64_t chunks,
                                     float* out, U lane_index) noexcept {
  for (std::int64_t c = 0; c < chunks; ++c) {
    float* dst = out + c * noise::kF32ChunkElements;
    for (int part = 0; part < kLanes / kWidth; ++part) {
      const auto block0 = static_cast<std::uint32_t>((chunk + c) * kLanes + part * kWidth);
      U words[16];
      noise::chacha_block<noise::kChaChaRounds>(s, U(block0) + lane_index, words);
      alignas(64) std::uint32_t spilled[15][kWidth];
      for (int i = 0; i < 15; ++i) store_words(spilled[i], words[i]);
#pragma GCC unroll 5
      for (int q = 0; q < noise::kF32PairsPerBlock; ++q) {
        F z_cos, z_sin;
        noise::gaussian_pair_f32(load_words<U>(spilled[3 * q]), load_words<U>(spilled[3 * q + 1]),
                                 load_words<U>(spilled[3 * q + 2]), z_cos, z_sin);
        store(dst + kLanes * (2 * q) + part * kWidth, z_cos);
        store(dst + kLanes * (2 * q + 1) + part * kWidth, z_sin);
      }
    }
  }
}

// Whole chunks of the float64 stream (128 doubles per chunk): vectorised ChaCha, then the
// scalar float64 transform per lane (the AVX-512 build has a vectorised transform below).
template <typename U, int kWidth>
DPSHARP_NOISE_INLINE void f64_chunks(const StreamKey& s, std::int64_t chunk, std::int64_t chunks,
                                     double* out, U lane_index) noexcept {
  for (std::int64_t c = 0; c < chunks; ++c) {
    double* dst = out + c * noise::kF64ChunkElements;
    for (int part = 0; part < kLanes / kWidth; ++part) {
      const auto block0 = static_cast<std::uint32_t>((chunk + c) * kLanes + part * kWidth);
      U words[16];
      noise::chacha_block<noise::kChaChaRounds>(s, U(block0) + lane_index, words);
      alignas(64) std::uint32_t w[16][kWidth];
      for (int i = 0; i < 16; ++i) store_words(w[i], words[i]);
      for (int lane = 0; lane < kWidth; ++lane) {
        for (int q = 0; q < noise::kF64PairsPerBlock; ++q) {
          noise::gaussian_pair_f64<std::uint64_t, double>(
              w[4 * q][lane], w[4 * q + 1][lane], w[4 * q + 2][lane], w[4 * q + 3][lane],
              dst[kLanes * (2 * q) + part * kWidth + lane],
              dst[kLanes * (2 * q + 1) + part * kWidth + lane]);
        }
      }
    }
  }
}

// ---- 1 lane ----------------------------------------------------------------------------------
void f32_chunks_portable(const StreamKey& s, std::int64_t chunk, std::int64_t chunks,
                         float* out) noexcept {
  f32_chunks<std::uint32_t, float, 1>(s, chunk, chunks, out, 0u);
}
void f64_chunks_portable(const StreamKey& s, std::int64_t chunk, std::int64_t chunks,
                         double* out) noexcept {
  f64_chunks<std::uint32_t, 1>(s, chunk, chunks, out, 0u);
}

#if defined(DPSHARP_X86_NORMALS)
// ---- 8 lanes of AVX2 ---------------------------------------------------------------------------
// The lane operations carry the target but are not always_inline: they are called from the
// instruction-set-neutral templates of noise_stream.hpp, and GCC may only inline a target
// function into a caller of that target. The entry points below are `flatten`, which inlines
// the whole call tree (templates and lane operations) into them, where the target matches.
#define DPSHARP_AVX2 __attribute__((target("avx2"))) inline

struct U8 {
  __m256i v;
  U8() = default;
  DPSHARP_AVX2 U8(__m256i x) : v(x) {}  // NOLINT(google-explicit-constructor)
  DPSHARP_AVX2 U8(std::uint32_t c)      // NOLINT(google-explicit-constructor)
      : v(_mm256_set1_epi32(static_cast<int>(c))) {}
};
struct F8 {
  __m256 v;
  F8() = default;
  DPSHARP_AVX2 F8(__m256 x) : v(x) {}                   // NOLINT(google-explicit-constructor)
  DPSHARP_AVX2 F8(float c) : v(_mm256_set1_ps(c)) {}  // NOLINT(google-explicit-constructor)
};
struct M8 {
  __m256 v;  // all ones where true
};
DPSHARP_AVX2 U8 operator+(U8 a, U8 b) { return _mm256_add_epi32(a.v, b.v); }
DPSHARP_AVX2 U8 operator^(U8 a, U8 b) { return _mm256_xor_si256(a.v, b.v); }
DPSHARP_AVX2 U8 operator|(U8 a, U8 b) { return _mm256_or_si256(a.v, b.v); }
DPSHARP_AVX2 U8 operator&(U8 a, U8 b) { return _mm256_and_si256(a.v, b.v); }
DPSHARP_AVX2 U8 operator<<(U8 a, int n) { return _mm256_slli_epi32(a.v, n); }
DPSHARP_AVX2 U8 operator>>(U8 a, int n) { return _mm256_srli_epi32(a.v, n); }
DPSHARP_AVX2 F8 operator+(F8 a, F8 b) { return _mm256_add_ps(a.v, b.v); }
DPSHARP_AVX2 F8 operator-(F8 a, F8 b) { return _mm256_sub_ps(a.v, b.v); }
DPSHARP_AVX2 F8 operator*(F8 a, F8 b) { return _mm256_mul_ps(a.v, b.v); }
DPSHARP_AVX2 F8 operator/(F8 a, F8 b) { return _mm256_div_ps(a.v, b.v); }
DPSHARP_AVX2 M8 operator>(F8 a, F8 b) { return M8{_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ)}; }
template <int kBits>
DPSHARP_AVX2 U8 rotl(U8 x) {
  if constexpr (kBits == 16) {  // whole-byte rotations: one byte shuffle instead of three ops
    return _mm256_shuffle_epi8(x.v, _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14,
                                                     15, 12, 13, 2, 3, 0, 1, 6, 7, 4, 5, 10,
                                                     11, 8, 9, 14, 15, 12, 13));
  } else if constexpr (kBits == 8) {
    return _mm256_shuffle_epi8(x.v, _mm256_setr_epi8(3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15,
                                                     12, 13, 14, 3, 0, 1, 2, 7, 4, 5, 6, 11, 8,
                                                     9, 10, 15, 12, 13, 14));
  } else {
    return _mm256_or_si256(_mm256_slli_epi32(x.v, kBits), _mm256_srli_epi32(x.v, 32 - kBits));
  }
}
DPSHARP_AVX2 F8 as_float(U8 x) { return _mm256_castsi256_ps(x.v); }
DPSHARP_AVX2 U8 as_bits(F8 x) { return _mm256_castps_si256(x.v); }
DPSHARP_AVX2 F8 small_to_float(U8 x) { return _mm256_cvtepi32_ps(x.v); }
DPSHARP_AVX2 F8 select(M8 m, F8 a, F8 b) { return _mm256_blendv_ps(b.v, a.v, m.v); }
DPSHARP_AVX2 F8 select_top_bit(U8 m, F8 a, F8 b) {
  return _mm256_blendv_ps(b.v, a.v, _mm256_castsi256_ps(m.v));
}
DPSHARP_AVX2 F8 lane_sqrt(F8 x) { return _mm256_sqrt_ps(x.v); }
DPSHARP_AVX2 void store(float* p, F8 v) { _mm256_storeu_ps(p, v.v); }
DPSHARP_AVX2 void store_words(std::uint32_t* p, U8 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v.v);
}
template <>
DPSHARP_AVX2 U8 load_words<U8>(const std::uint32_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

__attribute__((target("avx2"), flatten)) void f32_chunks_avx2(const StreamKey& s, std::int64_t chunk,
                                                     std::int64_t chunks, float* out) noexcept {
  f32_chunks<U8, F8, 8>(s, chunk, chunks, out, U8(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
// 4 float64 lanes for the float64 transform: 64-bit words, doubles, all-ones masks. AVX2 has no
// 64-bit integer to double conversion: small_to_double adds the exact conversions of the high
// and low 32-bit halves, each by the 2^52 trick (exact, hence the scalar static_cast's value).
struct U64x4 {
  __m256i v;
  U64x4() = default;
  DPSHARP_AVX2 U64x4(__m256i x) : v(x) {}  // NOLINT(google-explicit-constructor)
  DPSHARP_AVX2 U64x4(std::uint64_t c)      // NOLINT(google-explicit-constructor)
      : v(_mm256_set1_epi64x(static_cast<long long>(c))) {}
};
struct D4 {
  __m256d v;
  D4() = default;
  DPSHARP_AVX2 D4(__m256d x) : v(x) {}                    // NOLINT(google-explicit-constructor)
  DPSHARP_AVX2 D4(double c) : v(_mm256_set1_pd(c)) {}  // NOLINT(google-explicit-constructor)
};
struct MaskD4 {
  __m256d v;  // all ones where true
};
DPSHARP_AVX2 U64x4 operator|(U64x4 a, U64x4 b) { return _mm256_or_si256(a.v, b.v); }
DPSHARP_AVX2 U64x4 operator&(U64x4 a, U64x4 b) { return _mm256_and_si256(a.v, b.v); }
DPSHARP_AVX2 U64x4 operator<<(U64x4 a, int n) { return _mm256_slli_epi64(a.v, n); }
DPSHARP_AVX2 U64x4 operator>>(U64x4 a, int n) { return _mm256_srli_epi64(a.v, n); }
DPSHARP_AVX2 D4 operator+(D4 a, D4 b) { return _mm256_add_pd(a.v, b.v); }
DPSHARP_AVX2 D4 operator-(D4 a, D4 b) { return _mm256_sub_pd(a.v, b.v); }
DPSHARP_AVX2 D4 operator*(D4 a, D4 b) { return _mm256_mul_pd(a.v, b.v); }
DPSHARP_AVX2 D4 operator/(D4 a, D4 b) { return _mm256_div_pd(a.v, b.v); }
DPSHARP_AVX2 MaskD4 operator>(D4 a, D4 b) { return MaskD4{_mm256_cmp_pd(a.v, b.v, _CMP_GT_OQ)}; }
DPSHARP_AVX2 MaskD4 operator>=(D4 a, D4 b) {
  return MaskD4{_mm256_cmp_pd(a.v, b.v, _CMP_GE_OQ)};
}
DPSHARP_AVX2 MaskD4 operator==(D4 a, D4 b) {
  return MaskD4{_mm256_cmp_pd(a.v, b.v, _CMP_EQ_OQ)};
}
DPSHARP_AVX2 MaskD4 operator|(MaskD4 a, MaskD4 b) { return MaskD4{_mm256_or_pd(a.v, b.v)}; }
DPSHARP_AVX2 D4 as_double(U64x4 x) { return _mm256_castsi256_pd(x.v); }
DPSHARP_AVX2 U64x4 as_bits(D4 x) { return _mm256_castpd_si256(x.v); }
DPSHARP_AVX2 D4 below_2_52_to_double(U64x4 x) {
  const __m256i magic = _mm256_set1_epi64x(0x4330000000000000LL);
  return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(x.v, magic)),
                       _mm256_set1_pd(4503599627370496.0));
}
DPSHARP_AVX2 D4 small_to_double(U64x4 x) {  // exact below 2^53
  return below_2_52_to_double(x >> 32) * D4(4294967296.0) +
         below_2_52_to_double(x & U64x4(0xFFFFFFFFull));
}
DPSHARP_AVX2 MaskD4 nonzero(U64x4 x) {
  const __m256i zero = _mm256_cmpeq_epi64(x.v, _mm256_setzero_si256());
  return MaskD4{_mm256_castsi256_pd(_mm256_xor_si256(zero, _mm256_set1_epi64x(-1)))};
}
DPSHARP_AVX2 D4 select(MaskD4 m, D4 a, D4 b) { return _mm256_blendv_pd(b.v, a.v, m.v); }
DPSHARP_AVX2 D4 lane_sqrt(D4 x) { return _mm256_sqrt_pd(x.v); }
// Lanes 0..3 (quarter 0) or 4..7 (quarter 1) of 8 32-bit words, zero-extended to 64 bits.
DPSHARP_AVX2 U64x4 widen_half(U8 x, int half) {
  return _mm256_cvtepu32_epi64(half == 0 ? _mm256_castsi256_si128(x.v)
                                         : _mm256_extracti128_si256(x.v, 1));
}

__attribute__((target("avx2"), flatten)) void f64_chunks_avx2(const StreamKey& s,
                                                              std::int64_t chunk,
                                                              std::int64_t chunks,
                                                              double* out) noexcept {
  const U8 lane_index(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (std::int64_t c = 0; c < chunks; ++c) {
    double* dst = out + c * noise::kF64ChunkElements;
    for (int part = 0; part < kLanes / 8; ++part) {
      const auto block0 = static_cast<std::uint32_t>((chunk + c) * kLanes + part * 8);
      U8 words[16];
      noise::chacha_block<noise::kChaChaRounds>(s, U8(block0) + lane_index, words);
      for (int q = 0; q < noise::kF64PairsPerBlock; ++q) {
        for (int half = 0; half < 2; ++half) {
          D4 z_cos, z_sin;
          noise::gaussian_pair_f64(
              widen_half(words[4 * q], half), widen_half(words[4 * q + 1], half),
              widen_half(words[4 * q + 2], half), widen_half(words[4 * q + 3], half), z_cos,
              z_sin);
          _mm256_storeu_pd(dst + kLanes * (2 * q) + part * 8 + 4 * half, z_cos.v);
          _mm256_storeu_pd(dst + kLanes * (2 * q + 1) + part * 8 + 4 * half, z_sin.v);
        }
      }
    }
  }
}
#undef DPSHARP_AVX2

// ---- 16 lanes of AVX-512 -----------------------------------------------------------------------
#define DPSHARP_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl"))) inline
// GCC 12 flags the intentionally undefined pass-through operand inside its own avx512fintrin.h
// set1/mask intrinsics (a known false positive: -Wmaybe-uninitialized).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

struct U16 {
  __m512i v;
  U16() = default;
  DPSHARP_AVX512 U16(__m512i x) : v(x) {}  // NOLINT(google-explicit-constructor)
  DPSHARP_AVX512 U16(std::uint32_t c)      // NOLINT(google-explicit-constructor)
      : v(_mm512_set1_epi32(static_cast<int>(c))) {}
};
struct F16 {
  __m512 v;
  F16() = default;
  DPSHARP_AVX512 F16(__m512 x) : v(x) {}                   // NOLINT(google-explicit-constructor)
  DPSHARP_AVX512 F16(float c) : v(_mm512_set1_ps(c)) {}  // NOLINT(google-explicit-constructor)
};
struct M16 {
  __mmask16 k;
};
DPSHARP_AVX512 U16 operator+(U16 a, U16 b) { return _mm512_add_epi32(a.v, b.v); }
DPSHARP_AVX512 U16 operator^(U16 a, U16 b) { return _mm512_xor_si512(a.v, b.v); }
DPSHARP_AVX512 U16 operator|(U16 a, U16 b) { return _mm512_or_si512(a.v, b.v); }
DPSHARP_AVX512 U16 operator&(U16 a, U16 b) { return _mm512_and_si512(a.v, b.v); }
DPSHARP_AVX512 U16 operator<<(U16 a, int n) {
  return _mm512_slli_epi32(a.v, static_cast<unsigned>(n));
}
DPSHARP_AVX512 U16 operator>>(U16 a, int n) {
  return _mm512_srli_epi32(a.v, static_cast<unsigned>(n));
}
DPSHARP_AVX512 F16 operator+(F16 a, F16 b) { return _mm512_add_ps(a.v, b.v); }
DPSHARP_AVX512 F16 operator-(F16 a, F16 b) { return _mm512_sub_ps(a.v, b.v); }
DPSHARP_AVX512 F16 operator*(F16 a, F16 b) { return _mm512_mul_ps(a.v, b.v); }
DPSHARP_AVX512 F16 operator/(F16 a, F16 b) { return _mm512_div_ps(a.v, b.v); }
DPSHARP_AVX512 M16 operator>(F16 a, F16 b) {
  return M16{_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)};
}
template <int kBits>
DPSHARP_AVX512 U16 rotl(U16 x) {
  return _mm512_rol_epi32(x.v, kBits);
}
DPSHARP_AVX512 F16 as_float(U16 x) { return _mm512_castsi512_ps(x.v); }
DPSHARP_AVX512 U16 as_bits(F16 x) { return _mm512_castps_si512(x.v); }
DPSHARP_AVX512 F16 small_to_float(U16 x) { return _mm512_cvtepi32_ps(x.v); }
DPSHARP_AVX512 F16 select(M16 m, F16 a, F16 b) { return _mm512_mask_blend_ps(m.k, b.v, a.v); }
DPSHARP_AVX512 F16 select_top_bit(U16 m, F16 a, F16 b) {
  return _mm512_mask_blend_ps(_mm512_movepi32_mask(m.v), b.v, a.v);
}
DPSHARP_AVX512 F16 lane_sqrt(F16 x) { return _mm512_sqrt_ps(x.v); }
DPSHARP_AVX512 void store(float* p, F16 v) { _mm512_storeu_ps(p, v.v); }
DPSHARP_AVX512 void store_words(std::uint32_t* p, U16 v) { _mm512_storeu_si512(p, v.v); }
template <>
DPSHARP_AVX512 U16 load_words<U16>(const std::uint32_t* p) { return _mm512_load_si512(p); }

// 8 float64 lanes for the float64 transform: 64-bit words, doubles, 8-bit masks.
struct U64x8 {
  __m512i v;
  U64x8() = default;
  DPSHARP_AVX512 U64x8(__m512i x) : v(x) {}  // NOLINT(google-explicit-constructor)
  DPSHARP_AVX512 U64x8(std::uint64_t c)      // NOLINT(google-explicit-constructor)
      : v(_mm512_set1_epi64(static_cast<long long>(c))) {}
};
struct D8 {
  __m512d v;
  D8() = default;
  DPSHARP_AVX512 D8(__m512d x) : v(x) {}                    // NOLINT(google-explicit-constructor)
  DPSHARP_AVX512 D8(double c) : v(_mm512_set1_pd(c)) {}  // NOLINT(google-explicit-constructor)
};
struct Mask8 {
  __mmask8 k;
};
DPSHARP_AVX512 U64x8 operator|(U64x8 a, U64x8 b) { return _mm512_or_si512(a.v, b.v); }
DPSHARP_AVX512 U64x8 operator&(U64x8 a, U64x8 b) { return _mm512_and_si512(a.v, b.v); }
DPSHARP_AVX512 U64x8 operator<<(U64x8 a, int n) {
  return _mm512_slli_epi64(a.v, static_cast<unsigned>(n));
}
DPSHARP_AVX512 U64x8 operator>>(U64x8 a, int n) {
  return _mm512_srli_epi64(a.v, static_cast<unsigned>(n));
}
DPSHARP_AVX512 D8 operator+(D8 a, D8 b) { return _mm512_add_pd(a.v, b.v); }
DPSHARP_AVX512 D8 operator-(D8 a, D8 b) { return _mm512_sub_pd(a.v, b.v); }
DPSHARP_AVX512 D8 operator*(D8 a, D8 b) { return _mm512_mul_pd(a.v, b.v); }
DPSHARP_AVX512 D8 operator/(D8 a, D8 b) { return _mm512_div_pd(a.v, b.v); }
DPSHARP_AVX512 Mask8 operator>(D8 a, D8 b) {
  return Mask8{_mm512_cmp_pd_mask(a.v, b.v, _CMP_GT_OQ)};
}
DPSHARP_AVX512 Mask8 operator>=(D8 a, D8 b) {
  return Mask8{_mm512_cmp_pd_mask(a.v, b.v, _CMP_GE_OQ)};
}
DPSHARP_AVX512 Mask8 operator==(D8 a, D8 b) {
  return Mask8{_mm512_cmp_pd_mask(a.v, b.v, _CMP_EQ_OQ)};
}
DPSHARP_AVX512 Mask8 operator|(Mask8 a, Mask8 b) {
  return Mask8{static_cast<__mmask8>(a.k | b.k)};
}
DPSHARP_AVX512 D8 as_double(U64x8 x) { return _mm512_castsi512_pd(x.v); }
DPSHARP_AVX512 U64x8 as_bits(D8 x) { return _mm512_castpd_si512(x.v); }
DPSHARP_AVX512 D8 small_to_double(U64x8 x) { return _mm512_cvtepi64_pd(x.v); }  // exact < 2^53
DPSHARP_AVX512 Mask8 nonzero(U64x8 x) { return Mask8{_mm512_test_epi64_mask(x.v, x.v)}; }
DPSHARP_AVX512 D8 select(Mask8 m, D8 a, D8 b) { return _mm512_mask_blend_pd(m.k, b.v, a.v); }
DPSHARP_AVX512 D8 lane_sqrt(D8 x) { return _mm512_sqrt_pd(x.v); }
// Lanes 0..7 (half 0) or 8..15 (half 1) of 16 32-bit words, zero-extended to 64 bits.
DPSHARP_AVX512 U64x8 widen_half(U16 x, int half) {
  return _mm512_cvtepu32_epi64(half == 0 ? _mm512_castsi512_si256(x.v)
                                         : _mm512_extracti64x4_epi64(x.v, 1));
}

__attribute__((target("avx512f,avx512dq,avx512vl"), flatten)) void f32_chunks_avx512(
    const StreamKey& s, std::int64_t chunk, std::int64_t chunks, float* out) noexcept {
  f32_chunks<U16, F16, 16>(
      s, chunk, chunks, out,
      U16(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
}
__attribute__((target("avx512f,avx512dq,avx512vl"), flatten)) void f64_chunks_avx512(
    const StreamKey& s, std::int64_t chunk, std::int64_t chunks, double* out) noexcept {
  const U16 lane_index(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  for (std::int64_t c = 0; c < chunks; ++c) {
    double* dst = out + c * noise::kF64ChunkElements;
    const auto block0 = static_cast<std::uint32_t>((chunk + c) * kLanes);
    U16 words[16];
    noise::chacha_block<noise::kChaChaRounds>(s, U16(block0) + lane_index, words);
    for (int q = 0; q < noise::kF64PairsPerBlock; ++q) {
      for (int half = 0; half < 2; ++half) {
        D8 z_cos, z_sin;
        noise::gaussian_pair_f64(widen_half(words[4 * q], half), widen_half(words[4 * q + 1], half),
                                 widen_half(words[4 * q + 2], half),
                                 widen_half(words[4 * q + 3], half), z_cos, z_sin);
        _mm512_storeu_pd(dst + kLanes * (2 * q) + 8 * half, z_cos.v);
        _mm512_storeu_pd(dst + kLanes * (2 * q + 1) + 8 * half, z_sin.v);
      }
    }
  }
}
#pragma GCC diagnostic pop
#undef DPSHARP_AVX512
#endif

template <typename T>
using ChunkFill = void (*)(const StreamKey&, std::int64_t, std::int64_t, T*) noexcept;

ChunkFill<float> f32_fill(NormalsIsa isa) noexcept {
  switch (isa) {
#if defined(DPSHARP_X86_NORMALS)
    case NormalsIsa::kAvx512: return f32_chunks_avx512;
    case NormalsIsa::kAvx2: return f32_chunks_avx2;
#endif
    default: return f32_chunks_portable;
  }
}

ChunkFill<double> f64_fill(NormalsIsa isa) noexcept {
  switch (isa) {
#if defined(DPSHARP_X86_NORMALS)
    case NormalsIsa::kAvx512: return f64_chunks_avx512;
    case NormalsIsa::kAvx2: return f64_chunks_avx2;
#endif
    default: return f64_chunks_portable;
  }
}

// Normals [first, first + count) from whole chunks: the chunks inside the range are written in
// place, the partial ones at its ends through a one-chunk scratch buffer.
template <typename T, int kChunk>
void normals_range(ChunkFill<T> fill, const StreamKey& s, std::int64_t first, std::int64_t count,
                   T* z) noexcept {
  std::int64_t pos = first;
  const std::int64_t end = first + count;
  while (pos < end) {
    const std::int64_t chunk = pos / kChunk;
    const std::int64_t offset = pos - chunk * kChunk;
    if (offset == 0 && end - pos >= kChunk) {
      const std::int64_t whole = (end - pos) / kChunk;
      fill(s, chunk, whole, z + (pos - first));
      pos += whole * kChunk;
    } else {
      alignas(64) T scratch[kChunk];
      fill(s, chunk, 1, scratch);
      const std::int64_t take = std::min<std::int64_t>(kChunk - offset, end - pos);
      std::memcpy(z + (pos - first), scratch + offset, static_cast<std::size_t>(take) * sizeof(T));
      pos += take;
    }
  }
}

}  // namespace

bool normals_isa_supported(NormalsIsa isa) noexcept {
  switch (isa) {
    case NormalsIsa::kPortable: return true;
#if defined(DPSHARP_X86_NORMALS)
    case NormalsIsa::kAvx2: return __builtin_cpu_supports("avx2");
    case NormalsIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#endif
    default: return false;
  }
}

NormalsIsa best_normals_isa() noexcept {
  static const NormalsIsa best = normals_isa_supported(NormalsIsa::kAvx512) ? NormalsIsa::kAvx512
                                 : normals_isa_supported(NormalsIsa::kAvx2) ? NormalsIsa::kAvx2
                                                                            : NormalsIsa::kPortable;
  return best;
}

void normals_f32(NormalsIsa isa, const NoiseStream& stream, std::int64_t first,
                 std::int64_t count, float* z) noexcept {
  normals_range<float, noise::kF32ChunkElements>(f32_fill(isa), stream, first, count, z);
}

void normals_f64(NormalsIsa isa, const NoiseStream& stream, std::int64_t first,
                 std::int64_t count, double* z) noexcept {
  normals_range<double, noise::kF64ChunkElements>(f64_fill(isa), stream, first, count, z);
}

}  // namespace dpsharp::clip
