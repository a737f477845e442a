"""Randomised consistency check of PLDAccountant's two composition routes.

For random Poisson-subsampled Gaussians (q log-uniform in [1e-3, 0.5], sigma in [0.5, 5],
T in [2^15, 2^19], delta in {1e-5, 1e-8}) the certified bracket ``epsilon_bounds(delta)`` is
computed twice, once as the accountant decides (two-stage composition where it pays) and once
forced to one stage, and RDP's upper bound once. Both brackets are certified, so they must
overlap; ``epsilon(delta)`` must be at least the refined upper end; and the tight upper bound
must not exceed RDP's. A case that breaks one of these prints ``BAD``; every tenth passing case
prints ``OK`` with its numbers.

This is how the missing round-off allowance of long compositions was found (one case in 2152
before ``pld._ROUNDOFF_PER_STEP``, none in 1461 after it, seeds 1 and 7).

    python bench/fuzz_pld_routes.py --seed 1 --seconds 300
"""

from __future__ import annotations

import argparse
import math
import random
import time

from dpsharp import Gaussian, PLDAccountant, PoissonSampled, RDPAccountant
from dpsharp.accountants import pld


def bracket(event: PoissonSampled, steps: int, delta: float, *, staged: bool) -> tuple[float, float, float]:
    """(lower, upper, epsilon) from a fresh accountant, forced to one stage unless ``staged``."""
    shipped = pld._staging
    if not staged:
        pld._staging = lambda _steps: None
    try:
        accountant = PLDAccountant().compose(event, steps)
        lower, upper = accountant.epsilon_bounds(delta)
        return lower, upper, accountant.epsilon(delta)
    finally:
        pld._staging = shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=240.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    deadline = time.time() + args.seconds
    cases = bad = 0
    while time.time() < deadline:
        q = math.exp(rng.uniform(math.log(1e-3), math.log(0.5)))
        sigma = rng.uniform(0.5, 5.0)
        steps = rng.randint(2**15, 2**19)
        delta = rng.choice([1e-5, 1e-8])
        event = PoissonSampled(Gaussian(sigma), q)
        lo1, up1, e1 = bracket(event, steps, delta, staged=True)
        lo2, up2, e2 = bracket(event, steps, delta, staged=False)
        rdp = RDPAccountant().compose(event, steps).epsilon(delta)
        cases += 1
        ok = (
            max(lo1, lo2) <= min(up1, up2) * (1 + 1e-9)
            and e1 >= up1 * (1 - 1e-12)
            and e2 >= up2 * (1 - 1e-12)
            and min(e1, e2) <= rdp * (1 + 1e-6)
        )
        bad += not ok
        if not ok or cases % 10 == 0:
            print(
                "OK " if ok else "BAD",
                f"q={q!r} sigma={sigma!r} T={steps} delta={delta} plan={pld._staging(steps)}"
                f" staged=({lo1:.6f}, {up1:.6f}) eps={e1:.6f} one-stage=({lo2:.6f}, {up2:.6f})"
                f" eps={e2:.6f} rdp={rdp:.5f}",
                flush=True,
            )
    print(f"cases {cases} bad {bad}")


if __name__ == "__main__":
    main()
