// Tails of the privacy loss of each dominating pair (see pld.hpp), in log space.
#include <cmath>

#include "dpsharp/numerics.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

LossTails certain_above() noexcept { return {0.0, kNegInf, 0.0, kNegInf}; }
LossTails certain_below() noexcept { return {kNegInf, 0.0, kNegInf, 0.0}; }

// P = Lap(1, b), Q = Lap(0, b): L(x) = (|x| - |x - 1|)/b, equal to eps0 = 1/b for x >= 1, -eps0
// for x <= 0 and (2x - 1)/b in between; {L > l} = {x > (b l + 1)/2} for -eps0 <= l < eps0, so
// P(L <= l) = e^{-(eps0 - l)/2} / 2 and Q(L > l) = e^{-(eps0 + l)/2} / 2 there. eps0 is 1/b
// rounded up (laplace_top_loss): the exact pair of scale 1/eps0 <= b, which dominates the pair of
// scale b (a larger shift of the Laplace location family is less private), so the largest loss
// is never understated by the rounding of 1/b.
LossTails laplace(double b, double loss) noexcept {
  const double eps0 = laplace_top_loss(b);
  if (loss >= eps0) return certain_below();
  if (loss < -eps0) return certain_above();
  LossTails t;
  t.log_cdf_p = kLogHalf - 0.5 * (eps0 - loss);
  t.log_survival_p = std::log1p(-std::exp(t.log_cdf_p));
  t.log_survival_q = kLogHalf - 0.5 * (eps0 + loss);
  t.log_cdf_q = std::log1p(-std::exp(t.log_survival_q));
  return t;
}

// The relative allowance of a value formed in log space from logarithms of these magnitudes:
// each carries a few ulps of its own size, so the value carries a few ulps of their sum.
double log_space_slack(double magnitudes) noexcept { return kExcessSlack * (1.0 + magnitudes); }

}  // namespace

GaussianExcess::GaussianExcess(bool remove_direction, double q, double loss) noexcept
    : remove(remove_direction),
      log_q(std::log(q)),
      log1mq(q >= 1.0 ? kNegInf : std::log1p(-q)),
      scale(remove_direction ? 0.0 : loss),
      magnitude(std::abs(loss)) {
  // c = e^{+-a} - (1 - q) with its sign, as log |c|.
  const double signed_loss = remove ? loss : -loss;
  positive = signed_loss > log1mq;
  log_coefficient = positive ? log_diff(signed_loss, log1mq) : log_diff(log1mq, signed_loss);
}

// Remove: L(x) = log(1 - q + q e^{mu x - mu^2/2}) is increasing in x with infimum log(1-q), so
// {L > l} = {x > x_l}. Add: L(x) = -log(1 - q + q e^{mu x - mu^2/2}) is decreasing in x with
// supremum -log(1-q), so {L > l} = {x < x_l}. x_l = (log((e^{+-l} - (1 - q)) / q) + mu^2/2) / mu
// = (log c - log q + mu^2 / 2) / mu.
ComponentLogTails gaussian_component_log_tails(const GaussianExcess& at, double mu) noexcept {
  if (!at.positive) {  // below the support (remove) or above it (add)
    return at.remove ? ComponentLogTails{0.0, kNegInf, 0.0, kNegInf}
                     : ComponentLogTails{kNegInf, 0.0, kNegInf, 0.0};
  }
  const double x = (at.log_coefficient - at.log_q + 0.5 * mu * mu) / mu;
  const double above_null = log_normal_cdf(-x);
  const double below_null = log_normal_cdf(x);
  const double above_shifted = log_normal_cdf(mu - x);
  const double below_shifted = log_normal_cdf(x - mu);
  if (at.remove) return {above_null, below_null, above_shifted, below_shifted};
  return {below_null, above_null, below_shifted, above_shifted};
}

double GaussianExcess::log_of(double log_null, double log_shifted, bool round_up) const noexcept {
  const double shifted_term = log_q + log_shifted;
  const double null_term = log_coefficient + log_null;
  // (a term that is 0, log -inf, is exact and adds nothing)
  if (shifted_term == kNegInf && null_term == kNegInf) return kNegInf;
  const double magnitudes =
      (shifted_term == kNegInf ? 0.0 : std::abs(log_q) + std::abs(log_shifted)) +
      (null_term == kNegInf ? 0.0 : std::abs(log_coefficient) + std::abs(log_null));
  // remove: q S - c N; add: e^a (c N - q S); rounded up, (1 + k) plus - (1 - k) minus, with k
  // the allowance for the logarithms' round-off (or down, (1 - k) plus - (1 + k) minus), with
  // k >= log(1 + k) and -k - k^2 <= log(1 - k) (k <= 1/2) for the factors.
  const double slack = log_space_slack(magnitudes + magnitude);
  const bool usable = slack <= 0.5;
  if (!usable && !round_up) return kNegInf;  // (no lower bound left but 0)
  const double grow = slack;
  const double shrink = -slack - slack * slack;
  if (!positive) {  // c <= 0: both terms add (remove); add is then outside its support
    if (!remove) return kNegInf;
    return log_add_exp(shifted_term, null_term) + (round_up ? grow : shrink);
  }
  const double plus = remove ? shifted_term : null_term;
  const double minus = remove ? null_term : shifted_term;
  if (plus == kNegInf) return kNegInf;
  if (!usable) return scale + plus + std::log1p(slack);  // (nothing can be subtracted)
  return scale + (round_up ? log_diff(plus + grow, minus + shrink)
                           : log_diff(plus + shrink, minus + grow));
}

