"""DP-PCA front end + DP-SGD on scikit-learn's digits, with one epsilon for the whole pipeline.

Abadi et al. 2016 put a differentially private PCA projection in front of the network
and count its cost in the same moments accountant; Yu et al. 2019 report it apart
(sigma_pca = 16). This script does both: it fits ``DPPCA(k=30)`` on a Poisson sample of the
training rows, uses the frozen projection as the model's first layer, trains with the privacy
engine (Poisson sampling, DP-SGD), then composes the PCA event into the engine's accountant and
prints the training-only and the combined epsilon and the test accuracy.

    python examples/dp_pca_digits.py [--accountant rdp] [--epochs 30] [--noise-multiplier 1]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from dpsharp.accountants import accountant as make_accountant
from dpsharp.torch import DPPCA, PrivacyEngine
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def run(
    *,
    k: int = 30,
    pca_noise_multiplier: float = 8.0,
    pca_sampling_probability: float = 1.0,
    noise_multiplier: float = 1.0,
    max_grad_norm: float = 1.0,
    batch_size: int = 64,
    epochs: int = 30,
    learning_rate: float = 0.5,
    delta: float = 1e-5,
    accountant: str = "rdp",
    seed: int = 0,
) -> dict[str, Any]:
    """Train and return the figures (epsilons, accuracy, the events) as a dict."""
    torch.manual_seed(seed)
    features, labels = load_digits(return_X_y=True)
    features = features / 16.0
    order = np.random.default_rng(seed).permutation(len(features))
    train, test = order[:1400], order[1400:]
    x_train = torch.as_tensor(features[train], dtype=torch.float32)
    y_train = torch.as_tensor(labels[train], dtype=torch.long)
    x_test = torch.as_tensor(features[test], dtype=torch.float32)
    y_test = torch.as_tensor(labels[test], dtype=torch.long)

    pca = DPPCA(k, pca_noise_multiplier, pca_sampling_probability, seed=seed)
    pca_event = pca.fit(x_train)
    model = torch.nn.Sequential(pca.projection(), torch.nn.Linear(k, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size)
    engine = PrivacyEngine(accountant=accountant)
    model, optimizer, loader = engine.make_private(
        model, optimizer, loader, max_grad_norm=max_grad_norm, noise_multiplier=noise_multiplier,
        delta=delta, sampling="poisson", seed=seed,
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
    training_epsilon = engine.epsilon(delta)
    training_events = engine.accountant.ledger
    # One number for the pipeline: the PCA event composes into the engine's accountant.
    engine.accountant.compose(pca_event)
    combined_epsilon = engine.epsilon(delta)
    pca_alone = make_accountant(accountant).compose(pca_event).epsilon(delta)
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
    return {
        "accountant": accountant,
        "delta": delta,
        "steps": engine.steps,
        "training_epsilon": training_epsilon,
        "pca_epsilon": pca_alone,
        "combined_epsilon": combined_epsilon,
        "test_accuracy": accuracy,
        "pca_event": repr(pca_event),
        "training_events": [(repr(e), c) for e, c in training_events],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run, print the result as JSON and return it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--accountant", default="rdp", help="accountant name")
    parser.add_argument("--epochs", type=int, default=30, help="passes over the data")
    parser.add_argument("--pca-noise-multiplier", type=float, default=8.0,
                        help="noise multiplier of the DP-PCA covariance (dpsharp.torch.DPPCA)")
    parser.add_argument("--noise-multiplier", type=float, default=1.0,
                        help="DP-SGD noise std / clipping norm")
    # the former spellings, kept working and out of --help
    parser.add_argument("--pca-noise", dest="pca_noise_multiplier", type=float,
                        help=argparse.SUPPRESS)
    parser.add_argument("--noise", dest="noise_multiplier", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the split, the sampler and the noise")
    args = parser.parse_args(argv)
    result = run(
        accountant=args.accountant, epochs=args.epochs,
        pca_noise_multiplier=args.pca_noise_multiplier,
        noise_multiplier=args.noise_multiplier, seed=args.seed,
    )
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
