"""``dpsharp demo``: differentially private training of a small CNN on scikit-learn's digits.

The data: ``sklearn.datasets.load_digits`` (1797 8x8 grey images of the digits 0-9, bundled with
scikit-learn: no network), split 80/20 (stratified, fixed seed); pixels divided by 16, their public
maximum. The model: two 3x3 convolutions with tanh and average pooling, then a linear layer (no
BatchNorm: it mixes examples, so per-example clipping could not bound one example's influence).

Training (Abadi et al. 2016; Bu et al. 2020, Algorithms 1-2): Poisson sampling with
q = batch_size / n_train, per-example clipping, Gaussian noise calibrated by
:class:`dpsharp.torch.PrivacyEngine` so that ``epochs`` epochs cost at most ``target_epsilon`` at
``delta`` under the tight (PLD) accountant, NoisyAdam (Adam on the privatised gradient, which is
post-processing), and a :class:`dpsharp.torch.PrivacyBudget` that would stop training before a
step exceeded it. After training the run is restated by every registered accountant (the
statement of ``dpsharp epsilon``), and two figures are written: epsilon against epochs per
accountant, and the trade-off curve of the final model's guarantee against G_mu (Dong, Roth,
Su 2019): the central-limit mu (an approximation), and the tight accountant's certified mu only
where it says something (``dpsharp._report.gdp_mu_is_informative``: a Poisson-subsampled run is
mu-GDP only for mu >= sqrt(T)/sigma, and the figure says so instead of drawing that G_mu).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpsharp._report import format_epsilon

__all__ = [
    "accuracy",
    "build_model",
    "default_accountant",
    "load_digits_split",
    "run_demo",
    "run_example",
    "train",
]


def build_model() -> Any:
    """The demo's CNN for 1x8x8 inputs (about 1.9k parameters)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.Tanh(),
        nn.AvgPool2d(2),  # 8x8 -> 4x4
        nn.Conv2d(8, 16, 3, padding=1),
        nn.Tanh(),
        nn.AvgPool2d(2),  # 4x4 -> 2x2
        nn.Flatten(),
        nn.Linear(16 * 2 * 2, 10),
    )


