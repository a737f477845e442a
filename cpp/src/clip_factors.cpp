// Flat clipping's norms and factors (clip_factors.hpp). B is a batch size (hundreds to
// thousands): one thread, one pass per term, no vector intrinsics needed.
#include "dpsharp/clip_factors.hpp"

#include <algorithm>
#include <cmath>

namespace dpsharp::clip {

bool flat_clip_factors(const SqNormTerm* terms, std::int64_t count, std::int64_t batch,
                       double bound, double* norms, double* factors) noexcept {
  // norms holds the running totals until the last pass.
  std::fill(norms, norms + batch, 0.0);
  for (std::int64_t k = 0; k < count; ++k) {
    const SqNormTerm& t = terms[k];
    if (t.y != nullptr) {
      for (std::int64_t i = 0; i < batch; ++i) {
        norms[i] += t.coef * (t.x[i] * (t.y[i] + t.y_offset));
      }
    } else {
      for (std::int64_t i = 0; i < batch; ++i) norms[i] += t.coef * t.x[i];
    }
  }
  bool finite = true;
  for (std::int64_t i = 0; i < batch; ++i) {
    finite = finite && std::isfinite(norms[i]);
    norms[i] = std::sqrt(norms[i]);
    factors[i] = std::min(1.0, bound / norms[i]);
  }
  return finite;
}

}  // namespace dpsharp::clip
