"""DP training step of an LSTM classifier: dpsharp (DPLSTM + per-example clipping) against the
non-private step (nn.LSTM's fused kernel, and the same DPLSTM without clipping) and Opacus'
DPLSTM with its per-sample-gradient hooks, in one process, modes alternating.

    python bench/bench_recurrent.py [--threads 1] [--repeats 7]

Prints the median step time of each mode and the ratios to the non-private nn.LSTM step.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    def __init__(self, lstm: nn.Module, hidden: int) -> None:
        super().__init__()
        self.lstm = lstm
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.seq, args.features)
    y = torch.randint(0, 2, (args.batch,))

    from dpsharp.torch import NoisySGD
    from dpsharp.torch.layers.recurrent import convert_recurrent

    def plain_lstm() -> Net:
        return Net(nn.LSTM(args.features, args.hidden, batch_first=True), args.hidden)

    modes = {}
    model = plain_lstm()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    modes["non-private nn.LSTM"] = (model, sgd)
    model = convert_recurrent(plain_lstm())
    modes["non-private DPLSTM"] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    model = convert_recurrent(plain_lstm())
    modes["dpsharp DP step"] = (model, NoisySGD(model, lr=0.01, noise_multiplier=1.0,
                                                max_grad_norm=1.0,
                                                expected_batch_size=args.batch, seed=0))
    try:
        from opacus.grad_sample import GradSampleModule
        from opacus.layers import DPLSTM as OpacusDPLSTM
        from opacus.optimizers import DPOptimizer as OpacusDPOptimizer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = GradSampleModule(Net(OpacusDPLSTM(args.features, args.hidden,
                                                      batch_first=True), args.hidden))
            opt = OpacusDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    noise_multiplier=1.0, max_grad_norm=1.0,
                                    expected_batch_size=args.batch)
        modes["Opacus DPLSTM DP step"] = (model, opt)
    except ImportError:
        pass

    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in modes}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (model, optimizer) in modes.items():  # warm-up
            step(model, optimizer)
        for _ in range(args.repeats):
            for name, (model, optimizer) in modes.items():
                times[name].append(step(model, optimizer))
    base = statistics.median(times["non-private nn.LSTM"])
    print(f"LSTM classifier: batch {args.batch}, seq {args.seq}, features {args.features}, "
          f"hidden {args.hidden}, {args.threads} thread(s), median of {args.repeats}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:24s} {1e3 * median:8.2f} ms  {median / base:6.2f}x")


if __name__ == "__main__":
    main()
