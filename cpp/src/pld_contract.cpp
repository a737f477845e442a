// Mean-preserving contractions onto a loss grid: the optimistic (lower-bound) side of the
// discretisation of a mechanism's PLD and of the coarsening of a composed one (see pld.hpp).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "dpsharp/numerics.hpp"
#include "dpsharp/pld.hpp"

namespace dpsharp::pld {

DiscretePld contract_onto_grid(std::int64_t lowest, std::int64_t n, double grid_step,
                               const std::vector<double>& cell_mass,
                               const std::vector<double>& cell_loss_of) {
  const GridRange range{lowest, lowest + n - 1};
  const double top_loss = static_cast<double>(range.highest) * grid_step;
  const auto boundaries = static_cast<std::int64_t>(cell_mass.size());
  DiscretePld out;
  out.offset = range.lowest;
  out.mass.assign(static_cast<std::size_t>(n), 0.0);
  // Sweep the atoms from the highest loss (smallest y) down. A group starts at the first unplaced
  // point, targets the smallest grid value y_k >= its y, and absorbs the following (larger-y)
  // points, the last one only in part, until its barycentre is exactly y_k: a mean-preserving
  // contraction. Within a group y is measured relative to the target, z = y / y_k = e^{l_k - l},
  // so that nothing overflows however wide the grid is (z = +inf for a point more than ~709 below
  // the target in loss: the group then needs a vanishing share of it and is closed).
  double group_mass = 0.0;
  double group_moment = 0.0;  // sum of mass * z over the group
  std::int64_t target = 0;    // index into out.mass
  double target_loss = top_loss;
  auto place_group = [&]() {
    out.mass[static_cast<std::size_t>(target)] += group_mass;
    group_mass = 0.0;
    group_moment = 0.0;
  };
  for (std::int64_t c = boundaries - 1; c >= 0; --c) {
    double mass = cell_mass[static_cast<std::size_t>(c)];
    if (!(mass > 0.0)) continue;
    const double cell_loss = cell_loss_of[static_cast<std::size_t>(c)];
    while (mass > 0.0) {
      if (group_mass == 0.0) {
        // Largest grid loss <= the cell's loss (the cell lies above the bottom grid point).
        std::int64_t k = static_cast<std::int64_t>(std::floor(cell_loss / grid_step)) - range.lowest;
        if (!(cell_loss < kInf) || k > n - 1) k = n - 1;
        if (k < 0) k = 0;
        target = k;
        target_loss = static_cast<double>(range.lowest + k) * grid_step;
        const double z = std::exp(target_loss - cell_loss);
        group_mass = mass;
        group_moment = mass * z;
        mass = 0.0;
        if (z >= 1.0) place_group();  // already on the grid point (up to round-off)
        continue;
      }
      const double z = std::exp(target_loss - cell_loss);
      if (z <= 1.0) {
        group_mass += mass;
        group_moment += mass * z;
        mass = 0.0;
        continue;
      }
      const double wanted = (group_mass - group_moment) / (z - 1.0);
      if (wanted >= mass) {
        group_mass += mass;
        group_moment += mass * z;
        mass = 0.0;
      } else {
        group_mass += wanted;
        mass -= wanted;
        place_group();
      }
    }
  }
  // A last group whose barycentre stays below its target moves up in y (down in loss) onto it.
  if (group_mass > 0.0) place_group();
  return out;
}

DiscretePld coarsen_optimistic(const double* mass, std::size_t size, std::int64_t offset,
                               double fine_step, std::int64_t factor) {
  if (factor < 1) throw std::invalid_argument("factor must be >= 1");
  if (!(fine_step > 0.0) || !std::isfinite(fine_step)) {
    throw std::invalid_argument("fine_step must be finite and > 0");
  }
  if (size == 0) throw std::invalid_argument("mass must not be empty");
  auto floor_div = [](std::int64_t a, std::int64_t b) {
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0);
  };
  const std::int64_t lowest = floor_div(offset, factor);
  const std::int64_t highest = floor_div(offset + static_cast<std::int64_t>(size) - 1, factor);
  std::vector<double> atom_mass(size);
  std::vector<double> atom_loss(size);
  for (std::size_t i = 0; i < size; ++i) {
    // Negative round-off is not mass: it counts as 0 (the caller accounts for what it clips).
    atom_mass[i] = std::max(mass[i], 0.0);
    atom_loss[i] = static_cast<double>(offset + static_cast<std::int64_t>(i)) * fine_step;
  }
  return contract_onto_grid(lowest, highest - lowest + 1, fine_step * static_cast<double>(factor),
                            atom_mass, atom_loss);
}

