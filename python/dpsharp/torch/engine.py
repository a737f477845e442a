"""The privacy engine: wire a model, an optimizer and an honest loader into an accountant.

``PrivacyEngine(accountant="pld").make_private(model, optimizer, loader, ...)`` returns the model
(with per-example clipping installed), a :class:`~dpsharp.torch.DPOptimizer` and a
:class:`~dpsharp.torch.data.DPDataLoader`. Every noisy release composes, into the accountant, the
event the loader's sampling implies (:func:`dpsharp.torch.data.sampling_event`):
``PoissonSampled(Gaussian(sigma), q)`` per step (add/remove), ``SampledWithoutReplacement(
Gaussian(sigma/2), b, n)`` per step (replace-one), or ``Shuffled(Gaussian(sigma), b, n)`` once
per epoch (zero-out: a record replaced by a null record whose clipped contribution is 0; random
reshuffling has no add/remove guarantee). :attr:`PrivacyReport.guarantee` states the relation in
words.

Budgets (Abadi et al. 2016, Algorithm "while within_limit(eps, delta)"; Yu et al. 2019: "the
training is terminated when the privacy budget runs out"): with ``budget=PrivacyBudget(eps,
delta)`` every release is checked *before* its noisy gradient is written, and refused with
:class:`BudgetExhausted` if composing its event would make epsilon(delta) exceed eps.

What makes the budget sound:

* Only a certified accountant enforces it. An accountant whose configured instance is not
  certified (``Accountant.certified``: the GDP central limit theorem, zCDP random sampling)
  can stop a run at the budget while its certified epsilon is 13-117% higher, so a budget (or a
  ``target_epsilon`` calibration) on one is refused unless ``allow_approximation=True``, and
  every report then says its number is an approximation.
* The event is charged (composed into the accountant) *before* the release writes ``p.grad``:
  an accounting error (e.g. a noise multiplier whose square underflows) releases nothing.
* The check is a counter comparison: the number of further events the budget allows is
  computed (exponential then binary search over the accountant's own epsilon) and reused while
  the event (sigma, q) and the accountant's ledger are unchanged. The ledger's
  :attr:`~dpsharp.accountants.base.Accountant.version` tells any other change (an event
  composed into ``engine.accountant`` by hand, e.g. the cost of a hyperparameter search, or a
  loaded state) and the allowance is searched again. Checkpoints store no allowance.
* The optimizer's release count and the engine's accounting must agree: restoring
  ``optimizer.state_dict()`` without ``engine.state_dict()`` (or from another checkpoint) is
  detected at the next release or query and refused.
* Adaptive noise. Composition theorems (PLD, RDP, zCDP sums) are proven for privacy
  parameters fixed in advance; a sigma chosen from earlier outputs (the ``ValidationBased``
  schedule, or ``optimizer.noise_multiplier`` set mid-run) together with a stop rule on the
  composed epsilon(delta) is a privacy *filter* (Rogers, Roth, Ullman, Vadhan 2016), which
  those theorems do not cover and which needs its own proof. Such runs must declare it up front
  (``make_private(..., adaptive_noise=True)``, or attach an adaptive schedule before the first
  release); with a budget the engine then enforces a filter proven for adaptively chosen
  parameters, and refuses the accountants that have none ("pld", "classic"):

  - "rdp" (and "moments"): the Renyi filter of Feldman and Zrnic 2021 ("Individual Privacy
    Accounting via a Renyi Filter", Theorem 3.1) at every order of the accountant at once, with
    a union bound over its orders Lambda (cf. Lecuyer 2021, "Practical Privacy Filters and
    Odometers with Renyi Differential Privacy"). A release is allowed only if afterwards some
    order alpha in Lambda has sum_t rho_t(alpha) <= B(alpha), where

        B(alpha) = eps - (log(|Lambda| / delta) + log c(alpha)) / (alpha - 1),
        c(alpha) = (1 / alpha) (1 - 1 / alpha)^(alpha - 1),

    the conversion of Canonne, Kamath, Steinke 2020 (Proposition 12) at delta / |Lambda|.
    Proof: let L_t be the privacy loss log(dP/dP') of the first t outputs on neighbours D, D'
    and S_t(alpha) = sum_{s<=t} rho_s(alpha), each rho_s chosen from the earlier outputs. Given
    the past, step s has Renyi divergence at most rho_s(alpha), so M_t(alpha) = exp((alpha - 1)
    (L_t - S_t(alpha))) is a non-negative supermartingale under P and E[M_tau(alpha)] <= 1 at
    the (bounded) stopping time tau (Feldman and Zrnic 2021, Theorem 3.1). For every real x,
    (1 - e^-x)_+ <= c(alpha) e^((alpha - 1) x). Let a(w) be the first order with S_tau(a) <=
    B(a); the filter guarantees one exists whenever tau >= 1. Then for every event E,

        P[E] - e^eps P'[E] <= E_P[(1 - e^(eps - L_tau))_+]
            <= sum_alpha c(alpha) E_P[1{S_tau(alpha) <= B(alpha)} e^((alpha - 1)(L_tau - eps))]
            <= sum_alpha c(alpha) e^((alpha - 1)(B(alpha) - eps)) E[M_tau(alpha)]
            <= sum_alpha delta / |Lambda| = delta.

    The per-step curves are the accountant's own, which bound both directions of the
    relation as its non-adaptive answers do. The price of adaptivity is log |Lambda| next to
    log(1/delta) (pass fewer orders in ``accountant_options`` to lower it).
  - "zcdp" (reshuffling, certified): the budget is rho_total <= rho_B, the largest rho whose
    conversion meets (eps, delta); the zCDP filter (Feldman and Zrnic 2021, Theorem 3.1 at
    every order: sum_t alpha rho_t <= alpha rho_B) proves the run rho_B-zCDP, which is what
    the usual check enforces, since the conversion is increasing in rho.
  - "gdp": the Gaussian DP filter (Smith and Thakurta 2022, "Fully Adaptive Composition for
    Gaussian Differential Privacy"): sum_t mu_t^2 <= mu_B^2, again the usual check; its
    sampled events stay central-limit approximations (``allow_approximation=True``).

  With a filter, :meth:`report` states the budget (eps, delta) as the run's guarantee; the
  composition of the realised sigmas is only a reading. Without a budget an adaptive run's
  epsilon is such a reading and is reported as not certified. A sigma changed mid-run without
  the declaration is refused when a budget is set.
"""

from __future__ import annotations

import inspect
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from dpsharp._report import format_bound
from dpsharp._validation import (
    require_count,
    require_delta,
    require_epsilon,
    require_positive_finite,
    require_real,
)
from dpsharp.accountants import Accountant, available
from dpsharp.accountants import accountant as make_accountant
from dpsharp.accountants.registry import _REGISTRY
from dpsharp.events import RELATION_WORDS, Event, Neighbouring, event_from_dict, event_to_dict
from dpsharp.torch.clipping import AdaptiveQuantileClipping
from dpsharp.torch.data import (
    SAMPLINGS,
    DPDataLoader,
    from_dataloader,
    sampling_event,
    sampling_neighbouring,
)
from dpsharp.torch.optimizer import BudgetExhausted, DPOptimizer, _require_max_grad_norm

__all__ = ["BudgetExhausted", "PrivacyBudget", "PrivacyEngine", "PrivacyReport"]

logger = logging.getLogger(__name__)

_STATE_FORMAT = 2
#: The budget search looks at most this many events ahead; when they are used up it searches
#: again from the grown ledger. This bounds the size of every composition the search asks the
#: accountant for (a PLD of 2^30 steps does not fit in memory) and keeps the check amortised
#: O(1) per step.
_ALLOWANCE_HORIZON = 1024


