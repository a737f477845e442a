"""Events for private selection and hyperparameter search, and their accounting formulas.

New leaf event types (registered with :func:`dpsharp.events.register_event_type`, so
accountant checkpoints serialise them); the existing classes of :mod:`dpsharp.events` are
untouched:

* :class:`PureDP` -- any epsilon-DP mechanism, e.g. the exponential mechanism.
* :class:`DisjointParts` -- parallel composition: each sub-event runs on its own part of a
  data-independent random partition of the records (Yu et al. 2019, Theorem 2).
* :class:`RandomChoice` -- one of the sub-events, chosen independently of the data.
* :class:`TruncatedNegativeBinomialTuning` and :class:`PoissonTuning` -- run a base mechanism a
  random number K of times and release the best run (Papernot and Steinke 2022).

The accountants recognise these leaves through the three functions at the bottom
(:func:`rdp_of_leaf`, :func:`zcdp_rho_of_leaf`, :func:`epsilon_delta_of_leaf`), which take a
callback that evaluates *any* event (the base runs of a search are ordinary training events) in
the host accountant's own family. Each function returns ``None`` for an event that is not one
of these types, so a host accountant adds one dispatch line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dpsharp._validation import (
    require_epsilon,
    require_positive_finite,
    require_real,
    require_real_array,
)
from dpsharp.events import Event, flatten, register_event_type

__all__ = [
    "TUNING_EVENT_TYPES",
    "DisjointParts",
    "PoissonTuning",
    "PureDP",
    "RandomChoice",
    "TruncatedNegativeBinomialTuning",
    "epsilon_delta_of_leaf",
    "poisson_tuning_rdp",
    "pure_dp_rdp",
    "rdp_of_leaf",
    "rdp_to_delta",
    "truncated_negative_binomial_mean",
    "truncated_negative_binomial_tuning_rdp",
    "unsupported_reason_of_leaf",
    "zcdp_rho_of_leaf",
]


def _require_event(name: str, value: object) -> None:
    if not isinstance(value, Event):
        raise TypeError(f"{name} must be a dpsharp event, got {value!r} ({type(value).__name__})")


def _event_tuple(name: str, events: object) -> tuple[Event, ...]:
    if isinstance(events, Event) or not isinstance(events, Iterable):
        raise TypeError(f"{name} must be an iterable of Event objects")
    result = tuple(events)
    if not result:
        raise ValueError(f"{name} must hold at least one event")
    for index, event in enumerate(result):
        _require_event(f"{name}[{index}]", event)
    return result


# ---------------------------------------------------------------------------------- events
@register_event_type
@dataclass(frozen=True)
class PureDP(Event):
    """A mechanism that is (epsilon, 0)-DP under the relation of the enclosing analysis.

    Used for the exponential mechanism (McSherry and Talwar 2007: selecting with probability
    proportional to exp(epsilon * score / (2 * sensitivity)) is epsilon-DP) and for results
    such as Gupta et al. 2010, Theorem 10.2. Accounting: (epsilon, 0)-DP; epsilon^2/2-zCDP
    (Bun and Steinke 2016, Prop. 3.3, the conversion 004 uses); and the exact worst-case RDP
    curve, attained by randomized response (every epsilon-DP pair is a post-processing of it,
    Kairouz, Oh, Viswanath 2015):
    D_alpha <= log(cosh((alpha - 1/2) epsilon) / cosh(epsilon / 2)) / (alpha - 1),
    which is <= min(epsilon, alpha epsilon^2 / 2).
    """

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", require_positive_finite("epsilon", self.epsilon))


@dataclass(frozen=True)
class _OfEvents(Event):
    """An event over a non-empty tuple ``events`` of events, its children (a base, not itself a
    serialisable event type)."""

    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", _event_tuple("events", self.events))

    def children(self) -> tuple[Event, ...]:
        return self.events


@register_event_type
@dataclass(frozen=True)
class DisjointParts(_OfEvents):
    """Parallel composition: ``events[i]`` runs only on part i of a partition of the records.

    The partition must be a function of each record alone (e.g. every record independently
    assigned a uniformly random part, or by a hash of a record id) -- not "cut the shuffled
    list into equal slices", where adding one record shifts the others. Then a neighbouring
    dataset changes one part only; the parts may run adaptively in order. The cost is the
    maximum over the parts, at every Renyi order (and the max rho under zCDP: Yu et al. 2019,
    Theorem 2; the max epsilon and max delta under (epsilon, delta)-DP).

    Under replace one and zero-out (dpsharp.events) the record that replaces x takes x's
    place, so the part must be a function of that place (a record id, an independent random
    assignment), not of the record's value: then one part changes, by a pair of the same
    relation, and the parts are analysed under it.
    """


@register_event_type
@dataclass(frozen=True)
class RandomChoice(_OfEvents):
    """One of ``events``, chosen at random independently of the data (the base run of a random
    search that picks a hyperparameter setting uniformly). Its output distribution is a mixture
    with data-independent weights, so by the joint quasi-convexity of Renyi divergence its cost
    is at most the maximum over the choices at every order (likewise rho and (epsilon, delta))."""


@register_event_type
@dataclass(frozen=True)
class TruncatedNegativeBinomialTuning(Event):
    """Run the base mechanism K times, K ~ D_{eta, gamma}, release only the best run (by a
    total order on outputs, e.g. the privatised validation score).

    Papernot and Steinke 2022, "Hyperparameter tuning with Renyi differential privacy" (ICLR;
    arXiv 2110.03620v2). Definition 1: for eta > -1 and gamma in (0, 1),
    P[K = k] = (1 - gamma)^k / (gamma^(-eta) - 1) * prod_{l=0}^{k-1} (l + eta) / (l + 1),
    k = 1, 2, ...; eta = 0 is the limit, the logarithmic distribution
    P[K = k] = (1 - gamma)^k / (k log(1/gamma)); eta = 1 is the geometric distribution
    P[K = k] = gamma (1 - gamma)^(k - 1).

    Theorem 2: if the base is (lambda, eps)-RDP and (lambda_hat, eps_hat)-RDP with
    lambda > 1, lambda_hat >= 1, the search is (lambda, eps')-RDP with
    eps' = eps + (1 + eta) (1 - 1/lambda_hat) eps_hat + (1 + eta) log(1/gamma) / lambda_hat
    + log(E[K]) / (lambda - 1),
    E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta))  (eta != 0; 1/gamma for eta = 1),
    E[K] = (1/gamma - 1) / log(1/gamma)               (eta = 0).
    The accountant minimises over lambda_hat in its own order grid. Special cases checked in
    the tests: Corollary 3 (an eps-DP base gives a (2 + eta) eps-DP search; eta = 1 is Liu and
    Talwar 2019's 3 eps) and Corollary 4 (a rho-zCDP base with rho <= log(1/gamma) gives
    eps' = rho (lambda - 1) + log(E[K])/(lambda - 1) + 2 (1 + eta) sqrt(rho log(1/gamma))
    - eta rho).
    """

    base: Event
    eta: float
    gamma: float

    def __post_init__(self) -> None:
        _require_event("base", self.base)
        eta = require_real("eta", self.eta)
        if eta <= -1.0:
            raise ValueError(f"eta must be in (-1, inf), got {eta!r}")
        gamma = require_real("gamma", self.gamma)
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
        object.__setattr__(self, "eta", eta)
        object.__setattr__(self, "gamma", gamma)

    @property
    def expected_runs(self) -> float:
        return truncated_negative_binomial_mean(self.eta, self.gamma)

    def children(self) -> tuple[Event, ...]:
        return (self.base,)


@register_event_type
@dataclass(frozen=True)
class PoissonTuning(Event):
    """Run the base mechanism K ~ Poisson(mean) times (K = 0 releases a fixed symbol "nothing")
    and release the best run.

    Papernot and Steinke 2022 (arXiv 2110.03620v2), Theorem 6: if the base is (lambda, eps)-RDP
    and (eps_hat, delta_hat)-DP with e^eps_hat <= 1 + 1/(lambda - 1), the search is
    (lambda, eps + mean delta_hat + log(mean)/(lambda - 1))-RDP. As printed this cannot hold
    for mean < 1: for identical neighbours (eps = delta_hat = 0) the divergence is 0 while the
    expression is log(mean)/(lambda - 1) < 0. Following the same argument (the density of the
    best of K runs is Q(y) f'(F(y)) with f'(x) = mean e^(mean (x - 1)), and the tail condition
    gives lambda F - (lambda - 1) F' <= 1 + (lambda - 1) delta_hat), keeping the K = 0 mass
    e^(-mean) and bounding the rest with Bernoulli's inequality
    p^lambda p'^(1 - lambda) >= lambda p - (lambda - 1) p', we account

        eps'(lambda) = log(1 + mean e^(mean (lambda - 1) delta_hat) (e^((lambda - 1) eps) - 1))
                       / (lambda - 1),

    valid for every mean > 0 (see :func:`poisson_tuning_rdp`). It is never above the paper's
    expression when mean e^(mean (lambda - 1) delta_hat) >= 1 (in particular mean >= 1, where
    the paper's bound therefore holds), and never above log(e^(-mean) + mean e^((lambda - 1)
    (eps + mean delta_hat)))/(lambda - 1), the bound with only the K = 0 term added. The
    accountant takes eps_hat = log(1 + 1/(lambda - 1)) (the largest allowed) and delta_hat from
    the base's own RDP curve (:func:`rdp_to_delta`).
    """

    base: Event
    mean: float

    def __post_init__(self) -> None:
        _require_event("base", self.base)
        object.__setattr__(self, "mean", require_positive_finite("mean", self.mean))

    @property
    def expected_runs(self) -> float:
        return self.mean

    def children(self) -> tuple[Event, ...]:
        return (self.base,)


TUNING_EVENT_TYPES: tuple[type[Event], ...] = (
    PureDP,
    DisjointParts,
    RandomChoice,
    TruncatedNegativeBinomialTuning,
    PoissonTuning,
)


# ---------------------------------------------------------------------------------- formulas
def _log_cosh(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    return ax + np.log1p(np.exp(-2.0 * ax)) - math.log(2.0)


def pure_dp_rdp(epsilon: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """The Renyi divergence of order alpha > 1 of an epsilon-DP mechanism (tight: randomized
    response attains it): log(cosh((alpha - 1/2) eps) / cosh(eps / 2)) / (alpha - 1)."""
    epsilon = require_positive_finite("epsilon", epsilon)
    alphas = _orders(orders)
    values = (_log_cosh((alphas - 0.5) * epsilon) - _log_cosh(np.asarray(epsilon / 2.0))) / (alphas - 1.0)
    return np.minimum(values, epsilon)  # equal in exact arithmetic as alpha -> inf; guards rounding


def truncated_negative_binomial_mean(eta: float, gamma: float) -> float:
    """E[K] for K ~ D_{eta, gamma} (Papernot and Steinke 2022, Definition 1 and Theorem 2):
    eta (1 - gamma) / (gamma (1 - gamma^eta)) for eta != 0 (1/gamma for the geometric eta = 1),
    (1/gamma - 1)/log(1/gamma) for the logarithmic eta = 0."""
    eta = require_real("eta", eta)
    gamma = require_real("gamma", gamma)
    if eta <= -1.0 or not 0.0 < gamma < 1.0:
        raise ValueError(f"need eta in (-1, inf) and gamma in (0, 1), got eta={eta!r}, gamma={gamma!r}")
    if eta == 0.0:
        return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
    # 1 - gamma^eta = -expm1(eta log gamma), accurate for small |eta|.
    return eta * (1.0 - gamma) / (gamma * -math.expm1(eta * math.log(gamma)))


def _orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    alphas = require_real_array("orders", orders)  # TypeError for bool, str, None, complex
    if alphas.ndim != 1 or alphas.size == 0 or np.any(alphas <= 1.0):
        raise ValueError("orders must be a non-empty 1-d sequence of finite numbers in (1, inf)")
    return alphas


def _base_curve(base_rdp: Sequence[float] | np.ndarray, alphas: np.ndarray) -> np.ndarray:
    base = require_real_array("base_rdp", base_rdp, allow_infinite=True)
    if base.shape != alphas.shape or np.any(base < 0):
        raise ValueError("base_rdp must be non-negative (inf allowed), one value per order")
    return base


def truncated_negative_binomial_tuning_rdp(
    base_rdp: Sequence[float] | np.ndarray,
    orders: Sequence[float] | np.ndarray,
    *,
    eta: float,
    gamma: float,
) -> np.ndarray:
    """Papernot and Steinke 2022, Theorem 2, at every order lambda of ``orders``, minimised over
    lambda_hat in ``orders``: eps'(lambda) = eps(lambda) + min_{lambda_hat} [(1 + eta)
    (1 - 1/lambda_hat) eps(lambda_hat) + (1 + eta) log(1/gamma)/lambda_hat]
    + log(E[K])/(lambda - 1). ``base_rdp[i]`` is the base mechanism's RDP at ``orders[i]``
    (may be +inf)."""
    alphas = _orders(orders)
    base = _base_curve(base_rdp, alphas)
    mean = truncated_negative_binomial_mean(eta, gamma)
    with np.errstate(invalid="ignore"):
        hat_terms = (1.0 + eta) * ((1.0 - 1.0 / alphas) * base + math.log(1.0 / gamma) / alphas)
    hat_terms = np.where(np.isnan(hat_terms), np.inf, hat_terms)
    return base + float(np.min(hat_terms)) + math.log(mean) / (alphas - 1.0)


def rdp_to_delta(base_rdp: Sequence[float] | np.ndarray, orders: Sequence[float] | np.ndarray, epsilon: float) -> float:
    """The smallest delta for which the RDP curve certifies (epsilon, delta)-DP, by the
    conversion of Canonne, Kamath, Steinke 2020 (Prop. 12): for each order alpha,
    delta = exp((alpha - 1)(eps(alpha) - epsilon)) (1 - 1/alpha)^(alpha - 1) / alpha; capped at 1."""
    alphas = _orders(orders)
    base = _base_curve(base_rdp, alphas)
    epsilon = require_epsilon(epsilon)
    with np.errstate(over="ignore", invalid="ignore"):
        log_delta = (alphas - 1.0) * (base - epsilon) + (alphas - 1.0) * np.log1p(-1.0 / alphas) - np.log(alphas)
    log_delta = np.where(np.isnan(log_delta), np.inf, log_delta)
    return float(min(1.0, math.exp(min(0.0, float(np.min(log_delta))))))


def poisson_tuning_rdp(
    base_rdp: Sequence[float] | np.ndarray,
    orders: Sequence[float] | np.ndarray,
    *,
    mean: float,
    base_delta: Callable[[float], float] | None = None,
) -> np.ndarray:
    """The RDP of the best of K ~ Poisson(mean) runs (see :class:`PoissonTuning`), at every
    order lambda:

        log(1 + mean e^(mean (lambda - 1) delta_hat) (e^((lambda - 1) eps(lambda)) - 1))
        / (lambda - 1),

    with delta_hat(lambda) the base's delta at eps_hat = log(1 + 1/(lambda - 1)), from
    ``base_delta`` if given (e.g. an exact or PLD delta), else from the RDP curve by
    :func:`rdp_to_delta`.

    Derivation (the argument of Papernot and Steinke 2022, Theorem 6, keeping the K = 0 term).
    Append an independent uniform tie-breaker to the base's output (post-processing back is
    free), so the base's output laws P, P' are atomless with CDFs F, F'. The best of K runs has
    density p f'(F) with f(x) = E[x^K] = e^(mean (x - 1)), and K = 0 has mass e^(-mean) under
    both. With h = lambda F - (lambda - 1) F', c = e^(mean (lambda - 1) delta_hat) and
    Z = integral p^lambda p'^(1 - lambda) <= e^((lambda - 1) eps):

        e^((lambda - 1) D_lambda)
            = e^(-mean) + mean integral p^lambda p'^(1 - lambda) e^(mean (h - 1)).

    The DP tail bound P'[Y > y] <= e^eps_hat P[Y > y] + delta_hat with e^eps_hat <= lambda /
    (lambda - 1) gives h <= 1 + (lambda - 1) delta_hat, so c - e^(mean (h - 1)) >= 0; and
    p^lambda p'^(1 - lambda) >= lambda p - (lambda - 1) p' = dh (Bernoulli). Hence
    integral p^lambda p'^(1 - lambda) (c - e^(mean (h - 1))) >= integral (c - e^(mean (h - 1))) dh
    = c - (1 - e^(-mean))/mean (h runs continuously from 0 to 1), and
    e^((lambda - 1) D_lambda) <= 1 + mean c (Z - 1). The exact divergence of brute-forced toy
    searches is checked against it in the tests. It is at most the paper's
    eps + mean delta_hat + log(mean)/(lambda - 1) whenever mean c >= 1."""
    alphas = _orders(orders)
    base = _base_curve(base_rdp, alphas)
    mean = require_positive_finite("mean", mean)
    result = np.empty_like(alphas)
    for index, lam in enumerate(alphas):
        eps_hat = math.log1p(1.0 / (lam - 1.0))
        delta_hat = base_delta(eps_hat) if base_delta is not None else rdp_to_delta(base, alphas, eps_hat)
        if math.isnan(delta_hat) or not 0.0 <= delta_hat <= 1.0:
            raise ValueError(f"base_delta must return a delta in [0, 1], got {delta_hat!r}")
        scaled = (lam - 1.0) * base[index]
        if scaled == 0.0:
            result[index] = 0.0  # identical output laws at this order
            continue
        # log(e^scaled - 1), accurate for small and large scaled (inf stays inf).
        if scaled < 30.0:
            log_expm1 = math.log(math.expm1(scaled))
        else:  # log(e^x - 1) = x + log(1 - e^-x), no overflow
            log_expm1 = scaled + math.log1p(-math.exp(-scaled))
        log_term = math.log(mean) + mean * (lam - 1.0) * delta_hat + log_expm1
        result[index] = float(np.logaddexp(0.0, log_term)) / (lam - 1.0)
    return result


# ------------------------------------------------------------------ hooks for the accountants
def first_unsupported_leaf(
    event: Event, leaf_reason: Callable[[Event], str | None]
) -> str | None:
    """``"<leaf!r>: <reason>"`` for the first leaf of ``event`` (in :func:`dpsharp.events.flatten`
    order) for which ``leaf_reason`` gives a reason; None when it accepts every leaf."""
    for leaf, _ in flatten(event):
        reason = leaf_reason(leaf)
        if reason is not None:
            return f"{leaf!r}: {reason}"
    return None


def unsupported_reason_of_leaf(
    leaf: Event, family: str, base_reason: Callable[[Event], str | None]
) -> str | None:
    """For a tuning leaf: None if ``family`` ("rdp", "zcdp" or "classic") can account it given
    ``base_reason`` (the host's reason for an arbitrary sub-event), else why not. For any
    other event: None (the host decides)."""
    if isinstance(leaf, PureDP):
        return None
    if isinstance(leaf, (DisjointParts, RandomChoice)):
        for event in leaf.events:
            reason = base_reason(event)
            if reason is not None:
                return reason
        return None
    if isinstance(leaf, (TruncatedNegativeBinomialTuning, PoissonTuning)):
        if family != "rdp":
            return (
                f"{type(leaf).__name__} has an RDP analysis only (Papernot and Steinke 2022); "
                "account it with the 'rdp' accountant"
            )
        return base_reason(leaf.base)
    return None


def rdp_of_leaf(
    leaf: Event, orders: np.ndarray, base_rdp: Callable[[Event], np.ndarray]
) -> np.ndarray | None:
    """The RDP curve of a tuning leaf at ``orders``; ``base_rdp(event)`` gives the host's curve
    of any event at the same orders. None for an event that is not a tuning leaf."""
    if isinstance(leaf, PureDP):
        return pure_dp_rdp(leaf.epsilon, orders)
    if isinstance(leaf, (DisjointParts, RandomChoice)):
        return np.max(np.stack([np.asarray(base_rdp(event), dtype=np.float64) for event in leaf.events]), axis=0)
    if isinstance(leaf, TruncatedNegativeBinomialTuning):
        return truncated_negative_binomial_tuning_rdp(base_rdp(leaf.base), orders, eta=leaf.eta, gamma=leaf.gamma)
    if isinstance(leaf, PoissonTuning):
        return poisson_tuning_rdp(base_rdp(leaf.base), orders, mean=leaf.mean)
    return None


def zcdp_rho_of_leaf(leaf: Event, base_rho: Callable[[Event], float]) -> float | None:
    """rho of a tuning leaf (PureDP: epsilon^2/2; parts / random choice: the max). None for
    other events (the Papernot-Steinke leaves are refused by :func:`unsupported_reason_of_leaf`)."""
    if isinstance(leaf, PureDP):
        return leaf.epsilon**2 / 2.0
    if isinstance(leaf, (DisjointParts, RandomChoice)):
        return max(base_rho(event) for event in leaf.events)
    return None


def epsilon_delta_of_leaf(
    leaf: Event, base: Callable[[Event], tuple[float, float]]
) -> tuple[float, float] | None:
    """(epsilon, delta) of a tuning leaf for an accountant of (epsilon, delta) statements:
    PureDP -> (epsilon, 0); parts / random choice -> (max epsilon, max delta) of the parts."""
    if isinstance(leaf, PureDP):
        return (leaf.epsilon, 0.0)
    if isinstance(leaf, (DisjointParts, RandomChoice)):
        pairs = [base(event) for event in leaf.events]
        return (max(p[0] for p in pairs), max(p[1] for p in pairs))
    return None
