// RDP curve -> (epsilon, delta): the classic tail bound and the tight conversion.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "dpsharp/numerics.hpp"
#include "dpsharp/rdp.hpp"

namespace dpsharp::rdp {
namespace {

void check_curve(const double* orders, const double* rdp, std::size_t n, int kind) {
  if (n == 0) throw std::invalid_argument("orders must not be empty");
  if (kind != 0 && kind != 1) throw std::invalid_argument("conversion kind must be 0 or 1");
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(orders[i]) || !(orders[i] > 1.0)) {
      throw std::invalid_argument("orders must be finite and > 1, got " + std::to_string(orders[i]));
    }
    if (std::isnan(rdp[i]) || rdp[i] < 0.0) {
      throw std::invalid_argument("rdp values must be >= 0 (or +inf), got " + std::to_string(rdp[i]));
    }
  }
}

// `value` raised past the rounding of a short formula whose terms have absolute values summing
// to `magnitude`: 8 units of roundoff of it (each term is within a few of its exact value), then
// the next double. The conversions are rounded up this way: rounded to nearest, delta read
// 5.9e-14 relative below the formula and a near-zero epsilon 8e-14.
double raised(double value, double magnitude) noexcept {
  if (!std::isfinite(value)) return value;  // (+-inf are exact)
  return std::nextafter(value + 0x1p-50 * magnitude, kInf);
}

}  // namespace

Conversion epsilon_from_rdp(const double* orders, const double* rdp, std::size_t n, double delta,
                            int kind) {
  check_curve(orders, rdp, n, kind);
  if (!std::isfinite(delta) || !(delta > 0.0) || !(delta < 1.0)) {
    throw std::invalid_argument("delta must be in (0, 1), got " + std::to_string(delta));
  }
  const double log_delta = std::log(delta);
  Conversion best{kInf, 0};
  for (std::size_t i = 0; i < n; ++i) {
    const double a = orders[i], r = rdp[i];
    double eps;
    if (r == kInf) {
      eps = kInf;
    } else if (kind == 0) {
      eps = raised(r - log_delta / (a - 1.0), r - log_delta / (a - 1.0));
    } else if (delta * delta > -std::expm1(-r) * (1.0 + 0x1p-49)) {
      // Total variation <= sqrt(1 - exp(-KL)) <= sqrt(1 - exp(-D_alpha)) <= delta: (0, delta)-DP
      // (decided with a margin for the rounding of both sides: without it, a D_alpha within an
      // ulp of the threshold answered 0 where the formula below gives 0.41).
      eps = 0.0;
    } else if (a > 1.01) {
      const double shape = std::log1p(-1.0 / a), log_a = std::log(a);
      eps = raised(r + shape - (log_delta + log_a) / (a - 1.0),
                   r - shape + (log_a - log_delta) / (a - 1.0));
    } else {
      eps = kInf;  // the tight bound is numerically unstable as alpha -> 1
    }
    if (eps < best.value) best = {eps, i};
  }
  if (best.value < 0.0) best.value = 0.0;
  return best;
}

Conversion delta_from_rdp(const double* orders, const double* rdp, std::size_t n, double epsilon,
                          int kind) {
  check_curve(orders, rdp, n, kind);
  if (!std::isfinite(epsilon) || epsilon < 0.0) {
    throw std::invalid_argument("epsilon must be in [0, inf), got " + std::to_string(epsilon));
  }
  Conversion best{kInf, 0};  // log delta
  for (std::size_t i = 0; i < n; ++i) {
    const double a = orders[i], r = rdp[i];
    double log_delta;
    if (r == kInf) {
      log_delta = kInf;
    } else if (kind == 0) {
      log_delta = raised((a - 1.0) * (r - epsilon), (a - 1.0) * (r + epsilon));
    } else {
      // 1 - e^{-r} by expm1: exp(-r) rounds to 1 below r ~ 1.1e-16 (delta would read 0) and
      // loses 1e-16 / r relative above it.
      log_delta = r == 0.0 ? kNegInf : 0.5 * std::log(-std::expm1(-r));
      log_delta = raised(log_delta, std::abs(log_delta) + 1.0);
      if (a > 1.01) {
        const double shape = std::log1p(-1.0 / a), log_a = std::log(a);
        const double bound = raised((a - 1.0) * (r - epsilon + shape) - log_a,
                                    (a - 1.0) * (r + epsilon - shape) + log_a);
        if (bound < log_delta) log_delta = bound;
      }
    }
    if (log_delta < best.value) best = {log_delta, i};
  }
  // (exp is within an ulp: one double up; a log delta of -inf is an exact 0)
  if (best.value >= 0.0) {
    best.value = 1.0;
  } else if (best.value > kNegInf) {
    best.value = std::min(std::nextafter(std::exp(best.value), kInf), 1.0);
  } else {
    best.value = 0.0;
  }
  return best;
}

}  // namespace dpsharp::rdp
