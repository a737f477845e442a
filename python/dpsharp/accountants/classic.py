"""Classical (epsilon, delta) accounting: per-step guarantees composed by the basic, advanced or
optimal composition theorem (the "strong composition" baseline of Abadi et al. 2016 and Yu et al. 2019).

How events become per-step (epsilon_t, delta_t) guarantees
----------------------------------------------------------
* ``Laplace(b)``: (1/b, 0) exactly.
* ``Gaussian(sigma)``: (eps_0(delta_0), delta_0) for a per-step delta_0 chosen by the
  accountant (below). ``gaussian="analytic"`` (default) uses the exact curve of Balle and Wang
  2018 (valid for every epsilon); ``gaussian="classical"`` uses eps_0 = sqrt(2 log(1.25/delta_0))
  / sigma, the calibration the papers used, which is a theorem only for eps_0 < 1: any step
  whose eps_0 >= 1 makes ``epsilon`` raise ValueError.
* ``PoissonSampled(M, q)`` with M Gaussian or Laplace: M's (eps_0, delta_0) amplified to
  (log(1 + q (e^eps_0 - 1)), q delta_0).
* ``Shuffled(M, ...)``: one epoch of disjoint batches costs what one run of M costs (parallel
  composition, McSherry 2009), i.e. M's (eps_0, delta_0) once per epoch; under zero-out or
  replace one only (:class:`dpsharp.events.Shuffled`).

The per-step delta split
------------------------
For a target total delta every Gaussian-based step uses one common delta_0 before
amplification (so a step sampled at rate q spends q delta_0). With S = sum over Gaussian-based
steps of q_t:

* ``basic``: delta = S delta_0, so delta_0 = delta / S; epsilon = sum eps_t (Claim 10 of 003).
* ``advanced``: delta = S delta_0 + delta' (the slack of the advanced theorem); the fraction
  f = delta'/delta is optimised numerically (a grid in log f and log(1 - f), then Brent's bounded
  minimisation). The reported epsilon is the smallest of the heterogeneous Dwork-Rothblum-Vadhan
  bound (Wu et al., Lemma 2.2), the Kairouz-Oh-Viswanath 2017 Theorem 3.5 bound (delta =
  1 - (1 - delta') prod (1 - delta_t) <= S delta_0 + delta'), and the basic composition at
  delta_0 = delta / S. Each is a valid bound for its split, so the minimum is.
* ``optimal``: Kairouz-Oh-Viswanath 2017 Theorem 3.3 (exact optimum over per-step guarantees);
  homogeneous only (one distinct event); split: (1 - delta_t)^k = 1 - (1 - f) delta, the rest of
  delta for the theorem's delta_0 term, f optimised as above.

The papers' strong-composition numbers
--------------------------------------
Abadi et al. 2016 report 9.34 (q = 0.01, sigma = 4, T = 10^4) and 24.22 (T = 4 10^4) at
delta = 1e-5 without stating the split or the amplification. A search over the classical /
exact calibration, the amplification log(1 + q(e^eps - 1)), 2 q eps or q eps, the DRV, KOV and
"k eps^2" second terms, per-step deltas with and without the factor q, and both fixed and
optimised splits found one family within 0.2%: classical calibration per step, amplified to
q eps_0 (the paper's "(O(q eps), q delta)" read with constant 1), DRV composition with an
optimised split (delta' ~ 0.46 delta at T = 10^4, 0.40 delta at T = 4 10^4): 9.353 and 24.245.
With the second term k eps^2 instead of k eps (e^eps - 1) and delta' = delta/2 it gives 9.339 and
24.205. Neither reproduces both numbers to the printed digits. Note q eps_0 is *not* a valid
amplification for eps_0 > 1 (here eps_0 ~ 1.5-1.7): log(1 + q(e^eps_0 - 1)) is the tight one,
and with it the optimised DRV bound is 26.39 and 82.35, far above the paper. See
:func:`paper_strong_composition_002`.

Yu et al. 2019 report 34.3 (q = 0.01, sigma = 6, T = 4 10^4) and states its recipe:
strong composition of (log(1 + q(e^eps - 1)), q delta) steps. With the classical calibration
and DRV the optimised split gives 29.04 (< 34.3); 34.3 is reached only at the unnatural split
delta' = 0.975 delta (delta_0 = 6.1e-10). With per-step (0.808, 1e-5) (the paper's own
calibration of sigma = 6) and delta' = 1e-5, DRV gives 17.98. Other readings tried (2 q eps
amplification with the exact Gaussian curve: 34.33 at the optimised split but with per-step
delta not scaled by q) are not what the paper states. 34.3 is therefore not reproduced. The
accountant reports the valid, optimised bound: 23.14 with ``gaussian="classical"`` (its
minimum of DRV, 29.04 alone, and KOV Theorem 3.5) and 16.09 with the exact Gaussian curve.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

from dpsharp._native import core as _core
from dpsharp._rounding import fraction_rounded_up
from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
)
from dpsharp.accountants.base import Accountant
from dpsharp.accountants.registry import register
from dpsharp.composition import (
    amplify_by_subsampling,
    extended_advanced_composition,
    optimal_composition_epsilon,
)
from dpsharp.events import (
    Event,
    Gaussian,
    Laplace,
    Neighbouring,
    PoissonSampled,
    Shuffled,
)
from dpsharp.tradeoff import gdp_epsilon
from dpsharp.tuning_events import PureDP  # an epsilon-DP step (e.g. exponential mechanism)

__all__ = ["ClassicAccountant", "paper_strong_composition_002"]

_COMPOSITIONS = ("basic", "advanced", "optimal")
_INVALID = 1e200  # objective value standing for "no valid bound at this split"
_GAUSSIAN_CALIBRATIONS = ("analytic", "classical")


#: eps_0 of the analytic calibration per (noise multiplier, delta_0), the most recently used
#: ``_ANALYTIC_CACHE_SIZE`` (the splits of a query ask again for the same values, and so does a
#: query at the same delta on another accountant of the same steps).
_ANALYTIC_CACHE: OrderedDict[tuple[float, float], float] = OrderedDict()
_ANALYTIC_CACHE_SIZE = 4096
_ANALYTIC_CACHE_LOCK = threading.Lock()


def _analytic_epsilons(sigmas: list[float], delta0: float) -> dict[float, float]:
    """eps_0 = the smallest epsilon of the Gaussian mechanism of each noise multiplier at
    per-step delta ``delta0`` (Balle and Wang 2018: :func:`~dpsharp.tradeoff.gdp_epsilon` at
    mu = 1 / sigma), those not cached computed in one vectorised search."""
    with _ANALYTIC_CACHE_LOCK:
        known = {sigma: _ANALYTIC_CACHE.get((sigma, delta0)) for sigma in sigmas}
        for sigma, value in known.items():
            if value is not None:
                _ANALYTIC_CACHE.move_to_end((sigma, delta0))
    missing = [sigma for sigma, value in known.items() if value is None]
    if missing:
        values = np.atleast_1d(gdp_epsilon(delta0, 1.0 / np.array(missing))).tolist()
        with _ANALYTIC_CACHE_LOCK:
            for sigma, value in zip(missing, values):
                known[sigma] = value
                _ANALYTIC_CACHE[(sigma, delta0)] = value
            while len(_ANALYTIC_CACHE) > _ANALYTIC_CACHE_SIZE:
                _ANALYTIC_CACHE.popitem(last=False)
    return known  # type: ignore[return-value]


@lru_cache(maxsize=4096)
def _gaussian_epsilon(sigma: float, delta0: float, calibration: str) -> float:
    if calibration == "classical":
        eps0 = math.sqrt(2.0 * math.log(1.25 / delta0)) / sigma
        if eps0 >= 1.0:
            raise ValueError(
                f"the classical Gaussian calibration gives eps_0 = {eps0:.4g} >= 1 for "
                f"noise_multiplier={sigma!r} at per-step delta_0={delta0:.3g}; the theorem "
                "(Dwork and Roth 2014, Theorem A.1) holds only for eps_0 < 1. Use "
                "ClassicAccountant(gaussian='analytic')"
            )
        return eps0
    return float(gdp_epsilon(delta0, 1.0 / sigma))


def _mechanism(leaf: Event) -> tuple[Event, float]:
    """(base mechanism, sampling probability) of a supported leaf."""
    if isinstance(leaf, PoissonSampled):
        return leaf.event, leaf.sampling_probability
    if isinstance(leaf, Shuffled):
        return leaf.event, 1.0
    return leaf, 1.0


@register("classic")
class ClassicAccountant(Accountant):
    """Per-step (epsilon, delta) guarantees composed by a classical theorem.

    Parameters
    ----------
    composition : {"basic", "advanced", "optimal"}
        The composition theorem (see the module docstring for the per-step delta split).
    gaussian : {"analytic", "classical"}
        Per-step Gaussian calibration: the exact curve (Balle and Wang 2018) or
        sqrt(2 log(1.25/delta_0))/sigma (valid only below epsilon 1; outside it ``epsilon``
        raises).

    Supported events: Laplace, Gaussian, PoissonSampled(Gaussian | Laplace),
    Shuffled(Gaussian | Laplace). ``composition="optimal"`` needs one distinct event.
    Every result is a proven upper bound (``certified`` True), but these theorems know nothing
    of the Gaussian's shape, so they are far looser than the 'rdp' or 'pld' accountants.
    """

    certified = True

    def __init__(
        self,
        composition: str = "advanced",
        *,
        gaussian: str = "analytic",
        neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    ) -> None:
        if composition not in _COMPOSITIONS:
            raise ValueError(f"composition must be one of {_COMPOSITIONS}, got {composition!r}")
        if gaussian not in _GAUSSIAN_CALIBRATIONS:
            raise ValueError(f"gaussian must be one of {_GAUSSIAN_CALIBRATIONS}, got {gaussian!r}")
        super().__init__(neighbouring=neighbouring)
        self._composition = composition
        self._gaussian = gaussian

    # ------------------------------------------------------------------ support
    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        if isinstance(leaf, (Gaussian, Laplace, PureDP)):
            return None
        if isinstance(leaf, (PoissonSampled, Shuffled)) and isinstance(leaf.event, (Gaussian, Laplace)):
            return None
        return (
            "the classical accountant maps Laplace, Gaussian, PoissonSampled(Gaussian | Laplace) "
            "and Shuffled(Gaussian | Laplace) events to per-step (epsilon, delta)"
        )

    def _unsupported_reason(self, event: Event, leaves: list[tuple[Event, int]]) -> str | None:
        reason = super()._unsupported_reason(event, leaves)
        if reason is None and self._composition == "optimal":
            distinct = set(self._counts) | {leaf for leaf, _ in leaves}
            if len(distinct) > 1:
                return (
                    "ClassicAccountant(composition='optimal') applies the homogeneous optimal "
                    f"composition theorem and needs one distinct event; got {len(distinct)} "
                    f"({', '.join(map(repr, list(distinct)[:3]))}); use composition='advanced'"
                )
        return reason

    # ------------------------------------------------------------------ per-step guarantees
    def _step(
        self, leaf: Event, delta0: float, gaussian_epsilons: dict[float, float] | None = None
    ) -> tuple[float, float]:
        """(eps_t, delta_t) of one step at per-step delta_0; a Gaussian step's eps_0 is read
        from ``gaussian_epsilons`` (noise multiplier -> eps_0 at this delta_0) where given."""
        base, q = _mechanism(leaf)
        if isinstance(base, Laplace):
            eps0, d0 = _core.reciprocal_rounded_up(base.scale), 0.0  # 1/b, never below it
        elif isinstance(base, PureDP):  # (epsilon, 0)-DP by definition
            eps0, d0 = base.epsilon, 0.0
        else:
            assert isinstance(base, Gaussian)
            sigma = base.noise_multiplier
            eps0 = (gaussian_epsilons[sigma] if gaussian_epsilons is not None
                    else _gaussian_epsilon(sigma, delta0, self._gaussian))
            d0 = delta0
        if q < 1.0:
            if math.isinf(eps0):  # log(1 + q (e^eps0 - 1)) = +inf: no privacy to amplify
                return math.inf, q * d0
            return amplify_by_subsampling(eps0, d0, q)
        return eps0, d0

    def _delta_weight(self) -> float:
        """S = sum over Gaussian-based steps of count * q (delta spent per unit of delta_0)."""
        total = 0.0
        for leaf, count in self._counts.items():
            base, q = _mechanism(leaf)
            if isinstance(base, Gaussian):
                total += count * q
        return total

    def per_step_guarantees(self, delta0: float) -> list[tuple[Event, int, float, float]]:
        """(leaf, count, eps_t, delta_t) of every composed event at per-step delta_0 in (0, 1]
        (1 only where no step spends delta)."""
        delta0 = require_probability("delta0", delta0)
        epsilons = self._gaussian_epsilons(delta0)
        return [(leaf, count, *self._step(leaf, delta0, epsilons))
                for leaf, count in self._counts.items()]

    def _gaussian_epsilons(self, delta0: float) -> dict[float, float] | None:
        """eps_0 at ``delta0`` of every distinct noise multiplier of the Gaussian steps, the
        analytic ones computed together (:func:`_analytic_epsilons`: one vectorised search,
        where a per-step schedule of a thousand noise multipliers would otherwise solve a
        thousand times at each split the composition tries); None for the classical
        calibration (a closed form per step)."""
        if self._gaussian != "analytic":
            return None
        sigmas = {base.noise_multiplier for base, _ in map(_mechanism, self._counts)
                  if isinstance(base, Gaussian)}
        return _analytic_epsilons(sorted(sigmas), delta0) if sigmas else None

    # ------------------------------------------------------------------ composition
    def _epsilon_at_split(self, delta: float, fraction: float) -> float:
        """epsilon when the fraction ``fraction`` of delta is the theorem's slack."""
        weight = self._delta_weight()
        slack = fraction * delta
        if self._composition == "optimal":
            ((leaf, count),) = self._counts.items()
            if weight > 0.0:
                # (1 - q delta_0)^k = 1 - (1 - f) delta
                step_delta = -math.expm1(math.log1p(-(1.0 - fraction) * delta) / count)
                eps_t, delta_t = self._step(leaf, step_delta / _mechanism(leaf)[1])
                delta_t = min(delta_t, step_delta)
            else:
                eps_t, delta_t = self._step(leaf, 1.0)
            if math.isinf(eps_t):  # a step without privacy (sigma below about 1e-154)
                return math.inf
            return optimal_composition_epsilon(eps_t, delta_t, count, target_delta=delta)
        delta0 = (delta - slack) / weight if weight > 0.0 else 1.0
        steps = self.per_step_guarantees(min(delta0, 1.0 - 1e-16))
        eps = np.array([s[2] for s in steps])
        dels = np.array([s[3] for s in steps]) if weight > 0.0 else np.zeros(len(steps))
        counts = [s[1] for s in steps]
        if np.isinf(eps).any():  # a step without privacy (sigma below about 1e-154)
            return math.inf
        drv, _ = extended_advanced_composition(eps, dels, delta_slack=slack, form="drv", counts=counts)
        kov, _ = extended_advanced_composition(eps, dels, delta_slack=slack, form="kov", counts=counts)
        return min(drv, kov)

    def _basic_epsilon(self, delta: float) -> float:
        weight = self._delta_weight()
        delta0 = delta / weight if weight > 0.0 else 1.0
        if delta0 >= 1.0 and weight > 0.0:
            delta0 = 1.0 - 1e-16
        # sum_t count_t eps_t exactly, then the smallest double at or above it (a sum rounded
        # to nearest can be below the exact one)
        terms = [(count, eps) for _, count, eps, _ in self.per_step_guarantees(delta0)]
        if any(math.isinf(eps) for _, eps in terms):
            return math.inf
        total = sum((count * Fraction(eps) for count, eps in terms), Fraction(0))
        return fraction_rounded_up(total)

    def _best_split(self, delta: float) -> tuple[float, float]:
        """(epsilon, fraction) minimising over the slack fraction."""
        def objective(log_odds: float) -> float:
            fraction = 1.0 / (1.0 + math.exp(-log_odds))
            try:
                value = self._epsilon_at_split(delta, fraction)
            except ValueError:  # e.g. classical calibration outside eps_0 < 1 at this split
                value = math.inf
            # a large finite stand-in keeps Brent's parabolic steps free of inf - inf
            return value if math.isfinite(value) else _INVALID + abs(log_odds)

        grid = np.linspace(-24.0, 24.0, 33)
        values = [objective(t) for t in grid]
        best = int(np.argmin(values))
        if values[best] >= _INVALID:
            # report why (re-raise the calibration error at the middle split)
            self._epsilon_at_split(delta, 0.5)
            return math.inf, 0.5
        lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
        res = minimize_scalar(objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-6})
        t = float(res.x) if res.fun <= values[best] else float(grid[best])
        return min(float(res.fun), values[best]), 1.0 / (1.0 + math.exp(-t))

    def _epsilon(self, delta: float) -> float:
        if self._composition == "basic":
            return self._basic_epsilon(delta)
        if self._delta_weight() == 0.0 and self._composition == "advanced":
            # pure-DP steps: the whole delta is slack
            return min(self._epsilon_at_split(delta, 1.0 - 1e-16), self._basic_epsilon(delta))
        eps, _ = self._best_split(delta)
        if self._composition == "advanced":
            try:
                eps = min(eps, self._basic_epsilon(delta))
            except ValueError:
                pass
        return eps

    def split(self, delta: float) -> dict[str, float]:
        """The per-step delta split used at ``delta``: the fraction f of delta left as the
        theorem's slack, ``delta_slack`` = f delta, and ``delta0``, the per-step delta of each
        Gaussian before amplification (a step sampled at rate q spends q delta0)."""
        delta = require_delta(delta)
        weight = self._delta_weight()
        if self._composition == "basic" or self.is_empty:
            return {"delta_slack": 0.0, "delta0": delta / weight if weight else 0.0, "fraction": 0.0}
        _, fraction = self._best_split(delta)
        if self._composition == "optimal" and weight:
            ((leaf, count),) = self._counts.items()
            step_delta = -math.expm1(math.log1p(-(1.0 - fraction) * delta) / count)
            delta0 = step_delta / _mechanism(leaf)[1]
        else:
            delta0 = (1.0 - fraction) * delta / weight if weight else 0.0
        return {"delta_slack": fraction * delta, "delta0": delta0, "fraction": fraction}

    def _delta(self, epsilon: float) -> float:
        # epsilon(delta) decreases in delta: bisection on log delta keeping a bracket
        # [lo, hi] with epsilon(e^hi) <= epsilon < epsilon(e^lo); the answer is e^hi, a delta
        # the bound certifies (conservative), within 1e-9 relative of the smallest one.
        def within(log_delta: float) -> bool:
            try:
                return self._epsilon(math.exp(log_delta)) <= epsilon
            except ValueError:  # e.g. classical calibration outside its range
                return False

        if self._delta_weight() == 0.0 and self._basic_epsilon(0.5) <= epsilon:
            return 0.0  # pure-DP steps: basic composition holds with delta = 0
        hi = math.log1p(-1e-12)
        if not within(hi):
            return 1.0
        lo = math.log(1e-300)
        if within(lo):
            return 1e-300  # the floor of the search, not a claim that delta is exactly this
        while hi - lo > 1e-9 * max(1.0, abs(hi)):
            mid = 0.5 * (lo + hi)
            if within(mid):
                hi = mid
            else:
                lo = mid
        return math.exp(hi)

    def _options(self) -> dict[str, Any]:
        return {"composition": self._composition, "gaussian": self._gaussian}


