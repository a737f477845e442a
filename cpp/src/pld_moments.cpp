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
  for (const double t : exponents) {
    if (!std::isfinite(t)) throw std::invalid_argument("exponents must be finite");
  }
  std::vector<double> out(exponents.size(), kNegInf);
  if (size == 0) return out;
  const double bottom = static_cast<double>(offset) * grid_step;
  const double top = static_cast<double>(offset + static_cast<std::int64_t>(size) - 1) * grid_step;
  // Factor out e^{t l*} at the end l* where t l is largest and walk away from it with the ratio
  // e^{-|t| h} <= 1, so every factor is in (0, 1] and nothing overflows; stop when the rest
  // cannot matter relative to the sum so far (never merely because the factor is small: the
  // masses near l* may be 0 or tiny). The exponents of one sign share one walk, kLanes at a
  // time, in blocks of kBlock points between the stopping checks (independent running sums with
  // no branch inside a block, so the compiler vectorises across exponents; summing a few more,
  // negligible, terms past the cut-off only makes the sums more exact). A lane whose factor has
  // fallen below kFactorFloor by the end of a block is recomputed exactly, whether or not it
  // also met the cut-off in that block.
  constexpr std::size_t kLanes = 8;
  constexpr std::size_t kBlock = 32;
  for (const bool from_top : {true, false}) {
    std::vector<std::size_t> walking;  // indices into exponents
    for (std::size_t e = 0; e < exponents.size(); ++e) {
      if ((exponents[e] >= 0.0) == from_top) walking.push_back(e);
    }
    for (std::size_t first = 0; first < walking.size(); first += kLanes) {
      const std::size_t lanes = std::min(kLanes, walking.size() - first);
      double ratio[kLanes], factor[kLanes], sum[kLanes];
      bool exact_needed[kLanes];
      bool stopped[kLanes];  // met the cut-off at an earlier check (later terms are negligible)
      for (std::size_t j = 0; j < kLanes; ++j) {
        const double t = j < lanes ? exponents[walking[first + j]] : 0.0;
        ratio[j] = std::exp(-std::fabs(t) * grid_step);
        factor[j] = 1.0;
        sum[j] = 0.0;
        exact_needed[j] = false;
        stopped[j] = false;
      }
      bool done = false;
      for (std::size_t start = 0; start < size && !done; start += kBlock) {
        const std::size_t stop = std::min(size, start + kBlock);
        for (std::size_t step = start; step < stop; ++step) {
          const double m = mass[from_top ? size - 1 - step : step];
          for (std::size_t j = 0; j < kLanes; ++j) {
            sum[j] += m * factor[j];
            factor[j] *= ratio[j];
          }
        }
        done = true;
        for (std::size_t j = 0; j < lanes; ++j) {
          if (exact_needed[j] || stopped[j]) continue;
          if (factor[j] < kFactorFloor) {
            exact_needed[j] = true;
          } else if (factor[j] < kRelativeCutoff * sum[j]) {
            stopped[j] = true;
          } else {
            done = false;
          }
        }
      }
      const double anchor = from_top ? top : bottom;
      for (std::size_t j = 0; j < lanes; ++j) {
        const std::size_t e = walking[first + j];
        if (exact_needed[j]) {
          out[e] = log_mgf_exact(mass, size, bottom, grid_step, exponents[e]);
        } else if (sum[j] > 0.0) {
          out[e] = exponents[e] * anchor + std::log(sum[j]);
        }
      }
    }
  }
  return out;
}

}  // namespace dpsharp::pld
