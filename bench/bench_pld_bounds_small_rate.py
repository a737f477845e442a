"""The certified bracket of the tight accountant on a small-rate long run (by default q = 5e-4,
sigma = 0.6, T = 2 10^5, delta = 1e-5): epsilon() (the upper bound), the optimistic lower bound
on the base grid and at each refinement of epsilon_bounds (halving h), and epsilon_bounds'
time against epsilon()'s, measured alternately in one process (median of ``--repeat``).

    python bench/bench_pld_bounds_small_rate.py [--repeat 3] [--steps 200000] [--rate 5e-4]
                                                [--sigma 0.6]
"""

from __future__ import annotations

import argparse
import statistics
import time

from dpsharp import Gaussian, PLDAccountant, PoissonSampled


def _fresh(steps: int, rate: float, sigma: float) -> PLDAccountant:
    accountant = PLDAccountant()
    accountant.compose(PoissonSampled(Gaussian(sigma), rate), steps)
    return accountant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=5e-4)
    parser.add_argument("--sigma", type=float, default=0.6)
    args = parser.parse_args()
    setting = (args.steps, args.rate, args.sigma)
    probe = _fresh(*setting)
    upper = probe.epsilon(1e-5)
    print(f"q = {args.rate:g}, sigma = {args.sigma:g}, T = {args.steps}, delta = 1e-5: "
          f"epsilon (upper) {upper:.6f}")
    for refinement in range(5):
        lower = probe._epsilon_side(1e-5, pessimistic=False, refinement=refinement)
        print(f"  lower bound at h / {2**refinement:<2d}: {lower:.6f}  "
              f"gap {(upper - lower) / upper:.4%}")
    single, bounds = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        _fresh(*setting).epsilon(1e-5)
        single.append(time.perf_counter() - start)
        start = time.perf_counter()
        lower, upper = _fresh(*setting).epsilon_bounds(1e-5)
        bounds.append(time.perf_counter() - start)
    one, two = statistics.median(single), statistics.median(bounds)
    print(f"epsilon_bounds [{lower:.6f}, {upper:.6f}] width {(upper - lower) / upper:.4%}: "
          f"{two:.2f} s against epsilon() {one:.3f} s ({two / one:.1f}x)")


if __name__ == "__main__":
    main()
