"""Calibration for any accountant: the noise multiplier, the number of steps or the sampling
rate that meets a target (epsilon, delta).

Each function composes the run it is asked about (``steps`` times ``PoissonSampled(Gaussian(
sigma), q)`` by default, ``Gaussian(sigma)`` when q = 1, or the events a caller's ``event``
function builds) into a fresh accountant, reads the accountant's ``epsilon(delta)`` (its
certified upper bound) and solves with Brent's method (``scipy.optimize.brentq``) in log space.

Guarantee (conservative): the returned value achieves epsilon <= target, and for the
continuous parameters (noise multiplier, sampling rate) also epsilon >= target * (1 - rtol)
(default rtol = 1e-3): Brent is aimed at target * (1 - rtol/2), the middle of that window,
and the answer is checked, moved in the safe direction if rounding left it outside, and an
error is raised if that fails. Steps are integers: the largest count whose epsilon fits.
An unreachable target raises ValueError saying why.

An answer that is not a proven bound is refused: whether it is comes from the configured
accountant instance (:attr:`dpsharp.accountants.base.Accountant.certified`: the GDP central
limit theorem, ``ZCDPAccountant(batching="sample")``) and from each answer
(:attr:`~dpsharp.accountants.base.PrivacyGuarantee.certified`), never from the accountant's
class. Calibrating on an approximation is not conservative (the CLT epsilon of a run can be
13-117% below its certified epsilon), so it needs an explicit ``allow_approximation=True``;
the result is then logged as an approximation. (``require_certified=False`` is the older
spelling of the same opt-in.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from scipy.optimize import brentq

from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
    require_real,
)
from dpsharp.accountants.base import Accountant, UnsupportedEventError
from dpsharp.accountants.registry import accountant as make_accountant
from dpsharp.events import Event, Gaussian, PoissonSampled

__all__ = ["AccountantSpec", "noise_multiplier", "sampling_probability", "steps"]

#: A registry name ("rdp", "pld", "gdp", ...) or a zero-argument callable returning a fresh
#: accountant (e.g. ``lambda: ZCDPAccountant(batching="sample")``).
AccountantSpec = str | Callable[[], Accountant]
EventFactory = Callable[[float, float], Event]

logger = logging.getLogger(__name__)

_SIGMA_MIN, _SIGMA_MAX = 1e-3, 1e6
_Q_MIN = 1e-12


def _default_event(noise: float, q: float) -> Event:
    gaussian = Gaussian(noise)
    return gaussian if q == 1.0 else PoissonSampled(gaussian, q)


def _factory(spec: AccountantSpec) -> Callable[[], Accountant]:
    if isinstance(spec, str):
        make_accountant(spec)  # validates the name now (ValueError listing the valid ones)
        return lambda: make_accountant(spec)
    if callable(spec):
        return spec
    raise TypeError(f"accountant must be a registry name or a zero-argument factory, got {spec!r}")


def _allowed(allow_approximation: object, require_certified: object) -> bool:
    """Whether the caller opted in to calibrating on an approximation."""
    for name, value in (("allow_approximation", allow_approximation),
                        ("require_certified", require_certified)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(allow_approximation) or not require_certified


class _Problem:
    def __init__(
        self,
        spec: AccountantSpec,
        delta: float,
        event: EventFactory | None,
        allow_approximation: bool,
    ) -> None:
        self.factory = _factory(spec)
        self.delta = delta
        self.event = event or _default_event
        self.allow_approximation = allow_approximation
        self._logged = False

    def epsilon(self, noise: float, q: float, count: int) -> float:
        acc = self.factory()
        if not isinstance(acc, Accountant):
            raise TypeError(f"the accountant factory returned {acc!r}, not a dpsharp Accountant")
        event = self.event(noise, q)
        acc.compose(event, count)  # UnsupportedEventError propagates: a wrong pairing
        # A configured accountant whose every answer is a proven bound (the instance's
        # ``certified``) only needs epsilon() (guarantee() may also compute lower bounds, e.g.
        # the PLD accountant's bracket); otherwise each answer says whether it is one.
        try:
            if acc.certified:
                return acc.epsilon(self.delta)
            result = acc.guarantee(self.delta)
        except (ValueError, OverflowError) as exc:
            if isinstance(exc, UnsupportedEventError):
                raise
            return math.inf  # e.g. a calibration formula outside its range at this noise
        if not result.certified:
            if not self.allow_approximation:
                why = f" ({result.warning})" if result.warning else ""
                raise ValueError(
                    f"the accountant {acc!r} gives an approximate (not certified) epsilon for "
                    f"{event!r}{why}; calibrating on it is not conservative. Use a certified "
                    "accountant ('pld', 'rdp'), or pass allow_approximation=True to calibrate on "
                    "the approximation anyway"
                )
            if not self._logged:
                self._logged = True
                logger.warning(
                    "calibrating on an approximation (%r, not a certified bound): the result "
                    "does not guarantee the target epsilon", acc,
                )
        return result.epsilon


def _check_target(epsilon: float, delta: float, rtol: float) -> tuple[float, float, float]:
    epsilon = require_positive_finite("epsilon", epsilon)
    delta = require_delta(delta)
    rtol = require_real("rtol", rtol)
    if not 0.0 < rtol < 0.5:
        raise ValueError(f"rtol must be in (0, 0.5), got {rtol!r}")
    return epsilon, delta, rtol


def _solve_window(
    eps_of: Callable[[float], float], lo: float, hi: float, target: float, rtol: float, *, increasing: bool
) -> float:
    """x in [lo, hi] (log scale) with eps_of(x) in [target (1 - rtol), target], where eps_of is
    monotone (``increasing`` in x or not) and eps_of(lo), eps_of(hi) bracket the window."""
    aim = target * (1.0 - 0.5 * rtol)

    def gap(log_x: float) -> float:
        value = eps_of(math.exp(log_x))
        return min(value, 1e300) - aim

    log_x = brentq(gap, math.log(lo), math.log(hi), xtol=1e-14, rtol=1e-15, maxiter=200)
    x = math.exp(log_x)
    # Rounding may leave x a hair on the wrong side: move towards safety.
    step = 1.0 + rtol / 64.0
    for _ in range(256):
        if eps_of(x) <= target:
            return x
        x = x / step if increasing else x * step
    raise RuntimeError("calibration failed to reach the target; the accountant is not monotone")


def noise_multiplier(
    epsilon: float,
    delta: float,
    *,
    steps: int,
    sampling_probability: float = 1.0,
    accountant: AccountantSpec = "rdp",
    rtol: float = 1e-3,
    event: EventFactory | None = None,
    allow_approximation: bool = False,
    require_certified: bool = True,
) -> float:
    """The noise multiplier sigma at which ``steps`` steps sampled at rate q are
    (epsilon, delta)-DP by ``accountant``: epsilon(sigma) in [target (1 - rtol), target].

    epsilon(sigma) decreases in sigma; Brent's method on log sigma in [1e-3, 1e6] (bracket
    found by doubling). Raises ValueError if no sigma <= 1e6 reaches the target (e.g. a
    delta below what the accountant can certify) or if even sigma = 1e-3 is private enough.
    ``event(sigma, q)`` overrides the event that one step is (default PoissonSampled(Gaussian)).
    An approximate answer (module docstring) is refused unless ``allow_approximation=True``.
    """
    epsilon, delta, rtol = _check_target(epsilon, delta, rtol)
    count = require_count("steps", steps, minimum=1)
    q = require_probability("sampling_probability", sampling_probability)
    allowed = _allowed(allow_approximation, require_certified)
    problem = _Problem(accountant, delta, event, allowed)

    def eps_of(sigma: float) -> float:
        return problem.epsilon(sigma, q, count)

    hi = 1.0
    while eps_of(hi) > epsilon:
        if hi >= _SIGMA_MAX:
            raise ValueError(
                f"target (epsilon={epsilon!r}, delta={delta!r}) is unreachable for steps={count}, "
                f"q={q!r}: even noise_multiplier={_SIGMA_MAX:g} gives epsilon={eps_of(_SIGMA_MAX):.6g}"
            )
        hi = min(hi * 4.0, _SIGMA_MAX)
    if eps_of(hi) >= epsilon * (1.0 - rtol):
        return hi
    lo = hi / 4.0 if hi > 1.0 else 1.0
    while eps_of(lo) <= epsilon * (1.0 - 0.5 * rtol):
        if lo <= _SIGMA_MIN:
            raise ValueError(
                f"target epsilon={epsilon!r} is met by every noise_multiplier >= {_SIGMA_MIN:g} "
                f"(steps={count}, q={q!r}); there is nothing to calibrate"
            )
        lo = max(lo / 4.0, _SIGMA_MIN)
    return _solve_window(eps_of, lo, hi, epsilon, rtol, increasing=False)


def sampling_probability(
    epsilon: float,
    delta: float,
    *,
    noise_multiplier: float,
    steps: int,
    accountant: AccountantSpec = "rdp",
    rtol: float = 1e-3,
    event: EventFactory | None = None,
    allow_approximation: bool = False,
    require_certified: bool = True,
) -> float:
    """The largest sampling rate q in (0, 1] at which ``steps`` steps with noise multiplier
    sigma are (epsilon, delta)-DP: 1.0 if q = 1 already fits, else epsilon(q) in
    [target (1 - rtol), target]. Raises ValueError if not even q = 1e-12 fits."""
    epsilon, delta, rtol = _check_target(epsilon, delta, rtol)
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    count = require_count("steps", steps, minimum=1)
    allowed = _allowed(allow_approximation, require_certified)
    problem = _Problem(accountant, delta, event, allowed)

    def eps_of(q: float) -> float:
        return problem.epsilon(sigma, min(q, 1.0), count)

    if eps_of(1.0) <= epsilon:
        return 1.0
    lo = 0.5
    while eps_of(lo) > epsilon:
        if lo <= _Q_MIN:
            raise ValueError(
                f"target (epsilon={epsilon!r}, delta={delta!r}) is unreachable with "
                f"noise_multiplier={sigma!r} and steps={count}: even q={_Q_MIN:g} is too much"
            )
        lo = max(lo / 8.0, _Q_MIN)
    if eps_of(lo) >= epsilon * (1.0 - rtol):
        return lo
    return min(1.0, _solve_window(eps_of, lo, 1.0, epsilon, rtol, increasing=True))


def steps(
    epsilon: float,
    delta: float,
    *,
    noise_multiplier: float,
    sampling_probability: float = 1.0,
    accountant: AccountantSpec = "rdp",
    max_steps: int = 10**7,
    event: EventFactory | None = None,
    allow_approximation: bool = False,
    require_certified: bool = True,
) -> int:
    """The largest number of steps T <= ``max_steps`` with epsilon(T) <= target (epsilon grows
    with T): doubling, then integer bisection. Raises ValueError if not even one step fits, or
    if ``max_steps`` steps still fit (the budget allows more than max_steps)."""
    epsilon = require_positive_finite("epsilon", epsilon)
    delta = require_delta(delta)
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    q = require_probability("sampling_probability", sampling_probability)
    max_steps = require_count("max_steps", max_steps, minimum=1)
    allowed = _allowed(allow_approximation, require_certified)
    problem = _Problem(accountant, delta, event, allowed)

    def fits(count: int) -> bool:
        return problem.epsilon(sigma, q, count) <= epsilon

    if not fits(1):
        raise ValueError(
            f"target (epsilon={epsilon!r}, delta={delta!r}) is unreachable: one step with "
            f"noise_multiplier={sigma!r}, q={q!r} already costs "
            f"epsilon={problem.epsilon(sigma, q, 1):.6g}"
        )
    # Double first: the accountant is only asked about counts near the answer, never about
    # max_steps itself unless the doubling gets there (a tight accountant at 10^9 steps is costly).
    good, bad = 1, 2
    while bad < max_steps and fits(bad):
        good, bad = bad, bad * 2
    if bad >= max_steps and fits(max_steps):
        raise ValueError(
            f"the budget allows more than max_steps={max_steps} steps; raise max_steps"
        )
    bad = min(bad, max_steps)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
