// Each bind_*.cpp file registers one concern of the core on the module.
#pragma once

#include <pybind11/pybind11.h>

namespace dpsharp::bindings {

void bind_numerics(pybind11::module_& m);
void bind_clip(pybind11::module_& m);
void bind_norms(pybind11::module_& m);
void bind_pld(pybind11::module_& m);
void bind_rdp(pybind11::module_& m);
void bind_clip_cuda(pybind11::module_& m);

}  // namespace dpsharp::bindings
