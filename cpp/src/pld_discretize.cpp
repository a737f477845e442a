// Certified roundings of a privacy-loss distribution onto the grid {k h} (see pld.hpp for the
// argument why each is on the right side).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include "dpsharp/numerics.hpp"
#include "dpsharp/parallel.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

constexpr double kLogHalf = -0.6931471805599453;

double log_diff(double a, double b) noexcept {
  if (a <= b) return kNegInf;
  return log_sub_exp(a, b);
}

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
    if (hi > kLimit) throw std::runtime_error("privacy loss tail does not vanish");
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
    if (step > kLimit) throw std::runtime_error("privacy loss lower tail does not vanish");
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

// (1 - Phi(x), Phi(x)) with one erfc: the smaller of the two directly, the larger as its
// complement (>= 1/2, so no digits are lost).
void normal_tails(double x, double& survival, double& cdf) noexcept {
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  if (x > 0.0) {
    survival = 0.5 * std::erfc(x * kInvSqrt2);
    cdf = 1.0 - survival;
  } else {
    cdf = 0.5 * std::erfc(-x * kInvSqrt2);
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
};

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
  const double support_floor = q < 1.0 ? std::log1p(-q) : kNegInf;
  const double signed_step_growth = std::expm1(remove ? grid_step : -grid_step);
  parallel_ranges<Threads::kOwnThreads>(size, kPointsPerThread, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const double loss = static_cast<double>(first + i) * grid_step;
      const double signed_loss = remove ? loss : -loss;
      const auto at = static_cast<std::size_t>(i);
      if (q < 1.0 && signed_loss <= support_floor) {
        table.log_ratio[at] = kNegInf;
        table.log_ratio_step[at] = kNaN;
        table.ratio[at] = 0.0;
      } else if (q < 1.0) {
        const double above_floor = std::expm1(signed_loss) + q;  // E - (1 - q)
        table.ratio[at] = above_floor / q;
        table.log_ratio[at] = std::log(table.ratio[at]);
        table.log_ratio_step[at] =
            std::log1p(std::exp(signed_loss) * signed_step_growth / above_floor);
      } else {
        table.log_ratio[at] = signed_loss;
        table.log_ratio_step[at] = remove ? grid_step : -grid_step;
        table.ratio[at] = std::exp(signed_loss);
      }
      table.exp_loss[at] = std::exp(loss);
    }
  });
  return table;
}

// Linear-space tails of the Poisson-subsampled Gaussian pairs (q = 1: the Gaussian pair), the same
// quantities as loss_tails() in pld_tails.cpp with two erfc calls per point instead of six
// log-CDFs, from the point's log_ratio (see GaussianFamilyTable). remove: {L > l} = {x > x_l};
// add: {L > l} = {x < x_l} (see pld_tails.cpp), with x_l = (log_ratio + mu^2 / 2) / mu.
LinearTails gaussian_family_tails(bool remove, double mu, double q, double log_ratio) noexcept {
  if (log_ratio == kNegInf) {
    return remove ? LinearTails{1.0, 0.0, 1.0, 0.0} : LinearTails{0.0, 1.0, 0.0, 1.0};
  }
  const double x = (log_ratio + 0.5 * mu * mu) / mu;
  double null_above, null_below, shifted_above, shifted_below;
  normal_tails(x, null_above, null_below);
  normal_tails(x - mu, shifted_above, shifted_below);
  const double mixture_above = (1.0 - q) * null_above + q * shifted_above;
  const double mixture_below = (1.0 - q) * null_below + q * shifted_below;
  if (remove) return {mixture_above, mixture_below, null_above, null_below};
  return {null_below, null_above, mixture_below, mixture_above};
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
  const double spread_denominator = -std::expm1(-grid_step);
  const double* log_ratio_step = table.log_ratio_step.data() + base;
  const double* ratio = table.ratio.data() + base;
  const double half_mu = 0.5 * mu;
  const double half_inverse_mu = 0.5 / mu;
  const double inverse_mu = 1.0 / mu;
  const double inverse_spread = 1.0 / spread_denominator;
  parallel_ranges<Threads::kOwnThreads>(n - 1, kPointsPerThread, threads, [&](std::int64_t lo, std::int64_t hi) {
    LinearTails a{};
    bool have_a = false;  // whether `a` holds the tails at point i (kept from the cell before)
    for (std::int64_t i = lo; i < hi; ++i) {
      // The cell (l_i, l_{i+1}] of the loss is the x interval between x_i and x_{i+1},
      // x = log_ratio / mu + mu / 2 (increasing in l for remove, decreasing for add): centre
      // m, half-width d = |log_ratio_step| / (2 mu). A narrow one (all but the few cells next
      // to the bottom of the support) is integrated by narrow_cell_masses, one exponential per
      // normal instead of two tails each; the others as the difference of the tails at its ends.
      double null_mass = 0.0;
      double shifted_mass = 0.0;
      double p = 0.0;
      double q_mass = 0.0;
      const double half_step = half_inverse_mu * log_ratio_step[i];
      const double centre = log_ratio[i] * inverse_mu + half_mu + half_step;
      // e^{mu m - mu^2 / 2} = e^{(log_ratio_i + log_ratio_{i+1}) / 2} at the centre m.
      const double tilt = std::sqrt(ratio[i] * ratio[i + 1]);
      if (narrow_cell_masses(centre, std::abs(half_step), mu, tilt, null_mass, shifted_mass)) {
        const double mixture = (1.0 - q) * null_mass + q * shifted_mass;
        p = remove ? mixture : null_mass;
        q_mass = remove ? null_mass : mixture;
        have_a = false;
      } else {
        if (!have_a) a = gaussian_family_tails(remove, mu, q, log_ratio[i]);
        const LinearTails b = gaussian_family_tails(remove, mu, q, log_ratio[i + 1]);
        p = cell_mass(a.survival_p, a.cdf_p, b.survival_p, b.cdf_p);
        q_mass = cell_mass(a.survival_q, a.cdf_q, b.survival_q, b.cdf_q);
        a = b;
        have_a = true;
      }
      if (p > 0.0) {
        // r = e^{a} Q(cell) / P(cell) in [e^{-h}, 1]; weight at b = p (1 - r) / (1 - e^{-h}).
        const double r = q_mass / p * exp_loss[i];
        const double upper_fraction = std::clamp((1.0 - r) * inverse_spread, 0.0, 1.0);
        upper[static_cast<std::size_t>(i)] = p * upper_fraction;
        lower[i] = p * (1.0 - upper_fraction);
      }
    }
  });
  // Mass at or below the bottom point moves up to it.
  out.mass[0] = gaussian_family_tails(remove, mu, q, log_ratio[0]).cdf_p + out.mass[0];
  for (std::int64_t i = 1; i < n; ++i) out.mass[i] = upper[i - 1] + out.mass[i];
  // Mass above the top point l_t: Q-mass e^{l_t} at l_t and the rest, delta(l_t), at +inf.
  const LinearTails top = gaussian_family_tails(remove, mu, q, log_ratio[n - 1]);
  const double at_top = std::min(top.survival_q * exp_loss[n - 1], top.survival_p);
  out.mass[n - 1] += at_top;
  out.infinity_mass = std::max(top.survival_p - at_top, 0.0);
  return out;
}

