// Moment generating functions of a discretised privacy-loss distribution (see pld.hpp).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "dpsharp/numerics.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

// The walk stops once every remaining term is below this fraction of the sum so far: the
// remaining terms are at most factor * (their total mass <= 1), so the sum is then exact to
// double precision.
constexpr double kRelativeCutoff = 1e-18;
// Below this the running factor has lost its relative accuracy (subnormals): the walk gives up
// and the exact log-sum-exp below is used instead.
constexpr double kFactorFloor = 1e-290;

// log sum_k mass[k] e^{t l_k}, l_k = bottom + k h, by log-sum-exp over the non-zero masses
// (one log and one exp per point): exact whatever the masses' magnitudes.
double log_mgf_exact(const double* mass, std::size_t size, double bottom, double grid_step,
                     double t) {
  double top_term = kNegInf;
  for (std::size_t k = 0; k < size; ++k) {
    if (mass[k] > 0.0) {
      top_term = std::max(top_term, std::log(mass[k]) + t * (bottom + static_cast<double>(k) * grid_step));
    }
  }
  if (top_term == kNegInf) return kNegInf;
  double sum = 0.0;
  for (std::size_t k = 0; k < size; ++k) {
    if (mass[k] > 0.0) {
      sum += std::exp(std::log(mass[k]) + t * (bottom + static_cast<double>(k) * grid_step) - top_term);
    }
  }
  return top_term + std::log(sum);
}

}  // namespace

std::vector<double> log_mgf(const double* mass, std::size_t size, std::int64_t offset,
                            double grid_step, const std::vector<double>& exponents) {
  if (!(grid_step > 0.0) || !std::isfinite(grid_step)) {
    throw std::invalid_argument("grid_step must be finite and > 0");
  }
  std::vector<double> out(exponents.size(), kNegInf);
  if (size == 0) return out;
  const double bottom = static_cast<double>(offset) * grid_step;
  const double top = static_cast<double>(offset + static_cast<std::int64_t>(size) - 1) * grid_step;
  for (std::size_t e = 0; e < exponents.size(); ++e) {
    const double t = exponents[e];
    if (!std::isfinite(t)) throw std::invalid_argument("exponents must be finite");
    // Factor out e^{t l*} at the end l* where t l is largest and walk away from it with the
    // ratio e^{-|t| h} <= 1, so every factor is in (0, 1] and nothing overflows; stop when the
    // rest cannot matter relative to the sum so far (never merely because the factor is small:
    // the masses near l* may be 0 or tiny).
    const double ratio = std::exp(-std::fabs(t) * grid_step);
    const double anchor = t >= 0.0 ? top : bottom;
    double factor = 1.0;
    double sum = 0.0;
    bool exact_needed = false;
    for (std::size_t step = 0; step < size; ++step) {
      const std::size_t k = t >= 0.0 ? size - 1 - step : step;
      sum += mass[k] * factor;
      factor *= ratio;
      if (factor < kRelativeCutoff * sum) break;
      if (factor < kFactorFloor) {
        exact_needed = true;
        break;
      }
    }
    if (exact_needed) {
      out[e] = log_mgf_exact(mass, size, bottom, grid_step, t);
    } else if (sum > 0.0) {
      out[e] = t * anchor + std::log(sum);
    }
  }
  return out;
}

}  // namespace dpsharp::pld
