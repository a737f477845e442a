"""Bad input raises, never answers with a number.

Two parts:

* regressions: each input below used to get a number, a KeyError / IndexError / unhashable
  error the user cannot act on, or was silently coerced (a bool read as 1.0, a string parsed,
  2.7 steps truncated to 2);
* an audit table over every public function, constructor and accountant method of dpsharp
  (``dpsharp.__all__``, tradeoff, rdp, calibrate, composition, events, tuning events,
  accountants, plots): for each numeric argument it passes a bool, a string, None, NaN, inf
  and the values outside the documented range, and asserts a TypeError or ValueError whose
  message names the argument. A completeness check makes every parameter of every public
  callable either part of the table or listed as non-numeric, so a new argument cannot skip
  the audit. NumPy scalars (``np.float64``, ``np.int64``) and arrays stay accepted.

The compatibility adapters (``dpsharp.compat``) have their own bad-input tests.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpsharp
from dpsharp import calibrate, composition, events, plots, rdp, tradeoff, tuning_events
from dpsharp.accountants import classic as classic_module
from dpsharp.accountants import gdp as gdp_module
from dpsharp.accountants import registry
from dpsharp.accountants import zcdp as zcdp_module
from dpsharp.accountants.base import Accountant
from dpsharp.accountants.pld import PLDAccountant
from dpsharp.accountants.rdp import RDPAccountant
from dpsharp.accountants.zcdp import (
    zcdp_delta,
    zcdp_epsilon,
    zcdp_epsilon_bun_steinke,
    zcdp_epsilon_cks,
)
from dpsharp.bench import precision
from dpsharp.events import Gaussian, PoissonSampled

NAN, INF = math.nan, math.inf


def _raises_naming(name: str, call: Callable[[], Any]) -> BaseException:
    """Run ``call``; it must raise TypeError or ValueError whose message names ``name``."""
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert name in str(info.value), f"the error does not name {name!r}: {info.value}"
    return info.value


# =============================================================================== regressions
ZCDP_CONVERSIONS = {
    "zcdp_epsilon_bun_steinke": lambda alpha_max: zcdp_epsilon_bun_steinke(
        1.0, 1e-5, alpha_max=alpha_max
    ),
    "zcdp_epsilon_cks": lambda alpha_max: zcdp_epsilon_cks(1.0, 1e-5, alpha_max=alpha_max),
    "zcdp_epsilon": lambda alpha_max: zcdp_epsilon(1.0, 1e-5, alpha_max=alpha_max),
    "zcdp_delta": lambda alpha_max: zcdp_delta(1.0, 1.0, alpha_max=alpha_max),
    "zcdp_epsilon_bun_steinke rho=0": lambda alpha_max: zcdp_epsilon_bun_steinke(
        0.0, 1e-5, alpha_max=alpha_max
    ),
}


@pytest.mark.parametrize("function", sorted(ZCDP_CONVERSIONS))
@pytest.mark.parametrize("alpha_max", [0.5, -3.0, NAN, 1.0, 1, 0.0, -INF])
def test_zcdp_alpha_max_must_be_an_order_above_one(function: str, alpha_max: float) -> None:
    """The conversions minimise over 1 < alpha <= alpha_max: an empty range is an error (it
    gave epsilon = -22.5 for alpha_max = 0.5, NaN for NaN, a ZeroDivisionError for 1.0, and
    CKS / zcdp_delta ignored a NaN restriction)."""
    error = _raises_naming("alpha_max", lambda: ZCDP_CONVERSIONS[function](alpha_max))
    assert isinstance(error, ValueError) and "(1, inf]" in str(error)


@pytest.mark.parametrize("function", sorted(ZCDP_CONVERSIONS))
@pytest.mark.parametrize("alpha_max", [True, "2", [3.0], 2 + 0j])
def test_zcdp_alpha_max_must_be_a_real_number(function: str, alpha_max: object) -> None:
    error = _raises_naming("alpha_max", lambda: ZCDP_CONVERSIONS[function](alpha_max))
    assert isinstance(error, TypeError)


def test_zcdp_alpha_max_valid_range_keeps_its_closed_forms() -> None:
    """Right above the refused range the answers are the paper's closed forms: with alpha* =
    1 + sqrt(log(1/delta)/rho) > alpha_max, Bun-Steinke is eq. (16) of Yu et al. 2019,
    rho alpha_max + log(1/delta)/(alpha_max - 1); alpha_max = inf is no restriction."""
    rho, delta = 1.0, 1e-5
    log_inv = math.log(1.0 / delta)
    for alpha_max in (1.0 + 2.0**-40, 1.5, 2.0, np.float64(3.0), 4):
        expected = rho * float(alpha_max) + log_inv / (float(alpha_max) - 1.0)
        got = zcdp_epsilon_bun_steinke(rho, delta, alpha_max=alpha_max)  # type: ignore[arg-type]
        assert got == pytest.approx(expected, rel=1e-12)
        # CKS at any single order alpha <= alpha_max is below Bun-Steinke's at that order
        assert zcdp_epsilon_cks(rho, delta, alpha_max=alpha_max) <= got  # type: ignore[arg-type]
    assert zcdp_epsilon_bun_steinke(rho, delta, alpha_max=INF) == pytest.approx(
        rho + 2.0 * math.sqrt(rho * log_inv), rel=1e-15
    )
    assert zcdp_epsilon_bun_steinke(0.0, delta, alpha_max=INF) == 0.0
    assert zcdp_epsilon_bun_steinke(0.0, delta, alpha_max=2.0) == pytest.approx(log_inv)
    assert zcdp_epsilon_cks(rho, delta, alpha_max=INF) == zcdp_epsilon_cks(rho, delta)
    assert zcdp_delta(rho, 5.0, alpha_max=INF) == zcdp_delta(rho, 5.0)


TRADEOFF_CALLS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "gaussian_tradeoff": (tradeoff.gaussian_tradeoff, {"alpha": 0.5, "mu": 1.0}),
    "eps_delta_tradeoff": (
        tradeoff.eps_delta_tradeoff, {"alpha": 0.5, "epsilon": 1.0, "delta": 1e-5}
    ),
    "gdp_delta": (tradeoff.gdp_delta, {"epsilon": 1.0, "mu": 1.0}),
    "gdp_log_delta": (tradeoff.gdp_log_delta, {"epsilon": 1.0, "mu": 1.0}),
    "gdp_epsilon": (tradeoff.gdp_epsilon, {"delta": 1e-5, "mu": 1.0}),
}


@pytest.mark.parametrize(
    ("function", "argument"),
    [(name, arg) for name, (_, kwargs) in TRADEOFF_CALLS.items() for arg in kwargs],
)
@pytest.mark.parametrize(
    "value", [True, False, "0.5", np.bool_(True), [True], ["0.5"], [0.5, True], np.array([True])]
)
def test_tradeoff_refuses_bools_and_strings(function: str, argument: str, value: object) -> None:
    """gdp_epsilon(1e-5, True) was 4.377 (True read as mu = 1) and gaussian_tradeoff('0.5', 1.0)
    parsed the string; a bool inside a list became 1.0."""
    call, kwargs = TRADEOFF_CALLS[function]
    error = _raises_naming(argument, lambda: call(**{**kwargs, argument: value}))
    assert isinstance(error, TypeError)


def test_rdp_orders_refuse_bools_and_strings() -> None:
    """RDPAccountant(orders='2') and poisson_gaussian_rdp(0.1, 1.0, '2') parsed the string."""
    for orders in ("2", ["2"], True, [2.0, True], np.array(["2"])):
        assert isinstance(_raises_naming("orders", lambda: RDPAccountant(orders=orders)), TypeError)
        error = _raises_naming("orders", lambda: rdp.poisson_gaussian_rdp(0.1, 1.0, orders))
        assert isinstance(error, TypeError)
    for values in ("1", [True], [1.0, True]):
        error = _raises_naming("rdp", lambda: rdp.epsilon_from_rdp([2.0], values, 1e-5))
        assert isinstance(error, TypeError)


def test_pld_tradeoff_refuses_bools_strings_and_scalars() -> None:
    """PLDAccountant.tradeoff([True]) answered [0.] (True read as alpha = 1); tradeoff('0.5')
    and tradeoff(0.5) ended in an IndexError."""
    acc = PLDAccountant().compose(Gaussian(1.0))
    for alphas in ([True], "0.5", ["0.5"], [0.5, True], np.array([True]), [None]):
        assert isinstance(_raises_naming("alphas", lambda: acc.tradeoff(alphas)), TypeError)
    error = _raises_naming("alphas", lambda: acc.tradeoff(0.5))
    assert isinstance(error, TypeError) and "[0.5]" in str(error)
    for alphas in ([NAN], [-0.1], [1.5], [INF]):
        assert isinstance(_raises_naming("alphas", lambda: acc.tradeoff(alphas)), ValueError)


def test_grid_file_refuses_non_integer_steps(tmp_path: Path) -> None:
    """"steps": 2.7 ran 2 steps; strings, bools and misspelt keys are refused the same way,
    with one line naming the entry and the field, also from the command line."""
    from dpsharp.cli import main

    path = tmp_path / "g.json"
    cases = [
        ({"q": 0.01, "sigma": 1.5, "steps": 2.7}, "steps"),
        ({"q": 0.01, "sigma": 1.5, "T": 2.5}, "T"),
        ({"q": 0.01, "sigma": 1.5, "steps": True}, "steps"),
        ({"q": 0.01, "sigma": 1.5, "steps": "10"}, "steps"),
        ({"q": "0.01", "sigma": 1.5, "steps": 10}, "q"),
        ({"q": 0.01, "sigma": True, "steps": 10}, "sigma"),
        ({"q": 0.01, "sigma": 1.5, "steps": 10, "delta": "1e-5"}, "delta"),
        ({"q": 0.01, "sigma": 1.5, "steps": 10, "detla": 1e-3}, "detla"),
        ({"q": 0.01, "sigma": 1.5, "steps": 10, "T": 20}, "T"),
    ]
    for item, name in cases:
        path.write_text(json.dumps([item]))
        error = _raises_naming(name, lambda: precision.load_grid(path))
        assert isinstance(error, ValueError) and "entry 0" in str(error)
    path.write_text(json.dumps([{"q": 0.01, "sigma": 1.5, "steps": 2.7}]))
    assert main(["bench", "precision", "--grid", str(path), "--no-peers"]) == 2
    # an integral JSON number is an integer: 1e2 is 100 steps
    path.write_text(json.dumps([{"q": 0.01, "sigma": 1.5, "steps": 1e2}]))
    assert [s.steps for s in precision.load_grid(path)] == [100]
    missing = tmp_path / "missing.json"
    error = _raises_naming("missing.json", lambda: precision.load_grid(missing))
    assert isinstance(error, ValueError)


def test_event_from_dict_names_the_missing_field() -> None:
    """event_from_dict({'type': 'Gaussian'}) raised a bare KeyError('noise_multiplier')."""
    error = _raises_naming(
        "noise_multiplier", lambda: events.event_from_dict({"type": "Gaussian"})
    )
    assert isinstance(error, ValueError) and "Gaussian" in str(error)
    error = _raises_naming(
        "sampling_probability",
        lambda: events.event_from_dict(
            {"type": "PoissonSampled", "event": {"type": "Gaussian", "noise_multiplier": 1.0}}
        ),
    )
    assert isinstance(error, ValueError)
    # an unexpected field (a typo) is refused, not ignored
    typo = {"type": "Gaussian", "noise_multiplier": 1.0, "sigma": 2}
    error = _raises_naming("sigma", lambda: events.event_from_dict(typo))
    assert isinstance(error, ValueError)
    for data in ({}, {"type": ["Gaussian"]}, {"type": "Gausian", "noise_multiplier": 1.0}):
        error = _raises_naming("type", lambda: events.event_from_dict(data))
        assert isinstance(error, ValueError) and "'Gaussian'" in str(error)
    error = _raises_naming("data", lambda: events.event_from_dict(["x"]))  # type: ignore[arg-type]
    assert isinstance(error, TypeError)
    # the round trip still works
    event = PoissonSampled(Gaussian(1.5), 0.01)
    assert events.event_from_dict(events.event_to_dict(event)) == event


def test_accountant_lookup_lists_the_valid_names() -> None:
    """accountant(['pld']) raised "unhashable type: 'list'"."""
    for name in (["pld"], None, 3, ("pld",)):
        error = _raises_naming("'pld'", lambda: dpsharp.accountant(name))  # type: ignore[arg-type]
        assert isinstance(error, TypeError) and "accountant name" in str(error)
    error = _raises_naming("'rdp'", lambda: dpsharp.accountant("pdl"))
    assert isinstance(error, ValueError)
    error = _raises_naming("sigma", lambda: dpsharp.accountant("pld", sigma=1.0))
    assert isinstance(error, TypeError) and "precision" in str(error)


# =============================================================================== audit table
COMMON_BAD: list[object] = [True, "0.5", None, NAN, INF]
ARRAY_FORMS: list[object] = [[True], ["0.5"], [0.5, True], np.array(["0.5"]), [None]]
BAD_VALUES: dict[str, list[object]] = {
    "positive": COMMON_BAD + [-1.0, 0.0, -INF],  # (0, inf)
    "probability": COMMON_BAD + [-0.1, 0.0, 1.5],  # (0, 1]
    "delta": COMMON_BAD + [0.0, 1.0, -1e-5, 2.0],  # (0, 1)
    "delta_closed": COMMON_BAD + [-1e-5, 1.0],  # [0, 1)
    "epsilon": COMMON_BAD + [-1.0, -INF],  # [0, inf)
    "real": COMMON_BAD + [-INF, 2 + 0j],  # any finite real
    "count": COMMON_BAD + [-1, 2.5, 3.0, np.float64(3.0)],  # integer >= 0
    "count1": COMMON_BAD + [0, -1, 2.5, 3.0],  # integer >= 1
    "open_unit": COMMON_BAD + [0.0, 1.0, -0.1],  # (0, 1)
    "eta": COMMON_BAD + [-1.0, -2.0],  # (-1, inf)
    "rtol": COMMON_BAD + [0.0, 0.5, -0.1],  # (0, 0.5)
    "alpha_max": [True, "0.5", NAN, -3.0, 0.5, 1.0],  # None or (1, inf]
    "orders": [True, "2", None, NAN, 2 + 0j, *ARRAY_FORMS, [NAN], [INF], [], [0.5], [1.0]],
    "orders_or_none": [True, "2", NAN, *ARRAY_FORMS, [NAN], [], [0.5], [1.0]],
    "curve": [True, "1", None, [True, 1.0], ["1", "1"], [NAN, 1.0], [-1.0, 1.0], [1.0]],
    "alphas": [True, "0.5", None, *ARRAY_FORMS, [NAN], [-0.1], [1.5], [INF]],
    # array-or-scalar arguments of dpsharp.tradeoff (scalar bad values plus list forms)
    "array_unit": COMMON_BAD + [-0.1, 1.5] + ARRAY_FORMS + [[NAN]],  # [0, 1]
    "array_nonneg": COMMON_BAD + [-1.0] + ARRAY_FORMS + [[NAN]],  # [0, inf)
    "array_positive": COMMON_BAD + [0.0, -1.0] + ARRAY_FORMS + [[NAN]],  # (0, inf)
    "array_delta": COMMON_BAD + [0.0, 1.0] + ARRAY_FORMS + [[NAN]],  # (0, 1)
    "list_epsilon": [True, None, [True], ["0.5"], [None], [NAN], [-1.0], [INF]],
    "list_delta": [True, None, [True], ["0.5"], [None], [NAN], [-0.1], [1.0]],
    "list_probability": [True, None, [True], ["0.5"], [None], [NAN], [-0.1], [1.5]],
    "list_count": [True, [True], ["1"], [2.5], [-1], [None]],
}


@dataclass(frozen=True)
class Entry:
    """``call(**valid)`` succeeds; replacing ``valid[name]`` by any value of
    ``BAD_VALUES[kind]`` (for each ``name: kind`` of ``numeric``) raises naming ``name``."""

    key: str
    call: Callable[..., Any]
    valid: dict[str, Any]
    numeric: dict[str, str]
    cleanup: Callable[[Any], None] | None = field(default=None)


def _pld() -> PLDAccountant:
    return PLDAccountant().compose(Gaussian(2.0), 3)


def _close_figure(figure: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(figure)


ORDERS2 = [2.0, 4.0]


def _accountant_method_entries() -> list[Entry]:
    entries = []
    for name in registry.available():
        cls = type(dpsharp.accountant(name))

        def make(name: str = name) -> Accountant:
            return dpsharp.accountant(name).compose(Gaussian(2.0), 3)

        owner = cls.__name__
        entries += [
            Entry(f"{owner}.compose", lambda count, make=make: make().compose(Gaussian(1.0), count),
                  {"count": 2}, {"count": "count"}),
            Entry(f"{owner}.epsilon", lambda delta, make=make: make().epsilon(delta),
                  {"delta": 1e-5}, {"delta": "delta"}),
            Entry(f"{owner}.delta", lambda epsilon, make=make: make().delta(epsilon),
                  {"epsilon": 1.0}, {"epsilon": "epsilon"}),
            Entry(f"{owner}.guarantee", lambda delta, make=make: make().guarantee(delta),
                  {"delta": 1e-5}, {"delta": "delta"}),
        ]
    return entries


ENTRIES: list[Entry] = [
    # ------------------------------------------------------------------ events
    Entry("Gaussian", Gaussian, {"noise_multiplier": 1.0}, {"noise_multiplier": "positive"}),
    Entry("Laplace", dpsharp.Laplace, {"scale": 1.0}, {"scale": "positive"}),
    Entry("PoissonSampled", PoissonSampled, {"event": Gaussian(1.0), "sampling_probability": 0.1},
          {"sampling_probability": "probability"}),
    Entry("SampledWithoutReplacement", dpsharp.SampledWithoutReplacement,
          {"event": Gaussian(1.0), "sample_size": 10, "dataset_size": 100},
          {"sample_size": "count1", "dataset_size": "count1"}),
    Entry("Shuffled", dpsharp.Shuffled,
          {"event": Gaussian(1.0), "batch_size": 10, "dataset_size": 100},
          {"batch_size": "count1", "dataset_size": "count1"}),
    Entry("Repeated", dpsharp.Repeated, {"event": Gaussian(1.0), "count": 3}, {"count": "count"}),
    Entry("flatten", events.flatten, {"event": Gaussian(1.0), "count": 3}, {"count": "count"}),
    Entry("ZCDP", events.ZCDP, {"rho": 0.5, "xi": 0.0}, {"rho": "epsilon", "xi": "epsilon"}),
    Entry("RandomizedResponse", events.RandomizedResponse,
          {"noise_parameter": 0.5, "num_buckets": 3},
          {"noise_parameter": "probability", "num_buckets": "count1"}),
    Entry("DiscreteLaplace", events.DiscreteLaplace, {"noise_parameter": 1.0, "sensitivity": 2},
          {"noise_parameter": "positive", "sensitivity": "count1"}),
    Entry("SingleEpochTreeAggregation", events.SingleEpochTreeAggregation,
          {"noise_multiplier": 1.0, "step_counts": (3, 4)},
          {"noise_multiplier": "positive", "step_counts": "count1"}),
    Entry("GaussianMixture", events.GaussianMixture,
          {"noise_multiplier": 1.0, "sensitivities": (1.0,), "probabilities": (1.0,)},
          {"noise_multiplier": "positive", "sensitivities": "list_epsilon",
           "probabilities": "list_probability"}),
    Entry("ReplaceOnePoissonSampledGaussian", events.ReplaceOnePoissonSampledGaussian,
          {"noise_multiplier": 1.0, "sampling_probability": 0.1},
          {"noise_multiplier": "positive", "sampling_probability": "probability"}),
    Entry("TruncatedPoissonSampledGaussian", events.TruncatedPoissonSampledGaussian,
          {"noise_multiplier": 1.0, "sampling_probability": 0.1, "dataset_size": 100,
           "max_batch_size": 10},
          {"noise_multiplier": "positive", "sampling_probability": "probability",
           "dataset_size": "count1", "max_batch_size": "count1"}),
    Entry("PureDP", dpsharp.PureDP, {"epsilon": 1.0}, {"epsilon": "positive"}),
    Entry("PoissonTuning", dpsharp.PoissonTuning, {"base": Gaussian(1.0), "mean": 3.0},
          {"mean": "positive"}),
    Entry("TruncatedNegativeBinomialTuning", dpsharp.TruncatedNegativeBinomialTuning,
          {"base": Gaussian(1.0), "eta": 1.0, "gamma": 0.1},
          {"eta": "eta", "gamma": "open_unit"}),
    # ------------------------------------------------------------------ tradeoff
    Entry("gaussian_tradeoff", tradeoff.gaussian_tradeoff, {"alpha": 0.5, "mu": 1.0},
          {"alpha": "array_unit", "mu": "array_nonneg"}),
    Entry("eps_delta_tradeoff", tradeoff.eps_delta_tradeoff,
          {"alpha": 0.5, "epsilon": 1.0, "delta": 1e-5},
          {"alpha": "array_unit", "epsilon": "array_nonneg", "delta": "array_unit"}),
    Entry("gdp_delta", tradeoff.gdp_delta, {"epsilon": 1.0, "mu": 1.0},
          {"epsilon": "array_nonneg", "mu": "array_positive"}),
    Entry("gdp_log_delta", tradeoff.gdp_log_delta, {"epsilon": 1.0, "mu": 1.0},
          {"epsilon": "array_nonneg", "mu": "array_positive"}),
    Entry("gdp_epsilon", tradeoff.gdp_epsilon, {"delta": 1e-5, "mu": 1.0},
          {"delta": "array_delta", "mu": "array_positive"}),
    Entry("gdp_mu_for", tradeoff.gdp_mu_for, {"epsilon": 1.0, "delta": 1e-5},
          {"epsilon": "positive", "delta": "delta"}),
    # ------------------------------------------------------------------ rdp
    Entry("poisson_gaussian_rdp", rdp.poisson_gaussian_rdp,
          {"sampling_probability": 0.1, "noise_multiplier": 1.0, "orders": ORDERS2},
          {"sampling_probability": "probability", "noise_multiplier": "positive",
           "orders": "orders"}),
    Entry("gaussian_rdp", rdp.gaussian_rdp, {"noise_multiplier": 1.0, "orders": ORDERS2},
          {"noise_multiplier": "positive", "orders": "orders"}),
    Entry("laplace_rdp", rdp.laplace_rdp, {"scale": 1.0, "orders": ORDERS2},
          {"scale": "positive", "orders": "orders"}),
    Entry("sampled_without_replacement_gaussian_rdp",
          rdp.sampled_without_replacement_gaussian_rdp,
          {"sampling_rate": 0.1, "noise_multiplier": 1.0, "orders": ORDERS2},
          {"sampling_rate": "probability", "noise_multiplier": "positive", "orders": "orders"}),
    Entry("epsilon_from_rdp", rdp.epsilon_from_rdp,
          {"orders": ORDERS2, "rdp": [0.5, 1.0], "delta": 1e-5},
          {"orders": "orders", "rdp": "curve", "delta": "delta"}),
    Entry("delta_from_rdp", rdp.delta_from_rdp,
          {"orders": ORDERS2, "rdp": [0.5, 1.0], "epsilon": 1.0},
          {"orders": "orders", "rdp": "curve", "epsilon": "epsilon"}),
    # ------------------------------------------------------------------ tuning formulas
    Entry("pure_dp_rdp", tuning_events.pure_dp_rdp, {"epsilon": 1.0, "orders": ORDERS2},
          {"epsilon": "positive", "orders": "orders"}),
    Entry("truncated_negative_binomial_mean", tuning_events.truncated_negative_binomial_mean,
          {"eta": 1.0, "gamma": 0.1}, {"eta": "eta", "gamma": "open_unit"}),
    Entry("truncated_negative_binomial_tuning_rdp",
          tuning_events.truncated_negative_binomial_tuning_rdp,
          {"base_rdp": [0.5, 1.0], "orders": ORDERS2, "eta": 1.0, "gamma": 0.1},
          {"base_rdp": "curve", "orders": "orders", "eta": "eta", "gamma": "open_unit"}),
    Entry("rdp_to_delta", tuning_events.rdp_to_delta,
          {"base_rdp": [0.5, 1.0], "orders": ORDERS2, "epsilon": 1.0},
          {"base_rdp": "curve", "orders": "orders", "epsilon": "epsilon"}),
    Entry("poisson_tuning_rdp", tuning_events.poisson_tuning_rdp,
          {"base_rdp": [0.5, 1.0], "orders": ORDERS2, "mean": 3.0},
          {"base_rdp": "curve", "orders": "orders", "mean": "positive"}),
    # ------------------------------------------------------------------ composition theorems
    Entry("basic_composition", composition.basic_composition,
          {"epsilons": [1.0, 0.5], "deltas": [1e-6, 0.0]},
          {"epsilons": "list_epsilon", "deltas": "list_delta"}),
    Entry("advanced_composition", composition.advanced_composition,
          {"epsilon": 0.1, "delta": 1e-6, "steps": 10, "delta_slack": 1e-6},
          {"epsilon": "epsilon", "delta": "delta_closed", "steps": "count",
           "delta_slack": "delta"}),
    Entry("extended_advanced_composition", composition.extended_advanced_composition,
          {"epsilons": [0.1, 0.2], "deltas": [1e-6, 1e-6], "delta_slack": 1e-6,
           "counts": [2, 3]},
          {"epsilons": "list_epsilon", "deltas": "list_delta", "delta_slack": "delta",
           "counts": "list_count"}),
    Entry("optimal_composition_delta", composition.optimal_composition_delta,
          {"epsilon": 0.1, "delta": 1e-6, "steps": 10, "epsilon_total": 1.0},
          {"epsilon": "epsilon", "delta": "delta_closed", "steps": "count",
           "epsilon_total": "epsilon"}),
    Entry("optimal_composition_epsilon", composition.optimal_composition_epsilon,
          {"epsilon": 0.1, "delta": 1e-6, "steps": 10, "target_delta": 1e-5},
          {"epsilon": "epsilon", "delta": "delta_closed", "steps": "count",
           "target_delta": "delta"}),
    Entry("amplify_by_subsampling", composition.amplify_by_subsampling,
          {"epsilon": 1.0, "delta": 1e-6, "sampling_probability": 0.1},
          {"epsilon": "epsilon", "delta": "delta_closed", "sampling_probability": "probability"}),
    Entry("classical_gaussian_sigma", composition.classical_gaussian_sigma,
          {"epsilon": 0.5, "delta": 1e-5}, {"epsilon": "positive", "delta": "delta"}),
    Entry("classical_gaussian_epsilon", composition.classical_gaussian_epsilon,
          {"noise_multiplier": 6.0, "delta": 1e-5},
          {"noise_multiplier": "positive", "delta": "delta"}),
    Entry("analytic_gaussian_delta", composition.analytic_gaussian_delta,
          {"noise_multiplier": 1.0, "epsilon": 1.0},
          {"noise_multiplier": "positive", "epsilon": "epsilon"}),
    Entry("analytic_gaussian_epsilon", composition.analytic_gaussian_epsilon,
          {"noise_multiplier": 1.0, "delta": 1e-5},
          {"noise_multiplier": "positive", "delta": "delta"}),
    Entry("analytic_gaussian_sigma", composition.analytic_gaussian_sigma,
          {"epsilon": 1.0, "delta": 1e-5}, {"epsilon": "positive", "delta": "delta"}),
    # ------------------------------------------------------------------ accountant functions
    Entry("zcdp_epsilon_bun_steinke", zcdp_epsilon_bun_steinke,
          {"rho": 1.0, "delta": 1e-5, "alpha_max": 50.0},
          {"rho": "epsilon", "delta": "delta", "alpha_max": "alpha_max"}),
    Entry("zcdp_epsilon_cks", zcdp_epsilon_cks, {"rho": 1.0, "delta": 1e-5, "alpha_max": 50.0},
          {"rho": "epsilon", "delta": "delta", "alpha_max": "alpha_max"}),
    Entry("zcdp_epsilon", zcdp_epsilon, {"rho": 1.0, "delta": 1e-5, "alpha_max": 50.0},
          {"rho": "epsilon", "delta": "delta", "alpha_max": "alpha_max"}),
    Entry("zcdp_delta", zcdp_delta, {"rho": 1.0, "epsilon": 5.0, "alpha_max": 50.0},
          {"rho": "epsilon", "epsilon": "epsilon", "alpha_max": "alpha_max"}),
    Entry("clt_mu", gdp_module.clt_mu,
          {"noise_multiplier": 1.0, "sampling_probability": 0.01, "steps": 100},
          {"noise_multiplier": "positive", "sampling_probability": "probability",
           "steps": "count"}),
    Entry("clt_equivalent_noise", dpsharp.clt_equivalent_noise,
          {"epsilon": 1.0, "delta": 1e-5, "sampling_probability": 0.01, "steps": 100},
          {"epsilon": "epsilon", "delta": "delta", "sampling_probability": "probability",
           "steps": "count1"}),
    Entry("clt_equivalent_noise_for", dpsharp.clt_equivalent_noise_for,
          {"noise_multiplier": 1.0, "sampling_probability": 0.01, "steps": 100, "delta": 1e-5},
          {"noise_multiplier": "positive", "sampling_probability": "probability",
           "steps": "count1", "delta": "delta"}),
    Entry("paper_strong_composition_002", classic_module.paper_strong_composition_002,
          {"noise_multiplier": 4.0, "sampling_probability": 0.01, "steps": 100, "delta": 1e-5},
          {"noise_multiplier": "positive", "sampling_probability": "probability",
           "steps": "count1", "delta": "delta"}),
    # ------------------------------------------------------------------ calibration
    Entry("calibrate.noise_multiplier", calibrate.noise_multiplier,
          {"epsilon": 1.0, "delta": 1e-5, "steps": 10, "sampling_probability": 0.1,
           "rtol": 0.01},
          {"epsilon": "positive", "delta": "delta", "steps": "count1",
           "sampling_probability": "probability", "rtol": "rtol"}),
    Entry("calibrate.sampling_probability", calibrate.sampling_probability,
          {"epsilon": 1.0, "delta": 1e-5, "noise_multiplier": 1.0, "steps": 10, "rtol": 0.01},
          {"epsilon": "positive", "delta": "delta", "noise_multiplier": "positive",
           "steps": "count1", "rtol": "rtol"}),
    Entry("calibrate.steps", calibrate.steps,
          {"epsilon": 1.0, "delta": 1e-5, "noise_multiplier": 5.0, "sampling_probability": 0.1,
           "max_steps": 1000},
          {"epsilon": "positive", "delta": "delta", "noise_multiplier": "positive",
           "sampling_probability": "probability", "max_steps": "count1"}),
    # ------------------------------------------------------------------ accountants
    Entry("PLDAccountant", PLDAccountant, {"precision": 1e-3}, {"precision": "open_unit"}),
    Entry("RDPAccountant", RDPAccountant, {"orders": ORDERS2}, {"orders": "orders_or_none"}),
    Entry("PLDAccountant.epsilon_bounds", lambda delta: _pld().epsilon_bounds(delta),
          {"delta": 1e-5}, {"delta": "delta"}),
    Entry("PLDAccountant.delta_bounds", lambda epsilon: _pld().delta_bounds(epsilon),
          {"epsilon": 1.0}, {"epsilon": "epsilon"}),
    Entry("PLDAccountant.tradeoff", lambda alphas: _pld().tradeoff(alphas),
          {"alphas": [0.1, 0.5]}, {"alphas": "alphas"}),
    Entry("ZCDPAccountant.epsilon_bun_steinke",
          lambda delta: dpsharp.ZCDPAccountant().compose(Gaussian(2.0)).epsilon_bun_steinke(delta),
          {"delta": 1e-5}, {"delta": "delta"}),
    Entry("ZCDPAccountant.epsilon_cks",
          lambda delta: dpsharp.ZCDPAccountant().compose(Gaussian(2.0)).epsilon_cks(delta),
          {"delta": 1e-5}, {"delta": "delta"}),
    Entry("ClassicAccountant.split",
          lambda delta: dpsharp.ClassicAccountant().compose(Gaussian(4.0), 3).split(delta),
          {"delta": 1e-5}, {"delta": "delta"}),
    Entry("ClassicAccountant.per_step_guarantees",
          lambda delta0: dpsharp.ClassicAccountant().compose(Gaussian(4.0), 3)
          .per_step_guarantees(delta0),
          {"delta0": 1e-6}, {"delta0": "probability"}),
    # ------------------------------------------------------------------ plots
    Entry("plots.epsilon_vs_epochs",
          lambda delta: plots.epsilon_vs_epochs({"rdp": ([1, 2], [0.5, 0.7])}, delta=delta),
          {"delta": 1e-5}, {"delta": "delta"}, cleanup=_close_figure),
    Entry("plots.tradeoff_curves",
          lambda alphas: plots.tradeoff_curves({"pld": [0.9, 0.4]}, alphas=alphas),
          {"alphas": [0.1, 0.5]}, {"alphas": "alphas"}, cleanup=_close_figure),
    *_accountant_method_entries(),
]
ENTRY_BY_KEY = {entry.key: entry for entry in ENTRIES}


def _bad_cases() -> list[Any]:
    cases = []
    for entry in ENTRIES:
        for name, kind in entry.numeric.items():
            for index, value in enumerate(BAD_VALUES[kind]):
                cases.append(pytest.param(entry.key, name, value, id=f"{entry.key}-{name}-{index}"))
    return cases


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("key", "name", "value"), _bad_cases())
def test_bad_argument_is_refused_and_named(key: str, name: str, value: object) -> None:
    entry = ENTRY_BY_KEY[key]
    kwargs = {**entry.valid, name: value}
    error = _raises_naming(name, lambda: entry.call(**kwargs))
    kind = entry.numeric[name]
    non_real = isinstance(value, (bool, str, np.bool_, complex)) or value is None
    if non_real and kind not in ("list_epsilon", "list_delta", "list_count"):
        assert isinstance(error, TypeError), f"{type(error).__name__}: {error}"


def _as_numpy(value: object) -> object:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return np.asarray(value, dtype=np.float32)
    return value


# The two entries that calibrate or compose a long classic bound take seconds: slow sweeps.
NUMPY_SCALAR_SLOW = {"ClassicAccountant.delta", "calibrate.steps"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", [
    pytest.param(key, marks=pytest.mark.slow) if key in NUMPY_SCALAR_SLOW else key
    for key in sorted(ENTRY_BY_KEY)
])
def test_valid_arguments_are_accepted_also_as_numpy_scalars(key: str) -> None:
    """The table's valid call answers, and answers the same with np.float64 / np.int64 scalars
    (and float32 arrays holding the same binary values) in place of Python numbers."""
    entry = ENTRY_BY_KEY[key]
    plain = entry.call(**entry.valid)
    numpy_kwargs = {k: _as_numpy(v) if k in entry.numeric else v for k, v in entry.valid.items()}
    if any(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in numpy_kwargs.values()):
        # float32 changes the values (0.1 is not a float32); the Python floats of the same
        # float32 values must give the same answer
        exact = {
            k: (v.astype(np.float64).tolist() if isinstance(v, np.ndarray) else v)
            for k, v in numpy_kwargs.items()
        }
        plain = entry.call(**exact)
    as_numpy = entry.call(**numpy_kwargs)
    if entry.cleanup is not None:
        entry.cleanup(plain)
        entry.cleanup(as_numpy)
        return
    _assert_same_answer(plain, as_numpy)


def _assert_same_answer(first: Any, second: Any) -> None:
    if isinstance(first, Accountant):
        assert first.state_dict() == second.state_dict()
    elif isinstance(first, (float, int, np.ndarray, np.floating, tuple, list)):
        if isinstance(first, list) and first and not isinstance(first[0], (float, int)):
            assert repr(first) == repr(second)
        else:
            np.testing.assert_array_equal(
                np.asarray(first, dtype=object), np.asarray(second, dtype=object)
            )
    else:
        assert first == second


# Parameters of public callables that take no number: events, names, flags, callbacks.
NON_NUMERIC: dict[str, set[str]] = {
    "accountant": {"name", "options"},
    "available": set(),
    "register": {"name"},
    "event_from_dict": {"data"},
    "event_to_dict": {"event"},
    "required_neighbouring": {"event"},
    "neighbouring_unsupported_reason": {"event", "relation", "analyser"},
    "Composed": {"events"},
    "DisjointParts": {"events"},
    "RandomChoice": {"events"},
    "Accountant": {"neighbouring"},
    "GDPAccountant": {"neighbouring"},
    "MomentsAccountant": {"neighbouring"},
    "ZCDPAccountant": {"batching", "neighbouring", "allow_approximation"},
    "ClassicAccountant": {"composition", "gaussian", "neighbouring"},
    "PrivacyGuarantee": {
        "epsilon", "delta", "certified", "accountant", "neighbouring", "epsilon_lower",
        "details", "warning",
    },  # a result record, built by the accountants from validated numbers
    "epsilon_delta_of_leaf": {"leaf", "base"},
    "rdp_of_leaf": {"leaf", "orders", "base_rdp"},  # hooks: orders come validated
    "zcdp_rho_of_leaf": {"leaf", "base_rho"},
    "unsupported_reason_of_leaf": {"leaf", "family", "base_reason"},
    "plots.epsilon_vs_epochs": {"series", "certified", "title", "path", "yscale"},
    "plots.tradeoff_curves": {"curves", "title", "path", "note", "not_drawn"},
}
SHARED_NON_NUMERIC = {
    "event", "base", "accountant", "require_certified", "allow_approximation",
    "allow_epsilon_above_one", "form", "conversion", "neighbouring", "symmetrised", "base_delta",
    "state", "self", "args", "kwargs", "kwds",
}
ACCOUNTANT_METHODS_WITHOUT_NUMBERS = {"supports", "unsupported_reason", "state_dict",
                                      "load_state_dict", "rdp", "gdp_mu"}


def _public_callables() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for module in (dpsharp, tradeoff, rdp, events, composition, tuning_events, gdp_module,
                   zcdp_module, classic_module, registry, dpsharp.accountants):
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or isinstance(obj, type)):
                continue  # modules, constants, type aliases
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            if isinstance(obj, type) and issubclass(obj, str):  # the Neighbouring enum
                continue
            found.setdefault(getattr(obj, "__name__", name), obj)
    for name in calibrate.__all__:
        if inspect.isfunction(getattr(calibrate, name)):
            found[f"calibrate.{name}"] = getattr(calibrate, name)
    for name in plots.__all__:
        obj = getattr(plots, name)
        if inspect.isfunction(obj):
            found[f"plots.{name}"] = obj
    # the dpsharp-level aliases of calibrate's functions are the same objects
    for alias in ("calibrate_noise_multiplier", "calibrate_sampling_probability",
                  "calibrate_steps"):
        found.pop(alias, None)
    for name in ("noise_multiplier", "sampling_probability", "steps"):
        found.pop(name, None)
    return found


def _parameters(obj: Callable[..., Any]) -> list[str]:
    target = obj.__init__ if isinstance(obj, type) else obj  # type: ignore[misc]
    return [p for p in inspect.signature(target).parameters if p not in SHARED_NON_NUMERIC]


def test_every_public_numeric_argument_is_in_the_table() -> None:
    """A new public function, constructor or accountant method with a numeric argument must be
    added to the table above (or its argument listed as non-numeric)."""
    missing = []
    for key, obj in sorted(_public_callables().items()):
        covered = set(ENTRY_BY_KEY[key].numeric) if key in ENTRY_BY_KEY else set()
        for parameter in _parameters(obj):
            if parameter not in covered and parameter not in NON_NUMERIC.get(key, set()):
                missing.append(f"{key}({parameter})")
    for name in registry.available():
        cls = type(dpsharp.accountant(name))
        for method_name, method in inspect.getmembers(cls, inspect.isfunction):
            if method_name.startswith("_") or method_name in ACCOUNTANT_METHODS_WITHOUT_NUMBERS:
                continue
            key = f"{cls.__name__}.{method_name}"
            covered = set(ENTRY_BY_KEY[key].numeric) if key in ENTRY_BY_KEY else set()
            for parameter in _parameters(method):
                if parameter not in covered:
                    missing.append(f"{key}({parameter})")
    assert not missing, f"numeric arguments outside the bad-input table: {missing}"


@pytest.mark.parametrize("name", registry.available())
def test_a_count_beyond_the_largest_float_is_a_value_error_naming_count(name: str) -> None:
    """Every accountant weighs an event by float(count): 10^400 runs (directly, or as 10^200
    runs of a 10^200-fold Repeated) overflowed that conversion with a bare OverflowError from
    inside. Refused as a ValueError naming count, the state unchanged."""
    acc = dpsharp.accountant(name).compose(Gaussian(2.0), 3)
    before = acc.composed
    repeated = events.Repeated(Gaussian(1.0), 10**200)
    for event, count in ((Gaussian(1.0), 10**400), (repeated, 10**200)):
        with pytest.raises(ValueError, match="count must keep"):
            acc.compose(event, count)
    assert acc.composed == before
