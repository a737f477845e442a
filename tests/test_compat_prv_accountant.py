"""dpsharp.compat.prv_accountant: prv-accountant's module tree (``PRVAccountant``, the
deprecated ``Accountant``, ``dpsgd``, the privacy random variables, ``compute-dp-epsilon``) on
dpsharp's PLD accountant, checked against closed forms (the exact Gaussian curve, the PRVs'
normalisation E[e^-Y] = 1) and against prv-accountant 0.2.0 on the same settings."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from fractions import Fraction

import dpsharp
import numpy as np
import pytest
from _gaussian_reference import exact_delta, exact_epsilon_lower
from dpsharp.compat import prv_accountant as compat
from scipy.integrate import quad


def Accountant(**kwargs):  # type: ignore[no-untyped-def]
    """The deprecated ``Accountant``, whose prv-accountant DeprecationWarning is checked once in
    test_deprecated_accountant_warns_as_prv_accountant_does."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`Accountant` will be deprecated", DeprecationWarning)
        return compat.Accountant(**kwargs)


def built() -> None:
    if "pld" not in dpsharp.available():
        pytest.skip("the pld accountant is not built in this checkout")


def test_semantics_bounds_and_max_compositions() -> None:
    built()
    acc = Accountant(noise_multiplier=0.8, sampling_probability=5e-3, delta=1e-6,
                     eps_error=0.05, max_compositions=1000)
    lower, estimate, upper = acc.compute_epsilon(num_compositions=1000)
    assert lower <= estimate <= upper and upper - lower <= 2 * 0.05
    # the upper bound's relative precision is 2 eps_error, as prv-accountant's mesh follows
    # eps_error; at 0.05 the bracket is met by refining the lower bound's grid alone
    assert acc.accountant.precision == 0.1
    pld = dpsharp.accountant("pld", precision=0.1).compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(0.8), 5e-3), 1000)
    # the estimate is dpsharp's one certified number for the composition: the PLD
    # accountant's epsilon (and the upper end of its own bounds) at that precision
    assert estimate == upper == pld.epsilon(1e-6) == pld.epsilon_bounds(1e-6)[1]
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
@pytest.mark.parametrize(("sigma", "q", "steps", "delta"),
                         [(0.8, 5e-3, 1000, 1e-6), (1.1, 256 / 60000, 14063, 1e-5)])
def test_brackets_agree_with_prv_accountant(sigma: float, q: float, steps: int,
                                            delta: float) -> None:
    prv = pytest.importorskip("prv_accountant")
    built()
    theirs = prv.Accountant(noise_multiplier=sigma, sampling_probability=q, delta=delta,
                            eps_error=0.05, max_compositions=steps
                            ).compute_epsilon(num_compositions=steps)
    mine = Accountant(noise_multiplier=sigma, sampling_probability=q, delta=delta,
                      eps_error=0.05, max_compositions=steps
                      ).compute_epsilon(num_compositions=steps)
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


def test_deprecated_accountant_warns_as_prv_accountant_does() -> None:
    built()
    with pytest.deprecated_call(match="PRVAccountant"):
        acc = compat.Accountant(noise_multiplier=0.8, sampling_probability=5e-3, delta=1e-6,
                                eps_error=0.1, max_compositions=1000)
    assert acc.compute_epsilon(num_compositions=10)[2] > 0.0


def test_module_tree_mirrors_prv_accountant() -> None:
    from dpsharp.compat.prv_accountant.accountant import PRVAccountant
    from dpsharp.compat.prv_accountant.dpsgd import DPSGDAccountant, find_noise_multiplier
    from dpsharp.compat.prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        LaplaceMechanism,
        PoissonSubsampledGaussianMechanism,
    )

    assert PRVAccountant is compat.PRVAccountant and issubclass(DPSGDAccountant, PRVAccountant)
    assert find_noise_multiplier is compat.dpsgd.find_noise_multiplier
    assert GaussianMechanism is compat.GaussianMechanism
    assert LaplaceMechanism is compat.privacy_random_variables.LaplaceMechanism
    assert PoissonSubsampledGaussianMechanism is compat.PoissonSubsampledGaussianMechanism


def _normalisation(prv: compat.PrivacyRandomVariable, low: float, high: float) -> float:
    """E[e^-Y] = sum over the pair's outputs of Q = 1 for a PRV Y = log(P/Q)(X), X ~ P, with no
    mass at infinity: the integral of e^-t dF(t) = the integral of e^-t F(t) dt over [low, high]
    plus the boundary term e^-high F(high) (F(low) = 0)."""
    points = [p for p in (-1e-2, 0.0, 1e-2) if low < p < high]
    body, _ = quad(lambda t: math.exp(-t) * prv.cdf(t), low, high, points=points, limit=500)
    return body + math.exp(-high) * prv.cdf(high)


