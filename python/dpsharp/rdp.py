"""Renyi differential privacy (RDP) curves and their conversion to (epsilon, delta).

A mechanism M is (alpha, D)-RDP if D_alpha(M(X) || M(X')) <= D for all neighbouring X, X'
(Mironov 2017, "Renyi differential privacy"). RDP composes by adding curves order by order,
and converts to (epsilon, delta)-DP at the best order. Every function here evaluates a curve at
an array of real orders alpha > 1 in dpsharp's compiled core (log space, no fast-math) and
returns a NumPy array.

Precision. :func:`poisson_gaussian_rdp` is accurate to a relative error below 1e-10 (measured
against mpmath at 50 digits over q in [1e-6, 1], sigma in [0.3, 1000], alpha in (1, 1e4], see
tests/test_rdp_precision.py, and at integer orders 1e5 and 4e5 in its slow tests). Where the
core cannot certify that precision it returns +inf, a valid (useless) bound, never a smaller
number. At integer orders the binomial sum of Mironov, Talwar and Zhang (2019) is taken with
Loader's (2000) saddle-point form of the binomial probabilities and rounded up by a bound on its
rounding error (about 1e-12 relative at order 1e6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsharp._native import core as _core
from dpsharp._validation import (
    require_delta,
    require_epsilon,
    require_positive_finite,
    require_probability,
    require_real_array,
)

__all__ = [
    "DEFAULT_ORDERS",
    "MAX_ORDER",
    "delta_from_rdp",
    "epsilon_from_rdp",
    "gaussian_rdp",
    "laplace_rdp",
    "poisson_gaussian_rdp",
    "sampled_without_replacement_gaussian_rdp",
]

OrdersLike = float | Sequence[float] | npt.NDArray[np.floating]
Conversion = Literal["tight", "classic"]

#: Largest order accepted (the integer-order sum costs O(alpha)).
MAX_ORDER = 1e6

#: Default orders of :class:`dpsharp.RDPAccountant` (203 orders). Every tenth in [1.1, 10.9]
#: and every quarter in [1.25, 8] (large epsilon: the optimal order is small and the answer is
#: sensitive to the grid there), 1.05 (epsilon in the hundreds), every half in [11, 20], every
#: integer in [21, 64], then roughly geometric up to 10^4 (small epsilon / large noise: the
#: optimal order grows like sqrt(log(1/delta)) / (q ...)). A superset of the default orders of
#: Opacus (1.1..10.9 by 0.1, 12..63), so this grid is never the looser one. An accountant
#: evaluates only the orders its answer needs (:func:`search_orders`), so the length costs
#: little.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    sorted(
        {1.05}
        | {1 + x / 10.0 for x in range(1, 100)}  # 1.1 ... 10.9
        | {1.25 + 0.25 * i for i in range(28)}  # 1.25 ... 8.0
        | {11.0 + 0.5 * i for i in range(19)}  # 11.0 ... 20.0
        | {float(v) for v in range(21, 65)}
        | {72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0, 320.0, 384.0, 448.0}
        | {512.0, 640.0, 768.0, 1024.0, 1280.0, 1536.0, 2048.0, 2560.0, 3072.0, 4096.0}
        | {5120.0, 6144.0, 8192.0, 10000.0}
    )
)

_DEFAULT_ORDER_ARRAY = np.array(DEFAULT_ORDERS, dtype=np.float64)

_CONVERSIONS = {"classic": 0, "tight": 1}


def validate_orders(orders: OrdersLike, name: str = "orders") -> npt.NDArray[np.float64]:
    """``orders`` as a 1-d float64 array of finite values in (1, MAX_ORDER]: TypeError for
    anything but real numbers (a bool, a string, an array of either), ValueError if not."""
    if orders is DEFAULT_ORDERS:
        return _DEFAULT_ORDER_ARRAY.copy()
    array = np.array(require_real_array(name, orders), ndmin=1)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence of orders in (1, {MAX_ORDER:g}]")
    bad = ~np.isfinite(array) | (array <= 1.0) | (array > MAX_ORDER)
    if bad.any():
        raise ValueError(
            f"{name} must be finite and in (1, {MAX_ORDER:g}], got {array[bad][0]!r}"
        )
    return array


def validate_conversion(conversion: str) -> Conversion:
    if conversion not in _CONVERSIONS:
        raise ValueError(f"conversion must be 'tight' or 'classic', got {conversion!r}")
    return conversion  # type: ignore[return-value]


def poisson_gaussian_rdp(
    sampling_probability: float, noise_multiplier: float, orders: OrdersLike
) -> npt.NDArray[np.float64]:
    """RDP of the Poisson-subsampled Gaussian mechanism under add/remove one.

    D_alpha = log(A_alpha) / (alpha - 1) with
    A_alpha = E_{z ~ N(0, sigma^2)}[(1 - q + q exp((2z - 1)/(2 sigma^2)))^alpha]
    (Mironov, Talwar, Zhang 2019, "Renyi differential privacy of the sampled Gaussian
    mechanism"; the log moment of Abadi et al. 2016 is lambda * D_{lambda+1}). Integer orders are
    summed by the binomial expansion and fractional ones integrated by the trapezoidal rule on
    the whole line (geometric convergence for an integrand analytic in a strip: Trefethen and
    Weideman 2014), or adaptive Gauss-Kronrod quadrature where that rule does not settle, both
    for A - 1 as a sum/integral of non-negative terms, so tiny divergences keep full relative
    precision. Any real order alpha in (1, 1e6] is accepted.

    Parameters
    ----------
    sampling_probability
        q in (0, 1]; q = 1 gives the plain Gaussian alpha / (2 sigma^2).
    noise_multiplier
        sigma = noise std / L2 sensitivity, in (0, inf).
    orders
        One order or an array of orders in (1, 1e6].

    Returns
    -------
    numpy.ndarray
        D_alpha per order (+inf where the precision could not be certified, and at every order
        once c = 1/(2 sigma^2) overflows a double, sigma below about 7e-155: there
        D_alpha >= (alpha log q + alpha (alpha - 1) c) / (alpha - 1), keeping the term
        q^alpha L^alpha of (1 - q + q L)^alpha, is above every double).
    """
    q = require_probability("sampling_probability", sampling_probability)
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    return np.asarray(_core.rdp_poisson_gaussian(q, sigma, validate_orders(orders)))


def gaussian_rdp(noise_multiplier: float, orders: OrdersLike) -> npt.NDArray[np.float64]:
    """RDP of the Gaussian mechanism: D_alpha = alpha / (2 sigma^2) (Mironov 2017, Prop. 7).

    Valid under either neighbouring relation, with sigma relative to that relation's L2
    sensitivity.
    """
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    return np.asarray(_core.rdp_gaussian(sigma, validate_orders(orders)))


def laplace_rdp(scale: float, orders: OrdersLike) -> npt.NDArray[np.float64]:
    """RDP of the Laplace mechanism with scale b relative to the L1 sensitivity
    (Mironov 2017, Proposition 6):

    D_alpha = log( alpha/(2 alpha - 1) e^{(alpha-1)/b} + (alpha-1)/(2 alpha - 1) e^{-alpha/b} )
              / (alpha - 1).
    """
    b = require_positive_finite("scale", scale)
    return np.asarray(_core.rdp_laplace(b, validate_orders(orders)))


def sampled_without_replacement_gaussian_rdp(
    sampling_rate: float, noise_multiplier: float, orders: OrdersLike
) -> npt.NDArray[np.float64]:
    """Upper bound on the RDP of a Gaussian run on a uniformly random subset of fixed size
    m = gamma n drawn without replacement, under replace one.

    Integer alpha >= 2: the general upper bound of Wang, Balle, Kasiviswanathan 2019
    ("Subsampled Renyi differential privacy and analytical moments accountant", Theorem 9),
    with the Gaussian's eps(j) = j / (2 sigma^2) and eps(inf) = inf::

        (alpha-1) D_alpha <= log(1 + gamma^2 C(alpha,2) min{4(e^{eps(2)} - 1), 2 e^{eps(2)}}
                                 + sum_{j=3}^{alpha} 2 gamma^j C(alpha,j) e^{(j-1) eps(j)}).

    It is an upper bound because the theorem bounds every term of the binomial expansion of
    the subsampled moment by the base mechanism's RDP (it holds for any mechanism; it is not
    tight for the Gaussian). Fractional alpha: K(alpha) = (alpha-1) D_alpha is convex in alpha
    (it is the log of E[(p/p')^alpha], a log-moment generating function, convex by Hoelder)
    with K(1) = 0, so the chord between the integers floor(alpha) and ceil(alpha) (between 1 and
    2 for alpha < 2) lies above K; interpolating the integer *upper bounds* therefore bounds
    K(alpha) from above too. Finally every order is capped by the unsampled Gaussian
    alpha / (2 sigma^2), since subsampling cannot increase the divergence (joint convexity).

    Parameters
    ----------
    sampling_rate
        gamma = sample_size / dataset_size in (0, 1].
    noise_multiplier
        sigma = noise std / L2 sensitivity under replace one (twice the clipping norm for a
        clipped sum).
    orders
        Orders in (1, 1e6].
    """
    gamma = require_probability("sampling_rate", sampling_rate)
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    return np.asarray(
        _core.rdp_sampled_without_replacement_gaussian(gamma, sigma, validate_orders(orders))
    )


def _curve(orders: OrdersLike, rdp: OrdersLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    order_array = validate_orders(orders)
    rdp_array = np.array(require_real_array("rdp", rdp, allow_infinite=True), ndmin=1)
    if rdp_array.shape != order_array.shape:
        raise ValueError(
            f"rdp must have one value per order ({order_array.size}), got shape {rdp_array.shape}"
        )
    if np.isnan(rdp_array).any() or (rdp_array < 0).any():
        raise ValueError("rdp values must be in [0, inf] (no NaN)")
    return order_array, rdp_array


def epsilon_from_rdp(
    orders: OrdersLike, rdp: OrdersLike, delta: float, *, conversion: Conversion = "tight"
) -> tuple[float, float]:
    """The smallest epsilon over the orders for which the RDP curve implies (epsilon, delta)-DP;
    returns (epsilon, optimal order).

    ``conversion="classic"`` (Mironov 2017, Prop. 3; Abadi et al. 2016, Thm 2):
    epsilon = min_alpha D_alpha + log(1/delta)/(alpha - 1).

    ``conversion="tight"`` (Balle et al. 2020, Thm 21; Canonne, Kamath, Steinke 2020, Prop. 12;
    the rule of dp-accounting 0.6.0): epsilon = min_alpha D_alpha + log1p(-1/alpha)
    - (log delta + log alpha)/(alpha - 1) over orders alpha > 1.01, and epsilon = 0 when
    delta >= sqrt(1 - exp(-D_alpha)) for some order (KL / Bretagnolle-Huber); clamped at 0.
    """
    order_array, rdp_array = _curve(orders, rdp)
    delta = require_delta(delta)
    kind = _CONVERSIONS[validate_conversion(conversion)]
    eps, index = _core.rdp_epsilon(order_array, rdp_array, delta, kind)
    return float(eps), float(order_array[index])


def delta_from_rdp(
    orders: OrdersLike, rdp: OrdersLike, epsilon: float, *, conversion: Conversion = "tight"
) -> tuple[float, float]:
    """The smallest delta over the orders for which the curve implies (epsilon, delta)-DP;
    returns (delta, optimal order). The inverse of :func:`epsilon_from_rdp`:

    classic: delta = min_alpha exp((alpha - 1)(D_alpha - epsilon));
    tight: log delta = min_alpha min{ (alpha-1)(D_alpha - epsilon + log1p(-1/alpha)) - log alpha
    (alpha > 1.01), log sqrt(1 - exp(-D_alpha)) }; delta is capped at 1.
    """
    order_array, rdp_array = _curve(orders, rdp)
    epsilon = require_epsilon(epsilon)
    kind = _CONVERSIONS[validate_conversion(conversion)]
    delta, index = _core.rdp_delta(order_array, rdp_array, epsilon, kind)
    return float(delta), float(order_array[index])


# --------------------------------------------------------------------------- lazy evaluation
# An (epsilon, delta) answer needs the curve only at the optimal order: every other order only
# has to be shown to be no better. The fractional orders of the Poisson-subsampled Gaussian are
# integrated numerically and cost 10-40x an integer order, so an accountant evaluates them (and
# the large integer orders) only where the answer needs them. The log moment
# K(alpha) = (alpha - 1) D_alpha = log E_{mu_0}[(mu / mu_0)^alpha] is convex in alpha (Hoelder;
# it is a log-moment generating function), K(1) = 0 and K >= 0, so K is non-decreasing on
# [1, inf); a composition's K is a sum of such curves, hence one too. Between evaluated orders
# a convex K lies above the extensions of the chords of its neighbouring evaluated pairs (on
# either side) and above its left neighbour's value: lower bounds on K, hence on the per-order
# epsilon or log-delta, which are non-decreasing in D_alpha. An order whose lower bound is no
# better than the best evaluated order is never evaluated: the minimum over the grid, and the
# order where it is attained, are those of the full curve.

# The rounds run in the compiled core (cpp/src/rdp_search.cpp: the bounds carry a relative
# slack of 1e-7 for rounding, as evaluated values carry <= 1e-10 relative error, which a chord
# extended past its points amplifies by extension / chord length).

# Fractional orders evaluated per round of search_orders for a few curves: the optimum's
# neighbours are usually open together (with many curves: one per round, each costing a
# quadrature per curve).
_FRACTIONAL_PER_ROUND = 2


class OrderPlan:
    """Where an accountant evaluates the curves of a grid of orders.

    ``points`` are the grid and anchor integers around each fractional order (floor - 1 ..
    floor + 2: the chords of the convexity bounds); ``eager_at`` are the points evaluated as
    soon as a curve is created: 2, 3 and every integer point up to the largest fractional
    order + 2 (a binomial sum costs about a microsecond); the rest on demand.
    """

    def __init__(self, orders: npt.NDArray[np.float64]) -> None:
        self.orders = orders
        self.key = orders.tobytes()
        fractional = orders[orders != np.floor(orders)]
        base = np.floor(fractional)
        anchors = np.concatenate([[2.0, 3.0], base - 1.0, base, base + 1.0, base + 2.0])
        anchors = anchors[(anchors >= 2.0) & (anchors <= MAX_ORDER)]
        #: Sorted evaluation points: the grid and the anchors.
        self.points = np.union1d(orders, anchors)
        #: Index of each grid order in :attr:`points`.
        self.grid_at = np.searchsorted(self.points, orders)
        reach = float(base.max()) + 2.0 if base.size else 3.0
        integer = self.points == np.floor(self.points)
        #: Points evaluated at once.
        self.eager_at = np.flatnonzero(integer & (self.points <= reach))
        #: Whether each grid order is an integer (cheap to evaluate).
        self.grid_integer = integer[self.grid_at]
        # the same for the compiled search (int64 indices, one byte per flag)
        self.grid_at_int64 = np.ascontiguousarray(self.grid_at, dtype=np.int64)
        self.grid_integer_uint8 = np.ascontiguousarray(self.grid_integer, dtype=np.uint8)


_PLANS: dict[bytes, OrderPlan] = {}


def order_plan(orders: npt.NDArray[np.float64]) -> OrderPlan:
    """The (cached) :class:`OrderPlan` of validated ``orders``."""
    key = orders.tobytes()
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        plan = _PLANS[key] = OrderPlan(np.array(orders, dtype=np.float64))
    return plan


class LazyPoissonGaussianCurve:
    """D_alpha of the Poisson-subsampled Gaussian (:func:`poisson_gaussian_rdp`) at the points
    of an :class:`OrderPlan`, computed on demand (``plan.eager_at`` at once, the rest when
    :meth:`ensure` asks for them). Unknown values are NaN."""

    __slots__ = ("q", "sigma", "plan", "values", "floor")

    def __init__(
        self, sampling_probability: float, noise_multiplier: float, plan: OrderPlan
    ) -> None:
        self.q = require_probability("sampling_probability", sampling_probability)
        self.sigma = require_positive_finite("noise_multiplier", noise_multiplier)
        self.plan = plan
        self.values = np.full(plan.points.size, np.nan)
        #: A lower bound on D_alpha at every order: D_alpha >= KL >= 2 TV^2 (Renyi divergences
        #: grow with the order, van Erven and Harremoes 2014, Thm 3; Pinsker's inequality), with
        #: TV = q TV(N(1, sigma^2), N(0, sigma^2)) = q erf(1 / (2 sqrt(2) sigma)) the total
        #: variation of the mixture (1-q) N(0, sigma^2) + q N(1, sigma^2) from N(0, sigma^2).
        self.floor = 2.0 * (self.q * math.erf(1.0 / (2.0 * math.sqrt(2.0) * self.sigma))) ** 2
        self._evaluate(plan.eager_at)

    def _evaluate(self, index: npt.NDArray[np.intp]) -> None:
        if index.size:
            points = self.plan.points[index]
            self.values[index] = _core.rdp_poisson_gaussian(self.q, self.sigma, points)

    def ensure(self, index: npt.NDArray[np.intp]) -> None:
        """Evaluate the points ``index`` (indices into plan.points) not evaluated yet."""
        self._evaluate(index[np.isnan(self.values[index])])

    def grid(self) -> npt.NDArray[np.float64]:
        """D_alpha at every grid order (evaluating what is missing)."""
        self.ensure(self.plan.grid_at)
        return self.values[self.plan.grid_at]


# Curves already evaluated, shared by every accountant of the process (the values are functions
# of (q, sigma, order) alone): a fresh accountant over events seen before (a calibration that
# revisits a noise level, an adapter that rebuilds its accountant per query) reuses them.
_CURVE_CACHE: dict[tuple[float, float, bytes], LazyPoissonGaussianCurve] = {}
_CURVE_CACHE_SIZE = 4096


def lazy_poisson_gaussian_curve(
    sampling_probability: float, noise_multiplier: float, plan: OrderPlan
) -> LazyPoissonGaussianCurve:
    """The process-wide :class:`LazyPoissonGaussianCurve` of (q, sigma) on ``plan``."""
    key = (sampling_probability, noise_multiplier, plan.key)
    curve = _CURVE_CACHE.get(key)
    if curve is None:
        curve = LazyPoissonGaussianCurve(sampling_probability, noise_multiplier, plan)
        if len(_CURVE_CACHE) >= _CURVE_CACHE_SIZE:
            _CURVE_CACHE.clear()
        _CURVE_CACHE[key] = curve
    return curve


def clear_curve_cache() -> None:
    """Forget every cached curve (benchmarks of the first evaluation use this)."""
    _CURVE_CACHE.clear()


def convex_lower_bound(
    points: npt.NDArray[np.float64],
    log_moment: npt.NDArray[np.float64],
    at: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """A lower bound on a convex, non-decreasing K with K(1) = 0 at the orders ``at`` (each
    > 1 and not in ``points``), from its finite values ``log_moment`` at the sorted ``points``
    (each > 1):

    K(x) >= max{ K(l0), K(l0) + s(l1, l0) (x - l0), K(r0) - s(r0, r1) (r0 - x) },

    with l1 < l0 < x < r0 < r1 the neighbouring points (1 counts as a point with K = 0) and
    s(a, b) the chord slope (K(b) - K(a)) / (b - a): by convexity the chord of [l1, l0]
    extended to the right and the chord of [r0, r1] extended to the left lie below K. A
    missing neighbour contributes nothing. (The compiled core's bound, the one
    :func:`search_orders` uses.)
    """
    return np.asarray(
        _core.rdp_convex_lower_bound(
            np.asarray(points, dtype=np.float64),
            np.asarray(log_moment, dtype=np.float64),
            np.asarray(at, dtype=np.float64),
        )
    )


CurveTerm = tuple[int, "LazyPoissonGaussianCurve | npt.NDArray[np.float64]"]


def search_orders(
    plan: OrderPlan, terms: Sequence[CurveTerm], target: float, kind: int, *, want_delta: bool
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
    """The grid orders an (epsilon, delta) answer needs, and the composed curve there.

    ``terms`` are (count, curve) pairs in a canonical order: a curve is either an array over the
    grid or a :class:`LazyPoissonGaussianCurve`. Returns a mask over the grid and the composed
    D_alpha = sum count * curve at the masked orders (summed in the order of ``terms``, so
    equal to the full curve there). Every unmasked order is proven (convexity bounds, module
    notes above) to give an epsilon (``want_delta=False``, ``target`` = delta) or log delta
    (``target`` = epsilon) no smaller than the best masked one, so the minimum over the masked
    orders is the minimum over the grid. Each round evaluates, in every lazy curve, the open
    integer orders (cheap binomial sums) and the few open fractional orders with the smallest
    lower bounds. The rounds run in the compiled core (cpp/src/rdp_search.cpp), which writes
    what it evaluates into the lazy curves' values (so the process-wide cache keeps them).
    """
    core_terms = []
    lazy = 0
    for count, curve in terms:
        if isinstance(curve, LazyPoissonGaussianCurve):
            lazy += 1
            core_terms.append((float(count), curve.values, curve.q, curve.sigma, curve.floor, True))
        else:
            values = np.ascontiguousarray(curve, dtype=np.float64)
            core_terms.append((float(count), values, 0.0, 0.0, 0.0, False))
    # with many curves a round is cheap next to its quadratures: one fractional order per round
    per_round = _FRACTIONAL_PER_ROUND if lazy <= 4 else 1
    known, total = _core.rdp_search_orders(
        plan.points, plan.grid_at_int64, plan.orders, plan.grid_integer_uint8, core_terms,
        float(target), kind, want_delta, per_round,
    )
    return np.asarray(known), np.asarray(total)


def convert_found(
    orders: npt.NDArray[np.float64], rdp: npt.NDArray[np.float64], target: float, kind: int,
    *, want_delta: bool,
) -> tuple[float, float]:
    """:func:`epsilon_from_rdp` / :func:`delta_from_rdp` (by ``want_delta``) of a curve that
    :func:`search_orders` returned (already valid: no second validation); returns (value,
    optimal order)."""
    if want_delta:
        value, index = _core.rdp_delta(orders, rdp, target, kind)
    else:
        value, index = _core.rdp_epsilon(orders, rdp, target, kind)
    return float(value), float(orders[index])
