// Vector-width builds of plain C++ loops: the same body compiled for AVX-512, AVX2 and the
// baseline instruction set, picked once at run time (the compiler vectorises the loops at each
// width). Bodies that are element-wise or per-lane sums in a fixed order compute the same bits
// in every build, since -ffp-contract=off rules out FMA.
//
// Use: an always-inline `name##_body` function, then DPSHARP_WIDTH_BUILDS(name, (params),
// (args)) defines name##_avx512 / name##_avx2 / name##_baseline, and
// DPSHARP_WIDTH_DISPATCH(vector_width(), name, args...) calls the one for this CPU.
#pragma once

namespace dpsharp {

enum class Width { kBaseline, kAvx2, kAvx512 };

inline Width vector_width() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const Width width = __builtin_cpu_supports("avx512f") ? Width::kAvx512
                             : __builtin_cpu_supports("avx2")  ? Width::kAvx2
                                                               : Width::kBaseline;
  return width;
#else
  return Width::kBaseline;
#endif
}

}  // namespace dpsharp

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DPSHARP_WIDTH_DISPATCH(width, name, ...)            \
  switch (width) {                                          \
    case ::dpsharp::Width::kAvx512: name##_avx512(__VA_ARGS__); break; \
    case ::dpsharp::Width::kAvx2: name##_avx2(__VA_ARGS__); break;     \
    default: name##_baseline(__VA_ARGS__); break;           \
  }
#define DPSHARP_WIDTH_BUILDS(name, params, args)                                       \
  __attribute__((target("avx512f"))) void name##_avx512 params { name##_body args; } \
  __attribute__((target("avx2"))) void name##_avx2 params { name##_body args; }      \
  void name##_baseline params { name##_body args; }
#else
#define DPSHARP_WIDTH_DISPATCH(width, name, ...) name##_baseline(__VA_ARGS__);
#define DPSHARP_WIDTH_BUILDS(name, params, args) \
  void name##_baseline params { name##_body args; }
#endif
