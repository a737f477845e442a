"""Noise schedules: a noise multiplier per epoch or per step, and their calibration to a budget.

A schedule is a callable ``schedule(t) -> sigma`` giving the noise multiplier (noise std /
clipping norm) of index ``t = 0, 1, 2, ...``. Its :attr:`~NoiseSchedule.unit` says what ``t``
counts: ``"epoch"`` (one sigma for every step of an epoch, as in Yu et al. 2019) or
``"step"`` (one sigma per noisy release, as ADP-SGD in Wu et al., adaptive DP-ERM).

Pre-defined decays (Yu et al. 2019, "Differentially private model publishing for deep
learning", section IV-A-2): :class:`TimeBased`, :class:`Exponential`, :class:`StepDecay`,
:class:`Polynomial`; the validation-driven rule of section IV-A-1, eqs. (8)-(10):
:class:`ValidationBased`; and the learning-rate-adapted noise of ADP-SGD: :class:`ADP`.

Nothing here does privacy arithmetic of its own. A schedule is turned into the same events
every other part of dpsharp uses (:func:`schedule_events`: one ``PoissonSampled(Gaussian
(sigma_t), q)`` per step, or one ``Shuffled(Gaussian(sigma_t), ...)`` per reshuffled epoch), and
those are composed into a registered accountant; :func:`calibrate_schedule` solves for a
schedule's free parameter with :func:`scipy.optimize.brentq` on the accountant's answer.

This module does not import torch; :func:`learning_rates_from_scheduler` only touches the torch
objects it is given.
"""

from __future__ import annotations

import abc
import copy
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
    require_real,
)
from dpsharp.events import Composed, Event, Gaussian, PoissonSampled, Repeated, Shuffled

__all__ = [
    "ADP",
    "CalibratedSchedule",
    "Constant",
    "Exponential",
    "NoiseSchedule",
    "Polynomial",
    "ScheduleHandle",
    "StepDecay",
    "TimeBased",
    "ValidationBased",
    "adagrad_norm_proxy",
    "attach_schedule",
    "calibrate_schedule",
    "count_within_budget",
    "learning_rates_from_scheduler",
    "schedule_events",
]

Unit = Literal["epoch", "step"]


def _require_unit(unit: object) -> Unit:
    if unit not in ("epoch", "step"):
        raise ValueError(f"unit must be 'epoch' or 'step', got {unit!r}")
    return unit  # type: ignore[return-value]


def _require_open_unit_interval(name: str, value: object) -> float:
    result = require_real(name, value)
    if not 0.0 < result < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {result!r}")
    return result


