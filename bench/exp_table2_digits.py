"""Experiment (a): Yu et al. 2019 Table II on sklearn digits.

Usage:  python bench/exp_table2_digits.py [--seeds 5]

Same total budget rho_total = 0.78125 (zCDP, random reshuffling: each epoch costs
1/(2 sigma_t^2), Yu et al. Theorem 2), same schedules and hyper-parameters as Table II (uniform
sigma = 8; sigma_0 = 10 for the dynamic ones; validation k = 0.7, m = 5, threshold 0.01,
period 10). Training stops before the epoch whose cost would exceed the budget; the epochs are
counted by composing Shuffled(Gaussian(sigma_t)) epochs into dpsharp's ZCDPAccountant
(count_within_budget), and online for the validation schedule. "uniform, same epochs" is the
paper's last row: a constant sigma calibrated (calibrate_schedule, zCDP) to spend the whole
budget in the dynamic schedule's number of epochs.

Data: digits (1797 images, 64 features, 10 classes), split 65/15/20 train/validation/test with a
fixed seed; the validation split plays the *public* validation set. Model: softmax regression
(bench/_dpsgd.py), clipping C = 1, batch 120 (q ~ 0.1), constant learning rate 0.5 (the paper
uses a constant rate too). Seeds vary the shuffling and the noise. Results: mean, std, min, max
of the test accuracy over the seeds, in bench/results/table2_digits.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import dpsharp
from _dpsgd import DPSGD, load, summary
from dpsharp.events import Gaussian, Shuffled
from dpsharp.torch.schedules import (
    Constant,
    Exponential,
    Polynomial,
    StepDecay,
    TimeBased,
    ValidationBased,
    calibrate_schedule,
    count_within_budget,
)

RHO, BATCH, LR, CLIP = 0.78125, 120, 0.5, 1.0
RESULTS = os.path.join(os.path.dirname(__file__), "results")


def predefined() -> dict[str, object]:
    return {
        "uniform (sigma=8)": Constant(8.0),
        "time (k=0.05)": TimeBased(10.0, 0.05),
        "step (k=0.6, period=10)": StepDecay(10.0, 0.6, 10),
        "exp (k=0.01)": Exponential(10.0, 0.01),
        "poly (k=3, sigma_end=2, period=100)": Polynomial(10.0, 3.0, 2.0, 100),
    }


def run_fixed(split, schedule, epochs: int, seed: int) -> float:
    model = DPSGD(split.x_train.shape[1], split.classes, clip=CLIP, seed=seed)
    rng = np.random.default_rng(seed)
    for t in range(epochs):
        model.shuffled_epoch(split, batch=BATCH, sigma=schedule(t), lr=LR, rng=rng)
    return model.accuracy(split.x_test, split.y_test)


def run_validation(split, seed: int) -> tuple[float, int]:
    """Validation-based schedule: validate on the public split after every epoch; stop before
    the epoch whose reshuffling cost would exceed the budget (composed into ZCDPAccountant)."""
    schedule = ValidationBased(10.0, 0.7, m=5, threshold=0.01, period=10, validation_set="public")
    model = DPSGD(split.x_train.shape[1], split.classes, clip=CLIP, seed=seed)
    rng = np.random.default_rng(seed)
    acc = dpsharp.accountant("zcdp", batching="reshuffle", neighbouring="zero_out")
    n = len(split.y_train)
    epochs = 0
    while True:
        event = Shuffled(Gaussian(schedule.sigma), BATCH, n)
        trial = dpsharp.accountant("zcdp", batching="reshuffle", neighbouring="zero_out")
        trial.load_state_dict(acc.state_dict())
        trial.compose(event)
        if trial.rho > RHO:
            break
        acc = trial
        model.shuffled_epoch(split, batch=BATCH, sigma=schedule.sigma, lr=LR, rng=rng)
        epochs += 1
        schedule.observe(model.accuracy(split.x_val, split.y_val))
    return model.accuracy(split.x_test, split.y_test), epochs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    start = time.perf_counter()
    split = load("digits", seed=0)
    n = len(split.y_train)
    shuffle = {"batch_size": BATCH, "dataset_size": n}
    rows = []
    for name, schedule in predefined().items():
        epochs, acc = count_within_budget(schedule, rho=RHO, accountant="zcdp", **shuffle)
        accs = [run_fixed(split, schedule, epochs, seed) for seed in range(args.seeds)]
        row = {"schedule": name, "epochs": epochs, "rho_spent": acc.rho, "test_accuracy": accs}
        if not name.startswith("uniform"):
            same = calibrate_schedule(
                lambda s: Constant(s), length=epochs, rho=RHO, accountant="zcdp", initial=8.0, **shuffle
            )
            row["uniform_same_epochs_sigma"] = same.parameter
            row["uniform_same_epochs_accuracy"] = [
                run_fixed(split, same.schedule, epochs, seed) for seed in range(args.seeds)
            ]
        rows.append(row)
        print(name, epochs, summary(accs), flush=True)
    val = [run_validation(split, seed) for seed in range(args.seeds)]
    rows.append(
        {
            "schedule": "validation (k=0.7, m=5, threshold=0.01, period=10)",
            "epochs": [e for _, e in val],
            "test_accuracy": [a for a, _ in val],
        }
    )
    print("validation", [e for _, e in val], summary([a for a, _ in val]), flush=True)
    elapsed = time.perf_counter() - start
    os.makedirs(RESULTS, exist_ok=True)
    meta = {"rho_total": RHO, "batch": BATCH, "lr": LR, "clip": CLIP, "n_train": n, "seeds": args.seeds,
            "seconds": elapsed, "command": f"python bench/exp_table2_digits.py --seeds {args.seeds}"}
    with open(os.path.join(RESULTS, "table2_digits.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [
        f"# Table II of Yu et al. 2019 on digits ({args.seeds} seeds; `{meta['command']}`, {elapsed:.0f} s)",
        "",
        f"rho_total = {RHO}, reshuffling, batch {BATCH} of n = {n}, softmax regression, C = {CLIP}, lr = {LR}.",
        "Test accuracy: mean +- std [min, max]. Last column: a constant sigma calibrated to spend the",
        "same rho in the same number of epochs (the paper's 'uniform/same #epochs' row).",
        "",
        "| schedule | epochs | test accuracy | uniform, same epochs (sigma) |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        m, s, lo, hi = summary(row["test_accuracy"])
        same = ""
        if "uniform_same_epochs_accuracy" in row:
            m2, s2, lo2, hi2 = summary(row["uniform_same_epochs_accuracy"])
            same = f"{m2:.3f} +- {s2:.3f} [{lo2:.3f}, {hi2:.3f}] (sigma {row['uniform_same_epochs_sigma']:.3f})"
        epochs = row["epochs"] if isinstance(row["epochs"], int) else f"{min(row['epochs'])}-{max(row['epochs'])}"
        lines.append(f"| {row['schedule']} | {epochs} | {m:.3f} +- {s:.3f} [{lo:.3f}, {hi:.3f}] | {same} |")
    with open(os.path.join(RESULTS, "table2_digits.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        for i, row in enumerate(rows):
            a = np.asarray(row["test_accuracy"])
            ax.errorbar(i, a.mean(), yerr=[[a.mean() - a.min()], [a.max() - a.mean()]], fmt="o", capsize=4, color="C0")
            if "uniform_same_epochs_accuracy" in row:
                b = np.asarray(row["uniform_same_epochs_accuracy"])
                ax.errorbar(i + 0.2, b.mean(), yerr=[[b.mean() - b.min()], [b.max() - b.mean()]], fmt="s", capsize=4, color="C1")
        ax.set_xticks(range(len(rows)), [r["schedule"].split(" (")[0] for r in rows])
        ax.set_ylabel("test accuracy (mean, min-max)")
        ax.set_title(f"digits, rho_total={RHO}: schedule (o) vs uniform with the same epochs (s)")
        fig.tight_layout()
        fig.savefig(os.path.join(RESULTS, "table2_digits.png"), dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
