"""The privacy engine: wire a model, an optimizer and an honest loader into an accountant.

``PrivacyEngine(accountant="pld").make_private(model, optimizer, loader, ...)`` returns the model
(with per-example clipping installed), a :class:`~dpsharp.torch.DPOptimizer` and a
:class:`~dpsharp.torch.data.DPDataLoader`. Every noisy release composes, into the accountant, the
event the loader's sampling implies (:func:`dpsharp.torch.data.sampling_event`):
``PoissonSampled(Gaussian(sigma), q)`` per step, ``SampledWithoutReplacement(Gaussian(sigma/2),
b, n)`` per step (replace-one), or ``Shuffled(Gaussian(sigma), b, n)`` once per epoch.

Budgets (Abadi et al. 2016, Algorithm "while within_limit(eps, delta)"; Yu et al. 2019: "the
training is terminated when the privacy budget runs out"): with ``budget=PrivacyBudget(eps,
delta)`` every release is checked *before* its noisy gradient is written, and refused with
:class:`BudgetExhausted` if composing its event would make epsilon(delta) exceed eps. The check
is a counter comparison: the number of further events the budget allows at the current event
is computed once (exponential then binary search over the accountant's own epsilon) and again
only when the event (sigma, q) changes.
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from dpsharp._validation import require_count, require_delta, require_epsilon, require_real
from dpsharp.accountants import Accountant, available
from dpsharp.accountants import accountant as make_accountant
from dpsharp.accountants.registry import _REGISTRY
from dpsharp.events import Event, Neighbouring, event_from_dict, event_to_dict
from dpsharp.torch.data import SAMPLINGS, DPDataLoader, from_dataloader, sampling_event
from dpsharp.torch.optimizer import BudgetExhausted, DPOptimizer, _require_max_grad_norm

__all__ = ["BudgetExhausted", "PrivacyBudget", "PrivacyEngine", "PrivacyReport"]

logger = logging.getLogger(__name__)

_STATE_FORMAT = 1
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

    ``epsilon`` comes from the accounting the engine was asked for. When that accounting does
    not match the loader's sampling (allowed only with ``allow_accounting_mismatch=True``),
    ``honest_epsilon`` is the epsilon of the sampling the loader really does, from
    ``honest_accountant``; report both (cf. TF Privacy's privacy statement).
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
        self.neighbouring = SAMPLINGS[accounting][0]
        self.accountant = self._fresh()
        self.last_epoch_charge: tuple[int, float] | None = None  # (epoch, sigma), "epoch" units
        self.non_private_releases = 0

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
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["name"] != self.name or state["accounting"] != self.accounting:
            raise ValueError(
                f"checkpoint accounts {state['accounting']!r} with {state['name']!r}; this "
                f"engine accounts {self.accounting!r} with {self.name!r}"
            )
        self.accountant.load_state_dict(state["accountant"])
        charge = state["last_epoch_charge"]
        self.last_epoch_charge = None if charge is None else (int(charge[0]), float(charge[1]))
        self.non_private_releases = require_count("non_private_releases", state["non_private_releases"])


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
        under the neighbouring relation of the loader's sampling.
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
        self.budget: PrivacyBudget | None = None
        self.delta: float | None = None
        # budget cache: (event, allowed further events when computed, events charged since)
        self._allowance: tuple[Event, int, int] | None = None

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
        clipping: str = "flat",
        loss_reduction: str = "mean",
        budget: PrivacyBudget | None = None,
        sampling: str = "poisson",
        accounting: str | None = None,
        allow_accounting_mismatch: bool = False,
        max_physical_batch_size: int | None = None,
        seed: int | None = None,
    ) -> tuple[torch.nn.Module, DPOptimizer, DPDataLoader]:
        """Return ``(module, dp_optimizer, dp_loader)``.

        Parameters
        ----------
        data_loader:
            A :class:`~dpsharp.torch.data.DPDataLoader` (used as is), or a torch DataLoader whose
            sampler is replaced by ``sampling`` ("poisson" with q = batch_size / n, "shuffle" or
            "without_replacement") -- see :func:`dpsharp.torch.data.from_dataloader`.
        noise_multiplier, target_epsilon:
            Exactly one. With ``target_epsilon`` (and ``delta``, ``epochs``) sigma is calibrated
            with :mod:`dpsharp.calibrate` on this engine's accountant so that ``epochs`` epochs
            of this loader cost at most ``target_epsilon``.
        delta:
            The delta at which epsilon is reported (default: the budget's delta).
        budget:
            A :class:`PrivacyBudget` that no release may exceed.
        accounting:
            The sampling to account for (default: the loader's). A different one is refused
            unless ``allow_accounting_mismatch=True``; then both epsilons are reported by
            :meth:`report` and the budget applies to the requested accounting.
        seed:
            Seeds the noise stream, and the sampler when the loader is built here (seeded
            runs are for testing and reproducibility; refused in secure mode).
        """
        if self.optimizer is not None:
            raise RuntimeError("this PrivacyEngine already made a model private; use a new engine")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
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
        if delta is None:
            if budget is None:
                raise ValueError("delta is required (the delta epsilon is reported at)")
            delta = budget.delta
        delta = require_delta(delta)
        if self.secure_mode and seed is not None:
            raise ValueError("seed must be None in secure mode")
        if seed is not None:
            require_count("seed", seed)

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
        main = _Ledger(self.accountant_name, self.accountant_options, accounting)
        self._require_support(main, loader, accounting)
        honest = None
        if mismatch:
            honest = self._honest_ledger(loader)
            logger.warning(
                "accounting a %r loader as %r at the user's request; the honest %r accounting "
                "is reported alongside", loader.sampling, accounting, loader.sampling,
            )

        if sigma is None:
            sigma = self._calibrate(main, loader, float(target_epsilon), delta, int(epochs))  # type: ignore[arg-type]

        dp_optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=norm,
            expected_batch_size=loader.expected_batch_size,
            module=_distributed.unwrap_ddp(module),
            clipping=clipping,
            loss_reduction=loss_reduction,
            seed=seed,
            secure=self.secure_mode,
            distributed=ddp,
            process_group=process_group,
        )
        dp_optimizer.attach_loader(loader)
        dp_optimizer.add_budget_check(self._check_budget)
        dp_optimizer.add_release_hook(self._on_release)
        self._main, self._honest = main, honest
        self.optimizer, self.loader, self.module = dp_optimizer, loader, module
        self.budget, self.delta = budget, delta
        return module, dp_optimizer, loader

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

    def _calibrate(self, ledger: _Ledger, loader: DPDataLoader, target: float, delta: float, epochs: int) -> float:
        """sigma such that ``epochs`` epochs of ``loader`` cost at most ``target`` (certified,
        within dpsharp.calibrate's relative tolerance below it)."""
        from dpsharp import calibrate

        units = self._units(ledger.accounting, loader, epochs)
        return calibrate.noise_multiplier(
            target,
            delta,
            steps=units,
            sampling_probability=loader.sample_rate,
            accountant=ledger._fresh,
            event=lambda sigma, _q: self._event(ledger.accounting, loader, sigma),
        )

    # ----------------------------------------------------------------- per release
    def _charge(self, ledger: _Ledger, sigma: float) -> Event | None:
        """The event releasing the current batch at sigma adds to ``ledger`` (None: free)."""
        assert self.loader is not None
        if SAMPLINGS[ledger.accounting][1] == "epoch":
            if ledger.last_epoch_charge == (self.loader.epoch, sigma):
                return None
        return self._event(ledger.accounting, self.loader, sigma)

    def _check_budget(self, optimizer: DPOptimizer) -> str | None:
        if self.budget is None:
            return None
        assert self._main is not None
        sigma = optimizer.noise_multiplier
        if sigma == 0.0:
            return "noise_multiplier is 0: a release without noise fits in no finite budget"
        event = self._charge(self._main, sigma)
        if event is None:
            return None  # already paid for (this epoch of a reshuffling loader)
        if self.steps_left(event) < 1:
            return (
                f"releasing this step ({event!r}) would take epsilon(delta={self.budget.delta}) "
                f"above the budget epsilon={self.budget.epsilon}; spent so far: "
                f"{self.epsilon(self.budget.delta):.6g}"
            )
        return None

    def steps_left(self, event: Event | None = None) -> int | float:
        """How many more events (releases, or epochs for a reshuffling accounting) the budget
        allows at the current sigma and sampling; ``math.inf`` without a budget. Exact when
        fewer than the search horizon (1024 ahead) remain, otherwise a lower bound."""
        if self.budget is None:
            return math.inf
        assert self._main is not None and self.optimizer is not None
        if event is None:
            if self.optimizer.noise_multiplier == 0.0:
                return 0
            event = self._event(self._main.accounting, self.loader, self.optimizer.noise_multiplier)  # type: ignore[arg-type]
        if (
            self._allowance is None
            or self._allowance[0] != event
            or (self._allowance[1] == _ALLOWANCE_HORIZON and self._allowance[2] >= self._allowance[1])
        ):
            self._allowance = (event, self._allowed(event), 0)
        return self._allowance[1] - self._allowance[2]

    def _allowed(self, event: Event) -> int:
        """min(horizon, largest k with epsilon(ledger + k * event) <= budget): exponential then
        binary search, epsilon being non-decreasing in k."""
        assert self._main is not None and self.budget is not None
        budget = self.budget

        def fits(k: int) -> bool:
            return self._main.clone_with(event, k).epsilon(budget.delta) <= budget.epsilon  # type: ignore[union-attr]

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

    def _on_release(self, optimizer: DPOptimizer) -> None:
        sigma = optimizer.noise_multiplier
        for ledger in (self._main, self._honest):
            if ledger is None:
                continue
            if sigma == 0.0:
                ledger.non_private_releases += 1
                continue
            event = self._charge(ledger, sigma)
            if event is None:
                continue
            ledger.accountant.compose(event)
            if SAMPLINGS[ledger.accounting][1] == "epoch":
                ledger.last_epoch_charge = (self.loader.epoch, sigma)  # type: ignore[union-attr]
            if ledger is self._main:
                if self._allowance is not None and self._allowance[0] == event:
                    event_, allowed, used = self._allowance
                    self._allowance = (event_, allowed, used + 1)
                else:
                    self._allowance = None

    # ----------------------------------------------------------------- queries
    def _ledger(self) -> _Ledger:
        if self._main is None:
            raise RuntimeError("call make_private first")
        return self._main

    @property
    def accountant(self) -> Accountant:
        """The live accountant (of the requested accounting)."""
        return self._ledger().accountant

    @property
    def steps(self) -> int:
        """Noisy releases so far."""
        return 0 if self.optimizer is None else self.optimizer.releases

    def epsilon(self, delta: float | None = None) -> float:
        """epsilon(delta) of everything released so far (inf after a release without noise)."""
        ledger = self._ledger()
        delta = require_delta(self.delta if delta is None else delta)
        if ledger.non_private_releases:
            return math.inf
        return ledger.accountant.epsilon(delta)

    def report(self, delta: float | None = None) -> PrivacyReport:
        """Both numbers when the accounting was overridden, one otherwise."""
        ledger = self._ledger()
        delta = require_delta(self.delta if delta is None else delta)
        honest_eps = honest_name = note = None
        if self._honest is not None:
            honest_eps = math.inf if self._honest.non_private_releases else self._honest.accountant.epsilon(delta)
            honest_name = self._honest.name
            note = (
                f"the loader samples by {self.loader.sampling!r} but the run is accounted as "  # type: ignore[union-attr]
                f"{ledger.accounting!r} at the user's request; the loader's own sampling gives "
                f"epsilon {honest_eps:.6g}"
            )
        return PrivacyReport(
            epsilon=self.epsilon(delta),
            delta=delta,
            accountant=ledger.name,
            accounting=ledger.accounting,
            sampling=self.loader.sampling,  # type: ignore[union-attr]
            steps=self.steps,
            epochs=self.loader.epoch,  # type: ignore[union-attr]
            honest_epsilon=honest_eps,
            honest_accountant=honest_name,
            note=note,
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
        """Accountant ledger(s), sampler state, noise stream position and release count.
        Save the model's and optimizer's own state_dicts beside it."""
        ledger = self._ledger()
        assert self.optimizer is not None and self.loader is not None
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
            "lot_pending": self.optimizer._lot_pending,
            "budget": None if self.budget is None else [self.budget.epsilon, self.budget.delta],
            "allowance": None
            if self._allowance is None
            else [event_to_dict(self._allowance[0]), self._allowance[1], self._allowance[2]],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into an engine set up by the same ``make_private`` call;
        the resumed run then reports exactly the uninterrupted run's epsilon and continues the
        noise stream and the sampler where they stopped."""
        ledger = self._ledger()
        assert self.optimizer is not None and self.loader is not None
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"unsupported engine state format {state.get('format')!r}")
        if (state["honest"] is None) != (self._honest is None):
            raise ValueError("the checkpoint and this engine differ in accounting override")
        budget = None if self.budget is None else [self.budget.epsilon, self.budget.delta]
        if state["budget"] != budget:
            raise ValueError(f"checkpoint budget {state['budget']!r} differs from this engine's {budget!r}")
        ledger.load_state_dict(state["main"])
        if self._honest is not None:
            self._honest.load_state_dict(state["honest"])
        self.loader.load_state_dict(state["loader"])
        self.optimizer.noise.load_state_dict(state["noise"])
        self.optimizer._releases = require_count("releases", state["releases"])
        self.optimizer.noise_multiplier = state["noise_multiplier"]
        self.optimizer._lot_pending = bool(state["lot_pending"])
        allowance = state["allowance"]
        self._allowance = (
            None
            if allowance is None
            else (event_from_dict(allowance[0]), int(allowance[1]), int(allowance[2]))
        )


