"""A DP-SGD run described in the vocabulary of TF Privacy and Opacus, turned into events.

The ``dpsharp`` command (and its plots) describe training as *dataset size n, batch size B,
epochs or steps, noise multiplier sigma, sampling scheme*. This module is the one place that
turns those flags into the events every accountant answers, and states in words what was
assumed. No accountant math lives here.

``noise_multiplier`` follows Opacus and TF Privacy: sigma = noise standard deviation / clipping
norm C. How it becomes an event depends on the sampling scheme:

* ``poisson``: every example joins each batch independently with probability q = B / n
  (Abadi et al. 2016). One step is ``PoissonSampled(Gaussian(sigma), q)`` under add/remove one
  (the clipped sum has sensitivity C), composed T times.
* ``shuffle``: the data are reshuffled every epoch and cut into ceil(n / B) disjoint batches
  (Yu et al. 2019, Theorem 2). One epoch is ``Shuffled(Gaussian(sigma), B, n)``; a partial
  epoch is charged as a whole one (each example is still used at most once in it), so T steps
  cost ceil(T / ceil(n / B)) epochs.
* ``fixed``: each batch is a uniformly random subset of exactly B examples, drawn without
  replacement (Wang, Balle, Kasiviswanathan 2019). That analysis is under *replace one*, where
  the clipped sum has sensitivity 2C, so one step is
  ``SampledWithoutReplacement(Gaussian(sigma / 2), B, n)`` (see :mod:`dpsharp.events`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsharp._validation import require_count, require_positive_finite
from dpsharp.events import (
    Event,
    Gaussian,
    Neighbouring,
    PoissonSampled,
    SampledWithoutReplacement,
    Shuffled,
)

__all__ = ["SAMPLING_SCHEMES", "DPSGDRun", "steps_for_epochs"]

SAMPLING_SCHEMES = ("poisson", "shuffle", "fixed")


def steps_for_epochs(epochs: float, dataset_size: int, batch_size: int) -> int:
    """T = ceil(epochs * n / B), the step count of TF Privacy's ``compute_dp_sgd_privacy``
    (rounding up, so a fractional last step is charged, never dropped)."""
    epochs = require_positive_finite("epochs", epochs)
    return math.ceil(epochs * dataset_size / batch_size - 1e-9)


@dataclass(frozen=True)
class DPSGDRun:
    """T steps of DP-SGD with batch size B out of n examples and noise multiplier sigma."""

    dataset_size: int
    batch_size: int
    steps: int
    noise_multiplier: float
    sampling: str = "poisson"

    def __post_init__(self) -> None:
        n = require_count("dataset_size", self.dataset_size, minimum=1)
        b = require_count("batch_size", self.batch_size, minimum=1)
        if b > n:
            raise ValueError(f"batch_size must be in [1, dataset_size={n}], got {b}")
        require_count("steps", self.steps, minimum=1)
        require_positive_finite("noise_multiplier", self.noise_multiplier)
        if self.sampling not in SAMPLING_SCHEMES:
            raise ValueError(
                f"sampling must be one of {', '.join(SAMPLING_SCHEMES)}, got {self.sampling!r}"
            )

    # ------------------------------------------------------------------ derived quantities
    @property
    def sampling_probability(self) -> float:
        """q = B / n."""
        return self.batch_size / self.dataset_size

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.dataset_size // self.batch_size)

    @property
    def epochs(self) -> float:
        """T * B / n (the number of passes over the data, possibly fractional)."""
        return self.steps * self.batch_size / self.dataset_size

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.REPLACE_ONE if self.sampling == "fixed" else Neighbouring.ADD_REMOVE

    @property
    def event(self) -> Event:
        """The event composed ``count`` times (one step, or one epoch for ``shuffle``)."""
        return self.event_for(self.noise_multiplier)

    def event_for(self, noise_multiplier: float) -> Event:
        """The unit event with a different noise multiplier (used by calibration)."""
        sigma = require_positive_finite("noise_multiplier", noise_multiplier)
        if self.sampling == "poisson":
            return PoissonSampled(Gaussian(sigma), self.sampling_probability)
        if self.sampling == "shuffle":
            return Shuffled(Gaussian(sigma), self.batch_size, self.dataset_size)
        return SampledWithoutReplacement(Gaussian(sigma / 2.0), self.batch_size, self.dataset_size)

    @property
    def count(self) -> int:
        return self.count_for_steps(self.steps)

    @property
    def unit(self) -> str:
        return "epoch" if self.sampling == "shuffle" else "step"

    def count_for_steps(self, steps: int) -> int:
        """How many unit events ``steps`` steps are (ceil(steps / batches per epoch) epochs
        for ``shuffle``)."""
        if self.sampling == "shuffle":
            return -(-steps // self.batches_per_epoch)
        return steps

    def accountant_options(self, name: str) -> dict[str, object]:
        """Constructor options that make accountant ``name`` analyse this run's sampling."""
        options: dict[str, object] = {}
        if self.neighbouring is Neighbouring.REPLACE_ONE:
            options["neighbouring"] = Neighbouring.REPLACE_ONE.value
        if name == "zcdp":
            options["batching"] = "reshuffle" if self.sampling == "shuffle" else "sample"
        return options

    # ------------------------------------------------------------------ words
    def assumption(self) -> str:
        """The sampling assumption in plain words, in the manner of TF Privacy's statement."""
        n, b = self.dataset_size, self.batch_size
        if self.sampling == "poisson":
            return (
                f"Poisson sampling: every example joins each batch independently with probability "
                f"q = {b}/{n} = {self.sampling_probability:.6g}, so batch sizes vary around {b}. "
                "Neighbouring datasets differ by adding or removing one example. If your data "
                "loader instead shuffles the data and takes fixed-size batches, these numbers do "
                "not apply: use --sampling shuffle or --sampling fixed."
            )
        if self.sampling == "shuffle":
            return (
                f"Random reshuffling: each epoch the {n} examples are permuted and cut into "
                f"{self.batches_per_epoch} disjoint batches of {b}, so each example is used once "
                f"per epoch; {self.steps} steps are charged as {self.count} whole epochs. "
                "Accounted by parallel composition within an epoch (Yu et al. 2019, Theorem 2); "
                "accountants that only analyse Poisson or fixed-size sampling are not applicable. "
                "Neighbouring datasets differ by adding or removing one example."
            )
        return (
            f"Fixed-size batches: each batch is a uniformly random subset of exactly {b} of the "
            f"{n} examples, drawn without replacement (Wang, Balle, Kasiviswanathan 2019). "
            "Neighbouring datasets have the same size and differ in one example (replace one), "
            "where the clipped sum has sensitivity 2C: each step is accounted as a Gaussian "
            f"with noise multiplier sigma/2 = {self.noise_multiplier / 2:.6g} relative to that "
            "sensitivity."
        )
