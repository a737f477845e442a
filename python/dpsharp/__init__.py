"""dpsharp: tight, certified privacy accounting and fast differentially private training.

The public API: events (what a mechanism did), accountants (what it cost), calibration, and
the registry that names every accountant. See README.md for a tour.
"""

from __future__ import annotations

from dpsharp._native import core as _core_module  # fails loudly if the extension is missing
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
from dpsharp.accountants.gdp import GDPAccountant, clt_equivalent_noise, clt_equivalent_noise_for
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
