"""DP / non-private step-time ratio from single steps interleaved in one process.

bench_training.py times rounds of a few steps per mode and compares medians; on a shared
machine the rounds of one mode can land in a noisy second that the other mode's rounds miss.
Here the two modes alternate step by step (nonprivate, dpsharp, nonprivate, ...), so both see
the same background load, and the ratio is reported at the minimum, the 25th percentile and the
median of each mode's step times (the lower quantiles are the least disturbed by other jobs).
The steps are bench_training.py's (same models, data, sigma = 1, C = 1, SGD).

Run:  python bench/bench_training_interleaved.py --models mlp cnn transformer --threads 1 2

``--import-from DIR`` imports dpsharp from DIR/python (a checkout with its ``_core`` built into
DIR/python/dpsharp) instead of the installed one, to compare two versions on one machine.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per mode (default: 100 for mlp, 60 for cnn, 20 for transformer)")
    ap.add_argument("--import-from", type=Path)
    ap.add_argument("--retain-freed-memory", action="store_true",
                    help="call dpsharp.torch.retain_freed_memory() first (glibc keeps freed "
                         "memory instead of returning it to the system; applies to both modes)")
    args = ap.parse_args()
    if args.import_from is not None:
        # Drop the import hooks of an editable install so that DIR/python wins.
        sys.meta_path[:] = [f for f in sys.meta_path
                            if "editable" not in type(f).__module__.lower()]
        sys.path.insert(0, str(args.import_from / "python"))
    warnings.filterwarnings("ignore")
    import dpsharp
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_training import build_step, make

    print(f"dpsharp from {Path(dpsharp.__file__).parent}")
    if args.retain_freed_memory:
        from dpsharp.torch import retain_freed_memory

        print(f"retain_freed_memory(): {retain_freed_memory()}")
    default_steps = {"mlp": 100, "cnn": 60, "transformer": 20}
    print("| model | threads | steps | non-private ms (min / p25 / median) | dpsharp ms (min / p25 "
          "/ median) | DP / non-private (min / p25 / median) |")
    print("|---|---|---|---|---|---|")
    for model_name in args.models:
        for threads in args.threads:
            torch.set_num_threads(threads)
            runners = {}
            for mode in ("nonprivate", "dpsharp"):
                model, x, y = make(model_name)
                runners[mode] = build_step(mode, model, x, y)
                for _ in range(3):
                    runners[mode]()  # warm-up
            times: dict[str, list[float]] = {mode: [] for mode in runners}
            steps = args.steps or default_steps.get(model_name, 50)
            for _ in range(steps):
                for mode, step in runners.items():
                    t0 = time.perf_counter()
                    step()
                    times[mode].append((time.perf_counter() - t0) * 1e3)
            qs = (0.0, 0.25, 0.5)
            plain = [quantile(times["nonprivate"], q) for q in qs]
            dp = [quantile(times["dpsharp"], q) for q in qs]
            print(f"| {model_name} | {threads} | {steps} | "
                  + " / ".join(f"{v:.2f}" for v in plain) + " | "
                  + " / ".join(f"{v:.2f}" for v in dp) + " | "
                  + " / ".join(f"{d / p:.3f}" for d, p in zip(dp, plain)) + " |", flush=True)


if __name__ == "__main__":
    main()
