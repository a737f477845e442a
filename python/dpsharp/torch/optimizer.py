"""DP optimizers: clip per example, add Gaussian noise once per logical batch, then step.

:class:`DPOptimizer` wraps any :class:`torch.optim.Optimizer`. Between two releases any number
of ``loss.backward()`` calls (virtual batches / micro-batches of one *lot*, Abadi et al. 2016,
section 3.1 "Lots") add their clipped per-example gradients to the clipper's accumulators;
``step()`` then releases, for every trainable parameter,

    p.grad = (sum_i clip_C(g_i) + N(0, (sigma C)^2 I)) / B,

with B the *expected* (public) batch size -- never the realised one, which would leak the batch
size under Poisson sampling -- and hands p.grad to the wrapped optimizer. The wrapped optimizer
only ever sees privatised gradients, so its state (momentum, Adam moments, AdaGrad sums) is
post-processing and costs no privacy (Bu et al. 2020, section 3.1).

Clipping and noise are done by :class:`dpsharp.torch.PerSampleClipper` and
:class:`dpsharp.torch.NoiseGenerator`; this module only sequences them.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from dpsharp._validation import require_positive_finite, require_real

if TYPE_CHECKING:
    from dpsharp.torch.data import DPDataLoader

__all__ = ["BudgetExhausted", "DPOptimizer", "NoisyAdaGrad", "NoisyAdam", "NoisySGD"]

#: The attribute a DPOptimizer sets on its clipper (a weak reference to itself): a clipper
#: releases through one optimizer only.
_CLIPPER_OWNER = "_dpsharp_optimizer"


@contextlib.contextmanager
def _owner_release(clipper: Any) -> Iterator[None]:
    """Let the owning optimizer's release through the clipper's refusal of releases called on
    it directly (``PerSampleClipper._require_owner_release``)."""
    if not hasattr(clipper, "_owner_releasing"):
        yield
        return
    clipper._owner_releasing = True
    try:
        yield
    finally:
        clipper._owner_releasing = False


class BudgetExhausted(RuntimeError):
    """Releasing the next noisy gradient would exceed the privacy budget; nothing was released."""


def _require_noise_multiplier(value: object) -> float:
    sigma = require_real("noise_multiplier", value)
    if sigma < 0.0:
        raise ValueError(f"noise_multiplier must be in [0, inf), got {sigma!r}")
    return sigma


def _require_max_grad_norm(value: object) -> float | list[float]:
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("max_grad_norm must be a positive number or a non-empty sequence")
        return [require_positive_finite(f"max_grad_norm[{i}]", v) for i, v in enumerate(value)]
    return require_positive_finite("max_grad_norm", value)


_NO_COPY = (
    "a DPOptimizer cannot be copied: the copy would draw the same noise stream and release "
    "outside the ledger of the engine that accounts this one. Checkpoint with state_dict() and "
    "load it into the optimizer of a new make_private"
)


class DPOptimizer(torch.optim.Optimizer):
    """A differentially private wrapper of ``optimizer``.

    Parameters
    ----------
    optimizer:
        Any torch optimizer over (a subset of) the clipper's trainable parameters. Its
        ``param_groups``, ``state`` and ``state_dict`` are used as they are, so learning-rate
        schedulers keep working on the wrapper.
    noise_multiplier:
        sigma >= 0: the noise std divided by the clipping bound C (0 disables noise and gives
        no privacy).
    max_grad_norm:
        C > 0, or one bound per parameter tensor with ``clipping="per_layer"``. With adaptive
        clipping, the initial bound.
    clipping:
        How each example's gradient is scaled (:mod:`dpsharp.torch.clipping`): ``"flat"``
        (min(1, C / ||g_i||) over all parameters; Abadi et al. 2016), ``"per_layer"`` (the
        same per parameter tensor), ``"automatic"`` (C / (||g_i|| + ``stability``); Bu, Wang,
        Zha, Karypis 2023), ``"adaptive"`` (flat clipping at a bound that tracks a quantile of
        the norms; Andrew et al. 2021), or a :class:`~dpsharp.torch.clipping.ClipRule`
        (e.g. ``AdaptiveQuantileClipping(target_quantile=0.7)``). With adaptive clipping
        ``noise_multiplier`` is the *total* per-step noise multiplier, the one the accountant
        is charged (the gradient and the count of unclipped examples together, as one
        Gaussian mechanism): the gradient gets :attr:`gradient_noise_multiplier`.
    stability:
        gamma >= 0 of ``clipping="automatic"`` (default 0.01).
    expected_batch_size:
        The public normaliser B of the noisy sum (q * n under Poisson sampling).
    module, clipper:
        Exactly one: the model (a :class:`~dpsharp.torch.PerSampleClipper` is built for it with
        ``max_grad_norm``, ``clipping`` and ``loss_reduction``) or a ready clipper.
    noise, seed, secure:
        The :class:`~dpsharp.torch.NoiseGenerator` (built from ``seed`` / ``secure`` if None).
    distributed, process_group:
        Distributed data parallel (:mod:`dpsharp.torch.distributed`): every rank of
        ``process_group`` (default group if None) releases its clipped sum plus a noise share
        N(0, (sigma C)^2 / W) from its own stream (the generator's rank word), and the results
        are all-reduced; ``expected_batch_size`` is then the global one.

    Notes
    -----
    ``step()`` raises if no gradient was accumulated since the last release (calling it twice),
    except on an empty Poisson batch drawn from an attached loader, which releases pure noise.

    A release runs, in order: the budget checks (:meth:`add_budget_check`; a refusal releases
    nothing), the charge hooks (:meth:`add_charge_hook`: an attached engine composes the
    release's event into its accountant *before* anything is written, so an accounting error
    releases nothing), the noisy release into ``p.grad``, the release hooks
    (:meth:`add_release_hook`) and the wrapped optimizer's step.

    :attr:`noise_chosen_online` records whether sigma was changed after the first release
    other than by a schedule committed before it (:mod:`dpsharp.torch.schedules`): such a
    sigma may depend on earlier outputs, which an engine's budget must know (adaptively chosen
    privacy parameters need a privacy filter; see :class:`dpsharp.torch.PrivacyEngine`).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        noise_multiplier: float,
        max_grad_norm: float | Sequence[float],
        expected_batch_size: float,
        module: torch.nn.Module | None = None,
        clipper: Any = None,
        clipping: Any = "flat",
        loss_reduction: str = "mean",
        noise: Any = None,
        seed: int | None = None,
        secure: bool = False,
        distributed: bool = False,
        process_group: Any = None,
        stability: float = 0.01,
        public_buffers: Sequence[str] = (),
    ) -> None:
        if isinstance(optimizer, DPOptimizer):
            raise TypeError("optimizer is already a DPOptimizer")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        self._noise_multiplier = _require_noise_multiplier(noise_multiplier)
        self._max_grad_norm = _require_max_grad_norm(max_grad_norm)
        self._expected_batch_size = require_positive_finite("expected_batch_size", expected_batch_size)
        if (module is None) == (clipper is None):
            raise ValueError("give exactly one of module (a clipper is built for it) and clipper")
        from dpsharp.torch.clipping import AdaptiveQuantileClipping, resolve_clipping

        structure, rule = resolve_clipping(clipping, stability=stability)
        if clipper is None:
            from dpsharp.torch.clipper import PerSampleClipper

            clipper = PerSampleClipper(
                module, max_grad_norm=self._max_grad_norm, clipping=structure,
                loss_reduction=loss_reduction, rule=rule, public_buffers=public_buffers,
            )
        else:
            if public_buffers:
                raise ValueError("public_buffers is for the clipper built from module; give it "
                                 "to PerSampleClipper(..., public_buffers=...) instead")
            given_rule = getattr(clipper, "rule", None)
            if rule is not None and given_rule is not rule:
                raise ValueError(
                    f"clipping={clipping!r} asks for a clip rule the given clipper does not use; "
                    "build the clipper with that rule (PerSampleClipper(..., rule=...))"
                )
            rule = given_rule
            bound = getattr(clipper, "max_grad_norm", None)
            if bound is not None and bound != self._max_grad_norm:
                raise ValueError(
                    f"max_grad_norm={self._max_grad_norm!r} differs from the clipper's bound "
                    f"{bound!r}; the noise must be calibrated to the bound actually used"
                )
        owner = getattr(clipper, _CLIPPER_OWNER, None)
        if owner is not None and owner() is not None:
            raise ValueError(
                "clipper already belongs to another DPOptimizer: its clipped sums would be "
                "released twice, and a release by this optimizer would not be charged where the "
                "other one's are (e.g. its engine's ledger). Build a clipper for each optimizer"
            )
        self.clipper = clipper
        try:
            setattr(clipper, _CLIPPER_OWNER, weakref.ref(self))
        except AttributeError:  # a clipper object that takes no attributes: nothing to mark
            pass
        self.clip_rule = rule
        self._adaptive_clipping = isinstance(rule, AdaptiveQuantileClipping)
        if self._adaptive_clipping:
            if isinstance(self._max_grad_norm, list):
                raise ValueError("adaptive clipping needs one max_grad_norm (flat clipping)")
            if distributed:
                raise ValueError("adaptive clipping is not supported with distributed=True")
            rule.bind(self._max_grad_norm, self._expected_batch_size)
            rule.gradient_noise_multiplier(self._noise_multiplier)  # 2 sigma_b > sigma?
        handled = {id(p) for p in clipper.parameters}
        self._handled_ids = handled
        # Frozen parameters (requires_grad=False: a frozen base under LoRA adapters) may stay
        # in the optimizer, as optimizer(model.parameters()) puts them there: they get no
        # gradient, so the optimizer skips them; every release checks that this still holds.
        self._frozen_params: list[torch.Tensor] = []
        for group_index, group in enumerate(optimizer.param_groups):
            for param in group["params"]:
                if id(param) not in handled and not param.requires_grad:
                    self._frozen_params.append(param)
                elif id(param) not in handled:
                    raise ValueError(
                        f"optimizer.param_groups[{group_index}] holds a parameter of shape "
                        f"{tuple(param.shape)} that is not a trainable parameter of the private "
                        "model; its gradient would not be clipped or noised. Build the optimizer "
                        "from model.parameters()"
                    )
        if noise is None:
            from dpsharp.torch.noise import NoiseGenerator

            rank = 0
            if distributed:
                from dpsharp.torch.distributed import group_rank_and_size

                rank = group_rank_and_size(process_group)[0]
            noise = NoiseGenerator(seed, secure=secure, rank=rank)
        elif seed is not None or secure:
            raise ValueError("give seed / secure or a ready noise generator, not both")
        self.noise = noise
        try:
            noise._owner = weakref.ref(self)
        except AttributeError:  # a generator object that takes no attributes
            pass
        # Distributed data parallel: each rank releases its clipped sum plus an independent
        # noise share and the results are all-reduced (dpsharp.torch.distributed).
        self.distributed = bool(distributed)
        self.process_group = process_group
        self.original_optimizer = optimizer
        self._releases = 0
        self._released_here = 0  # releases made in this process (never restored)
        self._noise_chosen_online = False  # a release was made with a sigma chosen online
        # Set by a change of sigma after a release other than by a schedule; the next release
        # is online if its sigma differs from the last one released (None: not known here).
        self._online_change = False
        self._released_sigma: float | None = None
        self._budget_checks: list[Callable[[DPOptimizer], str | None]] = []
        self._charge_hooks: list[Callable[[DPOptimizer], None]] = []
        self._release_hooks: list[Callable[[DPOptimizer], None]] = []
        self._loader: DPDataLoader | None = None
        self._lot_pending = False
        self._last_draw: int | None = None  # the attached loader's draw count at its last batch
        # torch.optim.Optimizer plumbing that Optimizer.__init__ would have set up.
        self._optimizer_step_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()

    # ----------------------------------------------------------------- delegation
    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.original_optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        handled = {id(p) for p in self.clipper.parameters}
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        if any(id(p) not in handled for p in params):
            raise ValueError("param_group holds parameters the private model's clipper does not handle")
        self.original_optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad``. Accumulated clipped gradients of the current lot are kept: they are
        released (and reset) only by :meth:`step`."""
        self.original_optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return (
            f"DPOptimizer({type(self.original_optimizer).__name__}, noise_multiplier="
            f"{self._noise_multiplier}, max_grad_norm={self.max_grad_norm}, "
            f"expected_batch_size={self._expected_batch_size})"
        )

    # ----------------------------------------------------------------- DP settings
    @property
    def noise_multiplier(self) -> float:
        return self._noise_multiplier

    @noise_multiplier.setter
    def noise_multiplier(self, value: float) -> None:
        """Change sigma; an attached engine accounts the new value. A change after the first
        release that the next release uses sets :attr:`noise_chosen_online` (the new sigma may
        depend on earlier outputs; one set back to the last released value before then does
        not); sigmas fixed in advance belong in a schedule attached before the first release
        (:func:`dpsharp.torch.schedules.attach_schedule`)."""
        self._set_noise_multiplier(value, online=True)

    def _set_noise_multiplier(self, value: float, *, online: bool) -> None:
        """Set sigma; ``online`` says the value may have been chosen from earlier outputs."""
        sigma = _require_noise_multiplier(value)
        if online and self._releases > 0 and sigma != self._noise_multiplier:
            self._online_change = True
        self._noise_multiplier = sigma

    @property
    def max_grad_norm(self) -> float | list[float]:
        """C: the clipping bound of the next release (one per parameter tensor with per-layer
        clipping), as the clipper holds it.

        Assigning a number changes the flat bound from the next release on, through the
        clipper (:meth:`~dpsharp.torch.PerSampleClipper.set_max_grad_norm`), so that the
        clipping factors min(1, C / ||g_i||) and the noise std sigma C move together. A
        release's privacy depends on sigma = noise std / C alone (the clipped sum has
        sensitivity C and noise std sigma C), so a C chosen from earlier outputs costs nothing
        more (Andrew et al. 2021 move C from released counts): unlike a change of
        :attr:`noise_multiplier`, it is not an adaptive choice of privacy parameters and needs
        no privacy filter. Refused mid-lot (between ``backward`` and ``step``: the lot was
        clipped at the old bound), with per-layer bounds (fixed at construction), and with
        adaptive clipping, whose rule moves the bound itself. With ``distributed=True`` set it
        on every rank: a release refuses ranks whose bounds differ
        (:mod:`dpsharp.torch.distributed`)."""
        bound = getattr(self.clipper, "max_grad_norm", None)
        return self._max_grad_norm if bound is None else bound

    @max_grad_norm.setter
    def max_grad_norm(self, value: float) -> None:
        if self._adaptive_clipping:
            raise RuntimeError(
                "max_grad_norm is moved by the adaptive clipping rule after every release; "
                "give the starting bound to make_private (max_grad_norm=...) or limit it with "
                "AdaptiveQuantileClipping(min_bound=..., max_bound=...)"
            )
        if isinstance(self._max_grad_norm, list) or isinstance(value, (list, tuple)):
            raise ValueError(
                "max_grad_norm can be changed only for flat clipping (one bound C); per-layer "
                "bounds are fixed at construction: build a new optimizer (make_private) with "
                "the new bounds"
            )
        bound = require_positive_finite("max_grad_norm", value)
        setter = getattr(self.clipper, "set_max_grad_norm", None)
        if setter is None:
            raise TypeError(
                f"the clipper ({type(self.clipper).__name__}) has no set_max_grad_norm, so its "
                "bound cannot be changed; build a new optimizer with the new max_grad_norm"
            )
        setter(bound)  # refuses mid-lot: the bound of a release is the one it clipped with
        self._max_grad_norm = bound

    @property
    def noise_chosen_online(self) -> bool:
        """True once a release is (or the next would be) made with a sigma changed after the
        first release other than by a schedule committed before it (sticky from that release
        on). A sigma changed and set back before the next release leaves the released sigmas
        as fixed in advance: not online."""
        return self._noise_chosen_online or (
            self._online_change and self._noise_multiplier != self._released_sigma)

    @property
    def expected_batch_size(self) -> float:
        return self._expected_batch_size

    @property
    def gradient_noise_multiplier(self) -> float:
        """The noise multiplier the clipped gradient sum is released with: ``noise_multiplier``,
        or with adaptive clipping the larger z_grad = (z^-2 - (2 sigma_b)^-2)^(-1/2) that
        leaves room for the count's release (:mod:`dpsharp.torch.clipping`)."""
        if self._adaptive_clipping:
            return float(self.clip_rule.gradient_noise_multiplier(self._noise_multiplier))
        return self._noise_multiplier

    @property
    def releases(self) -> int:
        """Noisy gradients released so far (= optimizer steps taken)."""
        return self._releases

    # ----------------------------------------------------------------- engine wiring
    @property
    def loader(self) -> DPDataLoader | None:
        """The loader whose logical batches the releases are tied to (:meth:`attach_loader`)."""
        return self._loader

    @property
    def accounted(self) -> bool:
        """Whether an engine accounts the releases (it has added a budget check or a charge
        hook): the attached loader is then fixed (:meth:`attach_loader`)."""
        return bool(self._budget_checks or self._charge_hooks)

    def attach_loader(self, loader: DPDataLoader) -> None:
        """Tie releases to ``loader``'s logical batches: one release per logical batch, chunks
        of a batch accumulate, an empty batch releases pure noise, and a batch drawn before the
        previous one was released is an error (it would change the sampling mechanism).

        Attaching the loader already attached changes nothing. Once an engine accounts the
        releases (:attr:`accounted`: ``PrivacyEngine.make_private`` attaches its loader and
        then its hooks) another loader is refused: the engine charges every release as a
        draw of *its* loader (its sampling rate, batch size and epoch counter), so batches
        drawn from another one would be released unaccounted. Iterate the loader make_private
        returned for every epoch (each pass over it is a new epoch, drawn and charged afresh),
        or call make_private with the new loader for a new, separately accounted run."""
        if loader is self._loader:
            return
        if self.accounted:
            raise RuntimeError(
                f"attach_loader refused: an engine accounts this optimizer's releases as draws "
                f"of the loader it was made private with ({self._loader!r}); batches of another "
                "loader would be released under that loader's accounting. Iterate the loader "
                "make_private returned for every epoch (each pass is a new epoch, drawn afresh "
                "and accounted), or call make_private with the new loader for a new, separately "
                "accounted run"
            )
        if self._loader is not None:
            self._loader.remove_listener(self._on_logical_batch)
        self._loader = loader
        self._lot_pending = False
        self._last_draw = None
        loader.add_listener(self._on_logical_batch)

    def add_budget_check(self, check: Callable[[DPOptimizer], str | None]) -> None:
        """``check(self)`` runs before each release; a string return refuses the release."""
        self._budget_checks.append(check)

    def add_charge_hook(self, hook: Callable[[DPOptimizer], None]) -> None:
        """``hook(self)`` runs after the budget checks passed and before the release writes
        anything; if it raises, nothing is released (the lot stays pending). If the hook is a
        method of an object with a ``loader`` attribute (an engine), every release first
        checks that this is the attached loader (:meth:`attach_loader`)."""
        self._charge_hooks.append(hook)

    def add_release_hook(self, hook: Callable[[DPOptimizer], None]) -> None:
        """``hook(self)`` runs right after each noisy gradient is released."""
        self._release_hooks.append(hook)

    def _on_logical_batch(self, loader: DPDataLoader, batch_size: int) -> None:
        drawn = loader.logical_batches_drawn
        if self._last_draw is not None and drawn <= self._last_draw:
            raise RuntimeError(
                f"the loader's draw count went back from {self._last_draw} to {drawn}: its "
                "sampler was rewound, so this batch repeats one already released. Every "
                "release must be a fresh draw; keep iterating the loader without restoring "
                "its state"
            )
        self._last_draw = drawn
        if self._lot_pending:
            raise RuntimeError(
                "a new logical batch was drawn before optimizer.step() released the previous "
                "one. Every drawn batch must be released exactly once: accumulating several "
                "sampled batches into one step changes the sampling mechanism, and skipping "
                "batches (e.g. empty ones) makes the number of releases data-dependent. For "
                "virtual batches use the loader's max_physical_batch_size"
            )
        self._lot_pending = True

    # ----------------------------------------------------------------- stepping
    def _ready(self) -> bool:
        accumulated = int(self.clipper.accumulated_batches)
        if self._loader is not None:
            if not self._loader.logical_batch_complete:
                return False  # more chunks of this logical batch follow: keep accumulating
            if not self._lot_pending:
                raise RuntimeError(
                    "optimizer.step() called twice for one batch: draw a new batch from the "
                    "data loader and call loss.backward() before stepping again"
                )
            if accumulated == 0 and self._loader.last_batch_size > 0:
                raise RuntimeError(
                    "optimizer.step() called without new gradients: call loss.backward() on "
                    "the batch first"
                )
            # The clipper may verify that the examples it clipped are the loader's logical
            # batch (e.g. a model that sees the batch in another dimension); no-op otherwise.
            check_batch = getattr(self.clipper, "check_logical_batch", None)
            if check_batch is not None:
                check_batch(int(self._loader.last_batch_size))
            return True
        if accumulated == 0:
            raise RuntimeError(
                "optimizer.step() called without new gradients (twice in a row, or before "
                "loss.backward()); nothing to release"
            )
        return True

    def _require_accounted_loader(self) -> None:
        """The accounting hooks' owner (an engine) must account the attached loader: an owner
        whose ``loader`` is another one (e.g. ``engine.loader`` replaced after make_private)
        would charge that loader's sampling for batches drawn from this one."""
        for hook in (*self._budget_checks, *self._charge_hooks):
            owner = getattr(hook, "__self__", None)
            accounted = getattr(owner, "loader", None) if owner is not None else None
            if accounted is not None and accounted is not self._loader:
                raise RuntimeError(
                    f"the engine accounting this optimizer's releases accounts {accounted!r}, "
                    f"but the batches are drawn from {self._loader!r} (was engine.loader "
                    "replaced?); nothing was released. Keep the loader make_private returned "
                    "(engine.loader), or call make_private with the new loader for a new, "
                    "separately accounted run"
                )

    def _refusal(self) -> str | None:
        self._require_accounted_loader()
        for check in self._budget_checks:
            reason = check(self)
            if reason is not None:
                return reason
        return None

    def _release_and_step(self) -> None:
        self._require_only_clipped_parameters()
        check_releasable = getattr(self.clipper, "check_releasable", None)
        if check_releasable is not None:
            check_releasable()  # before anything is charged
        # Validated before the charge: a sigma the count's noise leaves no room for is refused
        # before anything is charged or released.
        gradient_sigma = self.gradient_noise_multiplier
        for charge in self._charge_hooks:
            charge(self)  # may raise: then nothing has been released
        examples = int(getattr(self.clipper, "accumulated_examples", 0))
        with _owner_release(self.clipper):
            if self.distributed:
                from dpsharp.torch.distributed import distributed_release

                distributed_release(
                    self.clipper,
                    noise_multiplier=gradient_sigma,
                    expected_batch_size=self._expected_batch_size,
                    noise=self.noise,
                    group=self.process_group,
                    loader=self._loader,
                )
            else:
                self.clipper.release(
                    noise_multiplier=gradient_sigma,
                    expected_batch_size=self._expected_batch_size,
                    noise=self.noise,
                )
        # The noisy gradient is in p.grad now: the release counts as done even if what follows
        # raises, so that a retry of the same lot is a new release, charged again.
        try:
            if self._adaptive_clipping:
                # The count of unclipped examples of this lot, noised, moves the bound for the
                # next lot (Andrew et al. 2021, Algorithm 1); charged with the gradient above.
                bound = self.clip_rule.release(noise=self.noise,
                                               expected_batch_size=self._expected_batch_size,
                                               realised_batch_size=examples)
                self.clipper.set_max_grad_norm(bound)
                self._max_grad_norm = bound
        finally:
            self._noise_chosen_online = self.noise_chosen_online
            self._online_change = False
            self._released_sigma = self._noise_multiplier
            self._releases += 1
            self._released_here += 1
            self._lot_pending = False
            for hook in self._release_hooks:
                hook(self)
        self.original_optimizer.step()

    def _require_only_clipped_parameters(self) -> None:
        """Refuse a release while the wrapped optimizer would step a parameter the clipper
        does not handle with its own gradient: one frozen at make_private and unfrozen since,
        or one added to ``original_optimizer`` afterwards (``add_param_group`` of this
        optimizer refuses those; the wrapped optimizer's own does not). Its raw gradient would
        go out unclipped and without noise."""
        handled = self._handled_ids
        for group_index, group in enumerate(self.original_optimizer.param_groups):
            for param in group["params"]:
                if id(param) in handled or not (param.requires_grad or param.grad is not None):
                    continue
                frozen = any(param is p for p in self._frozen_params)
                raise RuntimeError(
                    f"optimizer.param_groups[{group_index}] holds a parameter of shape "
                    f"{tuple(param.shape)} that "
                    + ("was frozen when the model was made private and now has "
                       "requires_grad=True or a gradient" if frozen else
                       "the private model's clipper does not handle (added to the wrapped "
                       "optimizer after make_private)")
                    + "; its gradient would be stepped without clipping or noise, so nothing "
                    "was released. Unfreeze parameters before make_private, and keep every "
                    "trained parameter in the private model"
                )

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Release one noisy gradient and take one step of the wrapped optimizer.

        ``closure`` (if given) is evaluated once with gradients enabled before the release.
        Raises :class:`BudgetExhausted` (releasing nothing) if an attached budget forbids the
        release. Returns the closure's loss (or None).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._ready():
            return loss
        reason = self._refusal()
        if reason is not None:
            raise BudgetExhausted(reason)
        self._release_and_step()
        return loss

    def step_if_within_budget(self) -> bool:
        """Like :meth:`step`, but return False (releasing nothing) instead of raising
        :class:`BudgetExhausted`; True when the step was taken (or, mid-lot, deferred)."""
        if not self._ready():
            return True
        if self._refusal() is not None:
            return False
        self._release_and_step()
        return True

    # ----------------------------------------------------------------- checkpoints
    def __copy__(self) -> DPOptimizer:
        raise TypeError(_NO_COPY)

    def __deepcopy__(self, memo: dict[int, Any]) -> DPOptimizer:
        raise TypeError(_NO_COPY)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state_dict plus a ``"dpsharp"`` entry (noise stream
        position, release count, sigma, B)."""
        state = self.original_optimizer.state_dict()
        state["dpsharp"] = {
            "noise": self.noise.state_dict(),
            "releases": self._releases,
            "noise_multiplier": self._noise_multiplier,
            "noise_chosen_online": self.noise_chosen_online,
            "expected_batch_size": self._expected_batch_size,
        }
        if self.clip_rule is not None:
            state["dpsharp"]["clipping"] = self.clip_rule.state_dict()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`. With an attached engine, restore the engine's own
        ``state_dict`` from the same checkpoint too: the engine refuses to release or report
        when the optimizer's release count and its accounting disagree.

        Under an engine (:attr:`accounted`) an optimizer that has released in this process
        refuses a checkpoint: it would rewind the noise stream (the next releases would reuse
        noise already released) and the release count, as the engine's own ``load_state_dict``
        refuses to rewind its ledger. To take a checkpoint's weights in the same run, load the
        wrapped torch optimizer's state (``original_optimizer.load_state_dict``)."""
        state = dict(state_dict)
        private = state.pop("dpsharp", None)
        if private is not None and self.accounted and self._released_here:
            raise RuntimeError(
                f"load_state_dict refused: this optimizer has released {self._released_here} "
                "noisy gradients in this process under an engine, and the checkpoint would "
                "rewind its noise stream and release count. A checkpoint is loaded into a fresh "
                "optimizer (a new make_private) when resuming in a new process; in the same run "
                "restore only the wrapped torch optimizer's state "
                "(optimizer.original_optimizer.load_state_dict)"
            )
        self.original_optimizer.load_state_dict(state)
        if private is not None:
            self.noise.load_state_dict(private["noise"])
            self._releases = int(private["releases"])
            self._noise_multiplier = _require_noise_multiplier(private["noise_multiplier"])
            self._noise_chosen_online = bool(private.get("noise_chosen_online", False))
            self._expected_batch_size = require_positive_finite(
                "expected_batch_size", private["expected_batch_size"]
            )
            clipping_state = private.get("clipping")
            if clipping_state is not None and self.clip_rule is not None:
                self._load_clipping_state(clipping_state)

    def _load_clipping_state(self, state: Mapping[str, Any]) -> None:
        """Restore the clip rule's state (an adaptive rule's bound C_t moves the clipper's
        bound and :attr:`max_grad_norm` with it)."""
        self.clip_rule.load_state_dict(dict(state))
        if self._adaptive_clipping:
            self.clipper.set_max_grad_norm(self.clip_rule.bound)
            self._max_grad_norm = self.clip_rule.bound


