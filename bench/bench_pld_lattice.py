"""The exact lattice route of the tight accountant against its grid route and dp-accounting, on
compositions of randomized response and discrete Laplace mechanisms.

    python bench/bench_pld_lattice.py [--out bench/results/pld_lattice.txt]

For each setting and delta: the certified bracket ``epsilon_bounds(delta)`` of
``PLDAccountant()`` as shipped (the exact lattice of accountants/_pld_lattice.py, at most 2^18
composed outcomes) and with the lattice switched off (the grid and FFT route), and
dp-accounting 0.6.0's optimistic and pessimistic PLDs at its default
value_discretization_interval 1e-4 (``pessimistic_estimate=False`` with privacy buckets, and
the default connect-the-dots), each with its time (seconds, one run; the machine is shared).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from dp_accounting.pld import privacy_loss_distribution as peer
from dp_accounting.privacy_accountant import NeighboringRelation

from _results import write_lines
from dpsharp import PLDAccountant
from dpsharp.accountants import _pld_lattice
from dpsharp.events import DiscreteLaplace, RandomizedResponse

SETTINGS: list[tuple[str, Any, str, int]] = [
    ("randomized response p=0.99 k=10, zero-out", RandomizedResponse(0.99, 10), "zero_out", 500),
    ("randomized response p=0.5 k=2, replace one", RandomizedResponse(0.5, 2), "replace_one", 200),
    ("randomized response p=0.3 k=4, replace one", RandomizedResponse(0.3, 4), "replace_one", 600),
    ("discrete Laplace a=0.1 s=1", DiscreteLaplace(0.1, 1), "add_remove", 300),
    ("discrete Laplace a=0.5 s=3", DiscreteLaplace(0.5, 3), "add_remove", 100),
]
DELTAS = (1e-6, 1e-10, 1e-11)
_RELATIONS = {"zero_out": NeighboringRelation.REPLACE_SPECIAL,
              "replace_one": NeighboringRelation.REPLACE_ONE,
              "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE}


def ours(event: Any, relation: str, count: int, delta: float) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        lower, upper = PLDAccountant(neighbouring=relation).compose(event, count).epsilon_bounds(delta)
        text = f"[{lower:.7f}, {upper:.7f}]"
    except ValueError as error:
        text = f"refused ({str(error)[:40]}...)"
    return text, time.perf_counter() - start


def theirs(event: Any, relation: str, count: int, delta: float) -> tuple[str, float]:
    start = time.perf_counter()
    values = []
    for pessimistic in (False, True):
        if isinstance(event, RandomizedResponse):
            made = peer.from_randomized_response(
                event.noise_parameter, event.num_buckets, pessimistic_estimate=pessimistic,
                neighboring_relation=_RELATIONS[relation])
        else:
            made = peer.from_discrete_laplace_mechanism(
                event.noise_parameter, event.sensitivity, pessimistic_estimate=pessimistic)
        values.append(made.self_compose(count).get_epsilon_for_delta(delta))
    return f"[{values[0]:.7f}, {values[1]:.7f}]", time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "pld_lattice.txt"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # (dp-accounting's note on privacy buckets)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# python {' '.join(sys.argv)}",
             f"# load average at start {load:.1f} on {os.cpu_count()} CPUs; epsilon brackets "
             "(lower, upper) and seconds"]
    shipped = _pld_lattice.MAX_OUTCOMES
    for name, event, relation, count in SETTINGS:
        for delta in DELTAS:
            exact, exact_seconds = ours(event, relation, count, delta)
            _pld_lattice.MAX_OUTCOMES = 0  # the grid route
            try:
                grid, grid_seconds = ours(event, relation, count, delta)
            finally:
                _pld_lattice.MAX_OUTCOMES = shipped
            peer_text, peer_seconds = theirs(event, relation, count, delta)
            line = (f"{name}, {count} releases, delta={delta:g}: lattice {exact} "
                    f"{exact_seconds:.3f}s | grid {grid} {grid_seconds:.3f}s | dp-accounting "
                    f"1e-4 {peer_text} {peer_seconds:.2f}s")
            print(line, flush=True)
            lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
