"""prv-accountant's ``dpsgd`` module on dpsharp: ``DPSGDAccountant`` and
``find_noise_multiplier`` for homogeneous DP-SGD (one Poisson-subsampled Gaussian per step)."""

from __future__ import annotations

from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
)
from dpsharp.events import Gaussian, PoissonSampled

from dpsharp.compat._prv.accountant import PRVAccountant
from dpsharp.compat._prv.privacy_random_variables import PoissonSubsampledGaussianMechanism

__all__ = ["DPSGDAccountant", "find_noise_multiplier"]


class DPSGDAccountant(PRVAccountant):
    """:class:`PRVAccountant` of ``max_steps`` DP-SGD steps with noise multiplier sigma and
    Poisson sampling probability q (prv-accountant's signature and defaults)."""

    def __init__(self, noise_multiplier: float, sampling_probability: float, max_steps: int,
                 eps_error: float = 0.1, delta_error: float = 1e-9) -> None:
        super().__init__(
            prvs=PoissonSubsampledGaussianMechanism(
                noise_multiplier=noise_multiplier, sampling_probability=sampling_probability),
            max_self_compositions=max_steps, eps_error=eps_error, delta_error=delta_error,
        )

    def compute_epsilon(  # type: ignore[override]
        self, delta: float, num_steps: int
    ) -> tuple[float, float, float]:
        """(lower, estimate, upper) epsilon at ``delta`` after ``num_steps`` steps (estimate =
        the certified upper bound)."""
        return super().compute_epsilon(delta=delta, num_self_compositions=num_steps)


def find_noise_multiplier(sampling_probability: float, num_steps: int, target_epsilon: float,
                          target_delta: float, eps_error: float = 0.1,
                          mu_max: float = 100.0) -> float:
    """The noise multiplier at which ``num_steps`` Poisson-subsampled Gaussian steps at
    ``sampling_probability`` are (``target_epsilon``, ``target_delta``)-DP.

    Conservative, unlike prv-accountant's search (whose answer may exceed the target by up to
    ``eps_error``): dpsharp's certified upper epsilon at the returned sigma is at most
    ``target_epsilon`` and at least ``target_epsilon - eps_error`` (Brent's method on the PLD
    accountant's certified epsilon, :func:`dpsharp.calibrate.noise_multiplier`). Raises
    ``RuntimeError`` when the sigma needed exceeds ``mu_max``, as prv-accountant does.
    """
    from dpsharp._report import calibrate_noise, format_bound

    rate = require_probability("sampling_probability", sampling_probability)
    steps = require_count("num_steps", num_steps, minimum=1)
    epsilon = require_positive_finite("target_epsilon", target_epsilon)
    delta = require_delta(target_delta, "target_delta")
    tolerance = require_positive_finite("eps_error", eps_error)
    ceiling = require_positive_finite("mu_max", mu_max)
    from dpsharp.accountants import accountant

    at_ceiling = accountant("pld").compose(PoissonSampled(Gaussian(ceiling), rate), steps)
    if at_ceiling.epsilon(delta) > epsilon:
        raise RuntimeError(
            "Finding a suitable noise multiplier has not converged: even noise_multiplier = "
            f"mu_max = {ceiling:g} gives epsilon "
            f"{format_bound(at_ceiling.epsilon(delta), '.6g', side='upper')} > "
            f"target_epsilon = {epsilon:g}. Try increasing target epsilon or decreasing "
            "sampling probability."
        )
    sigma = calibrate_noise(
        lambda s: PoissonSampled(Gaussian(s), rate), steps, "pld",
        target_epsilon=epsilon, delta=delta, epsilon_tolerance=tolerance,
    )
    return float(min(sigma, ceiling))
