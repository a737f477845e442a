// Log-space arithmetic shared by every accountant in the core.
//
// Privacy numerics combine quantities that span hundreds of orders of magnitude (log-moments
// of order 10^4, deltas of 1e-15), so everything is carried as a logarithm and combined with
// the stable identities below. Nothing here may be compiled with -ffast-math: the infinities
// are meaningful (log 0 = -inf is "no mass", +inf is "no guarantee").
#pragma once

#include <cmath>
#include <limits>

namespace dpsharp {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// log(exp(a) + exp(b)) without overflow; -inf is the identity.
inline double log_add_exp(double a, double b) noexcept {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double hi = a > b ? a : b;
  const double lo = a > b ? b : a;
  return hi + std::log1p(std::exp(lo - hi));
}

// log(exp(a) - exp(b)) for a >= b; returns NaN when a < b (a negative mass is a bug upstream).
inline double log_sub_exp(double a, double b) noexcept {
  if (b == kNegInf) return a;
  if (a < b) return kNaN;
  if (a == b) return kNegInf;
  // log(e^a - e^b) = a + log(1 - e^{b-a}); log1p(-exp(x)) loses accuracy for x near 0,
  // so switch to log(-expm1(x)) there (Maechler 2012, "Accurately computing log(1 - exp(-|a|))").
  const double x = b - a;
  return a + (x > -0.6931471805599453 ? std::log(-std::expm1(x)) : std::log1p(-std::exp(x)));
}

// log(e^a - e^b) for a > b, and -inf (an empty difference) for a <= b: where a and b are two
// rounded logarithms of masses of which the first contains the second, a rounding-induced a < b
// means a difference below their rounding.
inline double log_diff(double a, double b) noexcept {
  if (a <= b) return kNegInf;
  return log_sub_exp(a, b);
}

// log(1/2).
inline constexpr double kLogHalf = -0.6931471805599453;

// log(expm1(y)) for y > 0, without overflow (y + log(1 - e^{-y}) above 1/2, where expm1 would
// overflow for large y and the complement loses nothing).
inline double log_expm1(double y) noexcept {
  if (y > 0.5) return y + std::log1p(-std::exp(-y));
  return std::log(std::expm1(y));
}

// The rounding error of a sum: a + b = sum + two_sum_residual(a, b, sum) exactly for
// sum = fl(a + b) (Knuth's TwoSum, six operations, any order of magnitude; needs IEEE
// arithmetic, no fast-math).
inline double two_sum_residual(double a, double b, double sum) noexcept {
  const double b_virtual = sum - a;
  const double a_virtual = sum - b_virtual;
  return (a - a_virtual) + (b - b_virtual);
}

// 1 / x rounded up: the smallest double r >= 1 / x for a positive x (the correctly rounded
// quotient, moved up one ulp where it fell below; the product r x - 1 is exact in one fma, so
// its sign decides). +inf where 1 / x overflows. Where a bound is read off a reciprocal (the
// largest privacy loss 1/b of a Laplace release), rounding it down would understate it.
inline double reciprocal_rounded_up(double x) noexcept {
  const double r = 1.0 / x;
  if (std::isfinite(r) && std::fma(r, x, -1.0) < 0.0) return std::nextafter(r, kInf);
  return r;
}

// log(Phi(x)) for the standard normal CDF, accurate to double precision in both tails:
// erfc for x > -20, the asymptotic Mills-ratio series below (where erfc would underflow).
double log_normal_cdf(double x) noexcept;

}  // namespace dpsharp
