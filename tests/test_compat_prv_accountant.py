"""dpsharp.compat.prv_accountant: prv-accountant's ``Accountant`` on dpsharp's PLD accountant,
checked against prv-accountant 0.2.0 on the same settings."""

from __future__ import annotations

import math

import dpsharp
import pytest
from _gaussian_reference import exact_epsilon_lower
from dpsharp.compat.prv_accountant import Accountant


def built() -> None:
    if "pld" not in dpsharp.available():
        pytest.skip("the pld accountant is not built in this checkout")


def test_semantics_bounds_and_max_compositions() -> None:
    built()
    acc = Accountant(noise_multiplier=0.8, sampling_probability=5e-3, delta=1e-6,
                     eps_error=0.05, max_compositions=1000)
    lower, estimate, upper = acc.compute_epsilon(num_compositions=1000)
    assert lower <= estimate <= upper and upper - lower <= 2 * 0.05
    pld = dpsharp.accountant("pld").compose(dpsharp.PoissonSampled(dpsharp.Gaussian(0.8), 5e-3), 1000)
    # eps_error = 0.05 is looser than the default precision: the bracket is the PLD's own
    assert (lower, upper) == tuple(pld.epsilon_bounds(1e-6))
    assert estimate == 0.5 * (lower + upper)
    # fewer compositions after more: answered from a fresh composition, monotone in T
    small = acc.compute_epsilon(100)
    assert small[2] < upper and small[0] <= small[1] <= small[2]
    assert acc.compute_epsilon(0) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="max_compositions"):
        acc.compute_epsilon(1001)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"sampling_probability": 1.5}, "sampling_probability"),
        ({"delta": 1.0}, "delta"),
        ({"max_compositions": 0}, "max_compositions"),
        ({"eps_error": -0.1}, "eps_error"),
        ({"mesh_size": 0.1}, "mesh_size"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, float], name: str) -> None:
    arguments = {"noise_multiplier": 1.0, "sampling_probability": 0.01, "delta": 1e-5,
                 "max_compositions": 10, "eps_error": 0.1}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=name):
        Accountant(**arguments)  # type: ignore[arg-type]


@pytest.mark.peers
@pytest.mark.filterwarnings("ignore:`Accountant` will be deprecated:DeprecationWarning")
@pytest.mark.parametrize(("sigma", "q", "steps", "delta"), [(0.8, 5e-3, 1000, 1e-6), (1.1, 256 / 60000, 14063, 1e-5)])
def test_brackets_agree_with_prv_accountant(sigma: float, q: float, steps: int, delta: float) -> None:
    prv = pytest.importorskip("prv_accountant")
    built()
    theirs = prv.Accountant(noise_multiplier=sigma, sampling_probability=q, delta=delta,
                            eps_error=0.05, max_compositions=steps).compute_epsilon(num_compositions=steps)
    mine = Accountant(noise_multiplier=sigma, sampling_probability=q, delta=delta,
                      eps_error=0.05, max_compositions=steps).compute_epsilon(num_compositions=steps)
    # both brackets contain the true epsilon, so they overlap; ours is certified and narrower
    assert mine[0] <= theirs[2] and theirs[0] <= mine[2]
    assert mine[2] - mine[0] <= theirs[2] - theirs[0] + 1e-9
    assert mine[2] <= theirs[2] + 1e-9




@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 4), (2.5, 30)])
def test_noise_multiplier_is_relative_to_the_add_remove_sensitivity(
    sigma: float, steps: int
) -> None:
    """prv-accountant's noise_multiplier is noise std / add-remove sensitivity (a mean shift of
    1): with sampling probability 1 the steps are the Gaussian mechanism with mu =
    sqrt(steps) / sigma, whose exact epsilon the certified bracket contains."""
    built()
    delta = 1e-5
    exact = exact_epsilon_lower(delta, math.sqrt(steps) / sigma)
    lower, estimate, upper = Accountant(
        noise_multiplier=sigma, sampling_probability=1.0, delta=delta, eps_error=0.01,
        max_compositions=steps,
    ).compute_epsilon(steps)
    assert lower <= exact <= upper
    assert upper <= exact * (1 + 1e-3)