@pytest.mark.parametrize(
    "prv",
    [
        compat.PoissonSubsampledGaussianMechanism(1e-2, 1.0),
        compat.PoissonSubsampledGaussianMechanism(0.3, 0.7),
        compat.GaussianMechanism(2.0),
        compat.LaplaceMechanism(0.5),
        compat.PureDPMechanism(0.8),
    ],
    ids=repr,
)
def test_privacy_random_variables_are_normalised(prv: compat.PrivacyRandomVariable) -> None:
    """Each PRV's cdf is the law of a privacy loss: E[e^-Y] = 1 (Gopi, Lee, Wutschitz 2021,
    the PRV of a pair (P, Q) has E_P[Q/P] = 1)."""
    assert _normalisation(prv, -40.0, 40.0) == pytest.approx(1.0, abs=1e-7)


@pytest.mark.peers
def test_privacy_random_variables_match_prv_accountant() -> None:
    peer = pytest.importorskip("prv_accountant")
    ts = np.array([math.log1p(-1e-2) - 1, math.log1p(-1e-2) / 2, 0.0, 1e-3, 0.5, 3.0, 100.0])
    pairs = [
        (compat.PoissonSubsampledGaussianMechanism(1e-2, 1.0),
         peer.PoissonSubsampledGaussianMechanism(1e-2, 1.0)),
        (compat.PoissonSubsampledGaussianMechanism(0.2, 3.0),
         peer.PoissonSubsampledGaussianMechanism(0.2, 3.0)),
        (compat.GaussianMechanism(8.0, l2_sensitivity=2.0),
         peer.GaussianMechanism(8.0, l2_sensitivity=2.0)),
        (compat.PureDPMechanism(0.3), peer.PureDPMechanism(0.3)),
    ]
    for ours, theirs in pairs:
        np.testing.assert_allclose(ours.cdf(ts), theirs.cdf(ts), rtol=1e-9, atol=1e-15)
    # the Laplace PRV: the same away from its atoms; at the atom -mu the cdf here is right-
    # continuous (P(Y <= -mu) = e^-mu / 2), prv-accountant's gives the left limit 0
    mu = 0.5
    laplace, peer_laplace = compat.LaplaceMechanism(mu), peer.LaplaceMechanism(mu)
    away = np.array([-1.0, -0.3, 0.0, 0.2, 0.6])
    np.testing.assert_allclose(laplace.cdf(away), peer_laplace.cdf(away), rtol=1e-12)
    assert laplace.cdf(-mu) == pytest.approx(0.5 * math.exp(-mu)) and peer_laplace.cdf(-mu) == 0
    for alpha in (1.5, 2.0, 8.0, 32.0):
        assert compat.PoissonSubsampledGaussianMechanism(1e-2, 1.0).rdp(alpha) == pytest.approx(
            peer.PoissonSubsampledGaussianMechanism(1e-2, 1.0).rdp(alpha), rel=1e-6)
        assert laplace.rdp(alpha) == pytest.approx(float(peer_laplace.rdp(alpha)), rel=1e-9)


def test_gaussian_composition_brackets_the_exact_curve() -> None:
    """q = 1 is the Gaussian mechanism: after T steps mu = sqrt(T) / sigma, whose exact
    delta(eps) and eps(delta) every certified bracket contains (Dong, Roth, Su 2019)."""
    built()
    sigma, steps = 10.0, 400
    acc = compat.PRVAccountant(
        prvs=[compat.PoissonSubsampledGaussianMechanism(sampling_probability=1.0,
                                                        noise_multiplier=sigma)],
        max_self_compositions=[steps], eps_error=0.01, delta_error=1e-10)
    mu = math.sqrt(steps) / sigma
    for eps in (0.1, 1.0, 5.0):
        low, estimate, high = acc.compute_delta(eps, [steps])
        exact = exact_delta(eps, mu)
        assert low <= exact <= high and estimate == high
        assert high - low <= 1e-3 * exact + 1e-12
    low, estimate, high = acc.compute_epsilon(delta=1e-6, num_self_compositions=[steps])
    exact = exact_epsilon_lower(1e-6, mu)
    assert low <= exact <= high <= exact + 2 * 0.01 and estimate == high


