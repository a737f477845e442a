"""examples/train_digits.py at its defaults over several seeds: test accuracy and epsilon.

The train/test split is fixed (see the example); the seed moves the model's initialisation, the
Poisson sampler and the noise stream, so the spread over seeds is the spread a user would see
from the randomness of DP training. The target is at least 90% test accuracy at
epsilon <= 3 (delta 1e-5). Prints every seed's accuracy and the engine's epsilon, then one JSON
object per optimizer with the mean, minimum and maximum accuracy and the largest epsilon. Torch
runs on one thread; extra arguments go to the example unchanged.

    python bench/digits_seeds.py --optimizer sgd --seeds 10
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import statistics
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location(
    "train_digits", Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"
)
digits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(digits)  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", nargs="+", default=["sgd"], choices=sorted(digits.OPTIMIZERS))
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    args, extra = parser.parse_known_args()
    torch.set_num_threads(1)
    for name in args.optimizer:
        runs = []
        for seed in range(args.seeds):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                result = digits.main(["--optimizer", name, "--seed", str(seed), *extra])
            if seed == 0:
                print(out.getvalue().splitlines()[0], flush=True)  # the data and sigma line
            runs.append(result)
            print(f"{name} seed {seed}: test accuracy {result['test_accuracy']:.4f}  "
                  f"epsilon {result['epsilon']:.4f}  steps {result['steps']}", flush=True)
        accuracies = [float(r["test_accuracy"]) for r in runs]
        print(json.dumps({
            "optimizer": name,
            "seeds": args.seeds,
            "mean_accuracy": round(statistics.fmean(accuracies), 4),
            "min_accuracy": round(min(accuracies), 4),
            "max_accuracy": round(max(accuracies), 4),
            "max_epsilon": max(float(r["epsilon"]) for r in runs),
            "delta": runs[0]["delta"],
            "accountant": runs[0]["accountant"],
            "noise_multiplier": runs[0]["noise_multiplier"],
            "sample_rate": runs[0]["sample_rate"],
            "steps": runs[0]["steps"],
            "max_grad_norm": runs[0]["max_grad_norm"],
        }), flush=True)


if __name__ == "__main__":
    main()
