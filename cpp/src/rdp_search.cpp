// The orders an RDP answer needs (cpp/include/dpsharp/rdp_search.hpp): rounds of convexity
// bounds, each evaluating the open integer orders (binomial sums, about a microsecond) and the
// few open fractional orders (quadratures) with the smallest bounds, until no unevaluated order
// can beat the best evaluated one.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "dpsharp/numerics.hpp"
#include "dpsharp/rdp.hpp"
#include "dpsharp/rdp_search.hpp"

namespace dpsharp::rdp {
namespace {

// A finite stand-in for +inf in the scores (as in python/dpsharp/rdp.py).
constexpr double kNoBound = 1e300;
// Relative allowance for the rounding of the bounds: evaluated values carry <= 1e-10 relative
// error, which a chord extended past its points amplifies by (extension / chord length).
constexpr double kBoundSlack = 1e-7;

// The per-order epsilon (want_delta = false, target = delta) or log delta (target = epsilon) of
// the conversions (rdp_conversion.cpp) at order alpha for a finite D_alpha = r, before the
// minimum over orders: non-decreasing in r, used only to decide which orders to skip.
struct Scorer {
  double target;
  int kind;
  bool want_delta;
  double log_delta;       // log(target) when scoring epsilons
  double kl_threshold;    // -log1p(-delta^2): below it the tight conversion certifies eps = 0

  Scorer(double target_, int kind_, bool want_delta_)
      : target(target_),
        kind(kind_),
        want_delta(want_delta_),
        log_delta(want_delta_ ? 0.0 : std::log(target_)),
        kl_threshold(want_delta_ ? 0.0 : -std::log1p(-target_ * target_)) {}

  double operator()(double alpha, double r) const noexcept {
    const double am1 = alpha - 1.0;
    const bool above = alpha > 1.01;  // the tight bounds hold above 1.01 only
    const double log1p_minus_inv = above ? std::log1p(-1.0 / alpha) : kNoBound;
    if (!want_delta) {
      if (kind == 0) return r - log_delta / am1;
      if (r < kl_threshold) return 0.0;
      const double offset = above ? log1p_minus_inv - std::log(alpha) / am1 : kNoBound;
      return r + offset - log_delta / am1;
    }
    if (kind == 0) return am1 * (r - target);
    const double kl = 0.5 * std::log(-std::expm1(-r));  // -inf at r = 0; exact for tiny r
    const double bound = am1 * (r - target + log1p_minus_inv) - std::log(alpha);
    return std::fmin(kl, bound);
  }
};

// The bound of convex_lower_bound on known points padded with (0, 0), (1, 0) on the left and two
// copies of the last value on the right (a slope-0 chord on the left, no chord on the right).
double padded_convex_lower_bound(const std::vector<double>& known_x,
                                 const std::vector<double>& known_k, double at) noexcept {
  const std::size_t size = known_x.size();
  // known_x[right - 1] < at < known_x[right]
  const auto right = static_cast<std::size_t>(
      std::lower_bound(known_x.begin(), known_x.end(), at) - known_x.begin());
  const std::size_t left = right - 1;
  const double x_l0 = known_x[left], k_l0 = known_k[left];
  const double x_r0 = known_x[right], k_r0 = known_k[right];
  const double from_left =
      k_l0 + (k_l0 - known_k[left - 1]) / (x_l0 - known_x[left - 1]) * (at - x_l0);
  const double from_right =
      right + 1 < size - 2
          ? k_r0 - (known_k[right + 1] - k_r0) / (known_x[right + 1] - x_r0) * (x_r0 - at)
          : 0.0;
  return std::max(std::max(k_l0, from_left), from_right);
}

// Pads the known points on the right with two copies of the last value, at top + 1 and top + 2
// (top: the largest order a bound is asked at), as padded_convex_lower_bound expects.
void pad_right(std::vector<double>& known_x, std::vector<double>& known_k, double top) {
  const double last = known_k.back();
  known_x.push_back(top + 1.0);
  known_x.push_back(top + 2.0);
  known_k.push_back(last);
  known_k.push_back(last);
}

}  // namespace

void convex_lower_bound(const double* points, const double* log_moment, std::size_t n,
                        const double* at, std::size_t n_at, double* out) {
  std::vector<double> known_x{0.0, 1.0}, known_k{0.0, 0.0};
  double top = n ? points[n - 1] : 1.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!(points[i] > known_x.back()) || !std::isfinite(log_moment[i])) {
      throw std::invalid_argument("points must be increasing, > 1, with finite log moments");
    }
    known_x.push_back(points[i]);
    known_k.push_back(log_moment[i]);
  }
  for (std::size_t j = 0; j < n_at; ++j) {
    if (!(at[j] > 1.0) || !std::isfinite(at[j]) ||
        std::binary_search(points, points + n, at[j])) {
      throw std::invalid_argument("orders must be finite, > 1 and not among the points");
    }
    top = std::max(top, at[j]);
  }
  pad_right(known_x, known_k, top);
  for (std::size_t j = 0; j < n_at; ++j) {
    out[j] = padded_convex_lower_bound(known_x, known_k, at[j]);
  }
}

