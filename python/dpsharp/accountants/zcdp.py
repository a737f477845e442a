"""Zero-concentrated differential privacy (zCDP) and the batching analyses of Yu et al. 2019.

A mechanism is rho-zCDP when its Renyi divergences satisfy D_alpha <= alpha rho for every
alpha > 1 (Bun and Steinke 2016, Definition 1.1). Gaussian(sigma) is exactly
1/(2 sigma^2)-zCDP (its Renyi divergence is alpha / (2 sigma^2), Mironov 2017), compositions add
rho, and rho-zCDP implies (epsilon, delta)-DP through either conversion below (the accountant
reports the smaller; both are valid):

* Bun and Steinke 2016, Proposition 1.3:  epsilon = rho + 2 sqrt(rho log(1/delta)).
* Canonne, Kamath, Steinke 2020, Proposition 12 / Corollary 13 (via RDP at order alpha):
  delta = exp((alpha - 1)(alpha rho - epsilon)) / alpha * (1 - 1/alpha)^(alpha - 1),
  i.e. epsilon = alpha rho + (log(1/delta) + (alpha - 1) log(1 - 1/alpha) - log alpha)/(alpha - 1),
  minimised over alpha > 1. Every alpha gives a valid bound, so a numerical minimiser can only
  cost tightness, never validity.

Batching (Yu, Liu, Pu, Gursoy, Truex 2019, Section IV-B):

* random reshuffling (Theorem 2): the batches of an epoch are disjoint, so an epoch of
  rho-zCDP steps costs max_i rho_i; epochs add. Described by the ``Shuffled`` event, which
  holds under zero-out (a record replaced by a null record, Kairouz et al. 2021) and replace
  one, not under add/remove (adding a record shifts the others across batch boundaries).
* random sampling (Theorem 3): the sampled Gaussian is assumed to satisfy
  D_alpha <= alpha P(q, sigma) with P = q^2 / sigma^2 on 1 < alpha <= U = sigma^2 log(1/(q sigma)) + 1,
  for q <= 1/(16 sigma) and sigma >= 1 (the range of the moment bound of Abadi et al. 2016,
  Lemma 3, that P comes from). The paper itself states that this P was found empirically (it "misses
  an asymptotic term" of the moment bound it was derived from), so results that use it are
  approximations, flagged as such, and refused outside the stated range. Inside it the
  assumption can fail too: at sigma = 1, q = 1/16 the exact Renyi divergence of the sampled
  Gaussian (remove direction, mpmath quadrature) exceeds alpha P by up to 16% near alpha = U
  (1.14 at q = 0.05); it held for sigma >= 1.2. (The epsilons measured against the certified
  PLD accountant's lower bound stayed above it there: the restriction alpha <= U absorbs it.)

The paper's numbers (q = 0.01, sigma = 6, delta = 1e-5; tests/test_zcdp.py):

* reshuffling, 400 epochs: rho = 400/72 = 5.556, Bun-Steinke epsilon 21.551 (paper 21.5);
  the CKS conversion of the same rho gives 20.39, which ``epsilon`` reports.
* random sampling, T = 40000: rho_hat = T q^2/sigma^2 = 1/9, U = 36 log(1/0.06) + 1 = 102.28;
  exp(-rho_hat (U - 1)^2) = e^-1139 <= delta, so case (15): 1/9 + 2 sqrt(log(1e5)/9) = 2.373
  (paper 2.37); with CKS restricted to alpha <= U: 2.029.
* one step: rho = 1/72 = 0.0139 (paper 0.0139).
"""

from __future__ import annotations

import math
from typing import Any

from scipy.optimize import minimize_scalar

from dpsharp._rounding import raised
from dpsharp._validation import is_real_number, require_delta, require_epsilon, require_real
from dpsharp.accountants.base import Accountant, PrivacyGuarantee
from dpsharp.accountants.registry import register
from dpsharp.events import (
    ZCDP,
    Event,
    Gaussian,
    Laplace,
    Neighbouring,
    PoissonSampled,
    Shuffled,
    flatten,
)
from dpsharp.tuning_events import (
    TUNING_EVENT_TYPES,
    DisjointParts,
    PureDP,
    RandomChoice,
    first_unsupported_leaf,
    unsupported_reason_of_leaf,
)

