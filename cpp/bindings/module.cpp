// dpsharp._core: the one compiled module. This file only assembles the concerns bound in
// the bind_*.cpp files and reports how the module was built.
#include <pybind11/pybind11.h>

#include "bindings.hpp"

namespace py = pybind11;

#ifndef DPSHARP_VERSION_STRING
#define DPSHARP_VERSION_STRING "unknown"
#endif
#ifndef DPSHARP_BUILD_TYPE
#define DPSHARP_BUILD_TYPE "unknown"
#endif
#ifndef DPSHARP_CUDA_BUILT
#define DPSHARP_CUDA_BUILT 0
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "dpsharp's compiled core: privacy numerics and clip-and-noise kernels.";
  m.def(
      "build_info",
      []() {
        py::dict info;
        info["version"] = DPSHARP_VERSION_STRING;
        info["build_type"] = DPSHARP_BUILD_TYPE;
        info["cuda"] = static_cast<bool>(DPSHARP_CUDA_BUILT);
        info["compiler"] = __VERSION__;
        info["fast_math"] =
#ifdef __FAST_MATH__
            true;
#else
            false;
#endif
        return info;
      },
      "How this module was built: version, build type, whether CUDA kernels are included.");
  dpsharp::bindings::bind_numerics(m);
  dpsharp::bindings::bind_pld(m);
  dpsharp::bindings::bind_rdp(m);
  dpsharp::bindings::bind_clip(m);
}
