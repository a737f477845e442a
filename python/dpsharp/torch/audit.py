"""One-run privacy audit of a DP-SGD training run with white-box gradient canaries.

An accountant proves an upper bound eps_upper for the algorithm it was told about; whether the
code that ran *is* that algorithm (per-example clipping, noise of std sigma * C on the sum,
fresh noise every step) is a different question. :func:`audit` answers it empirically, in the
style of Steinke, Nasr and Jagielski 2023 ("Privacy Auditing with One (1) Training Run",
NeurIPS 2023): one training run through dpsharp's own engine with m canaries, each included
independently with probability 1/2, a guess for each canary from the released gradients, and
a lower bound eps_lower on the epsilon of the run at confidence 1 - beta from the number of
correct guesses. eps_lower > eps_upper means that the run is *not* as private as accounted:
the code, not the accountant, is wrong. eps_lower <= eps_upper proves nothing about privacy
(it is a lower bound, not a certificate); it says this audit found no violation.

What runs
---------
The user's model is wrapped with one extra canary-only parameter w in R^m (a bias-free
``nn.Linear(m, 1)``, initialised to 0). Canary j is a training record (the dataset's first
input, its user loss masked to zero) whose loss is ``w . (G e_j)``: its per-example gradient
is G e_j (a Dirac canary, Steinke et al. section 6) with G = ``canary_scale * C`` >= C, and it
is zero on every parameter of the user's model; a real record's gradient on w is zero. The
canaries go into the training set, are drawn by the same :class:`PoissonDataLoader`, pass the
same forward / backward pass, the same :class:`~dpsharp.torch.PerSampleClipper` (flat
clipping over *all* parameters, the user's and w together) and the same fused noise release
of :class:`~dpsharp.torch.DPOptimizer` built by :class:`~dpsharp.torch.PrivacyEngine`, and
are accounted by the engine's accountant (``PoissonSampled(Gaussian(sigma), q)`` per step,
add/remove one record). A canary left out is a record removed: its inclusion is exactly the
neighbouring relation the accountant's eps_upper is stated under.

The auditor is white-box: it sees every released noisy gradient g_t (a release hook of the
optimizer), which the accountant's guarantee covers (the composition is over all releases).
Coordinate j of g_t is (C * [canary j sampled at step t] + sigma C z_{t,j}) / B for an
included canary and sigma C z_{t,j} / B for an excluded one. Two scores per canary:

* ``sum``: sum_t g_{t,j}, the inner product of the canary direction with the total update
  (Steinke et al.'s white-box score for gradient canaries);
* ``dispersion``: sum_t (g_{t,j} - mean_t g_{t,j})^2, which is exactly 0 for an excluded
  canary when noise is reused across steps, and catches that fault while the sum does not.

For each score and each guess size k in ``guess_sizes`` the auditor guesses the k highest
scores "included" and the k lowest "excluded" (k+ = k- = k; abstains on the rest; ties broken
at random), counts the correct guesses v of r = 2k, and computes the one-run bound below at
level beta / K for the K = (number of scores) x (number of guess sizes) candidate audits.
eps_lower is the largest of the K bounds; by the union bound it exceeds the true epsilon with
probability at most beta.

The statistics (Steinke, Nasr, Jagielski 2023, Theorem 5.2)
-----------------------------------------------------------
If the run is (eps, delta)-DP with respect to each canary's inclusion, S is uniform on
{-1, 1}^m and the guesses (r of them, abstaining on the rest) are any function of the output,
then the number of correct guesses W satisfies, for every v,

    P[W >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i,
    f(v) = P[Binomial(r, p) >= v],   p = e^eps / (1 + e^eps)

(:func:`one_run_p_value`; for i > v the ratio only falls, since f(v - i) = 1). The audit
rejects "(eps, delta)-DP" when this p-value is <= beta, and :func:`one_run_epsilon_lower`
returns the first eps at which it is no longer rejected (scanning up from 0, then Brent's
method), so that eps_lower > eps* implies that eps* itself was rejected: probability <= beta
for the true eps*.

Where this differs from the paper
---------------------------------
* The paper reports the best bound over a sweep of k+ and k- without correcting for the
  choice; here the sweep is fixed in advance and Bonferroni-corrected (beta / K), so the
  stated confidence holds for the reported maximum.
* Two scores instead of one (also Bonferroni-corrected): the dispersion score is this
  library's addition, aimed at noise reused across steps.
* The guesses depend only on the ranks of the scores, and every release shares the public
  normaliser 1 / B (B = q * n with n the size of the training set, canaries included), so the
  guesses are a function of the noisy clipped sums: the Poisson-sampled Gaussian mechanism
  the accountant composes, with a sampling rate q fixed before the canaries are drawn.
* Input-space canaries (``canary_type="input"``, for black-box use) are the paper's
  black-box setting with one change: each canary is a record (default: a random sign vector
  far outside the data with a random label, :func:`_input_canaries`) trained on like any other,
  and the auditor sees only the final model, scoring each canary by how much training lowered
  its loss, loss(initial model) - loss(final model) (``loss_drop``). The paper scores by the
  final loss alone; subtracting the initial loss removes most of the spread between canaries,
  and the initial model is independent of which canaries are included, so the guesses remain
  a function of the output and of public randomness and Theorem 5.2 applies unchanged.
  Black-box scores are far weaker than gradient canaries (the paper, section 7): at the
  defaults of tests/test_audit.py a run with no noise reaches eps_lower about 0.85, enough to
  refute a claimed sigma of 8 (eps_upper 0.38) but not sigma 2. Input canaries pass through
  every layer of the user's model, so they also see what the gradient canaries cannot: layers
  that mix examples or leak an example through another's gradient.
* A model that sees the batch in another dimension than 0 is refused by the clipper, and the
  audit raises that refusal.

Power. With m canaries and all r = 2k guesses right, eps_lower is about log(p / (1 - p))
with p^r = beta / K: at confidence 0.95 and delta 1e-5 the largest value the default guess
sizes can give is 2.29, 3.22, 4.57 and 5.66 for m = 100, 250, 1000 and 4000 (it grows like
log m). For a correct run it is far below eps_upper: one run with m canaries cannot reach the
Gaussian mechanism's tight epsilon (Steinke et al. section 7 find the same). More steps add
signal to each included canary (it is sampled in about q T releases), so strong faults (no
noise, no clipping, noise on the mean, reused noise) separate the canaries completely.
The canary layer also sees the batch in dimension 0, so a model whose layers see another
batch dimension fails the clipper's equal-batch check even if it passes the others.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpsharp._report import format_bound
from dpsharp._validation import (
    require_count,
    require_delta,
    require_positive_finite,
    require_probability,
)

__all__ = ["AuditResult", "audit", "audit_digits", "batch_dimension_leak", "cross_example_leak",
           "one_run_epsilon_lower", "one_run_p_value"]

_SCORES = ("sum", "dispersion")


# ---------------------------------------------------------------------------- statistics
def _require_counts(m: int, r: int, v: int) -> tuple[int, int, int]:
    m = require_count("m", m)
    r = require_count("r", r)
    v = require_count("v", v)
    if r > m:
        raise ValueError(f"r (guesses) must be in [0, m={m}], got {r}")
    if v > r:
        raise ValueError(f"v (correct guesses) must be in [0, r={r}], got {v}")
    return m, r, v


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[W >= v] for an (epsilon, delta)-DP run audited with m canaries.

    Steinke, Nasr, Jagielski 2023, Theorem 5.2: with r guesses, p = e^eps / (1 + e^eps) and
    f(v) = P[Binomial(r, p) >= v],

        P[W >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i.

    Returns the right-hand side clipped to [0, 1] (1 for r = 0 or v = 0).
    """
    from scipy import stats

    m, r, v = _require_counts(m, r, v)
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon >= 0.0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    if v == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, p))
    if delta == 0.0:
        return min(1.0, tail)
    pmf = stats.binom.pmf(np.arange(v), r, p)  # P[X = 0..v-1]
    windows = np.cumsum(pmf[::-1])  # windows[i-1] = P[v - i <= X <= v - 1]
    ratio = float(np.max(windows / np.arange(1, v + 1)))
    return min(1.0, tail + 2.0 * m * delta * ratio)