class NoiseSchedule(abc.ABC):
    """A noise multiplier for each index ``t = 0, 1, ...`` counted in :attr:`unit`.

    :attr:`adaptive` says whether the sigmas may depend on the run's outputs. A schedule fixed
    in advance (every decay here, :class:`ADP` of precomputed learning rates) composes as
    ordinary heterogeneous composition; an adaptive one (:class:`ValidationBased`) chooses its
    privacy parameters from earlier outputs, which only a privacy filter covers
    (:class:`dpsharp.torch.PrivacyEngine`). A subclass is adaptive unless it says otherwise.
    """

    #: Whether sigma_t may depend on earlier outputs of the run (True unless a subclass
    #: declares its sigmas fixed in advance).
    adaptive: bool = True

    def __init__(self, *, unit: Unit = "epoch") -> None:
        self._unit: Unit = _require_unit(unit)

    @property
    def unit(self) -> Unit:
        """What ``t`` counts: ``"epoch"`` or ``"step"``."""
        return self._unit

    def __call__(self, t: int) -> float:
        """The noise multiplier at index ``t`` (an integer >= 0)."""
        return self._sigma(require_count("t", t))

    @abc.abstractmethod
    def _sigma(self, t: int) -> float: ...

    def sequence(self, length: int) -> np.ndarray:
        """``[schedule(0), ..., schedule(length - 1)]`` as a float64 array."""
        length = require_count("length", length)
        return np.array([self._sigma(t) for t in range(length)], dtype=np.float64)

    def _params(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({params}, unit={self._unit!r})"


class Constant(NoiseSchedule):
    """sigma_t = sigma: the uniform allocation (Abadi et al. 2016; the baseline of Yu et al.)."""

    adaptive = False

    def __init__(self, sigma: float, *, unit: Unit = "epoch") -> None:
        super().__init__(unit=unit)
        self.sigma = require_positive_finite("sigma", sigma)

    def _sigma(self, t: int) -> float:
        return self.sigma

    def _params(self) -> dict[str, Any]:
        return {"sigma": self.sigma}


class TimeBased(NoiseSchedule):
    """Time-based decay, sigma_t = sigma_0 / (1 + k t), k > 0 (Yu et al. 2019, IV-A-2a)."""

    adaptive = False

    def __init__(self, sigma_0: float, k: float, *, unit: Unit = "epoch") -> None:
        super().__init__(unit=unit)
        self.sigma_0 = require_positive_finite("sigma_0", sigma_0)
        self.k = require_positive_finite("k", k)

    def _sigma(self, t: int) -> float:
        return self.sigma_0 / (1.0 + self.k * t)

    def _params(self) -> dict[str, Any]:
        return {"sigma_0": self.sigma_0, "k": self.k}


class Exponential(NoiseSchedule):
    """Exponential decay, sigma_t = sigma_0 exp(-k t), k > 0 (Yu et al. 2019, IV-A-2b)."""

    adaptive = False

    def __init__(self, sigma_0: float, k: float, *, unit: Unit = "epoch") -> None:
        super().__init__(unit=unit)
        self.sigma_0 = require_positive_finite("sigma_0", sigma_0)
        self.k = require_positive_finite("k", k)

    def _sigma(self, t: int) -> float:
        value = self.sigma_0 * math.exp(-self.k * t)
        if value <= 0.0:
            raise ValueError(
                f"Exponential(sigma_0={self.sigma_0}, k={self.k}) underflows to sigma = 0 at t={t}"
            )
        return value

    def _params(self) -> dict[str, Any]:
        return {"sigma_0": self.sigma_0, "k": self.k}


class StepDecay(NoiseSchedule):
    """Step decay, sigma_t = sigma_0 k^floor(t / period), 0 < k < 1, period >= 1
    (Yu et al. 2019, IV-A-2c)."""

    adaptive = False

    def __init__(self, sigma_0: float, k: float, period: int, *, unit: Unit = "epoch") -> None:
        super().__init__(unit=unit)
        self.sigma_0 = require_positive_finite("sigma_0", sigma_0)
        self.k = _require_open_unit_interval("k", k)
        self.period = require_count("period", period, minimum=1)

    def _sigma(self, t: int) -> float:
        value = self.sigma_0 * self.k ** (t // self.period)
        if value <= 0.0:
            raise ValueError(f"{self!r} underflows to sigma = 0 at t={t}")
        return value

    def _params(self) -> dict[str, Any]:
        return {"sigma_0": self.sigma_0, "k": self.k, "period": self.period}


class Polynomial(NoiseSchedule):
    """Polynomial decay (Yu et al. 2019, IV-A-2d):

    sigma_t = (sigma_0 - sigma_end) (1 - t / period)^k + sigma_end for t < period, and
    sigma_end for t >= period; k > 0, 0 < sigma_end <= sigma_0, period >= 1.
    """

    adaptive = False

    def __init__(
        self, sigma_0: float, k: float, sigma_end: float, period: int, *, unit: Unit = "epoch"
    ) -> None:
        super().__init__(unit=unit)
        self.sigma_0 = require_positive_finite("sigma_0", sigma_0)
        self.k = require_positive_finite("k", k)
        self.sigma_end = require_positive_finite("sigma_end", sigma_end)
        if self.sigma_end > self.sigma_0:
            raise ValueError(
                f"sigma_end must be in (0, sigma_0={self.sigma_0}], got {self.sigma_end!r}"
            )
        self.period = require_count("period", period, minimum=1)

    def _sigma(self, t: int) -> float:
        if t >= self.period:
            return self.sigma_end
        return (self.sigma_0 - self.sigma_end) * (1.0 - t / self.period) ** self.k + self.sigma_end

    def _params(self) -> dict[str, Any]:
        return {
            "sigma_0": self.sigma_0,
            "k": self.k,
            "sigma_end": self.sigma_end,
            "period": self.period,
        }


class ValidationBased(NoiseSchedule):
    """Validation-driven decay (Yu et al. 2019, section IV-A-1, eqs. (8)-(10)).

    After each validation epoch e = 1, 2, ... the caller reports the accuracy S_e on a
    *public* validation set with :meth:`observe`. Every ``period`` validation epochs (at
    e = period, 2 period, ...) the moving average of eq. (10),

        S_bar_e = (1/m) sum_{i=e-m+1}^{e} S_i,

    is compared with the value at the previous check (S_bar = 0 before the first check, the
    paper's S_0 = 0), and by eqs. (8)-(9) the noise multiplier becomes

        sigma' = k sigma   if S_bar_e - S_bar_previous <= threshold,   else sigma,

    applied from the next epoch until the next check. ``period >= m`` (as the paper requires),
    so the average always covers m reported accuracies.

    Validation on a public set costs no privacy; on a set drawn from the private training data
    the decisions would depend on private records and would have to be accounted. This class
    does not account them, so it requires ``validation_set="public"`` and refuses anything
    else.

    ``schedule(t)`` returns the current sigma for any ``t`` (the schedule is decided online and
    has no precomputed future); :attr:`history` records (validation epoch, sigma after it).

    The accuracy is measured on a model trained on the private data, so each sigma is chosen
    from earlier outputs: the schedule is :attr:`adaptive`, and an engine enforces a budget on
    it only through a privacy filter (Feldman and Zrnic 2021), refusing accountants without one.
    """

    adaptive = True

    def __init__(
        self,
        sigma_0: float,
        k: float,
        *,
        m: int,
        threshold: float,
        period: int,
        validation_set: str,
        unit: Unit = "epoch",
    ) -> None:
        super().__init__(unit=unit)
        if validation_set != "public":
            raise ValueError(
                "validation_set must be 'public' (a set disjoint from the private training data "
                "whose use costs no privacy); a validation set drawn from the private data would "
                f"have to be accounted, which ValidationBased does not do; got {validation_set!r}"
            )
        self.sigma_0 = require_positive_finite("sigma_0", sigma_0)
        self.k = _require_open_unit_interval("k", k)
        self.m = require_count("m", m, minimum=1)
        self.threshold = require_real("threshold", threshold)
        self.period = require_count("period", period, minimum=1)
        if self.period < self.m:
            raise ValueError(f"period must be an integer >= m={self.m}, got {self.period}")
        self._sigma_now = self.sigma_0
        self._accuracies: list[float] = []
        self._last_average = 0.0
        self.history: list[tuple[int, float]] = []

    @property
    def sigma(self) -> float:
        """The noise multiplier in force now."""
        return self._sigma_now

    @property
    def validation_epochs(self) -> int:
        return len(self._accuracies)

    def observe(self, accuracy: float) -> float:
        """Report the public validation accuracy of the epoch just finished; returns the sigma
        to use from now on."""
        accuracy = require_real("accuracy", accuracy)
        self._accuracies.append(accuracy)
        e = len(self._accuracies)
        if e % self.period == 0:
            average = math.fsum(self._accuracies[e - self.m :]) / self.m
            if average - self._last_average <= self.threshold:
                self._sigma_now = self.k * self._sigma_now
            self._last_average = average
        self.history.append((e, self._sigma_now))
        return self._sigma_now

    def _sigma(self, t: int) -> float:
        return self._sigma_now

    def state_dict(self) -> dict[str, Any]:
        return {
            "sigma": self._sigma_now,
            "accuracies": list(self._accuracies),
            "last_average": self._last_average,
            "history": [list(item) for item in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sigma_now = require_positive_finite("sigma", state["sigma"])
        self._accuracies = [require_real("accuracies", a) for a in state["accuracies"]]
        self._last_average = require_real("last_average", state["last_average"])
        self.history = [(int(e), float(s)) for e, s in state["history"]]

    def _params(self) -> dict[str, Any]:
        return {
            "sigma_0": self.sigma_0,
            "k": self.k,
            "m": self.m,
            "threshold": self.threshold,
            "period": self.period,
        }


class ADP(NoiseSchedule):
    """ADP-SGD noise adapted to the learning rate (Wu et al., Theorem 4.2 and
    Remark 4.1): sigma_t proportional to 1 / sqrt(eta_t), here

        sigma_t = scale * sqrt(eta_0 / eta_t),

    so sigma_0 = scale, sigma_t sqrt(eta_t) = scale sqrt(eta_0) is constant, and the noise on
    the update, eta_t sigma_t, decays like sqrt(eta_t), slower than eta_t. A constant learning
    rate gives constant noise. The learning rates must be known before training (the privacy
    cost of step t depends on sigma_t): take them from a torch LR scheduler with
    :func:`learning_rates_from_scheduler`, or, for the AdaGrad-norm step size of section 5.2,
    from the proxy :func:`adagrad_norm_proxy`.

    ``scale`` is the free parameter: :meth:`calibrated` sets it so the run meets the same
    budget as the constant-noise run it replaces, with the exact accountant.
    """

    adaptive = False

    def __init__(
        self, learning_rates: Sequence[float] | np.ndarray, *, scale: float, unit: Unit = "step"
    ) -> None:
        super().__init__(unit=unit)
        self.learning_rates = _require_learning_rates(learning_rates)
        self.scale = require_positive_finite("scale", scale)
        self._sigmas = self.scale * np.sqrt(self.learning_rates[0] / self.learning_rates)

    def __len__(self) -> int:
        return int(self.learning_rates.size)

    def _sigma(self, t: int) -> float:
        if t >= self.learning_rates.size:
            raise ValueError(
                f"t must be in [0, {self.learning_rates.size - 1}] (the learning rates given), got {t}"
            )
        return float(self._sigmas[t])

    def sequence(self, length: int | None = None) -> np.ndarray:
        if length is None:
            return self._sigmas.copy()
        return super().sequence(length)

    @classmethod
    def calibrated(
        cls,
        learning_rates: Sequence[float] | np.ndarray,
        *,
        sampling_probability: float,
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        accountant: str = "pld",
        accountant_options: dict[str, Any] | None = None,
        rtol: float = 1e-3,
    ) -> CalibratedSchedule:
        """The ADP schedule over ``len(learning_rates)`` Poisson-sampled steps whose certified
        epsilon at ``delta`` equals (and does not exceed) a target: ``epsilon`` if given, else
        the epsilon of the constant run with ``noise_multiplier`` that it replaces (both
        computed by the same accountant)."""
        rates = _require_learning_rates(learning_rates)
        q = require_probability("sampling_probability", sampling_probability)
        if delta is None:
            raise ValueError("delta must be given (in (0, 1))")
        delta = require_delta(delta)
        steps = int(rates.size)
        if (noise_multiplier is None) == (epsilon is None):
            raise ValueError("give exactly one of noise_multiplier (the constant run) or epsilon")
        if noise_multiplier is not None:
            sigma = require_positive_finite("noise_multiplier", noise_multiplier)
            acc = _new_accountant(accountant, accountant_options)
            acc.compose(PoissonSampled(Gaussian(sigma), q), steps)
            epsilon = float(acc.epsilon(delta))
        return calibrate_schedule(
            lambda s: cls(rates, scale=s),
            length=steps,
            sampling_probability=q,
            epsilon=epsilon,
            delta=delta,
            accountant=accountant,
            accountant_options=accountant_options,
            initial=noise_multiplier if noise_multiplier is not None else 1.0,
            rtol=rtol,
        )

    def _params(self) -> dict[str, Any]:
        return {"learning_rates": f"<{self.learning_rates.size} values>", "scale": self.scale}


def _require_learning_rates(learning_rates: Sequence[float] | np.ndarray) -> np.ndarray:
    if isinstance(learning_rates, (str, bytes)) or not isinstance(learning_rates, Iterable):
        raise TypeError("learning_rates must be a sequence of positive numbers")
    values = [require_real(f"learning_rates[{i}]", v) for i, v in enumerate(learning_rates)]
    if not values:
        raise ValueError("learning_rates must be non-empty")
    rates = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(rates <= 0.0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"learning_rates[{i}] must be in (0, inf), got {rates[i]!r}")
    return rates


def adagrad_norm_proxy(
    learning_rate: float, *, steps: int, b0: float, gradient_bound: float
) -> np.ndarray:
    """The step sizes ADP-SGD assumes for AdaGrad-norm (Wu et al., section 5.2).

    AdaGrad-norm sets eta_t = eta / b_{t+1} with b_{t+1}^2 = b_t^2 + ||g_t||^2, known only during
    training. The paper replaces b_t by its value under a gradient-norm bound G (the clipping
    norm after clipping, or a smaller proxy of the observed norms): b_t^2 ~ b_0^2 + t G^2, so

        eta_t = eta / sqrt(b0^2 + (t + 1) G^2),   t = 0, ..., steps - 1,

    fixed in advance; :class:`ADP` then adapts sigma_t to these values.
    """
    eta = require_positive_finite("learning_rate", learning_rate)
    steps = require_count("steps", steps, minimum=1)
    b0 = require_positive_finite("b0", b0)
    bound = require_positive_finite("gradient_bound", gradient_bound)
    t = np.arange(1, steps + 1, dtype=np.float64)
    return eta / np.sqrt(b0 * b0 + t * bound * bound)


def learning_rates_from_scheduler(
    scheduler: Any, steps: int, *, param_group: int = 0
) -> np.ndarray:
    """The next ``steps`` learning rates a torch LR scheduler will set, found by stepping a copy.

    ``scheduler`` is a ``torch.optim.lr_scheduler.LRScheduler`` whose values do not depend on
    training (ReduceLROnPlateau does and is refused). The scheduler and its optimizer are
    deep-copied (the model's parameters are shared, not copied) and the copy is stepped
    ``steps`` times; the originals are untouched. Entry t is the rate in force for step t.
    """
    steps = require_count("steps", steps, minimum=1)
    param_group = require_count("param_group", param_group)
    optimizer = getattr(scheduler, "optimizer", None)
    if optimizer is None or not hasattr(scheduler, "step"):
        raise TypeError("scheduler must be a torch LR scheduler with an .optimizer")
    if type(scheduler).__name__ == "ReduceLROnPlateau":
        raise ValueError(
            "scheduler: ReduceLROnPlateau depends on the metrics seen during training, so its "
            "learning rates are not known in advance; ADP needs a predetermined schedule"
        )
    if param_group >= len(optimizer.param_groups):
        raise ValueError(
            f"param_group must be in [0, {len(optimizer.param_groups) - 1}], got {param_group}"
        )
    memo = {id(p): p for group in optimizer.param_groups for p in group["params"]}
    twin = copy.deepcopy(scheduler, memo)
    rates = np.empty(steps, dtype=np.float64)
    with warnings.catch_warnings():
        # Stepping a scheduler without an optimizer.step() warns; here that is intended.
        warnings.simplefilter("ignore")
        for t in range(steps):
            rates[t] = float(twin.optimizer.param_groups[param_group]["lr"])
            twin.step()
    return _require_learning_rates(rates)


# ---------------------------------------------------------------------------------- accounting


def _new_accountant(name: str, options: dict[str, Any] | None) -> Any:
    import importlib

    from dpsharp.accountants import accountant as make
    from dpsharp.accountants import available

    if isinstance(name, str) and name.isidentifier() and name not in available():
        # Accountant modules register on import; load dpsharp.accountants.<name> if it exists.
        try:
            importlib.import_module(f"dpsharp.accountants.{name}")
        except ModuleNotFoundError:
            pass
    return make(name, **(options or {}))


def _relation_options(
    options: dict[str, Any] | None, event_options: dict[str, Any]
) -> dict[str, Any]:
    """The accountant options for events built from ``event_options``: reshuffled epochs
    (``batch_size`` / ``dataset_size``) are accounted under zero-out unless the options name a
    relation (add/remove is refused by the accountant: dpsharp.events.Shuffled)."""
    result = dict(options or {})
    if ("batch_size" in event_options or "dataset_size" in event_options) and (
        "neighbouring" not in result
    ):
        result["neighbouring"] = "zero_out"
    return result


def schedule_events(
    schedule: NoiseSchedule | Sequence[float] | np.ndarray,
    length: int,
    *,
    sampling_probability: float | None = None,
    steps_per_epoch: int | None = None,
    batch_size: int | None = None,
    dataset_size: int | None = None,
) -> Event:
    """The events of ``length`` indices (steps or epochs, the schedule's unit) of a run.

    * Poisson sampling (``sampling_probability`` q): every step is
      ``PoissonSampled(Gaussian(sigma), q)``; for an epoch schedule each epoch is
      ``steps_per_epoch`` such steps with that epoch's sigma.
    * Random reshuffling (``batch_size`` and ``dataset_size``; epoch schedules only): each epoch
      is ``Shuffled(Gaussian(sigma_t), batch_size, dataset_size)`` (Yu et al. 2019, Theorem 2),
      valid under zero-out (same sigma) or replace one, never add/remove
      (:class:`dpsharp.events.Shuffled`); :func:`count_within_budget` and
      :func:`calibrate_schedule` account it under zero-out unless told otherwise.

    Consecutive equal sigmas are grouped with :class:`Repeated` (several groups in a
    :class:`Composed`); the multiset of leaves is exactly one event per step (or epoch).
    """
    length = require_count("length", length)
    if isinstance(schedule, NoiseSchedule):
        if schedule.adaptive:
            raise ValueError(
                f"schedule: {type(schedule).__name__} is adaptive (its sigmas are decided online, "
                "from the run's outputs), so its events are not known in advance; run it in a "
                "PrivacyEngine with adaptive_noise=True (a privacy filter enforces the budget)"
            )
        unit: Unit = schedule.unit
        sigmas = schedule.sequence(length)
    else:
        unit = "step"
        sigmas = np.asarray([require_positive_finite(f"sigmas[{i}]", s) for i, s in enumerate(schedule)])
        if sigmas.size < length:
            raise ValueError(f"length must be <= {sigmas.size} (the sigmas given), got {length}")
        sigmas = sigmas[:length]
    if steps_per_epoch is not None and unit != "epoch":
        raise ValueError(
            "steps_per_epoch is for an epoch schedule (one sigma per epoch); "
            + ("a list of sigmas is one sigma per step" if not isinstance(schedule, NoiseSchedule)
               else f"this schedule's unit is {unit!r}")
            + ": give one sigma per step, or an epoch-unit NoiseSchedule"
        )
    poisson = sampling_probability is not None
    shuffled = batch_size is not None or dataset_size is not None
    if poisson == shuffled:
        raise ValueError(
            "give either sampling_probability (Poisson sampling) or batch_size and dataset_size "
            "(random reshuffling)"
        )
    if poisson:
        q = require_probability("sampling_probability", sampling_probability)
        if unit == "epoch":
            if steps_per_epoch is None:
                raise ValueError("steps_per_epoch must be given for an epoch schedule with Poisson sampling")
            per = require_count("steps_per_epoch", steps_per_epoch, minimum=1)
        else:
            per = 1
        make: Callable[[float], Event] = lambda s: PoissonSampled(Gaussian(s), q)
    else:
        if unit != "epoch":
            raise ValueError("random reshuffling is accounted per epoch: the schedule's unit must be 'epoch'")
        if batch_size is None or dataset_size is None:
            raise ValueError("random reshuffling needs both batch_size and dataset_size")
        b = require_count("batch_size", batch_size, minimum=1)
        n = require_count("dataset_size", dataset_size, minimum=1)
        per = 1
        make = lambda s: Shuffled(Gaussian(s), b, n)
    events: list[Event] = []
    start = 0
    while start < sigmas.size:
        stop = start + 1
        while stop < sigmas.size and sigmas[stop] == sigmas[start]:
            stop += 1
        leaf = make(float(sigmas[start]))
        reps = (stop - start) * per
        events.append(leaf if reps == 1 else Repeated(leaf, reps))
        start = stop
    if len(events) == 1:
        return events[0]
    return Composed(tuple(events))


def _spent(acc: Any, *, rho: float | None, delta: float | None) -> float:
    if rho is not None:
        if not hasattr(acc, "rho"):
            raise ValueError(f"a rho budget needs a zCDP accountant; {type(acc).__name__} has no rho")
        return float(acc.rho)
    assert delta is not None
    return float(acc.epsilon(delta))


def _check_target(
    epsilon: float | None, delta: float | None, rho: float | None
) -> tuple[float, float | None, float | None]:
    if rho is not None:
        if epsilon is not None or delta is not None:
            raise ValueError("give either rho or (epsilon, delta), not both")
        return require_positive_finite("rho", rho), None, rho
    if epsilon is None or delta is None:
        raise ValueError("give a target: rho, or epsilon and delta")
    return require_positive_finite("epsilon", epsilon), require_delta(delta), None


def count_within_budget(
    schedule: NoiseSchedule,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    rho: float | None = None,
    accountant: str = "zcdp",
    accountant_options: dict[str, Any] | None = None,
    max_count: int = 100_000,
    **event_options: Any,
) -> tuple[int, Any]:
    """How many indices (epochs or steps) of ``schedule`` fit in the budget.

    Index t = 0, 1, ... is composed (as :func:`schedule_events` describes it) while the
    accountant's answer after composing it stays <= the budget; the first index whose cost
    would exceed the budget is not run (the stopping rule of Yu et al. 2019, Table II).
    Returns (count, the accountant holding exactly the counted indices).
    """
    target, delta, rho = _check_target(epsilon, delta, rho)
    max_count = require_count("max_count", max_count, minimum=1)
    if schedule.adaptive:
        raise ValueError(  # noqa: TRY004 - a valid schedule, but not one known in advance
            f"schedule: {type(schedule).__name__} is adaptive (decided online); run it in the "
            "engine"
        )
    acc = _new_accountant(accountant, _relation_options(accountant_options, event_options))
    for t in range(max_count):
        sigma = schedule(t)
        event = schedule_events(Constant(sigma, unit=schedule.unit), 1, **event_options)
        trial = copy.deepcopy(acc)
        trial.compose(event)
        if _spent(trial, rho=rho, delta=delta) > target:
            return t, acc
        acc = trial
    raise ValueError(f"max_count: the budget was not exhausted within {max_count} indices")


@dataclass(frozen=True)
class CalibratedSchedule:
    """A schedule whose free parameter was solved for a budget.

    ``achieved`` <= ``target`` always (epsilon at ``delta``, or rho), and
    ``target - achieved <= rtol * target`` unless ``parameter`` hit the bracket's edge.
    """

    schedule: NoiseSchedule
    parameter: float
    achieved: float
    target: float
    delta: float | None
    accountant: str
    rtol: float


def calibrate_schedule(
    family: Callable[[float], NoiseSchedule],
    *,
    length: int,
    epsilon: float | None = None,
    delta: float | None = None,
    rho: float | None = None,
    sampling_probability: float | None = None,
    steps_per_epoch: int | None = None,
    batch_size: int | None = None,
    dataset_size: int | None = None,
    accountant: str = "pld",
    accountant_options: dict[str, Any] | None = None,
    bracket: tuple[float, float] = (1e-2, 1e3),
    initial: float = 1.0,
    rtol: float = 1e-3,
) -> CalibratedSchedule:
    """Solve for the free parameter p of ``family(p)`` (sigma_0 of a decay, the scale of
    :class:`ADP`: more p means more noise everywhere) so that ``length`` indices of the schedule
    spend the target: epsilon at delta (default: the tight "pld" accountant) or rho (a zCDP
    accountant, e.g. ``accountant="zcdp"`` with reshuffled epochs).

    The spent budget f(p) is computed by composing :func:`schedule_events` into a fresh
    accountant; the root is bracketed by doubling / halving from ``initial`` inside ``bracket``,
    then :func:`scipy.optimize.brentq` finds f(p) = target; the answer is then moved to
    the safe side so that f(p) <= target (conservative, like :mod:`dpsharp.calibrate`) and
    target - f(p) <= rtol * target.
    """
    from scipy.optimize import brentq

    target, delta, rho = _check_target(epsilon, delta, rho)
    length = require_count("length", length, minimum=1)
    rtol = require_positive_finite("rtol", rtol)
    if rtol >= 1.0:
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    low, high = (require_positive_finite("bracket[0]", bracket[0]), require_positive_finite("bracket[1]", bracket[1]))
    if not low < high:
        raise ValueError(f"bracket must satisfy bracket[0] < bracket[1], got {bracket!r}")
    event_options = {
        "sampling_probability": sampling_probability,
        "steps_per_epoch": steps_per_epoch,
        "batch_size": batch_size,
        "dataset_size": dataset_size,
    }
    event_options = {k: v for k, v in event_options.items() if v is not None}

    def spent(p: float) -> float:
        acc = _new_accountant(accountant, _relation_options(accountant_options, event_options))
        acc.compose(schedule_events(family(p), length, **event_options))
        return _spent(acc, rho=rho, delta=delta)

    # Bracket the root by doubling / halving from ``initial`` (never evaluating the accountant at
    # needlessly extreme parameters), within [low, high].
    p = min(max(require_positive_finite("initial", initial), low), high)
    f_p = spent(p)
    if f_p > target:
        while f_p > target:
            if p >= high:
                raise ValueError(
                    f"bracket: even the largest parameter {high} spends {f_p:.6g} > target "
                    f"{target:.6g}; widen the bracket"
                )
            lo_p, p = p, min(2.0 * p, high)
            f_p = spent(p)
        low, high = lo_p, p
    else:
        while f_p <= target:
            if p <= low:
                # Even the least noise in the bracket fits: report the edge, not a fake root.
                return CalibratedSchedule(family(low), low, f_p, target, delta, accountant, rtol)
            hi_p, p = p, max(0.5 * p, low)
            f_p = spent(p)
        low, high = p, hi_p
    # Root of log f - log target: f falls over orders of magnitude across the bracket.
    log_target = math.log(target)
    root = brentq(
        lambda p: math.log(spent(p)) - log_target,
        low,
        high,
        xtol=1e-12,
        rtol=min(rtol, 1e-3) * 1e-2,
    )
    p = root
    achieved = spent(p)
    # Conservative side: step up until achieved <= target (monotone in p).
    step = max(rtol * 1e-2, 1e-9)
    while achieved > target:
        p *= 1.0 + step
        step *= 2.0
        achieved = spent(p)
    if target - achieved > rtol * target:
        raise ValueError(
            f"rtol: could not get within {rtol} of the target (achieved {achieved:.6g}, target "
            f"{target:.6g}); the accountant's answer may not be continuous in the parameter"
        )
    return CalibratedSchedule(family(p), p, achieved, target, delta, accountant, rtol)


# ---------------------------------------------------------------------------------- engine


class ScheduleHandle:
    """What :func:`attach_schedule` returns: the schedule in force, the sigmas it applied, and
    :meth:`detach`."""

    def __init__(self, optimizer: Any, schedule: NoiseSchedule, loader: Any) -> None:
        self.optimizer = optimizer
        self.schedule = schedule
        self.loader = loader
        # A fixed schedule attached after releases started may have been chosen from them.
        self.online = bool(schedule.adaptive) or int(optimizer.releases) > 0
        #: (release index, schedule index t, sigma) of every release that went out.
        self.applied: list[tuple[int, int, float]] = []
        self._pending: tuple[int, float] | None = None

    def index(self) -> int:
        """The schedule index of the next release: the epoch (from 0) or the step."""
        if self.schedule.unit == "epoch":
            return max(int(self.loader.epoch) - 1, 0)
        return int(self.optimizer.releases)

    def _before_release(self, optimizer: Any) -> None:
        t = self.index()
        sigma = self.schedule(t)
        setter = getattr(optimizer, "_set_noise_multiplier", None)
        if setter is not None:
            setter(sigma, online=self.online)
        else:
            optimizer.noise_multiplier = sigma
        self._pending = (t, sigma)

    def _after_release(self, optimizer: Any) -> None:
        t = self._pending[0] if self._pending is not None else self.index()
        self.applied.append((int(optimizer.releases) - 1, t, float(optimizer.noise_multiplier)))
        self._pending = None

    def detach(self) -> None:
        checks = self.optimizer._budget_checks
        if self._before_release in checks:
            checks.remove(self._before_release)
        hooks = self.optimizer._release_hooks
        if self._after_release in hooks:
            hooks.remove(self._after_release)


def attach_schedule(engine_or_optimizer: Any, schedule: NoiseSchedule, *, loader: Any = None) -> ScheduleHandle:
    """Drive a :class:`~dpsharp.torch.DPOptimizer`'s noise multiplier by ``schedule``.

    Before every release (ahead of the engine's budget check, so the check and the accountant
    see the sigma actually used) the optimizer's ``noise_multiplier`` is set to
    ``schedule(t)``, with t the epoch counted from 0 (``unit="epoch"``, read from the loader) or
    the number of releases so far (``unit="step"``). The engine then composes the event of that
    sigma (one ``PoissonSampled(Gaussian(sigma_t), q)`` per step, one ``Shuffled`` per epoch)
    and, with a :class:`~dpsharp.torch.PrivacyBudget`, refuses the first release that would
    exceed it (:class:`~dpsharp.torch.BudgetExhausted`, or False from
    ``optimizer.step_if_within_budget()``).

    ``engine_or_optimizer`` is a :class:`~dpsharp.torch.PrivacyEngine` after ``make_private``
    (its optimizer and loader are used) or a DPOptimizer (then pass ``loader`` for an epoch
    schedule).

    An :attr:`~NoiseSchedule.adaptive` schedule declares adaptive noise to the engine: with a
    budget it must be attached before the first release and the engine's accountant must have a
    privacy filter ("rdp", "zcdp" with reshuffling), otherwise ValueError / RuntimeError say
    so. A fixed schedule attached after the first release counts as adaptive too (when it was
    attached may depend on the outputs so far).
    """
    if not isinstance(schedule, NoiseSchedule):
        raise TypeError(f"schedule must be a NoiseSchedule, got {type(schedule).__name__}")
    optimizer = getattr(engine_or_optimizer, "optimizer", None)
    if optimizer is not None and hasattr(engine_or_optimizer, "make_private"):
        loader = engine_or_optimizer.loader if loader is None else loader
        ledger = getattr(engine_or_optimizer, "_main", None)
        accounting = getattr(ledger, "accounting", None)
        if accounting == "shuffle" and schedule.unit != "epoch":
            raise ValueError(
                "schedule: a reshuffling accounting charges one Shuffled event per epoch, so the "
                "noise must be constant within an epoch; use unit='epoch'"
            )
    else:
        optimizer = engine_or_optimizer
    if not (hasattr(optimizer, "_budget_checks") and hasattr(optimizer, "_release_hooks")):
        raise TypeError("engine_or_optimizer must be a PrivacyEngine (after make_private) or a DPOptimizer")
    if schedule.unit == "epoch" and loader is None:
        raise ValueError("loader is required for an epoch schedule (the epoch is read from it)")
    handle = ScheduleHandle(optimizer, schedule, loader)
    declare = getattr(engine_or_optimizer, "_declare_adaptive", None)
    if schedule.adaptive and declare is not None:
        declare(f"{type(schedule).__name__} schedule")
    # First in line: every other check (the engine's budget) must see the scheduled sigma.
    optimizer._budget_checks.insert(0, handle._before_release)
    optimizer._release_hooks.append(handle._after_release)
    return handle
