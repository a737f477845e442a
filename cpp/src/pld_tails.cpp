// Tails of the privacy loss of each dominating pair (see pld.hpp), in log space.
#include <cmath>

#include "dpsharp/numerics.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

// log_sub_exp that treats a rounding-induced a < b as an empty difference.
double log_diff(double a, double b) noexcept {
  if (a <= b) return kNegInf;
  return log_sub_exp(a, b);
}

LossTails certain_above() noexcept { return {0.0, kNegInf, 0.0, kNegInf}; }
LossTails certain_below() noexcept { return {kNegInf, 0.0, kNegInf, 0.0}; }

// Remove direction: P = (1-q) N(0,1) + q N(mu,1), Q = N(0,1), L(x) = log(1 - q + q e^{mu x -
// mu^2/2}) is increasing in x with infimum log(1-q), so {L > l} = {x > x_l}.
LossTails poisson_remove(double mu, double q, double loss) noexcept {
  const double log1mq = q >= 1.0 ? kNegInf : std::log1p(-q);
  if (loss <= log1mq) return certain_above();
  const double log_q = std::log(q);
  const double x = (log_diff(loss, log1mq) - log_q + 0.5 * mu * mu) / mu;
  // Four normal tails, each evaluated once (the same values as evaluating them in place).
  const double upper_null = log_normal_cdf(-x);
  const double lower_null = log_normal_cdf(x);
  LossTails t;
  t.log_survival_p = log_add_exp(log1mq + upper_null, log_q + log_normal_cdf(mu - x));
  t.log_cdf_p = log_add_exp(log1mq + lower_null, log_q + log_normal_cdf(x - mu));
  t.log_survival_q = upper_null;
  t.log_cdf_q = lower_null;
  return t;
}

// Add direction: P = N(0,1), Q = (1-q) N(0,1) + q N(mu,1), L(x) = -log(1 - q + q e^{mu x -
// mu^2/2}) is decreasing in x with supremum -log(1-q), so {L > l} = {x < x_l}.
LossTails poisson_add(double mu, double q, double loss) noexcept {
  const double log1mq = q >= 1.0 ? kNegInf : std::log1p(-q);
  if (-loss <= log1mq) return certain_below();
  const double log_q = std::log(q);
  const double x = (log_diff(-loss, log1mq) - log_q + 0.5 * mu * mu) / mu;
  const double lower_null = log_normal_cdf(x);
  const double upper_null = log_normal_cdf(-x);
  LossTails t;
  t.log_survival_p = lower_null;
  t.log_cdf_p = upper_null;
  t.log_survival_q = log_add_exp(log1mq + lower_null, log_q + log_normal_cdf(x - mu));
  t.log_cdf_q = log_add_exp(log1mq + upper_null, log_q + log_normal_cdf(mu - x));
  return t;
}

// P = Lap(1, b), Q = Lap(0, b): L(x) = (|x| - |x - 1|)/b, equal to 1/b for x >= 1, -1/b for
// x <= 0 and (2x - 1)/b in between; {L > l} = {x > (b l + 1)/2} for -1/b <= l < 1/b.
LossTails laplace(double b, double loss) noexcept {
  const double eps0 = 1.0 / b;
  if (loss >= eps0) return certain_below();
  if (loss < -eps0) return certain_above();
  const double x = 0.5 * (b * loss + 1.0);
  const double log_half = -0.6931471805599453;
  LossTails t;
  t.log_cdf_p = log_half - (1.0 - x) / b;
  t.log_survival_p = std::log1p(-std::exp(t.log_cdf_p));
  t.log_survival_q = log_half - x / b;
  t.log_cdf_q = std::log1p(-std::exp(t.log_survival_q));
  return t;
}

double log_delta_from_tails(const LossTails& t, double loss) noexcept {
  if (t.log_survival_p == kNegInf) return kNegInf;
  return log_diff(t.log_survival_p, loss + t.log_survival_q);
}

}  // namespace

LossTails loss_tails(const MechanismParams& params, double loss) noexcept {
  const double q = params.sampling_rate;
  switch (params.mechanism) {
    case Mechanism::kGaussian:
      return poisson_remove(1.0 / params.parameter, 1.0, loss);
    case Mechanism::kLaplace:
      return laplace(params.parameter, loss);
    case Mechanism::kPoissonRemove:
      return poisson_remove(1.0 / params.parameter, q, loss);
    case Mechanism::kPoissonAdd:
      return poisson_add(1.0 / params.parameter, q, loss);
    case Mechanism::kSampledSymmetric: {
      const LossTails remove = poisson_remove(1.0 / params.parameter, q, loss);
      const LossTails add = poisson_add(1.0 / params.parameter, q, loss);
      return log_delta_from_tails(remove, loss) >= log_delta_from_tails(add, loss) ? remove : add;
    }
  }
  return certain_below();
}

double log_hockey_stick(const MechanismParams& params, double loss) noexcept {
  return log_delta_from_tails(loss_tails(params, loss), loss);
}

}  // namespace dpsharp::pld
