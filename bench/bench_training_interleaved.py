"""DP / non-private step-time ratio from short turns of steps, the two modes alternating.

bench_training.py compares medians over rounds of all four modes; this script times only the
plain and the DP step, in many short turns (nonprivate, dpsharp, nonprivate, ...), so both see
the same background load, and reports the ratio at the minimum, the 25th percentile and the
median of each mode's step times (the lower quantiles are the least disturbed by other jobs).
Each mode runs in its own process (bench/_step_server.py: two modes in one process share a
malloc heap and move each other's page faults); a turn is ``--turn`` steps, of which the first
(it follows the other process's turn) is dropped. The steps are bench_training.py's (same
models, data, sigma = 1, C = 1, SGD).

Run:  python bench/bench_training_interleaved.py --models mlp cnn transformer --threads 1 2

``--import-from DIR`` imports dpsharp from DIR/python (a checkout with its ``_core`` built into
DIR/python/dpsharp) instead of the installed one, to compare two versions on one machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=0,
                    help="kept steps per mode (default: 100 for mlp, 60 for cnn, 20 for "
                         "transformer)")
    ap.add_argument("--turn", type=int, default=3,
                    help="steps per turn, the first of which is dropped (default 3)")
    ap.add_argument("--import-from", type=Path)
    ap.add_argument("--retain-freed-memory", action="store_true",
                    help="call dpsharp.torch.retain_freed_memory() first (glibc keeps freed "
                         "memory instead of returning it to the system; applies to both modes)")
    args = ap.parse_args()
    if args.turn < 2:
        raise SystemExit("--turn must be >= 2 (the first step of every turn is dropped)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _step_server import StepServer

    source = args.import_from / "python" if args.import_from else "the installed dpsharp"
    print(f"dpsharp from {source}")
    default_steps = {"mlp": 100, "cnn": 60, "transformer": 20}
    print("| model | threads | steps | non-private ms (min / p25 / median) | dpsharp ms (min / p25 "
          "/ median) | DP / non-private (min / p25 / median) |")
    print("|---|---|---|---|---|---|")
    for model_name in args.models:
        for threads in args.threads:
            servers = [StepServer(model_name, mode, threads, import_from=args.import_from,
                                  retain_freed_memory=args.retain_freed_memory, warmup=3)
                       for mode in ("nonprivate", "dpsharp")]
            times: dict[str, list[float]] = {server.mode: [] for server in servers}
            steps = args.steps or default_steps.get(model_name, 50)
            kept = args.turn - 1
            try:
                for _ in range(-(-steps // kept)):
                    for server in servers:
                        times[server.mode] += [t * 1e3 for t in server.run(args.turn)[1:]]
            finally:
                for server in servers:
                    server.close()
            qs = (0.0, 0.25, 0.5)
            plain = [quantile(times["nonprivate"], q) for q in qs]
            dp = [quantile(times["dpsharp"], q) for q in qs]
            print(f"| {model_name} | {threads} | {len(times['dpsharp'])} | "
                  + " / ".join(f"{v:.2f}" for v in plain) + " | "
                  + " / ".join(f"{v:.2f}" for v in dp) + " | "
                  + " / ".join(f"{d / p:.3f}" for d, p in zip(dp, plain)) + " |", flush=True)


if __name__ == "__main__":
    main()
