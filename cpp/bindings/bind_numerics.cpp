#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "dpsharp/numerics.hpp"

namespace py = pybind11;

namespace dpsharp::bindings {

void bind_numerics(py::module_& m) {
  m.def("log_normal_cdf", py::vectorize(&dpsharp::log_normal_cdf), py::arg("x"),
        "log Phi(x), the log of the standard normal CDF, accurate in both tails.");
}

}  // namespace dpsharp::bindings
