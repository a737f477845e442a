"""Two-stage against one-stage PLD composition (PLDAccountant's long compositions).

For each setting, one epsilon(1e-5) query from a fresh accountant three ways, in the same
process: forced to one stage, forced to two stages (``_staging``'s blocks and factor), and as
shipped (two stages only where ``staging_pays`` predicts a gain). Prints the epsilons, the
relative change of the staged upper bound, median times and the speed-up ratios (the figures to
quote; the machine is shared), with the circle sizes behind the prediction.

    python bench/bench_pld_staging.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import dpsharp.accountants._pld_numerics as numerics
import dpsharp.accountants.pld as pld_module
from dpsharp import Gaussian, PLDAccountant, PoissonSampled

DELTA = 1e-5
SETTINGS = [
    ("Abadi q=.01 s=4", 0.01, 4.0, 40_000),
    ("q=.001 s=.8", 0.001, 0.8, 100_000),
    ("MNIST q=256/6e4 s=.638", 256 / 60000, 0.638, 40_000),
    ("hard q=.02 s=.5", 0.02, 0.5, 40_000),
    ("hard q=.1 s=2", 0.1, 2.0, 40_000),
    ("MNIST q=256/6e4 s=1.1", 256 / 60000, 1.1, 1_000_000),
    ("MNIST q=256/6e4 s=1.1", 256 / 60000, 1.1, 10_000_000),
]


def timed_query(q: float, sigma: float, steps: int, repeat: int) -> tuple[float, float]:
    def query() -> float:
        return PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps).epsilon(DELTA)

    epsilon = query()  # warm-up (imports, thread pool)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        query()
        times.append(time.perf_counter() - start)
    return epsilon, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    shipped_staging = pld_module._staging
    shipped_pays: Callable[..., bool] = pld_module.staging_pays
    print(f"# command: python bench/bench_pld_staging.py --repeat {args.repeat}")
    print(f"# one epsilon({DELTA}) query from a fresh accountant; medians of {args.repeat}; load average {os.getloadavg()[0]:.1f}")
    header = (
        f"{'setting':24s} {'T':>9s} {'plan':>9s} {'n0':>7s} {'n1':>6s} {'pays':>5s} "
        f"{'one-stage eps':>14s} {'staged eps':>14s} {'rel':>9s} {'one ms':>8s} {'staged ms':>9s} "
        f"{'x':>5s} {'shipped ms':>10s} {'x':>5s}"
    )
    print(header)
    for name, q, sigma, steps in SETTINGS:
        results = {}
        for mode in ("one", "staged", "shipped"):
            pld_module._staging = (lambda _steps: None) if mode == "one" else shipped_staging
            pld_module.staging_pays = (lambda *a, **k: True) if mode == "staged" else shipped_pays
            results[mode] = timed_query(q, sigma, steps, args.repeat)
        pld_module._staging, pld_module.staging_pays = shipped_staging, shipped_pays
        blocks, factor = shipped_staging(steps)  # type: ignore[misc]
        accountant = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps)
        tail = pld_module._tail_for(DELTA, 1e-3)
        leaf = pld_module._Leaf(pld_module._REMOVE, sigma, q)
        per_step_tail = tail / (1 << (steps - 1).bit_length())
        [pld] = pld_module._discretize([leaf], accountant._grid_step(), per_step_tail, True)
        log_tail = math.log(tail)
        whole = numerics._Window.of([pld], [steps], log_tail).size
        block = numerics._Window.of([pld], [steps // blocks], numerics._block_log_tail(log_tail, blocks)).size
        pays = shipped_pays([pld], [steps], blocks=blocks, factor=factor, log_tail=log_tail)
        (one_eps, one_s), (staged_eps, staged_s), (_, shipped_s) = results["one"], results["staged"], results["shipped"]
        print(
            f"{name:24s} {steps:9d} {f'{blocks}x/{factor}':>9s} {whole:7d} {block:6d} {pays!s:>5} "
            f"{one_eps:14.6f} {staged_eps:14.6f} {staged_eps / one_eps - 1:+9.1e} {one_s * 1e3:8.2f} "
            f"{staged_s * 1e3:9.2f} {one_s / staged_s:5.2f} {shipped_s * 1e3:10.2f} {one_s / shipped_s:5.2f}"
        )
    print(f"# load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
