"""The tight accountant's queries with two builds of the compiled core, alternating in one process.

    python bench/bench_core_ab.py --other-core OTHER/_core.cpython-311-x86_64-linux-gnu.so
                                  [--rounds 9] [--transforms] [--out bench/results/core_ab.txt]

On a shared machine the speed of a process drifts by up to a third between processes (the same
code measured in two fresh processes can differ by that much), which hides a change of 5-15%
in process-alternating comparisons (bench_pld_fresh.py ``--against``). Here both builds run in
one process: the other build's extension module is loaded beside this one (it is
self-contained) and the accountant's modules are pointed at one or the other before each
round, the order alternating every round, so drift moves both alike. Only the compiled code
differs; the Python is this checkout's (use bench_pld_fresh.py ``--against`` to compare Python
changes). Reported per setting: the median time of each build over the rounds after the first,
their ratio, and both answers (a transform that changes its rounding changes the last digits).

``--transforms`` adds the real forward transform alone (``pld_certified_rfft`` of random values
filling two thirds of the circle, as a leaf does, on 1 and 2 threads) at circle sizes the
accountant uses, alternating the two cores call by call (the bits of both are compared).

Settings: fresh queries (``PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q),
T).epsilon(1e-5)``) of bench_pld_fresh.py, and ``epsilon(1e-5)`` of the two per-step schedules
of bench_schedules.py (q = 0.01, a different noise multiplier at every step, 10^3 and 10^4
steps) on composed events whose per-event keys were computed before the timing.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import statistics
import sys
import time
from types import ModuleType
from typing import Callable

import numpy as np

import dpsharp.accountants._pld_band as band
import dpsharp.accountants._pld_continuous as continuous
import dpsharp.accountants._pld_numerics as numerics
import dpsharp.accountants.pld as pld
from dpsharp import Gaussian, PLDAccountant, PoissonSampled

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_schedules  # noqa: E402  (this folder's script: its schedules)

FRESH = {
    "q=.01 s=1 T=1e3": (0.01, 1.0, 1_000),
    "q=.01 s=1 T=1e4": (0.01, 1.0, 10_000),
    "q=.01 s=1 T=1e5": (0.01, 1.0, 100_000),
    "q=5e-4 s=.6 T=2e5": (5e-4, 0.6, 200_000),
}
SCHEDULES = [("decay", 1_000), ("decay", 10_000), ("adp", 1_000), ("adp", 10_000)]
DELTA = 1e-5


def load_core(path: str) -> ModuleType:
    """The extension module at ``path``, loaded under its own name beside dpsharp's."""
    loader = importlib.machinery.ExtensionFileLoader("_core", path)
    spec = importlib.util.spec_from_loader("_core", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def use(core: ModuleType) -> None:
    """Point every accountant module that calls the compiled core at ``core``."""
    for module in (numerics, pld, band, continuous):
        module._core = core  # type: ignore[attr-defined]


def schedule_query(name: str, steps: int) -> Callable[[], float]:
    sigmas = bench_schedules.sigmas(name, steps)

    def query() -> float:
        accountant = PLDAccountant()
        for sigma in sigmas:
            accountant.compose(PoissonSampled(Gaussian(float(sigma)), 0.01))
        for direction in accountant._directions():
            accountant._exact_keys(direction)
        accountant._base_step()
        start = time.perf_counter()
        value = accountant.epsilon(DELTA)
        query.seconds = time.perf_counter() - start  # type: ignore[attr-defined]
        return value

    return query


def fresh_query(q: float, sigma: float, steps: int) -> Callable[[], float]:
    def query() -> float:
        start = time.perf_counter()
        value = PLDAccountant().compose(PoissonSampled(Gaussian(sigma), q), steps).epsilon(DELTA)
        query.seconds = time.perf_counter() - start  # type: ignore[attr-defined]
        return value

    return query


TRANSFORM_SIZES = (15_360, 16_384, 61_440, 131_072, 163_840, 524_288)


def transform_lines(this_core: ModuleType, other_core: ModuleType, rounds: int) -> list[str]:
    """The forward transform alone: median time of each core per size and thread count, calls
    alternating (``5 * rounds`` of each), and whether the two outputs have the same bits."""
    rng = np.random.default_rng(0)
    lines = [f"{'forward transform':20s} {'other ms':>9s} {'this ms':>9s} {'other/this':>10s}  same bits"]
    for size in TRANSFORM_SIZES:
        values = rng.random(2 * size // 3)
        for threads in (1, 2):
            times: dict[str, list[float]] = {"other": [], "this": []}
            for call in range(5 * rounds):
                order = (("other", other_core), ("this", this_core))
                for label, core in order if call % 2 == 0 else order[::-1]:
                    start = time.perf_counter()
                    core.pld_certified_rfft(values, size, threads=threads)
                    times[label].append(time.perf_counter() - start)
            same = np.array_equal(this_core.pld_certified_rfft(values, size),
                                  other_core.pld_certified_rfft(values, size))
            other = statistics.median(times["other"])
            this = statistics.median(times["this"])
            lines.append(f"{f'n={size} threads={threads}':20s} {other * 1e3:9.3f} {this * 1e3:9.3f} "
                         f"{other / this:10.2f}  {same}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--other-core", required=True,
                        help="the other build's compiled extension (a _core*.so file)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "core_ab.txt"))
    parser.add_argument("--transforms", action="store_true",
                        help="also time the forward transform alone at several circle sizes")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first round is dropped)")
    this_core = numerics._core
    other_core = load_core(args.other_core)
    settings: dict[str, Callable[[], float]] = {
        name: fresh_query(*setting) for name, setting in FRESH.items()
    }
    settings.update({f"{name} {steps}": schedule_query(name, steps) for name, steps in SCHEDULES})
    times: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], float] = {}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for round_index in range(args.rounds):
        order = (("other", other_core), ("this", this_core))
        for label, core in order if round_index % 2 == 0 else order[::-1]:
            use(core)
            for name, query in settings.items():
                answers[(name, label)] = query()
                times.setdefault((name, label), []).append(query.seconds)  # type: ignore[attr-defined]
    use(this_core)
    lines = [
        f"# python {' '.join(sys.argv)}",
        f"# {args.rounds} rounds in one process, the two cores alternating (the first round "
        f"dropped); medians; load average {load:.1f} at the start on {os.cpu_count()} CPUs",
        f"{'setting':20s} {'other ms':>9s} {'this ms':>9s} {'other/this':>10s}  epsilon (other, this)",
    ]
    for name in settings:
        other = statistics.median(times[(name, "other")][1:])
        this = statistics.median(times[(name, "this")][1:])
        lines.append(
            f"{name:20s} {other * 1e3:9.2f} {this * 1e3:9.2f} {other / this:10.3f}  "
            f"{answers[(name, 'other')]!r}, {answers[(name, 'this')]!r}"
        )
    if args.transforms:
        lines.extend(transform_lines(this_core, other_core, args.rounds))
    print("\n".join(lines))
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
