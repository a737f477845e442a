"""Incremental accounting: the tight accountant's epsilon after every step of a run (what a
budget check does), against fresh compositions of the same ledger.

    python bench/bench_pld_incremental.py [--steps 2000] [--check-every 100] [--check-first 40]
                                          [--out bench/results/pld_incremental.txt] [--profile]
                                          [--against OTHER/python --rounds 3]

One accountant composes ``PoissonSampled(Gaussian(1.0), 0.01)`` one step at a time and is asked
epsilon(1e-5) after each step; the time per step (compose + query) is reported for the whole run,
for the first 10 steps, and per quarter, in wall-clock and in this process's CPU time (the
machine is shared: CPU time is the steadier of the two). At every one of the first
``--check-first`` steps (short compositions, whose grid is refined per bucket of step counts),
every ``--check-every`` steps and at the last, a fresh accountant composes the same number of
steps at once: its answer must equal the incremental one bit for bit, and its query time gives
the ratio fresh / incremental per step (shown for the first step of each bucket, every tenth
check and any difference).
``--profile`` runs the loop under cProfile and appends where a step's time goes (the functions
with the most own time, grouped: transforms, epsilon searches, discretisation, the rest).
``--against DIR`` also times the same loop with the dpsharp package found in DIR (e.g. the
``python`` folder of another checkout with its extension built), each version in its own
process, alternating for ``--rounds`` rounds, and reports the CPU time of each (the ratio is
what a loaded machine still measures fairly).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

from _results import write_lines
from dpsharp import Gaussian, PLDAccountant, PoissonSampled

DELTA = 1e-5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--check-every", type=int, default=100)
    parser.add_argument("--check-first", type=int, default=40)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--q", type=float, default=0.01)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "pld_incremental.txt"))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--against", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop_only:  # (a child of --against: the loop alone, its CPU times on stdout)
        print(*_loop(PoissonSampled(Gaussian(args.sigma), args.q), args.steps))
        return
    event = PoissonSampled(Gaussian(args.sigma), args.q)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# python {' '.join(sys.argv)}",
             f"# q={args.q} sigma={args.sigma} delta={DELTA}; load average at start {load:.1f} "
             f"on {os.cpu_count()} CPUs"]

    accountant = PLDAccountant()
    per_step: list[float] = []
    cpu: list[float] = []
    answers: dict[int, float] = {}
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    for step in range(1, args.steps + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        accountant.compose(event)
        answers[step] = accountant.epsilon(DELTA)
        per_step.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    if profile is not None:
        profile.disable()
    total = sum(per_step)
    lines.append(f"incremental: {args.steps} steps, epsilon after each: total {total:.3f}s, "
                 f"{total / args.steps * 1e3:.3f} ms per step amortised (CPU "
                 f"{sum(cpu) / args.steps * 1e3:.3f} ms); final epsilon {answers[args.steps]:.6f}")
    quarter = max(args.steps // 4, 1)
    first = min(10, args.steps)
    for begin, end in [(0, first)] + [(b, min(b + quarter, args.steps))
                                      for b in range(0, args.steps, quarter)]:
        chunk, chunk_cpu = per_step[begin:end], cpu[begin:end]
        lines.append(f"  steps {begin + 1:5d}-{end:5d}: {sum(chunk) / len(chunk) * 1e3:.3f} ms "
                     f"per step (CPU {sum(chunk_cpu) / len(chunk) * 1e3:.3f} ms)")
    checks = sorted({*range(1, min(args.check_first, args.steps) + 1),
                     *range(args.check_every, args.steps + 1, args.check_every), args.steps})
    mismatches = 0
    for step in checks:
        start = time.perf_counter()
        fresh = PLDAccountant().compose(event, step).epsilon(DELTA)
        seconds = time.perf_counter() - start
        same = fresh == answers[step]
        mismatches += not same
        shown = step > args.check_first and (step % (10 * args.check_every) == 0
                                             or step == args.steps)
        if shown or not same or step in (1, 2, 3, 5, 9, 17, 33):
            lines.append(f"  step {step:5d}: fresh {fresh:.9f} in {seconds * 1e3:.1f} ms "
                         f"({seconds / per_step[step - 1]:.1f}x the incremental step); "
                         f"{'equal' if same else 'DIFFERENT: ' + repr(answers[step])}")
    lines.append(f"answers equal to a fresh composition: {len(checks) - mismatches} of "
                 f"{len(checks)} checked")
    if profile is not None:
        lines.extend(_profile_lines(profile, args.steps))
    if args.against:
        lines.extend(_against(args))
    print("\n".join(lines))
    write_lines(args.out, lines)
    if mismatches:
        raise SystemExit(1)


def _loop(event: object, steps: int) -> tuple[float, float, float]:
    """CPU seconds of a query after every step: (all steps, the first 500, the rest)."""
    accountant = PLDAccountant()
    start = time.process_time()
    first = 0.0
    for step in range(1, steps + 1):
        accountant.compose(event)  # type: ignore[arg-type]
        accountant.epsilon(DELTA)
        if step == min(500, steps):
            first = time.process_time() - start
    total = time.process_time() - start
    return total, first, total - first


#: Run in a child: the dpsharp package of the directory given first on the command line, past
#: an editable install's import hook (which would otherwise pick the installed checkout).
_CHILD = """import runpy, sys
root, sys.argv = sys.argv[1], sys.argv[2:]
sys.meta_path[:] = [f for f in sys.meta_path if 'Redirecting' not in type(f).__name__]
sys.path.insert(0, root)
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def _against(args: argparse.Namespace) -> list[str]:
    """The loop's CPU time with the installed package and with the one in ``args.against``,
    alternating, each in its own process."""
    command = [os.path.abspath(__file__), "--loop-only", "--steps", str(args.steps),
               "--sigma", str(args.sigma), "--q", str(args.q)]
    lines = [f"against {args.against} (CPU s of {args.steps} steps: all / first 500 / rest; "
             f"alternating, one process each):"]
    for round_ in range(1, args.rounds + 1):
        for name in ("other", "this"):
            child = (["-c", _CHILD, args.against] if name == "other" else []) + command
            out = subprocess.run([sys.executable, *child], capture_output=True, text=True,
                                 check=True).stdout.split()
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            lines.append(f"  round {round_} {name:5s}: "
                         + " / ".join(f"{float(v):.2f}" for v in out) + f"  (load {load:.1f})")
    return lines