@dataclass(frozen=True)
class PrivacyBudget:
    """A total (epsilon, delta) guarantee that training must never exceed."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", require_epsilon(self.epsilon))
        object.__setattr__(self, "delta", require_delta(self.delta))


@dataclass(frozen=True)
class PrivacyReport:
    """What the run has cost so far.

    ``epsilon`` comes from the accounting the engine was asked for; ``certified`` says whether
    it is a proven bound (False for an approximate accountant, and for the composed reading of
    adaptively chosen noise without a privacy filter), ``warning`` why not. When that
    accounting does not match the loader's sampling (allowed only with
    ``allow_accounting_mismatch=True``), ``honest_epsilon`` is the epsilon of the sampling the
    loader really does, from ``honest_accountant`` (``honest_certified`` likewise); report both
    (cf. TF Privacy's privacy statement).
    """

    epsilon: float
    delta: float
    accountant: str
    accounting: str
    sampling: str
    steps: int
    epochs: int
    honest_epsilon: float | None = None
    honest_accountant: str | None = None
    note: str | None = None
    certified: bool = False
    warning: str | None = None
    honest_certified: bool | None = None
    #: The neighbouring relation ``epsilon`` is stated under, in plain words.
    guarantee: str | None = None


def _new_accountant(name: str, neighbouring: Neighbouring, options: Mapping[str, Any]) -> Accountant:
    """A fresh accountant ``name`` stating guarantees under ``neighbouring``. Families whose
    constructor takes no ``neighbouring`` option are used only if their default matches."""
    try:
        signature = inspect.signature(registered_class(name).__init__)
        takes_relation = "neighbouring" in signature.parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
        )
    except (TypeError, ValueError):
        takes_relation = True
    if takes_relation:
        return make_accountant(name, neighbouring=neighbouring, **options)
    result = make_accountant(name, **options)
    if result.neighbouring is not neighbouring:
        raise ValueError(
            f"accountant {name!r} states guarantees under {result.neighbouring.value}, but this "
            f"accounting needs {neighbouring.value}"
        )
    return result


class _Ledger:
    """One accountant fed by the engine, with the bookkeeping of what it has been charged."""

    def __init__(self, name: str, options: Mapping[str, Any], accounting: str) -> None:
        self.name = name
        self.accounting = accounting
        self.options = dict(options)
        # The relation of the sampling's accounting (zero-out for reshuffling); a relation asked
        # for in the options must give the same event (e.g. zero-out for Poisson sampling), and
        # add/remove for reshuffling is refused with the reason (dpsharp.events.Shuffled).
        default = SAMPLINGS[accounting][0]
        requested = sampling_neighbouring(accounting, self.options.pop("neighbouring", None))
        if requested is not default and sampling_event(
            accounting, 1.0, dataset_size=2, sample_rate=0.5, batch_size=1, neighbouring=requested
        ) != sampling_event(accounting, 1.0, dataset_size=2, sample_rate=0.5, batch_size=1):
            raise ValueError(
                f"the engine accounts {accounting!r} sampling under {default.value}; "
                f"neighbouring={requested.value!r} changes its event, so compose the events "
                "into an accountant yourself (dpsharp.torch.data.sampling_event)"
            )
        self.neighbouring = requested
        self.accountant = self._fresh()
        self.last_epoch_charge: tuple[int, float] | None = None  # (epoch, sigma), "epoch" units
        self.non_private_releases = 0
        self.charged = 0  # events the engine composed (one per release, or per epoch)
        # the noise multipliers of those events, run-length encoded ([sigma, count], in
        # order); None for a checkpoint from before they were recorded
        self.charges: list[list[Any]] | None = []

    @property
    def per_epoch(self) -> bool:
        return SAMPLINGS[self.accounting][1] == "epoch"

    def _fresh(self) -> Accountant:
        return _new_accountant(self.name, self.neighbouring, self.options)

    def clone_with(self, event: Event, count: int) -> Accountant:
        clone = self._fresh()
        clone.load_state_dict(self.accountant.state_dict())
        clone.compose(event, count)
        return clone

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "accounting": self.accounting,
            "accountant": self.accountant.state_dict(),
            "last_epoch_charge": None if self.last_epoch_charge is None else list(self.last_epoch_charge),
            "non_private_releases": self.non_private_releases,
            "charged": self.charged,
            "charges": None if self.charges is None else [list(run) for run in self.charges],
        }

    def record_charge(self, sigma: float) -> None:
        """Count one charged event at noise multiplier ``sigma``."""
        self.charged += 1
        if self.charges is None:
            return
        if self.charges and self.charges[-1][0] == sigma:
            self.charges[-1][1] += 1
        else:
            self.charges.append([sigma, 1])

    def missing_charges(self, event_of: Callable[[float], Event]) -> str | None:
        """The first charged event (``event_of(sigma)`` for each recorded sigma) that the
        ledger holds fewer times than it was charged, or None (also without a record)."""
        if self.charges is None:
            return None
        expected: dict[Event, int] = {}
        for sigma, count in self.charges:
            event = event_of(sigma)
            expected[event] = expected.get(event, 0) + count
        held = dict(self.accountant.composed)
        for event, count in expected.items():
            if held.get(event, 0) < count:
                return f"{count} x {event!r} (the ledger holds {held.get(event, 0)})"
        return None

    def load_state_dict(self, state: Mapping[str, Any], releases: int) -> None:
        """Restore and validate against the number of ``releases`` the checkpoint states."""
        if state["name"] != self.name or state["accounting"] != self.accounting:
            raise ValueError(
                f"checkpoint accounts {state['accounting']!r} with {state['name']!r}; this "
                f"engine accounts {self.accounting!r} with {self.name!r}"
            )
        accountant = self._fresh()
        accountant_state = dict(state["accountant"])
        if (
            self.neighbouring is Neighbouring.ZERO_OUT
            and accountant_state.get("neighbouring") == Neighbouring.ADD_REMOVE.value
        ):
            # A reshuffling checkpoint from before zero-out accounting: its events were stated
            # with the sensitivity C of the clipped sum, which is also its zero-out sensitivity,
            # and every event valid under add/remove is valid under zero-out with the same
            # numbers (dpsharp.events), so the ledger is restated under zero-out, not trusted
            # as an add/remove guarantee it never was.
            accountant_state["neighbouring"] = Neighbouring.ZERO_OUT.value
        accountant.load_state_dict(accountant_state)
        charge = state["last_epoch_charge"]
        last = None if charge is None else (require_count("last_epoch_charge[0]", charge[0]),
                                            require_real("last_epoch_charge[1]", charge[1]))
        non_private = require_count("non_private_releases", state["non_private_releases"])
        if "charged" in state:
            charged = require_count("charged", state["charged"])
        else:  # format 1: one event per private release (per-step accounting)
            charged = releases - non_private if not self.per_epoch else int(releases > 0)
        composed = sum(count for _, count in accountant.composed)
        problems = []
        charges = state.get("charges")
        if charges is not None:
            charges = [[require_positive_finite("charges sigma", run[0]),
                        require_count("charges count", run[1], minimum=1)] for run in charges]
            if sum(run[1] for run in charges) != charged:
                problems.append(f"{charged} events charged but its record of their noise "
                                f"multipliers counts {sum(run[1] for run in charges)}")
        if composed < charged:
            problems.append(f"its ledger holds {composed} events but {charged} were charged")
        if self.per_epoch:
            if releases > 0 and charged + non_private < 1:
                problems.append(f"{releases} releases but no epoch was charged")
            if charged > releases + 1:
                problems.append(f"{charged} epochs charged for {releases} releases")
        elif not releases <= charged + non_private <= releases + 1:
            problems.append(
                f"{releases} releases but {charged} charged and {non_private} without noise"
            )
        if problems:
            raise ValueError(
                "the checkpoint's accounting is inconsistent (" + "; ".join(problems) + "): it "
                "was edited or comes from another run; refusing to resume a budget from it"
            )
        self.accountant.load_state_dict(accountant_state)
        self.last_epoch_charge = last
        self.non_private_releases = non_private
        self.charged = charged
        self.charges = charges

    def snapshot(self) -> tuple[Any, ...]:
        """What :meth:`restore` puts back (the ledger as it is, unvalidated)."""
        return (self.accountant.state_dict(), self.last_epoch_charge, self.non_private_releases,
                self.charged, None if self.charges is None else [list(r) for r in self.charges])

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        self.accountant.load_state_dict(snapshot[0])
        (self.last_epoch_charge, self.non_private_releases, self.charged,
         self.charges) = snapshot[1:]

    def dropped(self, before: tuple[tuple[Event, int], ...], non_private: int) -> str | None:
        """What the ledger held (``before``: its composed multiset, and ``non_private``
        releases without noise) that it no longer holds, or None if it only grew."""
        counts = dict(self.accountant.composed)
        for event, count in before:
            if counts.get(event, 0) < count:
                return f"{count} x {event!r} (now {counts.get(event, 0)})"
        if self.non_private_releases < non_private:
            return f"{non_private} releases without noise (now {self.non_private_releases})"
        return None


#: The attribute make_private sets on every submodule of the model it made private. A module
#: carrying it is refused by every later make_private.
_PRIVATE_MARKER = "_dpsharp_made_private"


class _PrivateMarker(str):
    """The marker's value: a string in the module's ``__dict__``, not a parameter or buffer,
    so the model's ``state_dict`` is unchanged.

    ``copy.deepcopy`` of the model keeps it: within a process a copy's weights carry the same
    releases as the original's, so a new engine on the copy would understate them just the
    same. Pickling (``torch.save`` of a whole model) writes an empty string instead: a pickle
    is how a model reaches a new process, where a run is resumed by loading the engine's
    checkpoint into the new engine (:meth:`PrivacyEngine.load_state_dict`), and a marker
    carried there would refuse that resume."""

    def __copy__(self) -> _PrivateMarker:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _PrivateMarker:
        return self

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, ("",))


def _made_private(module: torch.nn.Module) -> str | None:
    """How a PrivacyEngine made ``module``, or a submodule of it, private (None if none did
    in this process)."""
    for each in module.modules():
        found = vars(each).get(_PRIVATE_MARKER)
        if found:
            return str(found)
    return None


def _mismatch_budget_refusal(accounting: str, sampling: str) -> str:
    """Why a budget is refused where the accounting is not the loader's sampling: a budget
    enforced on the requested accounting is no bound for the run (a reshuffling loader accounted
    as Poisson stopped at the budget's epsilon 3.0 while its own sampling's epsilon was 14.2)."""
    return (
        f"a budget is enforced on a bound for the loader's own sampling, and the {accounting!r} "
        f"accounting asked for (allow_accounting_mismatch=True) is not one for a {sampling!r} "
        "loader: its epsilon can sit far below the run's. Use the loader's own accounting with "
        "a budget, or drop the budget and read both epsilons (report().honest_epsilon)"
    )


def _require_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _renyi_filter_admits(accountant: Accountant, budget: PrivacyBudget) -> bool:
    """The Renyi filter's condition (module docstring): some order alpha of the accountant has
    sum_t rho_t(alpha) <= eps - (log(|Lambda| / delta) + log c(alpha)) / (alpha - 1), with
    log c(alpha) = (alpha - 1) log(1 - 1/alpha) - log(alpha)."""
    import numpy as np

    orders = np.asarray(accountant.orders, dtype=np.float64)  # type: ignore[attr-defined]
    spent = np.asarray(accountant.rdp(), dtype=np.float64)  # type: ignore[attr-defined]
    log_c = (orders - 1.0) * np.log1p(-1.0 / orders) - np.log(orders)
    allowed = budget.epsilon - (math.log(orders.size / budget.delta) + log_c) / (orders - 1.0)
    return bool(np.any(spent <= allowed))


def _filter_of(accountant: Accountant) -> str | None:
    """The privacy filter that a budget check on ``accountant`` is, for adaptively chosen
    noise (module docstring), or None if it has none."""
    from dpsharp.accountants.gdp import GDPAccountant
    from dpsharp.accountants.rdp import RDPAccountant
    from dpsharp.accountants.zcdp import ZCDPAccountant

    if isinstance(accountant, RDPAccountant):
        return "renyi"
    if isinstance(accountant, ZCDPAccountant):
        return "zcdp"
    if isinstance(accountant, GDPAccountant):
        return "gdp"
    return None


_FILTER_NAMES = {
    "renyi": "Renyi filter (Feldman and Zrnic 2021, union bound over the accountant's orders)",
    "zcdp": "zCDP filter (Feldman and Zrnic 2021, at every order)",
    "gdp": "Gaussian DP filter (Smith and Thakurta 2022)",
}


#: Opacus' accountant names that are not dpsharp registry names: its "prv" (its default, the
#: numerical composition of Gopi, Lee, Wutschitz 2021) is the tight accountant here
_OPACUS_ACCOUNTANTS = {"prv": "pld"}


def registered_class(name: str) -> type[Accountant]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"accountant must be one of {', '.join(map(repr, available()))}; got {name!r}"
        ) from None


class PrivacyEngine:
    """Make a model, optimizer and loader differentially private, and account every step.

    Parameters
    ----------
    accountant:
        Registered accountant name (``dpsharp.available()``), "pld" by default. It is created
        under the neighbouring relation of the loader's sampling. Opacus' name ``"prv"`` (its
        default, the PRV accountant of Gopi, Lee, Wutschitz 2021) means the tight accountant,
        "pld".
    accountant_options:
        Keyword options for that accountant (e.g. ``{"precision": 1e-3}``).
    secure_mode:
        Sampling and noise take their randomness from the OS CSPRNG; seeds are refused.
    """

    def __init__(
        self,
        accountant: str = "pld",
        *,
        accountant_options: Mapping[str, Any] | None = None,
        secure_mode: bool = False,
    ) -> None:
        if not isinstance(accountant, str):
            raise TypeError("accountant must be a registered accountant name (dpsharp.available())")
        accountant = _OPACUS_ACCOUNTANTS.get(accountant, accountant)
        if accountant not in available():
            raise ValueError(
                f"accountant must be one of {', '.join(map(repr, available()))}; got {accountant!r}"
            )
        self.accountant_name = accountant
        self.accountant_options = dict(accountant_options or {})
        self.secure_mode = bool(secure_mode)
        self._main: _Ledger | None = None
        self._honest: _Ledger | None = None
        self.optimizer: DPOptimizer | None = None
        self.loader: DPDataLoader | None = None
        self.module: torch.nn.Module | None = None
        self._budget: PrivacyBudget | None = None
        self.delta: float | None = None
        self.allow_approximation = False
        # budget cache: (event, allowed further events when computed, events charged since,
        # the accountant's ledger version it is valid for)
        self._allowance: tuple[Event, int, int, int] | None = None
        # adaptive noise: declared (or detected without a budget), and why
        self._adaptive = False
        self._adaptive_reason: str | None = None
        # releases this engine has seen go out, and the (release index, sigma) already charged
        # for the release in progress (a release that failed after its charge is not re-charged)
        self._released = 0
        self._pending_charge: tuple[int, float] | None = None
        # What this engine did in this process, never restored from a checkpoint: the releases
        # it made, whether it charged a release (one that then failed included), and the ledger
        # versions of its last own change (make_private, load_state_dict): a ledger only grows
        # within a process, so load_state_dict refuses once any of these moved
        self._released_here = 0
        self._charged_here = False
        self._versions: tuple[int, int | None] | None = None
        # each ledger as the engine last left it: (ledger, version, composed, non-private)
        self._held: list[tuple[_Ledger, int, Mapping[Event, int], int]] = []
        #: What make_private's batch probe found at the first training batch it could probe
        #: (dpsharp.torch.batch_probe.BatchProbeResult), None before that or without the probe.
        self.batch_probe_result: Any = None
        self._batch_probe_handle: Any = None

    # ----------------------------------------------------------------- make_private
    def make_private(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data_loader: Any,
        *,
        max_grad_norm: float | Sequence[float],
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        delta: float | None = None,
        epochs: int | None = None,
        clipping: Any = "flat",
        stability: float = 0.01,
        loss_reduction: str = "mean",
        budget: PrivacyBudget | None = None,
        sampling: str = "poisson",
        accounting: str | None = None,
        allow_accounting_mismatch: bool = False,
        allow_approximation: bool = False,
        adaptive_noise: bool = False,
        max_physical_batch_size: int | None = None,
        seed: int | None = None,
        poisson_sampling: bool | None = None,
        batch_probe: bool = True,
        public_buffers: Sequence[str] = (),
    ) -> tuple[torch.nn.Module, DPOptimizer, DPDataLoader]:
        """Return ``(module, dp_optimizer, dp_loader)``.

        Parameters
        ----------
        module:
            The model. One made private by an earlier make_private (or a ``copy.deepcopy`` of
            one) is refused: its weights carry that engine's releases, which a second engine
            would not account. Build a new model for a new, separately accounted run.
        data_loader:
            A :class:`~dpsharp.torch.data.DPDataLoader` (used as is), or a torch DataLoader whose
            sampler is replaced by ``sampling`` ("poisson" with q = batch_size / n, "shuffle" or
            "without_replacement") -- see :func:`dpsharp.torch.data.from_dataloader`.
        noise_multiplier, target_epsilon:
            Exactly one. With ``target_epsilon`` (and ``delta``, ``epochs``) sigma is calibrated
            with :mod:`dpsharp.calibrate` on this engine's accountant so that ``epochs`` epochs
            of this loader cost at most ``target_epsilon``. That installs no budget (as in
            Opacus): training past ``epochs`` spends more; pass
            ``budget=PrivacyBudget(target_epsilon, delta)`` too for the engine to stop there.
        delta:
            The delta at which epsilon is reported (default: the budget's delta). May be left
            out with ``noise_multiplier`` and no budget, as in Opacus: then
            :meth:`epsilon` / :meth:`get_epsilon` take it.
        poisson_sampling:
            Opacus' flag: True is ``sampling="poisson"``, False is ``sampling="shuffle"``
            (Opacus keeps the loader's shuffled fixed-size batches and still accounts them as
            Poisson; here they are accounted as what they are, under zero-out). Refused when it
            contradicts ``sampling``.
        clipping, stability:
            How per-example gradients are clipped (:class:`~dpsharp.torch.DPOptimizer`):
            ``"flat"``, ``"per_layer"``, ``"automatic"`` (c_i = C / (||g_i|| + ``stability``);
            Bu, Wang, Zha, Karypis 2023), ``"adaptive"`` (a bound that tracks a quantile of the
            norms; Andrew et al. 2021), or a :mod:`dpsharp.torch.clipping` rule. With adaptive
            clipping sigma is the total per-step noise multiplier of the gradient and the count
            releases together, which is what the accountant is charged.
        budget:
            A :class:`PrivacyBudget` that no release may exceed.
        allow_approximation:
            Needed (True) to enforce ``budget`` or calibrate ``target_epsilon`` on an accountant
            that is not certified (``"gdp"``, ``"zcdp"`` with Poisson sampling); the reports then
            say their numbers are approximations. Refused otherwise.
        adaptive_noise:
            Declare that sigma may be chosen from earlier outputs during the run (a
            ``ValidationBased`` schedule, or setting ``noise_multiplier`` by hand). With a budget
            the engine then enforces it by a privacy filter (module docstring), which "rdp",
            "moments", "zcdp" and "gdp" have and "pld" and "classic" do not (refused).
        accounting:
            The sampling to account for (default: the loader's). A different one is refused
            unless ``allow_accounting_mismatch=True``; then both epsilons are reported by
            :meth:`report`, and the requested accounting's number is not a bound for the
            loader's actual sampling: ``report().certified`` is False, :meth:`epsilon` /
            :meth:`get_epsilon` warn (UserWarning) at every call, and a budget is refused (it
            would be enforced on a number that is no bound for the run).
        seed:
            Seeds the noise stream, and the sampler when the loader is built here (seeded
            runs are for testing and reproducibility; refused in secure mode). The noise is a
            function of the seed alone: two runs with one seed (a sweep over learning rates,
            say) add the same noise to their releases, so their epsilons do not compose and
            at most one of them may be published. Without a seed each run draws its own key.
        batch_probe:
            Probe the first training batch (the first forward pass of ``module`` with
            gradients enabled, before its backward pass and before anything is charged or
            released) with :func:`dpsharp.torch.batch_probe.probe_batch`: forward passes
            without gradients, in eval mode and in the model's own training modes, of the batch
            as given, with two examples swapped and with one example replaced (by a copy of
            another, and by an outlier), checking that every clipped layer sees the examples
            in its batch dimension (not, e.g., a sequence-first (L, B, ...) input with L = B,
            which the batch-size checks pass and which would be clipped per position) and that
            no layer's input mixes examples (``x - x.mean(0)``); and that the model's input is
            not the loader's batch with its examples moved out of dimension 0 (a loop feeding
            ``x.transpose(0, 1)``, which the swap cannot see). A fault raises ValueError
            naming the layer, from that forward pass, and again at every later one. The
            training flags, the buffers and the RNG state are restored, so the run is
            otherwise unchanged.
            A batch of one example (or of equal examples, or an empty Poisson batch) has nothing
            to swap: the probe waits for the next batch; inputs given as a ``PackedSequence``
            are not probed (logged). ``batch_probe=False`` skips it (only
            for a model checked by other means, e.g. one whose forward cannot run without
            gradients); :attr:`batch_probe_result` holds what the probe found.
        public_buffers:
            Names of the model's buffers that its training forward may change without reading
            the data (see :class:`~dpsharp.torch.PerSampleClipper`); a backward pass after a
            forward that wrote any other buffer is refused, since buffers are released with
            the model without noise.
        """
        if self.optimizer is not None:
            raise RuntimeError("this PrivacyEngine already made a model private; use a new engine")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        earlier = _made_private(module)
        if earlier is not None:
            raise ValueError(
                f"module was already made private by {earlier} (or is a copy of such a model): "
                "its weights carry that engine's releases, whose privacy cost is in that "
                "engine's ledger, and a second engine would account only its own. Keep using "
                "the first engine's optimizer and loader to train on, or build a new model for "
                "a new, separately accounted run (to train these weights further on other data "
                "under separate accounting, load their state_dict into a freshly built model "
                "and make that one private; the first engine's epsilon still covers what they "
                "carry)"
            )
        if isinstance(optimizer, DPOptimizer):
            raise TypeError("optimizer is already a DPOptimizer; pass the plain torch optimizer")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        model_params = {id(p) for p in module.parameters()}
        for index, group in enumerate(optimizer.param_groups):
            for param in group["params"]:
                if id(param) not in model_params:
                    raise ValueError(
                        f"optimizer.param_groups[{index}] holds a parameter of shape "
                        f"{tuple(param.shape)} that is not a parameter of module; build the "
                        "optimizer from module.parameters()"
                    )
        norm = _require_max_grad_norm(max_grad_norm)
        if (noise_multiplier is None) == (target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if noise_multiplier is not None:
            sigma: float | None = require_real("noise_multiplier", noise_multiplier)
            if sigma is not None and sigma < 0.0:
                raise ValueError(f"noise_multiplier must be in [0, inf), got {sigma!r}")
        else:
            sigma = None
            require_epsilon(target_epsilon, "target_epsilon")
            if epochs is None:
                raise ValueError("target_epsilon needs epochs (how long training will run)")
            require_count("epochs", epochs, minimum=1)
        if budget is not None and not isinstance(budget, PrivacyBudget):
            raise TypeError("budget must be a dpsharp.torch.PrivacyBudget")
        if poisson_sampling is not None:
            flag = _require_flag("poisson_sampling", poisson_sampling)
            wanted = "poisson" if flag else "shuffle"
            if sampling not in ("poisson", wanted):
                raise ValueError(
                    f"poisson_sampling={flag} contradicts sampling={sampling!r}; give one of them"
                )
            sampling = wanted
        if delta is None and budget is not None:
            delta = budget.delta
        if delta is None and sigma is None:
            raise ValueError("target_epsilon needs delta (the delta the target is met at)")
        if delta is not None:
            delta = require_delta(delta)
        allow_approximation = _require_flag("allow_approximation", allow_approximation)
        adaptive_noise = _require_flag("adaptive_noise", adaptive_noise)
        if self.secure_mode and seed is not None:
            raise ValueError("seed must be None in secure mode")
        if seed is not None:
            require_count("seed", seed)
        batch_probe = _require_flag("batch_probe", batch_probe)

        # Distributed data parallel (dpsharp.torch.distributed): clip on module.module, switch
        # DDP's own gradient all-reduce off, sample a distributed Poisson batch, all-reduce the
        # noised clipped sums.
        from dpsharp.torch import distributed as _distributed

        ddp = _distributed.is_ddp(module)
        process_group = _distributed.prepare_ddp(module) if ddp else None
        if ddp:
            loader = _distributed.from_dataloader_distributed(
                data_loader,
                sampling=sampling,
                seed=None if seed is None else seed + 1,
                secure=self.secure_mode,
                max_physical_batch_size=max_physical_batch_size,
                group=process_group,
            )
        else:
            loader = from_dataloader(
                data_loader,
                sampling=sampling,
                seed=None if seed is None else seed + 1,
                secure=self.secure_mode,
                max_physical_batch_size=max_physical_batch_size,
            )
        if self.secure_mode and not loader.secure:
            raise ValueError("secure mode needs a loader built with secure=True")
        accounting = loader.sampling if accounting is None else accounting
        if accounting not in SAMPLINGS:
            raise ValueError(f"accounting must be one of {', '.join(map(repr, SAMPLINGS))}, got {accounting!r}")
        mismatch = accounting != loader.sampling
        if mismatch and not allow_accounting_mismatch:
            raise ValueError(
                f"the loader samples by {loader.sampling!r} but accounting={accounting!r} was "
                f"asked for: the privacy amplification of {accounting!r} sampling does not hold "
                "for this loader. Use the loader's own accounting, or pass "
                "allow_accounting_mismatch=True to get both numbers reported"
            )
        if mismatch and budget is not None:
            raise ValueError(_mismatch_budget_refusal(accounting, loader.sampling))
        main = _Ledger(self.accountant_name, self.accountant_options, accounting)
        self._require_support(main, loader, accounting)
        if not main.accountant.certified and not allow_approximation:
            if budget is not None or target_epsilon is not None:
                raise ValueError(self._approximation_refusal(
                    main, loader, delta, "a budget" if budget is not None else "target_epsilon"
                ))
        if adaptive_noise and budget is not None:
            self._require_filter(main)
        honest = None
        if mismatch:
            honest = self._honest_ledger(loader)
            logger.warning(
                "accounting a %r loader as %r at the user's request; the honest %r accounting "
                "is reported alongside", loader.sampling, accounting, loader.sampling,
            )

        if sigma is None:
            sigma = self._calibrate(  # type: ignore[arg-type]
                main, loader, float(target_epsilon), delta,  # type: ignore[arg-type]
                int(epochs), allow_approximation,
            )

        dp_optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=norm,
            expected_batch_size=loader.expected_batch_size,
            module=_distributed.unwrap_ddp(module),
            clipping=clipping,
            stability=stability,
            loss_reduction=loss_reduction,
            seed=seed,
            secure=self.secure_mode,
            distributed=ddp,
            process_group=process_group,
            public_buffers=public_buffers,
        )
        if isinstance(dp_optimizer.clip_rule, AdaptiveQuantileClipping):
            # The released count's sensitivity depends on the relation (1 under zero-out, 1/2
            # otherwise, dpsharp.torch.clipping): the largest of those the run is reported under.
            relations = {main.neighbouring} | ({honest.neighbouring} if honest else set())
            dp_optimizer.clip_rule.set_neighbouring(
                Neighbouring.ZERO_OUT if Neighbouring.ZERO_OUT in relations
                else main.neighbouring)
            dp_optimizer.gradient_noise_multiplier  # noqa: B018 - refuses a too small count noise
        dp_optimizer.attach_loader(loader)
        dp_optimizer.add_budget_check(self._check_budget)
        dp_optimizer.add_charge_hook(self._charge_release)
        dp_optimizer.add_release_hook(self._on_release)
        self._main, self._honest = main, honest
        self.optimizer, self.loader, self.module = dp_optimizer, loader, module
        self._budget, self.delta = budget, delta
        self.allow_approximation = allow_approximation
        self._versions = self._ledger_versions()
        self._hold_ledgers()
        if adaptive_noise:
            self._adaptive = True
            self._adaptive_reason = "declared with adaptive_noise=True"
        if batch_probe:
            self._install_batch_probe(_distributed.unwrap_ddp(module), dp_optimizer, loader)
        # The last step: a make_private that raised leaves the model open to another engine.
        marker = _PrivateMarker(
            f"a PrivacyEngine (accountant {main.name!r}, {accounting!r} accounting)")
        for each in _distributed.unwrap_ddp(module).modules():
            object.__setattr__(each, _PRIVATE_MARKER, marker)
        return module, dp_optimizer, loader

    def _install_batch_probe(self, model: torch.nn.Module, optimizer: DPOptimizer,
                             loader: Any) -> None:
        """Run :func:`dpsharp.torch.batch_probe.probe_batch` on the clipped layers at the
        first forward pass of ``model`` with gradients enabled and a batch of two different
        examples or more (``make_private``'s ``batch_probe``), and compare that input with the
        loader's last batch (:func:`~dpsharp.torch.batch_probe.transposed_input`)."""
        import dataclasses

        from dpsharp.torch.batch_probe import clipped_layers, probe_batch, transposed_input

        layers = clipped_layers(model, optimizer.clipper)
        running = [False]
        drawn: list[Any] = []  # the loader's last batch, until the probe has run
        fetch = getattr(loader, "_fetch", None)
        recording = callable(fetch) and "_fetch" not in vars(loader)
        if recording:
            def recording_fetch(indices: Any) -> Any:
                batch = fetch(indices)
                drawn[:] = [batch]
                return batch

            loader._fetch = recording_fetch

        def done() -> None:
            handle.remove()
            if recording and vars(loader).get("_fetch") is recording_fetch:
                del loader._fetch
            drawn.clear()

        def probe(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if running[0] or not torch.is_grad_enabled():
                return
            running[0] = True
            try:
                result = probe_batch(model, args, kwargs, layers=layers)
            except Exception as error:
                if hasattr(error, "add_note"):
                    error.add_note(
                        "(raised by make_private's batch probe, which runs the model's first "
                        "training batch without gradients, in eval mode and in its own "
                        "modes, before training)")
                raise
            finally:
                running[0] = False
            if not result.checked:
                if result.final:  # this model's inputs cannot be probed
                    self.batch_probe_result = result
                    done()
                    logger.warning("batch probe: %s; not probed", result.reason)
                else:
                    logger.info("batch probe: %s; probing the next batch", result.reason)
                return
            if result.passed and drawn:
                moved = transposed_input(args, kwargs, drawn[0])
                if moved is not None:
                    result = dataclasses.replace(result, batch_dimension=moved)
            self.batch_probe_result = result
            problem = result.batch_dimension or result.cross_example
            if problem is not None:
                raise ValueError(
                    f"the model cannot be trained with per-example clipping: {problem}. "
                    "Keep the examples in dimension 0 from the model's input to every layer "
                    "(build sequence layers with batch_first=True and feed them (batch, seq, "
                    "...) tensors, or transpose back before the layer), and compute nothing "
                    "across the examples of a batch (no batch statistics); nothing was charged "
                    "or released")
            done()
            logger.info("batch probe: %d clipped layers see the examples of a batch of %d in "
                        "their batch dimension and do not mix them", result.layers,
                        result.batch_size)

        handle = model.register_forward_pre_hook(probe, with_kwargs=True)
        self._batch_probe_handle = handle

    def make_private_with_epsilon(
        self,
        *,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data_loader: Any,
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float | Sequence[float],
        **options: Any,
    ) -> tuple[torch.nn.Module, DPOptimizer, DPDataLoader]:
        """Opacus' ``make_private_with_epsilon``: :meth:`make_private` with ``target_epsilon``
        reached at ``target_delta`` after ``epochs`` epochs (sigma calibrated on this engine's
        accountant, conservative: the certified epsilon after ``epochs`` epochs is at most
        ``target_epsilon``). ``options`` are :meth:`make_private`'s (``poisson_sampling``,
        ``clipping``, ``loss_reduction``, ``budget``, ...)."""
        for name in ("noise_multiplier", "delta"):
            if name in options:
                raise TypeError(f"make_private_with_epsilon takes no {name!r} (it calibrates "
                                "noise_multiplier for target_epsilon at target_delta)")
        return self.make_private(
            module, optimizer, data_loader, max_grad_norm=max_grad_norm,
            target_epsilon=target_epsilon, delta=target_delta, epochs=epochs, **options,
        )

    def get_epsilon(self, delta: float) -> float:
        """Opacus' name for :meth:`epsilon`: epsilon(delta) of everything released so far (with
        ``allow_accounting_mismatch=True`` not a bound for the loader's actual sampling, and a
        UserWarning says so: see :meth:`epsilon`)."""
        return self._read_epsilon(delta)

    # ----------------------------------------------------------------- soundness checks
    def _approximation_refusal(
        self, ledger: _Ledger, loader: DPDataLoader, delta: float, what: str
    ) -> str:
        probe = ledger._fresh().compose(self._event(ledger.accounting, loader, 1.0))
        warning = probe.guarantee(delta).warning
        why = f": {warning.rstrip('.')}" if warning else ""
        return (
            f"accountant {ledger.name!r} ({ledger.accountant!r}) is not certified: its epsilon "
            f"for this loader is an approximation, not a proven bound{why}. Enforcing {what} on "
            "it can overshoot the certified epsilon of the run. Use a certified accountant "
            "('pld', 'rdp'), or pass allow_approximation=True to accept the approximation (every "
            "report then says so)"
        )

    @property
    def budget(self) -> PrivacyBudget | None:
        """The (epsilon, delta) budget enforced before every release, or None for no budget.

        May be set after ``make_private`` (a new budget applies from the next release: the
        allowance is searched again, and a budget already spent stops the run at once). The
        same checks as ``make_private(budget=...)`` apply: a budget on an uncertified
        accountant needs ``allow_approximation=True``, and with adaptive noise it needs an
        accountant with a privacy filter. The budget of a privacy filter (adaptive noise) is
        part of the filter's proof and cannot change after the first release."""
        return self._budget

    @budget.setter
    def budget(self, budget: PrivacyBudget | None) -> None:
        if budget is not None and not isinstance(budget, PrivacyBudget):
            raise TypeError("budget must be a dpsharp.torch.PrivacyBudget or None")
        if self._main is None:
            raise RuntimeError("set the budget with make_private(..., budget=...); the engine "
                               "has no accounting before make_private")
        if budget == self._budget:
            return
        if self._adaptive and self._released > 0:
            raise ValueError(
                f"the noise is chosen adaptively ({self._adaptive_reason}) and "
                f"{self._released} releases were made: a privacy filter's budget is fixed "
                "before the first release (the filter's proof assumes it), so it cannot be "
                "set or changed now")
        if budget is not None:
            if self._honest is not None:
                assert self.loader is not None
                raise ValueError(_mismatch_budget_refusal(self._main.accounting,
                                                          self.loader.sampling))
            if not self._main.accountant.certified and not self.allow_approximation:
                assert self.loader is not None
                raise ValueError(self._approximation_refusal(
                    self._main, self.loader, budget.delta, "a budget"))
            if self._adaptive:
                self._require_filter(self._main)
            if self.delta is None:
                self.delta = budget.delta
        self._budget = budget
        self._allowance = None  # searched again against the new budget

    def _require_filter(self, ledger: _Ledger) -> str:
        kind = _filter_of(ledger.accountant)
        if kind is None:
            raise ValueError(
                f"adaptive noise (sigma chosen from earlier outputs) with a budget needs a privacy "
                f"filter proven for adaptively chosen parameters, and accountant {ledger.name!r} "
                "has none: its epsilon(delta) stop rule is proven only for noise fixed in "
                "advance. Use accountant 'rdp' (Renyi filter, Feldman and Zrnic 2021) or 'zcdp' "
                "with reshuffling (zCDP filter), or a schedule fixed before the first release"
            )
        return kind

    def _declare_adaptive(self, reason: str) -> None:
        """Record that sigma is chosen online. With a budget this must happen before the first
        release (the filter covers the whole run) and needs an accountant with a filter."""
        if self._adaptive:
            return
        if self.budget is not None:
            if self._released > 0:
                raise RuntimeError(
                    f"the noise multiplier is chosen adaptively ({reason}) after "
                    f"{self._released} releases made under a budget for fixed noise; a stop "
                    "rule on epsilon(delta) is not proven for adaptively chosen noise. Declare "
                    "it before the first release: make_private(..., adaptive_noise=True) with "
                    "accountant 'rdp' (Renyi filter) or 'zcdp' with reshuffling, or attach the "
                    "schedule before training; sigmas fixed in advance belong in a schedule"
                )
            self._require_filter(self._ledger())
        self._adaptive = True
        self._adaptive_reason = reason
        self._allowance = None

    def _ledger_versions(self) -> tuple[int, int | None]:
        assert self._main is not None
        return (self._main.accountant.version,
                None if self._honest is None else self._honest.accountant.version)

    def _refuse_rewind(self) -> None:
        """load_state_dict replaces the ledger, so it is refused once this engine has released
        or charged anything in this process, or its ledger was composed into by hand since
        make_private or the last load (a ledger only grows within a process)."""
        released = self._released_here
        if released or self._charged_here:
            what = (f"released {released} noisy gradient{'s' if released != 1 else ''}"
                    if released else "charged a release (whose release then failed)")
            raise RuntimeError(
                f"load_state_dict refused: this engine has {what} in this process, and loading "
                "a checkpoint would replace its ledger with the checkpoint's. A checkpoint is "
                "loaded into a fresh engine (the engine of a new make_private call) when "
                "resuming in a new process; restoring an earlier state in the same run would "
                "drop releases already made from the ledger, and choosing among checkpoints is "
                "post-processing of every release made. Keep this engine's ledger and restore "
                "only the weights if you want the best checkpoint's: the model's "
                "(module.load_state_dict) and the wrapped torch optimizer's "
                "(optimizer.original_optimizer.load_state_dict)")
        if self._versions != self._ledger_versions():
            raise RuntimeError(
                "load_state_dict refused: events were composed into engine.accountant by hand "
                "since make_private (or the last load_state_dict), and loading a checkpoint "
                "would replace the ledger that holds them. Load the checkpoint first, then "
                "compose them")

    def _require_consistent(self) -> None:
        """The optimizer's release count must be the engine's: otherwise a state was restored
        into one of them only, and the ledger misses (or invents) releases."""
        assert self.optimizer is not None
        if self.optimizer.releases != self._released:
            raise RuntimeError(
                f"the optimizer has released {self.optimizer.releases} noisy gradients but this "
                f"engine accounted {self._released}: optimizer.load_state_dict() restored a "
                "checkpoint without engine.load_state_dict() (or from another checkpoint). "
                "Restore both from the same checkpoint into a fresh engine (in the same run, "
                "restore only the wrapped torch optimizer's state: "
                "optimizer.original_optimizer.load_state_dict); refusing to release or report"
            )
        self._require_grown()

    def _hold_ledgers(self) -> None:
        """Record the ledgers as the engine leaves them (make_private, a charge, a load): a
        live view of each composed multiset (O(1) per charge; a copy cost O(distinct events)
        per step, quadratic in the steps of a per-step noise schedule), which an accountant's
        load_state_dict detaches from the new state (``Accountant.composed_counts``)."""
        self._held = [(each, each.accountant.version, each.accountant.composed_counts,
                       each.non_private_releases)
                      for each in (self._main, self._honest) if each is not None]

    def _require_grown(self) -> None:
        """A ledger changed outside the engine may only have grown (events composed by hand);
        one that lost events (``engine.accountant.load_state_dict`` of an earlier state) drops
        releases already made, and nothing more is released or reported."""
        changed = False
        for ledger, version, composed, non_private in self._held:
            if ledger.accountant.version == version and ledger.non_private_releases == non_private:
                continue
            changed = True
            counts = ledger.accountant.composed_counts
            lost = [f"{count - counts.get(event, 0)} x {event!r}"
                    for event, count in composed.items() if counts.get(event, 0) < count]
            if ledger.non_private_releases < non_private:
                lost.append(f"{non_private - ledger.non_private_releases} releases without noise")
            if lost:
                raise RuntimeError(
                    f"the engine's {ledger.accounting!r} ledger lost {', '.join(lost)} since "
                    "the engine last charged it: its accountant's state was replaced in this "
                    "process (accountant.load_state_dict), dropping releases already made. A "
                    "ledger only grows; refusing to release or report"
                )
        if changed:
            self._hold_ledgers()

    def _require_support(self, ledger: _Ledger, loader: DPDataLoader, accounting: str) -> None:
        probe = self._event(accounting, loader, 1.0)
        reason = ledger.accountant.unsupported_reason(probe)
        if reason is not None:
            others = [name for name in available() if self._supports(name, accounting, probe)]
            hint = f"; accountants that can: {', '.join(others)}" if others else ""
            raise ValueError(
                f"accountant {ledger.name!r} cannot account {accounting!r} sampling: {reason}{hint}"
            )

    @staticmethod
    def _supports(name: str, accounting: str, event: Event) -> bool:
        try:
            return _new_accountant(name, SAMPLINGS[accounting][0], {}).supports(event)
        except (TypeError, ValueError):
            return False

    def _honest_ledger(self, loader: DPDataLoader) -> _Ledger:
        probe = self._event(loader.sampling, loader, 1.0)
        names = [self.accountant_name] + [n for n in available() if n != self.accountant_name]
        for name in names:
            if self._supports(name, loader.sampling, probe):
                options = self.accountant_options if name == self.accountant_name else {}
                return _Ledger(name, options, loader.sampling)
        raise ValueError(f"no registered accountant can account the loader's {loader.sampling!r} sampling")

    @staticmethod
    def _event(accounting: str, loader: DPDataLoader, sigma: float) -> Event:
        batch = getattr(loader, "batch_size", None)
        if batch is None:
            batch = max(1, min(loader.dataset_size, round(loader.expected_batch_size)))
        return sampling_event(
            accounting,
            sigma,
            dataset_size=loader.dataset_size,
            sample_rate=loader.sample_rate,
            batch_size=batch,
        )

    def _units(self, accounting: str, loader: DPDataLoader, epochs: int) -> int:
        return epochs if SAMPLINGS[accounting][1] == "epoch" else epochs * loader.steps_per_epoch

    def _calibrate(
        self,
        ledger: _Ledger,
        loader: DPDataLoader,
        target: float,
        delta: float,
        epochs: int,
        allow_approximation: bool,
    ) -> float:
        """sigma such that ``epochs`` epochs of ``loader`` cost at most ``target`` (certified,
        within dpsharp.calibrate's relative tolerance below it; an approximation only with
        ``allow_approximation``)."""
        from dpsharp import calibrate

        units = self._units(ledger.accounting, loader, epochs)
        return calibrate.noise_multiplier(
            target,
            delta,
            steps=units,
            sampling_probability=loader.sample_rate,
            accountant=ledger._fresh,
            event=lambda sigma, _q: self._event(ledger.accounting, loader, sigma),
            allow_approximation=allow_approximation,
        )

    # ----------------------------------------------------------------- per release
    def _charge(self, ledger: _Ledger, sigma: float) -> Event | None:
        """The event releasing the current batch at sigma adds to ``ledger`` (None: free)."""
        assert self.loader is not None
        if ledger.per_epoch:
            if ledger.last_epoch_charge == (self.loader.epoch, sigma):
                return None
        return self._event(ledger.accounting, self.loader, sigma)

    def _watch_noise(self, optimizer: DPOptimizer) -> None:
        if optimizer.noise_chosen_online and not self._adaptive:
            self._declare_adaptive(
                "noise_multiplier was changed after the first release, outside a schedule "
                "committed before it"
            )

    def _check_budget(self, optimizer: DPOptimizer) -> str | None:
        self._require_consistent()
        self._watch_noise(optimizer)
        if self.budget is None:
            return None
        assert self._main is not None
        sigma = optimizer.noise_multiplier
        if sigma == 0.0:
            return "noise_multiplier is 0: a release without noise fits in no finite budget"
        if self._pending_charge == (optimizer.releases, sigma):
            return None  # charged already by an attempt whose release then failed
        event = self._charge(self._main, sigma)
        if event is None:
            return None  # already paid for (this epoch of a reshuffling accounting)
        if self.steps_left(event) < 1:
            kind = _filter_of(self._main.accountant)
            if self._filtered() and kind is not None:
                rule = f"the {_FILTER_NAMES[kind]}"
            else:
                rule = f"epsilon(delta={self.budget.delta})"
            label = "" if self._main.accountant.certified else " (an approximation)"
            spent = self._main.accountant.epsilon(self.budget.delta)
            return (
                f"releasing this step ({event!r}) would take {rule} above the budget "
                f"epsilon={self.budget.epsilon}; spent so far: "
                f"{format_bound(spent, '.6g', side='upper')}{label}"
            )
        return None

    def _filtered(self) -> bool:
        """Whether the budget is enforced as a privacy filter for adaptive noise."""
        return self._adaptive and self.budget is not None

    def _fits(self, accountant: Accountant) -> bool:
        """Whether ``accountant``'s ledger is within the budget (by the filter when adaptive)."""
        assert self.budget is not None
        if self._filtered() and _filter_of(accountant) == "renyi":
            return _renyi_filter_admits(accountant, self.budget)
        # Without adaptivity: the accountant's epsilon. The zCDP and GDP filters are this same
        # check, since their conversions increase with rho and mu (module docstring).
        return accountant.epsilon(self.budget.delta) <= self.budget.epsilon

    def steps_left(self, event: Event | None = None) -> int | float:
        """How many more events (releases, or epochs for a reshuffling accounting) the budget
        allows at the current sigma and sampling; ``math.inf`` without a budget. Exact when
        fewer than the search horizon (1024 ahead) remain, otherwise a lower bound. Any change
        of the accountant's ledger other than the engine's own charges (an event composed by
        hand, a loaded state) makes it search again."""
        if self.budget is None:
            return math.inf
        assert self._main is not None and self.optimizer is not None
        self._require_consistent()
        if event is None:
            if self.optimizer.noise_multiplier == 0.0:
                return 0
            event = self._event(self._main.accounting, self.loader, self.optimizer.noise_multiplier)  # type: ignore[arg-type]
        version = self._main.accountant.version
        allowance = self._allowance
        if (
            allowance is None
            or allowance[0] != event
            or allowance[3] != version
            or (allowance[1] == _ALLOWANCE_HORIZON and allowance[2] >= allowance[1])
        ):
            allowance = self._allowance = (event, self._allowed(event), 0, version)
        return allowance[1] - allowance[2]

    def _allowed(self, event: Event) -> int:
        """min(horizon, largest k with ledger + k * event within the budget): exponential then
        binary search, the spent budget being non-decreasing in k."""
        assert self._main is not None and self.budget is not None
        main = self._main

        def fits(k: int) -> bool:
            return self._fits(main.clone_with(event, k))

        if not fits(1):
            return 0
        if fits(_ALLOWANCE_HORIZON):
            return _ALLOWANCE_HORIZON
        low, high = 1, 2
        while high < _ALLOWANCE_HORIZON and fits(high):
            low, high = high, 2 * high
        high = min(high, _ALLOWANCE_HORIZON)
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low

    def _charge_release(self, optimizer: DPOptimizer) -> None:
        """Compose the release's event into the ledger(s) *before* anything is released: if the
        accountant raises, nothing has been written to ``p.grad``."""
        self._require_consistent()
        sigma = optimizer.noise_multiplier
        marker = (optimizer.releases, sigma)
        if self._pending_charge == marker:
            return  # this release was charged by an attempt that then failed to release
        self._charged_here = True
        for ledger in (self._honest, self._main):
            if ledger is None:
                continue
            if sigma == 0.0:
                ledger.non_private_releases += 1
                continue
            event = self._charge(ledger, sigma)
            if event is None:
                continue
            version = ledger.accountant.version
            ledger.accountant.compose(event)
            ledger.record_charge(sigma)
            if ledger.per_epoch:
                ledger.last_epoch_charge = (self.loader.epoch, sigma)  # type: ignore[union-attr]
            if ledger is self._main:
                allowance = self._allowance
                if allowance is not None and allowance[0] == event and allowance[3] == version:
                    self._allowance = (event, allowance[1], allowance[2] + 1,
                                       ledger.accountant.version)
                else:
                    self._allowance = None
        self._hold_ledgers()
        self._pending_charge = marker

    def _on_release(self, optimizer: DPOptimizer) -> None:
        self._released += 1
        self._released_here += 1
        self._pending_charge = None

    # ----------------------------------------------------------------- queries
    def _ledger(self) -> _Ledger:
        if self._main is None:
            raise RuntimeError("call make_private first")
        return self._main

    @property
    def accountant(self) -> Accountant:
        """The live accountant (of the requested accounting). Events composed into it by hand
        (e.g. the cost of a hyperparameter search) count against the budget at once."""
        return self._ledger().accountant

    @property
    def steps(self) -> int:
        """Noisy releases so far."""
        return 0 if self.optimizer is None else self.optimizer.releases

    @property
    def adaptive_noise(self) -> bool:
        """Whether sigma is (declared or detected to be) chosen from earlier outputs."""
        return self._adaptive

    def epsilon(self, delta: float | None = None) -> float:
        """epsilon(delta) of everything released so far (inf after a release without noise):
        the accountant's composition of the ledger. For adaptively chosen noise this is only a
        reading; :meth:`report` gives the guarantee and says whether it is certified.

        With ``allow_accounting_mismatch=True`` (an accounting other than the loader's
        sampling) this is the requested accounting's number, which is *not* a bound for the
        sampling the loader really does: a UserWarning says so at every call, and
        :meth:`report` gives the loader's own epsilon as ``honest_epsilon`` (its ``certified``
        is False). After a release with adaptively chosen noise a UserWarning likewise says
        that the number is a reading, not the guarantee."""
        return self._read_epsilon(delta)

    def _read_epsilon(self, delta: float | None) -> float:
        """:meth:`epsilon` and :meth:`get_epsilon`: the ledger's epsilon, with a UserWarning
        (pointing at the caller's line) for each reason it is not the run's guarantee."""
        ledger = self._ledger()
        self._require_consistent()
        delta = require_delta(self._delta_or(delta))
        if self._honest is not None:
            warnings.warn(self._mismatch_words(), UserWarning, stacklevel=3)
        if self._adaptive and not ledger.accountant.is_empty:
            warnings.warn(
                f"the noise multiplier was chosen adaptively ({self._adaptive_reason}): this "
                "epsilon composes the realised noise multipliers as if they had been fixed in "
                "advance, which is a reading, not a guarantee; report() gives the run's "
                "statement (certified only under a budget enforced by a privacy filter)",
                UserWarning, stacklevel=3)
        if ledger.non_private_releases:
            return math.inf
        return ledger.accountant.epsilon(delta)

    def _mismatch_words(self) -> str:
        """Why the requested accounting's epsilon is not a bound for this loader."""
        assert self._main is not None and self.loader is not None
        return (
            f"the run is accounted as {self._main.accounting!r} sampling at the user's request "
            f"(allow_accounting_mismatch=True), but the loader samples by "
            f"{self.loader.sampling!r}: this epsilon is not a bound for the loader's actual "
            "sampling (report().honest_epsilon is the epsilon of the sampling it does)"
        )

    def _delta_or(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.delta is None:
            raise ValueError("delta is required: make_private was given no delta (nor a budget)")
        return self.delta

    def _statement(self, ledger: _Ledger, delta: float) -> tuple[float, bool, str | None]:
        """(epsilon, certified, warning) of ``ledger`` at ``delta``, before adaptivity."""
        if ledger.non_private_releases:
            return math.inf, True, None
        guarantee = ledger.accountant.guarantee(delta)
        return guarantee.epsilon, bool(guarantee.certified), guarantee.warning

    def report(self, delta: float | None = None) -> PrivacyReport:
        """The run's privacy statement: both numbers when the accounting was overridden, one
        otherwise; each says whether it is a proven bound (``certified``)."""
        ledger = self._ledger()
        self._require_consistent()
        delta = require_delta(self._delta_or(delta))
        epsilon, certified, warning = self._statement(ledger, delta)
        notes: list[str] = []
        if self._adaptive and not ledger.accountant.is_empty:
            reading = epsilon
            budget = self.budget
            kind = _filter_of(ledger.accountant)
            # The filter's guarantee covers the ledger only while it satisfies the filter (an
            # event composed by hand can take it past).
            if (budget is not None and kind is not None and delta >= budget.delta
                    and not ledger.non_private_releases and self._fits(ledger.accountant)):
                epsilon = budget.epsilon
                notes.append(
                    f"the noise multiplier was chosen adaptively ({self._adaptive_reason}); the "
                    f"budget was enforced by the {_FILTER_NAMES[kind]}, which proves "
                    f"({budget.epsilon:g}, {budget.delta!r})-DP for the whole run; the "
                    f"composition of the realised noise multipliers reads {reading:.6g}, which "
                    "is not a guarantee for adaptively chosen noise"
                )
            else:
                certified = False
                adaptive = (
                    f"the noise multiplier was chosen adaptively ({self._adaptive_reason}) "
                    f"without a privacy filter at this delta: epsilon {reading:.6g} composes "
                    "the realised noise multipliers as if they had been fixed in advance, which "
                    "no composition theorem proves for adaptively chosen parameters; set a "
                    "budget with adaptive_noise=True on the 'rdp' accountant (Renyi filter)"
                )
                warning = adaptive if warning is None else f"{warning}; {adaptive}"
        honest_eps = honest_name = honest_certified = None
        if self._honest is not None:
            honest_eps, honest_certified, _ = self._statement(self._honest, delta)
            honest_certified = honest_certified and not self._adaptive
            honest_name = self._honest.name
            notes.append(
                f"the loader samples by {self.loader.sampling!r} but the run is accounted as "  # type: ignore[union-attr]
                f"{ledger.accounting!r} at the user's request; the loader's own sampling gives "
                f"epsilon {format_bound(honest_eps, '.6g', side='upper')}"
                + ("" if honest_certified else " (not certified)")
            )
        guarantee = RELATION_WORDS[ledger.neighbouring]
        if self._honest is not None:
            # The requested accounting's number describes a sampling the loader does not do:
            # whatever its accountant proves, it proves it for that other sampling.
            certified = False
            mismatch = (f"{self._mismatch_words()}; epsilon "
                        f"{format_bound(epsilon, '.6g', side='upper')} is the "
                        f"{ledger.accounting!r} accounting's, honest_epsilon "
                        f"{format_bound(honest_eps, '.6g', side='upper')} the loader's")
            warning = mismatch if warning is None else f"{warning}; {mismatch}"
            sampling = self.loader.sampling  # type: ignore[union-attr]
            guarantee = (
                f"{guarantee}, for {ledger.accounting!r} sampling, which the loader does not "
                f"do: not a bound for its {sampling!r} sampling (see honest_epsilon)"
            )
        elif not certified and not ledger.accountant.certified:
            notes.append(f"epsilon {format_bound(epsilon, '.6g', side='nearest')} is an "
                         "approximation, not a certified bound")
        return PrivacyReport(
            epsilon=epsilon,
            delta=delta,
            accountant=ledger.name,
            accounting=ledger.accounting,
            sampling=self.loader.sampling,  # type: ignore[union-attr]
            steps=self.steps,
            epochs=self.loader.epoch,  # type: ignore[union-attr]
            honest_epsilon=honest_eps,
            honest_accountant=honest_name,
            note="; ".join(notes) if notes else None,
            certified=certified,
            warning=warning,
            honest_certified=honest_certified,
            guarantee=guarantee,
        )

    def within_budget(self) -> bool:
        """Whether the next release (at the current sigma) fits in the budget."""
        if self.budget is None:
            return True
        assert self.optimizer is not None
        return self._check_budget(self.optimizer) is None

    def view(self, name: str, **options: Any) -> Accountant:
        """A fresh accountant of family ``name`` that has composed the same events (e.g.
        "gdp" for the CLT mu, "zcdp" for rho, "rdp" for the Renyi curve)."""
        ledger = self._ledger()
        other = _new_accountant(name, ledger.neighbouring, options)
        for event, count in ledger.accountant.ledger:
            other.compose(event, count)
        return other

    def gdp_mu(self) -> float:
        """The GDP mu of the run: the certified ``gdp_mu()`` of the accountant if it has one
        (the tight accountant), else the central-limit mu of the "gdp" accountant (an
        approximation)."""
        accountant = self._ledger().accountant
        if hasattr(accountant, "gdp_mu"):
            return float(accountant.gdp_mu())
        return float(self.view("gdp").mu)  # type: ignore[attr-defined]

    def zcdp_rho(self, **options: Any) -> float:
        """The zCDP rho of the run from the "zcdp" accountant."""
        return float(self.view("zcdp", **options).rho)  # type: ignore[attr-defined]

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Accountant ledger(s), sampler state, noise stream position, release count and the
        clip rule's state (the adaptive clipping bound). Save the model's and optimizer's own
        state_dicts beside it. Nothing derived from the ledger (such as the budget's
        allowance) is stored: it is recomputed after loading."""
        ledger = self._ledger()
        assert self.optimizer is not None and self.loader is not None
        self._require_consistent()
        if int(self.optimizer.clipper.accumulated_batches) > 0:
            raise RuntimeError("cannot checkpoint with accumulated, unreleased gradients; "
                               "checkpoint between optimizer steps")
        return {
            "format": _STATE_FORMAT,
            "main": ledger.state_dict(),
            "honest": None if self._honest is None else self._honest.state_dict(),
            "loader": self.loader.state_dict(),
            "noise": self.optimizer.noise.state_dict(),
            "releases": self.optimizer.releases,
            "noise_multiplier": self.optimizer.noise_multiplier,
            "noise_chosen_online": self.optimizer.noise_chosen_online,
            "lot_pending": self.optimizer._lot_pending,
            "budget": None if self.budget is None else [self.budget.epsilon, self.budget.delta],
            "adaptive": None if not self._adaptive else self._adaptive_reason,
            # the clip rule's state (adaptive clipping: the bound C_t the next release clips
            # at, itself a function of the released counts), so that the engine's checkpoint
            # alone resumes the run exactly
            "clipping": (None if self.optimizer.clip_rule is None
                         else self.optimizer.clip_rule.state_dict()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into an engine set up by the same ``make_private`` call;
        the resumed run then reports exactly the uninterrupted run's epsilon and continues the
        noise stream and the sampler where they stopped.

        The checkpoint is validated, not trusted: its ledger must hold at least the events its
        release count implies, and each event its record of charges implies (the charged noise
        multipliers, under this engine's loader: a ledger from a run with another sampling
        rate or dataset size is refused); its loader must have drawn as many logical batches
        as releases were made (one more while a batch is pending); and the budget's allowance
        is recomputed from the ledger (a stored allowance, from older checkpoints, is ignored).
        A checkpoint's noise multiplier replaces the one given to ``make_private`` (a warning
        is logged when they differ). A refused checkpoint restores nothing.

        The ledger only grows within a process: an engine that has released (or charged) a
        noisy gradient, or whose ledger was composed into by hand, refuses to load (it would
        drop releases already made from the ledger: in the same run, restoring an earlier
        state to go on training, or to report the best checkpoint's epsilon, understates the
        run, since choosing among checkpoints is post-processing of every release made); so
        does a checkpoint whose ledger lacks events of one loaded before. To keep the best
        checkpoint's weights, restore only the model's and the wrapped torch optimizer's
        states and keep this engine's ledger.

        Raises
        ------
        RuntimeError
            If this engine released or charged anything, or was composed into by hand, since
            ``make_private`` (or the last load) in this process.
        ValueError
            If the checkpoint is inconsistent, or belongs to a different setup.
        """
        ledger = self._ledger()
        assert self.optimizer is not None and self.loader is not None
        self._refuse_rewind()
        if state.get("format") not in (1, _STATE_FORMAT):
            raise ValueError(f"unsupported engine state format {state.get('format')!r}")
        if (state["honest"] is None) != (self._honest is None):
            raise ValueError("the checkpoint and this engine differ in accounting override")
        budget = None if self.budget is None else [self.budget.epsilon, self.budget.delta]
        if state["budget"] != budget:
            raise ValueError(f"checkpoint budget {state['budget']!r} differs from this engine's {budget!r}")
        releases = require_count("releases", state["releases"])
        sigma = require_real("noise_multiplier", state["noise_multiplier"])
        rule = self.optimizer.clip_rule
        if "clipping" in state and (state["clipping"] is None) != (rule is None):
            raise ValueError(
                "the checkpoint and this engine differ in clip rule (the checkpoint "
                f"{'has none' if state['clipping'] is None else 'has one'}, this optimizer's "
                f"is {rule!r}); resume with the make_private arguments of the checkpointed run")
        clipping = state.get("clipping")
        if clipping is not None and clipping.get("bound") is not None:
            require_positive_finite("clipping bound", clipping["bound"])  # before any change
        adaptive = state.get("adaptive")
        if adaptive is not None and not self._adaptive and self.budget is not None:
            self._require_filter(ledger)
        # Everything below is undone if any of it raises: a refused checkpoint restores nothing.
        held = [(each, each.snapshot(), each.accountant.composed, each.non_private_releases)
                for each in (ledger, self._honest) if each is not None]
        optimizer = self.optimizer
        try:
            loader_state: dict[str, Any] | None = self.loader.state_dict()
        except RuntimeError:  # in the middle of a logical batch: its load refuses as well
            loader_state = None
        before = (loader_state, optimizer.noise.state_dict(), optimizer._releases,
                  optimizer.noise_multiplier, optimizer.noise_chosen_online,
                  optimizer._lot_pending,
                  None if optimizer.clip_rule is None else optimizer.clip_rule.state_dict())
        loader_loaded = False
        try:
            ledger.load_state_dict(state["main"], releases)
            if self._honest is not None:
                self._honest.load_state_dict(state["honest"], releases)
            # A ledger only grows: a checkpoint loaded over one loaded before (nothing was
            # released in between, see _refuse_rewind) must hold everything that one held.
            for each, _, composed, non_private in held:
                lost = each.dropped(composed, non_private)
                if lost is not None:
                    raise ValueError(
                        f"the checkpoint's ledger lacks {lost} that this engine's ledger held "
                        "(from a checkpoint loaded before): loading it would shrink the ledger "
                        "and drop releases it records; refusing it")
            self.loader.load_state_dict(state["loader"])
            loader_loaded = True
            drawn = state["loader"].get("logical_batches")
            if drawn is not None and not releases <= drawn <= releases + 1:
                raise ValueError(
                    f"the checkpoint's loader has drawn {drawn} logical batches but its engine "
                    f"made {releases} releases: it was edited or its parts come from different "
                    "runs; refusing it")
            for each in (ledger, self._honest):
                if each is None:
                    continue
                missing = each.missing_charges(
                    lambda sigma, each=each: self._event(each.accounting, self.loader, sigma))
                if missing is not None:
                    raise ValueError(
                        f"the checkpoint's ledger lacks events its record of charges implies "
                        f"for this loader's sampling: {missing}; it was edited or comes from "
                        "another run (another sampling rate or dataset size); refusing it")
            charge = ledger.last_epoch_charge
            if charge is not None:
                paid = self._event(ledger.accounting, self.loader, charge[1])
                if charge[0] > self.loader.epoch or paid not in dict(ledger.accountant.composed):
                    raise ValueError(
                        f"the checkpoint says epoch {charge[0]} was paid at noise multiplier "
                        f"{charge[1]!r}, which its ledger and loader do not show; refusing it"
                    )
            optimizer.noise.load_state_dict(state["noise"])
            optimizer._releases = releases
            optimizer._set_noise_multiplier(sigma, online=False)
            optimizer._noise_chosen_online = bool(state.get("noise_chosen_online", False))
            optimizer._lot_pending = bool(state["lot_pending"])
            # A checkpoint holds no clipped sums: what was accumulated since it (e.g. a lot
            # whose release was refused) is dropped, unreleased, exactly as in a fresh process.
            optimizer.clipper.reset()
            if state.get("clipping") is not None:
                optimizer._load_clipping_state(state["clipping"])
        except BaseException:
            for each, snapshot, _, _ in held:
                each.restore(snapshot)
            if loader_loaded and before[0] is not None:
                self.loader.load_state_dict(before[0])
            optimizer.noise.load_state_dict(before[1])
            optimizer._releases = before[2]
            optimizer._set_noise_multiplier(before[3], online=False)
            optimizer._noise_chosen_online, optimizer._lot_pending = before[4], before[5]
            if before[6] is not None:
                optimizer._load_clipping_state(before[6])
            self._versions = self._ledger_versions()  # the same ledger as before, restored
            self._hold_ledgers()
            raise
        if sigma != before[3]:
            logger.warning(
                "resumed at the checkpoint's noise multiplier %r, not the %r this engine was "
                "made with (a schedule attached to the engine sets it before every release)",
                sigma, before[3])
        self._released = releases
        self._pending_charge = None
        self._allowance = None
        self._versions = self._ledger_versions()
        self._hold_ledgers()
        if adaptive is not None and not self._adaptive:
            self._adaptive = True
            self._adaptive_reason = str(adaptive)
