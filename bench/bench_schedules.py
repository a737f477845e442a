"""Time the tight accounting of per-step noise schedules (a different sigma at every step).

Usage:  python bench/bench_schedules.py [--sizes 1000,10000,100000] [--repeat 3]
                                        [--peer-steps 200] [--out bench/results/bench_schedules.txt]

Schedules, Poisson q = 0.01, delta = 1e-5, one step per noise multiplier:

* ``decay``: sigma decaying geometrically from 2 to 0.8 over the run;
* ``adp``: ADP-SGD over a polynomially decaying learning rate eta_t = 0.5 / sqrt(1 + t / 100),
  scale 1.0 (sigma from 1 up to about 3.2).

For each schedule and number of steps (= distinct sigmas): the certified epsilon from a fresh
accountant (events built, composed and queried; median of ``--repeat`` runs), the certified
lower bound of ``epsilon_bounds`` and the relative gap (upper - lower) / upper (one run, timed
separately), the rounding quantum the accountant chose for the noise multipliers, and the
growth of the time against the previous size. The peers (dp-accounting 0.6.0 PLD at 1e-4,
prv-accountant 0.2.0) compose the ``adp`` schedule's first ``--peer-steps`` steps
(``--peer-steps 0`` skips them; they take minutes). Every line is printed and saved to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import dpsharp
import numpy as np
from dpsharp.torch.schedules import ADP, schedule_events

Q, DELTA = 0.01, 1e-5


def sigmas(schedule: str, steps: int) -> np.ndarray:
    if schedule == "decay":
        return np.geomspace(2.0, 0.8, steps)
    # Mildly decaying LR -> slowly growing sigma; chosen so epsilon stays moderate.
    rates = 0.5 / np.sqrt(1.0 + np.arange(steps) / 100.0)
    return ADP(rates, scale=1.0).sequence()


def fresh(schedule: str, steps: int) -> dpsharp.PLDAccountant:
    accountant = dpsharp.accountant("pld")
    accountant.compose(schedule_events([float(s) for s in sigmas(schedule, steps)], steps,
                                       sampling_probability=Q))
    return accountant  # type: ignore[return-value]


def ours(schedule: str, steps: int, repeat: int) -> tuple[float, float, float, float, float]:
    """(epsilon, median seconds of a fresh compose + epsilon, lower bound, seconds of
    epsilon_bounds on a fresh accountant, rounding quantum)."""
    times = []
    eps = float("nan")
    for _ in range(repeat):
        start = time.perf_counter()
        eps = fresh(schedule, steps).epsilon(DELTA)
        times.append(time.perf_counter() - start)
    accountant = fresh(schedule, steps)
    start = time.perf_counter()
    lower, upper = accountant.epsilon_bounds(DELTA)
    bounds_seconds = time.perf_counter() - start
    assert upper == eps, (upper, eps)  # one composition, one certified number
    quantum = accountant._rounding_quantum("remove", True)
    return eps, statistics.median(times), lower, bounds_seconds, quantum


def dp_accounting_pld(steps: int) -> tuple[float, float]:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    start = time.perf_counter()
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    for s in sigmas("adp", steps):
        acc.compose(dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(float(s))))
    eps = acc.get_epsilon(DELTA)
    return eps, time.perf_counter() - start


def prv(steps: int) -> tuple[float, float]:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    start = time.perf_counter()
    prvs = [PoissonSubsampledGaussianMechanism(sampling_probability=Q, noise_multiplier=float(s))
            for s in sigmas("adp", steps)]
    acc = PRVAccountant(prvs=prvs, max_self_compositions=[1] * steps, eps_error=0.01,
                        delta_error=1e-9)
    _, _, eps = acc.compute_epsilon(delta=DELTA, num_self_compositions=[1] * steps)
    return eps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--schedules", default="decay,adp")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer-steps", type=int, default=200)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "bench_schedules.txt"))
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# python {' '.join(sys.argv)}",
             f"# q={Q} delta={DELTA}; load average at start {load:.1f} on {os.cpu_count()} CPUs"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)
        with open(args.out, "w") as f:  # rewritten after every line: a killed run keeps its results
            f.write("\n".join(lines) + "\n")

    for schedule in args.schedules.split(","):
        previous: tuple[int, float] | None = None
        for steps in sizes:
            eps, seconds, lower, bounds_seconds, quantum = ours(schedule, steps, args.repeat)
            growth = ""
            if previous is not None:
                growth = (f" growth x{seconds / previous[1]:.2f} for x{steps / previous[0]:g}"
                          " events")
            report(f"dpsharp pld {schedule:5s} steps={steps:6d} distinct_sigmas={steps:6d} "
                   f"eps={eps:.5f} time={seconds:.3f}s (median of {args.repeat}) "
                   f"lower={lower:.5f} gap={(eps - lower) / eps:.2%} "
                   f"epsilon_bounds={bounds_seconds:.3f}s quantum={quantum:.3g}{growth}")
            previous = (steps, seconds)
    if args.peer_steps <= 0:
        return
    eps, seconds, *_ = ours("adp", args.peer_steps, args.repeat)
    report(f"dpsharp pld adp   steps={args.peer_steps:6d} eps={eps:.5f} time={seconds:.3f}s")
    for name, fn in (("dp-accounting pld", dp_accounting_pld), ("prv-accountant", prv)):
        try:
            peer_eps, peer_seconds = fn(args.peer_steps)
        except Exception as exc:  # noqa: BLE001 - a peer failing is a result to report
            report(f"{name:18s} steps={args.peer_steps:6d} FAILED: {type(exc).__name__}: {exc}")
            continue
        report(f"{name:18s} steps={args.peer_steps:6d} eps={peer_eps:.5f} "
               f"time={peer_seconds:.3f}s ({peer_seconds / seconds:.0f}x dpsharp)")


if __name__ == "__main__":
    main()
