"""Ask every accountant the same question and collect uniform answers, and say them: the privacy
statement and the trade-off figure that ``dpsharp epsilon``, ``dpsharp curve`` and ``dpsharp
demo`` share (so that neither :mod:`dpsharp.cli` nor :mod:`dpsharp.demo` imports the other).
Every number comes from an accountant through the generic interface of
:mod:`dpsharp.accountants.base`; nothing here computes privacy itself."""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpsharp._dpsgd import DPSGDRun
from dpsharp.accountants import Accountant, accountant
from dpsharp.events import Event

__all__ = [
    "AccountantResult",
    "calibrate_noise",
    "describe",
    "epsilon_series",
    "evaluate",
    "format_bound",
    "format_epsilon",
    "print_statement",
    "tradeoff_data",
    "write_tradeoff_figure",
]

# Keys of PrivacyGuarantee.details that mean "the optimal RDP order" in different families.
_ORDER_KEYS = ("order", "optimal_order", "best_order", "alpha", "lambda")


@dataclass
class AccountantResult:
    """One accountant's answer for a run: ``fields`` is the JSON object of the statement."""

    name: str
    accountant: Accountant | None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def applicable(self) -> bool:
        return bool(self.fields.get("applicable"))


def _json_scalar(value: Any) -> Any:
    """Floats that JSON cannot hold (inf, nan) become None; numpy scalars become Python ones."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, str) or value is None:
        return value
    return None


def build_accountant(run: DPSGDRun, name: str) -> tuple[Accountant | None, str | None]:
    """A fresh accountant ``name`` configured for the run's sampling, or (None, why not)."""
    options = run.accountant_options(name)
    try:
        acc = accountant(name, **options)
    except (TypeError, ValueError) as exc:
        if "neighbouring" in options and "neighbouring" in str(exc):
            return None, (
                f"the {name} accountant cannot state guarantees under "
                f"{run.neighbouring.value}, which {run.sampling} sampling is accounted under"
            )
        return None, f"cannot be configured for {run.sampling} sampling: {exc}"
    reason = acc.unsupported_reason(run.event)
    if reason is not None:
        return None, reason
    return acc, None


def evaluate(run: DPSGDRun, name: str, delta: float) -> AccountantResult:
    """Compose the run into accountant ``name`` and report its guarantee at ``delta``.

    The fields are: ``applicable``; if not, ``reason``; else ``options`` (the accountant's
    constructor options: ``dpsharp.accountant(name, **options)`` reproduces it), ``epsilon`` (the reported number:
    a certified upper bound when ``certified``), ``epsilon_lower`` (a proven lower bound or
    None), ``certified``, ``neighbouring``, ``warning``, the accountant's details (e.g. the
    RDP ``order``), and the family's parameter where it has one: ``mu`` (GDP), ``rho`` (zCDP),
    ``gdp_mu`` (the tight accountant's certified GDP parameter) with ``gdp_mu_informative``
    (whether statements show it, :func:`gdp_mu_is_informative`).
    """
    acc, reason = build_accountant(run, name)
    if acc is None:
        return AccountantResult(name, None, {"applicable": False, "reason": reason})
    options = {**acc.state_dict()["options"], **run.accountant_options(name)}
    try:
        acc.compose(run.event, run.count)
        guarantee = acc.guarantee(delta)
    except (ValueError, ArithmeticError) as exc:
        return AccountantResult(name, None, {"applicable": False, "reason": str(exc)})
    fields: dict[str, Any] = {
        "applicable": True,
        "epsilon": _json_scalar(guarantee.epsilon),
        "epsilon_lower": _json_scalar(guarantee.epsilon_lower),
        "certified": bool(guarantee.certified),
        "neighbouring": guarantee.neighbouring.value,
        "warning": guarantee.warning,
        "options": options,
    }
    for key, value in guarantee.details.items():
        scalar = _json_scalar(value)
        if scalar is not None or value is None:
            fields.setdefault(str(key), scalar)
    if "order" not in fields:
        for key in _ORDER_KEYS[1:]:
            if fields.get(key) is not None:
                fields["order"] = fields[key]
                break
    for attribute in ("mu", "rho"):
        if attribute not in fields and hasattr(type(acc), attribute):
            fields[attribute] = _json_scalar(getattr(acc, attribute))
    gdp_mu = getattr(acc, "gdp_mu", None)
    if callable(gdp_mu) and "gdp_mu" not in fields:
        try:
            fields["gdp_mu"] = _json_scalar(gdp_mu())
        except ValueError:
            fields["gdp_mu"] = None
        fields["gdp_mu_informative"] = gdp_mu_is_informative(fields["gdp_mu"], clt_mu(run))
    return AccountantResult(name, acc, fields)


