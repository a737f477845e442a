"""``dpsharp bench precision``: epsilon of a Poisson-subsampled Gaussian composed T times, from
every dpsharp accountant and the installed peers, with certified bounds, time and the gap to the
tightest certified upper bound.

For each setting (q, sigma, T, delta) and accountant a row holds: ``epsilon`` (the reported
number, ``guarantee(delta).epsilon``: for the tight accountant exactly what
``accountant("pld").epsilon(delta)`` and ``dpsharp epsilon`` report), ``epsilon_lower`` /
``epsilon_upper`` (proven bounds where the accountant gives them;
``epsilon_upper`` = ``epsilon`` for a certified accountant), ``certified``, ``seconds`` (one
fresh compose + query), and ``gap`` = epsilon - min over the setting's certified rows of
``epsilon_upper`` (0 for the tightest certified bound; negative for an approximation below it).
Peers' rows are named after their library (``dp_accounting.rdp``, ``prv_accountant``,
``opacus.prv``, ...). The default grid is the MNIST and Abadi et al. settings of
the papers (Abadi et al. 2016; Bu et al. 2020) plus three hard regimes.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpsharp._validation import require_count, require_positive_finite, require_real

__all__ = [
    "DEFAULT_GRID",
    "Setting",
    "load_grid",
    "markdown_document",
    "markdown_table",
    "run_precision",
    "write_outputs",
]


@dataclass(frozen=True)
class Setting:
    """One benchmark setting: Poisson sampling probability q, noise multiplier sigma, T steps."""

    name: str
    q: float
    sigma: float
    steps: int
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not (0.0 < self.q <= 1.0) or not math.isfinite(self.q):
            raise ValueError(f"q must be in (0, 1], got {self.q!r} (setting {self.name!r})")
        require_positive_finite("sigma", self.sigma)
        if int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps!r} (setting {self.name!r})")
        if not (0.0 < self.delta < 1.0):
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r} (setting {self.name!r})")


_MNIST_Q = 256 / 60000


def _epoch_steps(epochs: int, dataset_size: int = 60000, batch_size: int = 256) -> int:
    """ceil(E N / B), the steps of ``dpsharp epsilon --epochs E`` (as TF Privacy counts them),
    so that a setting here and the command's statement account the same run (60 epochs of
    MNIST are 14063 steps, not round()'s 14062)."""
    return -(-epochs * dataset_size // batch_size)

DEFAULT_GRID: tuple[Setting, ...] = (
    Setting("MNIST sigma=1.1 60 epochs", _MNIST_Q, 1.1, _epoch_steps(60)),
    Setting("MNIST sigma=0.7 45 epochs", _MNIST_Q, 0.7, _epoch_steps(45)),
    Setting("MNIST sigma=1.3 20 epochs", _MNIST_Q, 1.3, _epoch_steps(20)),
    Setting("Abadi q=0.01 sigma=4 T=1e4", 0.01, 4.0, 10_000),
    Setting("Abadi q=0.01 sigma=4 T=4e4", 0.01, 4.0, 40_000),
    Setting("hard q=0.02 sigma=0.5 T=5000", 0.02, 0.5, 5000),
    Setting("hard q=0.1 sigma=2 T=1000", 0.1, 2.0, 1000),
    Setting("hard q=0.001 sigma=0.8 T=1e5", 0.001, 0.8, 100_000),
)


def load_grid(path: str | Path) -> list[Setting]:
    """A user grid: a JSON list of objects with keys q, sigma, steps (or T), optional delta, name.

    Every field is checked before any setting runs, with a one-line error naming the entry and
    the field: q, sigma and delta must be JSON numbers (not strings or booleans), steps an
    integer (2.7 is refused, never truncated to 2; an integral number such as 1e4 is accepted),
    and an unknown key (a misspelt "delta" would silently mean the default) is refused."""
    try:
        items = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--grid: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"--grid: {str(path)!r} is not a JSON file: {exc}") from None
    if not isinstance(items, list) or not items:
        raise ValueError(f"--grid must be a non-empty JSON list of settings, got {type(items).__name__}")
    grid = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "q" not in item or "sigma" not in item or not ({"steps", "T"} & set(item)):
            raise ValueError(f"--grid entry {index} must have keys q, sigma and steps (or T); got {item!r}")
        unknown = sorted(set(item) - _GRID_KEYS)
        if unknown or {"steps", "T"} <= set(item):
            bad = unknown[0] if unknown else "T"
            raise ValueError(
                f"--grid entry {index}: unexpected key {bad!r}; the keys are q, sigma, steps "
                f"(or T), delta and name"
            )
        key = "steps" if "steps" in item else "T"
        where = f"--grid entry {index}"
        try:
            q = require_real("q", item["q"])
            sigma = require_real("sigma", item["sigma"])
            delta = require_real("delta", item.get("delta", 1e-5))
            steps = _grid_integer(key, item[key])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        name = item.get("name", f"q={q:g} sigma={sigma:g} T={steps}")
        grid.append(Setting(str(name), q, sigma, steps, delta))
    return grid


