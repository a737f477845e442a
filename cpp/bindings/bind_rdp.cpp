// Python bindings of the RDP concern (cpp/include/dpsharp/rdp.hpp). Inputs are converted to
// contiguous float64 arrays; the work runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "dpsharp/rdp.hpp"
#include "dpsharp/rdp_search.hpp"

namespace py = pybind11;

namespace dpsharp::bindings {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

template <typename Fn>
py::array_t<double> per_order(const Array& orders, Fn&& fn) {
  if (orders.ndim() != 1) throw std::invalid_argument("orders must be a 1-d array");
  const auto n = static_cast<std::size_t>(orders.shape(0));
  py::array_t<double> out(static_cast<py::ssize_t>(n));
  const double* in = orders.data();
  double* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    fn(in, n, dst);
  }
  return out;
}

py::tuple convert(const Array& orders, const Array& rdp, double target, int kind, bool to_epsilon) {
  if (orders.ndim() != 1 || rdp.ndim() != 1 || orders.shape(0) != rdp.shape(0)) {
    throw std::invalid_argument("orders and rdp must be 1-d arrays of the same length");
  }
  const auto n = static_cast<std::size_t>(orders.shape(0));
  rdp::Conversion result{};
  {
    py::gil_scoped_release release;
    result = to_epsilon ? rdp::epsilon_from_rdp(orders.data(), rdp.data(), n, target, kind)
                        : rdp::delta_from_rdp(orders.data(), rdp.data(), n, target, kind);
  }
  return py::make_tuple(result.value, result.best_index);
}

// rdp::search_orders over Python terms (count, values, q, sigma, floor, lazy): a lazy term's
// values (float64, C-contiguous, writable, one per plan point, NaN = not evaluated) are filled
// in place, so the caller's cached curves keep what this search evaluated.
using IndexArray = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using FlagArray = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;

py::tuple search(const Array& points, const IndexArray& grid_at, const Array& orders,
                 const FlagArray& integer,
                 const py::list& terms, double target, int kind, bool want_delta,
                 std::size_t fractional_per_round) {
  const auto n_grid = static_cast<std::size_t>(orders.size());
  const auto n_points = static_cast<std::size_t>(points.size());
  if (points.ndim() != 1 || orders.ndim() != 1 || grid_at.ndim() != 1 || integer.ndim() != 1 ||
      static_cast<std::size_t>(grid_at.size()) != n_grid ||
      static_cast<std::size_t>(integer.size()) != n_grid) {
    throw std::invalid_argument("points, grid_at, orders and integer must be 1-d and consistent");
  }
  for (std::size_t g = 0; g < n_grid; ++g) {
    const std::int64_t at = grid_at.data()[g];
    if (at < 0 || static_cast<std::size_t>(at) >= n_points) {
      throw std::invalid_argument("grid_at must index points");
    }
  }
  std::vector<py::array> keep_alive;
  std::vector<rdp::CurveTerm> curve_terms;
  keep_alive.reserve(terms.size());
  curve_terms.reserve(terms.size());
  for (const py::handle item : terms) {
    const auto term = item.cast<py::tuple>();
    if (term.size() != 6) {
      throw std::invalid_argument("a term is (count, values, q, sigma, floor, lazy)");
    }
    py::array values = term[1].cast<py::array>();
    const bool lazy = term[5].cast<bool>();
    if (!values.dtype().is(py::dtype::of<double>()) || values.ndim() != 1 ||
        !(values.flags() & py::array::c_style) || (lazy && !values.writeable()) ||
        static_cast<std::size_t>(values.size()) != (lazy ? n_points : n_grid)) {
      throw std::invalid_argument(
          "a term's values must be a writable, contiguous float64 array over the points (lazy) "
          "or the grid (fixed)");
    }
    rdp::CurveTerm curve{term[0].cast<double>(), lazy, term[2].cast<double>(),
                         term[3].cast<double>(), term[4].cast<double>(),
                         static_cast<double*>(values.mutable_data())};
    if (lazy && (!std::isfinite(curve.q) || !(curve.q > 0.0) || curve.q > 1.0 ||
                 !std::isfinite(curve.sigma) || !(curve.sigma > 0.0))) {
      throw std::invalid_argument("a lazy term needs q in (0, 1] and sigma in (0, inf)");
    }
    keep_alive.push_back(std::move(values));
    curve_terms.push_back(curve);
  }
  const rdp::OrderPlanView plan{points.data(), n_points, grid_at.data(), orders.data(),
                                integer.data(), n_grid};
  // The search writes the orders it evaluates into the curves' cached value arrays, which
  // other Python threads may read or fill too: it runs with the GIL held, so that two threads
  // querying one cached curve never write the same memory at once.
  const rdp::SearchResult result =
      rdp::search_orders(plan, curve_terms, target, kind, want_delta, fractional_per_round);
  py::array_t<bool> known(static_cast<py::ssize_t>(n_grid));
  bool* known_out = known.mutable_data();
  for (std::size_t g = 0; g < n_grid; ++g) known_out[g] = result.known[g] != 0;
  py::array_t<double> total(static_cast<py::ssize_t>(result.total.size()));
  std::copy(result.total.begin(), result.total.end(), total.mutable_data());
  return py::make_tuple(known, total);
}

}  // namespace

