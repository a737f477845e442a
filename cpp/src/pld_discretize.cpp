// Certified roundings of a privacy-loss distribution onto the grid {k h} (see pld.hpp for the
// argument why each is on the right side).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dpsharp/numerics.hpp"
#include "dpsharp/parallel.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

// log P(a < L <= b) from the tails at a and b, using the complementary CDF where the survival
// function is close to 1 so that no digits cancel.
double log_cell_mass(double log_survival_a, double log_cdf_a, double log_survival_b,
                     double log_cdf_b) noexcept {
  if (log_survival_a > kLogHalf) return log_diff(log_cdf_b, log_cdf_a);
  return log_diff(log_survival_a, log_survival_b);
}

void check_step(double grid_step) {
  if (!(grid_step > 0.0) || !std::isfinite(grid_step)) {
    throw std::invalid_argument("grid_step must be finite and > 0");
  }
}

// The number of grid points of `range`, after checking the step and that there are at least two.
std::int64_t checked_points(double grid_step, GridRange range) {
  check_step(grid_step);
  const std::int64_t n = range.highest - range.lowest + 1;
  if (n < 2) throw std::invalid_argument("the grid range needs at least two points");
  return n;
}

// The error for a mechanism whose privacy-loss tail does not fall below the tail budget
// within 2^40 grid steps: its parameter puts the loss beyond what this grid can hold.
std::string beyond_grid(const char* which, const MechanismParams& params, double grid_step) {
  const bool laplace = params.mechanism == Mechanism::kLaplace;
  const char* name = laplace ? "Laplace"
                     : params.mechanism == Mechanism::kGaussian ? "Gaussian"
                     : params.mechanism == Mechanism::kSampledSymmetric
                         ? "Gaussian sampled without replacement"
                         : "Poisson-subsampled Gaussian";
  std::ostringstream message;
  message.precision(17);
  message << "the " << which << " tail of the privacy loss of the " << name << " mechanism ("
          << (laplace ? "scale " : "noise multiplier ") << params.parameter;
  if (params.mechanism != Mechanism::kGaussian && !laplace) {
    message << ", sampling rate " << params.sampling_rate;
  }
  message << ") does not vanish within 2^40 grid steps of " << grid_step
          << ": its loss lies beyond what the grid can hold (a noise parameter this small gives "
          << "no useful guarantee)";
  return message.str();
}

}  // namespace

GridRange grid_range(const MechanismParams& params, double grid_step, double top_tail,
                     double bottom_tail) {
  check_step(grid_step);
  if (!(top_tail > 0.0 && top_tail < 1.0) || !(bottom_tail > 0.0 && bottom_tail < 1.0)) {
    throw std::invalid_argument("top_tail and bottom_tail must be in (0, 1)");
  }
  const double log_top = std::log(top_tail);
  const double log_bottom = std::log(bottom_tail);
  constexpr std::int64_t kLimit = std::int64_t{1} << 40;
  auto top_ok = [&](std::int64_t k) {
    return log_hockey_stick(params, static_cast<double>(k) * grid_step) <= log_top;
  };
  // delta(l) is non-increasing: find the smallest k >= 1 with delta(k h) <= top_tail.
  std::int64_t hi = 1;
  while (!top_ok(hi)) {
    if (hi > kLimit) throw std::invalid_argument(beyond_grid("upper", params, grid_step));
    hi *= 2;
  }
  std::int64_t lo = hi / 2;  // top_ok(lo) is false unless lo == 0
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (top_ok(mid) ? hi : lo) = mid;
  }
  const std::int64_t highest = hi;
  // P(L <= l) is non-decreasing: the largest k < highest with P(L <= k h) <= bottom_tail.
  auto bottom_ok = [&](std::int64_t k) {
    return loss_tails(params, static_cast<double>(k) * grid_step).log_cdf_p <= log_bottom;
  };
  std::int64_t good = highest - 1;
  std::int64_t step = 1;
  while (!bottom_ok(good)) {
    if (step > kLimit) throw std::invalid_argument(beyond_grid("lower", params, grid_step));
    good = highest - 1 - step;
    step *= 2;
  }
  std::int64_t bad = highest;  // treated as failing: the range needs at least two points
  if (good < highest - 1) {
    bad = good + step / 2;  // the previous probe, which failed
    while (bad - good > 1) {
      const std::int64_t mid = good + (bad - good) / 2;
      (bottom_ok(mid) ? good : bad) = mid;
    }
  }
  return {good, highest};
}