_GRID_KEYS = frozenset({"q", "sigma", "steps", "T", "delta", "name"})


def _grid_integer(name: str, value: Any) -> int:
    """A positive integer from a JSON number: an int, or a float with an integral value."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    return require_count(name, value, minimum=1)


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _dpsharp_rows(setting: Setting, names: list[str]) -> list[dict[str, Any]]:
    import dpsharp

    event = dpsharp.PoissonSampled(dpsharp.Gaussian(setting.sigma), setting.q)
    rows = []
    for name in names:
        acc = dpsharp.accountant(name)
        if not acc.supports(event):
            continue
        start = time.perf_counter()
        try:
            guarantee = acc.compose(event, setting.steps).guarantee(setting.delta)
        except (ValueError, ArithmeticError):
            continue
        seconds = time.perf_counter() - start
        eps = _finite(guarantee.epsilon)
        rows.append({"library": "dpsharp", "accountant": f"dpsharp.{name}", "epsilon": eps,
                     "epsilon_lower": _finite(guarantee.epsilon_lower),
                     "epsilon_upper": eps if guarantee.certified else None,
                     "certified": bool(guarantee.certified), "seconds": seconds})
    return rows


def _peer_rows(setting: Setting, peers: dict[str, Any]) -> list[dict[str, Any]]:
    import warnings

    rows = []
    for name, call in peers.items():
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():  # the peers' own deprecation/experimental warnings
                warnings.simplefilter("ignore")
                result = call(setting.q, setting.sigma, setting.steps, setting.delta)
        except Exception as exc:  # noqa: BLE001 - a peer's failure is a result, reported as such
            rows.append({"library": name.split(".")[0], "accountant": name, "epsilon": None,
                         "epsilon_lower": None, "epsilon_upper": None, "certified": False,
                         "seconds": time.perf_counter() - start, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows.append({"library": name.split(".")[0], "accountant": name, "epsilon": _finite(result.epsilon),
                     "epsilon_lower": _finite(result.epsilon_lower),
                     "epsilon_upper": _finite(result.epsilon_upper), "certified": result.certified,
                     "seconds": time.perf_counter() - start})
    return rows


def run_precision(
    grid: list[Setting] | tuple[Setting, ...] = DEFAULT_GRID,
    *,
    accountants: list[str] | None = None,
    peers: list[str] | None = None,
    use_peers: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the benchmark; returns ``{"settings": [...], "rows": [...], "skipped_peers": [...]}``.

    ``accountants``: dpsharp accountant names (default all registered); ``peers``: peer row
    names of :data:`dpsharp.bench.peers.PEERS` (default all installed); ``use_peers=False``
    runs dpsharp only.
    """
    import dpsharp
    from dpsharp.bench.peers import available_peers, skipped_peers

    names = accountants if accountants is not None else dpsharp.available()
    peer_calls = available_peers(peers) if use_peers else {}
    rows: list[dict[str, Any]] = []
    for setting in grid:
        if progress:
            print(f"  {setting.name}", file=sys.stderr, flush=True)
        found = _dpsharp_rows(setting, names) + _peer_rows(setting, peer_calls)
        uppers = [r["epsilon_upper"] for r in found if r["certified"] and r["epsilon_upper"] is not None]
        tightest = min(uppers) if uppers else None
        for row in found:
            row.update({"setting": setting.name, "q": setting.q, "sigma": setting.sigma,
                        "steps": setting.steps, "delta": setting.delta,
                        "tightest_certified_upper": tightest,
                        "gap": None if (tightest is None or row["epsilon"] is None) else row["epsilon"] - tightest})
        rows.extend(found)
    return {"settings": [asdict(s) for s in grid], "rows": rows,
            "skipped_peers": skipped_peers() if use_peers else ["(peers disabled)"]}


_COLUMNS = ["setting", "q", "sigma", "steps", "delta", "library", "accountant", "epsilon",
            "epsilon_lower", "epsilon_upper", "certified", "gap", "seconds"]


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else f"{value:.{digits}f}"
    return str(value)


