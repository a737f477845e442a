"""Opacus' accountant interface on dpsharp's accountants.

Swap one line of an Opacus training script::

    engine = opacus.PrivacyEngine()
    engine.accountant = dpsharp.compat.opacus.PLDAccountant()   # or RDPAccountant, GDPAccountant
    model, optimizer, loader = engine.make_private(...)
    ...
    engine.get_epsilon(delta)      # now a certified upper bound from dpsharp's PLD accountant

What Opacus 1.6 calls on ``engine.accountant`` (read from opacus/privacy_engine.py):
``get_optimizer_hook_fn(sample_rate)`` (the hook calls ``step(noise_multiplier=...,
sample_rate=sample_rate * optimizer.accumulated_iterations)`` after every optimizer step),
``len(accountant)``, ``mechanism()`` (passed to ``get_noise_multiplier`` by
``make_private_with_epsilon``), ``get_epsilon(delta)``, ``state_dict()`` and
``load_state_dict()`` (checkpoints). All are provided here with Opacus' semantics:

* ``history`` is a plain list of ``(noise_multiplier, sample_rate, num_steps)``; ``step``
  increments the last entry when both values repeat and appends a new one otherwise, exactly
  as Opacus' RDP and PRV accountants do. ``len(accountant)`` is ``len(history)`` (Opacus'
  definition: the number of distinct consecutive settings, not of steps; use :attr:`steps`).
  Assigning or editing ``history`` directly (as Opacus' ``get_noise_multiplier`` does) is
  honoured: the next query re-reads it.
* ``state_dict()`` returns ``{"history": [...], "mechanism": ...}`` as Opacus does, so Opacus
  checkpoints store and restore it; ``load_state_dict`` checks the mechanism.
* each history entry is the event ``PoissonSampled(Gaussian(noise_multiplier), sample_rate)``
  (add/remove one, the relation of Opacus' accounting), composed ``num_steps`` times into a
  dpsharp accountant (:attr:`dpsharp_accountant`). A ``noise_multiplier`` of 0 (no noise) makes
  ``get_epsilon`` return ``inf``; a ``sample_rate`` of 0 (a step that samples no record and so
  releases nothing about the data) adds nothing, whatever its noise multiplier, as in Opacus
  (whose RDP computation returns 0 for q = 0).

Sensitivity convention: Opacus' ``noise_multiplier`` is the noise standard deviation divided by
``max_grad_norm`` C, the bound on each per-sample gradient's norm, and its accountants (RDP,
PRV, GDP) analyse Poisson sampling under add/remove one, where the clipped sum moves by at most
C: the noise multiplier relative to the sensitivity, which is what dpsharp's ``Gaussian``
states under add/remove (:mod:`dpsharp.events`), so it carries over unchanged. The adapters
are add/remove only: a ``neighbouring`` option other than ``"add_remove"`` is refused (under
replace-one the same clipped sum moves by 2C, and Poisson sampling is not analysed there).

The mechanisms are named ``"dpsharp_pld"``, ``"dpsharp_rdp"`` and ``"dpsharp_gdp"`` and are
registered in Opacus' accountant registry (``opacus.accountants.registry``) when an adapter is
created with Opacus already imported, or by :func:`register_with_opacus`; that is what lets
``engine.make_private_with_epsilon`` calibrate with the dpsharp accountant.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
    require_real,
)
from dpsharp.accountants import Accountant, accountant, available
from dpsharp.accountants import accountant as _new_accountant
from dpsharp.events import Gaussian, Neighbouring, PoissonSampled

__all__ = [
    "GDPAccountant",
    "OpacusAccountant",
    "PLDAccountant",
    "RDPAccountant",
    "get_noise_multiplier",
    "register_with_opacus",
]

HistoryEntry = tuple[float, float, int]

_logger = logging.getLogger(__name__)
#: argument types compared with the last history entry without re-validation (bool excluded)
_PLAIN = (float, int)


def _history_entry(index: int, entry: Any) -> HistoryEntry:
    """``history[index]`` of a state_dict, validated: a (noise_multiplier, sample_rate,
    num_steps) triple."""
    if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 3:
        raise ValueError(
            f"history[{index}] must be a (noise_multiplier, sample_rate, num_steps) triple, "
            f"got {entry!r}"
        )
    return _entry(*entry)


def _entry(noise_multiplier: Any, sample_rate: Any, num_steps: Any) -> HistoryEntry:
    sigma = require_real("noise_multiplier", noise_multiplier)
    if sigma < 0.0:
        raise ValueError(f"noise_multiplier must be in [0, inf), got {sigma!r}")
    rate = require_probability("sample_rate", sample_rate, allow_zero=True)
    steps = require_count("num_steps", num_steps)
    return (sigma, rate, steps)


class OpacusAccountant:
    """Base of the adapters: Opacus' ``IAccountant`` interface over a dpsharp accountant.

    Subclasses set ``family`` (the dpsharp registry name) and ``mechanism_name``.
    ``options`` are passed to ``dpsharp.accountant(family, **options)``.
    """

    family: ClassVar[str] = ""
    mechanism_name: ClassVar[str] = ""

    def __init__(self, **options: Any) -> None:
        relation = options.get("neighbouring", Neighbouring.ADD_REMOVE)
        if relation not in (Neighbouring.ADD_REMOVE, Neighbouring.ADD_REMOVE.value):
            raise ValueError(
                f"neighbouring must be 'add_remove' for an Opacus accountant, got {relation!r}: "
                "Opacus accounts Poisson-sampled steps under add/remove one, with "
                "noise_multiplier = noise std / max_grad_norm; use dpsharp.accountant(...) with "
                "dpsharp events for another relation"
            )
        self.history: list[HistoryEntry] = []
        self._accountant_options = dict(options)
        self._inner: Accountant = accountant(self.family, **self._accountant_options)
        self._synced: list[HistoryEntry] = []
        self._no_noise = False
        if "opacus" in sys.modules:
            register_with_opacus()

    # ------------------------------------------------------------------ Opacus interface
    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one optimizer step (Opacus' merging of repeated settings)."""
        history = self.history
        if history:  # the common case: the last entry's (already validated) values again
            last_sigma, last_rate, last_steps = history[-1]
            if (type(noise_multiplier) in _PLAIN and type(sample_rate) in _PLAIN
                    and noise_multiplier == last_sigma and sample_rate == last_rate):
                history[-1] = (last_sigma, last_rate, last_steps + 1)
                return
        sigma, rate, _ = _entry(noise_multiplier, sample_rate, 1)
        if self.history and self.history[-1][0] == sigma and self.history[-1][1] == rate:
            last = self.history[-1]
            self.history[-1] = (last[0], last[1], last[2] + 1)
        else:
            self.history.append((sigma, rate, 1))

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """epsilon(delta) of the recorded history from the dpsharp accountant.

        Extra positional/keyword arguments are accepted and ignored, as Opacus' own
        accountants ignore the ones meant for other accountants (``make_private_with_epsilon``
        forwards its ``**kwargs`` here).
        """
        delta = require_delta(delta)
        inner = self.dpsharp_accountant
        if self._no_noise:
            return math.inf
        return float(inner.epsilon(delta))

    def __len__(self) -> int:
        return len(self.history)

    @classmethod
    def mechanism(cls) -> str:
        return cls.mechanism_name

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """The optimizer step hook Opacus attaches: one ``step`` per (logical) optimizer step
        with ``sample_rate * optimizer.accumulated_iterations``, as in Opacus."""

        def hook_fn(optimizer: Any) -> None:
            self.step(
                noise_multiplier=optimizer.noise_multiplier,
                sample_rate=sample_rate * optimizer.accumulated_iterations,
            )

        return hook_fn

    def state_dict(self, destination: Any = None) -> Any:
        """``{"history": copy of history, "mechanism": mechanism()}`` (Opacus' format)."""
        if destination is None:
            destination = OrderedDict()
        destination["history"] = [tuple(entry) for entry in self.history]
        destination["mechanism"] = self.mechanism()
        return destination

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; refuses an empty one or another mechanism's."""
        if not state_dict:
            raise ValueError("state_dict is None or empty and cannot be loaded into the accountant")
        for key in ("history", "mechanism"):
            if key not in state_dict:
                raise ValueError(f"state_dict has no key {key!r} and cannot be loaded")
        if state_dict["mechanism"] != self.mechanism():
            raise ValueError(
                f"state_dict of mechanism {state_dict['mechanism']!r} cannot be loaded into an "
                f"accountant with mechanism {self.mechanism()!r}"
            )
        history = state_dict["history"]
        if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
            raise ValueError(
                "state_dict['history'] must be a list of (noise_multiplier, sample_rate, "
                f"num_steps) triples, got {history!r}"
            )
        self.history = [_history_entry(index, entry) for index, entry in enumerate(history)]

    # ------------------------------------------------------------------ dpsharp extras
    @property
    def steps(self) -> int:
        """The total number of recorded steps (sum of num_steps over the history)."""
        return sum(entry[2] for entry in self.history)

    @property
    def dpsharp_accountant(self) -> Accountant:
        """The dpsharp accountant holding exactly the recorded history (the steps recorded since
        the last query are composed into it; rebuilt only when the history was edited)."""
        self._sync()
        return self._inner

    def _sync(self) -> None:
        # Incremental: when the history only grew since the last query (the last entry's
        # count, or new entries after it: what ``step`` does), only the new steps are composed
        # into the same dpsharp accountant. Its answers are functions of the composed multiset
        # alone (dpsharp.accountants: incremental, all-at-once and restored compositions give
        # identical answers), so this equals a rebuild from the whole history, which is done
        # only when the history was edited otherwise (an assignment, a checkpoint load).
        history = [_entry(*entry) for entry in self.history]
        synced = self._synced
        if history == synced:
            return
        grown = len(history) >= len(synced) and history[: max(len(synced) - 1, 0)] == synced[:-1]
        if grown and synced:
            last, now = synced[-1], history[len(synced) - 1]
            grown = last[:2] == now[:2] and now[2] >= last[2]
        if grown:
            inner, no_noise = self._inner, self._no_noise
            start = len(synced) - 1 if synced else 0
            new = [(sigma, rate, steps - (synced[-1][2] if i == 0 and synced else 0))
                   for i, (sigma, rate, steps) in enumerate(history[start:])]
        else:
            inner = accountant(self.family, **self._accountant_options)
            no_noise, new = False, history
        for sigma, rate, steps in new:
            if steps == 0 or rate == 0.0:  # no record sampled: nothing released
                continue
            if sigma == 0.0:
                no_noise = True
                continue
            inner.compose(PoissonSampled(Gaussian(sigma), rate), steps)
        self._inner, self._no_noise, self._synced = inner, no_noise, history

    def __repr__(self) -> str:
        return f"{type(self).__name__}(history={self.history!r})"


