"""prv-accountant's ``compute-dp-epsilon`` command on dpsharp's accountants.

``python -m dpsharp.compat.prv_accountant -p 5e-3 -s 0.8 -i 1000 -d 1e-6`` takes
prv-accountant 0.2.0's flags (``-p/--sampling-probability``, ``-s/--noise-multiplier``,
``-i/--num-compositions``, ``-d/--delta``, ``-v/--verbose``, ``--fail-on-no-value``) and prints
its lines, ``<name>:\\t\\teps_lower = ... eps_estimate = ..., eps_upper = ...``, in its
``{:6.3}`` format but rounded outwards (the lower bound down, the upper bound up, so that each
printed bound is still a bound; the estimate to nearest):

* ``PRV Accountant``: dpsharp's tight PLD accountant (certified lower and upper bounds;
  the estimate is the upper bound) at prv-accountant's ``eps_error = 0.1``;
* ``RDP Accountant``: dpsharp's RDP accountant (lower 0.0, estimate = upper, as
  prv-accountant prints its RDP line).

No console script is installed (prv-accountant's own ``compute-dp-epsilon`` keeps its name).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence

from dpsharp._report import format_bound
from dpsharp.accountants import accountant
from dpsharp.events import Gaussian, PoissonSampled

from dpsharp.compat._prv.dpsgd import DPSGDAccountant

__all__ = ["arg_parser", "main"]


def arg_parser() -> argparse.ArgumentParser:
    """prv-accountant's ``compute-dp-epsilon`` arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m dpsharp.compat.prv_accountant",
        description="Compute DP epsilon for a set of training hyper-params (dpsharp's "
                    "certified PLD and RDP accountants, prv-accountant's flags)")
    parser.add_argument("-p", "--sampling-probability", type=float, required=True,
                        help="Poisson sampling probability q of one record per step")
    parser.add_argument("-s", "--noise-multiplier", type=float, required=True,
                        help="noise standard deviation / clipping norm")
    parser.add_argument("-i", "--num-compositions", type=int, required=True,
                        help="the number of steps at which epsilon is computed")
    parser.add_argument("-d", "--delta", type=float, required=True, help="the target delta")
    parser.add_argument("-v", "--verbose", action="store_true", default=None,
                        help="say which dpsharp accountant gives each line")
    parser.add_argument("--fail-on-no-value", action="store_true", default=None,
                        help="raise instead of printing n/a when an accountant has no value")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    parser = arg_parser()
    args = parser.parse_args(argv)
    q, sigma, steps, delta = (args.sampling_probability, args.noise_multiplier,
                              args.num_compositions, args.delta)
    # Bad flags stop the command with status 2 and the flag named (as argparse does for a
    # malformed number), before any accountant runs: not an "n/a" line that reads like an
    # accountant without a value.
    if not 0.0 <= q <= 1.0:
        parser.error(f"argument -p/--sampling-probability: must be in [0, 1], got {q!r}")
    if not (math.isfinite(sigma) and sigma > 0.0):
        parser.error(f"argument -s/--noise-multiplier: must be in (0, inf), got {sigma!r}")
    if steps < 1:
        parser.error(f"argument -i/--num-compositions: must be an integer >= 1, got {steps!r}")
    if not 0.0 < delta < 1.0:
        parser.error(f"argument -d/--delta: must be in (0, 1), got {delta!r}")

    def prv(_: int) -> tuple[float, float, float]:
        mirror = DPSGDAccountant(noise_multiplier=sigma, sampling_probability=q, max_steps=steps,
                                 eps_error=0.1, delta_error=delta / 1000)
        bounds = mirror.compute_epsilon(delta=delta, num_steps=steps)
        methods["PRV Accountant"] = (
            "dpsharp PLD accountant, certified bounds; the upper one at relative precision "
            f"{mirror.precision:g} (eps_error 0.1), `dpsharp epsilon` gives the default 1e-3's",
            prv)
        return bounds

    def rdp(_: int) -> tuple[float, float, float]:
        if q == 0.0:  # no record is ever used: nothing is released about any of them
            return (0.0, 0.0, 0.0)
        eps = float(accountant("rdp").compose(PoissonSampled(Gaussian(sigma), q), steps)
                    .epsilon(delta))
        return (0.0, eps, eps)

    methods: dict[str, tuple[str, Callable[[int], tuple[float, float, float]]]] = {
        "PRV Accountant": ("dpsharp PLD accountant, certified bounds", prv),
        "RDP Accountant": ("dpsharp RDP accountant, certified upper bound", rdp),
    }
    for name in list(methods):
        compute = methods[name][1]
        try:
            low, estimate, high = compute(steps)
            what = methods[name][0]
            # prv-accountant's {:6.3}, rounded down for the lower and up for the upper bound
            print(f"{name}:\t\teps_lower = {format_bound(low, '6.3', side='lower')} "
                  f"eps_estimate = {format_bound(estimate, '6.3', side='nearest')}, "
                  f"eps_upper = {format_bound(high, '6.3', side='upper')} ")
            if args.verbose:
                print(f"\t({what})")
        except Exception as error:
            if args.fail_on_no_value:
                raise
            print(f"{name}:\t\tn/a")
            print(f"{name}: no value: {error}", file=sys.stderr)
    return 0
