"""The classical (epsilon, delta)-DP theorems as plain functions.

* basic composition (Dwork, Kenthapadi, McSherry, Mironov, Naor 2006; "A Tail of Two Densities" blog, Claim 10);
* advanced composition: the blog's independent / adaptive forms (Claims 14, 16, 17,
  18) and Dwork, Rothblum, Vadhan 2010 (Theorem III.3), homogeneous and with per-step
  (epsilon_t, delta_t) (the extended advanced composition of Wu et al., Lemma 2.2, which follows
  from Kairouz, Oh, Viswanath 2017 Theorem 3.5, also provided);
* the optimal homogeneous composition of Kairouz, Oh, Viswanath 2017 (Theorem 3.3), evaluated
  for any total epsilon by the exact formula of Murtagh and Vadhan 2016;
* amplification by Poisson subsampling (the blog; Li, Qardaji, Su 2012; Balle, Barthe,
  Gaboardi 2018): (epsilon, delta) -> (log(1 + q (e^epsilon - 1)), q delta);
* Gaussian calibration: the classical sigma = sqrt(2 log(1.25/delta)) / epsilon (Dwork and
  Roth 2014, Theorem A.1; valid only for epsilon < 1) and the analytic Gaussian mechanism of
  Balle and Wang 2018 (exact for every epsilon).

Every function validates its arguments (ValueError naming the argument and the range). The
composition and amplification bounds are rounded up (:mod:`dpsharp._rounding`): the returned
epsilon and delta are never below the exact value of the theorem's formula at the given doubles
(rounded to nearest, ten steps of epsilon 0.1 composed to 1.0, below the exact 1 + 5.6e-17).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp

from dpsharp._roots import settle
from dpsharp._rounding import UNIT_ROUNDOFF, fraction_rounded_up, raised, sum_rounded_up
from dpsharp._validation import (
    require_count,
    require_delta,
    require_epsilon,
    require_positive_finite,
    require_probability,
    require_real,
)
from dpsharp.tradeoff import gdp_delta, gdp_epsilon, gdp_mu_for

__all__ = [
    "ADVANCED_FORMS",
    "advanced_composition",
    "amplify_by_subsampling",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "basic_composition",
    "classical_gaussian_epsilon",
    "classical_gaussian_sigma",
    "extended_advanced_composition",
    "optimal_composition_delta",
    "optimal_composition_epsilon",
]

#: The homogeneous advanced-composition forms :func:`advanced_composition` knows.
ADVANCED_FORMS = ("drv", "independent", "adaptive", "kov")


def _require_delta_closed(value: object, name: str) -> float:
    result = require_real(name, value)
    if not 0.0 <= result < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {result!r}")
    return result


def _sequence(name: str, value: object) -> list[object]:
    """The items of a sequence argument (each is validated by the caller); a string, a bool, a
    number or None is a TypeError naming ``name``, not an iteration error."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of numbers, got {value!r}")
    return list(value)


