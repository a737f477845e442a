// Renyi differential privacy (RDP) of the mechanisms dpsharp accounts, and the conversions
// from an RDP curve to (epsilon, delta).
//
// Conventions. An RDP curve is a function order alpha > 1 -> D_alpha (the Renyi divergence of
// order alpha between the output distributions on neighbouring datasets, maximised over the two
// directions). Every function here takes arrays of orders and writes one value per order; they
// are pure (no global state) and never print.
//
// Failing closed: +inf is a valid (useless) RDP bound. Whenever a routine cannot certify the
// precision it promises (an adaptive quadrature that does not converge, an overflow), it
// returns +inf for that order rather than a number that might be too small. Invalid arguments
// (NaN, inf, out of range) throw std::invalid_argument before any loop starts.
#pragma once

#include <cstddef>
#include <vector>

namespace dpsharp::rdp {

// Relative precision every routine of this header aims for, and certifies through its error
// estimate where it integrates numerically.
inline constexpr double kTargetRelativeError = 1e-10;

// Poisson-subsampled Gaussian under add/remove one (Mironov, Talwar, Zhang 2019, "Renyi
// differential privacy of the sampled Gaussian mechanism"): D_alpha = log(A_alpha)/(alpha-1),
//   A_alpha = E_{z ~ N(0, sigma^2)} [ (1 - q + q exp((2z - 1)/(2 sigma^2)))^alpha ].
// Integer orders: the binomial expansion, written as A - 1 = sum of non-negative terms.
// Fractional orders: quadrature of A - 1 = E[(1+u)^alpha - 1 - alpha u] (a non-negative
// integrand; u = q (L - 1) with L the likelihood ratio): the trapezoidal rule on the whole line
// where it certifies the precision, adaptive Gauss-Kronrod (in log space) elsewhere.
// Writes D_alpha for each order to `out` (length n). Throws std::invalid_argument on bad input.
void poisson_gaussian(double sampling_probability, double noise_multiplier, const double* orders,
                      std::size_t n, double* out);

// Which quadrature integrates a fractional order: the trapezoidal rule where it certifies the
// precision and adaptive Gauss-Kronrod elsewhere (kAuto, what poisson_gaussian uses), or one
// of them alone (kTrapezoid returns NaN where it cannot certify).
enum class QuadratureMethod { kAuto = 0, kTrapezoid = 1, kKronrod = 2 };

// log(A_alpha - 1) for one order (the quantity both methods compute; exposed for testing).
// `use_quadrature` forces the quadrature also for integer orders.
double poisson_gaussian_log_a_minus_one(double sampling_probability, double noise_multiplier,
                                        double order, bool use_quadrature,
                                        QuadratureMethod method = QuadratureMethod::kAuto);

// Plain Gaussian mechanism: D_alpha = alpha / (2 sigma^2) (Mironov 2017, Proposition 7),
// rounded up (gaussian_order_coefficient).
void gaussian(double noise_multiplier, const double* orders, std::size_t n, double* out);

// alpha / (2 sigma^2) rounded up: (alpha / 2 / sigma) / sigma, two roundings of at most a unit
// of roundoff each, then two doubles up (two ulps exceed both; below the normal range, where
// sigma^2 overflowed and the plain formula read 0 for sigma >= 1e155, they exceed the two half
// subnormal ulps). Never 0 for a finite sigma: the exact value is positive.
double gaussian_order_coefficient(double order, double noise_multiplier) noexcept;

// Laplace mechanism with scale b (relative to the L1 sensitivity) (Mironov 2017, Proposition 6):
// D_alpha = log( alpha/(2 alpha - 1) exp((alpha-1)/b) + (alpha-1)/(2 alpha - 1) exp(-alpha/b) )
//           / (alpha - 1), rounded up. For alpha / b <= 1/2 the argument's excess over 1 is
// summed as its Taylor series in 1/b (its first-order terms cancel exactly; evaluated as a
// difference they left the value 23% low at b = 1e15 and negative at 1e16).
void laplace(double scale, const double* orders, std::size_t n, double* out);

// Sampling a fixed-size subset without replacement (rate gamma = m/n), then a Gaussian, under
// replace one: the general upper bound of Wang, Balle, Kasiviswanathan 2019, Theorem 9, with
// eps(j) = j/(2 sigma^2) and eps(inf) = inf; fractional orders by the convexity of
// (alpha - 1) D_alpha in alpha (linear interpolation between the neighbouring integers).
// Also capped by the unsampled Gaussian alpha/(2 sigma^2). See rdp.py for the derivation.
void sampled_without_replacement_gaussian(double sampling_rate, double noise_multiplier,
                                          const double* orders, std::size_t n, double* out);

// Conversions. `kind` 0 = classic (Mironov 2017 Prop. 3 / Abadi et al. Thm 2):
//   eps = D_alpha + log(1/delta)/(alpha-1),  delta = exp((alpha-1)(D_alpha - eps));
// 1 = tight (Balle et al. 2020 Thm 21; Canonne, Kamath, Steinke 2020 Prop. 12; as in
// dp-accounting 0.6.0): eps = D_alpha + log1p(-1/alpha) - (log delta + log alpha)/(alpha-1) for
// alpha > 1.01, the KL bound delta >= sqrt(1 - exp(-D_alpha)) => eps = 0, eps clamped at 0.
// Each returns the optimum and writes the index of the optimal order to `best_index`.
struct Conversion {
  double value;
  std::size_t best_index;
};
Conversion epsilon_from_rdp(const double* orders, const double* rdp, std::size_t n, double delta,
                            int kind);
Conversion delta_from_rdp(const double* orders, const double* rdp, std::size_t n, double epsilon,
                          int kind);

}  // namespace dpsharp::rdp