void bind_rdp(py::module_& m) {
  m.def(
      "rdp_poisson_gaussian",
      [](double q, double sigma, const Array& orders) {
        return per_order(orders, [&](const double* o, std::size_t n, double* out) {
          rdp::poisson_gaussian(q, sigma, o, n, out);
        });
      },
      py::arg("sampling_probability"), py::arg("noise_multiplier"), py::arg("orders"),
      "RDP of the Poisson-subsampled Gaussian (add/remove one) at each order.");
  m.def(
      "rdp_poisson_gaussian_log_a_minus_one",
      [](double q, double sigma, double order, bool use_quadrature, int method) {
        if (method < 0 || method > 2) {
          throw std::invalid_argument("method must be 0 (auto), 1 (trapezoid) or 2 (kronrod)");
        }
        py::gil_scoped_release release;
        return rdp::poisson_gaussian_log_a_minus_one(q, sigma, order, use_quadrature,
                                                     static_cast<rdp::QuadratureMethod>(method));
      },
      py::arg("sampling_probability"), py::arg("noise_multiplier"), py::arg("order"),
      py::arg("use_quadrature") = false, py::arg("method") = 0,
      "log(A_alpha - 1) of the Poisson-subsampled Gaussian; method (quadrature only): 0 = the "
      "trapezoidal rule where it certifies, else Gauss-Kronrod; 1 = trapezoidal only (NaN where "
      "it cannot certify); 2 = Gauss-Kronrod only.");
  m.def(
      "rdp_convex_lower_bound",
      [](const Array& points, const Array& log_moment, const Array& at) {
        if (points.ndim() != 1 || log_moment.ndim() != 1 || points.size() != log_moment.size()) {
          throw std::invalid_argument("points and log_moment must be 1-d of the same length");
        }
        const auto n = static_cast<std::size_t>(points.size());
        return per_order(at, [&](const double* o, std::size_t n_at, double* out) {
          rdp::convex_lower_bound(points.data(), log_moment.data(), n, o, n_at, out);
        });
      },
      py::arg("points"), py::arg("log_moment"), py::arg("at"),
      "Lower bound on a convex, non-decreasing K with K(1) = 0 from its values at points.");
  m.def("rdp_search_orders", &search, py::arg("points"), py::arg("grid_at"), py::arg("orders"),
        py::arg("integer"), py::arg("terms"), py::arg("target"), py::arg("kind"),
        py::arg("want_delta"), py::arg("fractional_per_round"),
        "(known mask over the grid, composed curve at the known orders) of an RDP answer; lazy "
        "terms' values are evaluated in place where the answer needs them.");
  m.def(
      "rdp_gaussian",
      [](double sigma, const Array& orders) {
        return per_order(orders, [&](const double* o, std::size_t n, double* out) {
          rdp::gaussian(sigma, o, n, out);
        });
      },
      py::arg("noise_multiplier"), py::arg("orders"), "RDP of the Gaussian mechanism.");
  m.def(
      "rdp_laplace",
      [](double scale, const Array& orders) {
        return per_order(orders, [&](const double* o, std::size_t n, double* out) {
          rdp::laplace(scale, o, n, out);
        });
      },
      py::arg("scale"), py::arg("orders"), "RDP of the Laplace mechanism.");
  m.def(
      "rdp_sampled_without_replacement_gaussian",
      [](double gamma, double sigma, const Array& orders) {
        return per_order(orders, [&](const double* o, std::size_t n, double* out) {
          rdp::sampled_without_replacement_gaussian(gamma, sigma, o, n, out);
        });
      },
      py::arg("sampling_rate"), py::arg("noise_multiplier"), py::arg("orders"),
      "Upper bound on the RDP of a Gaussian on a subsample without replacement (replace one).");
  m.def(
      "rdp_epsilon",
      [](const Array& orders, const Array& rdp, double delta, int kind) {
        return convert(orders, rdp, delta, kind, true);
      },
      py::arg("orders"), py::arg("rdp"), py::arg("delta"), py::arg("kind"),
      "(epsilon, index of the optimal order); kind 0 = classic, 1 = tight.");
  m.def(
      "rdp_delta",
      [](const Array& orders, const Array& rdp, double epsilon, int kind) {
        return convert(orders, rdp, epsilon, kind, false);
      },
      py::arg("orders"), py::arg("rdp"), py::arg("epsilon"), py::arg("kind"),
      "(delta, index of the optimal order); kind 0 = classic, 1 = tight.");
}

}  // namespace dpsharp::bindings
