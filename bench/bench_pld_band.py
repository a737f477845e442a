"""Compositions held as a band of low frequencies against the same compositions held dense.

For each setting, one epsilon(1e-5) query from a fresh accountant two ways, interleaved in the
same process: as shipped (a composition whose spectrum lies in at most n/64 low frequencies is
held as that band and queried by closed-form sums, ``_pld_band``) and forced dense (the band
threshold set so that every composition takes the inverse FFT of its circle). Prints both
epsilons (they agree to ~1e-12 relative), the band size, median times and the ratio dense / band
(the figure to quote; the machine is shared).

    python bench/bench_pld_band.py [--repeat 11]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import dpsharp.accountants._pld_numerics as numerics
from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp.accountants import pld as pld_module

DELTA = 1e-5
MNIST_Q = 256 / 60000
# (name, q, sigma, steps, precision): the default precision, and the parity precisions of
# bench/results/pld_speed.txt for the settings where they are finer.
SETTINGS = [
    ("Abadi T=1e4", 0.01, 4.0, 10_000, 1e-3),
    ("Abadi T=1e4", 0.01, 4.0, 10_000, 2.5e-4),
    ("Abadi T=4e4", 0.01, 4.0, 40_000, 1e-3),
    ("hard q=.02 s=.5", 0.02, 0.5, 5000, 6.1e-8),
    ("hard q=.1 s=2", 0.1, 2.0, 1000, 1e-3),
    ("hard q=.1 s=2", 0.1, 2.0, 1000, 9.77e-7),
    ("hard q=.001 s=.8", 0.001, 0.8, 100_000, 1e-3),
    ("MNIST s=0.638 e=70", MNIST_Q, 0.638, 16_406, 1e-3),
    ("MNIST s=1.1 e=15", MNIST_Q, 1.1, 3516, 1e-3),
    ("MNIST s=1.1 T=1e6", MNIST_Q, 1.1, 1_000_000, 1e-3),
]
_DENSE = 10**18  # a band threshold no circle reaches


def query(q: float, sigma: float, steps: int, precision: float) -> float:
    return (
        PLDAccountant(precision=precision)
        .compose(PoissonSampled(Gaussian(sigma), q), steps)
        .epsilon(DELTA)
    )


def band_size(q: float, sigma: float, steps: int, precision: float) -> str:
    accountant = PLDAccountant(precision=precision).compose(
        PoissonSampled(Gaussian(sigma), q), steps
    )
    result = accountant._composed(
        "remove", True, accountant._grid_step(), pld_module._tail_for(DELTA, precision)
    )
    if result.spectral is None:
        return f"dense/{result.size}"
    return f"{result.spectral.coefficients.size}/{result.size}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    shipped = numerics.BAND_FRACTION
    print(f"# command: python bench/bench_pld_band.py --repeat {args.repeat}")
    print(
        f"# one epsilon({DELTA}) query from a fresh accountant, band (shipped) and forced dense "
        f"interleaved; medians of {args.repeat}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'setting':20s} {'T':>8s} {'precision':>9s} {'band/n':>15s} {'band eps':>14s} "
        f"{'dense eps':>14s} {'band ms':>8s} {'dense ms':>9s} {'x':>5s}"
    )
    for name, q, sigma, steps, precision in SETTINGS:
        times: dict[int, list[float]] = {shipped: [], _DENSE: []}
        values: dict[int, float] = {}
        try:
            for _ in range(args.repeat):
                for fraction in times:
                    numerics.BAND_FRACTION = fraction
                    start = time.perf_counter()
                    values[fraction] = query(q, sigma, steps, precision)
                    times[fraction].append(time.perf_counter() - start)
        finally:
            numerics.BAND_FRACTION = shipped
        band_ms = statistics.median(times[shipped]) * 1e3
        dense_ms = statistics.median(times[_DENSE]) * 1e3
        print(
            f"{name:20s} {steps:8d} {precision:9.3g} {band_size(q, sigma, steps, precision):>15s} "
            f"{values[shipped]:14.9f} {values[_DENSE]:14.9f} {band_ms:8.2f} {dense_ms:9.2f} "
            f"{dense_ms / band_ms:5.2f}"
        )
    print(f"# load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
