"""Renyi-DP accountants: :class:`RDPAccountant` (any orders, tight or classic conversion) and
:class:`MomentsAccountant` (exactly the moments accountant of Abadi et al. 2016).

The composed multiset of leaf events is turned into one RDP curve by adding, order by order,
count * (the leaf's curve) (Mironov 2017, Proposition 1: RDP composes additively, adaptively).
Each distinct leaf's curve is computed once, when it is first composed, and cached; a query
sums the cached curves in a canonical order (sorted by the event's repr), so the answer is a
function of the multiset alone and ``count``, ``Repeated``, ``Composed`` and a restored
``state_dict`` give bit-identical results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsharp import rdp as _rdp
from dpsharp.accountants.base import Accountant, PrivacyGuarantee
from dpsharp.accountants.registry import register
from dpsharp.events import (
    Event,
    Gaussian,
    Laplace,
    Neighbouring,
    PoissonSampled,
    SampledWithoutReplacement,
    SingleEpochTreeAggregation,
    ZCDP,
    flatten,
)
from dpsharp.accountants._pld_atoms import ATOM_EVENTS, event_rdp
from dpsharp.tuning_events import (
    TUNING_EVENT_TYPES,
    first_unsupported_leaf,
    rdp_of_leaf,
    unsupported_reason_of_leaf,
)

__all__ = ["MomentsAccountant", "RDPAccountant"]


def leaf_rdp(
    leaf: Event,
    orders: npt.NDArray[np.float64],
    neighbouring: Neighbouring = Neighbouring.REPLACE_ONE,
) -> npt.NDArray[np.float64]:
    """The RDP curve of one supported mechanism event at ``orders`` (``neighbouring``: the
    relation of the analysis, which randomized response's pair depends on)."""
    if isinstance(leaf, Gaussian):
        return _rdp.gaussian_rdp(leaf.noise_multiplier, orders)
    if isinstance(leaf, ATOM_EVENTS):  # exact, from the loss's atoms (_pld_atoms.atoms_rdp)
        return event_rdp(leaf, neighbouring, orders)
    if isinstance(leaf, SingleEpochTreeAggregation):  # alpha d / (2 sigma^2), events.py
        return _rdp.gaussian_rdp(leaf.equivalent_noise_multiplier, orders)
    if isinstance(leaf, Laplace):
        return _rdp.laplace_rdp(leaf.scale, orders)
    if isinstance(leaf, ZCDP):  # the curve of the definition (Bun and Steinke 2016, Def. 1.1)
        return leaf.xi + leaf.rho * np.asarray(orders, dtype=np.float64)
    if isinstance(leaf, PoissonSampled) and isinstance(leaf.event, Gaussian):
        return _rdp.poisson_gaussian_rdp(
            leaf.sampling_probability, leaf.event.noise_multiplier, orders
        )
    if isinstance(leaf, SampledWithoutReplacement) and isinstance(leaf.event, Gaussian):
        return _rdp.sampled_without_replacement_gaussian_rdp(
            leaf.sampling_rate, leaf.event.noise_multiplier, orders
        )
    raise TypeError(f"no RDP analysis for {leaf!r}")  # unreachable after validation


def monotone_envelope(
    orders: npt.NDArray[np.float64], curve: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """min over the orders beta >= alpha of ``curve`` at beta, at every order alpha: still an
    upper bound on the divergence, which is non-decreasing in the order (van Erven and
    Harremoes 2014, Theorem 3); dp-accounting applies it to the selection bounds of Papernot
    and Steinke 2022, whose log(E[K]) / (alpha - 1) term is loose at small orders."""
    order = np.argsort(orders, kind="stable")
    suffix = np.minimum.accumulate(np.asarray(curve, dtype=np.float64)[order][::-1])[::-1]
    out = np.empty_like(suffix)
    out[order] = suffix
    return out


def leaf_unsupported_reason(leaf: Event) -> str | None:
    if isinstance(leaf, (Gaussian, Laplace, ZCDP, SingleEpochTreeAggregation) + ATOM_EVENTS):
        return None
    if isinstance(leaf, (PoissonSampled, SampledWithoutReplacement)):
        if isinstance(leaf.event, Gaussian):
            return None
        return (
            f"the sampled sub-event {leaf.event!r} has no RDP analysis here; only a Gaussian "
            f"inside {type(leaf).__name__} is supported"
        )
    return (
        f"no RDP analysis for {type(leaf).__name__}; supported: Gaussian, Laplace, ZCDP, "
        "PoissonSampled(Gaussian), SampledWithoutReplacement(Gaussian)"
    )


@register("rdp")
class RDPAccountant(Accountant):
    """Renyi-DP accountant (Mironov 2017) over a grid of real orders.

    Parameters
    ----------
    orders
        Orders alpha in (1, 1e6]; default :data:`dpsharp.rdp.DEFAULT_ORDERS` (fractional and
        dense in (1, 20], geometric up to 10^4).
    conversion
        ``"tight"`` (Balle et al. 2020 / Canonne, Kamath, Steinke 2020) or ``"classic"``
        (eps = D_alpha + log(1/delta)/(alpha - 1)); see :func:`dpsharp.rdp.epsilon_from_rdp`.
    neighbouring
        The relation guarantees are stated under. Poisson sampling needs add/remove one
        (the default) or zero-out (same numbers); sampling without replacement needs replace
        one.

    Supported events: Gaussian, Laplace, PoissonSampled(Gaussian), SampledWithoutReplacement
    (Gaussian), and any Composed / Repeated of them; heterogeneous steps compose by summing.
    """

    certified = True

    def __init__(
        self,
        orders: Sequence[float] | npt.NDArray[np.floating] | None = None,
        conversion: str = "tight",
        *,
        neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    ) -> None:
        super().__init__(neighbouring=neighbouring)
        self._orders = _rdp.validate_orders(_rdp.DEFAULT_ORDERS if orders is None else orders)
        self._conversion = _rdp.validate_conversion(conversion)
        self._plan = _rdp.order_plan(self._orders)
        # A leaf's curve over the orders; PoissonSampled(Gaussian) curves are evaluated lazily
        # (fractional orders only where an answer needs them: dpsharp.rdp.search_orders).
        self._curves: dict[Event, npt.NDArray[np.float64] | _rdp.LazyPoissonGaussianCurve] = {}

    @property
    def orders(self) -> npt.NDArray[np.float64]:
        return self._orders.copy()

    @property
    def conversion(self) -> str:
        return self._conversion

    # ----------------------------------------------------------------- hooks
    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        if isinstance(leaf, TUNING_EVENT_TYPES):  # selection / tuning events (dpsharp.tuning_events)
            return unsupported_reason_of_leaf(leaf, "rdp", self._event_unsupported_reason)
        return leaf_unsupported_reason(leaf)

    def _on_compose(self, leaves: list[tuple[Event, int]]) -> None:
        for leaf, _ in leaves:
            if leaf not in self._curves:
                if isinstance(leaf, PoissonSampled) and isinstance(leaf.event, Gaussian):
                    self._curves[leaf] = _rdp.lazy_poisson_gaussian_curve(
                        leaf.sampling_probability, leaf.event.noise_multiplier, self._plan
                    )
                else:
                    self._curves[leaf] = self._leaf_curve(leaf)

    # -- selection / tuning events (dpsharp.tuning_events): a tuning leaf's curve is a function of the curves
    # of the events inside it (training runs), which this accountant computes itself.
    def _leaf_curve(self, leaf: Event) -> npt.NDArray[np.float64]:
        if isinstance(leaf, TUNING_EVENT_TYPES):
            curve = rdp_of_leaf(leaf, self._orders, self._event_curve)
            assert curve is not None
            return monotone_envelope(self._orders, curve)
        return leaf_rdp(leaf, self._orders, self._neighbouring)

    def _event_curve(self, event: Event) -> npt.NDArray[np.float64]:
        total = np.zeros_like(self._orders)
        for leaf, count in sorted(flatten(event), key=lambda item: repr(item[0])):
            total = total + count * self._leaf_curve(leaf)
        return total

    def _event_unsupported_reason(self, event: Event) -> str | None:
        return first_unsupported_leaf(event, self._leaf_unsupported_reason)

    def _reset_caches(self) -> None:
        self._curves = {}

    def _options(self) -> dict[str, Any]:
        return {"orders": [float(o) for o in self._orders], "conversion": self._conversion}

    # ----------------------------------------------------------------- answers
    def rdp(self) -> npt.NDArray[np.float64]:
        """The composed RDP curve: sum over leaves of count * curve, one value per order."""
        total = np.zeros_like(self._orders)
        for leaf in sorted(self._counts, key=repr):
            curve = self._curves[leaf]
            if isinstance(curve, _rdp.LazyPoissonGaussianCurve):
                curve = curve.grid()
            total = total + self._counts[leaf] * curve
        return total

    def _answer(self, target: float, *, want_delta: bool) -> tuple[float, float]:
        """(epsilon or delta, optimal order) from the orders the answer needs
        (dpsharp.rdp.search_orders: the others are proven no better, so the optimum over the
        needed orders is the grid's)."""
        leaves = sorted(self._counts, key=repr)
        terms = [(self._counts[leaf], self._curves[leaf]) for leaf in leaves]
        kind = 0 if self._conversion == "classic" else 1
        known, curve = _rdp.search_orders(self._plan, terms, target, kind, want_delta=want_delta)
        return _rdp.convert_found(self._orders[known], curve, target, kind, want_delta=want_delta)

    def _epsilon_and_order(self, delta: float) -> tuple[float, float]:
        return self._answer(delta, want_delta=False)

    def _epsilon(self, delta: float) -> float:
        return self._epsilon_and_order(delta)[0]

    def _delta(self, epsilon: float) -> float:
        return self._answer(epsilon, want_delta=True)[0]

    def guarantee(self, delta: float) -> PrivacyGuarantee:
        """epsilon(delta) with details {"order": the optimal order, "conversion": ...}."""
        base = super().guarantee(delta)
        if self.is_empty:
            return base
        _, order = self._epsilon_and_order(base.delta)
        return replace(base, details={"order": order, "conversion": self._conversion})


@register("moments")
class MomentsAccountant(RDPAccountant):
    """The moments accountant of Abadi et al. 2016 ("Deep learning with differential
    privacy", Section 3.2), exactly: integer lambda = 1..32, log moments
    alpha(lambda) = lambda * D_{lambda+1} (the RDP of order lambda + 1) summed over steps, and

        delta(eps) = min_lambda exp(alpha(lambda) - lambda * eps),
        eps(delta) = min_lambda (alpha(lambda) + log(1/delta)) / lambda

    (their Theorem 2), i.e. the classic conversion on orders 2..33. ``guarantee`` reports the
    optimal order (lambda + 1) and lambda.
    """

    LAMBDAS: tuple[int, ...] = tuple(range(1, 33))

    def __init__(self, *, neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE) -> None:
        super().__init__(
            orders=[float(lam + 1) for lam in self.LAMBDAS],
            conversion="classic",
            neighbouring=neighbouring,
        )

    def guarantee(self, delta: float) -> PrivacyGuarantee:
        base = super().guarantee(delta)
        if self.is_empty:
            return base
        order = base.details["order"]
        return replace(
            base, details={"order": order, "lambda": int(order) - 1, "conversion": "classic"}
        )

    def _options(self) -> dict[str, Any]:
        return {}