def test_heterogeneous_gaussians_compose_to_one_gaussian() -> None:
    """N(0, 10^2) 50 times and N(0, 5^2) 50 times: one Gaussian with
    mu = sqrt(50/100 + 50/25)."""
    built()
    acc = compat.PRVAccountant(
        prvs=[compat.GaussianMechanism(10.0), compat.GaussianMechanism(5.0)],
        max_self_compositions=[50, 50], eps_error=0.01, delta_error=1e-10)
    low, _, high = acc.compute_delta(4.0, [50, 50])
    exact = exact_delta(4.0, math.sqrt(50 / 100 + 50 / 25))
    assert low <= exact <= high
    lo, _, hi = acc.compute_epsilon(1e-5, [50, 50])
    assert lo <= exact_epsilon_lower(1e-5, math.sqrt(2.5)) <= hi


def test_growing_compositions_reuse_the_accountant() -> None:
    """Asking for more compositions composes only the new ones into the same PLD accountant,
    with the numbers of a fresh composition (its answers depend on the multiset only)."""
    built()
    prv = compat.PoissonSubsampledGaussianMechanism(sampling_probability=0.01,
                                                    noise_multiplier=1.0)
    acc = compat.DPSGDAccountant(noise_multiplier=1.0, sampling_probability=0.01,
                                 max_steps=2000)
    acc.compute_epsilon(delta=1e-5, num_steps=500)
    inner = acc._accountant
    grown = acc.compute_epsilon(delta=1e-5, num_steps=2000)
    assert acc._accountant is inner
    event = prv.event
    assert event is not None
    fresh = dpsharp.accountant("pld", precision=acc.precision).compose(event, 2000)
    assert grown[2] == fresh.epsilon(1e-5) and grown[2] - grown[0] <= 2 * acc.eps_error
    assert acc.compute_epsilon(delta=1e-5, num_steps=500)[2] < grown[2]
    with pytest.raises(ValueError, match="exceeds the maximum number of compositions"):
        acc.compute_epsilon(delta=1e-5, num_steps=2001)


@pytest.mark.peers
@pytest.mark.slow
def test_readme_composition_agrees_with_prv_accountant() -> None:
    """prv-accountant's own heterogeneous example: a Poisson-subsampled Gaussian, a Gaussian and
    a Laplace mechanism. Both brackets contain the optimal epsilon, so they overlap; dpsharp's
    is certified and within 2 eps_error."""
    peer = pytest.importorskip("prv_accountant")
    built()

    def bracket(lib):  # type: ignore[no-untyped-def]
        prvs = [lib.PoissonSubsampledGaussianMechanism(noise_multiplier=0.8,
                                                       sampling_probability=5e-3),
                lib.GaussianMechanism(noise_multiplier=8.0), lib.LaplaceMechanism(mu=0.1)]
        acc = lib.PRVAccountant(prvs=prvs, max_self_compositions=[1_000] * 3, eps_error=0.1,
                                delta_error=1e-10)
        return acc.compute_epsilon(delta=1e-6, num_self_compositions=[100, 200, 100])

    mine, theirs = bracket(compat), bracket(peer)
    assert mine[0] <= theirs[2] and theirs[0] <= mine[2]
    assert mine[2] - mine[0] <= 0.2 and mine[2] <= theirs[2]
    # prv-accountant's own PRV objects are read by their parameters
    prvs = [peer.PoissonSubsampledGaussianMechanism(noise_multiplier=0.8,
                                                    sampling_probability=5e-3),
            peer.GaussianMechanism(noise_multiplier=8.0), peer.LaplaceMechanism(mu=0.1)]
    acc = compat.PRVAccountant(prvs=prvs, max_self_compositions=[1_000] * 3, eps_error=0.1,
                               delta_error=1e-10)
    assert acc.compute_epsilon(1e-6, [100, 200, 100]) == mine


