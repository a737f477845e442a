"""Benchmarks anyone can rerun: ``dpsharp bench precision`` and ``dpsharp bench speed``.

:mod:`dpsharp.bench.peers` calls the peer libraries (dp-accounting, prv-accountant, opacus) when
they are installed; :mod:`dpsharp.bench.precision` and :mod:`dpsharp.bench.speed` compare them
with every dpsharp accountant.
"""

from __future__ import annotations

from dpsharp.bench.peers import PEERS, available_peers
from dpsharp.bench.precision import DEFAULT_GRID, Setting, run_precision
from dpsharp.bench.speed import run_speed

__all__ = ["DEFAULT_GRID", "PEERS", "Setting", "available_peers", "run_precision", "run_speed"]
