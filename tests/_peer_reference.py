"""dp-accounting's PLD epsilon of Poisson-subsampled Gaussian steps: the independent reference of
the engine tests that train through dpsharp and compare its ledger's epsilon."""

from __future__ import annotations

import pytest


def poisson_gaussian_epsilon(q: float, sigma: float, steps: int, delta: float,
                             interval: float = 1e-4) -> float:
    """dp-accounting's PLD epsilon (add/remove, value_discretization_interval ``interval``)
    of ``steps`` Poisson-subsampled Gaussians with rate ``q`` and noise multiplier ``sigma``;
    skips the test where dp-accounting is not installed."""
    dp_accounting = pytest.importorskip("dp_accounting")
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))
