"""Gaussian differential privacy: exact for Gaussian mechanisms, the central limit theorem
(an approximation) for Poisson-subsampled ones.

Bu, Dong, Long, Su 2020, Section 3 and Theorem 3.4 / Corollary 5.4 of Dong, Roth,
Su 2019: T steps of NoisySGD / NoisyAdam with Poisson sampling probability p and noise
multiplier sigma are asymptotically mu-GDP with

    mu = p sqrt(T (e^{1/sigma^2} - 1))        (p sqrt(T) -> nu as T -> infinity).

This module generalises it to heterogeneous steps by adding the per-step contributions,
mu^2 = sum_t p_t^2 (e^{1/sigma_t^2} - 1), and composes unsampled Gaussian mechanisms exactly
(Gaussian(sigma) is exactly (1/sigma)-GDP and mu-GDP composes as mu^2 = sum mu_i^2).

Reproduces Bu et al.'s MNIST values (q = 256/60000, delta = 1e-5; tests/test_gdp.py):
sigma 0.7 / 45 epochs mu 1.134, eps 5.066; 1.1 / 60: 0.574, 2.324; 1.06 / 20: 0.350, 1.341;
0.638 / 70: 1.785, 8.697; and the Figure 4 calibration sigma~ = 1.056 (paper 1.06) for the
moments accountant's 1.3498 at 20 epochs, 0.6385 (paper 0.638) for 8.6757 at 70 epochs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dpsharp._validation import (
    require_count,
    require_delta,
    require_epsilon,
    require_positive_finite,
    require_probability,
)
from dpsharp.accountants.base import Accountant, PrivacyGuarantee
from dpsharp.accountants.registry import register
from dpsharp.events import Event, Gaussian, Neighbouring, PoissonSampled
from dpsharp.tradeoff import gdp_delta, gdp_epsilon, gdp_mu_for

__all__ = [
    "BU_ET_AL_ORDERS",
    "CLT_WARNING",
    "GDPAccountant",
    "clt_equivalent_noise",
    "clt_equivalent_noise_for",
    "clt_mu",
]

CLT_WARNING = (
    "central-limit (CLT) approximation of Bu et al. 2020: mu = p sqrt(T (e^{1/sigma^2} - 1)) is "
    "a limit as T -> infinity, not a bound; for finite T it can be far below the true privacy "
    "loss (q=0.1, sigma=1, T=10 gives epsilon 1.62 where the tight value is 2.85). Use the "
    "PLD accountant ('pld', its certified gdp_mu() and epsilon()) for a guarantee."
)


def _inverse_square(noise_multiplier: float) -> float:
    """1/sigma^2, +inf where sigma^2 underflows to 0 (sigma below about 1.5e-162): a noise that
    small is no noise at all, so mu = +inf (no privacy) rather than a ZeroDivisionError."""
    square = noise_multiplier * noise_multiplier
    return math.inf if square == 0.0 else 1.0 / square


def _clt_mu_squared_term(sampling_probability: float, noise_multiplier: float) -> float:
    # p^2 (e^{1/sigma^2} - 1) via expm1; may overflow to inf for tiny sigma (no privacy).
    inv = _inverse_square(noise_multiplier)
    if inv > 709.0:
        return math.inf
    return sampling_probability * sampling_probability * math.expm1(inv)


def clt_mu(noise_multiplier: float, *, sampling_probability: float, steps: int) -> float:
    """mu_CLT = p sqrt(T (e^{1/sigma^2} - 1)) (Bu et al. 2020, Section 3.2).

    An approximation (see :data:`CLT_WARNING`), not a certified bound.
    """
    sigma = _require_sigma(noise_multiplier)
    p = require_probability("sampling_probability", sampling_probability)
    steps = require_count("steps", steps)
    return math.sqrt(steps * _clt_mu_squared_term(p, sigma))


def _require_sigma(noise_multiplier: float) -> float:
    return require_positive_finite("noise_multiplier", noise_multiplier)


@register("gdp")
class GDPAccountant(Accountant):
    """mu-GDP accounting: exact for Gaussian mechanisms, the CLT for Poisson-subsampled ones.

    * ``Gaussian(sigma)`` is exactly (1/sigma)-GDP; compositions add mu^2 (Dong, Roth, Su 2019,
      Corollary 3.3), so a composition of plain Gaussians is certified (``certified`` True,
      the exact (epsilon, delta) of the composed Gaussian mechanism).
    * ``PoissonSampled(Gaussian(sigma), p)`` contributes p^2 (e^{1/sigma^2} - 1) to mu^2: the
      central limit theorem of Bu, Dong, Long, Su 2020 (eq. (3.3)), generalised to
      heterogeneous steps. This is an **approximation, not a bound**: it is the T -> infinity
      limit and can be far below the true privacy loss for finite T (for example
      q = 0.1, sigma = 1, T = 10 gives epsilon 1.62 at delta 1e-5 while the tight value is
      2.85). Any such composition makes every :meth:`guarantee` carry ``certified=False`` and
      :data:`CLT_WARNING`. (With p = 1 the event is the plain Gaussian and is composed exactly;
      so is a step whose CLT term is at least 1/sigma^2, which is accounted as the unsampled
      Gaussian, a bound at every p.)

    For a certified GDP parameter of subsampled mechanisms use the tight accountant's
    ``gdp_mu()`` (``dpsharp.accountant("pld")``), which bounds the composed trade-off curve
    from below by a Gaussian curve; this accountant is for reproducing Bu et al. and for quick
    planning.

    :attr:`mu` is the composed GDP parameter; ``epsilon(delta)`` / ``delta(epsilon)`` use the
    exact GDP-to-(epsilon, delta) duality of :mod:`dpsharp.tradeoff`.
    """

    @property
    def certified(self) -> bool:
        """Always False: any ``PoissonSampled`` event composed into this accountant is accounted
        by the central limit theorem, which is not a bound, so a budget or a calibration on a
        GDPAccountant needs an explicit opt-in (``allow_approximation=True``). Each answer still
        says whether it is exact: :meth:`guarantee` is ``certified`` when only Gaussian
        mechanisms (and p = 1 samplings) were composed."""
        return False

    def __init__(self, *, neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE) -> None:
        super().__init__(neighbouring=neighbouring)
        self._mu_squared = 0.0
        self._approximate = False

    # ----------------------------------------------------------------- interface
    def _leaf_unsupported_reason(self, leaf: Event) -> str | None:
        if isinstance(leaf, Gaussian):
            return None
        if isinstance(leaf, PoissonSampled) and isinstance(leaf.event, Gaussian):
            return None
        return (
            "the GDP accountant handles Gaussian and PoissonSampled(Gaussian) events only "
            "(use the 'pld' or 'rdp' accountant for other mechanisms)"
        )

    @staticmethod
    def _leaf_mu_squared(leaf: Event) -> float:
        if isinstance(leaf, Gaussian):
            return _inverse_square(leaf.noise_multiplier)
        assert isinstance(leaf, PoissonSampled) and isinstance(leaf.event, Gaussian)
        if leaf.sampling_probability == 1.0:  # sampling everyone: exactly the Gaussian
            return _inverse_square(leaf.event.noise_multiplier)
        # Never above the unsampled Gaussian's 1/sigma^2: the sampled pair (q N(1, s^2) +
        # (1 - q) N(0, s^2) against N(0, s^2)) is a post-processing of the unsampled one (keep
        # its output with probability q, else draw N(0, s^2) afresh), so the step is exactly
        # (1/sigma)-GDP at every q. The CLT term exceeds that for q near 1 or small sigma,
        # which made epsilon drop at q = 1.
        return min(_clt_mu_squared_term(leaf.sampling_probability, leaf.event.noise_multiplier),
                   _inverse_square(leaf.event.noise_multiplier))

    @staticmethod
    def _leaf_uses_clt(leaf: Event) -> bool:
        """Whether the leaf's mu^2 is the CLT term (an approximation): a sampled Gaussian whose
        CLT term is below 1/sigma^2. Where it is not, the step is accounted as the unsampled
        Gaussian, exactly (1/sigma)-GDP at every q (:meth:`_leaf_mu_squared`): a bound."""
        if not isinstance(leaf, PoissonSampled) or leaf.sampling_probability == 1.0:
            return False
        assert isinstance(leaf.event, Gaussian)
        sigma = leaf.event.noise_multiplier
        return _clt_mu_squared_term(leaf.sampling_probability, sigma) < _inverse_square(sigma)

    def _on_compose(self, leaves: list[tuple[Event, int]]) -> None:
        # Recomputed from the whole multiset with math.fsum, so the answer is a function of
        # the multiset alone (order of composition and checkpoints cannot change it).
        merged = dict(self._counts)
        for leaf, count in leaves:
            merged[leaf] = merged.get(leaf, 0) + count
        self._mu_squared = math.fsum(
            count * self._leaf_mu_squared(leaf) for leaf, count in merged.items()
        )
        self._approximate = any(self._leaf_uses_clt(leaf) for leaf in merged)

    def _reset_caches(self) -> None:
        self._mu_squared = 0.0
        self._approximate = False

    @property
    def mu(self) -> float:
        """The composed GDP parameter sqrt(sum mu_i^2) (approximate if any event is
        subsampled; see :attr:`is_approximate`)."""
        return math.sqrt(self._mu_squared)

    @property
    def is_approximate(self) -> bool:
        """True when the CLT was used: a PoissonSampled event whose CLT term was below the
        unsampled Gaussian's 1/sigma^2 was composed."""
        return self._approximate

    def _epsilon(self, delta: float) -> float:
        mu = self.mu
        if math.isinf(mu):
            return math.inf
        if mu == 0.0:  # (every mu_i^2 underflowed, e.g. sigma = 1e155: the two releases agree)
            return 0.0
        return float(gdp_epsilon(delta, mu))

    def _delta(self, epsilon: float) -> float:
        mu = self.mu
        if math.isinf(mu):
            return 1.0
        if mu == 0.0:
            return 0.0
        return float(gdp_delta(epsilon, mu))

    def _options(self) -> dict[str, Any]:
        return {}

    def guarantee(self, delta: float) -> PrivacyGuarantee:
        """(epsilon, delta) with ``certified`` False and :data:`CLT_WARNING` when the CLT was
        used; ``details`` holds ``{"mu": mu}``."""
        delta = require_delta(delta)
        return PrivacyGuarantee(
            epsilon=self.epsilon(delta),
            delta=delta,
            certified=not self._approximate,
            accountant=self.name,
            neighbouring=self.neighbouring,
            details={"mu": self.mu, "clt": self._approximate},
            warning=CLT_WARNING if self._approximate else None,
        )


