"""Renyi differential privacy (RDP) curves and their conversion to (epsilon, delta).

A mechanism M is (alpha, D)-RDP if D_alpha(M(X) || M(X')) <= D for all neighbouring X, X'
(Mironov 2017, "Renyi differential privacy"). RDP composes by adding curves order by order,
and converts to (epsilon, delta)-DP at the best order. Every function here evaluates a curve at
an array of real orders alpha > 1 in dpsharp's compiled core (log space, no fast-math) and
returns a NumPy array.

Precision. :func:`poisson_gaussian_rdp` is accurate to a relative error below 1e-10 (measured
against mpmath at 50 digits over q in [1e-6, 1], sigma in [0.3, 1000], alpha in (1, 1e4], see
tests/test_rdp_precision.py). Where the core cannot certify that precision it returns +inf,
a valid (useless) bound, never a smaller number.
"""

from __future__ import annotations

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

#: Default orders of :class:`dpsharp.RDPAccountant`. Dense (step 0.25) in (1, 8], where the
#: optimal order of typical DP-SGD runs at delta ~ 1e-5 lies and where the conversion is most
#: sensitive to the grid; every half/whole order up to 20; then roughly geometric up to 10^4 for
#: small-epsilon / large-noise regimes (the optimal order grows like sqrt(log(1/delta)) / (q ...)).
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1.1]
    + [1.25 + 0.25 * i for i in range(28)]  # 1.25 ... 8.0
    + [8.5, 9.0, 9.5, 10.0]
    + [float(v) for v in range(11, 21)]
    + [24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0]
    + [512.0, 768.0, 1024.0, 1536.0, 2048.0, 3072.0, 4096.0, 6144.0, 8192.0, 10000.0]
)

_CONVERSIONS = {"classic": 0, "tight": 1}


def validate_orders(orders: OrdersLike, name: str = "orders") -> npt.NDArray[np.float64]:
    """``orders`` as a 1-d float64 array of finite values in (1, MAX_ORDER]: TypeError for
    anything but real numbers (a bool, a string, an array of either), ValueError if not."""
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
    summed by the binomial expansion and fractional ones integrated by adaptive Gauss-Kronrod
    quadrature, both for A - 1 as a sum/integral of non-negative terms, so tiny divergences keep
    full relative precision. Any real order alpha in (1, 1e6] is accepted.

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
