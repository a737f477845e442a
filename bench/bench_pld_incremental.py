"""Incremental accounting: the tight accountant's epsilon after every step of a run (what a
budget check does), against fresh compositions of the same ledger.

    python bench/bench_pld_incremental.py [--steps 2000] [--check-every 250]
                                          [--out bench/results/pld_incremental.txt]

One accountant composes ``PoissonSampled(Gaussian(1.0), 0.01)`` one step at a time and is asked
epsilon(1e-5) after each step; the time per step (compose + query) is reported for the whole run
and per quarter. Every ``--check-every`` steps (and at the last) a fresh accountant composes the
same number of steps at once: its answer must equal the incremental one bit for bit, and its
query time gives the ratio fresh / incremental per step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dpsharp import Gaussian, PLDAccountant, PoissonSampled

DELTA = 1e-5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--check-every", type=int, default=250)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--q", type=float, default=0.01)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "pld_incremental.txt"))
    args = parser.parse_args()
    event = PoissonSampled(Gaussian(args.sigma), args.q)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# python {' '.join(sys.argv)}",
             f"# q={args.q} sigma={args.sigma} delta={DELTA}; load average at start {load:.1f} "
             f"on {os.cpu_count()} CPUs"]

    accountant = PLDAccountant()
    per_step: list[float] = []
    answers: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        accountant.compose(event)
        answers[step] = accountant.epsilon(DELTA)
        per_step.append(time.perf_counter() - start)
    total = sum(per_step)
    lines.append(f"incremental: {args.steps} steps, epsilon after each: total {total:.3f}s, "
                 f"{total / args.steps * 1e3:.3f} ms per step amortised; "
                 f"final epsilon {answers[args.steps]:.6f}")
    quarter = max(args.steps // 4, 1)
    for begin in range(0, args.steps, quarter):
        chunk = per_step[begin:begin + quarter]
        lines.append(f"  steps {begin + 1:5d}-{begin + len(chunk):5d}: "
                     f"{sum(chunk) / len(chunk) * 1e3:.3f} ms per step")
    checks = sorted({*range(args.check_every, args.steps + 1, args.check_every), args.steps})
    mismatches = 0
    for step in checks:
        start = time.perf_counter()
        fresh = PLDAccountant().compose(event, step).epsilon(DELTA)
        seconds = time.perf_counter() - start
        same = fresh == answers[step]
        mismatches += not same
        lines.append(f"  step {step:5d}: fresh {fresh:.9f} in {seconds * 1e3:.1f} ms "
                     f"({seconds / per_step[step - 1]:.1f}x the incremental step); "
                     f"{'equal' if same else 'DIFFERENT: ' + repr(answers[step])}")
    lines.append(f"answers equal to a fresh composition: {len(checks) - mismatches} of "
                 f"{len(checks)} checked")
    print("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