def markdown_table(results: dict[str, Any]) -> str:
    """One row per setting and accountant (results.md)."""
    lines = ["| setting | accountant | epsilon | lower | upper | certified | gap to tightest | seconds |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in results["rows"]:
        lines.append(f"| {r['setting']} | {r['accountant']} | {_cell(r['epsilon'])} | {_cell(r['epsilon_lower'])} | "
                     f"{_cell(r['epsilon_upper'])} | {_cell(r['certified'])} | {_cell(r['gap'])} | "
                     f"{r['seconds']:.3g} |")
    return "\n".join(lines) + "\n"


def markdown_document(results: dict[str, Any]) -> str:
    """results.md: a title, which peers were skipped, and :func:`markdown_table`."""
    skipped = ", ".join(results["skipped_peers"]) or "none"
    return ("# Accountant precision: Poisson-subsampled Gaussian, T steps\n\n"
            "gap = epsilon - the smallest certified upper bound of the setting. Peers skipped: "
            f"{skipped}.\n\n" + markdown_table(results))


def write_outputs(results: dict[str, Any], output: str | Path, *, plots: bool = True) -> list[Path]:
    """Write results.json, results.csv, results.md (and precision.png) to ``output``."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.csv", out / "results.md"]
    written[0].write_text(json.dumps(results, indent=2))
    with written[1].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results["rows"])
    written[2].write_text(markdown_document(results))
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return written
        written.append(_plot(results, out / "precision.png"))
    return written


#: Marker shapes of the precision figure, one per series together with a distinct colour.
_MARKERS = ("o", "s", "D", "^", "v", "<", ">", "P", "X", "*", "h", "p", "d", "8", "H", "1")


#: x range of the precision panel (epsilon / tightest certified upper bound).
_RATIO_AXIS = (0.8, 3.0)


def precision_figure(results: dict[str, Any]) -> Any:
    """The figure of precision.png: per setting, each accountant's epsilon / the tightest
    certified upper bound (left) and its time (right). Each series has its own colour (tab20,
    then hsv where there are more than 20) and marker, in a legend outside the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    settings = [s["name"] for s in results["settings"]]
    accountants = sorted({r["accountant"] for r in results["rows"]})
    figure = Figure(figsize=(13, 0.5 * len(settings) + 3), layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, sharey=True)
    colours = _distinct_colours(len(accountants))
    for index, name in enumerate(accountants):
        ys, gaps, secs = [], [], []
        for row in results["rows"]:
            if row["accountant"] == name and row["gap"] is not None:
                ys.append(settings.index(row["setting"]) + (index - len(accountants) / 2) * 0.05)
                gaps.append(row["epsilon"] / row["tightest_certified_upper"])
                secs.append(row["seconds"])
        off_scale = [g for g in gaps if g > _RATIO_AXIS[1]]
        label = name + (f" (off scale: up to {max(off_scale):.3g}x, drawn at the edge)"
                        if off_scale else "")
        style = {"label": label, "s": 26, "color": colours[index],
                 "marker": _MARKERS[index % len(_MARKERS)], "gid": name}
        # a bound thousands of times the tightest (classic composition) would squeeze the
        # others, all within a few per cent to a factor 2, into one column: it is drawn at
        # the right edge and its legend entry says how far off it is
        left.scatter([min(g, _RATIO_AXIS[1]) for g in gaps], ys, clip_on=False, **style)
        right.scatter(secs, ys, **style)
    left.set_xscale("log")
    left.set_xlim(*_RATIO_AXIS)
    left.axvline(1.0, color="0.6", linewidth=0.8)
    left.set_xlabel("epsilon / tightest certified upper bound (log scale)")
    ticks = [0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0]
    left.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    left.minorticks_off()
    right.set_xscale("log")
    right.set_xlabel("seconds (compose + query)")
    left.set_yticks(range(len(settings)), settings)
    for axes in (left, right):
        axes.grid(True, which="major", alpha=0.3)
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    deltas = sorted({s.get("delta", 1e-5) for s in results["settings"]})
    figure.suptitle("Accountant precision and time, delta = "
                    + ", ".join(f"{d:g}" for d in deltas))
    return figure


def _distinct_colours(count: int) -> list[Any]:
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        # tab20's dark shades first, then the light ones: neighbours in the legend differ most
        order = [2 * i for i in range(10)] + [2 * i + 1 for i in range(10)]
        return [colormaps["tab20"](order[i]) for i in range(count)]
    return [colormaps["hsv"](i / count) for i in range(count)]


def _plot(results: dict[str, Any], path: Path) -> Path:
    precision_figure(results).savefig(path, dpi=110)
    return path