def one_run_epsilon_lower(m: int, r: int, v: int, delta: float, beta: float) -> float:
    """The one-run lower bound on epsilon at confidence 1 - beta.

    The first epsilon >= 0 at which :func:`one_run_p_value` exceeds beta (0 if it already does
    at 0): every epsilon below it is rejected at level beta, so the result exceeds the true
    epsilon of an (eps, delta)-DP run with probability at most beta. Scans epsilon in steps of
    0.05 and refines the crossing with Brent's method (tolerance 1e-9, rounded down).
    """
    from scipy import optimize

    m, r, v = _require_counts(m, r, v)
    beta = require_probability("beta", beta)
    if beta >= 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta!r}")
    delta = float(delta)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")

    def excess(eps: float) -> float:
        return one_run_p_value(m, r, v, eps, delta) - beta

    if excess(0.0) > 0.0:
        return 0.0
    step, lo = 0.05, 0.0
    while True:
        hi = lo + step
        if excess(hi) > 0.0:
            break
        lo = hi
        if lo > 700.0:  # p rounds to 1: every guess right at any epsilon
            return math.inf
    root = optimize.brentq(excess, lo, hi, xtol=1e-9)
    return max(lo, root - 1e-9)


# ---------------------------------------------------------------------------- result
@dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` found.

    ``epsilon_lower`` is the empirical lower bound at ``confidence``; ``epsilon_upper`` the
    engine accountant's epsilon at ``delta`` (``certified`` says whether it is proven);
    ``passed`` is ``epsilon_lower <= epsilon_upper`` and no cross-example leak was found.
    ``candidates`` lists every (score, k, correct guesses out of 2k, bound) that was tried, each
    at level beta / K. ``cross_example`` is None when the batch-independence probe
    (:func:`cross_example_leak`) found nothing (or could not run), else what it found: one
    example's output depends on the other examples of its batch, so clipping per example does
    not bound an example's influence and no noise multiplier makes the run private as
    accounted. (A layer that sees the examples outside dimension 0,
    :func:`batch_dimension_leak`, makes :func:`audit` raise before training.)
    """

    epsilon_lower: float
    epsilon_upper: float
    passed: bool
    confidence: float
    delta: float
    canaries: int
    included: int
    steps: int
    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    certified: bool
    best: tuple[str, int, int, float]
    candidates: list[tuple[str, int, int, float]] = field(default_factory=list)
    scores: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    membership: np.ndarray | None = field(default=None, repr=False)
    canary_type: str = "gradient"
    cross_example: str | None = None

    def _bounds_text(self, spec: str) -> tuple[str, str]:
        """(eps_lower, eps_upper) printed with ``spec``, each on its safe side: the lower bound
        rounded down, the upper one rounded up where it is certified (to nearest otherwise)."""
        upper_side = "upper" if self.certified else "nearest"
        return (format_bound(self.epsilon_lower, spec, side="lower"),
                format_bound(self.epsilon_upper, spec, side=upper_side))

    def summary(self) -> str:
        """One paragraph for people."""
        verdict = "PASS" if self.passed else "FAIL"
        score, k, correct, _ = self.best
        lower, upper = self._bounds_text(".3f")
        leak = "" if self.cross_example is None else (
            f"FAIL: the examples are not independent ({self.cross_example}); "
            "per-example clipping does not bound one example's influence. ")
        return leak + (
            f"{verdict}: eps_lower = {lower} (confidence {self.confidence:g}, "
            f"{self.canaries} canaries, {self.included} included; best: {score} score, "
            f"{correct}/{2 * k} guesses right) vs eps_upper = {upper} "
            f"({'certified' if self.certified else 'not certified'}) at delta = "
            f"{self.delta:g} after {self.steps} steps (sigma {self.noise_multiplier:g}, "
            f"C {self.max_grad_norm:g}, q {self.sample_rate:g}). A lower bound, not a "
            "certificate: " + ("no violation found." if self.passed else
                               "the run is less private than accounted.")
        )

    def plot(self, path: str | None = None, score: str | None = None) -> Any:
        """Histogram of one score (default: the best candidate's) for included and excluded
        canaries, with the guess thresholds of the best guess size; returns the matplotlib
        Figure and writes it to ``path`` (PNG) if given. Needs matplotlib."""
        from dpsharp.plots import _new_figure, _save

        name = self.best[0] if score is None else score
        if name not in self.scores or self.membership is None:
            raise ValueError(f"score must be one of {sorted(self.scores)}, got {score!r}")
        values, member = np.asarray(self.scores[name]), self.membership
        k = max((c for c in self.candidates if c[0] == name), key=lambda c: c[3])[1]
        ordered = np.sort(values)
        figure = _new_figure()
        axes = figure.add_subplot(1, 1, 1)
        bins = np.linspace(ordered[0], ordered[-1], 60)
        axes.hist(values[member], bins=bins, alpha=0.6, label="included canaries")
        axes.hist(values[~member], bins=bins, alpha=0.6, label="excluded canaries")
        axes.axvline(ordered[k - 1], color="k", linestyle="--", label=f"bottom {k}: 'excluded'")
        axes.axvline(ordered[-k], color="k", linestyle=":", label=f"top {k}: 'included'")
        axes.set_xlabel(f"{name} score")
        axes.set_ylabel("canaries")
        lower, upper = self._bounds_text(".2f")
        axes.set_title(f"eps_lower {lower} vs eps_upper {upper} "
                       f"({'pass' if self.passed else 'FAIL'})")
        axes.legend(fontsize="small")
        _save(figure, path)
        return figure


def _guesses(scores: np.ndarray, membership: np.ndarray, k: int,
             rng: np.random.Generator) -> int:
    """Correct guesses among the top k ("included") and bottom k ("excluded") scores, ties
    broken at random."""
    order = np.lexsort((rng.random(scores.size), scores))  # ascending, random among ties
    bottom, top = order[:k], order[scores.size - k:]
    return int(membership[top].sum() + (~membership[bottom]).sum())


def evaluate_scores(scores: dict[str, np.ndarray], membership: np.ndarray, *, delta: float,
                    beta: float, guess_sizes: Sequence[int], rng: np.random.Generator,
                    ) -> list[tuple[str, int, int, float]]:
    """(score, k, correct, eps_lower at level beta / K) for every score and guess size k."""
    m = int(membership.size)
    sizes = [k for k in guess_sizes if 0 < 2 * k <= m]
    if not sizes:
        raise ValueError(f"guess_sizes must hold a k with 0 < 2k <= canaries={m}")
    level = beta / (len(scores) * len(sizes))
    out = []
    for name, values in scores.items():
        for k in sizes:
            correct = _guesses(np.asarray(values, dtype=np.float64), membership, k, rng)
            out.append((name, k, correct,
                        one_run_epsilon_lower(m, 2 * k, correct, delta, level)))
    return out


# ---------------------------------------------------------------------------- the run
def _canary_model(model: Any, canaries: int, norm: float) -> Any:
    import torch
    from torch import nn

    class CanaryModel(nn.Module):
        """The user's model plus a canary-only parameter w in R^m (see the module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.canary = nn.Linear(canaries, 1, bias=False)
            with torch.no_grad():
                self.canary.weight.zero_()

        def forward(self, x: Any, ids: Any) -> tuple[Any, Any]:
            out = self.model(x)
            is_canary = ids >= 0
            u = torch.zeros(ids.shape[0], canaries, dtype=self.canary.weight.dtype,
                            device=self.canary.weight.device)
            rows = torch.nonzero(is_canary).reshape(-1)
            u[rows, ids[rows]] = norm
            return out, self.canary(u).reshape(-1)

    return CanaryModel()


def _input_canaries(inputs: Any, targets: Any, m: int, canary_inputs: Any,
                    canary_targets: Any, rng: np.random.Generator) -> tuple[Any, Any]:
    """The m input-space canaries (records): the user's, or random inputs with random labels.

    Default: canary j is a random sign vector at 4 times the largest absolute training value,
    x_j = 4 max|x| s_j with s_j uniform on {-1, 1}^d, and a label drawn uniformly from
    {0, ..., max(targets)}. Mislabelled records far outside the data are what a model memorises
    most visibly (the black-box canaries of Jagielski, Ullman, Oprea 2020, "Auditing
    Differentially Private Machine Learning: How Private is Private SGD?"), and random sign
    vectors are nearly orthogonal to each other, so one canary's training moves its own loss
    more than the others'."""
    import torch

    if (canary_inputs is None) != (canary_targets is None):
        raise ValueError("canary_inputs and canary_targets must be given together")
    if canary_inputs is not None:
        if not isinstance(canary_inputs, torch.Tensor) or not isinstance(canary_targets,
                                                                          torch.Tensor):
            raise TypeError("canary_inputs and canary_targets must be torch tensors")
        if (canary_inputs.shape[0] != m or canary_targets.shape[0] != m
                or canary_inputs.shape[1:] != inputs.shape[1:]
                or canary_targets.shape[1:] != targets.shape[1:]):
            raise ValueError(
                f"canary_inputs / canary_targets must hold canaries={m} records shaped like "
                f"inputs / targets, got {tuple(canary_inputs.shape)} and "
                f"{tuple(canary_targets.shape)}")
        return canary_inputs, canary_targets
    if not inputs.is_floating_point():
        raise ValueError("canary_type='input' without canary_inputs needs floating-point inputs "
                         "(random canary inputs are drawn in the training values' range)")
    if targets.ndim != 1 or targets.is_floating_point() or targets.numel() == 0:
        raise ValueError("canary_type='input' without canary_targets needs integer class "
                         "targets of shape (n,): pass canary_inputs and canary_targets")
    amplitude = 4.0 * float(inputs.abs().max())
    if not (math.isfinite(amplitude) and amplitude > 0.0):
        raise ValueError("canary_type='input' without canary_inputs needs finite, not all-zero "
                         "inputs: pass canary_inputs and canary_targets")
    drawn = amplitude * (2.0 * rng.integers(0, 2, size=(m, *inputs.shape[1:])) - 1.0)
    classes = int(targets.max()) + 1
    labels = rng.integers(0, max(classes, 2), size=m)
    return (torch.as_tensor(drawn, dtype=inputs.dtype),
            torch.as_tensor(labels, dtype=targets.dtype))


def _final_losses(model: Any, loss_fn: Callable[[Any, Any], Any], x: Any, y: Any) -> np.ndarray:
    """Score of each input-space canary from the final model alone: minus its loss (a member
    was trained on, so its loss tends to be lower)."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            parameter = next(model.parameters(), None)
            device = parameter.device if parameter is not None else torch.device("cpu")
            losses = loss_fn(model(x.to(device)), y.to(device)).reshape(-1)
    finally:
        model.train(was_training)
    return -losses.to(torch.float64).cpu().numpy()


def cross_example_leak(model: Any, inputs: Any, *, probes: int = 4) -> str | None:
    """Whether one example's output depends on the other examples in its batch.

    Runs ``model`` (in eval mode, without gradients) on two batches of ``probes`` records that
    share their first record and differ in all the others, records 0, 1, ..., probes - 1 and
    0, probes, ..., 2 probes - 2, and compares the shared record's outputs. Per-example clipping
    bounds an example's influence only if its gradient is a function of that example alone;
    a layer that mixes examples (batch statistics, ``x - x.mean(0)``, attention across the batch)
    breaks that, whatever the clipper sees, and is invisible to gradient canaries. Returns a
    description of the difference when the outputs differ by more than 1e-4 relative to their
    magnitude (float32 batch-size effects are about 1e-7), None when they agree or when the
    probe cannot run (fewer than 2 probes - 1 records, or no tensor output).
    """
    import torch

    from dpsharp.torch.batch_probe import _first_output, _quiet_run

    needed = 2 * probes - 1
    if inputs.shape[0] < needed or probes < 2:
        return None
    first = torch.arange(probes)
    second = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(probes, needed)])
    with _quiet_run(model):
        a = _first_output(model(inputs[first]))
        b = _first_output(model(inputs[second]))
    if a is None or b is None or a.shape != b.shape or a.ndim == 0 or a.shape[0] != probes:
        return None
    row_a, row_b = a[0].to(torch.float64), b[0].to(torch.float64)
    scale = float(torch.maximum(row_a.abs().max(), row_b.abs().max())) + 1e-30
    difference = float((row_a - row_b).abs().max())
    if difference <= 1e-4 * scale:
        return None
    return (f"record 0's output changed by {difference:.3g} (relative {difference / scale:.3g}) "
            "when the other records of its batch changed")


def batch_dimension_leak(model: Any, inputs: Any) -> str | None:
    """Whether a layer with parameters sees something other than the batch in dimension 0.

    The clipper takes dimension 0 of every layer input as the examples and checks its size
    against the batch; a model that transposes (batch, seq, ...) to (seq, batch, ...) inside
    passes that check when seq happens to equal the batch size, and is then clipped per
    position: one example's influence is bounded by seq * C, not C. This probe
    (:func:`dpsharp.torch.batch_probe.probe_batch`, the one the engine runs at the first
    training step) runs ``model`` (eval mode, no gradients) on ``inputs[:n]`` and on the same
    records with records 0 and b swapped (b the first record that differs from record 0),
    n = min(len(inputs), 8), and records the first tensor input of every module that holds
    parameters (and the model's output): where that input has n rows, swapping two examples
    must swap exactly those two rows (dimension 1 for ``nn.MultiheadAttention`` with
    ``batch_first=False``). Returns the first module that breaks this, described, or None
    (also when all n records are equal, or fewer than 2 records are given).
    """
    from dpsharp.torch.batch_probe import probe_batch

    n = min(int(inputs.shape[0]), 8)
    if n < 2:
        return None
    return probe_batch(model, (inputs[:n],), mixing=False).batch_dimension


def audit(
    model_factory: Callable[[], Any],
    inputs: Any,
    targets: Any,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    steps: int,
    sample_rate: float,
    delta: float = 1e-5,
    optimizer: float | Callable[[Iterable[Any]], Any] = 0.1,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    canaries: int = 1000,
    confidence: float = 0.95,
    canary_scale: float = 100.0,
    guess_sizes: Sequence[int] | None = None,
    accountant: str = "pld",
    seed: int | None = None,
    progress: bool = True,
    canary_type: str = "gradient",
    canary_inputs: Any = None,
    canary_targets: Any = None,
) -> AuditResult:
    """Audit one DP-SGD run of ``model_factory()`` on ``(inputs, targets)`` with canaries.

    Parameters
    ----------
    model_factory:
        Returns a fresh ``torch.nn.Module`` (batch in dimension 0).
    inputs, targets:
        The training tensors (dimension 0: records).
    noise_multiplier, max_grad_norm:
        sigma >= 0 and the flat clipping bound C > 0, as for ``make_private``.
    steps, sample_rate:
        Number of noisy releases T >= 1 and the Poisson sampling rate q in (0, 1].
    delta:
        The delta of both eps_upper and the one-run bound, in (0, 1).
    optimizer:
        A learning rate (plain SGD) or a factory ``params -> torch.optim.Optimizer``.
    loss_fn:
        Per-example loss ``loss_fn(output, target) -> (B,)`` (default: cross-entropy with
        ``reduction="none"``).
    canaries:
        m >= 2, each included with probability 1/2.
    confidence:
        1 - beta, in (0, 1).
    canary_scale:
        The canary gradient norm G = canary_scale * C (>= 1: clipping must cut it to C).
    guess_sizes:
        The k's to try (default m/20, m/10, m/4), Bonferroni-corrected.
    accountant:
        The engine's accountant for eps_upper (default the certified "pld").
    seed:
        Seeds canary membership, initialisation, sampling and noise (None: fresh randomness).
    progress:
        A tqdm progress bar on stderr.
    canary_type:
        ``"gradient"`` (white-box Dirac gradient canaries scored from every released gradient,
        the default and the most powerful) or ``"input"`` (input-space canaries scored from the
        final model alone, for black-box use; see the module docstring).
    canary_inputs, canary_targets:
        For ``canary_type="input"``: the m canary records (dimension 0: canaries). Default:
        random sign vectors at 4 max|inputs| with labels drawn uniformly from the classes of
        ``targets`` (integer class targets, floating-point inputs).

    Returns
    -------
    AuditResult
        eps_lower, eps_upper and the verdict (module docstring: what it proves and how).

    Raises
    ------
    ValueError
        Bad arguments, or a run the library refuses (e.g. a sequence-first model).
    """
    import torch
    from tqdm import tqdm

    from dpsharp.torch.data import PoissonDataLoader
    from dpsharp.torch.engine import PrivacyEngine

    if not callable(model_factory):
        raise TypeError("model_factory must be a callable returning a torch.nn.Module")
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("inputs and targets must be torch tensors")
    if inputs.ndim == 0 or targets.ndim == 0 or inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            "inputs and targets must have the same number of records in dimension 0, got "
            f"shapes {tuple(inputs.shape)} and {tuple(targets.shape)}"
        )
    if inputs.shape[0] < 1:
        raise ValueError("inputs must hold at least one record")
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0.0):
        raise ValueError(f"noise_multiplier must be in [0, inf), got {noise_multiplier!r}")
    clip = require_positive_finite("max_grad_norm", max_grad_norm)
    steps = require_count("steps", steps, minimum=1)
    q = require_probability("sample_rate", sample_rate)
    delta = require_delta(delta)
    m = require_count("canaries", canaries, minimum=2)
    confidence = float(confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    scale = require_positive_finite("canary_scale", canary_scale)
    if scale < 1.0:
        raise ValueError(f"canary_scale must be >= 1 (canary norm >= C), got {canary_scale!r}")
    sizes = list(guess_sizes) if guess_sizes is not None else sorted(
        {max(1, m // 20), max(1, m // 10), max(1, m // 4)})
    for k in sizes:
        require_count("guess_sizes[k]", k, minimum=1)
        if 2 * k > m:
            raise ValueError(f"guess_sizes must be in [1, canaries / 2 = {m // 2}], got {k}")
    if seed is not None:
        require_count("seed", seed)
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        lr = require_positive_finite("optimizer (learning rate)", optimizer)

        def make_optimizer(params: Iterable[Any]) -> Any:
            return torch.optim.SGD(params, lr=lr)
    elif callable(optimizer):
        make_optimizer = optimizer
    else:
        raise TypeError("optimizer must be a learning rate or a factory params -> optimizer")
    if loss_fn is None:
        def loss_fn(output: Any, target: Any) -> Any:
            return torch.nn.functional.cross_entropy(output, target, reduction="none")

    if canary_type not in ("gradient", "input"):
        raise ValueError(f"canary_type must be 'gradient' or 'input', got {canary_type!r}")
    if canary_type == "gradient" and (canary_inputs is not None or canary_targets is not None):
        raise ValueError("canary_inputs / canary_targets are for canary_type='input' only")

    rng = np.random.default_rng(seed)
    membership = rng.random(m) < 0.5
    included = np.flatnonzero(membership)
    if seed is not None:
        torch.manual_seed(seed)
    if canary_type == "input":
        canary_x, canary_y = _input_canaries(inputs, targets, m, canary_inputs, canary_targets,
                                             rng)
    user_model = model_factory()
    if not isinstance(user_model, torch.nn.Module):
        raise TypeError("model_factory() must return a torch.nn.Module")
    misplaced = batch_dimension_leak(user_model, inputs)
    if misplaced is not None:  # training would be clipped per row: refuse, as the clipper does
        raise ValueError(f"the model cannot be audited or trained privately: {misplaced}")
    leak = cross_example_leak(user_model, inputs)
    if canary_type == "input":  # the initial model is independent of the canaries' membership
        initial_losses = _final_losses(user_model, loss_fn, canary_x.to(inputs.dtype),
                                       canary_y.to(targets.dtype))

    n_real, n_canary = inputs.shape[0], included.size
    if canary_type == "gradient":
        model: Any = _canary_model(user_model, m, scale * clip)
        x = torch.cat([inputs, inputs[:1].new_zeros((n_canary, *inputs.shape[1:]))])
        y = torch.cat([targets, targets[:1].repeat(n_canary, *([1] * (targets.ndim - 1)))])
    else:
        model = user_model
        chosen = torch.as_tensor(included, dtype=torch.long)
        x = torch.cat([inputs, canary_x[chosen].to(inputs.dtype)])
        y = torch.cat([targets, canary_y[chosen].to(targets.dtype)])
    ids = torch.cat([torch.full((n_real,), -1, dtype=torch.long),
                     torch.as_tensor(included, dtype=torch.long)])
    loader_seed = None if seed is None else seed + 1
    loader = PoissonDataLoader(torch.utils.data.TensorDataset(x, y, ids), sample_rate=q,
                               steps_per_epoch=steps, seed=loader_seed)
    engine = PrivacyEngine(accountant)
    model, opt, loader = engine.make_private(
        model, make_optimizer(model.parameters()), loader, max_grad_norm=clip,
        noise_multiplier=sigma, delta=delta, seed=None if seed is None else seed + 2,
        # The engine's first-step probe refuses a model that mixes examples; the audit found
        # that already (cross_example_leak) and runs it anyway, to report eps_lower beside it.
        batch_probe=leak is None,
    )
    released: list[np.ndarray] = []
    if canary_type == "gradient":
        weight = model.canary.weight

        def record(_: Any) -> None:
            released.append(
                weight.grad.detach().reshape(-1).to(torch.float64).cpu().numpy().copy())

        opt.add_release_hook(record)
    bar = tqdm(total=steps, desc="audit", unit="step", disable=not progress, leave=False)
    taken = 0
    try:
        for xb, yb, ib in loader:
            opt.zero_grad()
            if len(ib):  # an empty Poisson batch is still a step (pure noise)
                if canary_type == "gradient":
                    out, canary_out = model(xb, ib)
                    real = (ib < 0).to(canary_out.dtype)
                    per = loss_fn(out, yb).reshape(-1)
                    loss = (per * real + canary_out * (1.0 - real)).mean()
                else:
                    loss = loss_fn(model(xb), yb).reshape(-1).mean()
                loss.backward()
            opt.step()
            taken += 1
            bar.update(1)
    finally:
        bar.close()
    if canary_type == "gradient":
        if len(released) != steps:
            raise RuntimeError(f"the run released {len(released)} gradients, expected {steps}")
        g = np.stack(released)  # (T, m)
        scores = {"sum": g.sum(axis=0), "dispersion": ((g - g.mean(axis=0)) ** 2).sum(axis=0)}
    else:
        if taken != steps:
            raise RuntimeError(f"the run took {taken} steps, expected {steps}")
        final_losses = _final_losses(model, loss_fn, canary_x.to(inputs.dtype),
                                     canary_y.to(targets.dtype))
        scores = {"loss_drop": final_losses - initial_losses}
    beta = 1.0 - confidence
    candidates = evaluate_scores(scores, membership, delta=delta, beta=beta,
                                 guess_sizes=sizes, rng=rng)
    best = max(candidates, key=lambda c: c[3])
    report = engine.report(delta)
    upper = float(report.epsilon)
    lower = float(best[3])
    return AuditResult(
        epsilon_lower=lower, epsilon_upper=upper,
        passed=bool(lower <= upper) and leak is None, cross_example=leak,
        confidence=confidence, delta=delta, canaries=m, included=int(n_canary), steps=steps,
        noise_multiplier=sigma, max_grad_norm=clip, sample_rate=q,
        certified=bool(report.certified), best=best, candidates=candidates, scores=scores,
        membership=membership, canary_type=canary_type,
    )


def audit_digits(*, noise_multiplier: float = 2.0, max_grad_norm: float = 1.0, steps: int = 100,
                 sample_rate: float = 0.05, delta: float = 1e-5, canaries: int = 1000,
                 confidence: float = 0.95, lr: float = 0.5, seed: int | None = 0,
                 progress: bool = True, canary_type: str = "gradient") -> AuditResult:
    """:func:`audit` of the built-in model, a 64-32-10 tanh MLP, on scikit-learn's bundled
    digits (1797 images, pixels mapped to x / 16 - 0.25), trained with plain SGD. The defaults
    (sigma 2, q 0.05, 100 steps: eps_upper 1.10 at delta 1e-5 under PLD) are what
    ``dpsharp audit`` runs; ``canary_type="input"`` audits it black-box."""
    import torch
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images / 16.0 - 0.25, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)

    def model() -> Any:
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 10))

    return audit(model, x, y, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
                 steps=steps, sample_rate=sample_rate, delta=delta, optimizer=lr,
                 canaries=canaries, confidence=confidence, seed=seed, progress=progress,
                 canary_type=canary_type)


class _CallableModule(types.ModuleType):
    """``dpsharp.torch.audit`` is both this module and the function :func:`audit`: importing
    the submodule binds the module to the package attribute, so the module calls
    :func:`audit`."""

    def __call__(self, *args: Any, **kwargs: Any) -> AuditResult:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