__all__ = [
    "SAMPLING_WARNING",
    "ZCDPAccountant",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_epsilon_bun_steinke",
    "zcdp_epsilon_cks",
]

SAMPLING_WARNING = (
    "zCDP random-sampling bound of Yu et al. 2019 (Theorem 3 with P(q, sigma) = q^2/sigma^2): "
    "the authors state this P is an empirical bound on the Renyi divergence, not a proven "
    "one; it is an approximation. Use the 'rdp' or 'pld' accountant for a certified epsilon."
)

_ALPHA_SEARCH_MAX = 1e8


def _restricted_alpha_max(alpha_max: object) -> float:
    """``alpha_max`` validated: None (no restriction) reads as +inf; otherwise a real Renyi order
    in (1, inf]. An order <= 1 would turn the minimisation over 1 < alpha <= alpha_max into one
    over an empty set (alpha_max = 0.5 gave epsilon = -22.5 here), so it is an error."""
    if alpha_max is None:
        return math.inf
    if type(alpha_max) is not float and not is_real_number(alpha_max):
        raise TypeError(
            f"alpha_max must be None or a real Renyi order in (1, inf], got {alpha_max!r} "
            f"({type(alpha_max).__name__})"
        )
    value = float(alpha_max)  # type: ignore[arg-type]
    if not value > 1.0:  # also NaN
        raise ValueError(f"alpha_max must be None or a Renyi order in (1, inf], got {value!r}")
    return value


def zcdp_epsilon_bun_steinke(rho: float, delta: float, *, alpha_max: float | None = None) -> float:
    """epsilon = min_{1 < alpha <= alpha_max} alpha rho + log(1/delta)/(alpha - 1).

    With alpha_max = inf this is rho + 2 sqrt(rho log(1/delta)) (Bun and Steinke 2016,
    Proposition 1.3), attained at alpha* = 1 + sqrt(log(1/delta)/rho). With a finite alpha_max
    it is Theorem 3 of Yu et al. 2019, eqs. (15)-(16): (15) when
    delta >= exp(-rho (alpha_max - 1)^2), i.e. alpha* <= alpha_max, else (16) at alpha_max,
    rho alpha_max + log(1/delta)/(alpha_max - 1). Rounded up (:func:`~dpsharp._rounding.raised`).
    """
    rho = _require_rho(rho)
    log_inv_delta = -math.log(require_delta(delta))
    limit = _restricted_alpha_max(alpha_max)
    if rho == 0.0:
        value = log_inv_delta / (limit - 1.0)  # 0.0 without a restriction
        return raised(value, value) if value > 0.0 else value
    alpha_star = 1.0 + math.sqrt(log_inv_delta / rho)
    if alpha_star <= limit:
        value = rho + 2.0 * math.sqrt(rho * log_inv_delta)
    else:
        value = rho * limit + log_inv_delta / (limit - 1.0)
    return raised(value, value)  # (positive terms: the value is their magnitude)


def _cks_epsilon_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    """The CKS epsilon at one order alpha > 1 (any order gives a valid epsilon), rounded up
    (:func:`~dpsharp._rounding.raised`; alpha - 1 is exact for the doubles alpha in (1, 2^53))."""
    am1 = alpha - 1.0
    shape = am1 * math.log1p(-1.0 / alpha)
    log_alpha = math.log(alpha)
    value = alpha * rho + (log_inv_delta + shape - log_alpha) / am1
    return raised(value, alpha * rho + (log_inv_delta + abs(shape) + abs(log_alpha)) / am1)


