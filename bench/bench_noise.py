"""Speed of the in-kernel Gaussian noise: every implementation of the generator, the fused
release pass (noise added to a gradient buffer), and torch's own ``Tensor.normal_`` (a
non-counter-based generator, the peer) in the same run, at 1 and 2 threads.

Prints nanoseconds per normal (minimum over ``--repeat`` calls) and the ratio to torch's
``normal_`` of the same size and dtype. ``--import-from DIR`` measures a checkout whose
``_core`` is built into DIR/python/dpsharp (the previous generator, for a before/after in one
session; only the entry points both versions have are timed).

Run:  python bench/bench_noise.py --numel 670000 --repeat 30
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=670_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--import-from", type=Path)
    args = ap.parse_args()
    if args.import_from is not None:
        sys.meta_path[:] = [f for f in sys.meta_path
                            if "editable" not in type(f).__module__.lower()]
        sys.path.insert(0, str(args.import_from / "python"))
    import torch

    from dpsharp._native import core
    from dpsharp.torch import kernels

    n = args.numel
    print(f"dpsharp from {Path(kernels.__file__).parents[1]}; {n} normals; ns per normal "
          "(min of repeats), ratio to torch's normal_")
    print("| what | threads | float32 | float64 |")
    print("|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows: dict[str, dict[str, float]] = {}
        torch_ns = {}
        for dtype, name in ((torch.float32, "float32"), (torch.float64, "float64")):
            buf = torch.empty(n, dtype=dtype)
            torch_ns[name] = best(lambda: buf.normal_(), args.repeat) / n * 1e9
            rows.setdefault("torch normal_", {})[name] = torch_ns[name]
            if hasattr(core, "gaussian_stream_with"):  # this version: ChaCha8 + Box-Muller
                words = kernels.key_words(7)
                if threads == 1:
                    for impl in core.normals_implementations():
                        rows.setdefault(f"stream, {impl}", {})[name] = best(
                            lambda: core.gaussian_stream_with(impl, words, 0, 0, 0, 0, n, name),
                            args.repeat) / n * 1e9
            elif threads == 1 and name == "float64":  # previous version: Philox4x32-10
                for impl in core.normals_implementations():
                    rows.setdefault(f"stream, {impl}", {})[name] = best(
                        lambda: core.philox_gaussian_with(impl, 7, 0, 0, 0, 0, n),
                        args.repeat) / n * 1e9
            out = torch.zeros(n, dtype=dtype)
            rows.setdefault("release pass (noise into a buffer)", {})[name] = best(
                lambda: kernels.clip_accumulate_noise(out, base=out, noise_std=1.0, key=7,
                                                      scale=0.5),
                args.repeat) / n * 1e9
        for what, cells in rows.items():
            text = []
            for name in ("float32", "float64"):
                if name in cells:
                    ratio = cells[name] / torch_ns[name]
                    text.append(f"{cells[name]:.2f} ({ratio:.2f}x)")
                else:
                    text.append("-")
            print(f"| {what} | {threads} | {text[0]} | {text[1]} |", flush=True)


if __name__ == "__main__":
    main()