def test_refusals_name_the_privacy_random_variable() -> None:
    class OwnCdf:
        def cdf(self, t: float) -> float:
            return float(t >= 0)

    with pytest.raises(dpsharp.UnsupportedEventError, match=r"prvs\[0\].*prvs\[1\].*replace-one"):
        compat.PRVAccountant(prvs=[compat.PoissonSubsampledGaussianMechanism(0.1, 1.0),
                                   compat.ApproximateDPMechanism(0.1, 1e-6)],
                             eps_error=0.1, delta_error=1e-9)
    with pytest.raises(dpsharp.UnsupportedEventError, match=r"prvs\[0\].*given only by its CDF"):
        compat.PRVAccountant(prvs=OwnCdf(),  # type: ignore[arg-type]
                             eps_error=0.1, delta_error=1e-9)
    with pytest.raises(ValueError, match="max_self_compositions must have one entry per PRV"):
        compat.PRVAccountant(prvs=[compat.GaussianMechanism(1.0)], eps_error=0.1,
                             delta_error=1e-9, max_self_compositions=[1, 2])
    for kwargs, name in (({"eps_error": 0.0}, "eps_error"), ({"delta_error": 1.0}, "delta_error")):
        arguments = {"prvs": compat.GaussianMechanism(1.0), "eps_error": 0.1, "delta_error": 1e-9}
        arguments.update(kwargs)
        with pytest.raises(ValueError, match=name):
            compat.PRVAccountant(**arguments)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampling_probability"):
        compat.PoissonSubsampledGaussianMechanism(1.5, 1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        compat.GaussianMechanism(0.0)
    # a PRV whose loss is 0 (q = 0, eps = 0) composes to nothing
    null = compat.PRVAccountant(prvs=[compat.PoissonSubsampledGaussianMechanism(0.0, 1.0),
                                      compat.PureDPMechanism(0.0)],
                                eps_error=0.1, delta_error=1e-9, max_self_compositions=[5, 5])
    assert null.compute_epsilon(1e-5, [5, 5]) == (0.0, 0.0, 0.0)


def test_find_noise_multiplier_is_conservative() -> None:
    """The certified epsilon at the returned sigma is <= the target and within eps_error of
    it (prv-accountant's search may overshoot by eps_error); the exact Gaussian curve at
    q = 1 checks it independently."""
    built()
    target, delta, steps = 2.0, 1e-5, 50
    sigma = compat.dpsgd.find_noise_multiplier(sampling_probability=1.0, num_steps=steps,
                                                target_epsilon=target, target_delta=delta,
                                                eps_error=0.05)
    exact = exact_epsilon_lower(delta, math.sqrt(steps) / sigma)
    assert target - 0.05 - 1e-3 <= exact <= target
    upper = compat.DPSGDAccountant(sigma, 1.0, max_steps=steps).compute_epsilon(delta, steps)[2]
    assert upper <= target
    with pytest.raises(RuntimeError, match="mu_max") as info:
        compat.dpsgd.find_noise_multiplier(0.5, 1000, 0.01, 1e-10, mu_max=2.0)
    # the certified epsilon at mu_max it quotes is rounded up: still an upper bound
    quoted = re.search(r"gives epsilon (\S+) >", str(info.value))
    at_ceiling = dpsharp.accountant("pld").compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(2.0), 0.5), 1000).epsilon(1e-10)
    assert quoted is not None and Fraction(quoted[1]) >= Fraction(at_ceiling)


@pytest.mark.peers
@pytest.mark.slow
def test_find_noise_multiplier_agrees_with_prv_accountant() -> None:
    peer_dpsgd = pytest.importorskip("prv_accountant.dpsgd")
    built()
    args = {"sampling_probability": 2e-3, "num_steps": 2000, "target_epsilon": 2.0,
            "target_delta": 1e-6}
    mine = compat.dpsgd.find_noise_multiplier(**args)
    theirs = peer_dpsgd.find_noise_multiplier(**args)
    # both within the 0.1 epsilon tolerance of the target: the sigmas agree to a few percent
    assert mine == pytest.approx(theirs, rel=0.05)
    low, _, high = peer_dpsgd.DPSGDAccountant(mine, 2e-3, max_steps=2000).compute_epsilon(
        delta=1e-6, num_steps=2000)
    assert low <= 2.0 and high >= 2.0 - 0.1 - 0.2


