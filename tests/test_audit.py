"""One-run privacy audit (Steinke, Nasr, Jagielski 2023): the statistics against exact
references, and the audit of dpsharp's own training code against injected faults.

References: the p-value bound of Theorem 5.2 recomputed with mpmath at 50 digits from exact
binomial sums; the bound's validity by the exact distribution of the number of correct guesses
of the ideal eps-DP randomized-response canary game, and by simulating an (eps, delta)-DP game.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsharp.torch.audit import one_run_epsilon_lower, one_run_p_value

mpmath = pytest.importorskip("mpmath")


# ---------------------------------------------------------------------------- statistics
def _reference_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Theorem 5.2 of Steinke, Nasr, Jagielski 2023 with exact binomial sums in mpmath."""
    with mpmath.workdps(50):
        p = mpmath.e ** eps / (1 + mpmath.e ** eps)
        pmf = [mpmath.binomial(r, j) * p ** j * (1 - p) ** (r - j) for j in range(r + 1)]
        tails = [mpmath.mpf(0)] * (r + 2)  # tails[w] = P[Binomial(r, p) >= w]
        for j in range(r, -1, -1):
            tails[j] = tails[j + 1] + pmf[j]

        def f(w: int) -> mpmath.mpf:
            return mpmath.mpf(1) if w <= 0 else tails[w]

        fv = f(v)
        ratio = max(((f(v - i) - fv) / i for i in range(1, m + 1)), default=0)
        return float(min(1, fv + 2 * m * delta * ratio))


@pytest.mark.parametrize("m, r, v, eps, delta", [
    (10, 10, 9, 1.0, 0.0), (10, 6, 6, 2.0, 1e-3), (50, 40, 30, 0.5, 1e-5),
    (200, 100, 97, 3.0, 1e-5), (1000, 500, 480, 2.5, 1e-5), (20, 20, 1, 0.0, 0.01),
])
def test_p_value_matches_exact_binomial_reference(m, r, v, eps, delta):
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(
        _reference_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15)


def test_epsilon_lower_is_the_first_crossing_of_beta():
    m, r, v, delta, beta = 1000, 200, 190, 1e-5, 0.01
    eps = one_run_epsilon_lower(m, r, v, delta, beta)
    assert eps > 0
    assert _reference_p_value(m, r, v, eps, delta) <= beta
    assert _reference_p_value(m, r, v, eps + 1e-6, delta) > beta
    # every smaller epsilon is rejected too (the reported bound is the first crossing)
    assert all(_reference_p_value(m, r, v, e, delta) <= beta
               for e in np.linspace(0.0, eps, 25))


def test_all_correct_guesses_closed_form():
    # delta = 0, all r guesses right: p^r = beta, eps = log(p / (1 - p))
    r, beta = 300, 0.05
    p = beta ** (1.0 / r)
    assert one_run_epsilon_lower(r, r, r, 0.0, beta) == pytest.approx(math.log(p / (1 - p)),
                                                                      abs=1e-7)


def test_chance_level_gives_zero():
    assert one_run_epsilon_lower(1000, 500, 250, 1e-5, 0.05) == 0.0


@pytest.mark.parametrize("eps_true, r", [(0.5, 50), (1.0, 100), (2.0, 40)])
def test_bound_valid_exactly_for_ideal_randomized_response(eps_true, r):
    """Ideal eps-DP canary game (each guess right independently with probability
    e^eps / (1 + e^eps), the most an eps-DP mechanism allows): P[eps_lower > eps_true] is
    summed exactly over the binomial law of W and must be <= beta."""
    from scipy import stats

    beta = 0.05
    p = 1.0 / (1.0 + math.exp(-eps_true))
    flagged = sum(stats.binom.pmf(w, r, p) for w in range(r + 1)
                  if one_run_epsilon_lower(r, r, w, 0.0, beta) > eps_true)
    assert flagged <= beta
    assert flagged > beta / 10  # and the bound is not vacuous at delta = 0