class PLDAccountant(OpacusAccountant):
    """Opacus-interface accountant backed by dpsharp's tight PLD accountant: ``get_epsilon``
    is its certified upper bound (a drop-in for Opacus' ``PRVAccountant``).

    ``PLDAccountant(**options)`` passes ``options`` (e.g. ``precision``) to
    ``dpsharp.accountant("pld")``. :meth:`get_epsilon_bounds` gives (lower, upper).
    """

    family = "pld"
    mechanism_name = "dpsharp_pld"

    def get_epsilon_bounds(self, delta: float) -> tuple[float, float]:
        """Certified (lower, upper) bounds on the optimal epsilon at ``delta``."""
        delta = require_delta(delta)
        inner = self.dpsharp_accountant
        if self._no_noise:
            return (math.inf, math.inf)
        if inner.is_empty:
            return (0.0, 0.0)
        lower, upper = inner.epsilon_bounds(delta)  # type: ignore[attr-defined]
        return (float(lower), float(upper))


class RDPAccountant(OpacusAccountant):
    """Opacus-interface accountant backed by dpsharp's RDP accountant (a drop-in for Opacus'
    ``RDPAccountant``). :meth:`get_privacy_spent` returns (epsilon, optimal order) as Opacus'
    does; ``alphas`` selects the orders as there."""

    family = "rdp"
    mechanism_name = "dpsharp_rdp"

    def get_privacy_spent(self, *, delta: float, alphas: Any = None) -> tuple[float, float]:
        """(epsilon, best order) at ``delta``, over ``alphas`` if given (else the default
        orders of dpsharp's RDPAccountant)."""
        delta = require_delta(delta)
        if alphas is None:
            inner = self.dpsharp_accountant
        else:
            inner = accountant(self.family, **{**self._accountant_options, "orders": list(alphas)})
            for sigma, rate, steps in self.history:
                if sigma > 0.0 and rate > 0.0 and steps:
                    inner.compose(PoissonSampled(Gaussian(sigma), rate), steps)
        if not self.history:
            return (0.0, 0.0)
        if any(entry[0] == 0.0 and entry[1] > 0.0 and entry[2] for entry in self.history):
            return (math.inf, math.nan)
        guarantee = inner.guarantee(delta)
        order = next(
            (guarantee.details[key] for key in ("order", "optimal_order", "best_order", "alpha")
             if key in guarantee.details),
            math.nan,
        )
        return (float(guarantee.epsilon), float(order))

    def get_epsilon(self, delta: float, alphas: Any = None, **kwargs: Any) -> float:  # type: ignore[override]
        """epsilon(delta), over the orders ``alphas`` if given (Opacus' signature)."""
        if alphas is None:
            return super().get_epsilon(delta)
        return self.get_privacy_spent(delta=delta, alphas=alphas)[0]


