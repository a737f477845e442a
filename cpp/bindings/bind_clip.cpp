// Python entry points of the clip-and-noise kernels. Buffers are passed as integer addresses
// (tensor.data_ptr() of contiguous tensors) so that the extension is never built against
// torch; the torch adapter (python/dpsharp/torch/kernels.py) checks shapes, dtypes and
// contiguity before calling, since nothing here can.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "dpsharp/clip.hpp"
#include "dpsharp/clip_factors.hpp"
#include "dpsharp/conv_grads.hpp"
#include "dpsharp/normals.hpp"
#include "dpsharp/noise_stream.hpp"
#include "dpsharp/patches.hpp"

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

using KeyWords = std::array<std::uint32_t, 8>;

clip::NoiseStream to_stream(const KeyWords& key, std::uint32_t parameter, std::uint32_t release,
                            std::uint32_t rank) {
  clip::NoiseStream stream{};
  for (int i = 0; i < 8; ++i) stream.key[i] = key[static_cast<std::size_t>(i)];
  stream.parameter = parameter;
  stream.release = release;
  stream.rank = rank;
  return stream;
}

void check_stream_length(std::int64_t end, const char* what) {
  if (end > clip::kMaxNoiseElements) {
    throw py::value_error(std::string(what) + " must be <= " +
                          std::to_string(clip::kMaxNoiseElements) +
                          " (the noise stream's 32-bit block counter), got " +
                          std::to_string(end));
  }
}

bool is_float64(const std::string& precision) {
  if (precision != "float32" && precision != "float64") {
    throw py::value_error("precision must be 'float32' or 'float64', got '" + precision + "'");
  }
  return precision == "float64";
}

constexpr std::pair<const char*, clip::NormalsIsa> kNormalsImplementations[] = {
    {"avx512", clip::NormalsIsa::kAvx512},
    {"avx2", clip::NormalsIsa::kAvx2},
    {"portable", clip::NormalsIsa::kPortable},
};

clip::NormalsIsa to_normals_isa(const std::string& name) {
  for (const auto& [known, isa] : kNormalsImplementations) {
    if (name == known) {
      if (!clip::normals_isa_supported(isa)) {
        throw py::value_error("implementation '" + name + "' is not supported by this CPU");
      }
      return isa;
    }
  }
  throw py::value_error("implementation must be 'avx512', 'avx2' or 'portable', got '" + name +
                        "'");
}

