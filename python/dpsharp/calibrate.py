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
<= target; an error is raised if the search cannot find one. For the continuous parameters it
is also >= target (1 - rtol), except where the accountant's epsilon jumps across that window
(an answer piecewise constant in the parameter): then the nearest value found below the window
is returned and a warning is logged. Steps are integers: the largest count whose epsilon fits.
An unreachable target raises ValueError saying why.

An accountant that declines to answer at some value (its ValueError or OverflowError: e.g. the
tight accountant at a delta below what it can certify for that many steps, or a transform past
its size limit) gives no epsilon there, and the search never reads it as one: a bracketing step
that lands on a refusal is halved back towards the last answered value, and a refusal the search
cannot step around raises ValueError with the accountant's reason and the values it did answer.

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
#: How many times a bracketing step is halved back towards an answered value when the
#: accountant refuses to answer where it lands (a step of at most a factor 16 shrinks to 16^(1/64)).
_REFUSAL_BACKOFFS = 6


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


class _Refusal(Exception):
    """The accountant declined to answer at one parameter value (its ValueError or
    OverflowError, e.g. a delta below what it can certify for this many steps, or a transform
    beyond its size limit). The search backs off from it where it can; the public functions
    turn one it cannot avoid into a ValueError that carries the accountant's reason."""

    def __init__(
        self, acc: Accountant, noise: float, q: float, count: int, reason: Exception
    ) -> None:
        super().__init__(str(reason))
        self.accountant, self.noise, self.q, self.count, self.reason = (
            acc, noise, q, count, reason)

    def explain(self, known: str = "") -> ValueError:
        """The error a caller sees: where the accountant refused, its reason, what is known."""
        return ValueError(
            f"calibration stopped: the accountant {self.accountant!r} cannot answer at "
            f"noise_multiplier={self.noise!r}, sampling_probability={self.q!r}, "
            f"steps={self.count} ({type(self.reason).__name__}: {self.reason}){known}. Change "
            "the target (e.g. the delta the reason names) or calibrate with another accountant"
        )


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
        self._cache: dict[tuple[float, float, int], float | _Refusal] = {}
        #: Accountant evaluations made (distinct parameter values).
        self.evaluations = 0

    def epsilon(self, noise: float, q: float, count: int) -> float:
        """epsilon(delta) of ``count`` events at (noise, q); each distinct value computed once.
        Raises :class:`_Refusal` where the accountant declines to answer (also cached)."""
        key = (noise, q, count)
        value = self._cache.get(key)
        if value is None:
            try:
                value = self._evaluate(noise, q, count)
            except _Refusal as refusal:
                value = refusal
            self._cache[key] = value
            self.evaluations += 1
        if isinstance(value, _Refusal):
            raise value
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
            # A refusal is no epsilon: not "too much epsilon" (reading it as +inf steered the
            # search to whatever value the accountant happened to answer, e.g. a noise
            # multiplier 7,000 times too large where the tight accountant cannot certify the
            # delta asked for at any noise).
            raise _Refusal(acc, noise, q, count, exc) from exc
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
    parameter: str,
) -> float:
    """x in [lo_limit, hi_limit] with eps_of(x) in [target (1 - rtol), target], eps_of monotone
    in x (``increasing`` or not). Works on y = log x against g(y) = log eps_of(e^y) - log aim,
    aim = target (1 - rtol/2): bracket from ``start`` by secant steps clamped to a factor 16,
    then Illinois regula falsi, bisection where a value is 0 or inf or the step stalls. Returns
    the first evaluated x inside the window (or, if epsilon jumps across the window, the
    nearest evaluated x below it, with a warning). ValueError with ``unreachable()`` if the
    safe end of the range misses the target, with ``nothing_to_do()`` if the other end
    already meets it.

    Where the accountant refuses to answer (:class:`_Refusal`), a bracketing step backs off
    towards the last answered point (halving the step, at most ``_REFUSAL_BACKOFFS`` times);
    a refusal it cannot step around becomes a ValueError naming the refusal and every value
    the accountant did answer (``parameter`` names x in that message).
    """
    answered: dict[float, float] = {}  # x -> epsilon, for the refusal message

    def explain(refusal: _Refusal) -> ValueError:
        known = "; answered: " + ", ".join(
            f"{parameter}={x:.6g} gives epsilon={answered[x]:.6g}" for x in sorted(answered)
        ) if answered else ""
        return refusal.explain(known)

    try:
        return _search_window(lambda x: answered.setdefault(x, eps_of(x)), start,
                              (lo_limit, hi_limit), (target, rtol), increasing,
                              (unreachable, nothing_to_do))
    except _Refusal as refusal:
        raise explain(refusal) from refusal.reason


