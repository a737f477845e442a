"""Trade-off functions (f-DP) and Gaussian differential privacy.

A mechanism is f-DP when testing "D" against "D'" from its output has type-II error at least
f(alpha) at type-I error alpha (Dong, Roth, Su 2019; Bu, Dong, Long, Su 2020). The
Gaussian trade-off function

    G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)

is the curve of testing N(0, 1) against N(mu, 1); a mechanism is mu-GDP when it is G_mu-DP.
mu-GDP is equivalent to (epsilon, delta(epsilon))-DP for every epsilon >= 0 with (Corollary
2.13 of Dong, Roth, Su; eq. (3.2) of Bu et al. 2020)

    delta(epsilon; mu) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2).

Numerics. With a = -epsilon/mu + mu/2 and b = a - mu one has e^epsilon phi(b) = phi(a), so

    delta = phi(a) (R(a) - R(b)),    R(x) = Phi(x) / phi(x) = sqrt(pi/2) erfcx(-x / sqrt 2),

the Mills-ratio form. For a < 0 (the small-delta regime) this is evaluated in log space from
``scipy.special.erfcx``, whose logarithms are O(log |a|), so the subtraction R(a) - R(b) loses
only about log|a| * |a| / mu ulps instead of the a^2 / 2 of subtracting two ``log_ndtr``
values; delta is accurate to ~1e-12 relative down to 1e-300 and for mu up to 50 and beyond.
For a >= 0 delta > 0.3 min(mu, 1) and the direct ``log_ndtr`` form is exact enough. Every
function here is vectorised over NumPy arrays (broadcasting) and validates its inputs first.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import erfcx, log_ndtr, ndtr, ndtri, ndtri_exp

from dpsharp._roots import settle
from dpsharp._validation import require_delta, require_positive_finite, require_real_array

__all__ = [
    "eps_delta_tradeoff",
    "gaussian_tradeoff",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_log_delta",
    "gdp_mu_for",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_HALF_LOG_PI_OVER_2 = 0.5 * math.log(math.pi / 2.0)
_SQRT_HALF = math.sqrt(0.5)
_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)


# --------------------------------------------------------------------------- validation
def _require_range(
    name: str, value: Any, low: float, high: float, *, low_open: bool, high_open: bool
) -> np.ndarray:
    """``value`` as a float array, every entry finite and in the stated interval.

    Real numbers only (``dpsharp._validation``): a bool, a string or an array of either is a
    TypeError, never read as 1.0 or parsed."""
    array = require_real_array(name, value)
    bad_low = array <= low if low_open else array < low
    bad_high = array >= high if high_open else array > high
    if np.any(bad_low | bad_high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        offending = array[bad_low | bad_high].ravel()[0]
        raise ValueError(f"{name} must be in {interval}, got {offending!r}")
    return array


def _result(array: np.ndarray) -> Any:
    return float(array) if array.ndim == 0 else array


# --------------------------------------------------------------------------- curves
def gaussian_tradeoff(alpha: Any, mu: Any) -> Any:
    """The Gaussian trade-off function G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu).

    Dong, Roth, Su 2019, Definition 2.7; Bu et al. 2020, eq. (2.2). Evaluated as
    ``ndtr(-ndtri(alpha) - mu)`` so that tiny alpha keeps full precision.

    Parameters
    ----------
    alpha : float or array in [0, 1]
        Type-I error.
    mu : float or array in [0, inf)
        GDP parameter (mu = 0 gives the perfectly private curve 1 - alpha).
    """
    alpha_arr = _require_range("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False)
    mu_arr = _require_range("mu", mu, 0.0, math.inf, low_open=False, high_open=True)
    with np.errstate(over="ignore", divide="ignore"):
        out = ndtr(-ndtri(alpha_arr) - mu_arr)
    return _result(np.asarray(out, dtype=float))


def eps_delta_tradeoff(alpha: Any, epsilon: Any, delta: Any) -> Any:
    """The trade-off function of (epsilon, delta)-DP (Wasserman and Zhou 2010; Kairouz, Oh,
    Viswanath 2017; Dong, Roth, Su 2019, eq. (5)):

        f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)).

    Parameters
    ----------
    alpha : float or array in [0, 1]
    epsilon : float or array in [0, inf)
    delta : float or array in [0, 1]
    """
    alpha_arr = _require_range("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False)
    eps_arr = _require_range("epsilon", epsilon, 0.0, math.inf, low_open=False, high_open=True)
    delta_arr = _require_range("delta", delta, 0.0, 1.0, low_open=False, high_open=False)
    with np.errstate(over="ignore", invalid="ignore"):
        first = 1.0 - delta_arr - np.exp(eps_arr) * alpha_arr
        second = np.exp(-eps_arr) * (1.0 - delta_arr - alpha_arr)
    first = np.where(alpha_arr == 0.0, 1.0 - delta_arr, first)  # e^eps * 0 when e^eps = inf
    out = np.maximum(0.0, np.maximum(first, second))
    return _result(np.asarray(out, dtype=float))


# --------------------------------------------------------------------------- GDP <-> (eps, delta)
def _log_mills(x: np.ndarray) -> np.ndarray:
    """log R(x) = log(Phi(x) / phi(x)) for x <= 0 (finite for every such x)."""
    return _HALF_LOG_PI_OVER_2 + np.log(erfcx(-x * _SQRT_HALF))


def _mills_rate(x: np.ndarray) -> np.ndarray:
    """(log R)'(x) = 1 / R(x) + x, R = Phi / phi (R' = 1 + x R); 1 / R -> 0 where R overflows
    (x > 37)."""
    with np.errstate(over="ignore"):
        ratio = _SQRT_HALF_PI * erfcx(-x * _SQRT_HALF)
    return 1.0 / ratio + x


# Gauss-Legendre nodes and weights on [-1, 1] for the integral of (log R)' below.
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(10)
# Below this mu the drop log R(a - mu) - log R(a) is integrated, above it differenced.
_DROP_BY_QUADRATURE = 0.5


def _log_mills_drop(a: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """D = log R(a - mu) - log R(a) <= 0, R = Phi / phi the Mills ratio.

    Differencing the two logarithms loses the digits their common part holds: an absolute
    error of a few ulp of log R against a drop of size mu (1/R(a) + a), so about 1e-16 / mu
    relative (2.6e-9 at mu = 1e-6, measured against mpmath). For mu <= 1/2 the drop is the
    integral -int_{a - mu}^{a} (1/R(x) + x) dx instead, by 10-point Gauss-Legendre
    quadrature of the analytic integrand, whose relative error stays near the integrand's."""
    out = np.empty(a.shape, dtype=float)
    small = mu <= _DROP_BY_QUADRATURE
    if np.any(small):
        a_s, m_s = a[small], mu[small]
        half = m_s / 2.0
        nodes = (a_s - half)[:, None] + half[:, None] * _GL_NODES[None, :]
        rates = _mills_rate(nodes)
        # The weighted sum node by node, in order (a matrix product's summation order can
        # depend on the number of rows, and an entry should not depend on its neighbours).
        total = np.zeros(a_s.shape)
        for node, weight in enumerate(_GL_WEIGHTS):
            total += weight * rates[:, node]
        out[small] = -half * total
    large = ~small
    if np.any(large):
        a_l, m_l = a[large], mu[large]
        out[large] = _log_mills(a_l - m_l) - _log_mills(a_l)
    return out


