// Python bindings of the RDP concern (cpp/include/dpsharp/rdp.hpp). Inputs are converted to
// contiguous float64 arrays; the work runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <utility>

#include "bindings.hpp"
#include "dpsharp/rdp.hpp"

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
      [](double q, double sigma, double order, bool use_quadrature) {
        py::gil_scoped_release release;
        return rdp::poisson_gaussian_log_a_minus_one(q, sigma, order, use_quadrature);
      },
      py::arg("sampling_probability"), py::arg("noise_multiplier"), py::arg("order"),
      py::arg("use_quadrature") = false, "log(A_alpha - 1) of the Poisson-subsampled Gaussian.");
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