def test_compute_dp_epsilon_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m dpsharp.compat.prv_accountant`` takes compute-dp-epsilon's flags and prints
    its lines; the PRV line is dpsharp's certified PLD bracket."""
    built()
    out = subprocess.run([sys.executable, "-m", "dpsharp.compat.prv_accountant", "-p", "5e-3",
                          "-s", "0.8", "-d", "1e-6", "-i", "1000"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if "eps_upper" in line}
    assert set(lines) == {"PRV Accountant", "RDP Accountant"}
    fields = dict(re.findall(r"(eps_\w+) = +([-+.\deinf]+)", lines["PRV Accountant"]))
    lower, _, upper = compat.DPSGDAccountant(
        noise_multiplier=0.8, sampling_probability=5e-3, max_steps=1000, eps_error=0.1,
        delta_error=1e-9).compute_epsilon(delta=1e-6, num_steps=1000)
    # prv-accountant's format, 3 significant digits, rounded outwards: the printed upper bound
    # is >= the certified float and the printed lower bound <= it (exact rational comparison;
    # round-to-nearest printed eps_upper 2.01 for a certified 2.0114...), each within one unit
    # of the last printed digit
    unit = Fraction(1, 100)  # both are in [1, 10) here
    assert 1 <= lower <= upper < 10
    assert Fraction(upper) <= Fraction(fields["eps_upper"]) < Fraction(upper) + unit
    assert Fraction(lower) - unit < Fraction(fields["eps_lower"]) <= Fraction(lower)
    rdp_fields = dict(re.findall(r"(eps_\w+) = +([-+.\deinf]+)", lines["RDP Accountant"]))
    rdp = dpsharp.accountant("rdp").compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(0.8), 5e-3), 1000).epsilon(1e-6)
    assert Fraction(rdp) <= Fraction(rdp_fields["eps_upper"]) < Fraction(rdp) + unit
    # the long flags, in process
    assert compat.main(["--sampling-probability", "5e-3", "--noise-multiplier", "0.8",
                        "--delta", "1e-6", "--num-compositions", "1000"]) == 0
    assert capsys.readouterr().out == out
    with pytest.raises(SystemExit) as exit_info:
        compat.main(["-p", "5e-3"])
    assert exit_info.value.code == 2 and "--noise-multiplier" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, named", [
    ("-p", "1.5", "-p/--sampling-probability"), ("-s", "-1", "-s/--noise-multiplier"),
    ("-s", "nan", "-s/--noise-multiplier"), ("-i", "-5", "-i/--num-compositions"),
    ("-d", "0", "-d/--delta"), ("-d", "1", "-d/--delta"),
])
def test_compute_dp_epsilon_names_a_bad_flag_and_exits_2(capsys, flag: str, value: str,
                                                         named: str) -> None:
    """A bad value is an error naming its flag (status 2), not an "n/a" line with status 0."""
    args = {"-p": "5e-3", "-s": "0.8", "-i": "100", "-d": "1e-6"}
    args[flag] = value
    with pytest.raises(SystemExit) as exit_info:
        compat.main([part for pair in args.items() for part in pair])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and named in captured.err and captured.out == ""


