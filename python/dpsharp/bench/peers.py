"""The peer libraries' accountants for a Poisson-subsampled Gaussian composed T times.

Each peer is a function ``(q, sigma, T, delta) -> (epsilon, epsilon_lower, epsilon_upper,
certified)`` that calls the peer's public API directly (no dpsharp code in between), so that
the benchmark's rows are exactly what the peer returns. Peers that are not installed are left
out of :func:`available_peers` and reported as skipped.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["PEERS", "PeerResult", "available_peers", "skipped_peers"]

#: dp-accounting PLD discretisation intervals benchmarked (coarse to fine)
PLD_INTERVALS = (1e-2, 1e-3)


class PeerResult(NamedTuple):
    epsilon: float
    epsilon_lower: float | None
    epsilon_upper: float | None
    certified: bool


def _dp_accounting_rdp(q: float, sigma: float, steps: int, delta: float) -> PeerResult:
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    eps = float(acc.get_epsilon(delta))
    return PeerResult(eps, None, eps, True)


def _dp_accounting_pld(interval: float) -> Callable[[float, float, int, float], PeerResult]:
    def run(q: float, sigma: float, steps: int, delta: float) -> PeerResult:
        import dp_accounting

        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
        eps = float(acc.get_epsilon(delta))
        # pessimistic discretisation (the default): an upper bound up to the truncated tail mass
        return PeerResult(eps, None, eps, True)

    return run


def _prv_accountant(q: float, sigma: float, steps: int, delta: float) -> PeerResult:
    from prv_accountant import Accountant

    acc = Accountant(noise_multiplier=sigma, sampling_probability=q, delta=delta,
                     eps_error=0.01, max_compositions=steps)
    lower, estimate, upper = acc.compute_epsilon(num_compositions=steps)
    return PeerResult(float(estimate), float(lower), float(upper), True)


def _opacus(kind: str) -> Callable[[float, float, int, float], PeerResult]:
    def run(q: float, sigma: float, steps: int, delta: float) -> PeerResult:
        from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant

        cls = {"rdp": RDPAccountant, "prv": PRVAccountant, "gdp": GaussianAccountant}[kind]
        acc = cls()
        acc.history = [(sigma, q, steps)]
        eps = float(acc.get_epsilon(delta))
        # opacus's PRV returns its estimate's upper end; its GDP is the CLT (not a bound)
        return PeerResult(eps, None, eps if kind != "gdp" else None, kind != "gdp")

    return run


#: row name -> (python module that must be installed, function)
PEERS: dict[str, tuple[str, Callable[[float, float, int, float], PeerResult]]] = {
    "dp_accounting.rdp": ("dp_accounting", _dp_accounting_rdp),
    **{f"dp_accounting.pld(interval={i:g})": ("dp_accounting", _dp_accounting_pld(i)) for i in PLD_INTERVALS},
    "prv_accountant": ("prv_accountant", _prv_accountant),
    "opacus.rdp": ("opacus", _opacus("rdp")),
    "opacus.prv": ("opacus", _opacus("prv")),
    "opacus.gdp": ("opacus", _opacus("gdp")),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available_peers(names: list[str] | None = None) -> dict[str, Callable[[float, float, int, float], PeerResult]]:
    """The peers (of ``names``, default all) whose library is installed."""
    return {n: f for n, (m, f) in PEERS.items() if (names is None or n in names) and _installed(m)}


def skipped_peers() -> list[str]:
    """Peer libraries that are not installed."""
    return sorted({m for m, _ in PEERS.values() if not _installed(m)})
