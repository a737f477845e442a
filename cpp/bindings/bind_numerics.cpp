#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "dpsharp/numerics.hpp"

namespace py = pybind11;

namespace dpsharp::bindings {

void bind_numerics(py::module_& m) {
  m.def("log_normal_cdf", py::vectorize(&dpsharp::log_normal_cdf), py::arg("x"),
        "log Phi(x), the log of the standard normal CDF, accurate in both tails.");
  m.def("reciprocal_rounded_up", &dpsharp::reciprocal_rounded_up, py::arg("x"),
        "The smallest double >= 1 / x for x > 0 (+inf where 1 / x overflows): the largest "
        "privacy loss 1/b of a Laplace release, never understated.");
}

}  // namespace dpsharp::bindings