SearchResult search_orders(const OrderPlanView& plan, const std::vector<CurveTerm>& terms,
                           double target, int kind, bool want_delta,
                           std::size_t fractional_per_round) {
  if (kind != 0 && kind != 1) throw std::invalid_argument("conversion kind must be 0 or 1");
  if (fractional_per_round == 0) fractional_per_round = 1;
  const std::size_t n_grid = plan.n_grid, n_points = plan.n_points;
  const Scorer score(target, kind, want_delta);
  std::vector<const CurveTerm*> lazy;
  std::vector<double> fixed(n_grid, 0.0);
  double floor = 0.0;
  for (const CurveTerm& term : terms) {
    if (term.lazy) {
      lazy.push_back(&term);
      floor += term.count * term.floor;
    } else {
      for (std::size_t g = 0; g < n_grid; ++g) fixed[g] = fixed[g] + term.count * term.values[g];
    }
  }
  // the sum above rounds; the floor is a bound, so give it the relative slack of the others
  floor *= 1.0 - 1e-12;

  SearchResult result;
  std::vector<std::uint8_t> known_points(n_points);
  std::vector<std::size_t> unknown, chosen;
  std::vector<double> known_x, known_k, lower;
  std::vector<std::uint8_t> open;
  while (true) {
    for (std::size_t p = 0; p < n_points; ++p) {
      std::uint8_t all = 1;
      for (const CurveTerm* term : lazy) {
        all &= static_cast<std::uint8_t>(!std::isnan(term->values[p]));
      }
      known_points[p] = all;
    }
    result.known.assign(n_grid, 0);
    result.total.clear();
    unknown.clear();
    double best = kInf;
    for (std::size_t g = 0; g < n_grid; ++g) {
      const auto at = static_cast<std::size_t>(plan.grid_at[g]);
      if (!known_points[at]) {
        unknown.push_back(g);
        continue;
      }
      result.known[g] = 1;
      double sum = 0.0;  // in the order of the terms: equal to the full curve's value
      for (const CurveTerm& term : terms) sum = sum + term.count * term.values[term.lazy ? at : g];
      result.total.push_back(sum);
      if (std::isfinite(sum)) best = std::min(best, score(plan.orders[g], sum));
    }
    if (unknown.empty()) return result;
    if ((best <= 0.0 && !want_delta) || best == kNegInf) return result;  // nothing beats zero

    // K = (alpha - 1) * sum of the lazy curves at the evaluated points where it is finite,
    // padded with (0, 0), (1, 0) on the left and two copies of the last value on the right
    known_x.assign({0.0, 1.0});
    known_k.assign({0.0, 0.0});
    for (std::size_t p = 0; p < n_points; ++p) {
      if (!known_points[p]) continue;
      double moment = 0.0;
      for (const CurveTerm* term : lazy) moment += term->count * term->values[p];
      if (!std::isfinite(moment)) continue;  // a failed (+inf) evaluation bounds nothing
      known_x.push_back(plan.points[p]);
      known_k.push_back(moment * (plan.points[p] - 1.0));
    }
    double top = known_x.back();
    for (std::size_t g : unknown) top = std::max(top, plan.orders[g]);
    pad_right(known_x, known_k, top);

    lower.assign(unknown.size(), kNoBound);
    open.assign(unknown.size(), 0);
    bool any_open = false;
    for (std::size_t i = 0; i < unknown.size(); ++i) {
      const std::size_t g = unknown[i];
      const double at = plan.orders[g];
      const double lower_k = padded_convex_lower_bound(known_x, known_k, at);
      const double lower_rdp = std::max(lower_k / (at - 1.0), floor) + fixed[g];
      if (std::isfinite(lower_rdp)) {
        lower[i] = score(at, lower_rdp);
        const double slack = kBoundSlack * std::fabs(lower_rdp) * (want_delta ? at - 1.0 : 1.0);
        open[i] = lower[i] - slack < best;
      } else {
        open[i] = kNoBound < best;  // a fixed curve is +inf here: never better
      }
      any_open = any_open || open[i];
    }
    if (!any_open) return result;

    // every open integer order, and the open fractional orders with the smallest bounds
    chosen.clear();
    std::vector<std::size_t> fractional;
    for (std::size_t i = 0; i < unknown.size(); ++i) {
      if (!open[i]) continue;
      if (plan.integer[unknown[i]]) {
        chosen.push_back(unknown[i]);
      } else {
        fractional.push_back(i);
      }
    }
    std::stable_sort(fractional.begin(), fractional.end(),
                     [&](std::size_t a, std::size_t b) { return lower[a] < lower[b]; });
    if (fractional.size() > fractional_per_round) fractional.resize(fractional_per_round);
    for (std::size_t i : fractional) chosen.push_back(unknown[i]);
    for (const CurveTerm* term : lazy) {
      for (std::size_t g : chosen) {
        const auto at = static_cast<std::size_t>(plan.grid_at[g]);
        if (std::isnan(term->values[at])) {
          poisson_gaussian(term->q, term->sigma, &plan.points[at], 1, &term->values[at]);
        }
      }
    }
  }
}

}  // namespace dpsharp::rdp
