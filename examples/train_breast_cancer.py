"""Differentially private training of an MLP on scikit-learn's bundled breast-cancer data.

The data: ``sklearn.datasets.load_breast_cancer`` (569 tumours, 30 real features, benign or
malignant), split 80/20 (stratified, fixed seed). Features are standardised with the training
split's mean and standard deviation; like the papers (Yu et al. 2019 use the same kind of
data), this preprocessing is *not* privatised -- a fully private pipeline would spend part of
the budget on those statistics. The model: an MLP with hidden layers of 10, 20 and 10 ReLU
units, as in 004's cancer experiment.

Training: Poisson sampling with q = batch_size / n_train, per-example clipping to
--max-grad-norm, noise calibrated with ``dpsharp.calibrate`` so that --epochs epochs cost at most
--target-epsilon at --delta, and a ``PrivacyBudget`` of the same size that would stop training
before any step exceeded it. Prints accuracy and epsilon after every epoch (tqdm progress bar on
stderr); the last line on stdout is one JSON object with at least ``test_accuracy`` and
``epsilon``.

    python examples/train_breast_cancer.py --optimizer adam --target-epsilon 1
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from dpsharp import demo
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

OPTIMIZERS = {
    # name: (torch optimizer class, default learning rate, extra options)
    "sgd": (torch.optim.SGD, 0.5, {"momentum": 0.5}),
    "adam": (torch.optim.Adam, 1e-2, {}),
    "adagrad": (torch.optim.Adagrad, 0.1, {}),
}

accuracy = demo.accuracy
default_accountant = demo.default_accountant


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(30, 10),
        nn.ReLU(),
        nn.Linear(10, 20),
        nn.ReLU(),
        nn.Linear(20, 10),
        nn.ReLU(),
        nn.Linear(10, 2),
    )


def load(seed: int) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    features, labels = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    mean, std = x_train.mean(0), x_train.std(0)  # not privatised: see the module docstring

    def tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor((x - mean) / std, dtype=torch.float32), torch.tensor(y)

    train = TensorDataset(*tensors(x_train, y_train))
    return (train, *tensors(x_test, y_test))


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    return demo.run_example(
        argv,
        description=__doc__.split("\n\n")[0],
        dataset="breast_cancer",
        label="breast cancer",
        load=load,
        build_model=build_model,
        optimizers=OPTIMIZERS,
        target_epsilon=1.0,
        epochs=20,
        batch_size=64,
    )


if __name__ == "__main__":
    main()
