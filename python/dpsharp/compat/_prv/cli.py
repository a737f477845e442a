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
    args = arg_parser().parse_args(argv)
    q, sigma, steps, delta = (args.sampling_probability, args.noise_multiplier,
                              args.num_compositions, args.delta)

    def prv(_: int) -> tuple[float, float, float]:
        return DPSGDAccountant(noise_multiplier=sigma, sampling_probability=q, max_steps=steps,
                               eps_error=0.1, delta_error=delta / 1000).compute_epsilon(
                                   delta=delta, num_steps=steps)

    def rdp(_: int) -> tuple[float, float, float]:
        eps = float(accountant("rdp").compose(PoissonSampled(Gaussian(sigma), q), steps)
                    .epsilon(delta))
        return (0.0, eps, eps)

    methods: dict[str, tuple[str, Callable[[int], tuple[float, float, float]]]] = {
        "PRV Accountant": ("dpsharp PLD accountant, certified bounds", prv),
        "RDP Accountant": ("dpsharp RDP accountant, certified upper bound", rdp),
    }
    for name, (what, compute) in methods.items():
        try:
            low, estimate, high = compute(steps)
            # prv-accountant's {:6.3}, rounded down for the lower and up for the upper bound
            print(f"{name}:\t\teps_lower = {format_bound(low, '6.3', side='lower')} "
                  f"eps_estimate = {format_bound(estimate, '6.3', side='nearest')}, "
                  f"eps_upper = {format_bound(high, '6.3', side='upper')} ")
            if args.verbose:
                print(f"\t({what})")
        except Exception:
            if args.fail_on_no_value:
                raise
            print(f"{name}:\t\tn/a")
    return 0
