// The running product of a composition's spectra, one factor F^c at a time, with the log-moduli
// that bound its round-off (see pld.hpp: multiply_factor, and _compose_by_products in
// python/dpsharp/accountants/_pld_numerics.py for the argument).
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>

#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

constexpr double kUnit = 0x1p-53;
// Below this the squares of a modulus' parts may lose relative precision (subnormal range
// within a few binades): std::hypot is used there.
constexpr double kSquaresNormal = 0x1p-1000;

// An upper bound on |z|, positive: sqrt(re^2 + im^2) evaluated in floating point is within
// 2.5 u of |z| where the sum of squares is normal (each square, the sum and the root one
// rounding), std::hypot within 1 ulp elsewhere; the factor 1 + 4 u lifts either above |z|, and
// an entry of 0 is taken at the smallest subnormal (any a >= |z| serves the bound, and its
// logarithm stays finite).
double modulus_upper(std::complex<double> z) noexcept {
  const double re = z.real();
  const double im = z.imag();
  const double squares = re * re + im * im;
  const double modulus = squares >= kSquaresNormal && squares <= 0x1p1000
                             ? std::sqrt(squares)
                             : std::hypot(re, im);
  return std::max(modulus * (1.0 + 4.0 * kUnit), std::numeric_limits<double>::denorm_min());
}

// (a + ib)(c + id) = (ac - bd) + i(ad + bc), each part two products and one sum (no fused
// multiply-add: the build turns contraction off), the multiplication whose rounding
// power_rounding in _pld_numerics.py bounds.
inline std::complex<double> times(std::complex<double> x, std::complex<double> y) noexcept {
  return {x.real() * y.real() - x.imag() * y.imag(), x.real() * y.imag() + x.imag() * y.real()};
}

// z^count by repeated squaring (count >= 1): the lowest bit's power first, then each higher set
// bit's square multiplied in, about 2 log2(count) products.
std::complex<double> integer_power(std::complex<double> base, std::int64_t count) noexcept {
  bool have = false;
  std::complex<double> result{1.0, 0.0};
  while (true) {
    if (count & 1) {
      result = have ? times(result, base) : base;
      have = true;
    }
    count >>= 1;
    if (count == 0) return result;
    base = times(base, base);
  }
}

// log(modulus + error) from log(modulus), without rounding the sum modulus + error, whose
// rounding (up to an ulp of the modulus) can be a large part of a small error: with r = error /
// modulus, log(modulus) + log1p(r) for r < 1, by the series r - r^2 / 2 + r^3 / 3 where
// r <= 2^-20 (the next term, r^4 / 4, is below 2^-62 r), and log(modulus + error) directly for
// r >= 1, where the sum's rounding is at most 1.5 u of log1p(r). Within 8 u of
// |log(modulus + error)| + |log(modulus)| (see _LogModuli.slacks in _pld_numerics.py).
inline double log_raised(double modulus, double log_modulus, double error) noexcept {
  const double ratio = error / modulus;
  if (ratio <= 0x1p-20) return log_modulus + ratio * (1.0 - ratio * (0.5 - ratio / 3.0));
  if (ratio < 1.0) return log_modulus + std::log1p(ratio);
  return std::log(modulus + error);
}

}  // namespace

std::int64_t multiply_factor(std::complex<double>* product, double* upper, double* lower,
                             const std::complex<double>* factor, std::int64_t live,
                             std::int64_t count, double error, double cutoff) noexcept {
  const double weight = static_cast<double>(count);
  for (std::int64_t f = 0; f < live; ++f) {
    const double modulus = modulus_upper(factor[f]);
    const double log_modulus = std::log(modulus);
    upper[f] += weight * log_raised(modulus, log_modulus, error);
    lower[f] += weight * log_modulus;
  }
  std::int64_t alive = live;
  if (!std::isnan(cutoff)) {
    while (alive > 0 && !(upper[alive - 1] > cutoff)) --alive;
  }
  for (std::int64_t f = 0; f < alive; ++f) {
    product[f] = times(product[f], integer_power(factor[f], count));
  }
  return alive;
}

}  // namespace dpsharp::pld
