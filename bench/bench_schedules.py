"""Time the tight accounting of a per-step noise schedule (target: 10^4 distinct sigmas in < 1 s).

Usage:  python bench/bench_schedules.py [--steps 10000] [--peer-steps 1000]

Schedule: ADP-SGD over a polynomially decaying learning rate eta_t = 0.5 / sqrt(t + 1), scale
1.0 (sigma_t = sqrt(t + 1), capped below by nothing: a different sigma at every step), Poisson
q = 0.01, delta = 1e-5. Our "pld" accountant composes one PoissonSampled(Gaussian(sigma_t), q)
per step; the peers (dp-accounting 0.6.0 PLD, prv-accountant 0.2.0) compose the same events,
on ``--peer-steps`` steps if they are slower (one run each; ours: median of 5 runs). Every answer
and time is printed and saved to bench/results/bench_schedules.txt.
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


def sigmas(steps: int) -> np.ndarray:
    # Mildly decaying LR -> slowly growing sigma; chosen so epsilon stays moderate.
    rates = 0.5 / np.sqrt(1.0 + np.arange(steps) / 100.0)
    return ADP(rates, scale=1.0).sequence()


def ours(steps: int, repeat: int = 5) -> tuple[float, float]:
    """(epsilon, median time over ``repeat`` runs, each from a fresh accountant: events built,
    composed and queried)."""
    times = []
    eps = float("nan")
    for _ in range(repeat):
        start = time.perf_counter()
        acc = dpsharp.accountant("pld")
        acc.compose(schedule_events(list(sigmas(steps)), steps, sampling_probability=Q))
        eps = acc.epsilon(DELTA)
        times.append(time.perf_counter() - start)
    return eps, statistics.median(times)


def dp_accounting_pld(steps: int) -> tuple[float, float]:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    start = time.perf_counter()
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    for s in sigmas(steps):
        acc.compose(dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(float(s))))
    eps = acc.get_epsilon(DELTA)
    return eps, time.perf_counter() - start


def prv(steps: int) -> tuple[float, float]:
    from prv_accountant import Accountant as _Unused  # noqa: F401
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    start = time.perf_counter()
    prvs = [PoissonSubsampledGaussianMechanism(sampling_probability=Q, noise_multiplier=float(s)) for s in sigmas(steps)]
    acc = PRVAccountant(prvs=prvs, max_self_compositions=[1] * steps, eps_error=0.01, delta_error=1e-9)
    _, _, eps = acc.compute_epsilon(delta=DELTA, num_self_compositions=[1] * steps)
    return eps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--peer-steps", type=int, default=1000)
    args = parser.parse_args()
    lines = [f"# python {' '.join(sys.argv)}", f"# q={Q} delta={DELTA}"]

    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    out = os.path.join(os.path.dirname(__file__), "results", "bench_schedules.txt")

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)
        with open(out, "w") as f:  # rewritten after every line: a killed run keeps its results
            f.write("\n".join(lines) + "\n")

    for steps in sorted({args.peer_steps, args.steps}):
        eps, seconds = ours(steps)
        report(f"dpsharp pld        steps={steps:6d} distinct_sigmas={steps:6d} eps={eps:.5f} time={seconds:.3f}s (median of 5)")
    for name, fn in (("dp-accounting pld", dp_accounting_pld), ("prv-accountant", prv)):
        try:
            eps, seconds = fn(args.peer_steps)
        except Exception as exc:  # noqa: BLE001 - a peer failing is a result to report
            report(f"{name:18s} steps={args.peer_steps:6d} FAILED: {type(exc).__name__}: {exc}")
            continue
        report(f"{name:18s} steps={args.peer_steps:6d} distinct_sigmas={args.peer_steps:6d} eps={eps:.5f} time={seconds:.3f}s")


if __name__ == "__main__":
    main()
