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

}  // namespace dpsharp::pld