namespace {

// The four tails of a pair at one grid point, as probabilities (not logs).
struct LinearTails {
  double survival_p;
  double cdf_p;
  double survival_q;
  double cdf_q;
};

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;

// (1 - Phi(t), Phi(t)) at t = sqrt(2) (z + residual), with one erfc: the smaller of the two
// directly, the larger as its complement (>= 1/2, so no digits are lost). The residual (at most
// an ulp of z) enters to first order, erfc(z + r) = erfc(z) - (2 / sqrt(pi)) e^{-z^2} r, the
// next term being below r^2 |z| e^{-z^2}, an ulp's fraction of the first.
void scaled_normal_tails(double z, double residual, double& survival, double& cdf) noexcept {
  const double slope = residual == 0.0 ? 0.0 : kTwoOverSqrtPi * std::exp(-z * z) * residual;
  if (z > 0.0) {
    survival = std::max(0.5 * (std::erfc(z) - slope), 0.0);
    cdf = 1.0 - survival;
  } else {
    cdf = std::max(0.5 * (std::erfc(-z) + slope), 0.0);
    survival = 1.0 - cdf;
  }
}

// The sigma-independent part of the Gaussian-family tails at the grid points first .. first +
// size - 1 (shared by every noise multiplier with the same sampling rate and grid):
// log_ratio = log((e^{+-l} - (1 - q)) / q) (= +-l when q = 1; -inf below the support, where L
// ranges over (log(1 - q), inf) (remove) or (-inf, -log(1 - q)) (add)), and e^{l}.
struct GaussianFamilyTable {
  std::int64_t first = 0;
  std::vector<double> log_ratio;
  std::vector<double> exp_loss;
  // log_ratio_step[i] = log_ratio[i + 1] - log_ratio[i], computed without the cancellation of
  // the difference: log(1 + (E_{i+1} - E_i) / (E_i - (1 - q))) with E = e^{+-l} and
  // E_{i+1} - E_i = E_i (e^{+-h} - 1) (h, or -h, when q = 1); NaN below the support.
  std::vector<double> log_ratio_step;
  // ratio = e^{log_ratio} (0 below the support).
  std::vector<double> ratio;
  // excess_coefficient = E - (1 - q) = expm1(+-l) + q with its sign (negative below the
  // support; e^{+-l} when q = 1), the weight of the null normal in the excess P - e^{a} Q of a
  // cell above the point (see excess_over_tilted).
  std::vector<double> excess_coefficient;
};

// c = e^{l} - (1 - q) at the signed loss l (e^{l} when q = 1), with its sign. For q < 1/2 as
// expm1(l) + q, two terms exact to an ulp of their own size that cancel only next to the
// support's floor l = log(1 - q). For q >= 1/2 as (1 - q) expm1(l - log(1 - q)), 1 - q exact
// there (Sterbenz): expm1(l) + q cancelled numbers near -1 and 1 into one near 1 - q, and under
// q = 1 - 1e-12 the add direction's last cells before its top came out up to 37% off in delta.
double support_excess(double signed_loss, double q, double log1mq) noexcept {
  if (q >= 1.0) return std::exp(signed_loss);
  if (q < 0.5) return std::expm1(signed_loss) + q;
  return (1.0 - q) * std::expm1(signed_loss - log1mq);
}

// Grid points per thread at least in the threaded loops below (each point costs a few special
// functions, some tens of nanoseconds).
constexpr std::int64_t kPointsPerThread = std::int64_t{1} << 13;

GaussianFamilyTable gaussian_family_table(bool remove, double q, double grid_step,
                                          std::int64_t first, std::int64_t last, int threads) {
  GaussianFamilyTable table;
  table.first = first;
  const std::int64_t size = last - first + 1;
  table.log_ratio.resize(static_cast<std::size_t>(size));
  table.exp_loss.resize(static_cast<std::size_t>(size));
  table.log_ratio_step.resize(static_cast<std::size_t>(size));
  table.ratio.resize(static_cast<std::size_t>(size));
  table.excess_coefficient.resize(static_cast<std::size_t>(size));
  const double support_floor = q < 1.0 ? std::log1p(-q) : kNegInf;
  const double signed_step_growth = std::expm1(remove ? grid_step : -grid_step);
  parallel_ranges<Threads::kOwnThreads>(size, kPointsPerThread, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const double loss = static_cast<double>(first + i) * grid_step;
      const double signed_loss = remove ? loss : -loss;
      const auto at = static_cast<std::size_t>(i);
      table.excess_coefficient[at] = support_excess(signed_loss, q, support_floor);
      if (q < 1.0 && signed_loss <= support_floor) {
        table.log_ratio[at] = kNegInf;
        table.log_ratio_step[at] = kNaN;
        table.ratio[at] = 0.0;
      } else if (q < 1.0) {
        const double above_floor = table.excess_coefficient[at];
        table.ratio[at] = above_floor / q;
        table.log_ratio[at] = std::log(table.ratio[at]);
        table.log_ratio_step[at] =
            std::log1p(std::exp(signed_loss) * signed_step_growth / above_floor);
      } else {
        table.log_ratio[at] = signed_loss;
        table.log_ratio_step[at] = remove ? grid_step : -grid_step;
        table.ratio[at] = table.excess_coefficient[at];  // e^{+-l}
      }
      table.exp_loss[at] = std::exp(loss);
    }
  });
  return table;
}

// The two normal components' tails at a loss l, oriented by the loss: the null N(0, 1) and the
// shifted N(mu, 1) masses of {L > l} (survival) and {L <= l} (cdf).
struct NormalTails {
  double null_survival;
  double null_cdf;
  double shifted_survival;
  double shifted_cdf;
};

