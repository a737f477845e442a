"""pytest plugin: run a peer library's own test files with dpsharp's adapters in its place.

Loaded by :mod:`run_peer_suites` as ``-p peer_swap`` in a subprocess whose working directory is
outside the repository. With ``DPSHARP_PEER_MODE=adapter`` it replaces, before the peer's test
modules are imported, the peer's accountant classes (the module attributes the tests and the
peer's own helpers look up) by dpsharp's adapters from :mod:`dpsharp.compat`; with
``DPSHARP_PEER_MODE=peer`` it changes nothing (the peer's own baseline). Every test's outcome,
its failure message and whether a dpsharp adapter was constructed or called during the test is
appended, one JSON object per line, to the file named by ``DPSHARP_PEER_RECORD``.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from typing import Any

_EXERCISED = [False]
_PATH = [""]


def _flagging(function: Any) -> Any:
    """``function`` that also records that a dpsharp adapter was used."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _EXERCISED[0] = True
        return function(*args, **kwargs)

    wrapper.__dpsharp_flagging__ = True  # type: ignore[attr-defined]
    return wrapper


def _flag_class(cls: type) -> None:
    """Wrap ``cls.__init__`` and its public methods so that any use sets the flag."""
    for name, value in list(vars(cls).items()):
        if getattr(value, "__dpsharp_flagging__", False):
            continue
        if name == "__init__" or (callable(value) and not name.startswith("_")):
            if isinstance(value, (staticmethod, classmethod)):
                continue
            setattr(cls, name, _flagging(value))


def _set(module_name: str, attribute: str, value: Any) -> None:
    module = importlib.import_module(module_name)
    if not hasattr(module, attribute):
        raise AttributeError(f"{module_name} has no {attribute}: the peer's layout changed")
    setattr(module, attribute, value)


def _swap_dp_accounting() -> None:
    from dpsharp.compat import dp_accounting as adapter

    for cls in (adapter.PrivacyAccountant, adapter.PLDAccountant, adapter.RDPAccountant):
        _flag_class(cls)
    _set("dp_accounting.pld.pld_privacy_accountant", "PLDAccountant", adapter.PLDAccountant)
    _set("dp_accounting.pld", "PLDAccountant", adapter.PLDAccountant)
    _set("dp_accounting.rdp.rdp_privacy_accountant", "RdpAccountant", adapter.RDPAccountant)
    _set("dp_accounting.rdp", "RdpAccountant", adapter.RDPAccountant)


def _swap_opacus() -> None:
    from dpsharp.compat import opacus as adapter

    for cls in (adapter.OpacusAccountant, adapter.PLDAccountant, adapter.RDPAccountant,
                adapter.GDPAccountant):
        _flag_class(cls)
    calibrate = _flagging(adapter.get_noise_multiplier)
    swaps = {
        "RDPAccountant": adapter.RDPAccountant,
        "PRVAccountant": adapter.PLDAccountant,
        "GaussianAccountant": adapter.GDPAccountant,
    }
    for name, cls in swaps.items():
        _set("opacus.accountants", name, cls)
    _set("opacus.accountants.rdp", "RDPAccountant", adapter.RDPAccountant)
    _set("opacus.accountants.prv", "PRVAccountant", adapter.PLDAccountant)
    _set("opacus.accountants.gdp", "GaussianAccountant", adapter.GDPAccountant)
    from opacus.accountants import registry

    registry._ACCOUNTANTS.update(
        {"rdp": adapter.RDPAccountant, "prv": adapter.PLDAccountant, "gdp": adapter.GDPAccountant}
    )
    _set("opacus.accountants.utils", "get_noise_multiplier", calibrate)
    _set("opacus.privacy_engine", "get_noise_multiplier", calibrate)


def _swap_prv_accountant() -> None:
    from dpsharp.compat import prv_accountant as adapter

    classes = {
        "PRVAccountant": adapter.PRVAccountant,
        "Accountant": adapter.Accountant,
        "PoissonSubsampledGaussianMechanism": adapter.PoissonSubsampledGaussianMechanism,
        "GaussianMechanism": adapter.GaussianMechanism,
        "LaplaceMechanism": adapter.LaplaceMechanism,
        "PureDPMechanism": adapter.PureDPMechanism,
        "ApproximateDPMechanism": adapter.ApproximateDPMechanism,
    }
    for cls in (*classes.values(), adapter.DPSGDAccountant, adapter.PrivacyRandomVariable,
                adapter.ComposedPrivacyRandomVariable):
        _flag_class(cls)
    for name, cls in classes.items():
        _set("prv_accountant", name, cls)
    _set("prv_accountant.accountant", "PRVAccountant", adapter.PRVAccountant)
    _set("prv_accountant.accountant", "Accountant", adapter.Accountant)
    mechanisms = {
        "poisson_subsampled_gaussian_mechanism": "PoissonSubsampledGaussianMechanism",
        "gaussian_mechanism": "GaussianMechanism",
        "laplace_mechanism": "LaplaceMechanism",
        "pure_dp_mechanism": "PureDPMechanism",
        "approximate_dp": "ApproximateDPMechanism",
    }
    for module, name in mechanisms.items():
        _set("prv_accountant.privacy_random_variables", name, classes[name])
        _set(f"prv_accountant.privacy_random_variables.{module}", name, classes[name])
    _set("prv_accountant.dpsgd", "DPSGDAccountant", adapter.DPSGDAccountant)
    _set("prv_accountant.dpsgd", "find_noise_multiplier",
         _flagging(adapter.find_noise_multiplier))


def pytest_configure(config: Any) -> None:
    if os.environ.get("DPSHARP_PEER_MODE", "adapter") != "adapter":
        return
    suite = os.environ["DPSHARP_PEER_SUITE"]
    {"dp_accounting": _swap_dp_accounting, "opacus": _swap_opacus,
     "prv_accountant": _swap_prv_accountant}[suite]()


def pytest_runtest_setup(item: Any) -> None:
    _EXERCISED[0] = False
    _PATH[0] = str(item.path)


def _message(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):  # skipped: (file, line, reason)
        text = str(report.longrepr[2])
    else:
        text = str(report.longrepr or "")
    return " ".join(text.split())[:300]


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or (report.when == "setup" and not report.passed):
        record = {
            "nodeid": report.nodeid,
            "file": _PATH[0],
            "outcome": report.outcome,
            "exercised": _EXERCISED[0],
            "message": "" if report.passed else _message(report),
        }
        with open(os.environ["DPSHARP_PEER_RECORD"], "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record) + "\n")
