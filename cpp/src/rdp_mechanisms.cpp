// Closed-form and bounded RDP curves: the plain Gaussian, Laplace, and the Gaussian on a
// subsample drawn without replacement (replace-one relation).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "dpsharp/numerics.hpp"
#include "dpsharp/rdp.hpp"

namespace dpsharp::rdp {
namespace {

constexpr double kLog2 = 0.69314718055994530942;
constexpr double kMaxOrder = 1e6;

void check_orders(const double* orders, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(orders[i]) || !(orders[i] > 1.0) || orders[i] > kMaxOrder) {
      throw std::invalid_argument("orders must be finite and in (1, 1e6], got " +
                                  std::to_string(orders[i]));
    }
  }
}

void check_positive(const char* name, double value) {
  if (!std::isfinite(value) || !(value > 0.0)) {
    throw std::invalid_argument(std::string(name) + " must be in (0, inf), got " +
                                std::to_string(value));
  }
}

// Theorem 9 of Wang, Balle, Kasiviswanathan 2019 for integer alpha >= 2 with the Gaussian's
// eps(j) = j / (2 sigma^2) and eps(inf) = inf (so every min{2, (e^eps(inf) - 1)^j} is 2):
//   (alpha - 1) D_alpha <= log(1 + gamma^2 C(alpha,2) min{4 (e^eps(2) - 1), 2 e^eps(2)}
//                             + sum_{j=3}^{alpha} 2 gamma^j C(alpha,j) e^{(j-1) eps(j)}),
// capped by the unsampled Gaussian's (alpha - 1) alpha / (2 sigma^2). Returns (alpha-1) D_alpha.
double wor_scaled_bound(double gamma, double sigma, long alpha) {
  const double a = static_cast<double>(alpha);
  const double c = 0.5 / (sigma * sigma);
  const double unsampled = (a - 1.0) * a * c;
  // Once c or e^{eps(2)} overflows, the terms below read inf - inf as NaN: every term of the
  // bound is then +inf (or the unsampled cap is), and so is the bound.
  if (!std::isfinite(2.0 * c)) return kInf;
  const double log_gamma = std::log(gamma);
  const double lgamma_alpha = std::lgamma(a + 1.0);
  const double eps2 = 2.0 * c;
  const double second =
      std::min(std::log(4.0) + std::log(std::expm1(eps2)), kLog2 + eps2);
  double log_sum = 2.0 * log_gamma + std::log(a * (a - 1.0) / 2.0) + second;
  for (long j = 3; j <= alpha; ++j) {
    const double jd = static_cast<double>(j);
    const double log_binom = lgamma_alpha - std::lgamma(jd + 1.0) - std::lgamma(a - jd + 1.0);
    log_sum = log_add_exp(log_sum, kLog2 + jd * log_gamma + log_binom + (jd - 1.0) * jd * c);
  }
  const double bound = log_sum < 0.0 ? std::log1p(std::exp(log_sum))
                                     : log_sum + std::log1p(std::exp(-log_sum));
  // log_add_exp(inf, inf) is NaN: a NaN bound (an overflowed sum) counts as +inf, never as the
  // min below (std::min returns its first argument when the comparison is false).
  if (std::isnan(bound)) return unsampled;
  return std::min(bound, unsampled);
}

}  // namespace

double gaussian_order_coefficient(double order, double sigma) noexcept {
  const double value = (order * 0.5 / sigma) / sigma;
  return std::nextafter(std::nextafter(value, kInf), kInf);
}

void gaussian(double sigma, const double* orders, std::size_t n, double* out) {
  check_positive("noise_multiplier", sigma);
  check_orders(orders, n);
  for (std::size_t i = 0; i < n; ++i) out[i] = gaussian_order_coefficient(orders[i], sigma);
}