// remove: {L > l} = {x > x_l}; add: {L > l} = {x < x_l} (see pld_tails.cpp), with x_l =
// (log_ratio + mu^2 / 2) / mu, from the point's log_ratio (see GaussianFamilyTable); two erfc
// calls.
//
// Both normals' tails are of one set {x > x_l}: in erfc's scale z = x / sqrt(2) the null
// normal's threshold is the double z0 = fl(x_l / sqrt(2)), and the shifted normal's z0 - s
// (s = fl(mu / sqrt(2))) is carried as a double and its exact residual (two_sum_residual), which
// enters to first order (scaled_normal_tails). Rounded separately, the two thresholds differed by
// an ulp of x_l, and the excess q S - c N, which cancels to about mu / x_l of its terms under a
// large noise multiplier, read up to 1.2e-7 relative below exact (sigma = 1e6, against mpmath).
// (s for mu / sqrt(2) is the pair with mu' = s sqrt(2), within an ulp of mu: no cancellation
// amplifies that.)
NormalTails gaussian_normal_tails(bool remove, double mu, double log_ratio) noexcept {
  if (log_ratio == kNegInf) {
    return remove ? NormalTails{1.0, 0.0, 1.0, 0.0} : NormalTails{0.0, 1.0, 0.0, 1.0};
  }
  const double x = (log_ratio + 0.5 * mu * mu) / mu;
  const double null_threshold = x * kInvSqrt2;
  const double shift = mu * kInvSqrt2;
  const double shifted_threshold = null_threshold - shift;
  double null_above, null_below, shifted_above, shifted_below;
  scaled_normal_tails(null_threshold, 0.0, null_above, null_below);
  scaled_normal_tails(shifted_threshold,
                      two_sum_residual(null_threshold, -shift, shifted_threshold), shifted_above,
                      shifted_below);
  if (remove) return {null_above, null_below, shifted_above, shifted_below};
  return {null_below, null_above, shifted_below, shifted_above};
}

// (P-mass, Q-mass) of a set from its null and shifted normal masses: remove P = (1 - q) N(0, 1)
// + q N(mu, 1), Q = N(0, 1); add the other way round.
std::pair<double, double> pair_masses(bool remove, double q, double null_mass,
                                      double shifted_mass) noexcept {
  const double mixture = (1.0 - q) * null_mass + q * shifted_mass;
  return remove ? std::pair{mixture, null_mass} : std::pair{null_mass, mixture};
}

// Linear-space tails of the Poisson-subsampled Gaussian pairs (q = 1: the Gaussian pair), the same
// quantities as loss_tails() in pld_tails.cpp with two erfc calls per point instead of six
// log-CDFs.
LinearTails gaussian_family_tails(bool remove, double mu, double q, double log_ratio) noexcept {
  const NormalTails t = gaussian_normal_tails(remove, mu, log_ratio);
  const auto [survival_p, survival_q] = pair_masses(remove, q, t.null_survival, t.shifted_survival);
  const auto [cdf_p, cdf_q] = pair_masses(remove, q, t.null_cdf, t.shifted_cdf);
  return {survival_p, cdf_p, survival_q, cdf_q};
}

// P(S) - e^{a} Q(S) for a set S of outputs above the loss a, from its null and shifted normal
// masses N and S and the point's excess_coefficient c = E_a - (1 - q) (E_a = e^{+-a}), without
// forming P and Q: remove P - e^a Q = q S - (e^a - 1 + q) N = q S - c N; add P - e^a Q =
// N - e^a ((1 - q) N + q S) = e^a ((e^{-a} - 1 + q) N - q S) = e^a (c N - q S). Forming P and Q
// first loses everything below their ulp: at q = 1e-12 both are 1 - O(q) and their difference
// came out 1e-4 relative too small. Rounded up by kExcessSlack times the terms' magnitudes, so
// that a cell's split leans to its upper point (pessimistic; see pld.hpp).
double excess_over_tilted(bool remove, double q, double coefficient, double exp_loss,
                          double null_mass, double shifted_mass) noexcept {
  const double shifted_term = q * shifted_mass;
  const double null_term = coefficient * null_mass;
  const double slack = kExcessSlack * (std::abs(shifted_term) + std::abs(null_term));
  return remove ? shifted_term - null_term + slack
                : exp_loss * (null_term - shifted_term + slack);
}

// The normal masses of a narrow cell [m - d, m + d] of the output x, without the cancellation
// of a difference of tails: int_{-d}^{d} phi(c + t) dt = 2 d phi(c) sum_n d^{2n} He_{2n}(c) /
// (2n + 1)! (Taylor's series of phi(c + t) = phi(c) sum_k (-t)^k He_k(c) / k!, odd terms
// integrating to 0; He_k the probabilists' Hermite polynomials), summed up to He_6. With
// d (|c| + 3) <= kNarrowCell the first omitted term and all later ones are below 1e-19 of the
// sum (|He_2n(c)| <= (|c| + 3)^(2n) for 2n <= 8, and the (2n + 1)! grow faster beyond), far below
// the round-off of the terms. Returns false (nothing written) for a cell that is not that narrow.
constexpr double kNarrowCell = 0.02;
constexpr double kInvSqrtTwoPi = 0.39894228040143267794;