def clt_equivalent_noise(
    epsilon: float,
    delta: float,
    *,
    sampling_probability: float,
    steps: int,
) -> float:
    """The noise multiplier sigma~ whose CLT accounting gives exactly (epsilon, delta).

    Bu et al. 2020, Figure 1 / Figure 4: the moments accountant proves
    (epsilon, delta) for some sigma; the CLT reaches the same (epsilon, delta) with a smaller
    sigma~. With mu* the GDP parameter for which delta(epsilon; mu*) = delta
    (:func:`dpsharp.tradeoff.gdp_mu_for`), the CLT relation mu* = p sqrt(T (e^{1/sigma~^2} - 1))
    is solved in closed form:

        sigma~ = 1 / sqrt(log1p(mu*^2 / (p^2 T))).

    The result inherits the CLT's status: an approximation, not a certified calibration (use
    :func:`dpsharp.calibrate.noise_multiplier` with a certified accountant for that).

    To start from a noise multiplier instead of an (epsilon, delta), use
    :func:`clt_equivalent_noise_for`.
    """
    epsilon = require_epsilon(epsilon)
    if epsilon == 0.0:
        raise ValueError("epsilon must be in (0, inf), got 0.0")
    delta = require_delta(delta)
    p = require_probability("sampling_probability", sampling_probability)
    steps = require_count("steps", steps, minimum=1)
    mu_star = gdp_mu_for(epsilon, delta)
    spread = math.log1p(mu_star * mu_star / (p * p * steps)) if p * p * steps > 0.0 else math.inf
    return 1.0 / math.sqrt(spread)  # (0.0 where p^2 T underflows: no noise is needed)


