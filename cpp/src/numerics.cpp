#include "dpsharp/numerics.hpp"

namespace dpsharp {

double log_normal_cdf(double x) noexcept {
  if (std::isnan(x)) return kNaN;
  if (x == kInf) return 0.0;
  if (x == kNegInf) return kNegInf;
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  if (x > -20.0) {
    // erfc is accurate to full relative precision for every argument in this range.
    // For x > 0 go through 1 - Phi(x) = erfc(x/sqrt2)/2 so log1p keeps the tiny tail.
    if (x > 0.0) return std::log1p(-0.5 * std::erfc(x * kInvSqrt2));
    return std::log(0.5 * std::erfc(-x * kInvSqrt2));
  }
  // Phi(x) = phi(x)/|x| * (1 - 1/x^2 + 3/x^4 - 15/x^6 + ...) for x -> -inf (Abramowitz and
  // Stegun 26.2.12). At |x| >= 20 the terms shrink by >= 1/400 each until k ~ 200, so summing
  // until the term is below 1e-17 of the total is both convergent in practice and accurate.
  const double x2 = x * x;
  double term = 1.0;
  double series = 1.0;
  for (int k = 1; k < 40; ++k) {
    term *= -(2.0 * k - 1.0) / x2;
    series += term;
    if (std::fabs(term) < 1e-17 * std::fabs(series)) break;
  }
  constexpr double kLogSqrt2Pi = 0.91893853320467274178;
  return -0.5 * x2 - kLogSqrt2Pi - std::log(-x) + std::log(series);
}

}  // namespace dpsharp
