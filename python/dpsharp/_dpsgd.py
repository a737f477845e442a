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
  (Yu et al. 2019, Theorem 2). This is accounted under *zero-out* (Kairouz et al. 2021:
  neighbouring datasets differ in one example being replaced by a null example whose clipped
  gradient is 0), where the clipped sum has sensitivity C: one epoch is
  ``Shuffled(Gaussian(sigma), B, n)``, the same numbers as before for the same sigma. It is not
  an add/remove guarantee (adding an example shifts the others across batch boundaries, see
  :class:`dpsharp.events.Shuffled`), and asking for one is refused. Under replace one
  (``neighbouring="replace_one"``, sensitivity 2C) the epoch is ``Shuffled(Gaussian(sigma / 2),
  B, n)``. A partial epoch is charged as a whole one (each example is still used at most once
  in it), so T steps cost ceil(T / ceil(n / B)) epochs.
* ``fixed``: each batch is a uniformly random subset of exactly B examples, drawn without
  replacement (Wang, Balle, Kasiviswanathan 2019). That analysis is under *replace one*, where
  the clipped sum has sensitivity 2C, so one step is
  ``SampledWithoutReplacement(Gaussian(sigma / 2), B, n)`` (see :mod:`dpsharp.events`).

``poisson`` may also be stated under zero-out (the same events and numbers: a null example in a
Poisson sample is as good as an absent one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpsharp._validation import require_count, require_positive_finite
from dpsharp.events import (
    RELATION_WORDS,
    Event,
    Gaussian,
    Neighbouring,
    PoissonSampled,
    SampledWithoutReplacement,
    Shuffled,
)

__all__ = [
    "NEIGHBOURING_FACTORS",
    "SAMPLING_SCHEMES",
    "DPSGDRun",
    "resolve_neighbouring",
    "steps_for_epochs",
]

SAMPLING_SCHEMES = ("poisson", "shuffle", "fixed")

#: For each sampling scheme, the relations its accounting can be stated under (the first is the
#: default) with the factor that turns sigma = noise std / C into the event's noise multiplier:
#: 1 where the clipped sum has sensitivity C (add/remove, zero-out), 1/2 where it has 2C
#: (replace one). A relation missing here is refused by :func:`resolve_neighbouring`.
NEIGHBOURING_FACTORS: dict[str, dict[Neighbouring, float]] = {
    "poisson": {Neighbouring.ADD_REMOVE: 1.0, Neighbouring.ZERO_OUT: 1.0},
    "shuffle": {Neighbouring.ZERO_OUT: 1.0, Neighbouring.REPLACE_ONE: 0.5},
    "fixed": {Neighbouring.REPLACE_ONE: 0.5},
}
_EVENT_TYPES: dict[str, type[Event]] = {
    "poisson": PoissonSampled,
    "shuffle": Shuffled,
    "fixed": SampledWithoutReplacement,
}


def resolve_neighbouring(
    sampling: str, neighbouring: Neighbouring | str | None = None
) -> Neighbouring:
    """The relation a ``sampling`` scheme ("poisson", "shuffle", "fixed") is accounted under:
    ``neighbouring`` if its analysis holds there, the scheme's default if it is None.

    Raises :class:`dpsharp.accountants.base.UnsupportedEventError` (a ValueError) for a
    relation the scheme's analysis does not hold under, saying why and what to use instead
    (e.g. reshuffling under add/remove one).
    """
    if sampling not in NEIGHBOURING_FACTORS:
        raise ValueError(
            f"sampling must be one of {', '.join(SAMPLING_SCHEMES)}, got {sampling!r}"
        )
    factors = NEIGHBOURING_FACTORS[sampling]
    if neighbouring is None:
        return next(iter(factors))
    try:
        relation = Neighbouring(neighbouring)
    except ValueError:
        valid = ", ".join(repr(r.value) for r in Neighbouring)
        raise ValueError(f"neighbouring must be one of {valid}, got {neighbouring!r}") from None
    if relation not in factors:
        from dpsharp.accountants.base import UnsupportedEventError

        valid = " or ".join(repr(r.value) for r in factors)
        why = _EVENT_TYPES[sampling].neighbouring_refusals.get(relation)
        raise UnsupportedEventError(
            f"{sampling!r} sampling cannot be accounted under {relation.value} (it can under "
            f"{valid})" + (f": {why}" if why else "")
        )
    return relation


#: The largest step count taken from an epoch count (the integers a double holds exactly).
MAX_STEPS = 2**53


def steps_for_epochs(epochs: float, dataset_size: int, batch_size: int) -> int:
    """T = ceil(epochs * n / B), the step count of TF Privacy's ``compute_dp_sgd_privacy``
    (rounding up, so a fractional last step is charged, never dropped).

    The product is taken exactly from the double ``epochs``. A decimal epoch count a double
    cannot hold (0.1) is off by at most half a unit of its last place, 2^-53 relative: where
    the exact product lies within that of a whole number k of steps, k is what the decimal
    meant and is taken; anything further above k is a fractional last step (1.0000000005 epochs
    of n = B is 2 steps). ValueError above 2^53 steps."""
    epochs = require_positive_finite("epochs", epochs)
    exact = Fraction(epochs) * dataset_size / batch_size
    if exact > MAX_STEPS:
        raise ValueError(
            f"epochs={epochs!r} with dataset_size={dataset_size} and batch_size={batch_size} "
            f"gives more than 2^53 steps; epochs must be at most "
            f"{MAX_STEPS * batch_size / dataset_size:.6g}"
        )
    nearest = round(exact)
    if nearest >= 1 and abs(exact - nearest) <= Fraction(nearest, 2**53):
        return int(nearest)
    return math.ceil(exact)


@dataclass(frozen=True)
class DPSGDRun:
    """T steps of DP-SGD with batch size B out of n examples and noise multiplier sigma."""

    dataset_size: int
    batch_size: int
    steps: int
    noise_multiplier: float
    sampling: str = "poisson"
    #: The relation asked for (None: the scheme's default, see :data:`NEIGHBOURING_FACTORS`).
    relation: Neighbouring | str | None = None

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
        object.__setattr__(self, "relation", resolve_neighbouring(self.sampling, self.relation))

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
        """The relation the run is accounted under (zero-out for ``shuffle`` by default)."""
        assert isinstance(self.relation, Neighbouring)
        return self.relation

    @property
    def event(self) -> Event:
        """The event composed ``count`` times (one step, or one epoch for ``shuffle``)."""
        return self.event_for(self.noise_multiplier)

    def event_for(self, noise_multiplier: float) -> Event:
        """The unit event with a different noise multiplier (used by calibration)."""
        sigma = require_positive_finite("noise_multiplier", noise_multiplier)
        inner = Gaussian(sigma * NEIGHBOURING_FACTORS[self.sampling][self.neighbouring])
        if self.sampling == "poisson":
            return PoissonSampled(inner, self.sampling_probability)
        if self.sampling == "shuffle":
            return Shuffled(inner, self.batch_size, self.dataset_size)
        return SampledWithoutReplacement(inner, self.batch_size, self.dataset_size)

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
        if self.neighbouring is not Neighbouring.ADD_REMOVE:
            options["neighbouring"] = self.neighbouring.value
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
                f"{self._relation_sentence()} If your data loader instead shuffles the data and "
                "takes fixed-size batches, these numbers do not apply: use --sampling shuffle or "
                "--sampling fixed."
            )
        if self.sampling == "shuffle":
            scale = ""
            if self.neighbouring is Neighbouring.REPLACE_ONE:
                scale = (
                    " The clipped sum has sensitivity 2C there: each epoch is accounted as a "
                    f"Gaussian with noise multiplier sigma/2 = {self.noise_multiplier / 2:.6g}."
                )
            return (
                f"Random reshuffling: each epoch the {n} examples are permuted and cut into "
                f"{self.batches_per_epoch} disjoint batches of {b}, so each example is used once "
                f"per epoch; {self.steps} steps are charged as {self.count} whole epochs. "
                "Accounted by parallel composition within an epoch (Yu et al. 2019, Theorem 2); "
                "accountants that only analyse Poisson or fixed-size sampling are not applicable. "
                f"{self._relation_sentence()}{scale} Adding an example shifts the others across "
                "batch boundaries, so for an add/remove guarantee use --sampling poisson."
            )
        return (
            f"Fixed-size batches: each batch is a uniformly random subset of exactly {b} of the "
            f"{n} examples, drawn without replacement (Wang, Balle, Kasiviswanathan 2019). "
            "Neighbouring datasets have the same size and differ in one example (replace one), "
            "where the clipped sum has sensitivity 2C: each step is accounted as a Gaussian "
            f"with noise multiplier sigma/2 = {self.noise_multiplier / 2:.6g} relative to that "
            "sensitivity."
        )

    def _relation_sentence(self) -> str:
        # the statement speaks of examples, as the rest of a DP-SGD statement does
        words = RELATION_WORDS[self.neighbouring].replace("record", "example")
        return f"Guarantee: {words[0].upper()}{words[1:]}."