namespace {

// The Laplace RDP's log argument minus 1, A - 1 = [alpha expm1(beta x) + beta expm1(-alpha x)]
// / (2 alpha - 1) with beta = alpha - 1, x = 1/b, as its Taylor series: the x^k coefficient of
// the bracket is alpha beta (beta^(k-1) + (-alpha)^(k-1)) / k!, zero at k = 1. Every term is
// formed without cancellation (beta^(k-1) - alpha^(k-1) for odd k as -alpha^(k-1) (1 - (beta /
// alpha)^(k-1)), with expm1 and log1p), and for alpha x <= 1/2 the terms after k = 2 sum to at
// most a third of it in magnitude, so the sum is within a few units of roundoff.
double laplace_excess_series(double a, double x) {
  const double beta = a - 1.0;
  const double log_ratio = std::log1p(-1.0 / a);  // log(beta / alpha)
  double sum = 0.0;
  double alpha_power = a;  // alpha^(k-1), from k = 2
  double x_power = x * x / 2.0;  // x^k / k!, from k = 2
  for (int k = 2; k <= 60; ++k) {
    const double kd = static_cast<double>(k);
    // beta^(k-1) + alpha^(k-1) for even k, beta^(k-1) - alpha^(k-1) (negative) for odd k
    const double coefficient = k % 2 == 0
        ? alpha_power * (1.0 + std::exp((kd - 1.0) * log_ratio))
        : alpha_power * std::expm1((kd - 1.0) * log_ratio);
    const double term = x_power * coefficient;
    sum += term;
    if (std::abs(term) <= 1e-20 * std::abs(sum)) break;
    alpha_power *= a;
    x_power *= x / (kd + 1.0);
  }
  return a * beta / (2.0 * a - 1.0) * sum;
}

}  // namespace

void laplace(double scale, const double* orders, std::size_t n, double* out) {
  check_positive("scale", scale);
  check_orders(orders, n);
  for (std::size_t i = 0; i < n; ++i) {
    const double a = orders[i];
    const double beta = a - 1.0;
    double value;
    if (a / scale <= 0.5) {
      value = std::log1p(laplace_excess_series(a, 1.0 / scale)) / beta;
    } else if (beta / scale < 50.0) {
      // alpha x > 1/2: the cancelling first-order terms are at most a few times the result,
      // so forming the bracket with expm1 loses only a few units of roundoff.
      const double bracket = a * std::expm1(beta / scale) / beta + std::expm1(-a / scale);
      value = std::log1p(beta / (2.0 * a - 1.0) * bracket) / beta;
    } else {
      const double first = std::log(a / (2.0 * a - 1.0)) + (a - 1.0) / scale;
      const double second = std::log((a - 1.0) / (2.0 * a - 1.0)) - a / scale;
      value = log_add_exp(first, second) / (a - 1.0);
    }
    // Raised past the evaluation's rounding (a few units of roundoff of the value, 32 here;
    // two doubles more where it is below the normal range); the exact value is positive.
    out[i] = std::nextafter(std::nextafter(value * (1.0 + 0x1p-48), kInf), kInf);
  }
}

void sampled_without_replacement_gaussian(double gamma, double sigma, const double* orders,
                                          std::size_t n, double* out) {
  if (!std::isfinite(gamma) || !(gamma > 0.0) || gamma > 1.0) {
    throw std::invalid_argument("sampling_rate must be in (0, 1], got " + std::to_string(gamma));
  }
  check_positive("noise_multiplier", sigma);
  check_orders(orders, n);
  for (std::size_t i = 0; i < n; ++i) {
    const double alpha = orders[i];
    const double unsampled = alpha * 0.5 / (sigma * sigma);
    const double floor_alpha = std::floor(alpha);
    double scaled;  // an upper bound on (alpha - 1) D_alpha
    if (alpha == floor_alpha) {
      scaled = wor_scaled_bound(gamma, sigma, static_cast<long>(alpha));
    } else if (alpha < 2.0) {
      // K(alpha) = (alpha-1) D_alpha is convex with K(1) = 0, so K(alpha) <= (alpha-1) K(2).
      scaled = (alpha - 1.0) * wor_scaled_bound(gamma, sigma, 2);
    } else {
      const double theta = alpha - floor_alpha;
      const long lower = static_cast<long>(floor_alpha);
      scaled = (1.0 - theta) * wor_scaled_bound(gamma, sigma, lower) +
               theta * wor_scaled_bound(gamma, sigma, lower + 1);
    }
    out[i] = std::min(scaled / (alpha - 1.0), unsampled);
  }
}

}  // namespace dpsharp::rdp
