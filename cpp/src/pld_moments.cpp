// Moment generating functions of a discretised privacy-loss distribution (see pld.hpp).
#include <cmath>
#include <stdexcept>

#include "dpsharp/numerics.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {

std::vector<double> log_mgf(const double* mass, std::size_t size, std::int64_t offset,
                            double grid_step, const std::vector<double>& exponents) {
  if (!(grid_step > 0.0) || !std::isfinite(grid_step)) {
    throw std::invalid_argument("grid_step must be finite and > 0");
  }
  std::vector<double> out(exponents.size(), kNegInf);
  if (size == 0) return out;
  // Terms below this fraction of the largest factor are dropped: with masses <= 1 and at most
  // 2^40 points they change the sum by less than 1e-278 of its largest term.
  constexpr double kNegligible = 1e-290;
  const double bottom = static_cast<double>(offset) * grid_step;
  const double top = static_cast<double>(offset + static_cast<std::int64_t>(size) - 1) * grid_step;
  for (std::size_t e = 0; e < exponents.size(); ++e) {
    const double t = exponents[e];
    if (!std::isfinite(t)) throw std::invalid_argument("exponents must be finite");
    // Factor out e^{t l*} at the end l* where t l is largest, and walk away from it with the
    // ratio e^{-|t| h} <= 1, so every factor is in (0, 1] and nothing overflows.
    const double ratio = std::exp(-std::fabs(t) * grid_step);
    double factor = 1.0;
    double sum = 0.0;
    if (t >= 0.0) {
      for (std::size_t k = size; k-- > 0;) {
        sum += mass[k] * factor;
        factor *= ratio;
        if (factor < kNegligible) break;
      }
      if (sum > 0.0) out[e] = t * top + std::log(sum);
    } else {
      for (std::size_t k = 0; k < size; ++k) {
        sum += mass[k] * factor;
        factor *= ratio;
        if (factor < kNegligible) break;
      }
      if (sum > 0.0) out[e] = t * bottom + std::log(sum);
    }
  }
  return out;
}

}  // namespace dpsharp::pld
