"""Time the tight accounting of per-step noise schedules (a different sigma at every step).

Usage:  python bench/bench_schedules.py [--sizes 1000,10000,100000] [--repeat 3]
                                        [--baseline SRC] [--source SRC] [--rounds 2] [--bounds]
                                        [--peer-steps 200] [--out bench/results/bench_schedules.txt]

Schedules, Poisson q = 0.01, delta = 1e-5, one step per noise multiplier:

* ``decay``: sigma decaying geometrically from 2 to 0.8 over the run;
* ``adp``: ADP-SGD over a polynomially decaying learning rate eta_t = 0.5 / sqrt(1 + t / 100),
  scale 1.0 (sigma from 1 up to about 3.2).

For each schedule and number of steps (= distinct sigmas), in a fresh worker process: the certified
epsilon of a fresh accountant, the time of the query alone (``epsilon`` on an accountant holding
the composed events) and of the whole (events built, composed and queried, after the process's
one-off imports, which are timed apart: about 2 s of SciPy on a 2-core machine, paid once per
process), each the median of ``--repeat`` runs, and the number of distinct discretisations after
the rounding of the noise multipliers (with its quantum). ``--bounds`` adds the certified lower
bound of ``epsilon_bounds`` and the relative gap (upper - lower) / upper (one run, timed
separately). ``--baseline SRC`` times the same in workers that import dpsharp from the directory
SRC instead (e.g. an older checkout's ``python/``, with its compiled ``_core``), alternating with
the current code (or the one in ``--source``) for ``--rounds`` rounds on the same machine, and
reports the ratio of the medians, in wall-clock and in the process's CPU time (all threads: the
work done, steadier than wall-clock on a shared machine). The peers (dp-accounting 0.6.0 PLD at
1e-4, prv-accountant 0.2.0) compose the ``adp`` schedule's first ``--peer-steps`` steps
(``--peer-steps 0`` skips them; they take minutes). Every line is printed and saved to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

Q, DELTA = 0.01, 1e-5


def _use_source(source: str) -> None:
    """Import dpsharp from ``source`` (a directory holding the ``dpsharp`` package) instead of
    the installed one: the editable install's import hook is taken off ``sys.meta_path``."""
    sys.meta_path[:] = [
        finder for finder in sys.meta_path
        if "skbc" not in type(finder).__module__ and "editable" not in type(finder).__module__
    ]
    sys.path.insert(0, source)


def sigmas(schedule: str, steps: int) -> np.ndarray:
    if schedule == "decay":
        return np.geomspace(2.0, 0.8, steps)
    from dpsharp.torch.schedules import ADP

    # Mildly decaying LR -> slowly growing sigma; chosen so epsilon stays moderate.
    rates = 0.5 / np.sqrt(1.0 + np.arange(steps) / 100.0)
    return ADP(rates, scale=1.0).sequence()


def fresh(schedule: str, steps: int) -> Any:
    import dpsharp
    from dpsharp.torch.schedules import schedule_events

    accountant = dpsharp.accountant("pld")
    accountant.compose(schedule_events([float(s) for s in sigmas(schedule, steps)], steps,
                                       sampling_probability=Q))
    return accountant


def measure(schedule: str, steps: int, repeat: int, bounds: bool) -> dict[str, Any]:
    """One worker's figures (see the module docstring)."""
    start = time.perf_counter()
    import dpsharp  # the one-off imports (SciPy's optimize and stats: seconds), timed apart
    import dpsharp.torch.schedules  # noqa: F401

    dpsharp.accountant("pld")
    imported = time.perf_counter() - start
    totals, queries, cpus = [], [], []
    eps = float("nan")
    for _ in range(repeat):
        start = time.perf_counter()
        accountant = fresh(schedule, steps)
        built = time.perf_counter()
        cpu = time.process_time()
        eps = accountant.epsilon(DELTA)
        done = time.perf_counter()
        cpus.append(time.process_time() - cpu)
        totals.append(done - start)
        queries.append(done - built)
    out: dict[str, Any] = {"eps": eps, "total": statistics.median(totals),
                           "query": statistics.median(queries), "import": imported,
                           "query_cpu": statistics.median(cpus)}
    quantum = accountant._rounding_quantum("remove", True)
    out["quantum"] = quantum
    keys = accountant._leaf_keys.get(("remove", quantum, True)) or accountant._exact_keys("remove")
    out["distinct"] = len(set(keys))
    if bounds:
        accountant = fresh(schedule, steps)
        start = time.perf_counter()
        lower, upper = accountant.epsilon_bounds(DELTA)
        out["bounds_seconds"] = time.perf_counter() - start
        assert upper == eps, (upper, eps)  # one composition, one certified number
        out["lower"] = lower
    return out