#: The RDP orders of Bu et al. 2020's moments accountant (their Table 1 and Fig. 4):
#: 1.1, 1.2, ..., 10.9 and 12, ..., 63, with the classic conversion.
BU_ET_AL_ORDERS: tuple[float, ...] = tuple(round(1.0 + k / 10.0, 1) for k in range(1, 100)) + tuple(
    float(order) for order in range(12, 64)
)


def _bu_et_al_moments_accountant() -> Accountant:
    from dpsharp.accountants.registry import accountant as make

    return make("rdp", orders=BU_ET_AL_ORDERS, conversion="classic")


def clt_equivalent_noise_for(
    noise_multiplier: float,
    *,
    sampling_probability: float,
    steps: int,
    delta: float,
    accountant: str | Callable[[], Accountant] | None = None,
) -> tuple[float, float]:
    """Figure 1 / Figure 4 of Bu et al. 2020 from a noise multiplier: account ``steps``
    Poisson-sampled Gaussian steps with a certified accountant, read its epsilon at ``delta``,
    and return (epsilon, sigma~) with sigma~ from :func:`clt_equivalent_noise`.

    ``accountant`` is a registry name or a zero-argument factory; the default (None) is the
    paper's own moments accountant: RDP at :data:`BU_ET_AL_ORDERS` with the classic conversion
    (the 'rdp' accountant), which gives 1.3498 for sigma 1.3 at 20 MNIST epochs and 8.6757 for
    sigma 0.7 at 70, hence sigma~ = 1.056 and 0.6385 (paper: 1.06 and 0.638). Abadi et al.'s
    integer-order accountant ('moments') gives a different epsilon and sigma~ (0.6325 at 70
    epochs).
    """
    from dpsharp.accountants.registry import accountant as make

    sigma = _require_sigma(noise_multiplier)
    p = require_probability("sampling_probability", sampling_probability)
    steps = require_count("steps", steps, minimum=1)
    delta = require_delta(delta)
    if accountant is None:
        acc = _bu_et_al_moments_accountant()
    elif isinstance(accountant, str):
        acc = make(accountant)
    elif callable(accountant):
        acc = accountant()
    else:
        raise TypeError(
            f"accountant must be None, a registry name or a zero-argument factory, got "
            f"{accountant!r} ({type(accountant).__name__})"
        )
    acc.compose(PoissonSampled(Gaussian(sigma), p), steps)
    eps = acc.epsilon(delta)
    return eps, clt_equivalent_noise(eps, delta, sampling_probability=p, steps=steps)
