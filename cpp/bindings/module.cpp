// dpsharp._core: the one compiled module. This file only assembles the concerns bound in
// the bind_*.cpp files and reports how the module was built.
#include <pybind11/pybind11.h>

#include <string>

#include "bindings.hpp"
#include "dpsharp/parallel.hpp"

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
  m.def(
      "parallel_backend", []() { return std::string(dpsharp::parallel_backend()); },
      "Which threads the multithreaded CPU kernels run on now: 'openmp' (the thread team of an "
      "OpenMP runtime already loaded into the process, e.g. PyTorch's) or 'std::thread' "
      "(threads started per call).");
  dpsharp::bindings::bind_numerics(m);
  dpsharp::bindings::bind_clip(m);
  dpsharp::bindings::bind_norms(m);
  dpsharp::bindings::bind_pld(m);
  dpsharp::bindings::bind_rdp(m);
  dpsharp::bindings::bind_clip_cuda(m);
}