def test_bound_valid_by_simulation_with_delta_and_abstention():
    """An (eps, delta)-DP game simulated 4000 times: each canary's membership is revealed with
    probability delta, otherwise randomized response at eps; the auditor abstains on half. The
    bound exceeds eps_true in at most beta of the runs (binomial 3-sigma slack)."""
    rng = np.random.default_rng(7)
    eps_true, delta, beta, m, runs = 1.0, 0.02, 0.1, 60, 4000
    p = 1.0 / (1.0 + math.exp(-eps_true))
    cache: dict[int, float] = {}
    flagged = 0
    for _ in range(runs):
        s = rng.random(m) < 0.5
        reveal = rng.random(m) < delta
        truthful = rng.random(m) < p
        seen = np.where(reveal | truthful, s, ~s)
        # confident guesses first: revealed ones, then the rest; guess on 30 of 60
        order = np.argsort(~reveal + rng.random(m) * 0.5)[:30]
        v = int((seen[order] == s[order]).sum())
        if v not in cache:
            cache[v] = one_run_epsilon_lower(m, 30, v, delta, beta)
        flagged += cache[v] > eps_true
    assert flagged / runs <= beta + 3 * math.sqrt(beta * (1 - beta) / runs)


def test_statistics_bad_input():
    with pytest.raises(ValueError, match="v"):
        one_run_p_value(10, 5, 6, 1.0, 0.0)
    with pytest.raises(ValueError, match="r"):
        one_run_p_value(10, 11, 1, 1.0, 0.0)
    with pytest.raises(ValueError, match="epsilon"):
        one_run_p_value(10, 5, 1, -1.0, 0.0)
    with pytest.raises(ValueError, match="beta"):
        one_run_epsilon_lower(10, 5, 1, 0.0, 1.0)


# ---------------------------------------------------------------------------- the audit
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dpsharp.torch import kernels  # noqa: E402
from dpsharp.torch.noise import NoiseGenerator, ReleaseKey  # noqa: E402

# Default audit settings: sigma 2, q 0.05, 100 steps, delta 1e-5 (eps_upper 1.10 under PLD).
SETTINGS = dict(noise_multiplier=2.0, max_grad_norm=1.0, steps=100, sample_rate=0.05,
                delta=1e-5, canaries=1000, progress=False)


def _data(n: int = 200, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, (x[:, 0] > 0).long()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def _audit(seed: int, **overrides):
    import dpsharp.torch

    x, y = _data()
    return dpsharp.torch.audit(_mlp, x, y, **{**SETTINGS, "seed": seed, **overrides})


@pytest.mark.torch
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_implementation_passes(seed):
    result = _audit(seed)
    assert result.certified and result.epsilon_upper == pytest.approx(1.097, abs=0.01)
    assert result.passed and result.epsilon_lower <= result.epsilon_upper


@pytest.mark.torch
@pytest.mark.slow
def test_correct_implementation_passes_over_20_seeds():
    results = [_audit(100 + seed) for seed in range(20)]
    assert all(r.passed for r in results), [r.epsilon_lower for r in results]


def _no_noise(monkeypatch):
    original = kernels.release_noise

    def mutant(*args, **kwargs):
        kwargs["noise_std"] = 0.0
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "release_noise", mutant)


def _noise_on_mean(monkeypatch):
    original = kernels.release_noise

    def mutant(*args, **kwargs):  # std sigma C / B: calibrated to the mean, not the sum
        kwargs["noise_std"] = kwargs["noise_std"] * kwargs.get("scale", 1.0)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "release_noise", mutant)


def _no_clipping(monkeypatch):
    original = kernels.flat_clip_factors

    def mutant(terms, bound, batch):
        result = original(terms, bound, batch)
        return None if result is None else (result[0], torch.ones_like(result[1]))

    monkeypatch.setattr(kernels, "flat_clip_factors", mutant)


def _reused_noise(monkeypatch):
    original = NoiseGenerator.next_release

    def mutant(self):  # the counter advances but every release gets release 0's noise
        key = original(self)
        return ReleaseKey(key=key.key, release=0, rank=key.rank)

    monkeypatch.setattr(NoiseGenerator, "next_release", mutant)


