"""``dpsharp bench speed``: accountant query time against the peers, in one run.

Two sweeps of a Poisson-subsampled Gaussian (q = 0.01, delta = 1e-5): (1) T from 10^3 to 10^7
at sigma = 1 (one distinct event composed T times); (2) k distinct sigmas (evenly spaced in
[0.8, 2], T / k steps each, T = 10^4), the case where accountants cannot use self-composition
alone. Each (accountant, point) is timed ``repeats`` times from a fresh accountant (compose +
epsilon query); the report gives the median, the spread (min and max) and the ratio of each
peer's median to dpsharp's tight accountant (``pld``) measured in the same run. A call that
exceeds ``budget_seconds`` is not repeated and larger points of that accountant are skipped.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["run_speed", "write_outputs"]

Q = 0.01
DELTA = 1e-5


def _dpsharp(name: str) -> Callable[[list[tuple[float, int]]], float]:
    def run(parts: list[tuple[float, int]]) -> float:
        import dpsharp

        acc = dpsharp.accountant(name)
        for sigma, steps in parts:
            acc.compose(dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), Q), steps)
        return float(acc.epsilon(DELTA))

    return run


def _dp_accounting(kind: str) -> Callable[[list[tuple[float, int]]], float]:
    def run(parts: list[tuple[float, int]]) -> float:
        import dp_accounting

        acc = (dp_accounting.rdp.RdpAccountant() if kind == "rdp"
               else dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3))
        for sigma, steps in parts:
            acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)), steps)
        return float(acc.get_epsilon(DELTA))

    return run


def _prv(parts: list[tuple[float, int]]) -> float:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    prvs = [PoissonSubsampledGaussianMechanism(sampling_probability=Q, noise_multiplier=s) for s, _ in parts]
    acc = PRVAccountant(prvs=prvs, max_self_compositions=[n for _, n in parts], eps_error=0.01, delta_error=DELTA * 1e-3)  # prv_accountant.Accountant's default delta_error
    return float(acc.compute_epsilon(delta=DELTA, num_self_compositions=[n for _, n in parts])[2])


def _opacus(kind: str) -> Callable[[list[tuple[float, int]]], float]:
    def run(parts: list[tuple[float, int]]) -> float:
        from opacus.accountants import PRVAccountant, RDPAccountant

        acc = RDPAccountant() if kind == "rdp" else PRVAccountant()
        acc.history = [(sigma, Q, steps) for sigma, steps in parts]
        return float(acc.get_epsilon(DELTA))

    return run


def _contenders(use_peers: bool) -> dict[str, Callable[[list[tuple[float, int]]], float]]:
    import importlib.util

    import dpsharp

    out = {f"dpsharp.{n}": _dpsharp(n) for n in ("pld", "rdp") if n in dpsharp.available()}
    if not use_peers:
        return out
    if importlib.util.find_spec("dp_accounting"):
        out["dp_accounting.rdp"] = _dp_accounting("rdp")
        out["dp_accounting.pld(interval=0.001)"] = _dp_accounting("pld")
    if importlib.util.find_spec("prv_accountant"):
        out["prv_accountant"] = _prv
    if importlib.util.find_spec("opacus"):
        out["opacus.rdp"] = _opacus("rdp")
        out["opacus.prv"] = _opacus("prv")
    return out


def _import_peers(contenders: dict[str, Any]) -> None:
    """Import every contender's library before any clock starts."""
    import importlib

    modules = {"dpsharp": "dpsharp.accountants", "dp_accounting": "dp_accounting",
               "prv_accountant": "prv_accountant", "opacus": "opacus.accountants"}
    for name in contenders:
        importlib.import_module(modules[name.split(".")[0]])


def _time(call: Callable[[list[tuple[float, int]]], float], parts: list[tuple[float, int]],
          repeats: int, budget: float) -> dict[str, Any]:
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            value = call(parts)
        except Exception as exc:  # noqa: BLE001 - reported as the result
            return {"error": f"{type(exc).__name__}: {exc}"}
        times.append(time.perf_counter() - start)
        if times[-1] > budget:
            break
    return {"median": statistics.median(times), "min": min(times), "max": max(times),
            "repeats": len(times), "epsilon": value}


#: Per-call time budget (seconds) of a quick run and of a full one: a call over it is not
#: repeated and ends that contender's sweep (its larger points are skipped).
QUICK_BUDGET_SECONDS = 1.0
FULL_BUDGET_SECONDS = 20.0