def _search_window(
    eps_of: Callable[[float], float], start: float, limits: tuple[float, float],
    window: tuple[float, float], increasing: bool,
    messages: tuple[Callable[[], str], Callable[[], str]],
) -> float:
    """The search of :func:`_solve_window` (``limits`` = (lo_limit, hi_limit), ``window`` =
    (target, rtol), ``messages`` = (unreachable, nothing_to_do)); a refusal it cannot step
    around propagates."""
    lo_limit, hi_limit = limits
    target, rtol = window
    unreachable, nothing_to_do = messages
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
        y, gy = _answered_step(g, y, y_next)
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


def _answered_step(g: Callable[[float], float], y_from: float, y_to: float) -> tuple[float, float]:
    """(y, g(y)) for the first y the accountant answers on the way from ``y_to`` back towards
    the answered ``y_from``, halving the distance after each refusal; the last refusal
    propagates once ``_REFUSAL_BACKOFFS`` halvings found no answer."""
    for _ in range(_REFUSAL_BACKOFFS):
        try:
            return y_to, g(y_to)
        except _Refusal:
            y_to = 0.5 * (y_from + y_to)
    return y_to, g(y_to)


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
        parameter="noise_multiplier",
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

    try:
        if eps_of(1.0) <= epsilon:
            return 1.0
    except _Refusal as refusal:
        raise refusal.explain() from refusal.reason
    return min(1.0, _solve_window(
        eps_of, 0.5, _Q_MIN, 1.0, epsilon, rtol, increasing=True,
        unreachable=lambda: (
            f"target (epsilon={epsilon!r}, delta={delta!r}) is unreachable with "
            f"noise_multiplier={sigma!r} and steps={count}: even q={_Q_MIN:g} is too much"
        ),
        nothing_to_do=lambda: "q = 1 fits",  # excluded above
        parameter="sampling_probability",
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
    with T): doubling, then integer bisection. Raises ValueError if not even one step fits, if
    ``max_steps + 1`` steps still fit (the budget allows more than max_steps), or if the
    accountant refuses to answer at a count the search needs (e.g. the tight accountant at a
    delta below what it can certify for that many steps; the message names the largest count
    found to fit)."""
    epsilon = require_positive_finite("epsilon", epsilon)
    delta = require_delta(delta)
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    q = require_probability("sampling_probability", sampling_probability)
    max_steps = require_count("max_steps", max_steps, minimum=1)
    allowed = _allowed(allow_approximation, require_certified)
    problem = _Problem(accountant, delta, event, allowed)

    good = 0  # the largest count found to fit so far

    def fits(count: int) -> bool:
        try:
            return problem.epsilon(sigma, q, count) <= epsilon
        except _Refusal as refusal:
            known = (f"; {good} steps fit (epsilon="
                     f"{problem.epsilon(sigma, q, good):.6g})" if good else "")
            raise refusal.explain(known) from refusal.reason

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
        if fits(max_steps + 1):
            raise ValueError(
                f"the budget allows more than max_steps={max_steps} steps; raise max_steps"
            )
        return max_steps
    bad = min(bad, max_steps)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