@pytest.mark.torch
@pytest.mark.parametrize("mutate", [
    pytest.param(_no_noise, id="no_noise"),
    pytest.param(_noise_on_mean, id="noise_on_mean"),
    pytest.param(_no_clipping, id="no_clipping", marks=pytest.mark.slow),
    pytest.param(_reused_noise, id="reused_noise", marks=pytest.mark.slow),
])
def test_mutant_is_caught(monkeypatch, mutate):
    mutate(monkeypatch)
    result = _audit(0)  # seed 0 passes unmutated (test_correct_implementation_passes)
    assert not result.passed, result.summary()
    assert result.epsilon_lower > result.epsilon_upper + 1.0


class _SequenceFirst(nn.Module):
    """Takes (batch, seq, d) and runs its layers sequence-first, (seq, batch, d)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def forward(self, x):
        return self.layer(x.transpose(0, 1)).mean(dim=0)


@pytest.mark.torch
def test_sequence_first_model_is_refused():
    import dpsharp.torch

    x = torch.randn(200, 5, 8)
    y = (x[:, 0, 0] > 0).long()
    with pytest.raises(ValueError, match="batch_first|dimension 0"):
        dpsharp.torch.audit(_SequenceFirst, x, y, **{**SETTINGS, "seed": 0})


@pytest.mark.torch
def test_audit_bad_input():
    import dpsharp.torch

    x, y = _data()
    with pytest.raises(ValueError, match="noise_multiplier"):
        dpsharp.torch.audit(_mlp, x, y, **{**SETTINGS, "noise_multiplier": -1.0})
    with pytest.raises(ValueError, match="confidence"):
        dpsharp.torch.audit(_mlp, x, y, **{**SETTINGS, "confidence": 1.0})
    with pytest.raises(ValueError, match="canary_scale"):
        dpsharp.torch.audit(_mlp, x, y, **{**SETTINGS, "canary_scale": 0.5})
    with pytest.raises(ValueError, match="sample_rate"):
        dpsharp.torch.audit(_mlp, x, y, **{**SETTINGS, "sample_rate": 0.0})
    with pytest.raises(ValueError, match="inputs and targets"):
        dpsharp.torch.audit(_mlp, x, y[:10], **SETTINGS)


@pytest.mark.torch
@pytest.mark.slow  # the README's `dpsharp audit` command runs the CLI audit by default
def test_cli_audit_json(tmp_path):
    import json
    import subprocess
    import sys

    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    result = subprocess.run(
        [sys.executable, "-m", "dpsharp", "audit", "--steps", "30", "--canaries", "200",
         "--json", "--no-progress", "--plot", str(tmp_path / "audit.png")],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # sigma 2, q 0.05, 30 steps at delta 1e-5, recomposed by hand into a fresh PLD accountant
    import dpsharp
    from dpsharp.events import Gaussian, PoissonSampled

    reference = dpsharp.accountant("pld").compose(PoissonSampled(Gaussian(2.0), 0.05), 30)
    assert report["epsilon_upper"] == pytest.approx(reference.epsilon(1e-5), rel=1e-6)
    assert report["passed"] and 0.0 <= report["epsilon_lower"] <= report["epsilon_upper"]
    assert report["canaries"] == 200 and 0 < report["included"] < 200
    assert (tmp_path / "audit.png").stat().st_size > 1000


@pytest.mark.parametrize("flags, message", [
    (["--sample-rate", "2"], "argument --sample-rate: must be in (0, 1]"),
    (["--noise-multiplier", "-1"], "argument --noise-multiplier: must be in [0, inf)"),
    (["--confidence", "1"], "argument --confidence: must be in (0, 1)"),
    (["--canaries", "1"], "argument --canaries: must be an integer in [2, 2^53]"),
])
def test_cli_audit_bad_input_one_line(flags, message, capsys):
    """Refused by the argument parser, naming the flag and its range (exit 2, one line)."""
    from dpsharp import cli

    with pytest.raises(SystemExit) as excinfo:
        cli.main(["audit", "--no-progress", *flags])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dpsharp audit: error:") and message in err[-1]


@pytest.mark.torch
def test_canary_contributes_exactly_the_clipping_bound_per_sampled_step():
    """Without noise (sigma = 0, the real code), canary j's coordinate of a release is
    C * [j sampled] / B with B = q n: the summed score times B / C is a whole number of sampled
    steps, 0 for every excluded canary, and averages q T over the included ones (binomial
    mean, 5-sigma band). The canary's norm 100 C is clipped to exactly C."""
    result = _audit(4, noise_multiplier=0.0, max_grad_norm=0.5)
    assert result.epsilon_upper == math.inf and result.passed
    n = 200 + result.included
    counts = result.scores["sum"] * (0.05 * n) / 0.5
    assert np.allclose(counts, np.round(counts), atol=1e-3)
    assert np.all(np.round(counts[~result.membership]) == 0)
    sampled = np.round(counts[result.membership])
    q, t = 0.05, 100
    band = 5 * math.sqrt(q * (1 - q) * t / sampled.size)
    assert abs(sampled.mean() - q * t) < band and sampled.max() <= t