def load_digits_split(seed: int) -> tuple[Any, Any, Any]:
    """(train TensorDataset, x_test, y_test) of scikit-learn's digits, 80/20 stratified."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    images, labels = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        images / 16.0, labels, test_size=0.2, random_state=seed, stratify=labels
    )

    def tensors(x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        return torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(y)

    return (TensorDataset(*tensors(x_train, y_train)), *tensors(x_test, y_test))


def accuracy(model: Any, x: Any, y: Any) -> float:
    """Fraction of ``x`` that ``model`` classifies as ``y``."""
    import torch

    model.eval()
    with torch.no_grad():
        result = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return result


def _train_epoch(
    model: Any, optimizer: Any, batches: Any, *, after_step: Callable[[], Any] | None = None
) -> tuple[list[float], bool]:
    """One epoch of cross-entropy DP training over ``batches``: (the batch losses, whether a
    :class:`dpsharp.torch.BudgetExhausted` stopped it). ``after_step`` runs after every step."""
    from torch import nn
    from tqdm import tqdm

    from dpsharp.torch import BudgetExhausted

    losses: list[float] = []
    try:
        for x, y in batches:
            optimizer.zero_grad()
            if len(y):  # an empty Poisson batch is still a step: step() adds pure noise
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                losses.append(loss.item())
            optimizer.step()
            if after_step is not None:
                after_step()
    except BudgetExhausted as exc:
        tqdm.write(f"stopping: {exc}", file=sys.stderr)
        return losses, True
    return losses, False


def train(
    *,
    target_epsilon: float,
    delta: float,
    epochs: int,
    batch_size: int,
    lr: float,
    max_grad_norm: float,
    seed: int,
    accountant: str = "pld",
    progress: bool = True,
) -> dict[str, Any]:
    """Train the demo model with NoisyAdam under a budget; returns the run's numbers.

    Returns a dict with ``test_accuracy``, ``epsilon`` (the engine's accountant after training),
    ``noise_multiplier``, ``sample_rate``, ``steps``, ``dataset_size``, ``epochs_run``,
    ``stopped_by_budget``, ``history`` (per epoch: loss, accuracy, epsilon) and ``seconds``.
    """
    import torch
    from tqdm import tqdm

    from dpsharp.torch import PoissonDataLoader, PrivacyBudget, PrivacyEngine

    torch.manual_seed(seed)
    start = time.perf_counter()
    train_set, x_test, y_test = load_digits_split(seed)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    engine = PrivacyEngine(accountant=accountant)
    model, optimizer, loader = engine.make_private(
        model,
        optimizer,
        PoissonDataLoader(train_set, expected_batch_size=batch_size, seed=seed),
        target_epsilon=target_epsilon,
        delta=delta,
        epochs=epochs,
        max_grad_norm=max_grad_norm,
        budget=PrivacyBudget(target_epsilon, delta),
        seed=seed,
    )
    history: list[dict[str, float]] = []
    stopped = False
    total = epochs * len(loader)
    bar = tqdm(total=total, desc="DP training (NoisyAdam)", unit="step", file=sys.stderr,
               disable=not progress, leave=False)
    try:
        for epoch in range(1, epochs + 1):
            losses, stopped = _train_epoch(model, optimizer, loader, after_step=bar.update)
            acc = accuracy(model, x_test, y_test)
            eps = engine.epsilon(delta)
            history.append({"epoch": epoch, "loss": float(np.mean(losses)) if losses else math.nan,
                            "test_accuracy": acc, "epsilon": eps})
            bar.set_postfix(acc=f"{acc:.3f}", eps=format_epsilon(eps, 3))
            if stopped:
                break
    finally:
        bar.close()
    return {
        "test_accuracy": history[-1]["test_accuracy"] if history else accuracy(model, x_test, y_test),
        "epsilon": engine.epsilon(delta),
        "delta": delta,
        "accountant": accountant,
        "noise_multiplier": float(optimizer.noise_multiplier),
        "sample_rate": float(loader.sample_rate),
        "batch_size": batch_size,
        "dataset_size": len(train_set),
        "steps": int(engine.steps),
        "epochs_run": len(history),
        "stopped_by_budget": stopped,
        "history": history,
        "seconds": time.perf_counter() - start,
    }


def default_accountant() -> str:
    """The tightest certified Poisson accountant installed: ``"pld"``, else ``"rdp"``."""
    import dpsharp

    for name in ("pld", "rdp"):
        if name in dpsharp.available():
            return name
    raise SystemExit("no certified Poisson accountant ('pld' or 'rdp') is installed")


def run_example(
    argv: Sequence[str] | None,
    *,
    description: str,
    dataset: str,
    label: str,
    load: Callable[[int], tuple[Any, Any, Any]],
    build_model: Callable[[], Any],
    optimizers: dict[str, tuple[Any, float, dict[str, Any]]],
    target_epsilon: float,
    epochs: int,
    batch_size: int,
) -> dict[str, object]:
    """The command line and DP training loop shared by the real-data scripts in ``examples/``.

    Parses ``argv`` (flags --optimizer, --target-epsilon, --delta, --epochs, --batch-size,
    --max-grad-norm, --lr, --noise-multiplier, --accountant, --seed, --quick; the keyword
    arguments give the dataset-specific defaults), trains ``build_model()`` on ``load(seed)``
    with Poisson sampling, per-example clipping and Gaussian noise (Abadi et al. 2016; Bu et al.
    2020, Algorithm 1) under a :class:`dpsharp.torch.PrivacyBudget` of (--target-epsilon,
    --delta), prints one line per epoch, and prints (and returns) the run's numbers as one JSON
    object on the last line. ``optimizers`` maps a name to (torch optimizer class, default
    learning rate, extra options); ``label`` names the data in the first line, ``dataset`` in
    the JSON.
    """
    import torch
    from tqdm import tqdm

    from dpsharp.torch import PoissonDataLoader, PrivacyBudget, PrivacyEngine

    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--optimizer", choices=sorted(optimizers), default="sgd",
                        help="the torch optimizer that steps on the privatised gradient")
    parser.add_argument("--target-epsilon", type=float, default=target_epsilon,
                        help="privacy budget epsilon: sigma is calibrated to it and training "
                        "stops before exceeding it")
    parser.add_argument("--delta", type=float, default=1e-5, help="privacy budget delta")
    parser.add_argument("--epochs", type=int, default=epochs, help="passes over the data")
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help="expected (Poisson) batch size")
    parser.add_argument("--max-grad-norm", type=float, default=1.0,
                        help="per-example clipping norm C")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (None: " + ", ".join(
                            f"{name} {lr:g}" for name, (_, lr, _) in sorted(optimizers.items()))
                        + ")")
    parser.add_argument("--noise-multiplier", type=float, default=None,
                        help="noise std / clipping norm; use this sigma instead of calibrating "
                        "to --target-epsilon (the budget still stops training at "
                        "--target-epsilon)")
    parser.add_argument("--accountant", default=None,
                        help="accountant name (None: pld, or rdp where pld is not built)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initialisation, the sampler and the noise")
    parser.add_argument("--quick", action="store_true", help="a short run (at most 3 epochs)")
    args = parser.parse_args(argv)

    if args.quick:
        args.epochs = min(args.epochs, 3)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    train_set, x_test, y_test = load(args.seed)
    model = build_model()
    make, default_lr, options = optimizers[args.optimizer]
    optimizer = make(model.parameters(), lr=args.lr or default_lr, **options)
    accountant = args.accountant or default_accountant()
    budget = PrivacyBudget(args.target_epsilon, args.delta)
    engine = PrivacyEngine(accountant=accountant)
    model, optimizer, loader = engine.make_private(
        model,
        optimizer,
        PoissonDataLoader(train_set, expected_batch_size=args.batch_size, seed=args.seed),
        target_epsilon=None if args.noise_multiplier is not None else args.target_epsilon,
        noise_multiplier=args.noise_multiplier,
        delta=args.delta,
        epochs=args.epochs,
        max_grad_norm=args.max_grad_norm,
        budget=budget,
        seed=args.seed,
    )
    print(
        f"{label}: n_train={len(train_set)} q={loader.sample_rate:.4f} steps/epoch={len(loader)} "
        f"sigma={optimizer.noise_multiplier:.4f} ({accountant}, target eps={args.target_epsilon}, "
        f"delta={args.delta})"
    )
    stopped = False
    test_accuracy = accuracy(model, x_test, y_test)
    for epoch in range(1, args.epochs + 1):
        bar = tqdm(loader, total=len(loader), desc=f"epoch {epoch}", leave=False, file=sys.stderr)
        try:
            losses, stopped = _train_epoch(model, optimizer, bar)
        finally:
            bar.close()
        test_accuracy = accuracy(model, x_test, y_test)
        epsilon = format_epsilon(engine.epsilon(args.delta))  # rounded up: a certified bound
        print(
            f"epoch {epoch:3d}  loss {np.mean(losses) if losses else float('nan'):.4f}  "
            f"test accuracy {test_accuracy:.4f}  epsilon {epsilon}"
        )
        if stopped:
            break
    result: dict[str, object] = {
        "dataset": dataset,
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


def run_demo(args: argparse.Namespace) -> int:
    """The ``dpsharp demo`` command (flags: see :func:`dpsharp.cli`)."""
    from dpsharp import plots
    from dpsharp._dpsgd import DPSGDRun
    from dpsharp._report import epsilon_series, evaluate, print_statement, write_tradeoff_figure
    from dpsharp.accountants import available

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    print(f"dpsharp demo: DP training on scikit-learn digits, NoisyAdam, budget "
          f"(epsilon = {args.target_epsilon:g}, delta = {args.delta!r}), {args.epochs} epochs")
    result = train(target_epsilon=args.target_epsilon, delta=args.delta, epochs=args.epochs,
                   batch_size=args.batch_size, lr=args.lr, max_grad_norm=args.max_grad_norm,
                   seed=args.seed, progress=not args.no_progress)
    for row in result["history"]:
        print(f"  epoch {row['epoch']:3d}  loss {row['loss']:.4f}  test accuracy "
              f"{row['test_accuracy']:.4f}  epsilon {format_epsilon(row['epsilon'])}")
    print(f"Test accuracy: {result['test_accuracy']:.4f} after {result['steps']} steps "
          f"(sigma = {result['noise_multiplier']:.4f}, q = {result['sample_rate']:.4f}, "
          f"{result['seconds']:.1f} s)\n")

    # the same run restated by every accountant (the statement of `dpsharp epsilon`)
    run = DPSGDRun(result["dataset_size"], result["batch_size"], result["steps"],
                   result["noise_multiplier"])
    results = [evaluate(run, name, args.delta) for name in available()]
    print_statement(run, results, delta=args.delta, epochs=result["epochs_run"])

    series = {}
    for item in results:
        # the classic bound (44.6 here, against about 3) only when asked: it flattens the rest
        if item.applicable and (item.name != "classic" or getattr(args, "plot_classic", False)):
            data = epsilon_series(run, item.name, args.delta, points=min(40, run.steps))
            if data is not None:
                series[item.name] = data
    epsilon_png = output / "epsilon_vs_epoch.png"
    plots.epsilon_vs_epochs(
        series, delta=args.delta,
        certified={r.name: bool(r.fields.get("certified")) for r in results if r.applicable},
        title=f"digits demo: n={run.dataset_size}, B={run.batch_size}, "
              f"sigma={run.noise_multiplier:.3g}", path=epsilon_png)
    tradeoff_png = output / "tradeoff.png"
    curve = write_tradeoff_figure(run, args.delta, tradeoff_png)
    document = {
        "training": {k: v for k, v in result.items()},
        "accountants": {r.name: r.fields for r in results},
        "epsilon_vs_epoch": {name: {"epochs": xs.tolist(), "epsilon": ys.tolist()}
                             for name, (xs, ys) in series.items()},
        "tradeoff": curve,
        "plots": [str(epsilon_png), str(tradeoff_png)],
    }
    (output / "demo.json").write_text(json.dumps(document, indent=2, default=float))
    print(f"\nPlots written to {output}/: {epsilon_png.name} (epsilon vs epoch per accountant), "
          f"{tradeoff_png.name} (trade-off curve against G_mu); numbers in demo.json.")
    return 0