// The geometry of a 2-D convolution, checked (the C++ side trusts it).
patches::ConvGeometry to_geometry(std::int64_t batch, std::int64_t channels, std::int64_t in_h,
                                  std::int64_t in_w, std::int64_t kernel_h,
                                  std::int64_t kernel_w, std::int64_t stride_h,
                                  std::int64_t stride_w, std::int64_t pad_h, std::int64_t pad_w,
                                  std::int64_t dilation_h, std::int64_t dilation_w) {
  if (batch < 0 || channels < 0 || in_h < 0 || in_w < 0 || pad_h < 0 || pad_w < 0 ||
      kernel_h < 1 || kernel_w < 1 || stride_h < 1 || stride_w < 1 || dilation_h < 1 ||
      dilation_w < 1) {
    throw py::value_error("sizes and paddings must be >= 0; kernel, stride and dilation >= 1");
  }
  const std::int64_t span_h = (kernel_h - 1) * dilation_h + 1;
  const std::int64_t span_w = (kernel_w - 1) * dilation_w + 1;
  if (in_h + 2 * pad_h < span_h || in_w + 2 * pad_w < span_w) {
    throw py::value_error("the (padded) input is smaller than the dilated kernel");
  }
  return patches::ConvGeometry{batch, channels, in_h, in_w, kernel_h, kernel_w, stride_h,
                               stride_w, pad_h, pad_w, dilation_h, dilation_w,
                               (in_h + 2 * pad_h - span_h) / stride_h + 1,
                               (in_w + 2 * pad_w - span_w) / stride_w + 1};
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
      "clip_flat_factors",
      [](const std::vector<std::tuple<std::uintptr_t, std::uintptr_t, double, double>>& terms,
         std::int64_t batch, double bound, std::uintptr_t norms, std::uintptr_t factors) {
        if (batch < 0) throw py::value_error("batch must be >= 0");
        if (!(bound > 0.0) || !std::isfinite(bound)) {
          throw py::value_error("bound must be positive and finite");
        }
        std::vector<clip::SqNormTerm> converted;
        converted.reserve(terms.size());
        for (const auto& [x, y, y_offset, coef] : terms) {
          if (x == 0 && batch > 0) throw py::value_error("every term needs an x buffer");
          converted.push_back({as_ptr<const double>(x), as_ptr<const double>(y), y_offset, coef});
        }
        const auto count = static_cast<std::int64_t>(converted.size());
        return clip::flat_clip_factors(converted.data(), count, batch, bound,
                                       as_ptr<double>(norms), as_ptr<double>(factors));
      },
      py::arg("terms"), py::arg("batch"), py::arg("bound"), py::arg("norms"), py::arg("factors"),
      "Flat clipping's norms and factors from squared-norm terms (x, y or 0, y_offset, coef) of "
      "float64 (batch,) buffers: norms = sqrt(sum coef x (y + y_offset)), factors = "
      "min(1, bound / norms). False if a squared norm is not finite.");
  m.def(
      "clip_per_example_dots",
      [](std::uintptr_t a, std::uintptr_t b, int dtype_code, std::int64_t batch,
         std::int64_t numel, std::uintptr_t out, int threads) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        const clip::DType dtype = to_dtype(dtype_code);
        py::gil_scoped_release release;
        clip::per_example_dots(as_ptr<const void>(a), as_ptr<const void>(b), dtype, batch, numel,
                               as_ptr<double>(out), threads);
      },
      py::arg("a"), py::arg("b"), py::arg("dtype_code"), py::arg("batch"), py::arg("numel"),
      py::arg("out"), py::arg("threads"),
      "out[i] = sum_j a[i, j] b[i, j] in float64 over two contiguous (batch, numel) buffers.");
  m.def(
      "conv_patches",
      [](std::uintptr_t in, int element_size, std::int64_t batch, std::int64_t channels,
         std::int64_t in_h, std::int64_t in_w, std::int64_t kernel_h, std::int64_t kernel_w,
         std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_h, std::int64_t pad_w,
         std::int64_t dilation_h, std::int64_t dilation_w, std::uintptr_t out, int threads) {
        if (element_size != 2 && element_size != 4 && element_size != 8) {
          throw py::value_error("element_size must be 2, 4 or 8, got " +
                                std::to_string(element_size));
        }
        const patches::ConvGeometry geometry =
            to_geometry(batch, channels, in_h, in_w, kernel_h, kernel_w, stride_h, stride_w,
                        pad_h, pad_w, dilation_h, dilation_w);
        py::gil_scoped_release release;
        patches::conv_patches(as_ptr<const void>(in), static_cast<std::size_t>(element_size),
                              geometry, as_ptr<void>(out), threads);
      },
      py::arg("input"), py::arg("element_size"), py::arg("batch"), py::arg("channels"),
      py::arg("in_h"), py::arg("in_w"), py::arg("kernel_h"), py::arg("kernel_w"),
      py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_h"), py::arg("pad_w"),
      py::arg("dilation_h"), py::arg("dilation_w"), py::arg("out"), py::arg("threads"),
      "Convolution patches (B, out_h * out_w, C * kernel_h * kernel_w) of a contiguous "
      "(B, C, in_h, in_w) input into a contiguous buffer of that size.");
  m.def(
      "conv_per_example_weight_grads",
      [](std::uintptr_t in, std::uintptr_t out_grads, int dtype_code, std::int64_t batch,
         std::int64_t channels, std::int64_t in_h, std::int64_t in_w, std::int64_t kernel_h,
         std::int64_t kernel_w, std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_h,
         std::int64_t pad_w, std::int64_t dilation_h, std::int64_t dilation_w,
         std::int64_t out_channels, std::uintptr_t out, int threads) {
        if (dtype_code != 0 && dtype_code != 1) {
          throw py::value_error("dtype_code must be 0 (float32) or 1 (float64), got " +
                                std::to_string(dtype_code));
        }
        if (out_channels < 0) throw py::value_error("out_channels must be >= 0");
        const patches::ConvGeometry geometry =
            to_geometry(batch, channels, in_h, in_w, kernel_h, kernel_w, stride_h, stride_w,
                        pad_h, pad_w, dilation_h, dilation_w);
        py::gil_scoped_release release;
        if (dtype_code == 0) {
          conv_grads::per_example_weight_grads(as_ptr<const float>(in),
                                               as_ptr<const float>(out_grads), geometry,
                                               out_channels, as_ptr<float>(out), threads);
        } else {
          conv_grads::per_example_weight_grads(as_ptr<const double>(in),
                                               as_ptr<const double>(out_grads), geometry,
                                               out_channels, as_ptr<double>(out), threads);
        }
      },
      py::arg("input"), py::arg("out_grads"), py::arg("dtype_code"), py::arg("batch"),
      py::arg("channels"), py::arg("in_h"), py::arg("in_w"), py::arg("kernel_h"),
      py::arg("kernel_w"), py::arg("stride_h"), py::arg("stride_w"), py::arg("pad_h"),
      py::arg("pad_w"), py::arg("dilation_h"), py::arg("dilation_w"), py::arg("out_channels"),
      py::arg("out"), py::arg("threads"),
      "Per-example convolution weight gradients (B, out_channels, C * kernel_h * kernel_w) of a "
      "contiguous (B, C, in_h, in_w) input and (B, out_channels, out_h, out_w) output gradient.");
  m.def(
      "clip_accumulate_noise",
      [](std::uintptr_t per_example, std::uintptr_t factors, std::int64_t batch,
         std::uintptr_t base, std::uintptr_t out, int dtype_code, std::int64_t numel,
         double noise_std, const KeyWords& key, std::uint32_t parameter, std::uint32_t release,
         std::uint32_t rank, double scale, int threads, int rows_dtype_code,
         int base_dtype_code) {
        if (batch < 0 || numel < 0) throw py::value_error("batch and numel must be >= 0");
        check_stream_length(numel, "numel");
        if (per_example != 0 && factors == 0) {
          throw py::value_error("factors must be given with per_example");
        }
        const clip::DType dtype = to_dtype(dtype_code);
        const clip::DType rows_dtype = rows_dtype_code < 0 ? dtype : to_dtype(rows_dtype_code);
        const clip::DType base_dtype = base_dtype_code < 0 ? dtype : to_dtype(base_dtype_code);
        const clip::NoiseStream stream = to_stream(key, parameter, release, rank);
        try {
          py::gil_scoped_release gil;
          clip::clip_accumulate_noise(as_ptr<const void>(per_example),
                                      as_ptr<const double>(factors), batch,
                                      as_ptr<const void>(base), as_ptr<void>(out), dtype, numel,
                                      noise_std, stream, scale, threads, rows_dtype,
                                      base_dtype);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("per_example"), py::arg("factors"), py::arg("batch"), py::arg("base"),
      py::arg("out"), py::arg("dtype_code"), py::arg("numel"), py::arg("noise_std"),
      py::arg("key"), py::arg("parameter"), py::arg("release"), py::arg("rank"),
      py::arg("scale"), py::arg("threads"), py::arg("rows_dtype_code") = -1,
      py::arg("base_dtype_code") = -1,
      "out = scale * (base + sum_i factors[i] g[i] + noise_std * z) with z the noise stream "
      "(ChaCha8 + Box-Muller) of key (8 words), parameter, release, rank; addresses of 0 mean "
      "'absent' for per_example and base. rows_dtype_code / base_dtype_code (-1: out's) give "
      "per_example's and base's element types: float32 rows into a float64 base and out, or a "
      "float64 base into a float32 out (one rounding after the noise).");
  m.def(
      "clip_release_noise",
      [](const std::vector<std::uintptr_t>& outs, const std::vector<std::uintptr_t>& bases,
         const std::vector<std::int64_t>& numels, const std::vector<int>& dtype_codes,
         const std::vector<std::uint32_t>& parameters, double noise_std, const KeyWords& key,
         std::uint32_t release, std::uint32_t rank, double scale, int threads,
         const std::vector<int>& base_dtype_codes) {
        const std::size_t count = outs.size();
        if (bases.size() != count || numels.size() != count || dtype_codes.size() != count ||
            parameters.size() != count ||
            (!base_dtype_codes.empty() && base_dtype_codes.size() != count)) {
          throw py::value_error("outs, bases, numels, dtype_codes, parameters and "
                                "base_dtype_codes (when given) must have the same length");
        }
        std::vector<clip::ReleaseBuffer> buffers(count);
        for (std::size_t b = 0; b < count; ++b) {
          if (numels[b] < 0) throw py::value_error("numels must be >= 0");
          check_stream_length(numels[b], "numel");
          const clip::DType dtype = to_dtype(dtype_codes[b]);
          buffers[b] = clip::ReleaseBuffer{
              as_ptr<const void>(bases[b]), as_ptr<void>(outs[b]), numels[b], dtype,
              parameters[b], base_dtype_codes.empty() ? dtype : to_dtype(base_dtype_codes[b])};
        }
        const clip::NoiseStream stream = to_stream(key, 0, release, rank);
        try {
          py::gil_scoped_release gil;
          clip::release_noise(buffers.data(), static_cast<std::int64_t>(count), noise_std,
                              stream, scale, threads);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("outs"), py::arg("bases"), py::arg("numels"), py::arg("dtype_codes"),
      py::arg("parameters"), py::arg("noise_std"), py::arg("key"), py::arg("release"),
      py::arg("rank"), py::arg("scale"), py::arg("threads"),
      py::arg("base_dtype_codes") = std::vector<int>{},
      "For every buffer b: outs[b] = scale * (bases[b] + noise_std * z) with z the noise stream "
      "of parameter index parameters[b] (one call for a whole model's release; base address 0 "
      "means 'absent').");
  m.def(
      "gaussian_stream",
      [](const KeyWords& key, std::uint32_t parameter, std::uint32_t release, std::uint32_t rank,
         std::int64_t first, std::int64_t count, const std::string& precision,
         int threads) -> py::array {
        if (first < 0 || count < 0) throw py::value_error("first and count must be >= 0");
        check_stream_length(first + count, "first + count");
        const bool wide = is_float64(precision);
        const clip::NoiseStream stream = to_stream(key, parameter, release, rank);
        if (wide) {
          py::array_t<double> out(count);
          double* data = out.mutable_data();
          py::gil_scoped_release gil;
          clip::gaussian_noise(stream, first, count, nullptr, data, threads);
          return std::move(out);
        }
        py::array_t<float> out(count);
        float* data = out.mutable_data();
        py::gil_scoped_release gil;
        clip::gaussian_noise(stream, first, count, data, nullptr, threads);
        return std::move(out);
      },
      py::arg("key"), py::arg("parameter"), py::arg("release"), py::arg("rank"), py::arg("first"),
      py::arg("count"), py::arg("precision") = "float32", py::arg("threads") = 1,
      "Standard normals first .. first + count - 1 of one noise stream: its float32 sequence "
      "(for float32 / bfloat16 parameters) or its float64 one.");
  m.def(
      "normals_implementations",
      []() {
        py::list names;
        for (const auto& [name, isa] : kNormalsImplementations) {
          if (clip::normals_isa_supported(isa)) names.append(name);
        }
        return names;
      },
      "The implementations of the bulk normal generator this CPU can run ('avx512', 'avx2', "
      "'portable'); the kernels use the first.");
  m.def(
      "gaussian_stream_with",
      [](const std::string& implementation, const KeyWords& key, std::uint32_t parameter,
         std::uint32_t release, std::uint32_t rank, std::int64_t first, std::int64_t count,
         const std::string& precision) -> py::array {
        if (first < 0 || count < 0) throw py::value_error("first and count must be >= 0");
        check_stream_length(first + count, "first + count");
        const clip::NormalsIsa isa = to_normals_isa(implementation);
        const bool wide = is_float64(precision);
        const clip::NoiseStream stream = to_stream(key, parameter, release, rank);
        if (wide) {
          py::array_t<double> out(count);
          double* data = out.mutable_data();
          py::gil_scoped_release gil;
          clip::normals_f64(isa, stream, first, count, data);
          return std::move(out);
        }
        py::array_t<float> out(count);
        float* data = out.mutable_data();
        py::gil_scoped_release gil;
        clip::normals_f32(isa, stream, first, count, data);
        return std::move(out);
      },
      py::arg("implementation"), py::arg("key"), py::arg("parameter"), py::arg("release"),
      py::arg("rank"), py::arg("first"), py::arg("count"), py::arg("precision") = "float32",
      "Standard normals first .. first + count - 1 of one noise stream from one implementation "
      "of the generator (for tests: they must all give the same bits).");
  m.def(
      "chacha_block",
      [](const KeyWords& key, std::uint32_t block, std::uint32_t parameter, std::uint32_t release,
         std::uint32_t rank, int rounds) {
        const noise::StreamKey stream = to_stream(key, parameter, release, rank);
        std::uint32_t words[16];
        if (rounds == 8) {
          noise::chacha_block<8>(stream, block, words);
        } else if (rounds == 20) {
          noise::chacha_block<20>(stream, block, words);
        } else {
          throw py::value_error("rounds must be 8 or 20, got " + std::to_string(rounds));
        }
        py::tuple out(16);
        for (int i = 0; i < 16; ++i) out[static_cast<std::size_t>(i)] = words[i];
        return out;
      },
      py::arg("key"), py::arg("block"), py::arg("parameter"), py::arg("release"), py::arg("rank"),
      py::arg("rounds") = 8,
      "One ChaCha block (16 words) of state [constants | key | block, parameter, release, rank] "
      "(RFC 8439's block function for rounds = 20; for known-answer tests).");
}

}  // namespace dpsharp::bindings
