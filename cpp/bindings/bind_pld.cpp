#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "dpsharp/pld.hpp"

namespace py = pybind11;

namespace dpsharp::bindings {
namespace {

pld::MechanismParams make_params(int mechanism, double parameter, double sampling_rate) {
  if (mechanism < 0 || mechanism > 4) throw py::value_error("mechanism must be in 0..4");
  if (!(parameter > 0.0)) throw py::value_error("parameter must be > 0");
  if (!(sampling_rate > 0.0 && sampling_rate <= 1.0)) {
    throw py::value_error("sampling_rate must be in (0, 1]");
  }
  return {static_cast<pld::Mechanism>(mechanism), parameter, sampling_rate};
}

pld::BandTerms band_terms(const py::array_t<double, py::array::c_style | py::array::forcecast>& plain,
                          const py::array_t<double, py::array::c_style | py::array::forcecast>& discounted,
                          double total, std::int64_t size, double grid_step) {
  if (plain.ndim() != 1 || discounted.ndim() != 1 || plain.shape(0) != discounted.shape(0) ||
      plain.shape(0) % 2 != 0) {
    throw py::value_error("plain and discounted must be one-dimensional (re, im) pairs of equal length");
  }
  pld::BandTerms terms;
  terms.plain = plain.data();
  terms.discounted = discounted.data();
  terms.count = static_cast<std::size_t>(plain.shape(0) / 2);
  terms.total = total;
  terms.size = size;
  terms.grid_step = grid_step;
  return terms;
}

py::array_t<double> to_python_mass(const pld::DiscretePld& result) {
  py::array_t<double> mass(static_cast<py::ssize_t>(result.mass.size()));
  std::memcpy(mass.mutable_data(), result.mass.data(), result.mass.size() * sizeof(double));
  return mass;
}

py::tuple to_python(pld::DiscretePld&& result) {
  return py::make_tuple(result.offset, to_python_mass(result), result.infinity_mass);
}


using ComplexArray = py::array_t<std::complex<double>, py::array::c_style | py::array::forcecast>;

// A one-dimensional complex array of `entries` entries, or a ValueError naming `name`.
void require_entries(const ComplexArray& array, py::ssize_t entries, const char* name) {
  if (array.ndim() != 1 || array.shape(0) != entries) {
    throw py::value_error(std::string(name) + " must be one-dimensional with " +
                          std::to_string(entries) + " entries");
  }
}

}  // namespace

void bind_pld(py::module_& m) {
  m.def(
      "pld_discretize",
      [](int mechanism, double parameter, double sampling_rate, double grid_step, double top_tail,
         double bottom_tail, bool pessimistic) {
        const auto params = make_params(mechanism, parameter, sampling_rate);
        pld::DiscretePld result;
        {
          py::gil_scoped_release release;
          const auto range = pld::grid_range(params, grid_step, top_tail, bottom_tail);
          result = pessimistic ? pld::discretize_pessimistic(params, grid_step, range)
                               : pld::discretize_optimistic(params, grid_step, range);
        }
        return to_python(std::move(result));
      },
      py::arg("mechanism"), py::arg("parameter"), py::arg("sampling_rate"), py::arg("grid_step"),
      py::arg("top_tail"), py::arg("bottom_tail"), py::arg("pessimistic"),
      "Discretise a privacy-loss distribution on the grid k * grid_step. Returns (offset, mass, "
      "infinity_mass): mass[i] sits at loss (offset + i) * grid_step. mechanism: 0 Gaussian, 1 "
      "Laplace, 2 Poisson remove, 3 Poisson add, 4 symmetrised sampled Gaussian. pessimistic: "
      "connect-the-dots upper bound; otherwise the certified lower bound (see pld.hpp).");
  m.def(
      "pld_discretize_many",
      [](int mechanism, const std::vector<double>& parameters, double sampling_rate,
         double grid_step, double top_tail, double bottom_tail, bool pessimistic, int threads) {
        for (const double parameter : parameters) make_params(mechanism, parameter, sampling_rate);
        if (threads < 1) throw py::value_error("threads must be >= 1");
        std::vector<pld::DiscretePld> results;
        {
          py::gil_scoped_release release;
          results = pld::discretize_many(static_cast<pld::Mechanism>(mechanism), parameters,
                                         sampling_rate, grid_step, top_tail, bottom_tail,
                                         pessimistic, threads);
        }
        py::list out;
        for (auto& result : results) out.append(to_python(std::move(result)));
        return out;
      },
      py::arg("mechanism"), py::arg("parameters"), py::arg("sampling_rate"), py::arg("grid_step"),
      py::arg("top_tail"), py::arg("bottom_tail"), py::arg("pessimistic"), py::arg("threads") = 1,
      "pld_discretize(...) at each of `parameters` (one mechanism and sampling rate): a list of "
      "(offset, mass, infinity_mass), the same values, with the work that does not depend on the "
      "parameter shared; `threads` split the grid points (the values do not depend on it).");
  m.def(
      "pld_log_mgf",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> mass, std::int64_t offset,
         double grid_step, std::vector<double> exponents) {
        if (mass.ndim() != 1) throw py::value_error("mass must be one-dimensional");
        std::vector<double> out;
        {
          py::gil_scoped_release release;
          out = pld::log_mgf(mass.data(), static_cast<std::size_t>(mass.shape(0)), offset,
                             grid_step, exponents);
        }
        py::array_t<double> result(static_cast<py::ssize_t>(out.size()));
        std::memcpy(result.mutable_data(), out.data(), out.size() * sizeof(double));
        return result;
      },
      py::arg("mass"), py::arg("offset"), py::arg("grid_step"), py::arg("exponents"),
      "log sum_k mass[k] e^{t (offset + k) grid_step} for each exponent t (-inf when the mass "
      "is 0): the log moment generating function of a discretised PLD's finite part.");
  m.def(
      "pld_coarsen_optimistic",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> mass, std::int64_t offset,
         double fine_step, std::int64_t factor) {
        if (mass.ndim() != 1) throw py::value_error("mass must be one-dimensional");
        if (factor < 1) throw py::value_error("factor must be >= 1");
        pld::DiscretePld result;
        {
          py::gil_scoped_release release;
          result = pld::coarsen_optimistic(mass.data(), static_cast<std::size_t>(mass.shape(0)),
                                           offset, fine_step, factor);
        }
        return py::make_tuple(result.offset, to_python_mass(result));
      },
      py::arg("mass"), py::arg("offset"), py::arg("fine_step"), py::arg("factor"),
      "(offset, mass): the optimistic coarsening of masses at losses (offset + i) * fine_step onto "
      "the grid of step factor * fine_step, a mean-preserving contraction in y = e^{-loss} (see "
      "pld.hpp); negative entries count as 0.");
  m.def(
      "pld_merge_onto_grid",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> losses,
         py::array_t<double, py::array::c_style | py::array::forcecast> masses,
         std::int64_t lowest, std::int64_t size, double grid_step, bool upward) {
        if (losses.ndim() != 1 || masses.ndim() != 1 || losses.shape(0) != masses.shape(0)) {
          throw py::value_error("losses and masses must be one-dimensional and of one length");
        }
        if (size < 1) throw py::value_error("size must be >= 1");
        if (!(grid_step > 0.0) || !std::isfinite(grid_step)) {
          throw py::value_error("grid_step must be finite and > 0");
        }
        const auto count = static_cast<std::size_t>(losses.shape(0));
        std::vector<double> loss(losses.data(), losses.data() + count);
        std::vector<double> mass(masses.data(), masses.data() + count);
        for (std::size_t i = 0; i < count; ++i) {
          if (std::isnan(loss[i]) || loss[i] == -std::numeric_limits<double>::infinity() ||
              (i > 0 && loss[i] < loss[i - 1])) {
            throw py::value_error("losses must be increasing, not NaN and not -inf");
          }
        }
        if (count > 0 && loss[0] < static_cast<double>(lowest) * grid_step) {
          throw py::value_error("every loss must be at or above the bottom grid point");
        }
        pld::DiscretePld result;
        {
          py::gil_scoped_release release;
          result = upward ? pld::pull_onto_grid(lowest, size, grid_step, mass, loss, true)
                          : pld::contract_onto_grid(lowest, size, grid_step, mass, loss);
        }
        return py::make_tuple(result.offset, to_python_mass(result));
      },
      py::arg("losses"), py::arg("masses"), py::arg("lowest"), py::arg("size"),
      py::arg("grid_step"), py::arg("upward"),
      "(offset, mass): the optimistic merge of atoms (``masses`` at increasing ``losses``, +inf "
      "allowed) onto the grid of ``size`` points from loss lowest * grid_step, by mean-preserving "
      "merges in y = e^{-loss}: an upward sweep aiming above each atom (``upward``) or a "
      "downward one aiming below (see pld.hpp). Every loss must be at or above the bottom grid "
      "point.");
  m.def(
      "pld_delta_crossing",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> mass, double constant,
         double decay, double delta, bool clip_negative, double relative_slack) {
        if (mass.ndim() != 1) throw py::value_error("mass must be one-dimensional");
        if (!(relative_slack > -1.0 && relative_slack < 1.0)) {
          throw py::value_error("relative_slack must be in (-1, 1)");
        }
        pld::CurveCrossing crossing;
        {
          py::gil_scoped_release release;
          crossing = pld::delta_crossing(mass.data(), static_cast<std::size_t>(mass.shape(0)),
                                         constant, decay, delta, clip_negative, relative_slack);
        }
        return py::make_tuple(crossing.index, crossing.tail_mass, crossing.tail_weighted);
      },
      py::arg("mass"), py::arg("constant"), py::arg("decay"), py::arg("delta"),
      py::arg("clip_negative"), py::arg("relative_slack") = 0.0,
      "(j, A, W): the smallest grid index j whose hockey-stick value A_j + constant - W_j is <= "
      "delta (-1 if none), with A_{j-1} = sum_{k >= j} m_k and W_{j-1} = sum_{k >= j} m_k "
      "decay^(k - j + 1) when j > 0 (see pld.hpp).");
  m.def(
      "pld_band_suffix_sums",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> plain,
         py::array_t<double, py::array::c_style | py::array::forcecast> discounted, double total,
         std::int64_t size, double grid_step, std::int64_t index) {
        const pld::BandTerms terms = band_terms(plain, discounted, total, size, grid_step);
        const pld::BandSums sums = pld::band_suffix_sums(terms, index);
        return py::make_tuple(sums.mass_above, sums.weighted_above);
      },
      py::arg("plain"), py::arg("discounted"), py::arg("total"), py::arg("size"),
      py::arg("grid_step"), py::arg("index"),
      "(A_K, W_K) of a composition held as a band (see pld.hpp: BandTerms; plain and discounted "
      "are the terms P_f, Q_f as float64 pairs (re, im)).");
  m.def(
      "pld_band_crossing",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> plain,
         py::array_t<double, py::array::c_style | py::array::forcecast> discounted, double total,
         std::int64_t size, double grid_step, std::int64_t first, double constant, double delta) {
        const pld::BandTerms terms = band_terms(plain, discounted, total, size, grid_step);
        pld::CurveCrossing crossing;
        {
          py::gil_scoped_release release;
          crossing = pld::band_crossing(terms, first, constant, delta);
        }
        return py::make_tuple(crossing.index, crossing.tail_mass, crossing.tail_weighted);
      },
      py::arg("plain"), py::arg("discounted"), py::arg("total"), py::arg("size"),
      py::arg("grid_step"), py::arg("first"), py::arg("constant"), py::arg("delta"),
      "(j, A_{j-1}, W_{j-1}): the first index j >= first with A_j + constant - W_j <= delta for a "
      "composition held as a band (-1 if none; (first, nan, nan) if it holds at first).");
  m.def(
      "pld_log_hockey_stick",
      [](int mechanism, double parameter, double sampling_rate, double loss) {
        return pld::log_hockey_stick(make_params(mechanism, parameter, sampling_rate), loss);
      },
      py::arg("mechanism"), py::arg("parameter"), py::arg("sampling_rate"), py::arg("loss"),
      "log delta(eps = loss) of the continuous dominating pair (-inf when delta is 0).");
  m.def(
      "pld_certified_rfft",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> values, std::int64_t size,
         int threads) {
        if (values.ndim() != 1) throw py::value_error("values must be one-dimensional");
        if (threads < 1) throw py::value_error("threads must be >= 1");
        py::array_t<std::complex<double>> out(static_cast<py::ssize_t>(size / 2 + 1));
        const auto length = static_cast<std::size_t>(values.shape(0));
        {
          py::gil_scoped_release release;
          pld::certified_rfft(values.data(), length, size, out.mutable_data(), threads);
        }
        return out;
      },
      py::arg("values"), py::arg("size"), py::arg("threads") = 1,
      "rfft(values, size) by the transform of pld.hpp (certified_rfft) whose error has an a priori "
      "componentwise bound; `threads` (>= 1) share the work, the bits do not depend on it.");
  m.def(
      "pld_certified_rfft_pair",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> first,
         py::array_t<double, py::array::c_style | py::array::forcecast> second, std::int64_t size,
         int threads) {
        if (first.ndim() != 1 || second.ndim() != 1) {
          throw py::value_error("first and second must be one-dimensional");
        }
        if (threads < 1) throw py::value_error("threads must be >= 1");
        py::array_t<std::complex<double>> first_out(static_cast<py::ssize_t>(size / 2 + 1));
        py::array_t<std::complex<double>> second_out(static_cast<py::ssize_t>(size / 2 + 1));
        const auto first_length = static_cast<std::size_t>(first.shape(0));
        const auto second_length = static_cast<std::size_t>(second.shape(0));
        {
          py::gil_scoped_release release;
          pld::certified_rfft_pair(first.data(), first_length, second.data(), second_length, size,
                                   first_out.mutable_data(), second_out.mutable_data(), threads);
        }
        return py::make_tuple(first_out, second_out);
      },
      py::arg("first"), py::arg("second"), py::arg("size"), py::arg("threads") = 1,
      "(rfft(first, size), rfft(second, size)) by one complex transform of first + i second "
      "(certified_rfft_pair in pld.hpp); componentwise error bound on the sum of the two l1 "
      "norms; `threads` (>= 1) share the work, the bits do not depend on it.");
  m.def(
      "pld_multiply_factor",
      [](py::array_t<std::complex<double>, py::array::c_style> product,
         py::array_t<double, py::array::c_style> upper,
         py::array_t<double, py::array::c_style> lower,
         const ComplexArray& factor, std::int64_t live, std::int64_t count, double error,
         double cutoff) {
        if (count < 1) throw py::value_error("count must be >= 1");
        if (live < 0) throw py::value_error("live must be >= 0");
        for (const py::array* array : {static_cast<const py::array*>(&product),
                                       static_cast<const py::array*>(&upper),
                                       static_cast<const py::array*>(&lower),
                                       static_cast<const py::array*>(&factor)}) {
          if (array->ndim() != 1 || array->shape(0) < live) {
            throw py::value_error(
                "product, upper, lower and factor must be one-dimensional with at least live "
                "entries");
          }
        }
        std::complex<double>* product_data = product.mutable_data();
        double* upper_data = upper.mutable_data();
        double* lower_data = lower.mutable_data();
        const std::complex<double>* factor_data = factor.data();
        py::gil_scoped_release release;
        return pld::multiply_factor(product_data, upper_data, lower_data, factor_data, live, count,
                                    error, cutoff);
      },
      py::arg("product").noconvert(), py::arg("upper").noconvert(), py::arg("lower").noconvert(),
      py::arg("factor"), py::arg("live"), py::arg("count"), py::arg("error"), py::arg("cutoff"),
      "In place: upper += count log(|F| + error) and lower += count log |F| (moduli rounded up) "
      "on the live prefix [0, live); with a cutoff (not NaN) the prefix then shrinks to end at "
      "the last upper above it, and product *= F^count on it. Returns the new live prefix "
      "(multiply_factor in pld.hpp).");
  m.def(
      "pld_certified_irfft",
      [](const ComplexArray& spectrum, std::int64_t size, int threads) {
        require_entries(spectrum, size / 2 + 1, "spectrum");
        if (threads < 1) throw py::value_error("threads must be >= 1");
        py::array_t<double> out(static_cast<py::ssize_t>(size));
        {
          py::gil_scoped_release release;
          pld::certified_irfft(spectrum.data(), size, out.mutable_data(), threads);
        }
        return out;
      },
      py::arg("spectrum"), py::arg("size"), py::arg("threads") = 1,
      "irfft(spectrum, size) by the transform of pld.hpp (certified_irfft) whose error has an a "
      "priori normwise bound; `threads` (>= 1) share the work, the bits do not depend on it.");
  m.def(
      "pld_certified_band_dft",
      [](py::array_t<double, py::array::c_style | py::array::forcecast> values, std::int64_t size,
         std::int64_t reach, int threads) {
        if (values.ndim() != 1) throw py::value_error("values must be one-dimensional");
        if (reach < 0 || reach > size / 2 + 1) throw py::value_error("reach must be in [0, size/2 + 1]");
        if (threads < 1) throw py::value_error("threads must be >= 1");
        py::array_t<std::complex<double>> out(static_cast<py::ssize_t>(reach));
        const auto length = static_cast<std::size_t>(values.shape(0));
        {
          py::gil_scoped_release release;
          pld::certified_band_dft(values.data(), length, size, reach, out.mutable_data(), threads);
        }
        return out;
      },
      py::arg("values"), py::arg("size"), py::arg("reach"), py::arg("threads") = 1,
      "The first `reach` entries of rfft(values, size) by direct summation (pld.hpp: "
      "certified_band_dft), with an a priori componentwise error bound; `threads` (>= 1) share "
      "the frequencies, the bits do not depend on it.");
}

}  // namespace dpsharp::bindings
