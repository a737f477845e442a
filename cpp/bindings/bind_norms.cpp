// Python entry points of the per-example norm kernels of linear layers on sequences and of
// embeddings. Buffers are integer addresses (tensor.data_ptr() of contiguous tensors), as in
// bind_clip.cpp; the torch adapters (python/dpsharp/torch/kernels.py) check shapes, dtypes and
// contiguity before calling. The embedding kernels check their indices themselves (an index
// outside the weight's rows raises ValueError before anything is read or written).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "dpsharp/affine_grads.hpp"
#include "dpsharp/embedding_norms.hpp"
#include "dpsharp/linear_norms.hpp"

namespace py = pybind11;

namespace dpsharp::bindings {
namespace {

constexpr std::pair<const char*, linear_norms::Isa> kLinearNormsImplementations[] = {
    {"avx512", linear_norms::Isa::kAvx512},
    {"avx2", linear_norms::Isa::kAvx2},
    {"portable", linear_norms::Isa::kPortable},
};

linear_norms::Isa to_linear_norms_isa(const std::string& name) {
  if (name == "auto") return linear_norms::best_isa();
  for (const auto& [known, isa] : kLinearNormsImplementations) {
    if (name == known) {
      if (!linear_norms::isa_supported(isa)) {
        throw py::value_error("implementation '" + name + "' is not supported by this CPU");
      }
      return isa;
    }
  }
  throw py::value_error("implementation must be 'auto', 'avx512', 'avx2' or 'portable', got '" +
                        name + "'");
}

void require_float_code(int dtype_code) {
  if (dtype_code != 0 && dtype_code != 1) {
    throw py::value_error("dtype_code must be 0 (float32) or 1 (float64), got " +
                          std::to_string(dtype_code));
  }
}

template <typename P>
P* as_ptr(std::uintptr_t address) {
  return reinterpret_cast<P*>(address);  // NOLINT: addresses come from torch data_ptr()
}

}  // namespace

void bind_norms(py::module_& m) {
  m.def(
      "layer_norm_affine_rows",
      [](std::uintptr_t x, std::uintptr_t mean, std::uintptr_t rstd, std::uintptr_t g,
         int dtype_code, std::int64_t batch, std::int64_t rows, std::int64_t features,
         std::uintptr_t weight_rows, std::uintptr_t bias_rows, int threads) {
        require_float_code(dtype_code);
        if (batch < 0 || rows < 0 || features < 0) {
          throw py::value_error("batch, rows and features must be >= 0");
        }
        py::gil_scoped_release release;
        if (dtype_code == 0) {
          affine_grads::layer_norm_rows(as_ptr<const float>(x), as_ptr<const float>(mean),
                                        as_ptr<const float>(rstd), as_ptr<const float>(g), batch,
                                        rows, features, as_ptr<float>(weight_rows),
                                        as_ptr<float>(bias_rows), threads);
        } else {
          affine_grads::layer_norm_rows(as_ptr<const double>(x), as_ptr<const double>(mean),
                                        as_ptr<const double>(rstd), as_ptr<const double>(g),
                                        batch, rows, features, as_ptr<double>(weight_rows),
                                        as_ptr<double>(bias_rows), threads);
        }
      },
      py::arg("x"), py::arg("mean"), py::arg("rstd"), py::arg("g"), py::arg("dtype_code"),
      py::arg("batch"), py::arg("rows"), py::arg("features"), py::arg("weight_rows"),
      py::arg("bias_rows"), py::arg("threads"),
      "Per-example layer-norm affine gradients: weight_rows[i, n] = sum_r g[i, r, n] "
      "(x[i, r, n] - mean[i, r]) rstd[i, r] and bias_rows[i, n] = sum_r g[i, r, n] (float64 "
      "sums; a 0 address skips that output).");
  m.def(
      "linear_norms_implementations",
      []() {
        py::list names;
        for (const auto& [name, isa] : kLinearNormsImplementations) {
          if (linear_norms::isa_supported(isa)) names.append(name);
        }
        return names;
      },
      "The implementations of the sequence-linear norm kernel this CPU can run ('avx512', "
      "'avx2', 'portable'); 'auto' picks the first.");
  m.def(
      "linear_sequence_sq_norms",
      [](std::uintptr_t a, std::uintptr_t g, int dtype_code, std::int64_t batch,
         std::int64_t positions, std::int64_t in_features, std::int64_t out_features,
         std::uintptr_t weight_sq, std::uintptr_t bias_sq, int threads,
         const std::string& implementation) {
        if (batch < 0 || positions < 0 || in_features < 0 || out_features < 0) {
          throw py::value_error("batch, positions, in_features and out_features must be >= 0");
        }
        require_float_code(dtype_code);
        const linear_norms::Isa isa = to_linear_norms_isa(implementation);
        py::gil_scoped_release release;
        if (dtype_code == 0) {
          linear_norms::sequence_sq_norms(isa, as_ptr<const float>(a), as_ptr<const float>(g),
                                          batch, positions, in_features, out_features,
                                          as_ptr<double>(weight_sq), as_ptr<double>(bias_sq),
                                          threads);
        } else {
          linear_norms::sequence_sq_norms(isa, as_ptr<const double>(a), as_ptr<const double>(g),
                                          batch, positions, in_features, out_features,
                                          as_ptr<double>(weight_sq), as_ptr<double>(bias_sq),
                                          threads);
        }
      },
      py::arg("a"), py::arg("g"), py::arg("dtype_code"), py::arg("batch"), py::arg("positions"),
      py::arg("in_features"), py::arg("out_features"), py::arg("weight_sq"), py::arg("bias_sq"),
      py::arg("threads"), py::arg("implementation") = "auto",
      "weight_sq[i] = sum_{t,s} (a_it . a_is)(g_it . g_is) and, unless bias_sq is 0, "
      "bias_sq[i] = sum_{t,s} g_it . g_is (float64) for contiguous a (batch, positions, "
      "in_features) and g (batch, positions, out_features).");
  m.def(
      "embedding_sq_norms",
      [](std::uintptr_t indices, std::uintptr_t out_grads, int dtype_code, std::int64_t batch,
         std::int64_t positions, std::int64_t features, std::int64_t num_rows,
         std::int64_t padding_idx, std::uintptr_t out, int threads) {
        if (batch < 0 || positions < 0 || features < 0 || num_rows < 0) {
          throw py::value_error("batch, positions, features and num_rows must be >= 0");
        }
        require_float_code(dtype_code);
        py::gil_scoped_release release;
        if (dtype_code == 0) {
          embedding_norms::per_example_sq_norms(
              as_ptr<const std::int64_t>(indices), as_ptr<const float>(out_grads), batch,
              positions, features, num_rows, padding_idx, as_ptr<double>(out), threads);
        } else {
          embedding_norms::per_example_sq_norms(
              as_ptr<const std::int64_t>(indices), as_ptr<const double>(out_grads), batch,
              positions, features, num_rows, padding_idx, as_ptr<double>(out), threads);
        }
      },
      py::arg("indices"), py::arg("out_grads"), py::arg("dtype_code"), py::arg("batch"),
      py::arg("positions"), py::arg("features"), py::arg("num_rows"), py::arg("padding_idx"),
      py::arg("out"), py::arg("threads"),
      "out[i] = ||sum_t onehot(indices[i, t]) out_grads[i, t]^T||^2 (float64), positions "
      "looking up padding_idx (< 0: none) left out; ValueError for an index outside "
      "[0, num_rows).");
  m.def(
      "embedding_clipped_sum",
      [](std::uintptr_t indices, std::uintptr_t out_grads, std::uintptr_t factors,
         int dtype_code, std::int64_t batch, std::int64_t positions, std::int64_t features,
         std::int64_t num_rows, std::int64_t padding_idx, std::uintptr_t out, bool accumulate,
         int threads) {
        if (batch < 0 || positions < 0 || features < 0 || num_rows < 0) {
          throw py::value_error("batch, positions, features and num_rows must be >= 0");
        }
        require_float_code(dtype_code);
        py::gil_scoped_release release;
        if (dtype_code == 0) {
          embedding_norms::clipped_sum(as_ptr<const std::int64_t>(indices),
                                       as_ptr<const float>(out_grads),
                                       as_ptr<const double>(factors), batch, positions,
                                       features, num_rows, padding_idx, as_ptr<float>(out),
                                       accumulate, threads);
        } else {
          embedding_norms::clipped_sum(as_ptr<const std::int64_t>(indices),
                                       as_ptr<const double>(out_grads),
                                       as_ptr<const double>(factors), batch, positions,
                                       features, num_rows, padding_idx, as_ptr<double>(out),
                                       accumulate, threads);
        }
      },
      py::arg("indices"), py::arg("out_grads"), py::arg("factors"), py::arg("dtype_code"),
      py::arg("batch"), py::arg("positions"), py::arg("features"), py::arg("num_rows"),
      py::arg("padding_idx"), py::arg("out"), py::arg("accumulate"), py::arg("threads"),
      "out (num_rows, features): row v = sum of factors[i] * out_grads[i, t] over the "
      "positions with indices[i, t] = v (float64, in order), written into every row, or added "
      "to the rows looked up with accumulate; ValueError for an index outside [0, num_rows).");
}

}  // namespace dpsharp::bindings
