// Python entry points of the CUDA clip kernels (cpp/cuda/clip_kernels.cu). Compiled into _core
// always, but the CUDA functions exist only when the module was built with -DDPSHARP_CUDA=ON
// (DPSHARP_CUDA_BUILT); without it nothing CUDA is included or referenced and only
// `cuda_device_count` (returning 0) is defined, so the torch side can tell "not built" apart.
// Buffers are device addresses (tensor.data_ptr()), the stream is
// torch.cuda.current_stream().cuda_stream; python/dpsharp/torch/kernels.py checks device,
// shapes, dtypes and contiguity before calling.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "dpsharp/clip.hpp"

#if DPSHARP_CUDA_BUILT
#include "dpsharp/clip_cuda.hpp"
#endif

namespace py = pybind11;

namespace dpsharp::bindings {

void bind_clip_cuda(py::module_& m) {
#if DPSHARP_CUDA_BUILT
  auto dtype_of = [](int code) {
    if (code < 0 || code > 2) {
      throw py::value_error("dtype_code must be 0 (float32), 1 (float64) or 2 (bfloat16)");
    }
    return static_cast<clip::DType>(code);
  };
  auto stream_of = [](const std::array<std::uint32_t, 8>& key, std::uint32_t parameter,
                      std::uint32_t release, std::uint32_t rank) {
    clip::NoiseStream s{};
    for (std::size_t i = 0; i < 8; ++i) s.key[i] = key[i];
    s.parameter = parameter;
    s.release = release;
    s.rank = rank;
    return s;
  };
  m.def(
      "cuda_clip_per_example_sq_norms",
      [dtype_of](std::uintptr_t per_example, int dtype_code, std::int64_t batch,
                 std::int64_t numel, std::uintptr_t out, std::uintptr_t stream) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        const clip::DType dtype = dtype_of(dtype_code);
        py::gil_scoped_release release;
        clip::cuda::per_example_sq_norms(reinterpret_cast<const void*>(per_example), dtype, batch,
                                         numel, reinterpret_cast<double*>(out),
                                         reinterpret_cast<void*>(stream));
      },
      py::arg("per_example"), py::arg("dtype_code"), py::arg("batch"), py::arg("numel"),
      py::arg("out"), py::arg("stream"),
      "CUDA: out[i] = sum_j g[i, j]^2 in float64 (device addresses, caller's stream).");
  m.def(
      "cuda_clip_per_example_dot_partials",
      [dtype_of](std::uintptr_t a, std::uintptr_t b, int dtype_code, std::int64_t batch,
                 std::int64_t numel, int slices, std::uintptr_t partial, std::uintptr_t stream) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        if (slices < 1 || slices > 65535) {
          throw py::value_error("slices must be in [1, 65535], got " + std::to_string(slices));
        }
        const clip::DType dtype = dtype_of(dtype_code);
        py::gil_scoped_release release;
        clip::cuda::per_example_dot_partials(reinterpret_cast<const void*>(a),
                                             reinterpret_cast<const void*>(b), dtype, batch,
                                             numel, slices, reinterpret_cast<double*>(partial),
                                             reinterpret_cast<void*>(stream));
      },
      py::arg("a"), py::arg("b"), py::arg("dtype_code"), py::arg("batch"), py::arg("numel"),
      py::arg("slices"), py::arg("partial"), py::arg("stream"),
      "CUDA: partial[i * slices + s] = sum over slice s of example i of a_j b_j, float64 "
      "(device addresses, caller's stream).");
  m.def(
      "cuda_clip_weighted_rows",
      [dtype_of](std::uintptr_t rows, int dtype_code, std::uintptr_t factors, std::int64_t batch,
                 std::int64_t numel, std::uintptr_t out, std::uintptr_t stream) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        const clip::DType dtype = dtype_of(dtype_code);
        if (dtype == clip::DType::kFloat64) {
          throw py::value_error("dtype_code must be 0 (float32) or 2 (bfloat16) for rows");
        }
        py::gil_scoped_release release;
        clip::cuda::weighted_rows_to_float32(
            reinterpret_cast<const void*>(rows), dtype, reinterpret_cast<const double*>(factors),
            batch, numel, reinterpret_cast<float*>(out), reinterpret_cast<void*>(stream));
      },
      py::arg("rows"), py::arg("dtype_code"), py::arg("factors"), py::arg("batch"),
      py::arg("numel"), py::arg("out"), py::arg("stream"),
      "CUDA: out[j] = float32(sum_i factors[i] rows[i, j]) in float64, float32 or bfloat16 "
      "rows (device addresses, caller's stream).");
  m.def(
      "cuda_clip_accumulate_noise",
      [dtype_of, stream_of](std::uintptr_t per_example, std::uintptr_t factors, std::int64_t batch,
                            std::uintptr_t base, std::uintptr_t out, int dtype_code,
                            std::int64_t numel, double noise_std,
                            const std::array<std::uint32_t, 8>& key,
                            std::uint32_t parameter, std::uint32_t release, std::uint32_t rank,
                            double scale, std::uintptr_t stream) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        const clip::DType dtype = dtype_of(dtype_code);
        const clip::NoiseStream s = stream_of(key, parameter, release, rank);
        py::gil_scoped_release release_gil;
        clip::cuda::clip_accumulate_noise(
            reinterpret_cast<const void*>(per_example), reinterpret_cast<const double*>(factors),
            batch, reinterpret_cast<const void*>(base), reinterpret_cast<void*>(out), dtype, numel,
            noise_std, s, scale, reinterpret_cast<void*>(stream));
      },
      py::arg("per_example"), py::arg("factors"), py::arg("batch"), py::arg("base"),
      py::arg("out"), py::arg("dtype_code"), py::arg("numel"), py::arg("noise_std"),
      py::arg("key"), py::arg("parameter"), py::arg("release"), py::arg("rank"),
      py::arg("scale"), py::arg("stream"),
      "CUDA: out = scale * (base + sum_i factors[i] g_i + noise_std z), z the in-kernel noise "
      "stream (same bits as the CPU kernel).");
  auto rows_buffers = [dtype_of](const std::vector<std::uintptr_t>& rows,
                                 const std::vector<int>& dtype_codes,
                                 const std::vector<std::int64_t>& numels,
                                 const std::vector<double>& scales,
                                 const std::vector<std::uintptr_t>& outs) {
    const std::size_t count = rows.size();
    if (dtype_codes.size() != count || numels.size() != count ||
        (!scales.empty() && scales.size() != count) || (!outs.empty() && outs.size() != count)) {
      throw py::value_error("rows, dtype_codes, numels, scales and outs must have the same "
                            "length");
    }
    std::vector<clip::cuda::RowsBuffer> buffers(count);
    for (std::size_t k = 0; k < count; ++k) {
      if (numels[k] < 0) throw py::value_error("numels must be >= 0");
      buffers[k] = clip::cuda::RowsBuffer{
          reinterpret_cast<const void*>(rows[k]), dtype_of(dtype_codes[k]), numels[k],
          scales.empty() ? 1.0 : scales[k],
          outs.empty() ? nullptr : reinterpret_cast<float*>(outs[k])};
    }
    return buffers;
  };
  m.def(
      "cuda_clip_sq_norm_partials_many",
      [rows_buffers](const std::vector<std::uintptr_t>& rows, const std::vector<int>& dtype_codes,
                     const std::vector<std::int64_t>& numels, std::int64_t batch, int slices,
                     std::uintptr_t partial, std::uintptr_t stream) {
        if (batch < 0) throw py::value_error("batch must be >= 0");
        const auto buffers = rows_buffers(rows, dtype_codes, numels, {}, {});
        try {
          py::gil_scoped_release release_gil;
          clip::cuda::per_example_sq_norms_many(buffers.data(),
                                                static_cast<std::int64_t>(buffers.size()), batch,
                                                slices, reinterpret_cast<double*>(partial),
                                                reinterpret_cast<void*>(stream));
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("rows"), py::arg("dtype_codes"), py::arg("numels"), py::arg("batch"),
      py::arg("slices"), py::arg("partial"), py::arg("stream"),
      "CUDA: partial[(k * batch + i) * slices + s] = the float64 sum of squares over slice s of "
      "example i's row of buffer k, for every buffer in one launch per 32 buffers.");
  m.def(
      "cuda_clip_weighted_rows_many",
      [rows_buffers](const std::vector<std::uintptr_t>& rows, const std::vector<int>& dtype_codes,
                     const std::vector<std::int64_t>& numels, const std::vector<double>& scales,
                     const std::vector<std::uintptr_t>& outs, std::int64_t batch,
                     std::uintptr_t factors, std::uintptr_t stream) {
        if (batch < 0) throw py::value_error("batch must be >= 0");
        if (scales.size() != rows.size() || outs.size() != rows.size()) {
          throw py::value_error("rows, scales and outs must have the same length");
        }
        const auto buffers = rows_buffers(rows, dtype_codes, numels, scales, outs);
        try {
          py::gil_scoped_release release_gil;
          clip::cuda::weighted_rows_many(buffers.data(),
                                         static_cast<std::int64_t>(buffers.size()), batch,
                                         reinterpret_cast<const double*>(factors),
                                         reinterpret_cast<void*>(stream));
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("rows"), py::arg("dtype_codes"), py::arg("numels"), py::arg("scales"),
      py::arg("outs"), py::arg("batch"), py::arg("factors"), py::arg("stream"),
      "CUDA: outs[k][j] = float32(sum_i (factors[i] scales[k]) rows[k][i, j]) in float64 for "
      "float32 or bfloat16 rows, every buffer in one launch per row dtype and 32 buffers.");
  m.def(
      "cuda_clip_release_noise",
      [dtype_of, stream_of](const std::vector<std::uintptr_t>& outs,
                            const std::vector<std::uintptr_t>& bases,
                            const std::vector<std::int64_t>& numels,
                            const std::vector<int>& dtype_codes,
                            const std::vector<std::uint32_t>& parameters, double noise_std,
                            const std::array<std::uint32_t, 8>& key, std::uint32_t release,
                            std::uint32_t rank, double scale, std::uintptr_t stream) {
        const std::size_t count = outs.size();
        if (bases.size() != count || numels.size() != count || dtype_codes.size() != count ||
            parameters.size() != count) {
          throw py::value_error(
              "outs, bases, numels, dtype_codes and parameters must have the same length");
        }
        std::vector<clip::ReleaseBuffer> buffers(count);
        for (std::size_t b = 0; b < count; ++b) {
          if (numels[b] < 0) throw py::value_error("numels must be >= 0");
          const clip::DType dtype = dtype_of(dtype_codes[b]);
          buffers[b] = clip::ReleaseBuffer{reinterpret_cast<const void*>(bases[b]),
                                           reinterpret_cast<void*>(outs[b]), numels[b], dtype,
                                           parameters[b], dtype};
        }
        const clip::NoiseStream s = stream_of(key, 0, release, rank);
        try {
          py::gil_scoped_release release_gil;
          clip::cuda::release_noise(buffers.data(), static_cast<std::int64_t>(count), noise_std,
                                    s, scale, reinterpret_cast<void*>(stream));
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("outs"), py::arg("bases"), py::arg("numels"), py::arg("dtype_codes"),
      py::arg("parameters"), py::arg("noise_std"), py::arg("key"), py::arg("release"),
      py::arg("rank"), py::arg("scale"), py::arg("stream"),
      "CUDA: for every buffer b, outs[b] = scale * (bases[b] + noise_std * z) with z the noise "
      "stream of parameter index parameters[b] (base address 0 means 'absent'), in one launch "
      "per dtype and 64 buffers; the bits of one cuda_clip_accumulate_noise call per buffer.");
  m.def(
      "cuda_gaussian_noise",
      [stream_of](const std::array<std::uint32_t, 8>& key, std::uint32_t parameter,
                  std::uint32_t release, std::uint32_t rank, std::int64_t numel,
                  const std::string& precision, std::uintptr_t out, std::uintptr_t stream) {
        if (numel < 0) throw py::value_error("numel must be >= 0");
        if (precision != "float32" && precision != "float64") {
          throw py::value_error("precision must be 'float32' or 'float64', got '" + precision +
                                "'");
        }
        const clip::NoiseStream s = stream_of(key, parameter, release, rank);
        py::gil_scoped_release release_gil;
        clip::cuda::gaussian_noise(s, numel, precision == "float64",
                                   reinterpret_cast<void*>(out), reinterpret_cast<void*>(stream));
      },
      py::arg("key"), py::arg("parameter"), py::arg("release"), py::arg("rank"), py::arg("numel"),
      py::arg("precision"), py::arg("out"), py::arg("stream"),
      "CUDA: the raw standard normals of a stream's float32 (into a float buffer) or float64 "
      "sequence.");
  m.def("cuda_device_count", []() { return clip::cuda::device_count(); },
        "Visible CUDA devices (0 without a device or driver).");
#else
  m.def("cuda_device_count", []() { return 0; }, "This module was built without CUDA: 0.");
#endif
}

}  // namespace dpsharp::bindings