class _Algorithm2Adam(torch.optim.Optimizer):
    """Adam exactly as Algorithm 2 of Bu et al. 2020 writes it (no bias correction):
    m_t = b1 m_{t-1} + (1 - b1) g, u_t = b2 u_{t-1} + (1 - b2) g*g,
    theta -= lr * m_t / (sqrt(u_t) + xi), with m_0 = u_0 = 0."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["m"] = torch.zeros_like(param)
                    state["u"] = torch.zeros_like(param)
                m, u, grad = state["m"], state["u"], param.grad
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                u.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                param.addcdiv_(m, u.sqrt().add_(group["eps"]), value=-group["lr"])
        return loss


def _build(
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    module: torch.nn.Module,
    *,
    noise_multiplier: float,
    max_grad_norm: float | Sequence[float],
    expected_batch_size: float,
    clipping: Any,
    loss_reduction: str,
    noise: Any,
    seed: int | None,
    secure: bool,
    stability: float = 0.01,
) -> DPOptimizer:
    from dpsharp.torch.clipper import PerSampleClipper
    from dpsharp.torch.clipping import resolve_clipping

    norm = _require_max_grad_norm(max_grad_norm)
    _require_noise_multiplier(noise_multiplier)
    require_positive_finite("expected_batch_size", expected_batch_size)
    structure, rule = resolve_clipping(clipping, stability=stability)
    clipper = PerSampleClipper(
        module, max_grad_norm=norm, clipping=structure, loss_reduction=loss_reduction,
        rule=rule,
    )
    return DPOptimizer(
        make_optimizer(list(clipper.parameters)),
        noise_multiplier=noise_multiplier,
        max_grad_norm=norm,
        expected_batch_size=expected_batch_size,
        clipper=clipper,
        noise=noise,
        seed=seed,
        secure=secure,
    )


def NoisySGD(  # noqa: N802 - named after the algorithm
    module: torch.nn.Module,
    *,
    lr: float,
    noise_multiplier: float,
    max_grad_norm: float | Sequence[float],
    expected_batch_size: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    clipping: Any = "flat",
    loss_reduction: str = "mean",
    noise: Any = None,
    seed: int | None = None,
    secure: bool = False,
    stability: float = 0.01,
) -> DPOptimizer:
    """NoisySGD (Bu et al. 2020, Algorithm 1; Abadi et al. 2016, Algorithm 1):

        theta_{t+1} = theta_t - lr * (sum_{i in I_t} clip_R(g_i) + sigma R N(0, I)) / B,

    with B = ``expected_batch_size`` = p n, the public normaliser (Algorithm 1 writes |I_t|;
    dividing by the realised size would make the normaliser data-dependent under Poisson
    sampling, so, as the paper's B = pn, we use the expected size). ``momentum`` and
    ``weight_decay`` are plain :class:`torch.optim.SGD` options (post-processing)."""
    lr = require_positive_finite("lr", lr)
    return _build(
        lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay),
        module,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        clipping=clipping,
        loss_reduction=loss_reduction,
        noise=noise,
        seed=seed,
        secure=secure,
        stability=stability,
    )


def NoisyAdam(  # noqa: N802
    module: torch.nn.Module,
    *,
    lr: float,
    noise_multiplier: float,
    max_grad_norm: float | Sequence[float],
    expected_batch_size: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    bias_correction: bool = True,
    clipping: Any = "flat",
    loss_reduction: str = "mean",
    noise: Any = None,
    seed: int | None = None,
    secure: bool = False,
    stability: float = 0.01,
) -> DPOptimizer:
    """NoisyAdam (Bu et al. 2020, Algorithm 2): the moments are computed only from the
    privatised gradient v~_t = (sum clip_R(g_i) + sigma R N(0, I)) / B:

        m_t = b1 m_{t-1} + (1 - b1) v~_t,  u_t = b2 u_{t-1} + (1 - b2) v~_t * v~_t,
        theta_{t+1} = theta_t - lr * m_t / (sqrt(u_t) + xi).

    ``bias_correction=False`` runs exactly these lines (xi = ``eps``); the default True runs
    :class:`torch.optim.Adam` (the bias-corrected Adam of TensorFlow Privacy, which the paper
    cites) on the same privatised gradients. Both are post-processing: same privacy."""
    lr = require_positive_finite("lr", lr)
    beta1, beta2 = (require_real("betas[0]", betas[0]), require_real("betas[1]", betas[1]))
    for name, beta in (("betas[0]", beta1), ("betas[1]", beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {beta!r}")
    xi = require_positive_finite("eps", eps)
    if bias_correction:
        make = lambda params: torch.optim.Adam(params, lr=lr, betas=(beta1, beta2), eps=xi)  # noqa: E731
    else:
        make = lambda params: _Algorithm2Adam(params, lr=lr, betas=(beta1, beta2), eps=xi)  # noqa: E731
    return _build(
        make,
        module,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        clipping=clipping,
        loss_reduction=loss_reduction,
        noise=noise,
        seed=seed,
        secure=secure,
        stability=stability,
    )


def NoisyAdaGrad(  # noqa: N802
    module: torch.nn.Module,
    *,
    lr: float,
    noise_multiplier: float,
    max_grad_norm: float | Sequence[float],
    expected_batch_size: float,
    eps: float = 1e-10,
    clipping: Any = "flat",
    loss_reduction: str = "mean",
    noise: Any = None,
    seed: int | None = None,
    secure: bool = False,
    stability: float = 0.01,
) -> DPOptimizer:
    """NoisyAdaGrad: :class:`torch.optim.Adagrad` on the privatised gradient
    v~_t = (sum clip_R(g_i) + sigma R N(0, I)) / B, i.e. G_t = G_{t-1} + v~_t * v~_t,
    theta -= lr v~_t / (sqrt(G_t) + eps). The accumulated squares are post-processing of the
    noisy gradients, so the privacy is NoisySGD's (Bu et al. 2020, section 3.1)."""
    lr = require_positive_finite("lr", lr)
    xi = require_positive_finite("eps", eps)
    return _build(
        lambda params: torch.optim.Adagrad(params, lr=lr, eps=xi),
        module,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        clipping=clipping,
        loss_reduction=loss_reduction,
        noise=noise,
        seed=seed,
        secure=secure,
        stability=stability,
    )