def test_compute_dp_epsilon_at_rate_zero_prints_zero_on_both_lines(capsys) -> None:
    """q = 0 uses no record: epsilon 0 on the PRV and the RDP line alike."""
    assert compat.main(["-p", "0", "-s", "0.8", "-i", "100", "-d", "1e-6"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "eps_upper" in line]
    assert len(lines) == 2
    for line in lines:
        assert dict(re.findall(r"(eps_\w+) = +([-+.\deinf]+)", line)) == {
            "eps_lower": "0.0", "eps_estimate": "0.0", "eps_upper": "0.0"}


def _binary_composition_delta(eps: float, delta: float, count: int, at: float) -> float:
    """The exact delta(at) of ``count`` (eps, delta)-DP mechanisms composed: the mass
    D = 1 - (1 - delta)^count at +inf, and binary randomized response's losses
    eps (2B - count), B ~ Binomial(count, e^eps / (1 + e^eps)) (Kairouz, Oh, Viswanath 2015),
    summed in mpmath."""
    import mpmath

    with mpmath.workdps(40):
        p = mpmath.exp(eps) / (1 + mpmath.exp(eps))
        finite = mpmath.fsum(
            mpmath.binomial(count, b) * p**b * (1 - p) ** (count - b)
            * max(mpmath.mpf(0), 1 - mpmath.exp(at - eps * (2 * b - count)))
            for b in range(count + 1))
        infinity = 1 - (1 - mpmath.mpf(delta)) ** count
        return float(infinity + (1 - infinity) * finite)


@pytest.mark.parametrize(("eps", "delta", "count"),
                         [(0.3, 1e-4, 20), (1.0, 0.0, 7), (0.0, 1e-6, 50)])
def test_approximate_dp_composition_is_exact(eps: float, delta: float, count: int) -> None:
    """ApproximateDPMechanism / PureDPMechanism: the certified bracket of the composition holds
    the exact binomial answer, and a Gaussian composes alongside (a replace-one pair too)."""
    built()
    prv = (compat.ApproximateDPMechanism(eps, delta) if delta else compat.PureDPMechanism(eps))
    acc = compat.PRVAccountant(prvs=[prv, compat.GaussianMechanism(3.0)], eps_error=1e-3,
                               delta_error=1e-12, max_self_compositions=[count, 4])
    for at in (0.0, 0.5, 2.0):
        exact = _binary_composition_delta(eps, delta, count, at)
        low, estimate, high = acc.compute_delta(at, [count, 0])
        assert low <= exact * (1 + 1e-12) and exact <= high * (1 + 1e-12) and estimate == high
        assert high - low <= 1e-3 * exact + 1e-12
        composed = acc.compute_composition([count, 0])
        assert composed.compute_delta_estimate(at) == high
    target = 1.5 * (1 - (1 - delta) ** count) + 1e-3
    low, _, high = acc.compute_epsilon(target, [count, 0])
    assert _binary_composition_delta(eps, delta, count, high) <= target * (1 + 1e-9)
    if low > 0:
        assert _binary_composition_delta(eps, delta, count, low) >= target * (1 - 1e-9)
    # below the mass at +inf no epsilon exists
    if delta:
        assert acc.compute_epsilon(0.5 * (1 - (1 - delta) ** count), [count, 4])[2] == math.inf


# prv-accountant's own test settings, as bench/bench_adapters.py times them: (PRVs, counts,
# delta); eps_error 0.1 as there.
_BENCH_SETTINGS = {
    "invariance": ([("poisson", 0.9, 256 / 100_000)], [4900], 1e-5),
    "dpsgd": ([("poisson", 0.8, 5e-3)], [1000], 1e-6),
    "readme": ([("poisson", 0.8, 5e-3), ("gaussian", 8.0, 1.0), ("laplace", 0.1, 1.0)],
               [100, 200, 100], 1e-6),
}


def _compat_prvs(spec):  # type: ignore[no-untyped-def]
    made = {"poisson": lambda s, q: compat.PoissonSubsampledGaussianMechanism(q, s),
            "gaussian": lambda s, _: compat.GaussianMechanism(s),
            "laplace": lambda mu, _: compat.LaplaceMechanism(mu)}
    return [made[kind](a, b) for kind, a, b in spec]


def _dp_accounting_pld(spec, counts, interval):  # type: ignore[no-untyped-def]
    """dp-accounting 0.6.0's connect-the-dots PLD of the same composition (Doroshenko, Ghazi,
    Kamath, Kumar, Manurangsi 2022): a pessimistic estimate, both directions of the Poisson
    pair, so its epsilon is at least the true one (up to its tail truncation, far below)."""
    from dp_accounting.pld import privacy_loss_distribution as peer_pld

    total = None
    for (kind, a, b), count in zip(spec, counts):
        if kind == "poisson":
            one = peer_pld.from_gaussian_mechanism(
                standard_deviation=a, sampling_prob=b, value_discretization_interval=interval)
        elif kind == "gaussian":
            one = peer_pld.from_gaussian_mechanism(
                standard_deviation=a, value_discretization_interval=interval)
        else:  # Lap(0, 1) against Lap(mu, 1): scale 1 / mu at sensitivity 1
            one = peer_pld.from_laplace_mechanism(
                1.0 / a, value_discretization_interval=interval)
        one = one.self_compose(count)
        total = one if total is None else total.compose(one)
    return total


@pytest.mark.peers
@pytest.mark.parametrize("setting", sorted(_BENCH_SETTINGS))
def test_bench_settings_bracket_dp_accountings_fine_pld(setting: str) -> None:
    """On prv-accountant's own settings at its eps_error 0.1: the certified bracket is at most
    2 eps_error wide (the contract of prv-accountant's compute_epsilon: a grid too coarse for
    it fails here) and contains dp-accounting's pessimistic epsilon on a grid of 5e-4, within
    1e-3 of the exact one on these settings; the upper end is the PLD accountant's epsilon at
    the adapter's precision (one number), and the lower end below dp-accounting's epsilon
    (which is at least the exact one). compute_delta brackets dp-accounting's delta too."""
    pytest.importorskip("dp_accounting")
    built()
    spec, counts, delta = _BENCH_SETTINGS[setting]
    prvs = _compat_prvs(spec)
    acc = compat.PRVAccountant(prvs=prvs, max_self_compositions=[1000 * c for c in counts],
                               eps_error=0.1, delta_error=1e-10)
    lower, estimate, upper = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
    reference = _dp_accounting_pld(spec, counts, 5e-4)
    eps_ref = reference.get_epsilon_for_delta(delta)
    assert lower <= eps_ref <= upper and estimate == upper
    assert upper - lower <= 2 * 0.1
    one = dpsharp.accountant("pld", precision=acc.precision)
    for prv, count in zip(prvs, counts):
        one.compose(prv.event, count)
    assert upper == one.epsilon(delta)
    # delta at the reference's epsilon: dp-accounting's (pessimistic) delta is at least the
    # exact one, and dpsharp's upper bound is above both on its coarser grid
    d_lower, d_estimate, d_upper = acc.compute_delta(eps_ref, counts)
    d_ref = reference.get_delta_for_epsilon(eps_ref)
    assert d_lower <= d_ref <= d_upper and d_estimate == d_upper


@pytest.mark.parametrize("eps_error", [0.05, 0.02])
def test_smaller_eps_error_narrows_the_bracket(eps_error: float) -> None:
    """The width follows eps_error (prv-accountant's contract) on its DP-SGD test setting, with
    the lower end below and the upper end above the exact epsilon's bracket from a much finer
    PLD accountant (both certified)."""
    built()
    acc = compat.DPSGDAccountant(noise_multiplier=0.8, sampling_probability=5e-3,
                                 max_steps=1000, eps_error=eps_error, delta_error=1e-10)
    lower, _, upper = acc.compute_epsilon(delta=1e-6, num_steps=1000)
    fine_lower, fine_upper = dpsharp.accountant("pld", precision=1e-3).compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(0.8), 5e-3), 1000).epsilon_bounds(1e-6)
    assert upper - lower <= 2 * eps_error
    assert lower <= fine_upper and fine_lower <= upper


