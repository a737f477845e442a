"""Speed and tightness of PLDAccountant against dp-accounting's PLD and opacus' PRV accountant.

One epsilon(1e-5) query from a fresh accountant (composition included) per setting of the
grid below: our median time over repeats, dp-accounting PLD at value_discretization_interval
1e-4 (and 1e-5, the tightness reference) and opacus' PRVAccountant, timed in the same process; ratios, not
absolute times, are the figures to quote (the machine is shared). Also: a schedule of 10^4
distinct sigmas composed in one accountant, and epsilon queried after every step of a 1,000-step
run.

Tightness parity (the speed ratio only counts "while at least as tight"): the default
precision is a relative target (1e-3) while dp-accounting's interval is absolute, so on settings
with a wide composed loss its 1e-4 run is tighter than our default. The parity columns give, per
setting, the coarsest precision of PARITY_LADDER at which our certified upper bound is <=
dp-accounting's at 1e-4, our median time there, and dp-accounting's time over it.

    python bench/bench_pld.py [--quick] [--no-fine] [--no-parity]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

from dpsharp import Gaussian, PLDAccountant, PoissonSampled

DELTA = 1e-5
MNIST_Q = 256 / 60000


def settings() -> list[tuple[str, float, float, int]]:
    out = []
    for sigma, epochs in [(0.638, 70), (0.7, 45), (0.7, 70), (1.06, 20), (1.1, 60), (1.3, 20), (1.1, 15)]:
        out.append((f"MNIST s={sigma} e={epochs}", MNIST_Q, sigma, round(epochs * 60000 / 256)))
    out += [
        ("Abadi T=1e4", 0.01, 4.0, 10_000),
        ("Abadi T=4e4", 0.01, 4.0, 40_000),
        ("hard q=.02 s=.5", 0.02, 0.5, 5000),
        ("hard q=.1 s=2", 0.1, 2.0, 1000),
        ("hard q=.001 s=.8", 0.001, 0.8, 100_000),
        ("RELIABILITY 1", 0.01, 1.0, 1000),
    ]
    return out


def ours(q: float, sigma: float, steps: int, precision: float = 1e-3) -> float:
    return PLDAccountant(precision=precision).compose(PoissonSampled(Gaussian(sigma), q), steps).epsilon(DELTA)


# Precisions tried for the tightness-parity columns: each half of the precision divides the
# grid step's formula by sqrt(2) (h ~ sqrt(precision), rounded down to a step 2^k or
# 3 * 2^(k-1), two grids per factor 2), so this ladder visits every grid from the default one
# down to 1/128 of its step.
PARITY_LADDER = [1e-3 / 2**k for k in range(16)]


def at_parity(q: float, sigma: float, steps: int, target: float) -> tuple[float, float] | None:
    """The coarsest precision of PARITY_LADDER whose certified upper bound is <= ``target``
    (dp-accounting's epsilon at interval 1e-4), with that upper bound; None if none is."""
    for precision in PARITY_LADDER:
        value = ours(q, sigma, steps, precision)
        if value <= target:
            return precision, value
    return None


def dp_accounting(q: float, sigma: float, steps: int, interval: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(DELTA))


def opacus_prv(q: float, sigma: float, steps: int) -> float:
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(sigma, q, steps)]
    return float(acc.get_epsilon(delta=DELTA))


def timed(fn, *args, repeat: int = 1) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    times = []
    value = float("nan")
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn(*args)
        times.append(time.perf_counter() - start)
    return value, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="skip the peers")
    parser.add_argument("--no-fine", action="store_true", help="skip dp-accounting at 1e-5")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--peer-repeat", type=int, default=3, help="repeats of each peer call (median)")
    parser.add_argument("--no-parity", action="store_true",
                        help="skip the tightness-parity columns (ours at the coarsest precision "
                             "at least as tight as dp-accounting at 1e-4)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"# command: python {' '.join(sys.argv)}")
    print(f"# one epsilon({DELTA}) query from a fresh accountant, composition included; median of "
          f"{args.repeat} (ours) and {args.peer_repeat} (peers) runs; load average {os.getloadavg()[0]:.1f}")
    # Heterogeneous: 10^4 distinct sigmas, one step each (median of 5 runs, each from scratch).
    sigmas = np.linspace(0.8, 1.6, 10_000)

    def distinct_sigmas() -> float:
        acc = PLDAccountant()
        for sigma in sigmas:
            acc.compose(PoissonSampled(Gaussian(float(sigma)), 0.01))
        return acc.epsilon(DELTA)

    eps, seconds = timed(distinct_sigmas, repeat=5)
    print(f"# 10^4 distinct sigmas in [0.8, 1.6], q=0.01: compose + epsilon = {seconds:.3f} s (median of 5), eps={eps:.5f}")

    # Incremental: epsilon after every step of a 1,000-step run (median of 5 runs).
    event = PoissonSampled(Gaussian(1.0), 0.01)

    def incremental() -> float:
        acc = PLDAccountant()
        last = float("nan")
        for _ in range(1000):
            acc.compose(event)
            last = acc.epsilon(DELTA)
        return last

    last, total = timed(incremental, repeat=5)
    fresh = PLDAccountant().compose(event, 1000).epsilon(DELTA)
    print(f"# incremental: 1000 steps with a query after each: {total:.3f} s total (median of 5); last eps {last:.6f} (fresh {fresh:.6f})")
    header = (
        f"{'setting':24s} {'T':>7s} {'ours eps':>10s} {'ours ms':>8s} {'dpa1e-4 eps':>12s} {'dpa1e-4 s':>9s}"
        f" {'x':>6s} {'prv eps':>9s} {'prv s':>7s} {'x':>6s} {'dpa1e-5 eps':>12s} {'ours/dpa1e-5':>12s}"
        f" {'parity prec':>11s} {'parity eps':>11s} {'parity ms':>9s} {'x':>6s}"
    )
    print(header)
    medians = []
    for name, q, sigma, steps in settings():
        value, median = timed(ours, q, sigma, steps, repeat=args.repeat)
        medians.append(median)
        row = f"{name:24s} {steps:7d} {value:10.5f} {median * 1e3:8.2f}"
        if not args.quick:
            d4, t4 = timed(dp_accounting, q, sigma, steps, 1e-4, repeat=args.peer_repeat)
            pv, tp = timed(opacus_prv, q, sigma, steps, repeat=args.peer_repeat)
            row += f" {d4:12.5f} {t4:9.3f} {t4 / median:6.0f} {pv:9.5f} {tp:7.3f} {tp / median:6.0f}"
            if not args.no_fine:
                d5, _ = timed(dp_accounting, q, sigma, steps, 1e-5)
                row += f" {d5:12.5f} {value / d5:12.6f}"
            else:
                row += f" {'-':>12s} {'-':>12s}"
            if not args.no_parity:
                parity = at_parity(q, sigma, steps, d4)
                if parity is None:
                    row += f" {'none':>11s}"
                else:
                    precision, tight = parity
                    _, t_parity = timed(ours, q, sigma, steps, precision, repeat=args.repeat)
                    row += f" {precision:11.3g} {tight:11.5f} {t_parity * 1e3:9.2f} {t4 / t_parity:6.0f}"
        print(row, flush=True)
    print(f"# median over settings of our median time: {statistics.median(medians) * 1e3:.2f} ms; max {max(medians) * 1e3:.2f} ms")

    print(f"# load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
