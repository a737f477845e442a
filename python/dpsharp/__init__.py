"""dpsharp: tight, certified privacy accounting and fast differentially private training.

The public API: events (what a mechanism did), accountants (what it cost), calibration, and
the registry that names every accountant. See README.md for a tour.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from dpsharp._native import core as _core_module  # fails loudly if the extension is missing

if TYPE_CHECKING:  # pragma: no cover - the names below are loaded on first use (__getattr__)
    from dpsharp.accountants import (
        Accountant,
        MomentsAccountant,
        PLDAccountant,
        PrivacyGuarantee,
        RDPAccountant,
        UnsupportedEventError,
        accountant,
        available,
    )
    from dpsharp import calibrate, composition, rdp, tradeoff
    from dpsharp import compat, plots
    from dpsharp.accountants.classic import ClassicAccountant
    from dpsharp.accountants.gdp import (
        GDPAccountant,
        clt_equivalent_noise,
        clt_equivalent_noise_for,
    )
    from dpsharp.accountants.zcdp import ZCDPAccountant
    from dpsharp.calibrate import noise_multiplier as calibrate_noise_multiplier
    from dpsharp.calibrate import sampling_probability as calibrate_sampling_probability
    from dpsharp.calibrate import steps as calibrate_steps
    from dpsharp.events import (
        Composed,
        Event,
        Gaussian,
        Laplace,
        Neighbouring,
        PoissonSampled,
        Repeated,
        SampledWithoutReplacement,
        Shuffled,
    )
    from dpsharp.tuning_events import (  # selection / tuning events (dpsharp.tuning_events)
        DisjointParts,
        PoissonTuning,
        PureDP,
        RandomChoice,
        TruncatedNegativeBinomialTuning,
    )

# Public name -> (module, attribute; None for the module itself). Loaded on first access (PEP 562)
# so that ``import dpsharp`` and the ``dpsharp`` command's --help / --version do not import
# scipy; every name is still an attribute of the package (dir(), hasattr, ``from dpsharp import``).
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: ("dpsharp.accountants", name) for name in (
        "Accountant", "MomentsAccountant", "PLDAccountant", "PrivacyGuarantee", "RDPAccountant",
        "UnsupportedEventError", "accountant", "available")},
    **{name: (f"dpsharp.{name}", None) for name in (
        "calibrate", "composition", "rdp", "tradeoff", "compat", "plots")},
    "ClassicAccountant": ("dpsharp.accountants.classic", "ClassicAccountant"),
    **{name: ("dpsharp.accountants.gdp", name) for name in (
        "GDPAccountant", "clt_equivalent_noise", "clt_equivalent_noise_for")},
    "ZCDPAccountant": ("dpsharp.accountants.zcdp", "ZCDPAccountant"),
    "calibrate_noise_multiplier": ("dpsharp.calibrate", "noise_multiplier"),
    "calibrate_sampling_probability": ("dpsharp.calibrate", "sampling_probability"),
    "calibrate_steps": ("dpsharp.calibrate", "steps"),
    **{name: ("dpsharp.events", name) for name in (
        "Composed", "Event", "Gaussian", "Laplace", "Neighbouring", "PoissonSampled", "Repeated",
        "SampledWithoutReplacement", "Shuffled")},
    **{name: ("dpsharp.tuning_events", name) for name in (
        "DisjointParts", "PoissonTuning", "PureDP", "RandomChoice",
        "TruncatedNegativeBinomialTuning")},
}


def __getattr__(name: str) -> Any:
    """Load a public name on first use (PEP 562) and cache it in the module."""
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dpsharp' has no attribute {name!r}") from None
    module = import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__: str = _core_module.build_info()["version"]

__all__ = [
    "DisjointParts",
    "PoissonTuning",
    "PureDP",
    "RandomChoice",
    "TruncatedNegativeBinomialTuning",
    "Accountant",
    "ClassicAccountant",
    "Composed",
    "Event",
    "GDPAccountant",
    "Gaussian",
    "Laplace",
    "MomentsAccountant",
    "Neighbouring",
    "PLDAccountant",
    "PoissonSampled",
    "PrivacyGuarantee",
    "RDPAccountant",
    "Repeated",
    "SampledWithoutReplacement",
    "Shuffled",
    "UnsupportedEventError",
    "ZCDPAccountant",
    "__version__",
    "accountant",
    "available",
    "calibrate",
    "calibrate_noise_multiplier",
    "calibrate_sampling_probability",
    "calibrate_steps",
    "clt_equivalent_noise",
    "clt_equivalent_noise_for",
    "compat",
    "composition",
    "plots",
    "rdp",
    "tradeoff",
]
