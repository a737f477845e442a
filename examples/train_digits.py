"""Differentially private training of a small CNN on scikit-learn's bundled digits.

The data: ``sklearn.datasets.load_digits`` (1797 8x8 grey images of the digits 0-9), split 80/20
(stratified, fixed seed). Pixels are divided by 16, their public maximum. The model: two 3x3
convolutions with tanh and average pooling, then a linear layer -- no BatchNorm (it mixes
examples, so per-example clipping could not bound one example's influence).

Training: Poisson sampling with q = batch_size / n_train (Abadi et al. 2016; Bu et al. 2020,
Algorithm 1), per-example clipping to --max-grad-norm, Gaussian noise calibrated with
``dpsharp.calibrate`` so that --epochs epochs cost at most --target-epsilon at --delta under the
chosen accountant, and a ``PrivacyBudget`` of the same size that would stop training before any
step exceeded it. Prints accuracy and epsilon after every epoch (with a tqdm progress bar on
stderr); the last line on stdout is one JSON object with at least ``test_accuracy`` and
``epsilon``.

    python examples/train_digits.py --optimizer sgd --target-epsilon 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset
from tqdm import tqdm

import dpsharp
from dpsharp import demo
from dpsharp.torch import BudgetExhausted, PoissonDataLoader, PrivacyBudget, PrivacyEngine

OPTIMIZERS = {
    # name: (torch optimizer class, default learning rate, extra options)
    "sgd": (torch.optim.SGD, 4.0, {"momentum": 0.5}),
    "adam": (torch.optim.Adam, 1e-2, {}),
    "adagrad": (torch.optim.Adagrad, 0.1, {}),
}


build_model = demo.build_model  # the CNN of `dpsharp demo`
accuracy = demo.accuracy


def load(seed: int) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    return demo.load_digits_split(seed)


def default_accountant() -> str:
    for name in ("pld", "rdp"):
        if name in dpsharp.available():
            return name
    raise SystemExit("no certified Poisson accountant ('pld' or 'rdp') is installed")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
    parser.add_argument("--target-epsilon", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=512, help="expected (Poisson) batch size")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=None, help="default depends on --optimizer")
    parser.add_argument("--noise-multiplier", type=float, default=None,
                        help="use this sigma instead of calibrating to --target-epsilon (the "
                        "budget still stops training at --target-epsilon)")
    parser.add_argument("--accountant", default=None, help="default: pld (or rdp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run (tests)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    args = parse(argv)
    if args.quick:
        args.epochs = min(args.epochs, 3)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    train, x_test, y_test = load(args.seed)
    model = build_model()
    make, default_lr, options = OPTIMIZERS[args.optimizer]
    optimizer = make(model.parameters(), lr=args.lr or default_lr, **options)
    accountant = args.accountant or default_accountant()
    budget = PrivacyBudget(args.target_epsilon, args.delta)
    engine = PrivacyEngine(accountant=accountant)
    model, optimizer, loader = engine.make_private(
        model,
        optimizer,
        PoissonDataLoader(train, expected_batch_size=args.batch_size, seed=args.seed),
        target_epsilon=None if args.noise_multiplier is not None else args.target_epsilon,
        noise_multiplier=args.noise_multiplier,
        delta=args.delta,
        epochs=args.epochs,
        max_grad_norm=args.max_grad_norm,
        budget=budget,
        seed=args.seed,
    )
    print(
        f"digits: n_train={len(train)} q={loader.sample_rate:.4f} steps/epoch={len(loader)} "
        f"sigma={optimizer.noise_multiplier:.4f} ({accountant}, target eps={args.target_epsilon}, "
        f"delta={args.delta})"
    )
    stopped = False
    test_accuracy = accuracy(model, x_test, y_test)
    for epoch in range(1, args.epochs + 1):
        losses = []
        bar = tqdm(loader, total=len(loader), desc=f"epoch {epoch}", leave=False, file=sys.stderr)
        try:
            for x, y in bar:
                optimizer.zero_grad()
                if len(y):  # an empty Poisson batch is still a step: step() adds pure noise
                    loss = nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    losses.append(loss.item())
                optimizer.step()
        except BudgetExhausted as exc:
            stopped = True
            tqdm.write(f"stopping: {exc}", file=sys.stderr)
        finally:
            bar.close()
        test_accuracy = accuracy(model, x_test, y_test)
        print(
            f"epoch {epoch:3d}  loss {np.mean(losses) if losses else float('nan'):.4f}  "
            f"test accuracy {test_accuracy:.4f}  epsilon {engine.epsilon(args.delta):.4f}"
        )
        if stopped:
            break
    result: dict[str, object] = {
        "dataset": "digits",
        "optimizer": args.optimizer,
        "test_accuracy": test_accuracy,
        "epsilon": engine.epsilon(args.delta),
        "delta": args.delta,
        "accountant": accountant,
        "noise_multiplier": optimizer.noise_multiplier,
        "sample_rate": loader.sample_rate,
        "epochs": loader.epoch,
        "steps": engine.steps,
        "max_grad_norm": args.max_grad_norm,
        "stopped_by_budget": stopped,
        "seconds": round(time.perf_counter() - start, 2),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