GaussianPointTails gaussian_point_tails(const MechanismParams& params, double loss) noexcept {
  const double mu = 1.0 / params.parameter;
  const double q = params.mechanism == Mechanism::kGaussian ? 1.0 : params.sampling_rate;
  auto direction = [&](bool remove) {
    const GaussianExcess excess(remove, q, loss);
    const ComponentLogTails t = gaussian_component_log_tails(excess, mu);
    return GaussianPointTails{t, excess, excess.log_of(t.null_survival, t.shifted_survival, true)};
  };
  if (params.mechanism != Mechanism::kSampledSymmetric) {
    return direction(params.mechanism != Mechanism::kPoissonAdd);
  }
  const GaussianPointTails remove = direction(true);
  const GaussianPointTails add = direction(false);
  return remove.log_delta >= add.log_delta ? remove : add;
}

// The tails of P and Q from those of the two normal components: remove P = (1 - q) N(0, 1) +
// q N(mu, 1), Q = N(0, 1); add the other way round.
LossTails gaussian_loss_tails(const GaussianPointTails& t) noexcept {
  const ComponentLogTails& c = t.components;
  const double log1mq = t.excess.log1mq;
  const double log_q = t.excess.log_q;
  const double mixture_survival =
      log_add_exp(log1mq + c.null_survival, log_q + c.shifted_survival);
  const double mixture_cdf = log_add_exp(log1mq + c.null_cdf, log_q + c.shifted_cdf);
  if (t.excess.remove) return {mixture_survival, mixture_cdf, c.null_survival, c.null_cdf};
  return {c.null_survival, c.null_cdf, mixture_survival, mixture_cdf};
}

LossTails loss_tails(const MechanismParams& params, double loss) noexcept {
  if (params.mechanism == Mechanism::kLaplace) return laplace(params.parameter, loss);
  return gaussian_loss_tails(gaussian_point_tails(params, loss));
}

double log_hockey_stick(const MechanismParams& params, double loss) noexcept {
  if (params.mechanism == Mechanism::kLaplace) {
    return laplace_log_excess(params.parameter, loss, kInf, kNaN);
  }
  return gaussian_point_tails(params, loss).log_delta;
}

double laplace_cell_bracket(double width) noexcept {
  // log(4 sinh^2(w / 2)) = w + 2 log(1 - e^{-w}), w = width / 2
  const double w = 0.5 * width;
  return w + 2.0 * std::log(-std::expm1(-w));
}

double laplace_log_excess(double scale, double lower, double upper,
                          double cell_bracket) noexcept {
  const double eps0 = laplace_top_loss(scale);
  double log_excess = kNegInf;
  // The atom at -eps0 (x <= 0; P = e^{-eps0} / 2, Q = 1 / 2): (e^{-eps0} - e^{a}) / 2.
  if (lower < -eps0 && upper >= -eps0) {
    log_excess = log_add_exp(log_excess, kLogHalf + lower + log_expm1(-eps0 - lower));
  }
  // The continuous part, x in (u, v) within (0, 1), its loss (2x - 1) / b in (m_a, m_c):
  // P = e^{-(1 - u) / b} expm1(w) / 2 and Q = e^{-u / b} (1 - e^{-w}) / 2 with w = (v - u) / b =
  // (m_c - m_a) / 2, and e^{m_a} = e^{(2u - 1) / b}, so P - e^{a} Q = e^{(m_a - eps0) / 2}
  // [expm1(w) + e^{a - m_a} expm1(-w)] / 2 = e^{(m_a - eps0) / 2} [4 sinh^2(w / 2) +
  // expm1(a - m_a) expm1(-w)] / 2, both terms >= 0 (a <= m_a).
  const double m_a = std::max(lower, -eps0);
  const double m_c = std::min(upper, eps0);
  if (m_c > m_a) {
    const bool whole_cell = lower == m_a && upper == m_c && !std::isnan(cell_bracket);
    double bracket = whole_cell ? cell_bracket : laplace_cell_bracket(m_c - m_a);
    if (lower < m_a) {
      const double w = 0.5 * (m_c - m_a);
      bracket = log_add_exp(bracket,
                            std::log(-std::expm1(lower - m_a)) + std::log(-std::expm1(-w)));
    }
    log_excess = log_add_exp(log_excess, kLogHalf + 0.5 * (m_a - eps0) + bracket);
  }
  // The atom at eps0 (x >= 1; P = 1 / 2, Q = e^{-eps0} / 2): (1 - e^{a - eps0}) / 2.
  if (lower < eps0 && upper >= eps0) {
    log_excess = log_add_exp(log_excess, kLogHalf + std::log(-std::expm1(lower - eps0)));
  }
  if (log_excess == kNegInf) return kNegInf;
  // (k >= log(1 + k))
  return log_excess + log_space_slack(std::abs(log_excess) + std::abs(lower) + 2.0 * eps0);
}

}  // namespace dpsharp::pld