# ---------------------------------------------------------------------------- input canaries
#: Black-box audit: canaries are records in input space, scored by the final model alone.
#: sigma 8 is claimed (eps_upper 0.378 at delta 1e-5 under dp-accounting's PLD for q 0.05,
#: 300 steps), so that the weaker black-box score can show a run that adds no noise.
INPUT_SETTINGS = dict(noise_multiplier=8.0, max_grad_norm=1.0, steps=300, sample_rate=0.05,
                      canaries=200, optimizer=2.0, progress=False, canary_type="input")


def _wide_mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 10))


def _digits():
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    return (torch.tensor(images / 16.0 - 0.25, dtype=torch.float32),
            torch.tensor(labels, dtype=torch.long))


def _input_audit(seed: int, **overrides):
    import dpsharp.torch

    pytest.importorskip("sklearn")
    x, y = _digits()
    return dpsharp.torch.audit(_wide_mlp, x, y, **{**INPUT_SETTINGS, "seed": seed, **overrides})


@pytest.mark.torch
def test_input_canaries_correct_run_passes_and_no_noise_is_caught(monkeypatch):
    """The same seed, the real code and then the code without noise: the black-box score
    finds no violation in the first and shows eps_lower > eps_upper in the second."""
    dp_accounting = pytest.importorskip("dp_accounting")
    reference = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(8.0))
    reference.compose(event, 300)
    correct = _input_audit(0)
    assert correct.canary_type == "input" and set(correct.scores) == {"loss_drop"}
    assert correct.epsilon_upper == pytest.approx(reference.get_epsilon(1e-5), rel=2e-3)
    assert correct.passed, correct.summary()
    _no_noise(monkeypatch)
    mutant = _input_audit(0)
    assert not mutant.passed, mutant.summary()
    assert mutant.epsilon_lower > mutant.epsilon_upper


@pytest.mark.torch
@pytest.mark.slow
def test_input_canaries_correct_run_passes_over_seeds():
    results = [_input_audit(200 + seed) for seed in range(10)]
    assert all(r.passed for r in results), [r.epsilon_lower for r in results]


@pytest.mark.torch
def test_input_canaries_default_records_and_bad_input():
    import dpsharp.torch
    from dpsharp.torch.audit import _input_canaries

    x, y = _data()
    rng = np.random.default_rng(0)
    cx, cy = _input_canaries(x, y, 50, None, None, rng)
    amplitude = 4.0 * float(x.abs().max())
    assert cx.shape == (50, *x.shape[1:]) and cy.shape == (50,)
    assert torch.allclose(cx.abs(), torch.full_like(cx, amplitude))
    assert int(cy.min()) >= 0 and int(cy.max()) <= int(y.max())
    settings = {**SETTINGS, "seed": 0}
    with pytest.raises(ValueError, match="canary_type"):
        dpsharp.torch.audit(_mlp, x, y, **settings, canary_type="blackbox")
    with pytest.raises(ValueError, match="canary_inputs"):
        dpsharp.torch.audit(_mlp, x, y, **settings, canary_inputs=cx, canary_targets=cy)
    with pytest.raises(ValueError, match="together"):
        dpsharp.torch.audit(_mlp, x, y, **settings, canary_type="input", canary_inputs=cx)
    with pytest.raises(ValueError, match="canaries=.* records"):
        dpsharp.torch.audit(_mlp, x, y, **{**settings, "canaries": 40}, canary_type="input",
                            canary_inputs=cx, canary_targets=cy)
    with pytest.raises(ValueError, match="integer class"):
        dpsharp.torch.audit(_mlp, x, y.to(torch.float32), **settings, canary_type="input")


