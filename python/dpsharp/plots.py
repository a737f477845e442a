"""Figures for privacy statements: epsilon against epochs per accountant (as in Abadi et al.
2016, Figure 2, and Yu et al. 2019, Figure 2) and the trade-off curve of a composition next to
G_mu and the (epsilon, delta) curves (Bu et al. 2020, Figure 3).

matplotlib is an optional extra (``pip install "dpsharp[plot]"``), imported only when a figure
is drawn. The functions build a :class:`matplotlib.figure.Figure` without pyplot (no global
state, no GUI backend), optionally save it, and return it so its line data can be inspected.
Every plotted number is passed in: the numbers come from the accountants
(see :mod:`dpsharp._report`), not from this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsharp._validation import require_delta, require_real_array

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["MatplotlibMissingError", "epsilon_vs_epochs", "tradeoff_curves"]


class MatplotlibMissingError(ImportError):
    """Plotting was asked for but matplotlib is not installed."""


def _new_figure(width: float = 6.4, height: float = 4.8) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MatplotlibMissingError(
            "plotting needs matplotlib, an optional extra: pip install \"dpsharp[plot]\" "
            f"(or pip install matplotlib); import failed with: {exc}"
        ) from exc
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str | Path | None) -> None:
    if path is not None:
        figure.savefig(Path(path), dpi=120)


def epsilon_vs_epochs(
    series: Mapping[str, tuple[Any, Any]],
    *,
    delta: float,
    certified: Mapping[str, bool] | None = None,
    title: str | None = None,
    yscale: str = "auto",
    path: str | Path | None = None,
) -> Figure:
    """epsilon(delta) against epochs, one line per accountant.

    Parameters
    ----------
    series
        accountant name -> (epochs, epsilons), equal-length arrays.
    delta
        The delta of every point (shown on the axis label).
    certified
        accountant name -> whether its numbers are certified upper bounds; approximations are
        drawn dashed and labelled "(approx.)".
    title, path
        Optional title; if ``path`` is given the figure is written there (format from suffix).
    yscale
        ``"linear"``, ``"log"`` or ``"auto"``: log where the series' final values differ by
        more than :data:`LOG_SCALE_RATIO` (one bound far above the others, e.g. the classic
        composition theorem's, would otherwise press every other line into a band near 0),
        linear otherwise.

    Returns
    -------
    matplotlib.figure.Figure
        One axes; its lines carry the accountant names as labels (``line.get_label()``) and
        the exact data passed in (``line.get_xdata()``, ``line.get_ydata()``).
    """
    if yscale not in ("auto", "linear", "log"):
        raise ValueError(f"yscale must be 'auto', 'linear' or 'log', got {yscale!r}")
    delta = require_delta(delta)
    certified = certified or {}
    figure = _new_figure()
    axes = figure.add_subplot()
    for name, (xs, ys) in series.items():
        exact = certified.get(name, True)
        axes.plot(
            np.asarray(xs, dtype=float),
            np.asarray(ys, dtype=float),
            linestyle="-" if exact else "--",
            marker="." if len(xs) <= 60 else None,
            label=name if exact else f"{name} (approx.)",
            gid=name,
        )
    if yscale == "auto":
        yscale = _auto_scale([ys for _, ys in series.values()])
    axes.set_yscale(yscale)
    axes.set_xlabel("epochs")
    axes.set_ylabel(f"epsilon at delta = {delta!r}" + (" (log scale)" if yscale == "log" else ""))
    axes.set_title(title or "privacy loss against epochs")
    axes.grid(True, which="both" if yscale == "log" else "major", alpha=0.3)
    if series:
        axes.legend()
    _save(figure, path)
    return figure


#: :func:`epsilon_vs_epochs` draws on a log axis where the largest final epsilon exceeds the
#: smallest by more than this factor.
LOG_SCALE_RATIO = 10.0


def _auto_scale(columns: list[Any]) -> str:
    finals = []
    for ys in columns:
        values = np.asarray(ys, dtype=float)
        values = values[np.isfinite(values) & (values > 0.0)]
        if values.size:
            finals.append(values[-1])
    if len(finals) >= 2 and max(finals) > LOG_SCALE_RATIO * min(finals):
        return "log"
    return "linear"


#: :func:`tradeoff_curves` leaves out (and names in the legend) a curve other than the first
#: whose every point lies this close to an axis: min(alpha, beta) < ON_AXES at every alpha.
ON_AXES = 0.005


def tradeoff_curves(
    curves: Mapping[str, Any],
    *,
    alphas: Any,
    title: str | None = None,
    note: str | None = None,
    not_drawn: Sequence[str] = (),
    path: str | Path | None = None,
) -> Figure:
    """Trade-off curves beta = f(alpha) (type II against type I error, Dong, Roth, Su 2019).

    Parameters
    ----------
    curves
        label -> beta values at ``alphas`` (e.g. the composition's certified curve,
        G_mu for the certified mu where it is informative and the CLT mu, f_{eps,delta}).
        A label should say what its curve is (certified bound or approximation).
    alphas
        Type I errors in [0, 1].
    note
        Optional text drawn under the axes.
    not_drawn
        Legend entries (no line, ``gid="not drawn"``) for curves deliberately left out, each
        saying which and why: e.g. G_mu for a certified mu so large that its curve would lie
        on the axes and look like a statement.

    Returns
    -------
    matplotlib.figure.Figure
        One square axes with the identity line (perfect privacy, ``gid="identity"``) and one
        line per curve with ``gid`` = its label; the first curve is drawn on top. A curve
        after the first that lies on the axes (:data:`ON_AXES`) is not drawn; its legend entry
        says so.
    """
    alphas = require_real_array("alphas", alphas)
    if np.any((alphas < 0.0) | (alphas > 1.0)):
        raise ValueError("alphas must lie in [0, 1]")
    figure = _new_figure(5.6, 5.6)
    axes = figure.add_subplot()
    axes.plot([0.0, 1.0], [1.0, 0.0], color="0.7", linewidth=0.8, gid="identity", label="_perfect privacy")
    not_drawn = list(not_drawn)
    for index, (label, betas) in enumerate(curves.items()):
        betas = np.asarray(betas, dtype=float)
        if index > 0 and float(np.max(np.minimum(alphas, betas))) < ON_AXES:
            # within ON_AXES of the axes everywhere (an (epsilon, delta) curve of epsilon >= 5.3,
            # whose corner is alpha = beta = (1 - delta) / (1 + e^epsilon); G_mu of a large mu),
            # it would be indistinguishable from the axes and read as a statement: named instead
            not_drawn.append(f"{label}: not drawn, on the axes")
            continue
        # the first curve (the composition's own) is drawn on top, thicker, so that curves that
        # coincide with it (a good CLT approximation) do not hide it
        axes.plot(alphas, betas, label=label, gid=label,
                  linewidth=2.6 if index == 0 else 1.4, zorder=3 if index == 0 else 2,
                  alpha=0.8 if index == 0 else 1.0)
    axes.set_xlim(0.0, 1.0)
    axes.set_ylim(0.0, 1.0)
    axes.set_aspect("equal")
    axes.set_xlabel("type I error")
    axes.set_ylabel("type II error")
    axes.set_title(title or "trade-off curve of the composition")
    axes.grid(True, alpha=0.3)
    for text in not_drawn:
        axes.plot([], [], linestyle="none", label=text, gid="not drawn")
    axes.legend(fontsize="small", loc="upper right")
    if note:
        figure.text(0.5, 0.005, note, ha="center", va="bottom", fontsize="x-small", color="0.3",
                    gid="note", wrap=True)
        figure.get_layout_engine().set(rect=(0.0, 0.06, 1.0, 0.94))
    _save(figure, path)
    return figure
