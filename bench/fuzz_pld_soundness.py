"""Randomised soundness check of PLDAccountant against dp-accounting's optimistic PLD.

For random ledgers (one to three kinds of event, each with a random count: under add/remove
among Gaussian, Laplace, discrete Laplace, Poisson-subsampled Gaussian and mixture of Gaussians,
and now and then a per-step schedule of several hundred distinct noise multipliers, which
dpsharp accounts with its noise multipliers rounded; under replace-one randomized response,
Gaussian and Poisson-subsampled Gaussian; under zero-out, dp-accounting's REPLACE_SPECIAL, any
of these), dp-accounting 0.6.0 builds the
*optimistic* privacy-loss distribution of the same events (``pessimistic_estimate=False``:
every loss rounded down, so its epsilon(delta) and delta(epsilon) are lower bounds of the exact
ones, up to its float64 FFT round-off and its truncations, which only drop mass) and the
pessimistic one (an upper bound). dpsharp's events are made from dp-accounting's by
``dpsharp.compat.dp_accounting.from_dp_event`` (so a wrong conversion shows as a failure too).

Each case checks, at a random delta in [1e-9, 1e-3] and at dp-accounting's optimistic epsilon
there:

* soundness: dpsharp's certified ``epsilon(delta)`` is at least dp-accounting's optimistic
  epsilon, and ``delta(epsilon)`` at least its optimistic delta (relative slack 1e-9, plus
  1e-13 absolute on delta for the peer's own round-off and truncation);
* the lower bound: the lower end of ``epsilon_bounds(delta)`` is at most dp-accounting's
  pessimistic epsilon (the same slack);
* the other upper bounds: the epsilon of ``RDPAccountant``, ``MomentsAccountant`` and
  ``ClassicAccountant`` on the same events (where they analyse them all) is at least the
  optimistic epsilon too;
* tightness (reported, not a failure): dpsharp's epsilon against the pessimistic one.

dp-accounting's optimistic estimate is not always below the exact value: for k-ary randomized
response composed hundreds of times it was 0.2% above it (bench/results/pld_lattice.txt,
checked at 40 digits), so a failure on such a ledger needs an exact check before it counts.
A case that breaks a check prints ``BAD`` with the ledger; every tenth prints ``OK`` with the
numbers; the summary gives the cases, failures and the largest ratio of dpsharp's epsilon to
dp-accounting's pessimistic one.

    python bench/fuzz_pld_soundness.py --seed 1 --seconds 600 [--interval 1e-4]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from typing import Any

from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpsharp import (
    ClassicAccountant,
    MomentsAccountant,
    Neighbouring,
    PLDAccountant,
    RDPAccountant,
)
from dpsharp.compat.dp_accounting import from_dp_event

#: Relative slack of the soundness comparisons (dp-accounting's float64 FFT round-off).
RELATIVE_SLACK = 1e-9
#: Absolute slack on delta (dp-accounting's truncations drop masses of about 1e-15).
DELTA_SLACK = 1e-13


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def random_replace_one_kind(rng: random.Random) -> tuple[Any, int]:
    """One kind of event of dp-accounting under REPLACE_ONE and its count."""
    kind = rng.choice(["randomized_response", "gaussian", "poisson_gaussian"])
    if kind == "randomized_response":
        return (dp_event.RandomizedResponseDpEvent(rng.uniform(0.3, 0.99), rng.randint(2, 8)),
                rng.randint(1, 40))
    if kind == "gaussian":
        return dp_event.GaussianDpEvent(log_uniform(rng, 1.0, 60.0)), rng.randint(1, 50)
    inner = dp_event.GaussianDpEvent(rng.uniform(1.2, 8.0))
    return (dp_event.PoissonSampledDpEvent(log_uniform(rng, 1e-3, 0.3), inner),
            int(log_uniform(rng, 1.0, 2000.0)))


def random_zero_out_kind(rng: random.Random) -> tuple[Any, int]:
    """One kind of event of dp-accounting under REPLACE_SPECIAL (dpsharp's zero-out: the
    record replaced by a null one) and its count."""
    if rng.random() < 0.35:
        return (dp_event.RandomizedResponseDpEvent(rng.uniform(0.3, 0.99), rng.randint(2, 8)),
                rng.randint(1, 40))
    return random_kind(rng)


def random_kind(rng: random.Random) -> tuple[Any, int]:
    """One kind of event of dp-accounting (add/remove) and its count."""
    kind = rng.choice(["gaussian", "laplace", "discrete_laplace", "poisson_gaussian",
                       "poisson_gaussian", "mixture"])
    if kind == "gaussian":
        return dp_event.GaussianDpEvent(log_uniform(rng, 0.5, 30.0)), rng.randint(1, 50)
    if kind == "laplace":
        return dp_event.LaplaceDpEvent(log_uniform(rng, 2.0, 50.0)), rng.randint(1, 20)
    if kind == "discrete_laplace":
        return (dp_event.DiscreteLaplaceDpEvent(log_uniform(rng, 0.02, 0.5), rng.randint(1, 3)),
                rng.randint(1, 20))
    if kind == "poisson_gaussian":
        inner = dp_event.GaussianDpEvent(rng.uniform(0.6, 4.0))
        return (dp_event.PoissonSampledDpEvent(log_uniform(rng, 1e-3, 0.3), inner),
                int(log_uniform(rng, 1.0, 2000.0)))
    sensitivities = sorted(rng.sample([0.0, 0.25, 0.5, 0.75, 1.0], rng.randint(2, 3)))
    if sensitivities[-1] == 0.0:
        sensitivities[-1] = 1.0
    weights = [rng.random() + 0.05 for _ in sensitivities]
    total = sum(weights)
    probabilities = [w / total for w in weights]
    probabilities[-1] = 1.0 - sum(probabilities[:-1])
    return (dp_event.MixtureOfGaussiansDpEvent(rng.uniform(0.6, 4.0), sensitivities,
                                               probabilities), rng.randint(1, 30))


def random_schedule(rng: random.Random) -> list[tuple[Any, int]]:
    """A per-step schedule: several hundred distinct noise multipliers at one sampling rate."""
    steps = rng.randint(520, 900)
    q = log_uniform(rng, 3e-3, 0.05)
    top, bottom = rng.uniform(1.5, 3.0), rng.uniform(0.7, 1.2)
    ratio = (bottom / top) ** (1.0 / (steps - 1))
    return [(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(top * ratio**k)), 1)
            for k in range(steps)]


def peer_pld(event: Any, count: int, interval: float, pessimistic: bool,
             relation: NeighboringRelation) -> Any:
    """dp-accounting's PLD of ``count`` copies of ``event`` under ``relation``."""
    if isinstance(event, dp_event.RandomizedResponseDpEvent):
        made = pld_lib.from_randomized_response(
            event.noise_parameter, event.num_buckets, pessimistic_estimate=pessimistic,
            value_discretization_interval=interval, neighboring_relation=relation)
        return made.self_compose(count) if count > 1 else made
    # (the optimistic side is the privacy-buckets rounding: connect-the-dots is pessimistic only)
    common = {"pessimistic_estimate": pessimistic, "value_discretization_interval": interval,
              "use_connect_dots": pessimistic}
    if isinstance(event, dp_event.GaussianDpEvent):
        return pld_lib.from_gaussian_mechanism(event.noise_multiplier / math.sqrt(count),
                                               neighboring_relation=relation, **common)
    if isinstance(event, dp_event.LaplaceDpEvent):
        made = pld_lib.from_laplace_mechanism(event.noise_multiplier, **common)
    elif isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        made = pld_lib.from_discrete_laplace_mechanism(event.noise_parameter, event.sensitivity,
                                                       **common)
    elif isinstance(event, dp_event.PoissonSampledDpEvent):
        made = pld_lib.from_gaussian_mechanism(event.event.noise_multiplier,
                                               sampling_prob=event.sampling_probability,
                                               neighboring_relation=relation, **common)
    else:
        made = pld_lib.from_mixture_gaussian_mechanism(event.standard_deviation,
                                                       event.sensitivities,
                                                       event.sampling_probs, **common)
    return made.self_compose(count) if count > 1 else made