def _pairs(epsilons: Sequence[float], deltas: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    eps = [
        require_epsilon(e, f"epsilons[{i}]") for i, e in enumerate(_sequence("epsilons", epsilons))
    ]
    dels = [
        _require_delta_closed(d, f"deltas[{i}]") for i, d in enumerate(_sequence("deltas", deltas))
    ]
    if len(eps) != len(dels):
        raise ValueError(
            f"epsilons and deltas must have the same length, got {len(eps)} and {len(dels)}"
        )
    return np.asarray(eps, dtype=float), np.asarray(dels, dtype=float)


# --------------------------------------------------------------------------- basic
def basic_composition(epsilons: Sequence[float], deltas: Sequence[float]) -> tuple[float, float]:
    """(sum_i epsilon_i, sum_i delta_i): the adaptive composition of (epsilon_i, delta_i)-DP
    mechanisms ("A Tail of Two Densities", Claim 10), each sum the smallest double at or above
    the exact sum. The delta is capped at nothing: a sum >= 1 is returned as is and means no
    guarantee."""
    eps, dels = _pairs(epsilons, deltas)
    return sum_rounded_up(eps.tolist()), sum_rounded_up(dels.tolist())


# --------------------------------------------------------------------------- advanced
def _a(epsilon: float) -> float:
    """a(eps) of "A Tail of Two Densities" (6.98): a bound on D(p||q) for eps-indistinguishable p, q."""
    return epsilon * math.expm1(epsilon) if epsilon <= math.log(2.0) else epsilon


def advanced_composition(
    epsilon: float,
    delta: float,
    steps: int,
    *,
    delta_slack: float,
    form: str = "drv",
) -> tuple[float, float]:
    """k-fold composition of an (epsilon, delta)-DP mechanism by an advanced composition
    theorem, with slack delta' = ``delta_slack``. Returns (epsilon_total, delta_total):

    * ``"drv"`` (adaptive; Dwork, Rothblum, Vadhan 2010, Theorem III.3):
      (sqrt(2k log(1/delta')) eps + k eps (e^eps - 1), k delta + delta');
    * ``"independent"`` ("A Tail of Two Densities", Claims 14 and 17, Hoeffding; independent mechanisms only):
      (k a(eps) + sqrt(2k log(1/delta')) eps, k delta + delta'),
      a(eps) = eps (e^eps - 1) if eps <= log 2 else eps;
    * ``"adaptive"`` ("A Tail of Two Densities", Claims 16 and 18, Azuma):
      (k a(eps) + sqrt(2k log(1/delta')) (eps + a(eps)), k delta + delta');
    * ``"kov"`` (adaptive; Kairouz, Oh, Viswanath 2017, Theorem 3.4):
      (min{k eps, k eps (e^eps - 1)/(e^eps + 1) + eps sqrt(2k log(e + sqrt(k eps^2)/delta')),
      k eps (e^eps - 1)/(e^eps + 1) + eps sqrt(2k log(1/delta'))}, 1 - (1 - delta)^k (1 - delta')).

    The free parameter delta' is the caller's here; :func:`advanced_composition` is used with
    it optimised by :class:`dpsharp.accountants.classic.ClassicAccountant`. Both totals are
    rounded up (k delta + delta' exactly; epsilon past its evaluation's rounding). A total
    delta >= 1 is returned as is and means no guarantee.
    """
    epsilon = require_epsilon(epsilon)
    delta = _require_delta_closed(delta, "delta")
    steps = require_count("steps", steps)
    slack = require_delta(delta_slack, "delta_slack")
    if form not in ADVANCED_FORMS:
        raise ValueError(f"form must be one of {ADVANCED_FORMS}, got {form!r}")
    k = steps
    root = math.sqrt(2.0 * k * math.log(1.0 / slack))
    if form == "drv":
        growth = math.expm1(epsilon) if epsilon < 709.0 else math.inf  # (overflows past 709.78)
        eps_total = root * epsilon + k * epsilon * growth
    elif form == "independent":
        eps_total = k * _a(epsilon) + root * epsilon
    elif form == "adaptive":
        eps_total = k * _a(epsilon) + root * (epsilon + _a(epsilon))
    else:
        return extended_advanced_composition(
            [epsilon], [delta], delta_slack=slack, form="kov", counts=[k]
        )
    # (positive terms: the value is their magnitude)
    delta_total = fraction_rounded_up(k * Fraction(delta) + Fraction(slack))
    return raised(eps_total, eps_total), delta_total


def extended_advanced_composition(
    epsilons: Sequence[float] | np.ndarray,
    deltas: Sequence[float] | np.ndarray,
    *,
    delta_slack: float,
    form: str = "drv",
    counts: Sequence[int] | None = None,
) -> tuple[float, float]:
    """Advanced composition of heterogeneous (epsilon_t, delta_t)-DP mechanisms.

    * ``"drv"``: the extended advanced composition of Wu et al. (adaptive DP-ERM), Lemma 2.2:
      (sqrt(2 log(1/delta') sum_t eps_t^2) + sum_t eps_t (e^{eps_t} - 1), sum_t delta_t + delta');
    * ``"kov"``: Kairouz, Oh, Viswanath 2017, Theorem 3.5 (from which 001 derives its lemma):
      epsilon = min{sum eps_t,
      sum eps_t (e^{eps_t}-1)/(e^{eps_t}+1) + sqrt(2 sum eps_t^2 log(e + sqrt(sum eps_t^2)/delta')),
      sum eps_t (e^{eps_t}-1)/(e^{eps_t}+1) + sqrt(2 sum eps_t^2 log(1/delta'))},
      delta = 1 - (1 - delta') prod_t (1 - delta_t).

    ``counts`` (optional) repeats the t-th pair counts[t] times without materialising it.
    Both totals are rounded up past their evaluation's rounding. A total delta >= 1 is
    returned as is and means no guarantee.
    """
    eps, dels = _pairs(epsilons, deltas)
    slack = require_delta(delta_slack, "delta_slack")
    if counts is None:
        reps = np.ones(len(eps))
    else:
        reps_list = [
            require_count(f"counts[{i}]", c) for i, c in enumerate(_sequence("counts", counts))
        ]
        if len(reps_list) != len(eps):
            raise ValueError("counts must have the same length as epsilons")
        reps = np.asarray(reps_list, dtype=float)
    # Every term below is non-negative, so a total is its own magnitude for raised(): a few
    # roundings per term (a product, expm1, tanh, log, sqrt) stay well inside its 8 units.
    sum_sq = math.fsum(reps * eps * eps)
    log_inv = math.log(1.0 / slack)
    if form == "drv":
        with np.errstate(over="ignore"):  # e^eps overflows past 709.78: +inf, as it should be
            linear = math.fsum(reps * eps * np.expm1(eps))
        eps_total = math.sqrt(2.0 * log_inv * sum_sq) + linear
        return raised(eps_total, eps_total), _weighted_sum_rounded_up(reps, dels, slack)
    if form != "kov":
        raise ValueError(f"form must be 'drv' or 'kov', got {form!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        tanh_half = np.where(eps > 700.0, 1.0, np.tanh(eps / 2.0))  # (e^x - 1)/(e^x + 1)
    linear = math.fsum(reps * eps * tanh_half)
    candidates = [
        linear + math.sqrt(2.0 * sum_sq * math.log(math.e + math.sqrt(sum_sq) / slack)),
        linear + math.sqrt(2.0 * sum_sq * log_inv),
    ]
    basic = _weighted_sum_rounded_up(reps, eps, 0.0)  # sum eps_t, the first candidate
    log_keep = math.log1p(-slack) + math.fsum(reps * np.log1p(-dels))
    # 1 - e^x with x = log_keep <= 0 moves by at most |error of x|, a few roundings of |x|, and
    # is itself at most |x|: 8 units of roundoff of |x| cover both
    delta_total = raised(-math.expm1(log_keep), -log_keep)
    return min(basic, raised(min(candidates), min(candidates))), delta_total


def _weighted_sum_rounded_up(counts: np.ndarray, values: np.ndarray, extra: float) -> float:
    """A double >= sum_t counts[t] values[t] + extra for non-negative doubles: exact (the
    smallest such double) where every count is 1; otherwise raised past the products'
    roundings (each at most one unit of roundoff of it, or half the smallest subnormal, well
    inside what :func:`~dpsharp._rounding.raised` adds for the magnitude given it)."""
    products = counts * values
    total = sum_rounded_up([*products.tolist(), extra])
    if np.all(counts == 1.0) or not math.isfinite(total):
        return total
    return raised(total, total + len(products) * 2.0**-1074 / UNIT_ROUNDOFF)


# --------------------------------------------------------------------------- optimal (KOV)
def _kov_log_delta0(epsilon: float, steps: int, eps_total: float, *, upper: bool = False) -> float:
    """log of delta_0(eps') = (1+e^eps)^-k sum_l C(k,l) [e^{(k-l) eps} - e^{eps'} e^{l eps}]_+
    (Kairouz, Oh, Viswanath 2017 Theorem 3.3; Murtagh and Vadhan 2016 for every eps').

    Term l is e^{(k-l) eps} (1 - e^{-g_l}) with g_l = (k - 2l) eps - eps'. With ``upper`` the
    value is an upper bound despite rounding: each g_l is raised by its rounding, 2 units of
    roundoff of |k - 2l| eps + eps' (a term next to a loss atom, g_l near 0, has its relative
    error magnified by 1/g_l: the settled epsilon's delta read 5e-10 relative above its target
    at eps = 0.1, k = 5, delta = 1e-10), and the logarithm by 8 units of roundoff of its terms'
    magnitudes (the log-gamma values, the sums)."""
    k = steps
    l = np.arange(k + 1, dtype=float)
    gap = (k - 2.0 * l) * epsilon - eps_total  # positive where the term is positive
    if upper:
        gap = gap + 2.0 * UNIT_ROUNDOFF * (np.abs(k - 2.0 * l) * epsilon + eps_total) + 1e-300
    keep = gap > 0.0
    if not np.any(keep):
        return -math.inf
    l = l[keep]
    gap = gap[keep]
    log_binom = gammaln(k + 1.0) - gammaln(l + 1.0) - gammaln(k - l + 1.0)
    with np.errstate(divide="ignore"):
        log_diff = np.where(gap > math.log(2.0), np.log1p(-np.exp(-gap)), np.log(-np.expm1(-gap)))
    log_terms = log_binom + (k - l) * epsilon + log_diff
    log_norm = k * np.logaddexp(0.0, epsilon)
    value = float(logsumexp(log_terms) - log_norm)
    if not upper:
        return value
    magnitude = float(np.max(gammaln(k + 1.0) + np.abs(log_terms))) + abs(log_norm)
    return value + 8.0 * UNIT_ROUNDOFF * magnitude


def optimal_composition_delta(epsilon: float, delta: float, steps: int, epsilon_total: float) -> float:
    """The exact delta of the k-fold adaptive composition of (epsilon, delta)-DP mechanisms at
    total epsilon ``epsilon_total`` (Kairouz, Oh, Viswanath 2017, Theorem 3.3, in the form for
    arbitrary epsilon_total of Murtagh and Vadhan 2016):

        delta_total = 1 - (1 - delta)^k (1 - delta_0(epsilon_total)),
        delta_0(e') = (1 + e^eps)^-k sum_{l=0}^{k} C(k, l) max(0, e^{(k-l) eps} - e^{e'} e^{l eps}).

    Optimal: no composition theorem over per-step (epsilon, delta) guarantees can do better.
    Evaluated in log space (k up to ~10^7 costs O(k)), with delta_0 raised past the rounding of
    its evaluation (see ``_kov_log_delta0``), so the value is never below the exact one.
    """
    epsilon = require_epsilon(epsilon)
    delta = _require_delta_closed(delta, "delta")
    steps = require_count("steps", steps)
    epsilon_total = require_epsilon(epsilon_total, "epsilon_total")
    if steps == 0:
        return 0.0
    log_d0 = _kov_log_delta0(epsilon, steps, epsilon_total, upper=True)
    if log_d0 >= 0.0:
        return 1.0  # delta_0 rounds to 1 (it is at most 1): so does the total
    log_keep = steps * math.log1p(-delta) + (math.log1p(-math.exp(log_d0)) if log_d0 > -math.inf else 0.0)
    return -math.expm1(log_keep)


def optimal_composition_epsilon(epsilon: float, delta: float, steps: int, *, target_delta: float) -> float:
    """The smallest total epsilon with k-fold composition of (epsilon, delta)-DP being
    (epsilon_total, target_delta)-DP by the optimal composition theorem (Kairouz, Oh, Viswanath
    2017); +inf when target_delta <= 1 - (1 - delta)^k (unreachable). Found with Brent's method
    on log delta_0 and rounded up (the returned epsilon satisfies the target)."""
    epsilon = require_epsilon(epsilon)
    delta = _require_delta_closed(delta, "delta")
    steps = require_count("steps", steps)
    target = require_delta(target_delta, "target_delta")
    if steps == 0:
        return 0.0
    keep_steps = steps * math.log1p(-delta)
    room = -math.expm1(math.log1p(-target) - keep_steps)  # delta_0 must be <= room
    if room <= 0.0:
        return math.inf
    if not math.isfinite(2.0 * steps * epsilon):  # k epsilon (the basic bound) overflows
        return math.inf
    log_room = math.log(room)

    def gap(eps_total: float) -> float:
        value = _kov_log_delta0(epsilon, steps, eps_total)
        return max(value, -1e4) - log_room

    def safe(eps_total: float) -> bool:  # delta_0 <= room despite the evaluation's rounding
        return _kov_log_delta0(epsilon, steps, eps_total, upper=True) <= log_room

    hi = steps * epsilon
    if safe(0.0):
        return 0.0
    if not safe(hi):  # (next to hi's own rounding: the next doubles up are checked)
        hi = settle(safe, hi, math.nextafter(hi * (1.0 + 2.0**-40), math.inf))
    if gap(0.0) <= 0.0:  # (0 is within the evaluation's rounding of the target: no sign change)
        return settle(safe, 0.0, hi)
    root = brentq(gap, 0.0, hi, xtol=1e-300, rtol=1e-14, maxiter=500)
    # a point where delta_0(eps) <= room (never an epsilon too small); safe(hi) holds (all
    # steps' epsilons added: delta_0 = 0)
    return float(root) if safe(float(root)) else settle(safe, float(root), hi)


# --------------------------------------------------------------------------- amplification
def amplify_by_subsampling(epsilon: float, delta: float, sampling_probability: float) -> tuple[float, float]:
    """(log(1 + q (e^eps - 1)), q delta): an (eps, delta)-DP mechanism run on a Poisson
    subsample with rate q ("A Tail of Two Densities", "privacy amplification by subsampling"; Li, Qardaji, Su
    2012; tight under add/remove, Balle, Barthe, Gaboardi 2018). Both rounded up (q delta
    exactly)."""
    epsilon = require_epsilon(epsilon)
    delta = _require_delta_closed(delta, "delta")
    q = require_probability("sampling_probability", sampling_probability)
    if q == 1.0:
        return epsilon, delta  # no subsampling: the guarantee itself
    # q delta rounded up exactly: a product below the smallest subnormal is that subnormal, not
    # 0 (which would claim pure DP)
    amplified_delta = fraction_rounded_up(Fraction(q) * Fraction(delta))
    if epsilon > 700.0:  # e^eps - 1 may overflow: eps + log(q + (1 - q) e^-eps)
        log_term = math.log(q + (1.0 - q) * math.exp(-epsilon))
        # (the two terms cancel where q e^eps is small: their magnitudes bound the rounding;
        # below 700 the direct form has no cancellation)
        return raised(epsilon + log_term, epsilon - log_term), amplified_delta
    amplified = math.log1p(q * math.expm1(epsilon))
    return raised(amplified, amplified), amplified_delta


# --------------------------------------------------------------------------- Gaussian
_CLASSICAL_RANGE = (
    "the classical Gaussian calibration sigma = sqrt(2 log(1.25/delta))/epsilon is proven only "
    "for epsilon < 1 (Dwork and Roth 2014, Theorem A.1)"
)


def classical_gaussian_sigma(epsilon: float, delta: float, *, allow_epsilon_above_one: bool = False) -> float:
    """sigma = sqrt(2 log(1.25/delta)) / epsilon (Dwork and Roth 2014, Theorem A.1; "A Tail of Two
    Densities", Claim 9; Abadi et al. 2016, Section 3.1). The theorem holds for epsilon < 1 only: larger epsilon
    raises ValueError unless ``allow_epsilon_above_one`` (then the number is a heuristic, not a
    guarantee; use :func:`analytic_gaussian_sigma`, which is exact for every epsilon)."""
    epsilon = require_positive_finite("epsilon", epsilon)
    delta = require_delta(delta)
    if epsilon >= 1.0 and not allow_epsilon_above_one:
        raise ValueError(f"epsilon must be in (0, 1) for this formula, got {epsilon!r}: {_CLASSICAL_RANGE}; use analytic_gaussian_sigma")
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def classical_gaussian_epsilon(noise_multiplier: float, delta: float, *, allow_epsilon_above_one: bool = False) -> float:
    """epsilon = sqrt(2 log(1.25/delta)) / sigma, the inverse of :func:`classical_gaussian_sigma`
    (sigma = 6, delta = 1e-5 gives 0.808, Yu et al. 2019). Raises ValueError when the result is >= 1
    (outside the theorem) unless ``allow_epsilon_above_one``."""
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    delta = require_delta(delta)
    epsilon = math.sqrt(2.0 * math.log(1.25 / delta)) / sigma
    if epsilon >= 1.0 and not allow_epsilon_above_one:
        raise ValueError(
            f"noise_multiplier={sigma!r} at delta={delta!r} gives epsilon={epsilon:.6g} >= 1, "
            f"outside the classical theorem: {_CLASSICAL_RANGE}; use analytic_gaussian_epsilon"
        )
    return epsilon


def analytic_gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """The exact delta(epsilon) of the Gaussian mechanism with noise multiplier sigma (Balle and
    Wang 2018, Theorem 8): Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma),
    i.e. :func:`dpsharp.tradeoff.gdp_delta` at mu = 1/sigma."""
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    return float(gdp_delta(require_epsilon(epsilon), 1.0 / sigma))


def analytic_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The exact (smallest) epsilon of the Gaussian mechanism at delta (Balle and Wang 2018)."""
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    return float(gdp_epsilon(require_delta(delta), 1.0 / sigma))


def analytic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """The analytic Gaussian mechanism (Balle and Wang 2018): the smallest noise multiplier whose
    Gaussian mechanism is (epsilon, delta)-DP, for every epsilon > 0. Solved with Brent's method
    on the exact delta (rounded up: the returned sigma satisfies the target)."""
    mu = gdp_mu_for(require_positive_finite("epsilon", epsilon), require_delta(delta))
    # 1 / mu rounds either way; gdp_mu_for kept a margin below the target, and the delta at the
    # rounded sigma is checked against the target itself
    sigma = 1.0 / mu
    while float(gdp_delta(epsilon, 1.0 / sigma)) > delta:  # (at most a few doubles)
        sigma = float(np.nextafter(sigma, math.inf))
    return sigma
