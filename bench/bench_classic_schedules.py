"""Time the classical accountant (advanced composition) on per-step noise schedules.

    python bench/bench_classic_schedules.py [--sizes 10,100,1000,10000] [--baseline SRC]
                                            [--baseline-up-to 100]
                                            [--out bench/results/classic_schedules.txt]

A schedule of n steps, each a Poisson-sampled Gaussian (q = 0.01) with its own noise multiplier
(geometric from 2 down to 1), is composed into ``ClassicAccountant()`` and epsilon(1e-6) is
asked; each size runs in a fresh process: the first query, and the median of 3 (each on a new
accountant: the later ones find the per-step calibrations of the first in the module's cache).
The accountant minimises over the split of delta between the per-step Gaussian calibrations and
the composition theorem's slack (some 60 splits), and every split calibrates every distinct
noise multiplier. ``--baseline SRC`` runs the same in processes that import dpsharp from the
directory SRC (e.g. an older checkout's ``python/`` with its compiled ``_core``) for sizes up to
``--baseline-up-to``, and reports the ratio and whether the two answers are the same float.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _results import write_lines

#: Run in a child: the dpsharp package of the directory given first (past an editable
#: install's import hook, which would otherwise pick the installed checkout).
_CHILD = """import json, sys, time
root = sys.argv[1]
if root:
    sys.meta_path[:] = [f for f in sys.meta_path if 'Redirecting' not in type(f).__name__]
    sys.path.insert(0, root)
import numpy as np
from dpsharp import ClassicAccountant, Gaussian, PoissonSampled
steps = int(sys.argv[2])
sigmas = [float(s) for s in np.geomspace(2.0, 1.0, steps)]
times, value = [], None
for _ in range(3):
    accountant = ClassicAccountant()
    for sigma in sigmas:
        accountant.compose(PoissonSampled(Gaussian(sigma), 0.01))
    start = time.perf_counter()
    value = accountant.epsilon(1e-6)
    times.append(time.perf_counter() - start)
print(json.dumps({"epsilon": value, "first": times[0], "seconds": sorted(times)[1]}))
"""


def run(source: str, steps: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, source, str(steps)], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--baseline-up-to", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "classic_schedules.txt"))
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# python {' '.join(sys.argv)}",
             f"# q=0.01, sigma geometric 2 -> 1, delta=1e-6; first and median of 3 queries per "
             f"process; "
             f"load average at start {load:.1f} on {os.cpu_count()} CPUs"]
    for steps in (int(size) for size in args.sizes.split(",")):
        ours = run("", steps)
        line = (f"steps={steps:6d} epsilon={ours['epsilon']:.10g} "
                f"first query={ours['first']:.3f}s median={ours['seconds']:.3f}s")
        if args.baseline and steps <= args.baseline_up_to:
            theirs = run(args.baseline, steps)
            same = "same float" if theirs["epsilon"] == ours["epsilon"] else (
                f"DIFFERENT: {theirs['epsilon']!r}")
            line += (f" | baseline first={theirs['first']:.3f}s "
                     f"(x{theirs['first'] / ours['first']:.1f}) median={theirs['seconds']:.3f}s "
                     f"(x{theirs['seconds'] / ours['seconds']:.1f}), {same}")
        print(line, flush=True)
        lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
