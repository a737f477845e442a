"""prv-accountant's ``Accountant`` interface on dpsharp's tight PLD accountant.

::

    from dpsharp.compat.prv_accountant import Accountant      # was: from prv_accountant import Accountant

    accountant = Accountant(noise_multiplier=0.8, sampling_probability=5e-3, delta=1e-6,
                            eps_error=0.1, max_compositions=1000)
    eps_low, eps_estimate, eps_upper = accountant.compute_epsilon(num_compositions=1000)

Semantics kept from prv-accountant 0.2.0 (``prv_accountant.Accountant``): the mechanism is the
Poisson-subsampled Gaussian (add/remove one); ``compute_epsilon(num_compositions)`` returns
``(lower, estimate, upper)`` for the fixed ``delta`` given at construction, for any
``num_compositions`` up to ``max_compositions`` (more raises ``ValueError``), and the bracket
is at most ``2 * eps_error`` wide. Differences, all on the safe side: ``lower`` and ``upper``
are dpsharp's certified bounds (provably below / above the optimal epsilon, not an error
estimate around a point value); ``estimate`` is their midpoint; the constructor's argument
checks raise ``ValueError`` rather than asserting; no ``DeprecationWarning``. When
``eps_error`` is None the PLD accountant's default precision is used (prv-accountant fails
later in that case). ``mesh_size`` must be None, as in prv-accountant.

Sensitivity convention: prv-accountant's ``noise_multiplier`` is the noise standard deviation
divided by the add/remove-one sensitivity (its privacy random variable is that of the pair
N(0, sigma^2) and (1 - q) N(0, sigma^2) + q N(1, sigma^2), a mean shift of 1; Gopi, Lee,
Wutschitz 2021), which is what dpsharp's ``Gaussian`` states under add/remove
(:mod:`dpsharp.events`): the multiplier carries over unchanged. prv-accountant analyses the
remove direction; dpsharp's PLD accountant takes the worse of add and remove, so its bounds are
never below the ones prv-accountant certifies for the same event.
"""

from __future__ import annotations

from typing import Any

from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
)
from dpsharp.accountants import Accountant as _DpsharpAccountant
from dpsharp.accountants import accountant as _make_accountant
from dpsharp.events import Gaussian, PoissonSampled

__all__ = ["Accountant"]

_MAX_REFINEMENTS = 6


class Accountant:
    """Bounds on epsilon for up to ``max_compositions`` Poisson-subsampled Gaussian steps.

    Parameters
    ----------
    noise_multiplier, sampling_probability
        sigma (noise std / clipping norm) and q of every step.
    delta
        The fixed target delta of :meth:`compute_epsilon`.
    max_compositions
        The largest ``num_compositions`` that :meth:`compute_epsilon` accepts.
    eps_error
        The half-width allowed for the (lower, upper) bracket; the PLD accountant's precision
        is refined until ``upper - lower <= 2 * eps_error`` (or fails with ``ValueError``).
    """

    def __init__(
        self,
        noise_multiplier: float,
        sampling_probability: float,
        delta: float,
        max_compositions: int,
        eps_error: float | None = None,
        mesh_size: float | None = None,
        verbose: bool = False,
    ) -> None:
        if mesh_size is not None:
            raise ValueError("mesh_size must be None (as in prv-accountant); use eps_error")
        self.noise_multiplier = require_positive_finite("noise_multiplier", noise_multiplier)
        self.sampling_probability = require_probability("sampling_probability", sampling_probability)
        self.delta = require_delta(delta)
        self.max_compositions = require_count("max_compositions", max_compositions, minimum=1)
        self.eps_error = None if eps_error is None else require_positive_finite("eps_error", eps_error)
        self.verbose = bool(verbose)
        self._event = PoissonSampled(Gaussian(self.noise_multiplier), self.sampling_probability)
        self._options: dict[str, Any] = {}
        self._accountant: _DpsharpAccountant = _make_accountant("pld")

    def _fresh(self, options: dict[str, Any]) -> _DpsharpAccountant:
        return _make_accountant("pld", **options)

    def compute_epsilon(self, num_compositions: int) -> tuple[float, float, float]:
        """(lower, estimate, upper) epsilon at ``delta`` after ``num_compositions`` steps."""
        steps = require_count("num_compositions", num_compositions)
        if steps > self.max_compositions:
            raise ValueError(
                "Requested number of compositions exceeds the maximum number of compositions: "
                f"num_compositions must be <= max_compositions={self.max_compositions}, got {steps}"
            )
        if steps == 0:
            return (0.0, 0.0, 0.0)
        options = dict(self._options)
        for _ in range(_MAX_REFINEMENTS + 1):
            acc = self._accountant
            composed = sum(count for _, count in acc.composed)
            if composed > steps:
                acc = self._accountant = self._fresh(options)
                composed = 0
            acc.compose(self._event, steps - composed)
            lower, upper = acc.epsilon_bounds(self.delta)  # type: ignore[attr-defined]
            lower, upper = float(lower), float(upper)
            if self.eps_error is None or upper - lower <= 2.0 * self.eps_error:
                return (lower, 0.5 * (lower + upper), upper)
            # Refine: the PLD accountant's precision is the relative gap (upper - lower) / upper.
            target = 2.0 * self.eps_error / max(upper, 1e-300)
            current = float(acc._options().get("precision", 1e-3))
            options["precision"] = min(0.5 * current, 0.9 * target)
            self._options = options
            self._accountant = self._fresh(options)
        raise ValueError(
            f"could not reach eps_error={self.eps_error} (bracket [{lower}, {upper}]) at "
            f"delta={self.delta}; increase eps_error"
        )
