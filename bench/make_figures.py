"""Reproduce the papers' figures with dpsharp, each with dpsharp's tight (PLD) accountant
added (which none of the papers had), and write the data behind every figure as JSON.

    python bench/make_figures.py [--output bench/results/figures]

Figures (delta = 1e-5 unless stated):

* ``002_fig2.png``: Abadi et al. 2016, Figure 2: epsilon against epochs for q = 0.01,
  sigma = 4 (100 steps per epoch, 400 epochs): moments accountant (integer lambda <= 32) vs
  strong (advanced) composition of the amplified Gaussian, plus the tight accountant.
* ``000_fig2.png``: Bu et al. 2020, Figure 2: epsilon(delta) curves for MNIST,
  p = 256/60000, sigma = 0.7, 45 epochs: the CLT (mu-GDP) vs their moments accountant (RDP at
  their orders, classic conversion), plus the tight accountant.
* ``000_fig3.png``: Bu et al. 2020, Figure 3: trade-off curves of the same composition: the
  tight accountant's, G_mu at the CLT mu, and the (eps, delta) curve of the moments accountant.
* ``004_fig2.png``: Yu et al. 2019, Figure 2: epsilon against epochs for q = 0.01, sigma = 6,
  400 epochs: zCDP with random reshuffling (rho = epochs / (2 sigma^2)), zCDP with random
  sampling (their Theorem 3), the moments accountant and strong composition, plus the tight one.

``figures.json`` holds every curve's numbers; tests/test_figures.py checks them against
the numbers the papers printed, where they printed them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

import dpsharp
from dpsharp.accountants.gdp import BU_ET_AL_ORDERS

DELTA = 1e-5
MNIST_Q = 256 / 60000


def _curve(make: Any, event: Any, marks: list[int], delta: float = DELTA) -> list[float | None]:
    """epsilon after each prefix of ``marks`` steps, one fresh accountant per point."""
    out: list[float | None] = []
    for mark in marks:
        acc = make()
        if not acc.supports(event):
            return [None] * len(marks)
        eps = acc.compose(event, mark).epsilon(delta)
        out.append(float(eps) if math.isfinite(eps) else None)
    return out


def figure_002_fig2(epochs: list[int] | None = None) -> dict[str, Any]:
    q, sigma, per_epoch = 0.01, 4.0, 100
    epochs = epochs or [1, 5, 10, 25, 50, 100, 150, 200, 250, 300, 350, 400]
    marks = [e * per_epoch for e in epochs]
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), q)
    return {
        "q": q, "sigma": sigma, "delta": DELTA, "epochs": epochs, "steps": marks,
        "moments accountant": _curve(lambda: dpsharp.accountant("moments"), event, marks),
        "strong composition": _curve(lambda: dpsharp.accountant("classic", composition="advanced"), event, marks),
        "dpsharp tight (pld)": _curve(lambda: dpsharp.accountant("pld"), event, marks),
    }


def figure_000_fig2(epochs: int = 45) -> dict[str, Any]:
    sigma, steps = 0.7, round(epochs * 60000 / 256)
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), MNIST_Q)
    deltas = [float(d) for d in np.geomspace(1e-8, 1e-2, 25)]
    if DELTA not in deltas:
        deltas = sorted(deltas + [DELTA])
    gdp = dpsharp.accountant("gdp").compose(event, steps)
    ma = dpsharp.accountant("rdp", orders=BU_ET_AL_ORDERS, conversion="classic").compose(event, steps)
    pld = dpsharp.accountant("pld").compose(event, steps)
    return {
        "q": MNIST_Q, "sigma": sigma, "epochs": epochs, "steps": steps, "delta": deltas,
        "mu_clt": float(gdp.mu),
        "CLT (mu-GDP)": [float(gdp.epsilon(d)) for d in deltas],
        "moments accountant": [float(ma.epsilon(d)) for d in deltas],
        "dpsharp tight (pld)": [float(pld.epsilon(d)) for d in deltas],
    }


def figure_000_fig3(epochs: int = 45) -> dict[str, Any]:
    from dpsharp import tradeoff

    sigma, steps = 0.7, round(epochs * 60000 / 256)
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), MNIST_Q)
    alphas = np.linspace(0.0, 1.0, 201)
    pld = dpsharp.accountant("pld").compose(event, steps)
    mu = float(dpsharp.accountant("gdp").compose(event, steps).mu)
    eps_ma = float(dpsharp.accountant("rdp", orders=BU_ET_AL_ORDERS, conversion="classic")
                   .compose(event, steps).epsilon(DELTA))
    return {
        "q": MNIST_Q, "sigma": sigma, "epochs": epochs, "steps": steps, "alpha": alphas.tolist(),
        "mu_clt": mu, "epsilon_moments": eps_ma,
        "dpsharp tight (pld)": np.asarray(pld.tradeoff(alphas), dtype=float).tolist(),
        "G_mu (CLT)": np.asarray(tradeoff.gaussian_tradeoff(alphas, mu), dtype=float).tolist(),
        "moments accountant (eps, delta)": np.asarray(
            tradeoff.eps_delta_tradeoff(alphas, eps_ma, DELTA), dtype=float).tolist(),
    }


def figure_004_fig2(epochs: list[int] | None = None) -> dict[str, Any]:
    q, sigma, per_epoch = 0.01, 6.0, 100
    epochs = epochs or [1, 10, 25, 50, 100, 150, 200, 250, 300, 350, 400]
    marks = [e * per_epoch for e in epochs]
    sampled = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), q)
    # the paper's conversion: rho + 2 sqrt(rho log(1/delta)) (Bun and Steinke), epsilon_bun_steinke
    # random reshuffling: each epoch touches every example once: one Gaussian per epoch
    reshuffled = [float(dpsharp.accountant("zcdp").compose(dpsharp.Gaussian(sigma), e).epsilon_bun_steinke(DELTA))
                  for e in epochs]
    # random sampling: Theorem 3, P(q, sigma) = q^2 / sigma^2 per step (an approximation, per the paper)
    sampling = [float(dpsharp.accountant("zcdp", batching="sample").compose(sampled, m).epsilon_bun_steinke(DELTA))
                for m in marks]
    return {
        "q": q, "sigma": sigma, "delta": DELTA, "epochs": epochs, "steps": marks,
        "zCDP reshuffling": reshuffled,
        "zCDP sampling": sampling,
        "moments accountant": _curve(lambda: dpsharp.accountant("moments"), sampled, marks),
        "strong composition": _curve(lambda: dpsharp.accountant("classic", composition="advanced"), sampled, marks),
        "dpsharp tight (pld)": _curve(lambda: dpsharp.accountant("pld"), sampled, marks),
    }


def _plot_epochs(data: dict[str, Any], names: list[str], title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.6))
    for name in names:
        pts = [(e, v) for e, v in zip(data["epochs"], data[name]) if v is not None]
        if pts:
            axes.plot(*zip(*pts), marker=".", label=name, linewidth=2.4 if "tight" in name else 1.4)
    axes.set_xlabel("epoch")
    axes.set_ylabel(f"epsilon at delta = {data['delta']:g}")
    axes.set_yscale("log")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def make_all(output: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output.mkdir(parents=True, exist_ok=True)
    data = {"002_fig2": figure_002_fig2(), "000_fig2": figure_000_fig2(),
            "000_fig3": figure_000_fig3(), "004_fig2": figure_004_fig2()}
    d = data["002_fig2"]
    _plot_epochs(d, ["moments accountant", "strong composition", "dpsharp tight (pld)"],
                 "Abadi et al. Fig. 2: q = 0.01, sigma = 4", output / "002_fig2.png")
    d = data["004_fig2"]
    _plot_epochs(d, ["zCDP reshuffling", "zCDP sampling", "moments accountant", "strong composition",
                     "dpsharp tight (pld)"], "Yu et al. Fig. 2: q = 0.01, sigma = 6", output / "004_fig2.png")
    d = data["000_fig2"]
    figure, axes = plt.subplots(figsize=(6.4, 4.6))
    for name in ("CLT (mu-GDP)", "moments accountant", "dpsharp tight (pld)"):
        axes.plot(d["delta"], d[name], label=name, linewidth=2.4 if "tight" in name else 1.4)
    axes.set_xscale("log")
    axes.set_xlabel("delta")
    axes.set_ylabel("epsilon")
    axes.set_title(f"Bu et al. Fig. 2: MNIST, sigma = 0.7, {d['epochs']} epochs")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(output / "000_fig2.png", dpi=110)
    plt.close(figure)
    from dpsharp import plots

    d = data["000_fig3"]
    plots.tradeoff_curves(
        {"dpsharp tight (pld)": d["dpsharp tight (pld)"], f"G_mu, CLT mu = {d['mu_clt']:.3g}": d["G_mu (CLT)"],
         f"moments accountant ({d['epsilon_moments']:.3g}, 1e-5)-DP": d["moments accountant (eps, delta)"]},
        alphas=d["alpha"], title=f"Bu et al. Fig. 3: MNIST, sigma = 0.7, {d['epochs']} epochs",
        path=output / "000_fig3.png")
    (output / "figures.json").write_text(json.dumps(data, indent=1))
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "figures"))
    args = parser.parse_args(argv)
    data = make_all(Path(args.output))
    for key, value in data.items():
        print(key, {k: v for k, v in value.items() if not isinstance(v, list)})
    print(f"written to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