def zcdp_epsilon_cks(rho: float, delta: float, *, alpha_max: float | None = None) -> float:
    """The Canonne-Kamath-Steinke 2020 conversion (Proposition 12 / Corollary 13), minimised
    over 1 < alpha <= alpha_max (bounded scalar minimisation in log(alpha - 1)):

        epsilon = alpha rho + (log(1/delta) + (alpha - 1) log(1 - 1/alpha) - log alpha)/(alpha - 1).

    Never larger than :func:`zcdp_epsilon_bun_steinke` by more than rounding where the
    Bun-Steinke order lies in the searched range (alpha <= 1e8; it is evaluated there too, and
    the smaller value is returned): beyond it, for rho below about 1e-16 log(1/delta), at the
    range's end. Clipped below at 0; rounded up (:func:`~dpsharp._rounding.raised`).
    """
    rho = _require_rho(rho)
    log_inv_delta = -math.log(require_delta(delta))
    upper = min(_restricted_alpha_max(alpha_max), _ALPHA_SEARCH_MAX)
    candidates = []
    if rho > 0.0:
        alpha_bs = min(1.0 + math.sqrt(log_inv_delta / rho), upper)
        candidates.append(alpha_bs)
    candidates.append(upper)
    lo, hi = math.log(1e-9), math.log(upper - 1.0)
    if hi > lo:
        res = minimize_scalar(
            lambda t: _cks_epsilon_at(1.0 + math.exp(t), rho, log_inv_delta),
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": 1e-10},
        )
        candidates.append(1.0 + math.exp(float(res.x)))
    best = min(_cks_epsilon_at(alpha, rho, log_inv_delta) for alpha in candidates if alpha > 1.0)
    return max(best, 0.0)


def zcdp_epsilon(rho: float, delta: float, *, alpha_max: float | None = None) -> float:
    """The better of :func:`zcdp_epsilon_bun_steinke` and :func:`zcdp_epsilon_cks`."""
    return min(
        zcdp_epsilon_bun_steinke(rho, delta, alpha_max=alpha_max),
        zcdp_epsilon_cks(rho, delta, alpha_max=alpha_max),
    )


def zcdp_delta(rho: float, epsilon: float, *, alpha_max: float | None = None) -> float:
    """The smallest delta the two conversions give at ``epsilon``:

    * Bun-Steinke: delta = min_alpha exp((alpha - 1)(alpha rho - epsilon)), i.e.
      exp(-(epsilon - rho)^2 / (4 rho)) for epsilon >= rho (unrestricted alpha);
    * CKS 2020: delta = min_alpha exp((alpha - 1)(alpha rho - epsilon)) / alpha (1 - 1/alpha)^(alpha-1).
    """
    rho = _require_rho(rho)
    epsilon = require_epsilon(epsilon)
    upper = min(_restricted_alpha_max(alpha_max), _ALPHA_SEARCH_MAX)
    if rho == 0.0:
        return 0.0

    def log_bs(alpha: float) -> float:
        return (alpha - 1.0) * (alpha * rho - epsilon)

    def log_cks(alpha: float) -> float:
        am1 = alpha - 1.0
        return am1 * (alpha * rho - epsilon) + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)

    def log_upper(alpha: float) -> float:
        """The smaller of the two at ``alpha``, each rounded up by its terms' magnitudes
        (:func:`~dpsharp._rounding.raised`): (alpha - 1)(alpha rho - epsilon) cancels where
        epsilon is near alpha rho."""
        am1 = alpha - 1.0
        tilt = am1 * (alpha * rho + epsilon)
        shape = abs(am1 * math.log1p(-1.0 / alpha)) + abs(math.log(alpha))
        return min(raised(log_bs(alpha), tilt), raised(log_cks(alpha), tilt + shape))

    alpha_bs = min(max((epsilon + rho) / (2.0 * rho), 1.0 + 1e-12), upper)
    # (every order gives a valid delta; the restriction's own end too, where it lies beyond the
    # searched orders: U = sigma^2 log(1 / (q sigma)) + 1 is 7e12 at sigma = 1e6, q = 1e-9)
    far = min(_restricted_alpha_max(alpha_max), 2.0**52)
    candidates = [alpha_bs, upper, far]
    lo, hi = math.log(1e-12), math.log(upper - 1.0)
    if hi > lo:
        res = minimize_scalar(
            lambda t: log_cks(1.0 + math.exp(t)), bounds=(lo, hi), method="bounded",
            options={"xatol": 1e-10},
        )
        candidates.append(1.0 + math.exp(float(res.x)))
    best = min(log_upper(a) for a in candidates if a > 1.0)
    best_order = (epsilon + rho) / (2.0 * rho)
    if epsilon > rho and best_order <= min(_restricted_alpha_max(alpha_max), 1e300):
        # Bun-Steinke's minimum in closed form, at alpha* = (epsilon + rho) / (2 rho), which for
        # a tiny rho lies far beyond the searched orders (rho = 1e-30: alpha* ~ 1e16, where the
        # search's end at 1e8 gave a delta 37 times the one epsilon(delta) was asked for)
        square = (epsilon - rho) * (epsilon - rho) / (4.0 * rho)
        best = min(best, raised(-square, (epsilon + rho) * (epsilon + rho) / (4.0 * rho)))
    if best >= 0.0:
        return 1.0  # (e^best overflows for rho above ~7e14)
    return min(math.nextafter(math.exp(best), math.inf), 1.0)  # (exp within an ulp)


