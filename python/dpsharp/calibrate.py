"""Calibration for any accountant: the noise multiplier, the number of steps or the sampling
rate that meets a target (epsilon, delta).

Each function composes the run it is asked about (``steps`` times ``PoissonSampled(Gaussian(
sigma), q)`` by default, ``Gaussian(sigma)`` when q = 1, or the events a caller's ``event``
function builds) into a fresh accountant and reads the accountant's ``epsilon(delta)`` (its
certified upper bound). The default accountant is the tight one (``"pld"``): the RDP
accountant's conversion asks for 3-8% more noise for the same target.

Continuous parameters (noise multiplier, sampling rate) are solved in log space on
log epsilon, which is close to linear there: the bracket grows by secant steps (at most a
factor 16 each), then the Illinois variant of regula falsi (Dowell and Jarratt 1971) with a
bisection fallback narrows it, and the search stops at the first value whose epsilon lies in
the window [target (1 - rtol), target] (default rtol = 1e-4). Each parameter value is
evaluated once (a cache): typically 5-8 accountant evaluations.

Guarantee (conservative): the returned value is one whose epsilon was evaluated and found
<= target (and >= target (1 - rtol) for the continuous parameters); an error is raised if the
search cannot find one. Steps are integers: the largest count whose epsilon fits.
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
        self._cache: dict[tuple[float, float, int], float] = {}
        #: Accountant evaluations made (distinct parameter values).
        self.evaluations = 0

    def epsilon(self, noise: float, q: float, count: int) -> float:
        """epsilon(delta) of ``count`` events at (noise, q); each distinct value computed once."""
        key = (noise, q, count)
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = self._evaluate(noise, q, count)
            self.evaluations += 1
        return value

    def _evaluate(self, noise: float, q: float, count: int) -> float:
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
    if not 1e-12 <= rtol < 0.5:
        raise ValueError(f"rtol must be in [1e-12, 0.5), got {rtol!r}")
    return epsilon, delta, rtol


def _solve_window(
    eps_of: Callable[[float], float],
    start: float,
    lo_limit: float,
    hi_limit: float,
    target: float,
    rtol: float,
    *,
    increasing: bool,
    unreachable: Callable[[], str],
    nothing_to_do: Callable[[], str],
) -> float:
    """x in [lo_limit, hi_limit] with eps_of(x) in [target (1 - rtol), target], eps_of monotone
    in x (``increasing`` or not). Works on y = log x against g(y) = log eps_of(e^y) - log aim,
    aim = target (1 - rtol/2): bracket from ``start`` by secant steps clamped to a factor 16,
    then Illinois regula falsi, bisection where a value is 0 or inf or the step stalls. Returns
    the first evaluated x inside the window (or, if epsilon jumps across the window, the
    nearest evaluated x below it, with a warning). ValueError with ``unreachable()`` if the
    safe end of the range misses the target, with ``nothing_to_do()`` if the other end
    already meets it.
    """
    floor = target * (1.0 - rtol)
    aim = target * (1.0 - 0.5 * rtol)
    log_aim = math.log(aim)
    sign = 1.0 if increasing else -1.0  # g grows with sign * y
    y_lo_limit, y_hi_limit = math.log(lo_limit), math.log(hi_limit)

    def g(y: float) -> float:
        value = eps_of(math.exp(y))
        if value <= 0.0:
            return -math.inf
        return math.log(value) - log_aim if math.isfinite(value) else math.inf

    def inside(y: float) -> bool:
        value = eps_of(math.exp(y))
        return floor <= value <= target

    # ---- bracket: y_bad has g > 0 (too much epsilon), y_good has g < 0 (safe)
    y = min(max(math.log(start), y_lo_limit), y_hi_limit)
    gy = g(y)
    if inside(y):
        return math.exp(y)
    y_prev, g_prev = None, None
    y_bad = y_good = None
    g_bad = g_good = 0.0
    for _ in range(200):
        if gy > 0.0:
            y_bad, g_bad = y, gy
        else:
            y_good, g_good = y, gy
        if y_bad is not None and y_good is not None:
            break
        # step towards the other side: secant on the last two points, clamped to [log 2, log 16]
        direction = -sign if gy > 0.0 else sign
        step = math.log(4.0)
        if y_prev is not None and math.isfinite(gy) and math.isfinite(g_prev) and gy != g_prev:
            secant = abs(gy * (y - y_prev) / (gy - g_prev)) * 1.5
            step = min(max(secant, math.log(2.0)), math.log(16.0))
        y_next = y + direction * step
        limit = y_hi_limit if direction > 0 else y_lo_limit
        if (direction > 0 and y >= y_hi_limit) or (direction < 0 and y <= y_lo_limit):
            raise ValueError(unreachable() if gy > 0.0 else nothing_to_do())
        y_next = min(y_next, limit) if direction > 0 else max(y_next, limit)
        y_prev, g_prev = y, gy
        y, gy = y_next, g(y_next)
        if inside(y):
            return math.exp(y)
    else:  # pragma: no cover - the range is finite, so the loop ends by the limits
        raise RuntimeError("calibration failed to bracket the target")
    assert y_bad is not None and y_good is not None
    # ---- narrow: Illinois regula falsi on [y_good, y_bad]
    side = 0  # which end was kept last time (for the Illinois halving)
    for _ in range(200):
        finite = math.isfinite(g_bad) and math.isfinite(g_good)
        if finite and g_bad != g_good:
            y = y_good - g_good * (y_bad - y_good) / (g_bad - g_good)
        else:
            y = 0.5 * (y_good + y_bad)
        width = abs(y_bad - y_good)
        # keep the new point off the ends (regula falsi can creep along one of them)
        lo_y, hi_y = min(y_good, y_bad), max(y_good, y_bad)
        y = min(max(y, lo_y + 0.01 * width), hi_y - 0.01 * width)
        if not lo_y < y < hi_y:
            break
        gy = g(y)
        if inside(y):
            return math.exp(y)
        if gy > 0.0:
            y_bad, g_bad = y, gy
            if side == 1:
                g_good *= 0.5
            side = 1
        else:
            y_good, g_good = y, gy
            if side == -1:
                g_bad *= 0.5
            side = -1
    # The bracket collapsed without a value inside the window: epsilon jumps across it (an
    # accountant whose answer is piecewise constant in the parameter). The safe end is still
    # conservative (epsilon <= target); say that the window was missed.
    logger.warning(
        "calibration: epsilon jumps across [%.10g, %.10g] near %.10g; returning the nearest "
        "value found below the window", floor, target, math.exp(y_good),
    )
    return math.exp(y_good)


def noise_multiplier(
    epsilon: float,
    delta: float,
    *,
    steps: int,
    sampling_probability: float = 1.0,
    accountant: AccountantSpec = "pld",
    rtol: float = 1e-4,
    event: EventFactory | None = None,
    allow_approximation: bool = False,
    require_certified: bool = True,
) -> float:
    """The noise multiplier sigma at which ``steps`` steps sampled at rate q are
    (epsilon, delta)-DP by ``accountant`` (default the tight accountant, ``"pld"``):
    epsilon(sigma) in [target (1 - rtol), target], default rtol = 1e-4.

    epsilon(sigma) decreases in sigma; the search runs on log sigma in [1e-3, 1e6] from
    sigma = 1 (module docstring). Raises ValueError if no sigma <= 1e6 reaches the target (e.g.
    a delta below what the accountant can certify) or if even sigma = 1e-3 is private enough.
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

    return _solve_window(
        eps_of, 1.0, _SIGMA_MIN, _SIGMA_MAX, epsilon, rtol, increasing=False,
        unreachable=lambda: (
            f"target (epsilon={epsilon!r}, delta={delta!r}) is unreachable for steps={count}, "
            f"q={q!r}: even noise_multiplier={_SIGMA_MAX:g} gives "
            f"epsilon={eps_of(_SIGMA_MAX):.6g}"
        ),
        nothing_to_do=lambda: (
            f"target epsilon={epsilon!r} is met by every noise_multiplier >= {_SIGMA_MIN:g} "
            f"(steps={count}, q={q!r}); there is nothing to calibrate"
        ),
    )