class GDPAccountant(OpacusAccountant):
    """Opacus-interface accountant backed by dpsharp's GDP accountant (the central limit
    theorem of Bu et al. 2020: an approximation, not a bound; prefer :class:`PLDAccountant`).

    Unlike Opacus' ``GaussianAccountant`` it accepts changing noise multipliers and sample
    rates (heterogeneous CLT, mu^2 = sum_t p_t^2 (e^{1/sigma_t^2} - 1)). :attr:`mu` gives the
    GDP parameter. ``get_epsilon(delta, poisson=False)`` (Opacus' uniform-sampling variant) is
    refused: dpsharp's GDP accountant analyses Poisson sampling only.
    """

    family = "gdp"
    mechanism_name = "dpsharp_gdp"

    def get_epsilon(self, delta: float, poisson: bool = True, **kwargs: Any) -> float:  # type: ignore[override]
        if not poisson:
            raise ValueError(
                "poisson=False (uniform sampling) is not analysed by dpsharp's GDP accountant; "
                "use dpsharp.compat.opacus.PLDAccountant or a SampledWithoutReplacement event"
            )
        return super().get_epsilon(delta)

    @property
    def mu(self) -> float:
        """The GDP parameter of the recorded history (central-limit approximation)."""
        inner = self.dpsharp_accountant
        return math.inf if self._no_noise else float(inner.mu)  # type: ignore[attr-defined]