inline double narrow_series(double c, double d_squared) noexcept {
  const double c2 = c * c;
  const double he2 = c2 - 1.0;
  const double he4 = (c2 - 6.0) * c2 + 3.0;
  const double he6 = ((c2 - 15.0) * c2 + 45.0) * c2 - 15.0;
  return 1.0 + d_squared * (he2 / 6.0 + d_squared * (he4 / 120.0 + d_squared * (he6 / 5040.0)));
}

// (mass under N(0, 1), mass under N(mu, 1)) of the cell [m - d, m + d], or false. `tilt` is
// e^{mu m - mu^2 / 2} = phi(m - mu) / phi(m) (0 or not finite: phi(m - mu) is computed
// directly), so that one exponential serves both normals.
bool narrow_cell_masses(double m, double d, double mu, double tilt, double& null_mass,
                        double& shifted_mass) noexcept {
  const double shifted = m - mu;
  if (!(d >= 0.0) || !(d * (std::max(std::abs(m), std::abs(shifted)) + 3.0) <= kNarrowCell)) {
    return false;
  }
  const double d_squared = d * d;
  const double width = 2.0 * d * kInvSqrtTwoPi;
  const double density = std::exp(-0.5 * m * m);
  const double shifted_density = density > 1e-280 && tilt > 0.0 && tilt < 1e280
                                     ? density * tilt
                                     : std::exp(-0.5 * shifted * shifted);
  null_mass = width * density * narrow_series(m, d_squared);
  shifted_mass = width * shifted_density * narrow_series(shifted, d_squared);
  return true;
}

// A Gaussian-family pair: its direction (remove or add), sampling rate (1 for the plain Gaussian)
// and shift mu = 1 / noise multiplier.
struct GaussianFamilyPair {
  bool remove;
  double q;
  double mu;
};

GaussianFamilyPair gaussian_family_pair(const MechanismParams& params) {
  return {params.mechanism != Mechanism::kPoissonAdd,
          params.mechanism == Mechanism::kGaussian ? 1.0 : params.sampling_rate,
          1.0 / params.parameter};
}

bool is_gaussian_family(Mechanism mechanism) {
  return mechanism == Mechanism::kGaussian || mechanism == Mechanism::kPoissonRemove ||
         mechanism == Mechanism::kPoissonAdd;
}

// P(a < L <= b) from the tails at a and b: from the survival function where it is at most 1/2,
// otherwise from the CDF, so the difference never cancels more than the tails' own magnitude.
double cell_mass(double survival_a, double cdf_a, double survival_b, double cdf_b) noexcept {
  const double mass = survival_a <= 0.5 ? survival_a - survival_b : cdf_b - cdf_a;
  return mass > 0.0 ? mass : 0.0;
}

// Whether linear-space tails keep every value the discretisation needs above the subnormal range
// on [lowest, highest] * h (checked at both ends, where the tails are smallest).
bool linear_tails_are_safe(const MechanismParams& params, double grid_step, GridRange range) {
  if (!is_gaussian_family(params.mechanism)) return false;
  constexpr double kLogSafe = -650.0;
  for (const std::int64_t index : {range.lowest, range.highest}) {
    const LossTails t = loss_tails(params, static_cast<double>(index) * grid_step);
    for (const double value : {t.log_survival_p, t.log_cdf_p, t.log_survival_q, t.log_cdf_q}) {
      if (value != kNegInf && value < kLogSafe) return false;
    }
  }
  return true;
}

