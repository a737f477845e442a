"""The certified bracket of the tight accountant on the small-rate long run (q = 5e-4,
sigma = 0.6, T = 2 10^5, delta = 1e-5): epsilon() (the upper bound), the optimistic lower bound
on the base grid and at each refinement of epsilon_bounds (halving h), and epsilon_bounds'
time against epsilon()'s, measured alternately in one process (median of ``--repeat``).

    python bench/bench_pld_bounds_small_rate.py [--repeat 3] [--steps 200000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from dpsharp import Gaussian, PLDAccountant, PoissonSampled


def _fresh(steps: int) -> PLDAccountant:
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(0.6), 5e-4), steps)
    return accountant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    probe = _fresh(args.steps)
    upper = probe.epsilon(1e-5)
    print(f"q = 5e-4, sigma = 0.6, T = {args.steps}, delta = 1e-5: epsilon (upper) {upper:.6f}")
    for refinement in range(5):
        lower = probe._epsilon_side(1e-5, pessimistic=False, refinement=refinement)
        print(f"  lower bound at h / {2**refinement:<2d}: {lower:.6f}  "
              f"gap {(upper - lower) / upper:.4%}")
    single, bounds = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        _fresh(args.steps).epsilon(1e-5)
        single.append(time.perf_counter() - start)
        start = time.perf_counter()
        lower, upper = _fresh(args.steps).epsilon_bounds(1e-5)
        bounds.append(time.perf_counter() - start)
    one, two = statistics.median(single), statistics.median(bounds)
    print(f"epsilon_bounds [{lower:.6f}, {upper:.6f}] width {(upper - lower) / upper:.4%}: "
          f"{two:.2f} s against epsilon() {one:.3f} s ({two / one:.1f}x)")


if __name__ == "__main__":
    main()