def run_worker(source: str | None, schedule: str, steps: int, repeat: int,
               bounds: bool) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--worker", schedule, str(steps),
               str(repeat), "1" if bounds else "0"]
    if source:
        command.append(source)
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        schedule, steps, repeat = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        bounds = sys.argv[5]
        if len(sys.argv) > 6:
            _use_source(sys.argv[6])
        print(json.dumps(measure(schedule, steps, repeat, bounds == "1")))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--schedules", default="decay,adp")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", default=None,
                        help="directory holding an older dpsharp package to time against")
    parser.add_argument("--source", default=None,
                        help="directory holding the dpsharp package to time (default: the "
                             "installed one)")
    parser.add_argument("--bounds", action="store_true", help="also time epsilon_bounds")
    parser.add_argument("--peer-steps", type=int, default=200)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "bench_schedules.txt"))
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    lines = [f"# python {' '.join(sys.argv)}",
             f"# q={Q} delta={DELTA}; {os.cpu_count()} CPUs; query = epsilon() on the composed "
             "events, total = events built + composed + epsilon(), after the one-off imports "
             "of a fresh process (import = dpsharp, its schedules and the accountants, with "
             "SciPy); medians; load = 1-minute load average when the line was measured"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)
        with open(args.out, "w") as f:  # rewritten after every line: a killed run keeps its results
            f.write("\n".join(lines) + "\n")

    def load() -> float:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    for schedule in args.schedules.split(","):
        previous: tuple[int, float] | None = None
        for steps in sizes:
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            loads = [load()]
            for round_index in range(args.rounds if args.baseline else 1):
                ours.append(run_worker(args.source, schedule, steps, args.repeat,
                                       args.bounds and round_index == 0))
                if args.baseline:
                    theirs.append(run_worker(args.baseline, schedule, steps, args.repeat, False))
                loads.append(load())
            first = ours[0]
            query = statistics.median(o["query"] for o in ours)
            total = statistics.median(o["total"] for o in ours)
            line = (f"dpsharp pld {schedule:5s} steps={steps:6d} distinct_sigmas={steps:6d} "
                    f"eps={first['eps']:.5f} query={query:.3f}s total={total:.3f}s "
                    f"import={first['import']:.2f}s "
                    f"discretised={first['distinct']} quantum={first['quantum']:.3g}")
            if previous is not None:
                line += f" growth x{query / previous[1]:.2f} for x{steps / previous[0]:g} events"
            previous = (steps, query)
            if args.bounds:
                gap = (first["eps"] - first["lower"]) / first["eps"]
                line += (f" lower={first['lower']:.5f} gap={gap:.2%}"
                         f" epsilon_bounds={first['bounds_seconds']:.3f}s")
            if theirs:
                old_query = statistics.median(t["query"] for t in theirs)
                old_total = statistics.median(t["total"] for t in theirs)
                cpu = statistics.median(o["query_cpu"] for o in ours)
                old_cpu = statistics.median(t["query_cpu"] for t in theirs)
                line += (f" | baseline eps={theirs[0]['eps']:.5f} query={old_query:.3f}s "
                         f"total={old_total:.3f}s discretised={theirs[0]['distinct']}: query "
                         f"x{old_query / query:.2f} faster, total x{old_total / total:.2f}, "
                         f"query CPU time {old_cpu:.3f}s -> {cpu:.3f}s (x{old_cpu / cpu:.2f})")
            line += f" load={min(loads):.1f}-{max(loads):.1f}"
            report(line)
    if args.peer_steps <= 0:
        return
    ours_peer = run_worker(args.source, "adp", args.peer_steps, args.repeat, False)
    report(f"dpsharp pld adp   steps={args.peer_steps:6d} eps={ours_peer['eps']:.5f} "
           f"total={ours_peer['total']:.3f}s")
    for name, fn in (("dp-accounting pld", dp_accounting_pld), ("prv-accountant", prv)):
        try:
            peer_eps, peer_seconds = fn(args.peer_steps)
        except Exception as exc:  # noqa: BLE001 - a peer failing is a result to report
            report(f"{name:18s} steps={args.peer_steps:6d} FAILED: {type(exc).__name__}: {exc}")
            continue
        report(f"{name:18s} steps={args.peer_steps:6d} eps={peer_eps:.5f} "
               f"time={peer_seconds:.3f}s ({peer_seconds / ours_peer['total']:.0f}x dpsharp)")


if __name__ == "__main__":
    main()