_ADAPTERS: dict[str, type[OpacusAccountant]] = {
    cls.mechanism_name: cls for cls in (PLDAccountant, RDPAccountant, GDPAccountant)
}


def register_with_opacus() -> None:
    """Register the adapters in Opacus' accountant registry under their mechanism names
    ("dpsharp_pld", "dpsharp_rdp", "dpsharp_gdp"), so that Opacus' ``create_accountant`` and
    ``get_noise_multiplier`` (used by ``make_private_with_epsilon``) find them. Needs Opacus."""
    from opacus.accountants.registry import _ACCOUNTANTS, register_accountant

    for name, cls in _ADAPTERS.items():
        if _ACCOUNTANTS.get(name) is not cls:
            register_accountant(name, cls, force=True)  # type: ignore[arg-type]


_OPACUS_NAMES = {"prv": "pld", "rdp": "rdp", "gdp": "gdp"}
#: the largest noise multiplier Opacus' search tries
_MAX_SIGMA = 1e6


def _steps_of_epochs(epochs: float, rate: float) -> int:
    """Opacus' ``int(epochs / sample_rate)``, except where the quotient falls within 1e-9
    (relative) below an integer: that is the floating-point shadow of an exact one (3 epochs at
    sample_rate = 1/75 give 224.99999999999997 for the 225 steps the run trains), and Opacus'
    floor would calibrate for a step fewer than the run takes, landing above the target."""
    quotient = epochs / rate
    nearest = round(quotient)
    if abs(quotient - nearest) <= 1e-9 * max(1.0, quotient):
        return int(nearest)
    return math.floor(quotient)


