"""Experiment (b): ADP-SGD vs DP-SGD with a polynomially decaying learning rate (Wu, Wang,
Cristali, Gu, Willett, "Adaptive Differentially Private Empirical Risk Minimization",
section 5.1 and section 6), at equal (epsilon, delta), over several budgets.

Usage:  python bench/exp_adp.py [--seeds 10]

Learning rate (both methods): eta_t = eta_0 / sqrt(e + 1) with e the epoch of step t (the
polynomial decay of Wu et al. section 5.1 with power 1/2, updated once per epoch so that the ADP
sequence has one sigma per epoch). Poisson sampling q, T = epochs / q steps, delta = 1e-5.

* DP-SGD: constant sigma, calibrated with calibrate_schedule(Constant) on the tight "pld"
  accountant so that T steps cost epsilon.
* ADP-SGD: sigma_t = scale sqrt(eta_0 / eta_t) (sigma_t proportional to 1/sqrt(eta_t)), the scale
  calibrated with ADP.calibrated(..., epsilon=...) on the same accountant.

Both certified epsilons are <= the target and within 0.1 % of it. Model: softmax regression
(bench/_dpsgd.py), C = 1. Data: breast cancer (455 train / 114 test) and digits (1438 / 359).
Seeds vary the sampling and the noise. Results: bench/results/adp.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _dpsgd import DPSGD, load, summary
from dpsharp.torch.schedules import ADP, Constant, calibrate_schedule

DELTA, CLIP = 1e-5, 1.0
SETTINGS = {
    # dataset: (q, epochs, eta_0)
    "breast_cancer": (0.1, 30, 1.0),
    "digits": (0.05, 30, 1.0),
}
BUDGETS = (0.5, 1.0, 2.0, 4.0)
RESULTS = os.path.join(os.path.dirname(__file__), "results")


def train(split, sigmas: np.ndarray, rates: np.ndarray, q: float, seed: int) -> float:
    model = DPSGD(split.x_train.shape[1], split.classes, clip=CLIP, seed=seed)
    rng = np.random.default_rng(seed)
    for sigma, lr in zip(sigmas, rates):
        model.poisson_step(split, q=q, sigma=float(sigma), lr=float(lr), rng=rng)
    return model.accuracy(split.x_test, split.y_test)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    start = time.perf_counter()
    rows = []
    for dataset, (q, epochs, eta0) in SETTINGS.items():
        split = load(dataset, seed=0, val_fraction=0.0)
        n = len(split.y_train)
        per_epoch = int(round(1 / q))
        steps = epochs * per_epoch
        rates = np.array([eta0 / np.sqrt(t // per_epoch + 1) for t in range(steps)])
        for eps in BUDGETS:
            dp = calibrate_schedule(
                lambda s: Constant(s, unit="step"), length=steps, sampling_probability=q,
                epsilon=eps, delta=DELTA, accountant="pld",
            )
            adp = ADP.calibrated(rates, sampling_probability=q, epsilon=eps, delta=DELTA, accountant="pld")
            sig_dp = dp.schedule.sequence(steps)
            sig_adp = adp.schedule.sequence()
            acc_dp = [train(split, sig_dp, rates, q, seed) for seed in range(args.seeds)]
            acc_adp = [train(split, sig_adp, rates, q, seed) for seed in range(args.seeds)]
            diff = np.asarray(acc_adp) - np.asarray(acc_dp)  # paired: same seed, same samples
            rows.append({
                "dataset": dataset, "n_train": n, "q": q, "steps": steps, "epsilon": eps,
                "dp_sigma": dp.parameter, "dp_certified_eps": dp.achieved,
                "adp_scale": adp.parameter, "adp_sigma_last": float(sig_adp[-1]),
                "adp_certified_eps": adp.achieved,
                "dp_accuracy": acc_dp, "adp_accuracy": acc_adp,
                "paired_diff_mean": float(diff.mean()),
                "paired_diff_se": float(diff.std(ddof=1) / np.sqrt(diff.size)),
            })
            print(dataset, eps, summary(acc_dp)[:2], summary(acc_adp)[:2], flush=True)
    elapsed = time.perf_counter() - start
    command = f"python bench/exp_adp.py --seeds {args.seeds}"
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "adp.json"), "w") as f:
        json.dump({"meta": {"command": command, "seconds": elapsed, "delta": DELTA, "clip": CLIP,
                            "settings": SETTINGS}, "rows": rows}, f, indent=1)
    lines = [
        "# ADP-SGD vs DP-SGD, polynomially decaying LR, equal (eps, 1e-5) by the pld accountant",
        f"`{command}` ({elapsed:.0f} s, {args.seeds} seeds). Test accuracy mean +- std;",
        "diff = ADP - DP paired by seed, mean +- standard error.",
        "",
        "| data | eps | DP sigma | ADP sigma first..last | certified eps DP / ADP | DP-SGD | ADP-SGD | diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        m1, s1, _, _ = summary(r["dp_accuracy"])
        m2, s2, _, _ = summary(r["adp_accuracy"])
        lines.append(
            f"| {r['dataset']} | {r['epsilon']} | {r['dp_sigma']:.3f} | {r['adp_scale']:.3f}..{r['adp_sigma_last']:.3f} "
            f"| {r['dp_certified_eps']:.4f} / {r['adp_certified_eps']:.4f} | {m1:.3f} +- {s1:.3f} "
            f"| {m2:.3f} +- {s2:.3f} | {r['paired_diff_mean']:+.3f} +- {r['paired_diff_se']:.3f} |"
        )
    with open(os.path.join(RESULTS, "adp.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(SETTINGS), figsize=(10, 4))
        for ax, dataset in zip(np.atleast_1d(axes), SETTINGS):
            sub = [r for r in rows if r["dataset"] == dataset]
            e = [r["epsilon"] for r in sub]
            for key, label in (("dp_accuracy", "DP-SGD"), ("adp_accuracy", "ADP-SGD")):
                m = [np.mean(r[key]) for r in sub]
                s = [np.std(r[key], ddof=1) for r in sub]
                ax.errorbar(e, m, yerr=s, marker="o", capsize=3, label=label)
            ax.set_xscale("log")
            ax.set_xlabel("epsilon (delta = 1e-5)")
            ax.set_ylabel("test accuracy")
            ax.set_title(dataset)
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(RESULTS, "adp.png"), dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
