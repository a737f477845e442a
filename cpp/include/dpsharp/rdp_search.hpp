// Which orders of a grid an RDP (epsilon, delta) answer needs (the lazy evaluation of
// python/dpsharp/rdp.py, module notes "lazy evaluation").
//
// An answer needs the composed curve only at its optimal order: every other order only has to
// be shown no better. K(alpha) = (alpha - 1) D_alpha is convex in alpha with K(1) = 0 (a
// log-moment generating function; Hoelder), so between evaluated orders K lies above the
// extended chords of its neighbouring evaluated pairs and above its left neighbour's value:
// lower bounds on K, hence on each order's epsilon or log delta (non-decreasing in D_alpha).
// Orders whose bound is no better than the best evaluated order are never evaluated. The
// Poisson-subsampled Gaussian's curves (poisson_gaussian) are evaluated here on demand, into
// caller-owned arrays (NaN = not evaluated yet), so a caller can keep them between queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpsharp::rdp {

// The grid and its evaluation points (python/dpsharp/rdp.py, OrderPlan).
struct OrderPlanView {
  const double* points;        // sorted evaluation points (the grid and anchor integers)
  std::size_t n_points;
  const std::int64_t* grid_at;  // index in `points` of each grid order
  const double* orders;         // the grid
  const std::uint8_t* integer;  // whether each grid order is an integer
  std::size_t n_grid;
};

// One term of the composition: count * curve. A lazy term is the Poisson-subsampled Gaussian
// of (q, sigma), with `values` over the plan's points (NaN where not evaluated; written here);
// a fixed term has `values` over the grid (every order known).
struct CurveTerm {
  double count;
  bool lazy;
  double q, sigma;
  double floor;  // lazy: a lower bound on D_alpha at every order (0 if none)
  double* values;
};

struct SearchResult {
  std::vector<std::uint8_t> known;  // over the grid: evaluated (the answer's orders)
  std::vector<double> total;        // the composed curve at the known orders, in grid order
};

// The grid orders an answer needs and the composed curve there: sum over `terms` (in their
// order, so each value equals the full curve's) of count * curve. `target` is delta
// (want_delta = false: epsilon answers) or epsilon (want_delta = true); `kind` 0 = classic,
// 1 = tight conversion (rdp.hpp). Every order left unknown is proven to give an epsilon or log
// delta no smaller than the best known one (up to a relative slack of 1e-7 in the bounds).
// `fractional_per_round`: fractional orders evaluated per round, the open ones with the
// smallest bounds (every open integer order is evaluated each round).
// A lower bound on a convex, non-decreasing K with K(1) = 0 at each order at[j] (> 1, not a
// point), from its finite values log_moment at the increasing points (> 1):
//   K(x) >= max{ K(l0), K(l0) + s(l1, l0) (x - l0), K(r0) - s(r0, r1) (r0 - x) },
// l1 < l0 < x < r0 < r1 the neighbouring points (1 counts as a point with K = 0), s(a, b) the
// chord slope; a missing neighbour contributes nothing. Throws std::invalid_argument on bad
// input.
void convex_lower_bound(const double* points, const double* log_moment, std::size_t n,
                        const double* at, std::size_t n_at, double* out);

SearchResult search_orders(const OrderPlanView& plan, const std::vector<CurveTerm>& terms,
                           double target, int kind, bool want_delta,
                           std::size_t fractional_per_round);

}  // namespace dpsharp::rdp