def get_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    epochs: float | None = None,
    steps: int | None = None,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
    **kwargs: Any,
) -> float:
    """The noise multiplier for ``target_epsilon`` at ``target_delta`` after ``steps`` (or
    ``epochs``) Poisson-sampled steps at ``sample_rate``: Opacus' signature and semantics
    (``steps = int(epochs / sample_rate)``, a quotient within 1e-9 of an integer taken as that
    integer, see :func:`_steps_of_epochs`; exactly one of ``epochs`` and ``steps``) and
    Opacus' search, on a dpsharp accountant: sigma_high doubles from 20 until
    epsilon(sigma_high) <= ``target_epsilon`` (refused beyond 1e6), then [0, sigma_high] is
    bisected, every midpoint whose epsilon is below the target becoming sigma_high, until
    ``target_epsilon - epsilon(sigma_high) <= epsilon_tolerance``; sigma_high is returned. The
    result is conservative (its epsilon is below the target, within ``epsilon_tolerance``),
    and where the accountant's numbers are Opacus' it is Opacus' own sigma.

    ``accountant`` is a dpsharp registry name ("pld", "rdp", "gdp", ...), an adapter mechanism
    ("dpsharp_pld", ...) or an Opacus name ("prv" -> "pld", "rdp", "gdp"); the default is
    Opacus' default, "rdp" (dpsharp's RDP accountant), so code that relies on Opacus' default
    calibrates on the same kind of accountant; pass ``accountant="pld"`` (or "prv") for the
    tight accountant and a smaller noise multiplier. Extra keyword arguments are ignored, as
    in Opacus. With ``accountant="gdp"`` the calibration is on the central-limit
    approximation, as Opacus' own "gdp" calibration is (not a certified guarantee); every other
    accountant must report a certified bound.
    """
    epsilon = require_positive_finite("target_epsilon", target_epsilon)
    delta = require_delta(target_delta, "target_delta")
    if (steps is None) == (epochs is None):
        raise ValueError("get_noise_multiplier takes exactly one of epochs and steps")
    rate = require_probability("sample_rate", sample_rate)
    if steps is None:
        epochs = require_real("epochs", epochs)
        if epochs < rate:
            raise ValueError(
                f"epochs must be in [sample_rate={rate!r}, inf) (steps = int(epochs / "
                f"sample_rate) must be at least 1), got {epochs!r}"
            )
        steps = _steps_of_epochs(epochs, rate)
    steps = require_count("steps", steps, minimum=1)
    if not isinstance(accountant, str):
        raise TypeError(
            "accountant must be an accountant name (a str such as 'pld', 'rdp', 'prv' or "
            f"'dpsharp_pld'), got {accountant!r} ({type(accountant).__name__})"
        )
    name = accountant
    if name in _ADAPTERS:
        name = _ADAPTERS[name].family
    name = _OPACUS_NAMES.get(name, name)
    tolerance = require_real("epsilon_tolerance", epsilon_tolerance)
    if tolerance <= 0:
        raise ValueError(f"epsilon_tolerance must be in (0, inf), got {tolerance!r}")
    if name not in available():
        raise ValueError(f"accountant must be a dpsharp accountant name or one of Opacus' "
                         f"('prv', 'rdp', 'gdp'), got {accountant!r}")
    if name != "gdp" and not _new_accountant(name).certified:
        raise ValueError(f"accountant {name!r} is not certified; calibrate on 'pld' or 'rdp'")
    if name == "gdp":
        _logger.warning(
            "get_noise_multiplier(accountant=%r) calibrates on the central-limit approximation, "
            "as Opacus does: the run's certified epsilon at that noise can be well above "
            "target_epsilon; use accountant='prv' (dpsharp's tight accountant) for a certified "
            "calibration", accountant)

    def epsilon_at(sigma: float) -> float:
        inner = _new_accountant(name).compose(PoissonSampled(Gaussian(sigma), rate), steps)
        return float(inner.epsilon(delta))

    low, high, eps_high = 0.0, 10.0, math.inf
    while eps_high > epsilon:
        high *= 2.0
        if high > _MAX_SIGMA:
            raise ValueError(
                f"target_epsilon={epsilon!r} is unreachable at target_delta={delta!r} after "
                f"{steps} steps at sample_rate={rate!r}: even noise_multiplier={_MAX_SIGMA:g} "
                "is not enough (the privacy budget is too low)"
            )
        eps_high = epsilon_at(high)
    while epsilon - eps_high > tolerance:
        middle = 0.5 * (low + high)
        eps_middle = epsilon_at(middle)
        if eps_middle < epsilon:
            high, eps_high = middle, eps_middle
        else:
            low = middle
    return high
