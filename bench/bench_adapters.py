"""dpsharp's drop-in adapters against the peer they replace, on the peers' own test settings.

Usage (from the repository root)::

    python bench/bench_adapters.py            # every setting, 3 alternating rounds
    python bench/bench_adapters.py --rounds 1 --write   # and rewrite bench/results/adapters.md
    python bench/bench_adapters.py --suite prv_accountant --write   # only those rows rewritten

Each setting runs the same call through dpsharp's adapter and through the peer, in this
process, alternating (adapter, peer, adapter, peer, ...; a call shorter than MIN_SPAN = 0.1 s is
repeated within its sample until the sample spans 0.1 s, on either side); the table reports the
median time of each, their ratio and both answers (the adapter's is a certified upper bound). The settings
are taken from the peers' own test files: Opacus' accountants_test.py (sigma 1.5, q 0.04, 2250
steps, fed one step at a time; its get_noise_multiplier tests), prv-accountant's tests
(test_invariance_max_compositions, its README composition, the analytic Gaussian, find_noise_
multiplier of test_dpsgd.py) and dp-accounting's PLD and RDP tests.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "adapters.md"

Case = tuple[str, str, Callable[[], Any], Callable[[], Any]]


def _opacus_cases() -> list[Case]:
    import opacus.accountants as peer
    from opacus.accountants.utils import get_noise_multiplier as peer_calibrate

    from dpsharp.compat import opacus as ours
    from dpsharp.rdp import clear_curve_cache

    sigma, q, steps, delta = 1.5, 0.04, int(90 / 0.04), 1e-5

    def feed(cls: Any, every: int = 0) -> Callable[[], float]:
        def run() -> float:
            if cls.__module__.startswith("dpsharp"):
                clear_curve_cache()  # each call a first query: no RDP curve from the last one
            acc = cls()
            for step in range(steps):
                acc.step(noise_multiplier=sigma, sample_rate=q)
                if every and step % every == every - 1:
                    acc.get_epsilon(delta)
            return float(acc.get_epsilon(delta))
        return run

    def calibrate(function: Callable[..., float], accountant: str) -> Callable[[], float]:
        def run() -> float:
            if function.__module__.startswith("dpsharp"):
                clear_curve_cache()  # each call a fresh search (curves cached within it only)
            return float(function(target_epsilon=8.0, target_delta=delta, sample_rate=q,
                                  epochs=90, accountant=accountant))
        return run

    return [
        ("opacus", "RDPAccountant, 2250 steps then get_epsilon", feed(ours.RDPAccountant),
         feed(peer.RDPAccountant)),
        ("opacus", "PRVAccountant (dpsharp: PLDAccountant), 2250 steps then get_epsilon",
         feed(ours.PLDAccountant), feed(peer.PRVAccountant)),
        ("opacus", "PRV/PLD, 2250 steps, get_epsilon every 250 steps (a training loop)",
         feed(ours.PLDAccountant, 250), feed(peer.PRVAccountant, 250)),
        ("opacus", "get_noise_multiplier(accountant='rdp'), epsilon 8, 90 epochs",
         calibrate(ours.get_noise_multiplier, "rdp"), calibrate(peer_calibrate, "rdp")),
        ("opacus", "get_noise_multiplier(accountant='prv'), epsilon 8, 90 epochs",
         calibrate(ours.get_noise_multiplier, "prv"), calibrate(peer_calibrate, "prv")),
    ]


def _prv_cases(full: bool) -> list[Case]:
    import prv_accountant as peer
    from prv_accountant import dpsgd as peer_dpsgd

    from dpsharp.compat import prv_accountant as ours

    def invariance(lib: Any) -> Callable[[], float]:
        def run() -> float:
            prv = lib.PoissonSubsampledGaussianMechanism(sampling_probability=256 / 100000,
                                                         noise_multiplier=0.9)
            acc = lib.PRVAccountant(prvs=[prv], max_self_compositions=[4900], eps_error=0.1,
                                    delta_error=1e-8)
            return acc.compute_epsilon(delta=1e-5, num_self_compositions=[4900])[2]
        return run

    def readme(lib: Any) -> Callable[[], float]:
        def run() -> float:
            prvs = [lib.PoissonSubsampledGaussianMechanism(noise_multiplier=0.8,
                                                           sampling_probability=5e-3),
                    lib.GaussianMechanism(noise_multiplier=8.0), lib.LaplaceMechanism(mu=0.1)]
            acc = lib.PRVAccountant(prvs=prvs, max_self_compositions=[1000] * 3, eps_error=0.1,
                                    delta_error=1e-10)
            return acc.compute_epsilon(delta=1e-6, num_self_compositions=[100, 200, 100])[2]
        return run

    def analytic(lib: Any) -> Callable[[], float]:
        def run() -> float:
            prv = lib.PoissonSubsampledGaussianMechanism(sampling_probability=1.0,
                                                         noise_multiplier=100.0)
            acc = lib.PRVAccountant(prvs=[prv], max_self_compositions=[10000], eps_error=0.1,
                                    delta_error=1e-10)
            return acc.compute_delta(1.0, [10000])[2]
        return run

    def dpsgd(lib: Any) -> Callable[[], float]:
        def run() -> float:
            acc = lib.DPSGDAccountant(noise_multiplier=0.8, sampling_probability=5e-3,
                                      max_steps=1000, eps_error=0.1, delta_error=1e-10)
            return acc.compute_epsilon(delta=1e-6, num_steps=1000)[2]
        return run

    def find(module: Any) -> Callable[[], float]:
        return lambda: float(module.find_noise_multiplier(2e-3, 10_000, 4.0, 1e-7))

    cases: list[Case] = [
        ("prv_accountant", "PRVAccountant q 256/1e5, sigma 0.9, 4900 steps (invariance test)",
         invariance(ours), invariance(peer)),
        ("prv_accountant", "README: subsampled Gaussian + Gaussian + Laplace",
         readme(ours), readme(peer)),
        ("prv_accountant", "compute_delta, q 1, sigma 100, 10000 steps (analytic test)",
         analytic(ours), analytic(peer)),
        ("prv_accountant", "DPSGDAccountant sigma 0.8, q 5e-3, 1000 steps", dpsgd(ours),
         dpsgd(peer_dpsgd)),
    ]
    if full:
        cases.append(("prv_accountant", "find_noise_multiplier q 2e-3, 10000 steps, eps 4",
                      find(ours.dpsgd), find(peer_dpsgd)))
    return cases


def _dp_accounting_cases() -> list[Case]:
    import dp_accounting as peer

    import dpsharp.compat.dp_accounting as ours

    def compose(lib: Any, family: str, q: float, sigma: float, steps: int,
                delta: float) -> Callable[[], float]:
        def run() -> float:
            acc = lib.pld.PLDAccountant() if family == "pld" else lib.rdp.RdpAccountant()
            event = peer.SelfComposedDpEvent(
                peer.PoissonSampledDpEvent(q, peer.GaussianDpEvent(sigma)), steps)
            acc.compose(event)
            return float(acc.get_epsilon(delta))
        return run

    return [
        ("dp_accounting", "pld.PLDAccountant, q 0.1, sigma 1, 100 steps",
         compose(ours, "pld", 0.1, 1.0, 100, 1e-5), compose(peer, "pld", 0.1, 1.0, 100, 1e-5)),
        ("dp_accounting", "rdp.RdpAccountant, q 0.01, sigma 1, 1600 steps (its tree tests)",
         compose(ours, "rdp", 0.01, 1.0, 1600, 1e-6),
         compose(peer, "rdp", 0.01, 1.0, 1600, 1e-6)),
    ]


# Each timed sample repeats the call until it spans at least this long (wall clock), on both
# sides: on a shared machine a call of a millisecond or two is otherwise measured whole or
# with a preemption of several milliseconds in it, by chance, while a call of 0.2 s always
# carries its share; over similar spans both carry the same share of the load.
MIN_SPAN = 0.1


def measure(cases: list[Case], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for suite, name, ours, theirs in cases:
        times: dict[str, list[float]] = {"ours": [], "peer": []}
        answers: dict[str, Any] = {}
        for _ in range(rounds):
            for side, function in (("ours", ours), ("peer", theirs)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    calls, start = 0, time.perf_counter()
                    while calls == 0 or time.perf_counter() - start < MIN_SPAN:
                        answers[side] = function()
                        calls += 1
                    times[side].append((time.perf_counter() - start) / calls)
        ours_s, peer_s = statistics.median(times["ours"]), statistics.median(times["peer"])
        rows.append({"suite": suite, "setting": name, "ours_s": ours_s, "peer_s": peer_s,
                     "ratio": peer_s / ours_s, "ours": answers["ours"], "peer": answers["peer"]})
        print(f"{suite:15s} {name[:60]:60s} {1e3 * ours_s:9.1f} ms {1e3 * peer_s:9.1f} ms "
              f"{peer_s / ours_s:6.1f}x  {answers['ours']:.6g} vs {answers['peer']:.6g}",
              flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], command: str, rounds: int) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    lines = [
        "# dpsharp's drop-in adapters against the peers, on the peers' own test settings",
        "",
        f"Command: `{command}` ({rounds} alternating rounds, median times; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{load:.1f} at the end: the machine was shared, so only the ratios, measured in one "
        "process with the calls alternating, mean anything).",
        "",
        "Answers: epsilon (compute_delta: delta; get_noise_multiplier / find_noise_multiplier: "
        "sigma). dpsharp's epsilon is its certified upper bound; the peers' are estimates (PRV: "
        "the upper end of its error band).",
        "",
        "| suite | setting | dpsharp (ms) | peer (ms) | peer / dpsharp | dpsharp answer | "
        "peer answer |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row['suite']} | {row['setting']} | {1e3 * row['ours_s']:.1f} | "
            f"{1e3 * row['peer_s']:.1f} | {row['ratio']:.1f}x | {row['ours']:.6g} | "
            f"{row['peer']:.6g} |"
        )
    return "\n".join(lines) + "\n"


def merged(previous: str, rows: list[dict[str, Any]], suites: list[str], command: str,
           rounds: int) -> str:
    """``previous`` (the committed table) with the rows of ``suites`` replaced by ``rows``,
    each in the place of the first old row of its suite (new suites at the end), and a note
    saying which rows were rerun, by which command, when and at what load."""
    fresh = markdown(rows, command, rounds).splitlines()
    new_rows = {suite: [line for line in fresh if line.startswith(f"| {suite} |")]
                for suite in suites}
    lines: list[str] = []
    for line in previous.splitlines():
        suite = line.split("|")[1].strip() if line.startswith("| ") else ""
        if suite in new_rows:
            lines.extend(new_rows.pop(suite))  # the suite's rows, once, where they were
        elif not (suite in suites or line.startswith("Rows of " + ", ".join(suites) + " ")):
            if line or (lines and lines[-1]):  # no doubled blank line where a note was
                lines.append(line)
    for remaining in new_rows.values():
        lines.extend(remaining)
    note = fresh[2].replace("Command: ", f"Rows of {', '.join(suites)} rerun by ", 1)
    at = next(i for i, line in enumerate(lines) if line.startswith("Command: ")) + 1
    lines[at:at] = ["", note]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full", action="store_true",
                        help="also find_noise_multiplier (prv-accountant's takes ~30 s)")
    parser.add_argument("--suite", action="append",
                        choices=["opacus", "prv_accountant", "dp_accounting"])
    parser.add_argument("--write", action="store_true", help=f"write {RESULT}")
    args = parser.parse_args(argv)
    suites = args.suite or ["opacus", "prv_accountant", "dp_accounting"]
    cases: list[Case] = []
    if "opacus" in suites:
        cases += _opacus_cases()
    if "prv_accountant" in suites:
        cases += _prv_cases(args.full)
    if "dp_accounting" in suites:
        cases += _dp_accounting_cases()
    rows = measure(cases, args.rounds)
    command = "python bench/bench_adapters.py " + " ".join(argv if argv is not None
                                                             else sys.argv[1:])
    text = markdown(rows, command.strip(), args.rounds)
    if args.write and args.suite and RESULT.exists():  # the other suites' rows are kept
        RESULT.write_text(merged(RESULT.read_text(), rows, suites, command.strip(), args.rounds))
    elif args.write:
        RESULT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