@pytest.mark.torch
def test_cli_audit_input_canaries(capsys):
    import json

    pytest.importorskip("sklearn")
    from dpsharp import cli

    status = cli.main(["audit", "--canary-type", "input", "--steps", "20", "--canaries", "50",
                       "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["passed"]
    assert report["best"]["score"] == "loss_drop" and report["canaries"] == 50


class _BatchCentred(nn.Module):
    """Subtracts the batch mean from its input: parameter-free, so the clipper sees only the
    Linear layers, yet every example's gradient depends on the others of its batch."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x):
        return self.body(x - x.mean(dim=0, keepdim=True))


@pytest.mark.torch
def test_batch_mixing_model_is_flagged():
    import dpsharp.torch
    from dpsharp.torch.audit import cross_example_leak

    x, y = _data()
    assert cross_example_leak(_mlp(), x) is None
    assert "record 0's output changed" in cross_example_leak(_BatchCentred(), x)
    # The canaries alone would not see it (they never pass through the user's layers): the
    # verdict fails on the probe, whatever eps_lower is.
    result = dpsharp.torch.audit(_BatchCentred, x, y, **{**SETTINGS, "seed": 0})
    assert not result.passed and result.cross_example is not None
    assert result.summary().startswith("FAIL: the examples are not independent")
    correct = _audit(0)
    assert correct.cross_example is None and correct.passed


class _TransposedInside(nn.Module):
    """Takes (batch, 8, 4) and runs its Linear sequence-first, on (8, batch, 4): with a batch
    of 8 every layer input has 8 rows, so the clipper's batch-size checks pass and the Linear
    would be clipped per position."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x.transpose(0, 1)).transpose(0, 1).mean(dim=1)


@pytest.mark.torch
def test_sequence_first_layer_hidden_by_equal_sizes_is_flagged():
    from dpsharp.torch.audit import batch_dimension_leak

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 8, 4, generator=g)
    found = batch_dimension_leak(_TransposedInside(), x)
    assert found is not None and "layer (Linear)" in found and "dimension 1" in found
    assert batch_dimension_leak(_mlp(), _data()[0]) is None
    assert batch_dimension_leak(nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)),
                                x) is None  # (batch, 8, 4): rows are examples


@pytest.mark.torch
def test_audit_fails_a_model_clipped_per_position():
    import dpsharp.torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 8, 4, generator=g)
    y = (x[:, 0, 0] > 0).long()
    with pytest.raises(ValueError, match="layer \\(Linear\\) sees the examples in dimension 1"):
        dpsharp.torch.audit(_TransposedInside, x, y, **{**SETTINGS, "seed": 0})


def test_summary_prints_each_bound_on_its_safe_side() -> None:
    """The summary's eps_lower (a statistical lower bound) is printed rounded down and the
    certified eps_upper rounded up, at 3 decimals: 0.12389 -> 0.123 and 1.23412 -> 1.235
    (round-to-nearest printed 0.124, above the lower bound, and 1.234, below the upper one);
    an uncertified upper value is printed to nearest."""
    from dpsharp.torch.audit import AuditResult

    fields = dict(epsilon_lower=0.12389, epsilon_upper=1.23412, passed=True, confidence=0.95,
                  delta=1e-5, canaries=100, included=50, steps=10, noise_multiplier=1.0,
                  max_grad_norm=1.0, sample_rate=0.1, best=("sum", 5, 9, 0.0))
    text = AuditResult(certified=True, **fields).summary()
    assert "eps_lower = 0.123 " in text and "eps_upper = 1.235 " in text
    text = AuditResult(certified=False, **fields).summary()
    assert "eps_upper = 1.234 " in text
