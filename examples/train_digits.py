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

from collections.abc import Sequence

import torch
from dpsharp import demo

OPTIMIZERS = {
    # name: (torch optimizer class, default learning rate, extra options)
    "sgd": (torch.optim.SGD, 4.0, {"momentum": 0.5}),
    "adam": (torch.optim.Adam, 1e-2, {}),
    "adagrad": (torch.optim.Adagrad, 0.1, {}),
}


build_model = demo.build_model  # the CNN of `dpsharp demo`
accuracy = demo.accuracy
load = demo.load_digits_split
default_accountant = demo.default_accountant


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    return demo.run_example(
        argv,
        description=__doc__.split("\n\n")[0],
        dataset="digits",
        label="digits",
        load=load,
        build_model=build_model,
        optimizers=OPTIMIZERS,
        target_epsilon=3.0,
        epochs=40,
        batch_size=512,
    )


if __name__ == "__main__":
    main()