// The connect-the-dots rounding of discretize_pessimistic for the Gaussian-family pairs, in linear
// space, with the sigma-independent values from `table` (which must cover the range). The same
// cell masses as the log-space version up to double rounding (a relative 1e-12 on a cell mass,
// also the accuracy of the log-space differences).
// The cells (a, b] are independent, so `threads` split them: cell i's share at its lower point is
// written to mass[i] and its share at its upper point to upper[i], and mass[i + 1] += upper[i]
// afterwards, the same sums in the same order as one pass over the cells (0 + x is exact).
DiscretePld discretize_pessimistic_linear(const MechanismParams& params, double grid_step,
                                          GridRange range, const GaussianFamilyTable& table,
                                          int threads) {
  const auto [remove, q, mu] = gaussian_family_pair(params);
  const std::int64_t n = range.highest - range.lowest + 1;
  const auto base = static_cast<std::size_t>(range.lowest - table.first);
  const double* log_ratio = table.log_ratio.data() + base;
  const double* exp_loss = table.exp_loss.data() + base;
  DiscretePld out;
  out.offset = range.lowest;
  out.mass.assign(static_cast<std::size_t>(n), 0.0);
  std::vector<double> upper(static_cast<std::size_t>(n), 0.0);
  double* lower = out.mass.data();
  const double inverse_spread = 1.0 / -std::expm1(-grid_step);
  const double* log_ratio_step = table.log_ratio_step.data() + base;
  const double* ratio = table.ratio.data() + base;
  const double* coefficient = table.excess_coefficient.data() + base;
  const double half_mu = 0.5 * mu;
  const double half_inverse_mu = 0.5 / mu;
  const double inverse_mu = 1.0 / mu;
  parallel_ranges<Threads::kOwnThreads>(n - 1, kPointsPerThread, threads, [&](std::int64_t lo, std::int64_t hi) {
    NormalTails a{};
    bool have_a = false;  // whether `a` holds the tails at point i (kept from the cell before)
    for (std::int64_t i = lo; i < hi; ++i) {
      // The cell (l_i, l_{i+1}] of the loss is the x interval between x_i and x_{i+1},
      // x = log_ratio / mu + mu / 2 (increasing in l for remove, decreasing for add): centre
      // m, half-width d = |log_ratio_step| / (2 mu). A narrow one (all but the few cells next
      // to the bottom of the support) is integrated by narrow_cell_masses, one exponential per
      // normal instead of two tails each; the others as the difference of the tails at its ends.
      double null_mass = 0.0;
      double shifted_mass = 0.0;
      const double half_step = half_inverse_mu * log_ratio_step[i];
      const double centre = log_ratio[i] * inverse_mu + half_mu + half_step;
      // e^{mu m - mu^2 / 2} = e^{(log_ratio_i + log_ratio_{i+1}) / 2} at the centre m.
      const double tilt = std::sqrt(ratio[i] * ratio[i + 1]);
      if (narrow_cell_masses(centre, std::abs(half_step), mu, tilt, null_mass, shifted_mass)) {
        have_a = false;
      } else {
        if (!have_a) a = gaussian_normal_tails(remove, mu, log_ratio[i]);
        const NormalTails b = gaussian_normal_tails(remove, mu, log_ratio[i + 1]);
        null_mass = cell_mass(a.null_survival, a.null_cdf, b.null_survival, b.null_cdf);
        shifted_mass =
            cell_mass(a.shifted_survival, a.shifted_cdf, b.shifted_survival, b.shifted_cdf);
        a = b;
        have_a = true;
      }
      const double p = pair_masses(remove, q, null_mass, shifted_mass).first;
      if (p > 0.0) {
        // The weight at b keeps the cell's P- and Q-masses: (P - e^{a} Q) / (1 - e^{-h}), in
        // [0, P] (rounded up, see excess_over_tilted).
        const double excess =
            excess_over_tilted(remove, q, coefficient[i], exp_loss[i], null_mass, shifted_mass);
        const double at_upper = std::clamp(excess * inverse_spread, 0.0, p);
        upper[static_cast<std::size_t>(i)] = at_upper;
        lower[i] = p - at_upper;
      }
    }
  });
  // Mass at or below the bottom point moves up to it.
  out.mass[0] = gaussian_family_tails(remove, mu, q, log_ratio[0]).cdf_p + out.mass[0];
  for (std::int64_t i = 1; i < n; ++i) out.mass[i] = upper[i - 1] + out.mass[i];
  // Mass above the top point l_t: Q-mass e^{l_t} at l_t and the rest, delta(l_t) = P - e^{l_t} Q
  // of {L > l_t} (from the normal masses, see excess_over_tilted), at +inf.
  const NormalTails top = gaussian_normal_tails(remove, mu, log_ratio[n - 1]);
  const double top_p = pair_masses(remove, q, top.null_survival, top.shifted_survival).first;
  out.infinity_mass =
      std::clamp(excess_over_tilted(remove, q, coefficient[n - 1], exp_loss[n - 1],
                                    top.null_survival, top.shifted_survival),
                 0.0, top_p);
  out.mass[n - 1] += top_p - out.infinity_mass;
  return out;
}

GaussianFamilyTable table_for(const MechanismParams& params, double grid_step, std::int64_t first,
                              std::int64_t last, int threads) {
  const GaussianFamilyPair pair = gaussian_family_pair(params);
  return gaussian_family_table(pair.remove, pair.q, grid_step, first, last, threads);
}

// log(P - e^{a} Q) of the cell (a, b] of a Gaussian-family or kSampledSymmetric pair, from the
// tails at its ends, rounded up. Both ends in one direction: that direction's excess from the
// cell's component masses (GaussianExcess). A kSampledSymmetric cell whose tails switch
// direction, A at a and B at b (where the two deltas cross): its P- and Q-masses are A's tails
// at a less B's at b, so P - e^{a} Q = [delta_A(a) - delta_B(a)] + B's excess on the cell, the
// gap with delta_B(a) rounded down.
double gaussian_cell_log_excess(const MechanismParams& params, double loss_a,
                                const GaussianPointTails& a, const GaussianPointTails& b) {
  const bool switched = a.excess.remove != b.excess.remove;
  const GaussianExcess at_a =
      switched ? GaussianExcess(b.excess.remove, params.sampling_rate, loss_a) : a.excess;
  const ComponentLogTails from =
      switched ? gaussian_component_log_tails(at_a, 1.0 / params.parameter) : a.components;
  const ComponentLogTails& to = b.components;
  const double log_null =
      log_cell_mass(from.null_survival, from.null_cdf, to.null_survival, to.null_cdf);
  const double log_shifted = log_cell_mass(from.shifted_survival, from.shifted_cdf,
                                           to.shifted_survival, to.shifted_cdf);
  const double excess = at_a.log_of(log_null, log_shifted, true);
  if (!switched) return excess;
  const double other_delta = at_a.log_of(from.null_survival, from.shifted_survival, false);
  return log_add_exp(log_diff(a.log_delta, other_delta), excess) + kExcessSlack;
}