def _require_rho(rho: float) -> float:
    value = require_real("rho", rho)
    if value < 0.0:
        raise ValueError(f"rho must be in [0, inf), got {value!r}")
    return value


def _leaf_rho(event: Event) -> float | None:
    """rho of one unsampled mechanism, or None if it is not a known zCDP mechanism."""
    if isinstance(event, Gaussian):
        return _half_inverse_square(event.noise_multiplier)
    if isinstance(event, Laplace):
        # (1/b)-DP implies (1/(2 b^2))-zCDP (Bun and Steinke 2016, Proposition 1.4).
        return _half_inverse_square(event.scale)
    if isinstance(event, ZCDP) and event.xi == 0.0:
        return event.rho  # rho-zCDP by definition (Bun and Steinke 2016, Definition 1.1)
    return None


def _half_inverse_square(scale: float) -> float:
    """1/(2 s^2); +inf (no privacy) where s^2 underflows to 0, not a ZeroDivisionError."""
    square = scale * scale
    return math.inf if square == 0.0 else 0.5 / square


@register("zcdp")
class ZCDPAccountant(Accountant):
    """rho-zCDP accounting with the batching analyses of Yu et al. 2019.

    Parameters
    ----------
    batching : {"reshuffle", "sample"}
        How the data loader forms batches.

        * ``"reshuffle"`` (random reshuffling, Theorem 2): ``Shuffled(event, batch_size,
          dataset_size)`` is one epoch and costs the rho of ``event`` (the max over its
          disjoint batches), under ``neighbouring="zero_out"`` (same sigma) or
          ``"replace_one"``; reshuffling has no add/remove guarantee, so an add/remove
          accountant refuses it (:class:`dpsharp.events.Shuffled`); ``Gaussian`` and
          ``Laplace`` cost their own rho. Every result is a
          certified bound. ``PoissonSampled`` events are refused: a Poisson loader is not a
          reshuffling loader; use ``batching="sample"``.
        * ``"sample"`` (random sampling with replacement, Theorem 3): additionally accepts
          ``PoissonSampled(Gaussian(sigma), q)`` with q <= 1/(16 sigma), contributing
          P(q, sigma) = q^2/sigma^2 to rho_hat, and restricts the conversion to
          1 < alpha <= U = min over such events of sigma^2 log(1/(q sigma)) + 1 (Theorem 3 and
          its composition case 2). The paper says this P is an empirical bound, so these
          results carry ``certified=False`` and :data:`SAMPLING_WARNING`. Events outside
          q <= 1/(16 sigma) and sigma >= 1 (Abadi et al. 2016, Lemma 3) are refused.

    Notes
    -----
    :attr:`rho` is the composed rho (rho_hat of Theorem 3 when a sampled event was composed:
    then it is the paper's assumed bound on D_alpha / alpha for alpha <= :attr:`alpha_max`, not
    a proven one; see the module docstring).
    ``epsilon(delta)`` reports the better of the Bun-Steinke and the Canonne-Kamath-Steinke
    conversions; :meth:`epsilon_bun_steinke` gives the former alone (the one the paper uses:
    21.551 for 400 reshuffled epochs at sigma = 6, 2.37 for random sampling).
    """

    def __init__(
        self,
        batching: str = "reshuffle",
        *,
        neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    ) -> None:
        if batching not in ("reshuffle", "sample"):
            raise ValueError(f"batching must be 'reshuffle' or 'sample', got {batching!r}")
        super().__init__(neighbouring=neighbouring)
        self._batching = batching
        self._rho = 0.0
        self._alpha_max: float | None = None

    @property
    def batching(self) -> str:
        return self._batching

    @property
    def certified(self) -> bool:
        """True for ``batching="reshuffle"`` (every answer is a proven bound); False for
        ``batching="sample"``, whose P(q, sigma) = q^2/sigma^2 is empirical (Yu et al. 2019,
        Theorem 3): a budget or a calibration on it needs ``allow_approximation=True``."""
        return self._batching == "reshuffle"

    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        if _leaf_rho(leaf) is not None:
            return None
        if isinstance(leaf, TUNING_EVENT_TYPES):  # selection / tuning events (dpsharp.tuning_events)
            return unsupported_reason_of_leaf(leaf, "zcdp", self._event_unsupported_reason)
        if isinstance(leaf, Shuffled):
            if _leaf_rho(leaf.event) is not None:
                return None
            return ("only Shuffled(Gaussian), Shuffled(Laplace) and Shuffled(ZCDP) epochs have a "
                    "zCDP analysis here")
        if isinstance(leaf, PoissonSampled):
            if self._batching != "sample":
                return (
                    "a Poisson-sampled step under batching='reshuffle': describe a reshuffling "
                    "loader with Shuffled epochs, or use ZCDPAccountant(batching='sample') for "
                    "random sampling"
                )
            if not isinstance(leaf.event, Gaussian):
                return "random-sampling zCDP (Yu et al. Theorem 3) covers PoissonSampled(Gaussian) only"
            q, sigma = leaf.sampling_probability, leaf.event.noise_multiplier
            if sigma < 1.0:
                return (
                    "Yu et al. 2019 Theorem 3 takes P = q^2/sigma^2 from the moment bound of "
                    "Abadi et al. 2016 (Lemma 3), which is stated for sigma >= 1 (below it the "
                    f"true divergence is up to thousands of times P); got sigma = {sigma!r}. "
                    "Use a certified accountant ('pld', 'rdp') for Poisson sampling"
                )
            if q > 1.0 / (16.0 * sigma):
                return (
                    f"Yu et al. 2019 Theorem 3 with P = q^2/sigma^2 is stated for "
                    f"q <= 1/(16 sigma) = {1.0 / (16.0 * sigma):.6g}; got q = {q!r}"
                )
            return None
        return "not a Gaussian, Laplace, Shuffled or (batching='sample') PoissonSampled event"

    # -- selection / tuning events (dpsharp.tuning_events): PureDP is epsilon^2/2-zCDP (Bun and Steinke 2016,
    # Prop. 3.3); DisjointParts / RandomChoice cost the max rho of their parts (Yu et al. 2019, Theorem 2;
    # joint quasi-convexity), valid for alpha up to the smallest limit among the parts.
    def _event_unsupported_reason(self, event: Event) -> str | None:
        return first_unsupported_leaf(event, self._leaf_unsupported_reason)

    @classmethod
    def _event_cost(cls, event: Event) -> tuple[float, float | None]:
        costs = [(cls._leaf_cost(leaf), count) for leaf, count in flatten(event)]
        limits = [limit for (_, limit), _ in costs if limit is not None]
        return math.fsum(count * rho for (rho, _), count in costs), (min(limits) if limits else None)

    @classmethod
    def _leaf_cost(cls, leaf: Event) -> tuple[float, float | None]:
        """(rho contribution, alpha upper limit or None) of one leaf."""
        direct = _leaf_rho(leaf)
        if direct is not None:
            return direct, None
        if isinstance(leaf, PureDP):
            return leaf.epsilon**2 / 2.0, None
        if isinstance(leaf, (DisjointParts, RandomChoice)):
            parts = [cls._event_cost(event) for event in leaf.events]
            limits = [limit for _, limit in parts if limit is not None]
            return max(rho for rho, _ in parts), (min(limits) if limits else None)
        if isinstance(leaf, Shuffled):
            # Theorem 2: the epoch's disjoint batches cost max_i rho_i = rho(event).
            inner = _leaf_rho(leaf.event)
            assert inner is not None
            return inner, None
        assert isinstance(leaf, PoissonSampled) and isinstance(leaf.event, Gaussian)
        q, sigma = leaf.sampling_probability, leaf.event.noise_multiplier
        if sigma * sigma == 0.0:  # underflow: no noise, no privacy
            return math.inf, None
        return q * q / (sigma * sigma), sigma * sigma * math.log(1.0 / (q * sigma)) + 1.0

    def _on_compose(self, leaves: list[tuple[Event, int]]) -> None:
        merged = dict(self._counts)
        for leaf, count in leaves:
            merged[leaf] = merged.get(leaf, 0) + count
        costs = [(self._leaf_cost(leaf), count) for leaf, count in merged.items()]
        self._rho = math.fsum(count * rho for (rho, _), count in costs)
        limits = [limit for (_, limit), _ in costs if limit is not None]
        self._alpha_max = min(limits) if limits else None

    def _reset_caches(self) -> None:
        self._rho = 0.0
        self._alpha_max = None

    @property
    def rho(self) -> float:
        """The composed zCDP parameter (rho_hat of Yu et al. Theorem 3 if sampled events were
        composed; valid then only for alpha <= :attr:`alpha_max`)."""
        return self._rho

    @property
    def alpha_max(self) -> float | None:
        """None for a true zCDP guarantee; the Renyi-order limit U of Theorem 3 otherwise."""
        return self._alpha_max

    @property
    def is_approximate(self) -> bool:
        return self._alpha_max is not None

    def _epsilon(self, delta: float) -> float:
        if math.isinf(self._rho):  # a noise multiplier so small its square underflows
            return math.inf
        return zcdp_epsilon(self._rho, delta, alpha_max=self._alpha_max)

    def _delta(self, epsilon: float) -> float:
        if math.isinf(self._rho):
            return 1.0
        return zcdp_delta(self._rho, epsilon, alpha_max=self._alpha_max)

    def epsilon_bun_steinke(self, delta: float) -> float:
        """epsilon by rho + 2 sqrt(rho log(1/delta)) alone (Theorem 3's (15)/(16) when a sampled
        event was composed): the conversion the paper reports."""
        delta = require_delta(delta)
        if self.is_empty:
            return 0.0
        if math.isinf(self._rho):
            return math.inf
        return zcdp_epsilon_bun_steinke(self._rho, delta, alpha_max=self._alpha_max)

    def epsilon_cks(self, delta: float) -> float:
        """epsilon by the Canonne-Kamath-Steinke 2020 conversion alone."""
        delta = require_delta(delta)
        if self.is_empty:
            return 0.0
        if math.isinf(self._rho):
            return math.inf
        return zcdp_epsilon_cks(self._rho, delta, alpha_max=self._alpha_max)

    def _options(self) -> dict[str, Any]:
        return {"batching": self._batching}

    def guarantee(self, delta: float) -> PrivacyGuarantee:
        delta = require_delta(delta)
        return PrivacyGuarantee(
            epsilon=self.epsilon(delta),
            delta=delta,
            certified=not self.is_approximate,
            accountant=self.name,
            neighbouring=self.neighbouring,
            details={
                "rho": self._rho,
                "alpha_max": self._alpha_max,
                "epsilon_bun_steinke": self.epsilon_bun_steinke(delta),
                "epsilon_cks": self.epsilon_cks(delta),
            },
            warning=SAMPLING_WARNING if self.is_approximate else None,
        )

