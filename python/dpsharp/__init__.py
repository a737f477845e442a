"""dpsharp: tight, certified privacy accounting and fast differentially private training.

The public API: events (what a mechanism did), accountants (what it cost), calibration, and
the registry that names every accountant. See README.md for a tour.
"""

from __future__ import annotations

from dpsharp._native import core as _core_module  # fails loudly if the extension is missing
from dpsharp.accountants import (
    Accountant,
    PLDAccountant,
    MomentsAccountant,
    PrivacyGuarantee,
    RDPAccountant,
    UnsupportedEventError,
    accountant,
    available,
)
from dpsharp import rdp
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
from dpsharp.tuning_events import (  # issue 11: selection / tuning events
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
    "Composed",
    "Event",
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
    "__version__",
    "accountant",
    "available",
    "rdp",
]