// The tails of the log-space discretisation at one grid point (with the Gaussian family's parts).
struct LogPoint {
  LossTails tails;
  GaussianPointTails gaussian;
};

LogPoint log_point(const MechanismParams& params, double loss) noexcept {
  LogPoint point{};
  if (params.mechanism == Mechanism::kLaplace) {
    point.tails = loss_tails(params, loss);
  } else {
    point.gaussian = gaussian_point_tails(params, loss);
    point.tails = gaussian_loss_tails(point.gaussian);
  }
  return point;
}

}  // namespace

DiscretePld discretize_pessimistic(const MechanismParams& params, double grid_step,
                                   GridRange range) {
  const std::int64_t n = checked_points(grid_step, range);
  if (linear_tails_are_safe(params, grid_step, range)) {
    return discretize_pessimistic_linear(
        params, grid_step, range, table_for(params, grid_step, range.lowest, range.highest, 1), 1);
  }
  DiscretePld out;
  out.offset = range.lowest;
  out.mass.assign(static_cast<std::size_t>(n), 0.0);
  LogPoint a = log_point(params, static_cast<double>(range.lowest) * grid_step);
  // Mass at or below the bottom point moves up to it (a larger loss: pessimistic).
  out.mass[0] += std::exp(a.tails.log_cdf_p);
  // Each cell (a, b] is spread onto {a, b} keeping its P-mass and its Q-mass (= E_P[Y; cell]):
  // weight at b = (P - e^{a} Q) / (1 - e^{-h}), the excess formed from the pair's parts
  // (gaussian_cell_log_excess, laplace_log_excess).
  const double spread_denominator = -std::expm1(-grid_step);
  const double cell_bracket = laplace_cell_bracket(grid_step);
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    const double loss_a = static_cast<double>(range.lowest + i) * grid_step;
    const double loss_b = static_cast<double>(range.lowest + i + 1) * grid_step;
    const LogPoint b = log_point(params, loss_b);
    const double log_p = log_cell_mass(a.tails.log_survival_p, a.tails.log_cdf_p,
                                       b.tails.log_survival_p, b.tails.log_cdf_p);
    if (log_p != kNegInf) {
      const double log_excess =
          params.mechanism == Mechanism::kLaplace
              ? laplace_log_excess(params.parameter, loss_a, loss_b, cell_bracket)
              : gaussian_cell_log_excess(params, loss_a, a.gaussian, b.gaussian);
      const double p = std::exp(log_p);
      const double upper_fraction =
          std::clamp(std::exp(log_excess - log_p) / spread_denominator, 0.0, 1.0);
      out.mass[i + 1] += p * upper_fraction;
      out.mass[i] += p * (1.0 - upper_fraction);
    }
    a = b;
  }
  // Mass above the top point l_t: spread onto {l_t, +inf}: delta(l_t) = P - e^{l_t} Q of
  // {L > l_t} at +inf and the rest, the Q-mass / e^{-l_t}, at l_t.
  const double top_loss = static_cast<double>(range.highest) * grid_step;
  if (a.tails.log_survival_p != kNegInf) {
    const double above = std::exp(a.tails.log_survival_p);
    const double log_delta = params.mechanism == Mechanism::kLaplace
                                 ? laplace_log_excess(params.parameter, top_loss, kInf, kNaN)
                                 : a.gaussian.log_delta;
    out.infinity_mass = std::min(std::exp(log_delta), above);
    out.mass[n - 1] += above - out.infinity_mass;
  }
  return out;
}

