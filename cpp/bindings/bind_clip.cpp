// Python entry points of the clip-and-noise kernels. Buffers are passed as integer addresses
// (tensor.data_ptr() of contiguous tensors) so that the extension is never built against
// torch; the torch adapter (python/dpsharp/torch/kernels.py) checks shapes, dtypes and
// contiguity before calling, since nothing here can.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

#include "bindings.hpp"
#include "dpsharp/clip.hpp"
#include "dpsharp/philox.hpp"

namespace py = pybind11;

namespace dpsharp::bindings {
namespace {

clip::DType to_dtype(int code) {
  if (code < 0 || code > 2) {
    throw py::value_error("dtype_code must be 0 (float32), 1 (float64) or 2 (bfloat16), got " +
                          std::to_string(code));
  }
  return static_cast<clip::DType>(code);
}

clip::NoiseStream to_stream(std::uint64_t key, std::uint32_t parameter, std::uint32_t release,
                            std::uint32_t rank) {
  return clip::NoiseStream{static_cast<std::uint32_t>(key),
                           static_cast<std::uint32_t>(key >> 32), parameter, release, rank};
}

template <typename P>
P* as_ptr(std::uintptr_t address) {
  return reinterpret_cast<P*>(address);  // NOLINT: addresses come from torch data_ptr()
}

}  // namespace

void bind_clip(py::module_& m) {
  m.def(
      "clip_per_example_sq_norms",
      [](std::uintptr_t per_example, int dtype_code, std::int64_t batch, std::int64_t numel,
         std::uintptr_t out, int threads) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        const clip::DType dtype = to_dtype(dtype_code);
        py::gil_scoped_release release;
        clip::per_example_sq_norms(as_ptr<const void>(per_example), dtype, batch, numel,
                                   as_ptr<double>(out), threads);
      },
      py::arg("per_example"), py::arg("dtype_code"), py::arg("batch"), py::arg("numel"),
      py::arg("out"), py::arg("threads"),
      "out[i] = sum_j g[i, j]^2 in float64 over a contiguous (batch, numel) buffer.");
  m.def(
      "clip_accumulate_noise",
      [](std::uintptr_t per_example, std::uintptr_t factors, std::int64_t batch,
         std::uintptr_t base, std::uintptr_t out, int dtype_code, std::int64_t numel,
         double noise_std, std::uint64_t key, std::uint32_t parameter, std::uint32_t release,
         std::uint32_t rank, double scale, int threads) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        if (numel > 2 * static_cast<std::int64_t>(UINT32_MAX)) {
          throw py::value_error("numel must be < 2^33 (the noise counter holds 2^32 pairs)");
        }
        if (per_example != 0 && factors == 0) {
          throw py::value_error("factors must be given with per_example");
        }
        const clip::DType dtype = to_dtype(dtype_code);
        const clip::NoiseStream stream = to_stream(key, parameter, release, rank);
        py::gil_scoped_release gil;
        clip::clip_accumulate_noise(as_ptr<const void>(per_example),
                                    as_ptr<const double>(factors), batch,
                                    as_ptr<const void>(base), as_ptr<void>(out), dtype, numel,
                                    noise_std, stream, scale, threads);
      },
      py::arg("per_example"), py::arg("factors"), py::arg("batch"), py::arg("base"),
      py::arg("out"), py::arg("dtype_code"), py::arg("numel"), py::arg("noise_std"),
      py::arg("key"), py::arg("parameter"), py::arg("release"), py::arg("rank"),
      py::arg("scale"), py::arg("threads"),
      "out = scale * (base + sum_i factors[i] g[i] + noise_std * z) with z from Philox4x32-10; "
      "addresses of 0 mean 'absent' for per_example and base.");
  m.def(
      "philox_gaussian",
      [](std::uint64_t key, std::uint32_t parameter, std::uint32_t release, std::uint32_t rank,
         std::int64_t numel, int threads) {
        if (numel < 0) throw py::value_error("numel must be >= 0");
        py::array_t<double> out(numel);
        const clip::NoiseStream stream = to_stream(key, parameter, release, rank);
        double* data = out.mutable_data();
        {
          py::gil_scoped_release gil;
          clip::gaussian_noise(stream, numel, data, threads);
        }
        return out;
      },
      py::arg("key"), py::arg("parameter"), py::arg("release"), py::arg("rank"), py::arg("numel"),
      py::arg("threads") = 1, "The standard normals of one noise stream (float64).");
  m.def(
      "philox4x32_10",
      [](std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3,
         std::uint32_t k0, std::uint32_t k1) {
        const philox::Block b = philox::philox4x32_10(philox::Block{{c0, c1, c2, c3}}, k0, k1);
        return py::make_tuple(b.v[0], b.v[1], b.v[2], b.v[3]);
      },
      py::arg("c0"), py::arg("c1"), py::arg("c2"), py::arg("c3"), py::arg("k0"), py::arg("k1"),
      "One Philox4x32-10 block (for known-answer tests).");
}

}  // namespace dpsharp::bindings
