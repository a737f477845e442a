// The hockey-stick curve of a composed PLD on its grid (see pld.hpp: delta_crossing).
#include <cmath>
#include <stdexcept>

#include "dpsharp/pld.hpp"

namespace dpsharp::pld {

CurveCrossing delta_crossing(const double* mass, std::size_t size, double constant, double decay,
                             double delta, bool clip_negative, double relative_slack) {
  if (!(decay > 0.0 && decay < 1.0)) throw std::invalid_argument("decay must be in (0, 1)");
  CurveCrossing out;
  if (size == 0) return out;
  // Walk down from the top: A_j = sum_{k > j} m_k (a running sum from the top) and
  // W_j = decay m_{j+1} + decay W_{j+1} (written as two products, the operations of the
  // first-order filter this replaces, so the values are the same to the bit).
  double tail_mass = 0.0;
  double tail_weighted = 0.0;
  double next_mass = 0.0;  // m_{j+1}
  for (std::size_t step = 0; step < size; ++step) {
    const std::size_t j = size - 1 - step;
    if (step > 0) {
      tail_mass += next_mass;
      tail_weighted = decay * next_mass + decay * tail_weighted;
    }
    const double curve =
        tail_mass * (1.0 + relative_slack) + constant - tail_weighted * (1.0 - relative_slack);
    if (curve <= delta) {
      out.index = static_cast<std::int64_t>(j);
      out.tail_mass = tail_mass;
      out.tail_weighted = tail_weighted;
    }
    const double m = mass[j];
    next_mass = clip_negative && m < 0.0 ? 0.0 : m;
  }
  if (out.index > 0) {
    // The sums at index - 1, the left end of the crossing cell.
    const std::size_t j = static_cast<std::size_t>(out.index);
    const double m = mass[j];
    const double at_j = clip_negative && m < 0.0 ? 0.0 : m;
    out.tail_mass += at_j;
    out.tail_weighted = decay * at_j + decay * out.tail_weighted;
  }
  return out;
}

}  // namespace dpsharp::pld