def paper_strong_composition_002(
    noise_multiplier: float, sampling_probability: float, steps: int, delta: float
) -> tuple[float, float]:
    """The closest reconstruction found of the strong-composition numbers of Abadi et al. 2016 (see
    the module docstring): classical calibration eps_0 = sqrt(2 log(1.25/delta_0))/sigma, the
    per-step guarantee (q eps_0, q delta_0) (NOT a valid amplification for eps_0 > 1), DRV
    composition, the split delta' = f delta, T q delta_0 = (1 - f) delta optimised over f.
    Returns (epsilon, f). For documentation and the test that pins the reconstruction only;
    it is not a privacy guarantee."""
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    q = require_probability("sampling_probability", sampling_probability)
    steps = require_count("steps", steps, minimum=1)
    delta = require_delta(delta)

    def value(fraction: float) -> float:
        slack = fraction * delta
        delta0 = (delta - slack) / (steps * q)
        eps = q * math.sqrt(2.0 * math.log(1.25 / delta0)) / sigma
        return math.sqrt(2.0 * steps * math.log(1.0 / slack)) * eps + steps * eps * math.expm1(eps)

    res = minimize_scalar(value, bounds=(1e-9, 1.0 - 1e-9), method="bounded", options={"xatol": 1e-10})
    return float(res.fun), float(res.x)