#: A certified GDP mu is shown next to the central-limit one only within this factor of it.
INFORMATIVE_MU_RATIO = 2.0


def clt_mu(run: DPSGDRun) -> float | None:
    """The central-limit mu of the GDP accountant for the run (Bu et al. 2020, an
    approximation), or None where that accountant does not apply."""
    if "gdp" not in _names():
        return None
    gdp, _ = build_accountant(run, "gdp")
    if gdp is None:
        return None
    try:
        gdp.compose(run.event, run.count)
        return float(gdp.mu)  # type: ignore[attr-defined]
    except (ValueError, ArithmeticError):
        return None


def gdp_mu_is_informative(certified: float | None, central_limit: float | None) -> bool:
    """Whether the tight accountant's certified GDP mu (``gdp_mu()``) says something about the
    run: finite and at most ``INFORMATIVE_MU_RATIO`` times the central-limit mu (any finite one
    when there is no central-limit mu).

    It is always a true statement (the composition's trade-off curve lies above G_mu at every
    type I error), but a Poisson-subsampled composition of finitely many steps is mu-GDP only
    for mu >= mu_0 = sqrt(sum_i 1/sigma_i^2), the mu of the same steps without sampling: with
    probability prod_i q_i every step samples the record, and that event's tail decays like
    G_{mu_0}'s (see ``PLDAccountant.gdp_mu``). For a subsampled run mu_0 is far above the
    central-limit mu that describes the bulk of the curve (107.8 against 0.57 for 60 epochs of
    MNIST), so the certified mu is then true but useless, and the statement and the trade-off
    figure leave it out; the certified statement is the (epsilon, delta) and the curve itself.
    """
    if certified is None or not math.isfinite(certified):
        return False
    return central_limit is None or certified <= INFORMATIVE_MU_RATIO * central_limit


def epsilon_series(
    run: DPSGDRun, name: str, delta: float, *, points: int = 40
) -> tuple[np.ndarray, np.ndarray] | None:
    """epsilon(delta) of accountant ``name`` after each of ``points`` evenly spaced prefixes of
    the run (x in epochs), or None if the accountant cannot analyse the run.

    Each point is a fresh accountant composed with that prefix, so it is exactly the number
    ``dpsharp epsilon`` reports for that many steps (an incrementally grown accountant may
    differ in the last digits, where its caches depend on when it was queried).
    """
    acc, _ = build_accountant(run, name)
    if acc is None:
        return None
    total = run.count
    marks = sorted({math.ceil(k * total / min(points, total)) for k in range(1, min(points, total) + 1)})
    xs, ys = [], []
    for mark in marks:
        acc, _ = build_accountant(run, name)
        assert acc is not None
        try:
            epsilon = acc.compose(run.event, mark).epsilon(delta)
        except (ValueError, ArithmeticError):
            return None  # the accountant refused part of the curve: leave it out, not half-drawn
        xs.append(float(mark) if run.sampling == "shuffle" else mark * run.batch_size / run.dataset_size)
        ys.append(epsilon)
    return np.asarray(xs), np.asarray(ys)


