"""Fresh-query speed of the tight accountant against dp-accounting's PLD, and of its certified
transforms against pocketfft (scipy.fft), measured alternately in one process.

Rows:

* one epsilon(1e-5) query from a fresh accountant (composition included) on the settings of the
  speed table (q = 0.01, sigma = 1, T = 10^3 .. 10^5), the small-q long run (q = 5e-4,
  sigma = 0.6, T = 2 10^5) and a composition without sampling (q = 1, answered by the exact
  Gaussian closed form), each against dp-accounting's PLD at value_discretization_interval
  1e-3 (the speed table's peer setting): median of ``--repeat`` alternating runs, ratio
  peer / ours;
* the first query of the process on a new circle size (cold: twiddle tables built) against the
  warm median;
* one certified real transform and its inverse against scipy.fft's rfft / irfft (one thread
  each) at 2^17 and 2^20 points.

``--against DIR`` also times the fresh queries (dpsharp only) with the dpsharp package found in
DIR (e.g. the ``python`` folder of another checkout with its extension built) and with this one,
each in its own process, alternating for ``--rounds`` rounds; per setting, the median over the
rounds of each process's median query, and the ratio other / this (a machine whose speed drifts
still compares the two fairly).

    python bench/bench_pld_fresh.py [--repeat 5] [--out bench/results/pld_fresh.txt]
                                    [--against OTHER/python --rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np
import scipy.fft

from dpsharp import Gaussian, PLDAccountant, PoissonSampled
from dpsharp.accountants import _pld_numerics

DELTA = 1e-5
SETTINGS = [
    ("q=.01 s=1 T=1e3", 0.01, 1.0, 1_000),
    ("q=.01 s=1 T=1e4", 0.01, 1.0, 10_000),
    ("q=.01 s=1 T=1e5", 0.01, 1.0, 100_000),
    ("q=5e-4 s=.6 T=2e5", 5e-4, 0.6, 200_000),
    ("q=1 s=1 T=1e3", 1.0, 1.0, 1_000),
    ("q=1 s=4 T=1e4", 1.0, 4.0, 10_000),
]


def ours(q: float, sigma: float, steps: int) -> float:
    event = Gaussian(sigma) if q == 1.0 else PoissonSampled(Gaussian(sigma), q)
    return PLDAccountant().compose(event, steps).epsilon(DELTA)


def peer(q: float, sigma: float, steps: int) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
        event = dp_event.GaussianDpEvent(sigma)
        if q < 1.0:
            event = dp_event.PoissonSampledDpEvent(q, event)
        accountant.compose(event, steps)
        return float(accountant.get_epsilon(DELTA))


def timed(function, *args):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - started, value


def _queries_only(repeat: int) -> None:
    """(A child of --against.) The median seconds of each fresh setting, as JSON on stdout."""
    medians = {}
    for name, q, sigma, steps in SETTINGS:
        ours(q, sigma, steps)  # this setting's circles planned
        medians[name] = statistics.median(timed(ours, q, sigma, steps)[0] for _ in range(repeat))
    print(json.dumps(medians))


#: Run in a child: the dpsharp package of the directory given first on the command line, past
#: an editable install's import hook (which would otherwise pick the installed checkout).
_CHILD = """import runpy, sys
root, sys.argv = sys.argv[1], sys.argv[2:]
sys.meta_path[:] = [f for f in sys.meta_path if 'Redirecting' not in type(f).__name__]
sys.path.insert(0, root)
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def _against(other: str, rounds: int, repeat: int) -> list[str]:
    """Fresh-query medians of this checkout and of ``other``, alternating processes."""
    command = [os.path.abspath(__file__), "--queries-only", "--repeat", str(repeat)]
    runs: dict[str, list[dict[str, float]]] = {"other": [], "this": []}
    for _ in range(rounds):
        for name in ("other", "this"):
            child = (["-c", _CHILD, other] if name == "other" else []) + command
            out = subprocess.run([sys.executable, *child], capture_output=True, text=True,
                                 check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    lines = [f"# against {other}: {rounds} rounds, one process each, alternating; per setting the "
             f"median over rounds of each process's median of {repeat} queries (ms)",
             f"{'setting':22} {'other ms':>9} {'this ms':>9} {'other/this':>11}"]
    for name, *_ in SETTINGS:
        before = statistics.median(run[name] for run in runs["other"])
        after = statistics.median(run[name] for run in runs["this"])
        lines.append(f"{name:22} {before * 1e3:9.2f} {after * 1e3:9.2f} {before / after:11.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--against", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--queries-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.queries_only:
        _queries_only(args.repeat)
        return
    lines = [
        f"# command: python {' '.join(sys.argv)}",
        f"# load average at the start: {os.getloadavg()[0]:.1f}",
    ]
    cold, _ = timed(ours, 0.01, 1.0, 1_000)
    warm = statistics.median(timed(ours, 0.01, 1.0, 1_000)[0] for _ in range(args.repeat))
    lines.append(
        f"# cold start (first query of the process, q=.01 s=1 T=1e3): {cold * 1e3:.1f} ms, "
        f"warm median {warm * 1e3:.1f} ms ({cold / warm:.1f}x)"
    )
    header = (
        f"{'setting':22} {'ours eps':>12} {'ours ms':>9} {'dpa1e-3 eps':>12} {'dpa ms':>9} "
        f"{'x':>7}"
    )
    lines.append(header)
    print("\n".join(lines), flush=True)
    for name, q, sigma, steps in SETTINGS:
        mine: list[float] = []
        theirs: list[float] = []
        eps_ours = eps_peer = float("nan")
        for _ in range(args.repeat):
            seconds, eps_ours = timed(ours, q, sigma, steps)
            mine.append(seconds)
            if len(theirs) < max(1, args.repeat // 2):
                seconds, eps_peer = timed(peer, q, sigma, steps)
                theirs.append(seconds)
        a, b = statistics.median(mine), statistics.median(theirs)
        line = (
            f"{name:22} {eps_ours:12.6f} {a * 1e3:9.2f} {eps_peer:12.6f} {b * 1e3:9.1f} "
            f"{b / a:7.1f}"
        )
        lines.append(line)
        print(line, flush=True)
    lines.append(
        f"{'transform':22} {'points':>12} {'ours ms':>9} {'pocketfft':>12} {'ms':>9} {'x':>7}"
    )
    for size in (1 << 17, 1 << 20):
        values = np.random.default_rng(0).random(size)
        spectrum = scipy.fft.rfft(values)
        for label, mine_f, theirs_f in (
            ("forward", lambda: _pld_numerics.certified_forward(values, size),
             lambda: scipy.fft.rfft(values, workers=1)),
            ("inverse", lambda: _pld_numerics.certified_inverse(spectrum, size),
             lambda: scipy.fft.irfft(spectrum, size, workers=1)),
        ):
            mine_t: list[float] = []
            theirs_t: list[float] = []
            for _ in range(args.repeat):
                mine_t.append(timed(mine_f)[0])
                theirs_t.append(timed(theirs_f)[0])
            a, b = statistics.median(mine_t), statistics.median(theirs_t)
            line = f"{label:22} {size:12d} {a * 1e3:9.2f} {'':12} {b * 1e3:9.2f} {b / a:7.2f}"
            lines.append(line)
            print(line, flush=True)
    if args.against:
        print("# alternating against", args.against, "...", flush=True)
        lines.extend(_against(args.against, args.rounds, args.repeat))
        print("\n".join(lines[-len(SETTINGS) - 2:]), flush=True)
    lines.append(f"# load average at the end: {os.getloadavg()[0]:.1f}")
    if args.out:
        with open(args.out, "a") as handle:
            handle.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    sys.exit(main())
