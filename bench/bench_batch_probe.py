"""First-step cost of make_private's batch probe (dpsharp.torch.batch_probe) on the bench
models: the probe (three forward passes without gradients, in eval mode) against one DP-SGD
step of the same batch, alternating in one process, median over rounds.

    python bench/bench_batch_probe.py [--rounds 5] [--threads 1]

Models: bench_training.py's MLP (batch 256), CNN (batch 256) and transformer (batch 64, seq
64); bench_transformers.py's GPT-2 (4 x 256, seq 128, batch 8) and nn.TransformerEncoder
classifier. The probe runs once per training run (at its first batch), so its cost is the
printed ratio of one step, once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_training  # noqa: E402
import bench_transformers  # noqa: E402

from dpsharp.torch import NoiseGenerator, PerSampleClipper  # noqa: E402
from dpsharp.torch.batch_probe import clipped_layers, probe_batch  # noqa: E402


def measure(name: str, rounds: int) -> tuple[float, float, int]:
    """(median step seconds, median probe seconds, probed layers) for one model."""
    if name in ("mlp", "cnn", "transformer"):
        model, x, y = bench_training.make(name)

        def loss() -> torch.Tensor:
            return torch.nn.functional.cross_entropy(model(x), y)
        args, kwargs = (x,), {}
    else:
        model, x, y, kind = bench_transformers.make(name)

        def loss() -> torch.Tensor:
            return bench_transformers._loss(model, x, y, kind)
        args, kwargs = ((), {"input_ids": x}) if kind == "lm" else ((x,), {})
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    noise = NoiseGenerator(0)
    opt = torch.optim.SGD(clipper.parameters, lr=0.05)
    layers = clipped_layers(model, clipper)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        clipper.release(noise_multiplier=1.0, expected_batch_size=x.shape[0], noise=noise)
        opt.step()

    steps, probes, found = [], [], 0
    step()  # warm-up
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        steps.append(time.perf_counter() - start)
        start = time.perf_counter()
        result = probe_batch(model, args, kwargs, layers=layers)
        probes.append(time.perf_counter() - start)
        assert result.passed, result
        found = result.layers
    return statistics.median(steps), statistics.median(probes), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", nargs="*", default=["mlp", "cnn", "transformer", "gpt2",
                                                        "encoder"])
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    print(f"| model | DP step (ms) | probe (ms) | probe / step | layers |  threads "
          f"{options.threads}, {options.rounds} rounds")
    for name in options.models:
        step, probe, layers = measure(name, options.rounds)
        print(f"| {name} | {1e3 * step:.1f} | {1e3 * probe:.1f} | {probe / step:.2f} | "
              f"{layers} |", flush=True)


if __name__ == "__main__":
    main()