def run_speed(*, quick: bool = False, use_peers: bool = True, repeats: int | None = None,
              budget_seconds: float | None = None, progress: bool = False) -> dict[str, Any]:
    """Time every contender on both sweeps; returns ``{"T": {...}, "sigmas": {...}}`` with, per
    sweep, the x values and per contender a list of timing records (median, min, max, repeats,
    epsilon), plus ``ratios`` (peer median / dpsharp.pld median, same run).

    ``quick`` (under a minute on 2 cores): T up to 10^5, k up to 16, 3 repeats and a budget
    of :data:`QUICK_BUDGET_SECONDS` per call (prv-accountant's and Opacus' PRV accountants,
    seconds at T = 10^4, are then timed once and stop there). Progress goes to stderr."""
    if budget_seconds is None:
        budget_seconds = QUICK_BUDGET_SECONDS if quick else FULL_BUDGET_SECONDS
    repeats = repeats or (3 if quick else 5)
    t_values = [10**3, 10**4, 10**5] if quick else [10**3, 10**4, 10**5, 10**6, 10**7]
    k_values = [1, 4, 16] if quick else [1, 4, 16, 64]
    contenders = _contenders(use_peers)
    _import_peers(contenders)  # a library's import time is not its query time
    sweeps: dict[str, Any] = {}
    #: per contender, the T at which the T sweep went over the budget: the sigma sweep (10^4
    #: steps in all) is not started for a contender already over budget at T <= 10^4
    over_at: dict[str, int] = {}
    for sweep, xs, parts_of in (
        ("T", t_values, lambda t: [(1.0, t)]),
        ("sigmas", k_values, lambda k: [(float(s), 10_000 // k) for s in np.linspace(0.8, 2.0, k)]),
    ):
        records: dict[str, list[dict[str, Any]]] = {}
        for name, call in contenders.items():
            records[name] = []
            slow = False
            if sweep == "sigmas" and over_at.get(name, 10**9) <= 10_000:
                records[name] = [{"skipped": f"over {budget_seconds:g} s at T = "
                                  f"{over_at[name]} in the T sweep"} for _ in xs]
                continue
            for x in xs:
                if slow:
                    records[name].append({"skipped": f"previous point over {budget_seconds:g} s"})
                    continue
                if progress:
                    print(f"  {sweep}={x} {name}", file=sys.stderr, flush=True)
                record = _time(call, parts_of(x), repeats, budget_seconds)
                slow = "error" in record or record["median"] > budget_seconds
                if slow and sweep == "T":
                    over_at[name] = x
                records[name].append(record)
        ratios = {}
        base = records.get("dpsharp.pld")
        if base is not None:
            for name, recs in records.items():
                ratios[name] = [
                    (r["median"] / b["median"]) if ("median" in r and "median" in b) else None
                    for r, b in zip(recs, base)
                ]
        sweeps[sweep] = {"x": xs, "records": records, "ratio_to_dpsharp_pld": ratios}
    return {"q": Q, "delta": DELTA, "quick": quick, "repeats": repeats,
            "budget_seconds": budget_seconds, "sweeps": sweeps}


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Accountant query time (q = {results['q']}, delta = {results['delta']:g}, "
             f"{results['repeats']} repeats; median [min, max] seconds; x = time / dpsharp.pld)\n"]
    for sweep, label in (("T", "T (sigma = 1)"), ("sigmas", "distinct sigmas (T = 10^4)")):
        data = results["sweeps"][sweep]
        lines.append(f"\n## {label}\n")
        lines.append("| accountant | " + " | ".join(str(x) for x in data["x"]) + " |")
        lines.append("| --- |" + " ---: |" * len(data["x"]))
        for name, recs in data["records"].items():
            ratios = data["ratio_to_dpsharp_pld"].get(name, [None] * len(recs))
            cells = []
            for rec, ratio in zip(recs, ratios):
                if "median" in rec:
                    cell = f"{rec['median']:.3g} [{rec['min']:.3g}, {rec['max']:.3g}]"
                    if ratio is not None:
                        cell += f" ({ratio:.2g}x)"
                else:
                    cell = "skipped" if "skipped" in rec else "error"
                cells.append(cell)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(results: dict[str, Any], output: str | Path) -> list[Path]:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(results, indent=2))
    (out / "speed.md").write_text(markdown(results))
    written = [out / "speed.json", out / "speed.md"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return written
    speed_figure(results).savefig(out / "speed.png", dpi=110)
    written.append(out / "speed.png")
    return written


def speed_figure(results: dict[str, Any]) -> Any:
    """The figure of speed.png: median time against T and against the number of distinct
    sigmas, log-log, one colour and marker per contender, with one legend below both axes
    (inside, it hid points)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 5.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2)
    names = list(dict.fromkeys(name for sweep in results["sweeps"].values()
                               for name in sweep["records"]))
    markers = ("o", "s", "D", "^", "v", "P", "X", "*", "h", "<", ">")
    for ax, sweep, label in ((axes[0], "T", "T (steps, sigma = 1)"),
                             (axes[1], "sigmas", "distinct sigmas (T = 10^4)")):
        data = results["sweeps"][sweep]
        for name, recs in data["records"].items():
            index = names.index(name)
            pts = [(x, r["median"]) for x, r in zip(data["x"], recs) if "median" in r]
            # every contender gets a (possibly empty) line, so the shared legend lists all
            ax.plot(*(zip(*pts) if pts else ([], [])), marker=markers[index % len(markers)],
                    color=colormaps["tab10"](index % 10), label=name, gid=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("seconds (median)")
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)),
                  fontsize=8)
    figure.suptitle(f"Accountant query time, q = {results['q']}, delta = {results['delta']:g} "
                    f"({results['repeats']} repeats)")
    return figure