GaussianFamilyTable table_for(const MechanismParams& params, double grid_step, std::int64_t first,
                              std::int64_t last, int threads) {
  const GaussianFamilyPair pair = gaussian_family_pair(params);
  return gaussian_family_table(pair.remove, pair.q, grid_step, first, last, threads);
}

}  // namespace

DiscretePld discretize_pessimistic(const MechanismParams& params, double grid_step,
                                   GridRange range) {
  const std::int64_t n = checked_points(grid_step, range);
  if (linear_tails_are_safe(params, grid_step, range)) {
    return discretize_pessimistic_linear(
        params, grid_step, range, table_for(params, grid_step, range.lowest, range.highest, 1), 1);
  }
  std::vector<LossTails> tails(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    tails[i] = loss_tails(params, static_cast<double>(range.lowest + i) * grid_step);
  }
  DiscretePld out;
  out.offset = range.lowest;
  out.mass.assign(static_cast<std::size_t>(n), 0.0);
  // Mass at or below the bottom point moves up to it (a larger loss: pessimistic).
  out.mass[0] += std::exp(tails[0].log_cdf_p);
  // Each cell (a, b] is spread onto {a, b} keeping its P-mass and its Q-mass (= E_P[Y; cell]):
  // weight at b = p (1 - r) / (1 - e^{-h}) with r = e^{a} Q(cell) / P(cell) in [e^{-h}, 1].
  const double spread_denominator = -std::expm1(-grid_step);
  for (std::int64_t i = 0; i + 1 < n; ++i) {
    const LossTails& a = tails[i];
    const LossTails& b = tails[i + 1];
    const double log_p = log_cell_mass(a.log_survival_p, a.log_cdf_p, b.log_survival_p, b.log_cdf_p);
    if (log_p == kNegInf) continue;
    const double log_q = log_cell_mass(a.log_survival_q, a.log_cdf_q, b.log_survival_q, b.log_cdf_q);
    const double loss_a = static_cast<double>(range.lowest + i) * grid_step;
    const double p = std::exp(log_p);
    double upper_fraction = -std::expm1(log_q - log_p + loss_a) / spread_denominator;
    upper_fraction = std::clamp(upper_fraction, 0.0, 1.0);
    out.mass[i + 1] += p * upper_fraction;
    out.mass[i] += p * (1.0 - upper_fraction);
  }
  // Mass above the top point l_t: spread onto {l_t, +inf}: Q-mass / e^{-l_t} at l_t and the rest,
  // delta(l_t), at +inf.
  const double top_loss = static_cast<double>(range.highest) * grid_step;
  const LossTails& top = tails[n - 1];
  if (top.log_survival_p != kNegInf) {
    out.mass[n - 1] += std::exp(std::min(top.log_survival_q + top_loss, top.log_survival_p));
    out.infinity_mass = std::exp(log_diff(top.log_survival_p, top.log_survival_q + top_loss));
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
