"""prv-accountant's interface on dpsharp's tight PLD accountant.

Change the import line of a prv-accountant script and nothing else::

    import dpsharp.compat.prv_accountant as prv_accountant    # was: import prv_accountant
    from dpsharp.compat.prv_accountant import PRVAccountant, PoissonSubsampledGaussianMechanism
    from dpsharp.compat.prv_accountant.dpsgd import DPSGDAccountant, find_noise_multiplier

The module tree of prv-accountant 0.2.0 is mirrored: ``PRVAccountant`` and the deprecated
``Accountant`` (``accountant``), ``dpsgd.DPSGDAccountant`` and
``dpsgd.find_noise_multiplier`` (``dpsgd``), the privacy random variables
``PrivacyRandomVariable``, ``PoissonSubsampledGaussianMechanism``, ``GaussianMechanism``,
``LaplaceMechanism``, ``PureDPMechanism``, ``ApproximateDPMechanism``
(``privacy_random_variables``), and the ``compute-dp-epsilon`` command as
``python -m dpsharp.compat.prv_accountant`` (``cli``).

Differences, all on the safe side: ``compute_epsilon`` / ``compute_delta`` return
``(lower, estimate, upper)`` as there, but ``lower`` and ``upper`` are certified bounds of
dpsharp's PLD accountant (not an estimate plus or minus ``eps_error``) and ``estimate`` is the
upper bound, dpsharp's one number for the composition; ``find_noise_multiplier`` never returns a
sigma whose certified epsilon exceeds the target; bad arguments raise ``ValueError`` naming
them instead of asserting; a PRV without a dpsharp event (``ApproximateDPMechanism``, a custom
CDF) is refused by name.

Sensitivity convention: prv-accountant's ``noise_multiplier`` is the noise standard deviation
divided by the add/remove-one sensitivity (its pair N(0, sigma^2) against (1 - q) N(0, sigma^2)
+ q N(1, sigma^2), a mean shift of 1; Gopi, Lee, Wutschitz 2021), which is what dpsharp's
``Gaussian`` states under add/remove (:mod:`dpsharp.events`): the multiplier carries over
unchanged. prv-accountant analyses the remove direction; dpsharp's PLD accountant takes the
worse of add and remove, so its bounds are never below the ones prv-accountant certifies for the
same event.
"""

from __future__ import annotations

import sys

from dpsharp.compat._prv import accountant, cli, dpsgd, privacy_random_variables
from dpsharp.compat._prv.accountant import Accountant, ComposedPrivacyRandomVariable, PRVAccountant
from dpsharp.compat._prv.cli import main
from dpsharp.compat._prv.dpsgd import DPSGDAccountant, find_noise_multiplier
from dpsharp.compat._prv.privacy_random_variables import (
    ApproximateDPMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    PoissonSubsampledGaussianMechanism,
    PrivacyRandomVariable,
    PureDPMechanism,
)

__all__ = [
    "Accountant",
    "ApproximateDPMechanism",
    "ComposedPrivacyRandomVariable",
    "DPSGDAccountant",
    "GaussianMechanism",
    "LaplaceMechanism",
    "PRVAccountant",
    "PoissonSubsampledGaussianMechanism",
    "PrivacyRandomVariable",
    "PureDPMechanism",
    "accountant",
    "cli",
    "dpsgd",
    "find_noise_multiplier",
    "main",
    "privacy_random_variables",
]

# prv-accountant's submodules under this module's name, so that
# ``from dpsharp.compat.prv_accountant.dpsgd import DPSGDAccountant`` works as
# ``from prv_accountant.dpsgd import DPSGDAccountant`` does.
for _sub in (accountant, cli, dpsgd, privacy_random_variables):
    sys.modules.setdefault(f"dpsharp.compat.prv_accountant.{_sub.__name__.rsplit('.', 1)[-1]}",
                           _sub)

if __name__ == "__main__":
    sys.exit(main())