namespace {

// Relative allowance for the round-off of the cell masses in the merged losses below.
constexpr double kMassSlack = 1e-9;

// The optimistic rounding from the half-width cells' log P- and Q-masses (cell c < cells - 1 is
// (b_c, b_{c+1}] with b_i = (lowest + i / 2) h, the last cell is everything above the top grid
// point), see discretize_optimistic. The half cells are merged pairwise into cells centred on the
// grid points, ((k - 1/2) h, (k + 1/2) h] (the bottom one from lowest h, the top one up to
// highest h; the cell above the top grid point stays apart), each one outcome of its P-mass p and
// loss log(p / q) lowered by 2e-9 (the merged pair is a post-processing, and a lower loss is only
// optimistic), then brought onto the grid by pull_onto_grid.
DiscretePld contract_cells(std::int64_t lowest, std::int64_t n, double grid_step,
                           const std::vector<double>& cell_log_p,
                           const std::vector<double>& cell_log_q) {
  const std::size_t cells = cell_log_p.size();  // 2 (n - 1) + 1
  std::vector<double> mass;
  std::vector<double> loss;
  mass.reserve(static_cast<std::size_t>(n) + 1);
  loss.reserve(static_cast<std::size_t>(n) + 1);
  auto add = [&](std::size_t first, std::size_t last) {  // half cells first..last (inclusive)
    double p = 0.0;
    double q = 0.0;
    for (std::size_t c = first; c <= last; ++c) {
      p += std::exp(cell_log_p[c]);
      q += std::exp(cell_log_q[c]);
    }
    mass.push_back(p);
    loss.push_back(p > 0.0 ? std::log(p) - std::log(q) - 2.0 * kMassSlack : 0.0);
  };
  add(0, 0);
  for (std::size_t c = 1; c + 1 < cells; c += 2) add(c, std::min(c + 1, cells - 2));
  add(cells - 1, cells - 1);
  // Four certified optimistic roundings of the same cells, each a post-processing followed by
  // mean-preserving merges: the centred cells pulled up onto the grid (pull_onto_grid, each group
  // aimed at the grid point nearest its first atom, or at the one above it), and the centred or
  // the half cells contracted down onto it (contract_onto_grid: groups sweep down from the
  // highest loss, each placed exactly at the grid point below its first atom). Which is closest
  // depends on where the cells' losses fall against the grid points (just below: the pull up;
  // just above: a contraction down) and on which end of the losses is dense: a sweep's last group
  // may find nothing left to balance it and is rounded down whole, harmless at a sparse tail but
  // first order at a hard edge. Under a small sampling rate q the remove direction's losses pile
  // up just above log(1 - q) (half the mass within two cells at q = 5e-4, sigma = 0.6, h = 2^-14):
  // a downward sweep ends there, and nearest-point targets round every atom in the upper half of
  // its cell down at once, so only the upward sweep aimed above (with a margin of 1e-6 h instead
  // of 1e-3 h, which alone lowers every group's loss, here by 3% of the leaf's mean loss) keeps
  // the leaf's Kullback-Leibler divergence to within 1.8e-3, most of it the 2e-9 allowance for
  // the masses' round-off below (the other three lost 0.81 of it there).
  // The one with the largest mean loss sum_k m_k k h (the closest to that divergence, which every
  // optimistic rounding can only lower) is kept; any choice is certified.
  std::vector<DiscretePld> candidates;
  candidates.push_back(pull_onto_grid(lowest, n, grid_step, mass, loss, false));
  candidates.push_back(pull_onto_grid(lowest, n, grid_step, mass, loss, true));
  candidates.push_back(contract_onto_grid(lowest, n, grid_step, mass, loss));
  std::vector<double> half_mass(cells);
  std::vector<double> half_loss(cells);
  for (std::size_t c = 0; c < cells; ++c) {
    half_mass[c] = std::exp(cell_log_p[c]);
    // lowered like the centred cells' losses, by the allowance for the masses' round-off
    half_loss[c] = cell_log_p[c] - cell_log_q[c] - 2.0 * kMassSlack;
  }
  candidates.push_back(contract_onto_grid(lowest, n, grid_step, half_mass, half_loss));
  auto mean_index = [](const DiscretePld& d) {
    double sum = 0.0;
    for (std::size_t i = 0; i < d.mass.size(); ++i) sum += d.mass[i] * static_cast<double>(i);
    return sum;
  };
  std::size_t best = 0;
  for (std::size_t i = 1; i < candidates.size(); ++i) {
    if (mean_index(candidates[i]) > mean_index(candidates[best])) best = i;
  }
  return std::move(candidates[best]);
}

// The cells of contract_cells for a Gaussian-family pair in linear space, with the
// sigma-independent values from `half_table` (a table on the half-step grid h / 2 that covers
// [2 lowest, 2 highest]): the same masses as the log-space tails up to double rounding.
DiscretePld discretize_optimistic_linear(const MechanismParams& params, double grid_step,
                                         GridRange range, const GaussianFamilyTable& half_table,
                                         int threads) {
  const auto [remove, q, mu] = gaussian_family_pair(params);
  const std::int64_t n = range.highest - range.lowest + 1;
  const std::int64_t boundaries = 2 * (n - 1) + 1;
  const double* log_ratio = half_table.log_ratio.data() + (2 * range.lowest - half_table.first);
  std::vector<double> cell_log_p(static_cast<std::size_t>(boundaries));
  std::vector<double> cell_log_q(static_cast<std::size_t>(boundaries));
  // The cells are independent (each from the tails at its two ends): `threads` split them.
  parallel_ranges<Threads::kOwnThreads>(boundaries - 1, kPointsPerThread, threads, [&](std::int64_t lo, std::int64_t hi) {
    LinearTails a = gaussian_family_tails(remove, mu, q, log_ratio[lo]);
    for (std::int64_t c = lo; c < hi; ++c) {
      const auto i = static_cast<std::size_t>(c);
      const LinearTails b = gaussian_family_tails(remove, mu, q, log_ratio[c + 1]);
      cell_log_p[i] = std::log(cell_mass(a.survival_p, a.cdf_p, b.survival_p, b.cdf_p));
      cell_log_q[i] = std::log(cell_mass(a.survival_q, a.cdf_q, b.survival_q, b.cdf_q));
      a = b;
    }
  });
  // The last cell: everything above the top grid point.
  const LinearTails top = gaussian_family_tails(remove, mu, q, log_ratio[boundaries - 1]);
  cell_log_p[static_cast<std::size_t>(boundaries - 1)] = std::log(top.survival_p);
  cell_log_q[static_cast<std::size_t>(boundaries - 1)] = std::log(top.survival_q);
  return contract_cells(range.lowest, n, grid_step, cell_log_p, cell_log_q);
}

}  // namespace