#: Groups of the profile summary, by function name.
_GROUPS = {
    "transforms": ("pld_certified_rfft", "pld_certified_irfft", "pld_certified_band_dft",
                   "pld_certified_rfft_pair"),
    "epsilon searches": ("pld_band_crossing", "pld_delta_crossing", "pld_band_suffix_sums"),
    "discretisation": ("pld_discretize", "pld_discretize_many", "pld_log_mgf"),
}


def _profile_lines(profile: cProfile.Profile, steps: int) -> list[str]:
    """Own time per step of each group and of the functions with the most own time."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = [(own, calls, name, path) for (path, _, name), (_, calls, own, _, _) in stats.items()]
    total = sum(own for own, *_ in rows)
    lines = [f"profile (cProfile, own time; {total / steps * 1e3:.3f} ms per step under it):"]
    grouped = {group: 0.0 for group in _GROUPS}
    for own, _, name, _ in rows:
        for group, names in _GROUPS.items():
            if any(member in name for member in names):
                grouped[group] += own
    rest = total - sum(grouped.values())
    for group, own in [*grouped.items(), ("Python and NumPy bookkeeping", rest)]:
        lines.append(f"  {group:30s} {own / steps * 1e6:8.1f} us per step "
                     f"({own / total:5.1%})")
    lines.append("  top functions by own time:")
    for own, calls, name, path in sorted(rows, reverse=True)[:12]:
        where = os.path.basename(path) if path != "~" else "builtin"
        lines.append(f"    {own / steps * 1e6:8.1f} us per step  {calls:7d} calls  "
                     f"{where}:{name}")
    return lines


if __name__ == "__main__":
    main()
