"""prv-accountant's privacy random variables, each the description of a dpsharp event.

A privacy random variable (PRV) of a pair of output distributions (P, Q) is the privacy loss
Y = log(P(X) / Q(X)) with X ~ P (Gopi, Lee, Wutschitz 2021, Definition 3.2); composing
mechanisms adds their PRVs, and delta(eps) = E[(1 - e^{eps - Y})_+] + P(Y = inf). Each class
here keeps prv-accountant 0.2.0's name, constructor and pair, gives the distribution of Y in
closed form (``cdf``, ``pdf``, ``probability``, ``rdp``, ``pm_inf``) and names the dpsharp
event with the same privacy-loss distribution (:attr:`PrivacyRandomVariable.event`), which is
what :class:`dpsharp.compat.prv_accountant.PRVAccountant` composes in dpsharp's tight PLD
accountant. The pairs and their events (sensitivity 1, the convention of :mod:`dpsharp.events`;
randomized response is a replace-one pair, Poisson sampling an add/remove one):

========================================================  ==========================================
``PoissonSubsampledGaussianMechanism(p, sigma)``           N(0, sigma^2) vs (1-p) N(0, sigma^2) +
                                                           p N(1, sigma^2):
                                                           ``PoissonSampled(Gaussian(sigma), p)``
``GaussianMechanism(noise_multiplier, l2_sensitivity)``    N(0, sigma^2) vs N(s, sigma^2):
                                                           ``Gaussian(sigma / s)``
``LaplaceMechanism(mu)``                                   Lap(0, 1) vs Lap(mu, 1):
                                                           ``Laplace(scale=1 / mu)``
``PureDPMechanism(eps)``                                   randomized response with e^eps odds:
                                                           ``RandomizedResponse(2/(1+e^eps), 2)``
``ApproximateDPMechanism(epsilon, delta)``                 the same with mass delta at +inf (the
                                                           mass composed in closed form)
========================================================  ==========================================

prv-accountant's Poisson PRV is the one of the remove direction; dpsharp's PLD accountant
composes both directions of the Poisson event and reports the worse, so its bounds are never
below the ones of the remove direction alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

from dpsharp._validation import require_positive_finite, require_probability, require_real
from dpsharp.events import Event, Gaussian, Laplace, PoissonSampled

__all__ = [
    "ApproximateDPMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "PoissonSubsampledGaussianMechanism",
    "PrivacyRandomVariable",
    "PureDPMechanism",
]

ArrayLike = Any


def _out(values: npt.NDArray[np.float64], scalar: bool) -> Any:
    return float(values) if scalar else values


class PrivacyRandomVariable:
    """Base of the privacy random variables: the law of the privacy loss Y of one mechanism,
    conditioned on Y being finite (``cdf``, ``pdf``), the mass ``pm_inf`` of Y = +inf, and
    :attr:`event`, the dpsharp event with the same privacy-loss distribution (None where
    dpsharp has none). Subclasses define ``_cdf`` (and ``_pdf``, ``rdp`` where known)."""

    #: the dpsharp event composed for this PRV; None: none (refused by the accountant), and
    #: a PRV whose loss is identically 0 (``is_null``) is composed as nothing
    event: Event | None = None
    is_null: bool = False

    def cdf(self, t: ArrayLike) -> Any:
        """P(Y <= t | Y finite)."""
        values = np.asarray(t, dtype=np.float64)
        return _out(self._cdf(values), values.ndim == 0)

    def pdf(self, t: ArrayLike) -> Any:
        """The density of Y at t (conditioned on Y finite), where Y has one."""
        values = np.asarray(t, dtype=np.float64)
        return _out(self._pdf(values), values.ndim == 0)

    def probability(self, a: ArrayLike, b: ArrayLike) -> Any:
        """P(a < Y <= b | Y finite) = cdf(b) - cdf(a)."""
        return self.cdf(b) - self.cdf(a)

    def mean(self) -> float:
        """E[Y | Y finite] (the Kullback-Leibler divergence of the pair where pm_inf = 0)."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form mean here")

    def rdp(self, alpha: float) -> float:
        """The Renyi divergence of order alpha of the pair, log E[e^{(alpha - 1) Y}] /
        (alpha - 1) (Mironov 2017)."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form RDP here")

    @property
    def pm_inf(self) -> float:
        """P(Y = +inf)."""
        return 0.0

    def _cdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        raise NotImplementedError

    def _pdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        raise NotImplementedError(f"{type(self).__name__} has no density")


def _orders_rdp(function: Any, alpha: float, *parameters: float) -> float:
    order = require_real("alpha", alpha)
    if order <= 1.0:
        raise ValueError(f"alpha must be in (1, inf], got {order!r}")
    if math.isinf(order):
        return math.inf
    return float(function(*parameters, [order])[0])


class PoissonSubsampledGaussianMechanism(PrivacyRandomVariable):
    """The Poisson-subsampled Gaussian: P = (1 - p) N(0, sigma^2) + p N(1, sigma^2) against
    Q = N(0, sigma^2) (one DP-SGD step, add/remove one; Abadi et al. 2016).

    With X ~ P and Y = log(1 - p + p e^{(2X - 1) / (2 sigma^2)}), Y > log(1 - p) and
    Y <= t iff X <= x(t) = sigma^2 log((e^t - 1 + p) / p) + 1/2, so
    cdf(t) = (1 - p) Phi(x / sigma) + p Phi((x - 1) / sigma)
    (the remove direction of Mironov, Talwar, Zhang 2019). Arguments in prv-accountant's order:
    ``(sampling_probability, noise_multiplier)``.
    """

    def __init__(self, sampling_probability: float, noise_multiplier: float) -> None:
        self.p = require_probability("sampling_probability", sampling_probability, allow_zero=True)
        self.sigma = require_positive_finite("noise_multiplier", noise_multiplier)
        self.is_null = self.p == 0.0
        if self.is_null:
            self.event = None
        elif self.p == 1.0:  # no sampling: the Gaussian mechanism, under every relation
            self.event = Gaussian(self.sigma)
        else:
            self.event = PoissonSampled(Gaussian(self.sigma), self.p)

    def _threshold(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        p, sigma = self.p, self.sigma
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # log(e^t - 1 + p) = t + log1p((p - 1) e^{-t}) for large t, log(expm1(t) + p) else
            big = t > 30.0
            log_gap = np.where(
                big, t + np.log1p((p - 1.0) * np.exp(-np.where(big, t, 0.0))),
                np.log(np.expm1(np.where(big, 0.0, t)) + p),
            )
            return sigma * sigma * (log_gap - math.log(p)) + 0.5

    def _cdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        p, sigma = self.p, self.sigma
        if p == 0.0:
            return np.where(t < 0.0, 0.0, 1.0)
        floor = math.log1p(-p) if p < 1.0 else -math.inf
        x = self._threshold(np.where(t > floor, t, floor + 1.0))
        value = (1.0 - p) * ndtr(x / sigma) + p * ndtr((x - 1.0) / sigma)
        return np.where(t > floor, np.minimum(value, 1.0), 0.0)

    def _pdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        p, sigma = self.p, self.sigma
        if p == 0.0:
            raise ValueError("sampling_probability = 0: the privacy loss is the constant 0")
        floor = math.log1p(-p) if p < 1.0 else -math.inf
        inside = t > floor
        s = np.where(inside, t, floor + 1.0)
        x = self._threshold(s)
        # dx/dt = sigma^2 e^t / (e^t - 1 + p) = sigma^2 / (1 - (1 - p) e^{-t})
        slope = sigma * sigma / (-np.expm1(np.log1p(-p) - s) if p < 1.0 else 1.0)
        log_density = np.logaddexp(
            math.log1p(-p) - 0.5 * (x / sigma) ** 2 if p < 1.0 else -np.inf,
            math.log(p) - 0.5 * ((x - 1.0) / sigma) ** 2,
        ) - math.log(sigma) - 0.5 * math.log(2.0 * math.pi)
        return np.where(inside, np.exp(log_density) * slope, 0.0)

    def rdp(self, alpha: float) -> float:
        """D_alpha of the pair (Mironov, Talwar, Zhang 2019), from
        :func:`dpsharp.rdp.poisson_gaussian_rdp`; 0 for p = 0."""
        from dpsharp.rdp import poisson_gaussian_rdp

        if self.p == 0.0:
            return 0.0
        return _orders_rdp(poisson_gaussian_rdp, alpha, self.p, self.sigma)

    def __repr__(self) -> str:
        return (f"PoissonSubsampledGaussianMechanism(sampling_probability={self.p!r}, "
                f"noise_multiplier={self.sigma!r})")


class GaussianMechanism(PrivacyRandomVariable):
    """The Gaussian mechanism: N(0, sigma^2) against N(s, sigma^2), s = ``l2_sensitivity``.
    Y ~ N(mu^2 / 2, mu^2) with mu = s / sigma (Dong, Roth, Su 2019): cdf(t) =
    Phi(t / mu - mu / 2)."""

    def __init__(self, noise_multiplier: float, l2_sensitivity: float = 1.0) -> None:
        sigma = require_positive_finite("noise_multiplier", noise_multiplier)
        sensitivity = require_positive_finite("l2_sensitivity", l2_sensitivity)
        self.mu = sensitivity / sigma
        self.event = Gaussian(sigma / sensitivity)

    def _cdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return ndtr(t / self.mu - self.mu / 2.0)

    def _pdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        z = t / self.mu - self.mu / 2.0
        return np.exp(-0.5 * z * z) / (self.mu * math.sqrt(2.0 * math.pi))

    def mean(self) -> float:
        return self.mu * self.mu / 2.0

    def rdp(self, alpha: float) -> float:
        """alpha mu^2 / 2 (Mironov 2017, Proposition 7)."""
        order = require_real("alpha", alpha)
        if order <= 1.0:
            raise ValueError(f"alpha must be in (1, inf], got {order!r}")
        return order * self.mu * self.mu / 2.0

    def __repr__(self) -> str:
        return f"GaussianMechanism(mu={self.mu!r})"


class LaplaceMechanism(PrivacyRandomVariable):
    """The Laplace mechanism: Lap(0, 1) against Lap(mu, 1). With X ~ Lap(0, 1),
    Y = |X - mu| - |X| is mu for X <= 0, -mu for X >= mu and mu - 2X between, so
    cdf(t) = 0 below -mu, e^{(t - mu) / 2} / 2 on [-mu, mu) and 1 from mu (an atom of mass
    e^{-mu} / 2 at -mu and 1/2 at mu)."""

    def __init__(self, mu: float) -> None:
        self.mu = require_positive_finite("mu", mu)
        self.event = Laplace(scale=1.0 / self.mu)

    def _cdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        mu = self.mu
        inside = 0.5 * np.exp(0.5 * (np.clip(t, -mu, mu) - mu))
        return np.where(t >= mu, 1.0, np.where(t >= -mu, inside, 0.0))

    def mean(self) -> float:
        # E[Y] = KL(Lap(0,1) || Lap(mu,1)) = mu - 1 + e^{-mu}
        return self.mu + math.expm1(-self.mu)

    def rdp(self, alpha: float) -> float:
        """Mironov 2017, Proposition 6, from :func:`dpsharp.rdp.laplace_rdp`."""
        from dpsharp.rdp import laplace_rdp

        return _orders_rdp(laplace_rdp, alpha, 1.0 / self.mu)

    def __repr__(self) -> str:
        return f"LaplaceMechanism(mu={self.mu!r})"


def _binary_response(eps: float) -> Event:
    """Binary randomized response with odds e^eps: k = 2 buckets, noise parameter
    p = 2 / (1 + e^eps), so P(own) / P(other) = (1 - p/2) / (p/2) = e^eps; under replace one
    its pair is the extremal eps-DP pair (Kairouz, Oh, Viswanath 2015)."""
    from dpsharp.events import RandomizedResponse  # type: ignore[attr-defined]

    return RandomizedResponse(noise_parameter=2.0 / (1.0 + math.exp(eps)), num_buckets=2)


def _binary_cdf(t: npt.NDArray[np.float64], eps: float) -> npt.NDArray[np.float64]:
    # Y = eps with probability e^eps / (1 + e^eps), -eps with probability 1 / (1 + e^eps)
    low = 1.0 / (1.0 + math.exp(eps)) if eps < 700 else 0.0
    return np.where(t < -eps, 0.0, np.where(t < eps, low, 1.0))


def _binary_rdp(alpha: float, eps: float) -> float:
    # D_alpha of (p, 1-p) against (1-p, p), p = e^eps / (1 + e^eps):
    # log(p^alpha (1-p)^{1-alpha} + (1-p)^alpha p^{1-alpha}) / (alpha - 1)
    order = require_real("alpha", alpha)
    if order <= 1.0:
        raise ValueError(f"alpha must be in (1, inf], got {order!r}")
    if eps == 0.0:
        return 0.0
    if math.isinf(order):
        return eps
    log_p = -math.log1p(math.exp(-eps))
    log_q = log_p - eps
    terms = np.logaddexp(order * log_p + (1 - order) * log_q, order * log_q + (1 - order) * log_p)
    return float(terms) / (order - 1.0)


class PureDPMechanism(PrivacyRandomVariable):
    """A pure eps-DP guarantee, as the binary randomized response that dominates every eps-DP
    pair (Kairouz, Oh, Viswanath 2015): Y = +-eps with P(Y = eps) = e^eps / (1 + e^eps).
    Composed as dpsharp's ``RandomizedResponse`` with two buckets (a replace-one pair; eps = 0:
    nothing to compose)."""

    def __init__(self, eps: float) -> None:
        self.eps = require_real("eps", eps)
        if not 0.0 <= self.eps < math.inf:
            raise ValueError(f"eps must be in [0, inf), got {self.eps!r}")
        self.is_null = self.eps == 0.0
        self.event = None if self.is_null else _binary_response(self.eps)

    def _cdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return _binary_cdf(t, self.eps)

    def mean(self) -> float:
        return self.eps * math.tanh(self.eps / 2.0)

    def rdp(self, alpha: float) -> float:
        """The exact D_alpha of the binary randomized-response pair."""
        return _binary_rdp(alpha, self.eps)

    def __repr__(self) -> str:
        return f"PureDPMechanism(eps={self.eps!r})"


class ApproximateDPMechanism(PrivacyRandomVariable):
    """An (epsilon, delta)-DP guarantee: the binary randomized response of
    :class:`PureDPMechanism` with mass delta moved to Y = +inf (Kairouz, Oh, Viswanath 2015).
    Its finite part is composed as :class:`PureDPMechanism`'s event, and the mass at +inf in
    closed form by :class:`~dpsharp.compat.prv_accountant.PRVAccountant`."""

    def __init__(self, epsilon: float, delta: float) -> None:
        self.epsilon = require_real("epsilon", epsilon)
        if not 0.0 <= self.epsilon < math.inf:
            raise ValueError(f"epsilon must be in [0, inf), got {self.epsilon!r}")
        self.delta = require_real("delta", delta)
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")
        self.is_null = self.epsilon == 0.0 and self.delta == 0.0
        # the finite part (Y given Y < inf); the mass delta at +inf is composed by the
        # accountant in closed form
        self.event = None if self.epsilon == 0.0 else _binary_response(self.epsilon)

    def _cdf(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return _binary_cdf(t, self.epsilon)

    def rdp(self, alpha: float) -> float:
        return math.inf if self.delta > 0.0 else _binary_rdp(alpha, self.epsilon)

    @property
    def pm_inf(self) -> float:
        return self.delta

    def __repr__(self) -> str:
        return f"ApproximateDPMechanism(epsilon={self.epsilon!r}, delta={self.delta!r})"