DiscretePld discretize_optimistic(const MechanismParams& params, double grid_step,
                                  GridRange range) {
  const std::int64_t n = checked_points(grid_step, range);
  // Post-process the output to half-width cells (boundaries at multiples of h/2 from the bottom
  // grid point up to the top one, plus one cell for everything above the top): the cell index is
  // a dominated pair (data processing), with point y*_c = Q(cell)/P(cell) per cell. Mass at or
  // below the bottom grid point is dropped (loss -inf).
  if (linear_tails_are_safe(params, grid_step, range)) {
    return discretize_optimistic_linear(
        params, grid_step, range,
        table_for(params, 0.5 * grid_step, 2 * range.lowest, 2 * range.highest, 1), 1);
  }
  const std::int64_t boundaries = 2 * (n - 1) + 1;
  std::vector<LossTails> tails(static_cast<std::size_t>(boundaries));
  for (std::int64_t i = 0; i < boundaries; ++i) {
    tails[i] = loss_tails(params, (static_cast<double>(range.lowest) + 0.5 * static_cast<double>(i)) * grid_step);
  }
  std::vector<double> cell_log_p(static_cast<std::size_t>(boundaries));
  std::vector<double> cell_log_q(static_cast<std::size_t>(boundaries));
  for (std::int64_t c = 0; c < boundaries; ++c) {
    const LossTails& t = tails[static_cast<std::size_t>(c)];
    if (c == boundaries - 1) {
      cell_log_p[static_cast<std::size_t>(c)] = t.log_survival_p;
      cell_log_q[static_cast<std::size_t>(c)] = t.log_survival_q;
    } else {
      const LossTails& next = tails[static_cast<std::size_t>(c + 1)];
      cell_log_p[static_cast<std::size_t>(c)] =
          log_cell_mass(t.log_survival_p, t.log_cdf_p, next.log_survival_p, next.log_cdf_p);
      cell_log_q[static_cast<std::size_t>(c)] =
          log_cell_mass(t.log_survival_q, t.log_cdf_q, next.log_survival_q, next.log_cdf_q);
    }
  }
  return contract_cells(range.lowest, n, grid_step, cell_log_p, cell_log_q);
}

std::vector<DiscretePld> discretize_many(Mechanism mechanism, const std::vector<double>& parameters,
                                         double sampling_rate, double grid_step, double top_tail,
                                         double bottom_tail, bool pessimistic, int threads) {
  check_step(grid_step);
  if (threads < 1) throw std::invalid_argument("threads must be >= 1");
  std::vector<MechanismParams> params;
  std::vector<GridRange> ranges;
  params.reserve(parameters.size());
  ranges.reserve(parameters.size());
  for (const double parameter : parameters) {
    params.push_back({mechanism, parameter, sampling_rate});
    ranges.push_back(grid_range(params.back(), grid_step, top_tail, bottom_tail));
  }
  // The linear-space leaves share one table over the union of their ranges (on the half-step
  // grid for the optimistic rounding's half-width cells).
  const int scale = pessimistic ? 1 : 2;
  std::vector<bool> linear(parameters.size());
  bool any_linear = false;
  std::int64_t first = 0;
  std::int64_t last = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    linear[i] = ranges[i].highest > ranges[i].lowest &&
                linear_tails_are_safe(params[i], grid_step, ranges[i]);
    if (!linear[i]) continue;
    const std::int64_t lo = scale * ranges[i].lowest;
    const std::int64_t hi = scale * ranges[i].highest;
    first = any_linear ? std::min(first, lo) : lo;
    last = any_linear ? std::max(last, hi) : hi;
    any_linear = true;
  }
  GaussianFamilyTable table;
  if (any_linear) table = table_for(params.front(), grid_step / scale, first, last, threads);
  std::vector<DiscretePld> out;
  out.reserve(parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    if (!linear[i]) {
      out.push_back(pessimistic ? discretize_pessimistic(params[i], grid_step, ranges[i])
                                : discretize_optimistic(params[i], grid_step, ranges[i]));
    } else {
      out.push_back(pessimistic
                        ? discretize_pessimistic_linear(params[i], grid_step, ranges[i], table,
                                                        threads)
                        : discretize_optimistic_linear(params[i], grid_step, ranges[i], table,
                                                       threads));
    }
  }
  return out;
}

}  // namespace dpsharp::pld