def test_analytic_setting_brackets_the_exact_gaussian() -> None:
    """prv-accountant's analytic test: q = 1, sigma = 100, 10000 steps is the Gaussian
    mechanism with mu = sqrt(10000) / 100 = 1, whose exact delta(1) (Balle, Wang 2018) the
    certified bracket contains."""
    built()
    acc = compat.PRVAccountant(
        prvs=[compat.PoissonSubsampledGaussianMechanism(sampling_probability=1.0,
                                                        noise_multiplier=100.0)],
        max_self_compositions=[10_000], eps_error=0.1, delta_error=1e-10)
    low, estimate, high = acc.compute_delta(1.0, [10_000])
    exact = exact_delta(1.0, 1.0)
    assert low <= exact <= high and estimate == high and high - low <= 1e-9


def _randomized_response_epsilon(eps: float, count: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``count`` compositions of eps-DP randomized response
    (Kairouz, Oh, Viswanath 2015): the loss is eps (2 J - count) with J ~ Bin(count, p),
    p = e^eps / (1 + e^eps), and delta(e) = E[(1 - e^{e - L})_+]."""
    from scipy.optimize import brentq
    from scipy.stats import binom

    j = np.arange(count + 1)
    mass = binom.pmf(j, count, math.exp(eps) / (1.0 + math.exp(eps)))
    loss = eps * (2.0 * j - count)

    def excess(e: float) -> float:
        gap = np.minimum(e - loss, 700.0)  # terms with loss below e vanish anyway
        return float(np.sum(mass * np.maximum(-np.expm1(gap), 0.0))) - delta

    return float(brentq(excess, 0.0, eps * count, xtol=1e-12))


def _approximate_dp_epsilon(eps: float, delta_1: float, count: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``count`` compositions of (eps, delta_1)-DP: with
    D = 1 - (1 - delta_1)^count the mass at +inf, delta = D + (1 - D) delta_rr(epsilon), the
    randomized-response part from the binomial closed form."""
    infinity = -math.expm1(count * math.log1p(-delta_1))
    return _randomized_response_epsilon(eps, count, (delta - infinity) / (1.0 - infinity))


@pytest.mark.parametrize(("delta_1", "delta_prime"), [(1e-7, 1e-5), (1e-8, 1e-6)])
def test_advanced_composition_setting_is_bracketed_within_two_eps_error(
    delta_1: float, delta_prime: float
) -> None:
    """prv-accountant's test_advanced_composition: 100,000 steps of (0.01, delta_1)-DP at
    delta 100,000 delta_1 + delta_prime, eps_error 0.1. The optimistic side merges each atom
    onto its grid point (a post-processing) instead of rounding it down, so the certified
    bracket holds the exact epsilon and is within 2 eps_error = 0.2 with no warning (it was
    [15.93, 16.51], 0.58 wide, with a RuntimeWarning)."""
    built()
    count = 100_000
    acc = compat.PRVAccountant(prvs=[compat.ApproximateDPMechanism(0.01, delta_1)],
                               eps_error=0.1, delta_error=delta_1 / 1000,
                               max_self_compositions=[count])
    delta = count * delta_1 + delta_prime
    lower, estimate, upper = acc.compute_epsilon(delta, [count])  # filterwarnings=error
    exact = _approximate_dp_epsilon(0.01, delta_1, count, delta)
    assert lower <= exact <= upper and estimate == upper
    assert upper - lower <= 0.2


@pytest.mark.slow
def test_bracket_wider_than_asked_is_returned_with_a_warning() -> None:
    """300 compositions of 0.01-DP randomized response at eps_error 1e-6: the optimistic
    discretisation still errs at first order for the top atom's tail, and no grid tried brings
    the bracket within 2 eps_error = 2e-6 (it ends 3.7e-5 wide); the wider bracket is returned
    (certified: it holds the exact epsilon of the binomial closed form) with a
    RuntimeWarning."""
    built()
    acc = compat.PRVAccountant(prvs=[compat.PureDPMechanism(0.01)], eps_error=1e-6,
                               delta_error=1e-10, max_self_compositions=[300])
    with pytest.warns(RuntimeWarning, match="wider than 2 \\* eps_error"):
        lower, estimate, upper = acc.compute_epsilon(1e-5, [300])
    exact = _randomized_response_epsilon(0.01, 300, 1e-5)
    assert lower <= exact <= upper and estimate == upper
    assert upper - lower > 2e-6


def test_delta_below_the_lower_bounds_floor_answers_at_once_with_a_warning() -> None:
    """Five Laplace mechanisms (3 x Lap(1), 2 x Lap(2): losses bounded by 4, top atom of mass
    1/32) at delta 1e-14, below the round-off floor of the optimistic composition on every grid:
    finer grids only raise that floor, so the search stops at the first refusal (it retried every
    grid at every precision before, for minutes) and returns the certified bracket with a
    RuntimeWarning. The upper end is the top-mass bound, against the closed form
    epsilon = 4 + log(1 - 32 delta) (the continuous part above it is far below delta)."""
    import mpmath

    built()
    acc = compat.PRVAccountant([compat.LaplaceMechanism(1.0), compat.LaplaceMechanism(0.5)],
                               eps_error=1e-3, delta_error=1e-16, max_self_compositions=[3, 2])
    calls = []
    original = compat_accountant_module()._optimistic_epsilon

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[2])
        return original(*args, **kwargs)

    import unittest.mock

    with unittest.mock.patch.object(compat_accountant_module(), "_optimistic_epsilon", counted):
        with pytest.warns(RuntimeWarning, match="round-off floor"):
            lower, estimate, upper = acc.compute_epsilon(1e-14, [3, 2])
    assert len(calls) == 1  # one refusal, no finer grid, no second precision
    exact = float(4 + mpmath.log1p(-32 * mpmath.mpf(1e-14)))
    assert lower <= exact <= upper == estimate
    assert upper <= exact + 1e-3 * 1e-14 + 4 * math.ulp(4.0)