def _log_delta_margin(log_delta: Any, mu: Any) -> Any:
    """How far below log(target) the evaluated log delta must be for the answer to count as
    on the safe side: 2^-40 plus 8 ulp of |log delta|, plus 16 ulp of mu times
    (sqrt(2 |log delta|) + 2). The evaluation of log delta(eps; mu) (:func:`_log_mills_drop`)
    was measured within 2.9e-13 of 60-digit mpmath over mu from 1e-8 to 30 (the rounding of
    -a^2 / 2 near log delta = -450 dominates). For large mu, a = mu / 2 - eps / mu is a
    difference of two terms about mu / 2 each, so it errs by about 2^-52 mu, and log delta,
    whose slope in a is about |a| <= sqrt(2 |log delta|) + 2, by |a| times that: 4e-11 of a
    log delta of -11.5 at mu = 1e5, past the first two terms (checked against 150-digit
    mpmath up to mu = 1e6). The margin moves epsilon by about 1e-12 relative."""
    return (2.0**-40 + 8.0 * 2.0**-52 * abs(log_delta)
            + 16.0 * 2.0**-52 * mu * (np.sqrt(2.0 * abs(log_delta)) + 2.0))


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 - e^x) for x <= 0 (Maechler 2012)."""
    with np.errstate(divide="ignore"):
        return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def _gdp_log_delta(eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
    eps, mu = np.broadcast_arrays(eps, mu)
    a = -eps / mu + mu / 2.0
    # delta = Phi(a) - e^eps Phi(a - mu) = Phi(a) (1 - R(a - mu) / R(a)), as
    # e^eps phi(a - mu) = phi(a): log delta = log Phi(a) + log(1 - e^D) (_log_mills_drop)
    out = np.empty(a.shape, dtype=float)
    drop = np.minimum(_log_mills_drop(a, mu), 0.0)
    neg = a < 0.0
    if np.any(neg):
        an = a[neg]
        log_phi_a = -0.5 * an * an - _LOG_SQRT_2PI
        out[neg] = log_phi_a + _log_mills(an) + _log1mexp(drop[neg])
    pos = ~neg
    if np.any(pos):
        out[pos] = log_ndtr(a[pos]) + _log1mexp(drop[pos])
    return out


def gdp_log_delta(epsilon: Any, mu: Any) -> Any:
    """log delta(epsilon; mu) of mu-GDP (see :func:`gdp_delta`), finite where delta underflows."""
    eps_arr = _require_range("epsilon", epsilon, 0.0, math.inf, low_open=False, high_open=True)
    mu_arr = _require_range("mu", mu, 0.0, math.inf, low_open=True, high_open=True)
    return _result(_gdp_log_delta(eps_arr, mu_arr))


def gdp_delta(epsilon: Any, mu: Any) -> Any:
    """The delta of mu-GDP at epsilon: the smallest delta with mu-GDP => (epsilon, delta)-DP.

    delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    (Dong, Roth, Su 2019, Corollary 2.13; Bu et al. 2020, eq. (3.2)). For mu = 1/sigma this is also
    the exact delta(eps) of the Gaussian mechanism with noise multiplier sigma (Balle and Wang
    2018, Theorem 8). Computed in log space (module docstring): no catastrophic cancellation;
    raised by the evaluation's margin (:func:`_log_delta_margin`, about 1e-12 relative), so that
    it is never below the exact value (it read up to 6e-12 relative below 60-digit mpmath).

    Parameters
    ----------
    epsilon : float or array in [0, inf)
    mu : float or array in (0, inf)
    """
    log_delta = np.asarray(gdp_log_delta(epsilon, mu), dtype=float)
    mu_arr = np.broadcast_to(np.asarray(mu, dtype=float), log_delta.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        raised = np.where(np.isfinite(log_delta),
                          log_delta + _log_delta_margin(log_delta, mu_arr), log_delta)
        return _result(np.minimum(np.exp(raised), 1.0))


#: Evaluations of :func:`_gdp_epsilons` that try regula falsi before plain halving.
_FALSI_STEPS = 12


def _gdp_epsilons(log_delta: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Elementwise, the smallest double epsilon >= 0 whose evaluated log delta(epsilon; mu) is
    below ``log_delta`` by the evaluation's margin (:func:`_log_delta_margin`), for 1-D arrays
    of one length. A bracketed search on the bit patterns of the doubles (ordered like the
    values for non-negative doubles), every element at once, from 0 (where delta is too large,
    unless 0 itself is safe) and eps_hi = mu^2/2 - mu Phi^-1(delta) (where delta(eps_hi) <=
    Phi(-eps_hi / mu + mu / 2) = delta; doubled while rounding puts it on the wrong side) until
    the two ends are adjacent doubles: regula falsi steps, then halvings, some 20 to 60
    vectorised evaluations whatever the number of elements, where a root finder per element
    costs as many for each one (a schedule of a thousand distinct noise multipliers asks for a
    thousand at once)."""
    margin = _log_delta_margin(log_delta, mu)  # (elementwise)

    def safe(eps: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return _gdp_log_delta(eps, mu[rows]) - log_delta[rows] <= -margin[rows]

    out = np.zeros(log_delta.shape)
    with np.errstate(all="ignore"):  # (a mu whose square overflows: handled below)
        rows = np.flatnonzero(~safe(np.zeros(log_delta.shape), np.arange(log_delta.size)))
    if rows.size == 0:
        return out
    with np.errstate(over="ignore"):
        high = np.maximum(mu[rows] * mu[rows] / 2.0 - mu[rows] * ndtri_exp(log_delta[rows]),
                          1e-300)
    for _ in range(2100):
        with np.errstate(all="ignore"):
            wrong = ~safe(high, rows) & np.isfinite(high)
        if not wrong.any():
            break
        with np.errstate(over="ignore"):
            high[wrong] *= 2.0
    else:  # pragma: no cover - delta(eps) -> 0 as eps grows: some doubling gets there
        raise RuntimeError("gdp_epsilon: no safe upper end found")
    # No double epsilon is safe where the upper end overflowed (mu above about 1e154, a noise
    # multiplier below 1e-154): epsilon is +inf there.
    beyond = ~np.isfinite(high)
    out[rows[beyond]] = math.inf
    rows, high = rows[~beyond], high[~beyond]
    if rows.size == 0:
        return out
    mu_rows = mu[rows]
    # The bracket [low, high] (low unsafe, high safe) narrows by regula falsi on
    # f = gap + margin (Illinois' variant: the end kept twice has its f halved) for the first
    # _FALSI_STEPS evaluations, then by halving the bit distance; every evaluated point joins the
    # side it is found on, so the bracket stays valid whatever the steps propose.
    low_bits = np.zeros(rows.size, dtype=np.int64)  # 0.0, where delta is too large
    high_bits = high.view(np.int64).copy()
    f_low = _gdp_log_delta(np.zeros(rows.size), mu_rows) - log_delta[rows] + margin[rows]
    f_high = _gdp_log_delta(high, mu_rows) - log_delta[rows] + margin[rows]
    kept = np.zeros(rows.size, dtype=np.int64)  # +1: low kept last time, -1: high kept
    for step in itertools.count():
        apart = np.flatnonzero(high_bits - low_bits > 1)
        if apart.size == 0:
            break
        low_a, high_a = low_bits[apart], high_bits[apart]
        middle_bits = low_a + (high_a - low_a) // 2
        if step < _FALSI_STEPS:
            low_x, high_x = low_a.view(np.float64), high_a.view(np.float64)
            f_lo, f_hi = f_low[apart], f_high[apart]
            with np.errstate(all="ignore"):
                proposal = high_x - f_hi * (high_x - low_x) / (f_hi - f_lo)
            proposal_bits = np.where(np.isfinite(proposal), np.maximum(proposal, 0.0),
                                     0.0).view(np.int64)
            inside = (proposal_bits > low_a) & (proposal_bits < high_a)
            middle_bits = np.where(inside, proposal_bits, middle_bits)
        middle = middle_bits.view(np.float64)
        f_middle = _gdp_log_delta(middle, mu[rows[apart]]) - log_delta[rows[apart]] + margin[
            rows[apart]]
        ok = f_middle <= 0.0
        high_bits[apart] = np.where(ok, middle_bits, high_a)
        low_bits[apart] = np.where(ok, low_a, middle_bits)
        was = kept[apart]
        # Illinois: the end that stays for the second time in a row has its f halved
        f_high[apart] = np.where(ok, f_middle, np.where(was == -1, 0.5 * f_high[apart],
                                                        f_high[apart]))
        f_low[apart] = np.where(ok, np.where(was == 1, 0.5 * f_low[apart], f_low[apart]),
                                f_middle)
        kept[apart] = np.where(ok, 1, -1)
    out[rows] = high_bits.view(np.float64)
    return out


def gdp_epsilon(delta: Any, mu: Any) -> Any:
    """The smallest epsilon with mu-GDP => (epsilon, delta)-DP: the inverse of
    :func:`gdp_delta` in epsilon (0.0 when delta >= delta(0; mu) = 2 Phi(mu/2) - 1).

    The smallest double at which the evaluated log delta is below log(delta) by a margin that
    covers the evaluation's error (:func:`_log_delta_margin`), found by bisection, every entry
    of an array at once (:func:`_gdp_epsilons`): the returned epsilon satisfies
    delta(epsilon; mu) <= delta (rounded up, never down).

    Parameters
    ----------
    delta : float or array in (0, 1)
    mu : float or array in (0, inf)
    """
    delta_arr = _require_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    mu_arr = _require_range("mu", mu, 0.0, math.inf, low_open=True, high_open=True)
    d_b, m_b = np.broadcast_arrays(delta_arr, mu_arr)
    flat = _gdp_epsilons(np.log(d_b.ravel()), np.ascontiguousarray(m_b.ravel(), dtype=float))
    return _result(flat.reshape(d_b.shape))


def gdp_mu_for(epsilon: float, delta: float) -> float:
    """The largest mu such that mu-GDP implies (epsilon, delta)-DP: the root in mu of
    delta(epsilon; mu) = delta (delta(eps; mu) increases with mu).

    With mu = 1/sigma this is the analytic Gaussian mechanism's calibration (Balle and Wang
    2018): the smallest noise multiplier 1/mu whose Gaussian mechanism is (epsilon, delta)-DP.
    The result is rounded down, so delta(epsilon; result) <= delta.
    """
    eps = require_positive_finite("epsilon", epsilon)
    log_target = math.log(require_delta(delta))

    def gap(log_mu: float) -> float:
        return float(_gdp_log_delta(np.array(eps), np.array(math.exp(log_mu)))) - log_target

    lo, hi = -1.0, 1.0
    while gap(lo) > 0.0:
        lo -= 2.0
        if lo < -700:
            raise ValueError(f"no mu > 0 reaches delta={delta!r} at epsilon={epsilon!r}")
    while gap(hi) < 0.0:
        hi += 2.0
        if hi > 700:  # pragma: no cover - delta < 1 is always reached by a finite mu
            raise ValueError(f"no finite mu reaches delta={delta!r} at epsilon={epsilon!r}")
    log_mu = brentq(gap, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    def safe(mu: float) -> bool:
        margin = _log_delta_margin(log_target, mu)
        return float(_gdp_log_delta(np.array(eps), np.array(mu))) - log_target <= -margin

    mu = math.exp(log_mu)
    return mu if safe(mu) else settle(safe, mu, math.exp(lo))