// The optimistic rounding of atoms (mass_of[c] at loss loss_of[c], in increasing loss up to
// round-off, +inf allowed) onto the grid {k h : lowest <= k < lowest + n}, by merges instead of
// rounding every atom down. Sweeping from the lowest loss up, a group starts at the first unplaced
// atom (loss l) with the target t = g + margin, g the grid point nearest l (`target_above` false,
// margin h / 1000) or the lowest grid point >= l (`target_above` true, margin 1e-6 h: see
// contract_cells in pld_discretize.cpp), the margin at least 1e-12. An atom at or above its
// target (or above the top grid point) is rounded down to the grid at once (delta(eps) is
// non-decreasing in every loss). Otherwise the group absorbs the following atoms, the last one
// only in part (taken with a relative 1e-9 excess, so that round-off cannot leave it short),
// until its barycentre in y = e^{-L} is at most e^{-t}; the part of an atom left over starts the
// next group. Each group is one merged outcome (P-mass sum m, Q-mass sum m e^{-l}; splitting an
// atom into parts of the same loss and merging outcomes are post-processings), a mean-preserving
// contraction of Y, so every delta(eps) = E[(1 - e^{eps} prod_i Y_i)_+] of every composition,
// convex in each Y_i, can only shrink (Jensen). Each group is then placed at the grid point below
// its merged loss (its target's g, once the target is reached; a last group that never gets
// there lands lower), and mass below the bottom grid point is dropped (loss -inf). With atoms
// from cells centred on the grid points, every atom is within h / 2 of its g and a group takes a
// small part of the next atom: the loss shift is O(h^2) per release instead of the O(h) of
// rounding each atom down to the grid.
DiscretePld pull_onto_grid(std::int64_t lowest, std::int64_t n, double grid_step,
                           const std::vector<double>& mass_of, const std::vector<double>& loss_of,
                           bool target_above) {
  DiscretePld out;
  out.offset = lowest;
  out.mass.assign(static_cast<std::size_t>(n), 0.0);
  const double top_loss = static_cast<double>(lowest + n - 1) * grid_step;
  // The margin keeps a group's merged loss, computed within about 1e-14 of its true value (sums
  // of a few terms, one logarithm), at or above g h, so that it is placed at g (not g - 1) and
  // never above its true loss, on every grid (a short composition's step can be 2^-32).
  const double margin = std::max((target_above ? 1e-6 : 1e-3) * grid_step, 1e-12);
  auto place = [&](double mass, double loss) {
    if (!(mass > 0.0)) return;
    double k = static_cast<double>(n - 1);
    if (loss < kInf) k = std::min(k, std::floor(loss / grid_step) - static_cast<double>(lowest));
    if (k < 0.0) return;  // below the bottom grid point: dropped
    out.mass[static_cast<std::size_t>(k)] += mass;
  };
  double group_mass = 0.0;
  double group_moment = 0.0;  // sum of mass * z over the group, z = e^{t - l}
  double target = 0.0;
  auto close_group = [&]() {
    if (group_mass > 0.0) place(group_mass, target - std::log(group_moment / group_mass));
    group_mass = 0.0;
    group_moment = 0.0;
  };
  for (std::size_t c = 0; c < mass_of.size(); ++c) {
    double mass = mass_of[c];
    if (!(mass > 0.0)) continue;
    const double loss = loss_of[c];
    while (mass > 0.0) {
      if (group_mass == 0.0) {
        const double aim = target_above ? std::ceil(loss / grid_step)
                                        : std::nearbyint(loss / grid_step);
        const double start = aim * grid_step + margin;
        if (!(loss < start) || start > top_loss) {
          place(mass, loss);
          break;
        }
        target = start;
        group_mass = mass;
        group_moment = mass * std::exp(target - loss);
        break;
      }
      const double z = std::exp(target - loss);
      const double wanted = z < 1.0 ? (group_moment - group_mass) / (1.0 - z) * (1.0 + 1e-9)
                                    : kInf;  // an atom not above the target is taken whole
      if (wanted >= mass) {
        group_mass += mass;
        group_moment += mass * z;
        mass = 0.0;
        if (group_moment <= group_mass) close_group();
      } else {
        group_mass += wanted;
        group_moment += wanted * z;
        mass -= wanted;
        close_group();
      }
    }
  }
  close_group();
  return out;
}

}  // namespace dpsharp::pld