def sampling_probability(
    epsilon: float,
    delta: float,
    *,
    noise_multiplier: float,
    steps: int,
    accountant: AccountantSpec = "pld",
    rtol: float = 1e-4,
    event: EventFactory | None = None,
    allow_approximation: bool = False,
    require_certified: bool = True,
) -> float:
    """The largest sampling rate q in (0, 1] at which ``steps`` steps with noise multiplier
    sigma are (epsilon, delta)-DP (default accountant ``"pld"``): 1.0 if q = 1 already fits,
    else epsilon(q) in [target (1 - rtol), target]. Raises ValueError if not even q = 1e-12
    fits."""
    epsilon, delta, rtol = _check_target(epsilon, delta, rtol)
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    count = require_count("steps", steps, minimum=1)
    allowed = _allowed(allow_approximation, require_certified)
    problem = _Problem(accountant, delta, event, allowed)

    def eps_of(q: float) -> float:
        return problem.epsilon(sigma, min(q, 1.0), count)

    if eps_of(1.0) <= epsilon:
        return 1.0
    return min(1.0, _solve_window(
        eps_of, 0.5, _Q_MIN, 1.0, epsilon, rtol, increasing=True,
        unreachable=lambda: (
            f"target (epsilon={epsilon!r}, delta={delta!r}) is unreachable with "
            f"noise_multiplier={sigma!r} and steps={count}: even q={_Q_MIN:g} is too much"
        ),
        nothing_to_do=lambda: "q = 1 fits",  # excluded above
    ))


def steps(
    epsilon: float,
    delta: float,
    *,
    noise_multiplier: float,
    sampling_probability: float = 1.0,
    accountant: AccountantSpec = "pld",
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
