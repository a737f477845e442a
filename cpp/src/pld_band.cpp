// Hockey-stick sums of a composition held as a band of low frequencies (see pld.hpp:
// band_suffix_sums, and python/dpsharp/accountants/_pld_band.py for the formulas).
#include <cmath>
#include <stdexcept>
#include <vector>

#include "dpsharp/pld.hpp"

namespace dpsharp::pld {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Pairwise summation (blocks of 16 summed in order): the error bound of BandSpectrum.error in
// _pld_band.py, (log2 J + 72) u S e^h, counts at most log2(J / 16) + 16 levels of rounding here.
double pairwise_sum(const double* values, std::size_t count) {
  if (count <= 16) {
    double total = 0.0;
    for (std::size_t i = 0; i < count; ++i) total += values[i];
    return total;
  }
  const std::size_t half = count / 2;
  return pairwise_sum(values, half) + pairwise_sum(values + half, count - half);
}

class BandEvaluator {
 public:
  explicit BandEvaluator(const BandTerms& terms)
      : terms_(terms),
        plain_(terms.count),
        discounted_(terms.count),
        rho_(std::exp(-terms.grid_step)),
        rho_minus_one_(std::expm1(-terms.grid_step)) {
    if (terms.size < 2 || 2 * static_cast<std::int64_t>(terms.count + 1) > terms.size) {
      throw std::invalid_argument("the band must hold at most half the circle's frequencies");
    }
    if (!(terms.grid_step > 0.0)) throw std::invalid_argument("grid_step must be > 0");
  }

  // (A_K, W_K) at K = index: sum_{k > K} m_k and sum_{k > K} m_k rho^{k - K}.
  BandSums at(std::int64_t index) {
    const std::int64_t n = terms_.size;
    const double h = terms_.grid_step;
    const double rho = rho_;
    const std::int64_t above_count = n - 1 - index;
    // rho - rho^{n-K}, without cancellation
    const double tail_gap = -rho * std::expm1(-static_cast<double>(above_count) * h);
    const std::int64_t stride = ((index + 1) % n + n) % n;
    std::int64_t reduced = 0;  // f (K + 1) mod n, kept exact in integers
    for (std::size_t i = 0; i < terms_.count; ++i) {
      reduced += stride;
      if (reduced >= n) reduced -= n;
      const std::int64_t centred = reduced > n / 2 ? reduced - n : reduced;  // in (-n/2, n/2]
      const double half_phase = kPi * static_cast<double>(centred) / static_cast<double>(n);
      const double half_sine = std::sin(half_phase);
      const double versine = 2.0 * half_sine * half_sine;     // 1 - cos(phi)
      const double sine = std::sin(2.0 * half_phase);         // sin(phi)
      // Re[P_f (e^{i phi} - 1)] and Re[Q_f (rho e^{i phi} - rho^{n-K})], without cancellation.
      const double p_re = terms_.plain[2 * i];
      const double p_im = terms_.plain[2 * i + 1];
      const double q_re = terms_.discounted[2 * i];
      const double q_im = terms_.discounted[2 * i + 1];
      plain_[i] = -p_re * versine - p_im * sine;
      discounted_[i] = q_re * (tail_gap - rho * versine) - q_im * (rho * sine);
    }
    const double plain_sum = pairwise_sum(plain_.data(), plain_.size());
    const double discounted_sum = pairwise_sum(discounted_.data(), discounted_.size());
    // sum_{k=K+1}^{n-1} rho^{k-K} = rho (1 - rho^{n-1-K}) / (1 - rho)
    const double geometric =
        rho * std::expm1(-static_cast<double>(above_count) * h) / rho_minus_one_;
    const double size = static_cast<double>(n);
    return {(terms_.total * static_cast<double>(above_count) + 2.0 * plain_sum) / size,
            (terms_.total * geometric + 2.0 * discounted_sum) / size};
  }

 private:
  const BandTerms& terms_;
  std::vector<double> plain_;
  std::vector<double> discounted_;
  const double rho_;            // e^{-h}
  const double rho_minus_one_;  // e^{-h} - 1, without cancellation
};

}  // namespace

BandSums band_suffix_sums(const BandTerms& terms, std::int64_t index) {
  if (index < -1 || index >= terms.size) throw std::invalid_argument("index must be in [-1, size)");
  BandEvaluator evaluator(terms);
  return evaluator.at(index);
}

CurveCrossing band_crossing(const BandTerms& terms, std::int64_t first, double constant,
                            double delta) {
  if (first < 0 || first >= terms.size) throw std::invalid_argument("first must be in [0, size)");
  BandEvaluator evaluator(terms);
  CurveCrossing out;
  const std::int64_t last = terms.size - 1;
  if (constant > delta) return out;  // the curve is `constant` at the last grid point
  auto above = [&](std::int64_t index, BandSums& sums) {
    sums = evaluator.at(index);
    return sums.mass_above + constant - sums.weighted_above > delta;
  };
  BandSums sums;
  if (!above(first, sums)) {
    out.index = first;
    out.tail_mass = std::nan("");
    out.tail_weighted = std::nan("");
    return out;
  }
  // Bisection: above(low), not above(high) (the last grid point: A = W = 0).
  std::int64_t low = first;
  std::int64_t high = last;
  BandSums at_low = sums;
  while (high - low > 1) {
    const std::int64_t middle = low + (high - low) / 2;
    if (above(middle, sums)) {
      low = middle;
      at_low = sums;
    } else {
      high = middle;
    }
  }
  out.index = high;
  out.tail_mass = at_low.mass_above;  // at high - 1 == low
  out.tail_weighted = at_low.weighted_above;
  return out;
}

}  // namespace dpsharp::pld