def tradeoff_data(run: DPSGDRun, delta: float, alphas: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """The curves of Bu et al. 2020's Figure 3 for the run's composition, from the accountants:

    * ``pld``: the tight accountant's certified trade-off curve f(alpha) (type II error of the
      best test at type I error alpha);
    * ``gdp_certified``: G_mu with the tight accountant's certified mu (``gdp_mu()``),
      G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu) (Dong, Roth, Su 2019), a proven lower bound of
      the curve; only where that mu is informative (``gdp_mu_informative``, see
      :func:`gdp_mu_is_informative`): for a Poisson-subsampled run it is sqrt(T)/sigma, and G_mu
      would lie on the axes;
    * ``gdp_clt``: G_mu with the central-limit mu of the GDP accountant (an approximation);
    * ``eps_delta``: f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps alpha,
      e^-eps (1 - delta - alpha)) at the PLD's certified epsilon(delta), and ``eps_delta_rdp``
      at the RDP accountant's epsilon (the moments-accountant curve of the figure).
    """
    from dpsharp import tradeoff

    alphas = np.asarray(alphas, dtype=float)
    pld, reason = build_accountant(run, "pld")
    if pld is None:
        raise ValueError(f"the trade-off curve needs the pld accountant, which {reason}")
    pld.compose(run.event, run.count)
    out: dict[str, Any] = {"alpha": alphas}
    out["pld"] = np.asarray(pld.tradeoff(alphas), dtype=float)  # type: ignore[attr-defined]
    mu = float(pld.gdp_mu())  # type: ignore[attr-defined]
    out["gdp_mu_certified"] = mu
    out["gdp_mu_informative"] = gdp_mu_is_informative(mu, clt_mu(run))
    if out["gdp_mu_informative"]:
        out["gdp_certified"] = np.asarray(tradeoff.gaussian_tradeoff(alphas, mu), dtype=float)
    epsilon = pld.epsilon(delta)
    out["epsilon_pld"] = epsilon
    out["eps_delta"] = np.asarray(tradeoff.eps_delta_tradeoff(alphas, epsilon, delta), dtype=float)
    gdp, _ = build_accountant(run, "gdp") if "gdp" in _names() else (None, None)
    if gdp is not None:
        gdp.compose(run.event, run.count)
        out["gdp_mu_clt"] = float(gdp.mu)  # type: ignore[attr-defined]
        out["gdp_clt"] = np.asarray(tradeoff.gaussian_tradeoff(alphas, out["gdp_mu_clt"]), dtype=float)
    rdp, _ = build_accountant(run, "rdp") if "rdp" in _names() else (None, None)
    if rdp is not None:
        rdp.compose(run.event, run.count)
        out["epsilon_rdp"] = rdp.epsilon(delta)
        out["eps_delta_rdp"] = np.asarray(
            tradeoff.eps_delta_tradeoff(alphas, out["epsilon_rdp"], delta), dtype=float
        )
    return out


def _names() -> list[str]:
    from dpsharp.accountants import available

    return available()


def calibrate_noise(
    event_for: Callable[[float], Event],
    count: int,
    name: str,
    *,
    target_epsilon: float,
    delta: float,
    options: dict[str, Any] | None = None,
    epsilon_tolerance: float | None = None,
    require_certified: bool = True,
    sampling_probability: float = 1.0,
) -> float:
    """The noise multiplier sigma with epsilon(delta) of ``count`` runs of ``event_for(sigma)``
    under accountant ``name`` in [target (1 - rtol), target], from
    :func:`dpsharp.calibrate.noise_multiplier` (conservative: achieved <= target), so that the
    command and the API give one number for one question. ``epsilon_tolerance`` is absolute
    (Opacus' convention) and becomes rtol = tolerance / target (at most 0.25); without it,
    the API's default rtol. ``sampling_probability`` only names the run's rate in the search's
    messages (``event_for`` builds the events)."""
    from dpsharp import calibrate

    options = dict(options or {})
    tolerance: dict[str, float] = {}
    if epsilon_tolerance is not None:
        tolerance["rtol"] = min(0.25, epsilon_tolerance / target_epsilon)
    return float(
        calibrate.noise_multiplier(
            target_epsilon,
            delta,
            steps=count,
            sampling_probability=sampling_probability,
            accountant=lambda: accountant(name, **options),
            event=lambda sigma, _q: event_for(sigma),
            require_certified=require_certified,
            **tolerance,
        )
    )


# ---------------------------------------------------------------------------- statements
#: Why a statement shows no certified GDP mu (:func:`gdp_mu_is_informative`).
HIDDEN_GDP_MU = (
    "No certified GDP mu is shown: a subsampled run of finitely many steps is mu-GDP only for "
    "mu >= sqrt(sum of 1/sigma^2 over its steps) (the event that every step samples the "
    "record), far above the central-limit mu; the certified statements are the epsilon above "
    "and the trade-off curve."
)
#: Short names of the neighbouring relations for statements (the Assumption line says them in
#: full, from dpsharp.events.RELATION_WORDS).
RELATION_NAMES = {
    "add_remove": "add/remove-one",
    "zero_out": "zero-out",
    "replace_one": "replace-one",
}


#: A format spec :func:`format_bound` rounds in a direction: [width].precision and f, g or no
#: type (Python's float formats: f counts decimals, g and no type count significant digits).
_BOUND_SPEC = re.compile(r"^(?P<width>\d*)\.(?P<precision>\d+)(?P<type>[fg]?)$")
#: The decimal rounding of each side: a printed upper bound is at least the float, a printed
#: lower bound at most the float; an estimate is rounded to nearest.
_ROUNDINGS = {"upper": decimal.ROUND_CEILING, "lower": decimal.ROUND_FLOOR,
              "nearest": decimal.ROUND_HALF_EVEN}


def format_bound(value: float | None, spec: str = ".4f", *, side: str) -> str:
    """``value`` formatted as ``format(value, spec)`` would, but rounded towards the safe side.

    Round-to-nearest can print a certified upper bound below the float it states (1.82833
    printed "1.8283" is not a proven epsilon) or a lower bound above it. Here ``side="upper"``
    rounds up (the printed number is >= ``value``), ``"lower"`` rounds down (<=) and
    ``"nearest"`` is the plain format, for estimates. The rounding is done on the exact
    decimal expansion of the float (:class:`decimal.Decimal` of a float is exact), so a value
    representable at the printed precision (2.5 at 4 decimals) prints unchanged and no
    intermediate product rounds. ``spec`` is ``[width].precision`` followed by ``f`` (decimals),
    ``g`` or nothing (significant digits, as ``{:6.3}``). None (a non-finite epsilon in JSON)
    and infinities print as "inf", NaN as "nan".
    """
    match = _BOUND_SPEC.match(spec)
    if match is None:
        raise ValueError(f"spec must be [width].precision[f|g], got {spec!r}")
    if side not in _ROUNDINGS:
        raise ValueError(f"side must be one of {', '.join(_ROUNDINGS)}, got {side!r}")
    if value is None:
        value = math.inf
    value = float(value)
    if side == "nearest" or not math.isfinite(value):
        return format(value, spec)
    exact = decimal.Decimal(value)
    precision = int(match["precision"])
    if match["type"] == "f":
        quantum = decimal.Decimal(1).scaleb(-precision)
    else:  # significant digits: the last one kept is at 10^(adjusted exponent - precision + 1)
        digits = max(precision, 1)
        quantum = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = exact.quantize(quantum, rounding=_ROUNDINGS[side],
                             context=decimal.Context(prec=1000))
    if rounded == 0:
        rounded = abs(rounded)  # no "-0.0000" for a lower bound of -0.0
    if match["type"] == "f":
        return format(rounded, spec)  # exact: the Decimal is printed digit for digit
    # ``rounded`` has at most ``digits`` significant digits, so the nearest float printed at
    # that many digits is ``rounded`` again (a 9.996 rounded up to 10.0 keeps 3 digits)
    return format(float(rounded), spec)


def format_epsilon(value: float | None, digits: int = 4, *, side: str = "upper") -> str:
    """``value`` with ``digits`` decimals, rounded towards ``side`` (:func:`format_bound`: up
    for a certified upper bound, down for a lower bound, to nearest for an approximation);
    None (a non-finite epsilon in JSON) is "inf"."""
    return format_bound(value, f".{digits}f", side=side)


def _side(fields: dict[str, Any]) -> str:
    """How an accountant's reported numbers (epsilon, mu, rho) are rounded for print: up where
    they are certified upper bounds, to nearest where they are approximations."""
    return "upper" if fields.get("certified") else "nearest"


def describe(fields: dict[str, Any], *, with_warning: bool = True) -> str:
    """One accountant's answer in words: certified upper bound or approximation, its lower
    bound, order, mu, certified GDP mu (where informative), rho and warning."""
    if not fields["applicable"]:
        return f"not applicable: {fields['reason']}"
    parts = ["certified upper bound" if fields["certified"] else "approximation"]
    side = _side(fields)
    if fields.get("epsilon_lower") is not None:
        parts.append(f"lower bound {format_epsilon(fields['epsilon_lower'], side='lower')}")
    if fields.get("order") is not None:
        parts.append(f"order {fields['order']:g}")
    if fields.get("mu") is not None:
        parts.append(f"mu = {format_bound(fields['mu'], '.4g', side=side)}")
    if fields.get("gdp_mu") is not None and fields.get("gdp_mu_informative", True):
        parts.append(f"certified GDP mu = {format_bound(fields['gdp_mu'], '.4g', side='upper')}")
    if fields.get("rho") is not None:
        parts.append(f"rho = {format_bound(fields['rho'], '.4g', side=side)}")
    text = "; ".join(parts)
    if fields.get("warning") and with_warning:
        text += f". Warning: {fields['warning']}"
    return text


def _parameter_text(value: float, *, side: str) -> str:
    """``value`` in six significant digits: as ``format(value, ".6g")`` where that text reads
    back as the same double (0.01 is the run's 0.01), else rounded towards ``side``
    (:func:`format_bound`)."""
    text = format(value, ".6g")
    return text if float(text) == value else format_bound(value, ".6g", side=side)


def run_description(run: DPSGDRun, *, delta: float, epochs: float | None = None,
                    sample_rate_only: bool = False) -> str:
    """The run in one sentence: sizes (or the sampling rate alone), length, noise, delta.

    "E epochs" means ceil(E n / B) steps, as the command line's ``--epochs`` counts them; a run
    whose passes over the data took another number of steps (a loader's epochs of ceil(n / B)
    batches) is described by its steps, with its passes beside them, so that the statement
    reproduces with ``--steps``. The sampling rate is rounded up and the noise multiplier down
    (a run recomputed from the printed numbers is charged at least as much); delta is printed
    exactly."""
    from dpsharp._dpsgd import steps_for_epochs

    if epochs is None:
        length = f"{run.steps} steps = {run.epochs:.4g} epochs"
    elif steps_for_epochs(epochs, run.dataset_size, run.batch_size) == run.steps:
        length = f"{epochs:g} epochs = {run.steps} steps"
    else:
        length = f"{run.steps} steps (in {epochs:g} passes over the data)"
    rate = _parameter_text(run.sampling_probability, side="upper")
    data = (f"Poisson sampling rate q = {rate}" if sample_rate_only
            else f"{run.dataset_size} examples, batch size {run.batch_size}")
    sigma = _parameter_text(run.noise_multiplier, side="lower")
    return (f"DP-SGD with {data}, {length}, noise multiplier {sigma} "
            f"(noise std / clipping norm), delta = {delta!r}.")


def print_statement(
    run: DPSGDRun,
    results: Sequence[AccountantResult],
    *,
    delta: float,
    epochs: float | None = None,
    sample_rate_only: bool = False,
) -> None:
    """Print the privacy statement of ``run`` (``dpsharp epsilon``, ``dpsharp demo``): the
    assumption, one line per accountant (certified bound or labelled approximation), the
    tightest certified (epsilon, delta) and the GDP parameters."""
    import dpsharp

    print(f"dpsharp {dpsharp.__version__} privacy statement")
    print(run_description(run, delta=delta, epochs=epochs, sample_rate_only=sample_rate_only))
    print(f"Assumption: {run.assumption()}")
    print()
    width = max(len(result.name) for result in results)
    for result in results:
        fields = result.fields
        value = (format_epsilon(fields.get("epsilon"), side=_side(fields))
                 if fields["applicable"] else "-")
        print(f"  {result.name:<{width}}  epsilon = {value:>9}  ({describe(fields)})")
    certified = [r for r in results if r.applicable and r.fields["certified"]]
    print()
    if certified:
        best = min(certified, key=lambda r: math.inf if r.fields["epsilon"] is None
                   else r.fields["epsilon"])
        print(
            f"The run is ({format_epsilon(best.fields['epsilon'])}, {delta!r})-DP under "
            f"{RELATION_NAMES[run.neighbouring.value]} neighbouring (certified, {best.name} "
            "accountant). Approximations are labelled and are not bounds."
        )
    tight = next((r for r in results if r.applicable and "gdp_mu" in r.fields), None)
    gdp = tight if tight is not None and tight.fields.get("gdp_mu_informative") else None
    clt = next((r for r in results
                if r.applicable and r.name == "gdp" and r.fields.get("mu") is not None), None)
    if gdp is not None or clt is not None:
        pieces = []
        if gdp is not None:
            shown = format_bound(gdp.fields["gdp_mu"], ".4g", side="upper")
            pieces.append(f"certified mu = {shown} ({gdp.name}: proven, every "
                          "test of the run is at least as hard as telling N(0,1) from N(mu,1))")
        if clt is not None:
            shown = format_bound(clt.fields["mu"], ".4g", side=_side(clt.fields))
            pieces.append(f"central-limit mu = {shown} (approximation)")
        print("Gaussian DP: " + "; ".join(pieces) + ".")
        if tight is not None and gdp is None:
            print(HIDDEN_GDP_MU)


# ---------------------------------------------------------------------------- figures
def _tradeoff_alphas() -> np.ndarray:
    """Type I errors of the trade-off figure: 0, a geometric run to 0.01 (where the curves fall
    fastest), then evenly spaced to 1."""
    alphas = np.concatenate([np.geomspace(1e-6, 1e-2, 40, endpoint=False),
                             np.linspace(1e-2, 1.0, 161)])
    return np.concatenate([[0.0], alphas])


def write_tradeoff_figure(
    run: DPSGDRun, delta: float, path: Any, *, title: str | None = None
) -> dict[str, Any]:
    """Draw the composition's certified trade-off curve next to G_mu (the certified mu where it
    is informative, and the CLT mu) and the (epsilon, delta) curves to ``path``; returns the
    data of :func:`tradeoff_data` (arrays as lists).

    Where the certified mu is not informative (:func:`gdp_mu_is_informative`: for a
    Poisson-subsampled run it is sqrt(T)/sigma and G_mu would lie on the axes) it is not drawn,
    and a line of the legend says so with its value; so is any other curve that lies on the
    axes (:data:`dpsharp.plots.ON_AXES`).
    """
    from dpsharp import plots

    alphas = _tradeoff_alphas()
    data = tradeoff_data(run, delta, alphas)
    curves: dict[str, Any] = {"tight accountant (certified)": data["pld"]}
    if "gdp_certified" in data:
        shown = format_bound(data["gdp_mu_certified"], ".3g", side="upper")
        curves[f"G_mu, certified mu = {shown} (proven lower bound)"] = data["gdp_certified"]
    if "gdp_clt" in data:
        curves[f"G_mu, CLT mu = {data['gdp_mu_clt']:.3g} (approx.)"] = data["gdp_clt"]
    shown = format_bound(data["epsilon_pld"], ".3g", side="upper")
    curves[f"({shown}, {delta!r})-DP, tight"] = data["eps_delta"]
    if "eps_delta_rdp" in data:
        shown = format_bound(data["epsilon_rdp"], ".3g", side="upper")
        curves[f"({shown}, {delta!r})-DP, RDP"] = data["eps_delta_rdp"]
    not_drawn = []
    if "gdp_certified" not in data:
        mu = data["gdp_mu_certified"]
        shown = format_bound(mu, ".3g", side="upper")
        not_drawn.append(f"certified G_mu not drawn: mu = {shown} is\nsqrt(T)/sigma for a "
                         "subsampled run (uninformative)")
    if title is None:
        title = (f"n={run.dataset_size}, B={run.batch_size}, "
                 f"sigma={run.noise_multiplier:.3g}, T={run.steps}")
    plots.tradeoff_curves(curves, alphas=alphas, title=title, not_drawn=not_drawn, path=path)
    return {key: (value.tolist() if isinstance(value, np.ndarray) else value)
            for key, value in data.items()}