def compat_accountant_module():  # type: ignore[no-untyped-def]
    """The module that holds the adapter's bracket search."""
    import dpsharp.compat._prv.accountant as module

    return module


def test_an_answer_does_not_depend_on_the_queries_before_it() -> None:
    """A query that needs finer grids (2000 steps at eps_error 2e-4) refines only itself: the same query on a fresh accountant and after it gives the same bracket,
    which holds the exact epsilon of the q = 1 composition (mu = sqrt(T) / sigma)."""
    built()

    def fresh() -> compat.PRVAccountant:
        return compat.PRVAccountant(
            prvs=[compat.PoissonSubsampledGaussianMechanism(sampling_probability=0.01,
                                                            noise_multiplier=0.8),
                  compat.PoissonSubsampledGaussianMechanism(sampling_probability=1.0,
                                                            noise_multiplier=30.0)],
            max_self_compositions=[2000, 100], eps_error=2e-4, delta_error=1e-10)

    first = fresh().compute_epsilon(delta=1e-5, num_self_compositions=[100, 0])
    refined = fresh()
    refined.compute_epsilon(delta=1e-5, num_self_compositions=[2000, 0])
    assert refined.precision < 1e-3  # that query refined its grids
    assert refined.compute_epsilon(delta=1e-5, num_self_compositions=[100, 0]) == first
    gaussian = fresh().compute_epsilon(delta=1e-5, num_self_compositions=[0, 100])
    assert gaussian[0] <= exact_epsilon_lower(1e-5, math.sqrt(100) / 30.0) <= gaussian[2]