def peer_composition(ledger: list[tuple[Any, int]], interval: float, pessimistic: bool,
                     relation: NeighboringRelation) -> Any:
    total = None
    for event, count in ledger:
        made = peer_pld(event, count, interval, pessimistic, relation)
        total = made if total is None else total.compose(made)
    return total


def describe(ledger: list[tuple[Any, int]]) -> str:
    if len(ledger) > 8:
        first = ledger[0][0]
        last = ledger[-1][0]
        return (f"schedule of {len(ledger)} steps q={first.sampling_probability:.4g} sigma "
                f"{first.event.noise_multiplier:.4g} -> {last.event.noise_multiplier:.4g}")
    return "; ".join(f"{count} x {event}" for event, count in ledger)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--interval", type=float, default=1e-4,
                        help="dp-accounting's value_discretization_interval")
    parser.add_argument("--verbose", action="store_true", help="print every passing case")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    deadline = time.time() + args.seconds
    cases = bad = 0
    worst_ratio = 0.0
    while time.time() < deadline:
        relation, ours_relation = NeighboringRelation.ADD_OR_REMOVE_ONE, Neighbouring.ADD_REMOVE
        draw = rng.random()
        if draw < 0.05:
            ledger = random_schedule(rng)
            interval = max(args.interval, 1e-3)  # (hundreds of distinct PLDs)
        elif draw < 0.25:
            relation, ours_relation = NeighboringRelation.REPLACE_ONE, Neighbouring.REPLACE_ONE
            ledger = [random_replace_one_kind(rng) for _ in range(rng.randint(1, 3))]
            interval = args.interval
        elif draw < 0.4:
            relation, ours_relation = NeighboringRelation.REPLACE_SPECIAL, Neighbouring.ZERO_OUT
            ledger = [random_zero_out_kind(rng) for _ in range(rng.randint(1, 3))]
            interval = args.interval
        else:
            ledger = [random_kind(rng) for _ in range(rng.randint(1, 3))]
            interval = args.interval
        delta = log_uniform(rng, 1e-9, 1e-3)
        start = time.perf_counter()
        optimistic = peer_composition(ledger, interval, pessimistic=False,
                                      relation=relation)
        pessimistic = peer_composition(ledger, interval, pessimistic=True, relation=relation)
        peer_low = optimistic.get_epsilon_for_delta(delta)
        peer_high = pessimistic.get_epsilon_for_delta(delta)
        if not (math.isfinite(peer_high) and peer_high < 60.0):
            continue  # outside what either is meant for; draw again
        peer_seconds = time.perf_counter() - start
        start = time.perf_counter()
        ours = PLDAccountant(neighbouring=ours_relation)
        for event, count in ledger:
            ours.compose(from_dp_event(event, relation), count)
        try:
            upper = ours.epsilon(delta)
            lower, bracket_upper = ours.epsilon_bounds(delta)
            at_low = ours.delta(peer_low) if peer_low > 0.0 else None
        except ValueError as error:  # a documented refusal (e.g. below the round-off floor)
            print(f"REFUSED {relation.name} {describe(ledger)} delta={delta:.3g}: {error}", flush=True)
            continue
        our_seconds = time.perf_counter() - start
        cases += 1
        peer_delta = optimistic.get_delta_for_epsilon(peer_low) if peer_low > 0.0 else None
        failures = []
        if upper < peer_low * (1.0 - RELATIVE_SLACK):
            failures.append(f"epsilon {upper!r} below the optimistic {peer_low!r}")
        if bracket_upper != upper:
            failures.append(f"epsilon_bounds upper {bracket_upper!r} != epsilon {upper!r}")
        if lower > peer_high * (1.0 + RELATIVE_SLACK):
            failures.append(f"lower bound {lower!r} above the pessimistic {peer_high!r}")
        if (at_low is not None and peer_delta is not None
                and at_low < peer_delta * (1.0 - RELATIVE_SLACK) - DELTA_SLACK):
            failures.append(f"delta({peer_low!r}) = {at_low!r} below the optimistic "
                            f"{peer_delta!r}")
        for other in (RDPAccountant, MomentsAccountant, ClassicAccountant):
            try:
                theirs = other(neighbouring=ours_relation)
                for event, count in ledger:
                    theirs.compose(from_dp_event(event, relation), count)
                bound = theirs.epsilon(delta)
            except (ValueError, TypeError, NotImplementedError):
                continue  # an event it does not analyse
            if bound < peer_low * (1.0 - RELATIVE_SLACK):
                failures.append(f"{other.__name__} epsilon {bound!r} below the optimistic "
                                f"{peer_low!r}")
        ratio = upper / peer_high if peer_high > 0.0 else 1.0
        worst_ratio = max(worst_ratio, ratio)
        line = (f"delta={delta:.3g} ours [{lower:.6f}, {upper:.6f}] peer optimistic "
                f"{peer_low:.6f} pessimistic {peer_high:.6f} (ours / pessimistic {ratio:.6f}; "
                f"{peer_seconds:.1f} s / {our_seconds:.2f} s)")
        if failures:
            bad += 1
            print(f"BAD {relation.name} {describe(ledger)} {line}: {'; '.join(failures)}", flush=True)
        elif cases % 10 == 0 or args.verbose:
            print(f"OK {cases}: {relation.name} {describe(ledger)} {line}", flush=True)
    print(f"cases {cases}, failures {bad}, largest epsilon / peer pessimistic {worst_ratio:.6f}")
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
