"""Private hyperparameter selection: run a user's training over candidate settings, release the
chosen one, and return the event that accounts the *whole* search.

Three analyses, from the oldest to the tightest:

* Gupta, Ligett, McSherry, Roth, Talwar 2010, Theorem 10.2, as restated by Abadi et al. 2016
  (Theorem D.1): :func:`gupta_et_al_epsilon` and its companions.
* The partition-and-exponential-mechanism procedure of Yu et al. 2019 (section IV.C.3):
  :func:`select_partitioned`, built on :func:`exponential_mechanism`.
* Renyi-DP tuning with a random number of repetitions (Papernot and Steinke 2022):
  :func:`select_random_repetitions`, accounted by
  :class:`~dpsharp.tuning_events.TruncatedNegativeBinomialTuning` or
  :class:`~dpsharp.tuning_events.PoissonTuning` in the RDP accountant.

:func:`select` dispatches to the two procedures by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from dpsharp._validation import (
    require_count,
    require_positive_finite,
    require_probability,
    require_real,
)
from dpsharp.events import Event
from dpsharp.tuning_events import (
    DisjointParts,
    PoissonTuning,
    PureDP,
    RandomChoice,
    TruncatedNegativeBinomialTuning,
    poisson_tuning_rdp,
    pure_dp_rdp,
    truncated_negative_binomial_mean,
    truncated_negative_binomial_tuning_rdp,
)

__all__ = [
    "SelectionResult",
    "exponential_mechanism",
    "exponential_mechanism_probabilities",
    "gupta_et_al_accuracy_loss",
    "gupta_et_al_calls",
    "gupta_et_al_epsilon",
    "gupta_et_al_max_candidates",
    "partition",
    "poisson_tuning_rdp",
    "pure_dp_rdp",
    "sample_truncated_negative_binomial",
    "select",
    "select_partitioned",
    "select_random_repetitions",
    "truncated_negative_binomial_mean",
    "truncated_negative_binomial_tuning_rdp",
]

Candidate = TypeVar("Candidate")


# ------------------------------------------------------------- Gupta et al. 2010 (Abadi et al. 2016, D.1)
def gupta_et_al_epsilon(epsilon: float, epsilon_prime: float, *, disjoint_validation: bool = False) -> float:
    """Privacy of the search mechanism M' of Gupta, Ligett, McSherry, Roth, Talwar 2010,
    Theorem 10.2, as restated in Abadi et al. 2016, Theorem D.1:

        Let M be an epsilon-differentially private mechanism such that for a query function q
        with sensitivity 1, and a parameter Q, it holds that Pr_{r ~ M(d)}[q(d, r) >= Q] >= p
        for some p in (0, 1). Then for any delta > 0 and any epsilon' in (0, 1/2), there is a
        mechanism M' which satisfies the following properties:
        * Pr_{r ~ M'(d)}[q(d, r) >= Q - (4/epsilon') log(1/(epsilon' delta p))] >= 1 - delta.
        * M' makes (1/(epsilon' delta p))^2 log(1/(epsilon' delta p)) calls to M.
        * M' is (epsilon + 8 epsilon')-differentially private.

    Returns epsilon + 8 epsilon'. With ``disjoint_validation=True`` returns
    max(epsilon, 8 epsilon'): 002 remarks that "the proof of Theorem D.1 actually implies a
    stronger max(epsilon, 8 epsilon')-differential privacy for the setting of interest", where
    M trains on the training set and q scores on a disjoint validation set. For K settings
    tried by a uniformly random choice, p = 1/K (Abadi et al. 2016).

    The restated theorem asks for epsilon' in the open interval (0, 1/2), but 002's own worked
    example uses epsilon' = 1/2; every function here accepts (0, 1/2] so that the example can
    be reproduced (the closed endpoint is the paper's usage, not a proven extension).
    """
    epsilon = require_positive_finite("epsilon", epsilon)
    epsilon_prime = _require_epsilon_prime(epsilon_prime)
    return max(epsilon, 8.0 * epsilon_prime) if disjoint_validation else epsilon + 8.0 * epsilon_prime


def _require_epsilon_prime(value: float) -> float:
    result = require_real("epsilon_prime", value)
    if not 0.0 < result <= 0.5:
        raise ValueError(f"epsilon_prime must be in (0, 0.5] (Theorem D.1), got {result!r}")
    return result


def _gupta_log_term(epsilon_prime: float, delta: float, p: float) -> float:
    epsilon_prime = _require_epsilon_prime(epsilon_prime)
    delta = require_probability("delta", delta)
    p = require_probability("p", p)
    if p >= 1.0 or delta >= 1.0:
        raise ValueError("p and delta must be in (0, 1) (Theorem D.1)")
    return -math.log(epsilon_prime) - math.log(delta) - math.log(p)  # log(1/(eps' delta p))


def gupta_et_al_accuracy_loss(epsilon_prime: float, delta: float, p: float) -> float:
    """(4/epsilon') log(1/(epsilon' delta p)): with probability >= 1 - delta, M' scores at least
    Q minus this (Theorem D.1 of Abadi et al. 2016, first bullet)."""
    return 4.0 / epsilon_prime * _gupta_log_term(epsilon_prime, delta, p)


def gupta_et_al_calls(epsilon_prime: float, delta: float, p: float) -> float:
    """(1/(epsilon' delta p))^2 log(1/(epsilon' delta p)): the calls M' makes to M (Theorem
    D.1 of Abadi et al. 2016, second bullet)."""
    log_term = _gupta_log_term(epsilon_prime, delta, p)
    return math.exp(2.0 * log_term) * log_term


def gupta_et_al_max_candidates(epsilon_prime: float, delta: float, accuracy_loss: float) -> int:
    """The largest K such that p = 1/K keeps the accuracy loss of Theorem D.1 at most
    ``accuracy_loss`` (in units of the sensitivity-1 query, e.g. validation examples):
    the largest integer K with (4/epsilon') log(K/(epsilon' delta)) <= accuracy_loss.

    002's worked example: epsilon' = 0.5, delta = 0.05, loss 100 of 10,000 validation examples
    (1%): K = floor(0.025 e^12.5) = 6706 ("one can try 6,700 different parameter settings at
    privacy cost epsilon = 4 for the validation set").
    """
    epsilon_prime = _require_epsilon_prime(epsilon_prime)
    delta = require_probability("delta", delta)
    accuracy_loss = require_positive_finite("accuracy_loss", accuracy_loss)
    # loss(K) = (4/eps') (log K - log eps' - log delta) <= L  <=>  log K <= L eps'/4 + log(eps' delta)
    log_k = accuracy_loss * epsilon_prime / 4.0 + math.log(epsilon_prime) + math.log(delta)
    if log_k < 0.0:
        raise ValueError(f"accuracy_loss={accuracy_loss!r} is too small for even one candidate")
    if log_k > 700.0:
        raise ValueError(f"accuracy_loss={accuracy_loss!r} allows more than 1e304 candidates")
    k = math.floor(math.exp(log_k))
    while k > 1 and gupta_et_al_accuracy_loss(epsilon_prime, delta, 1.0 / k) > accuracy_loss:
        k -= 1  # guard the floor against rounding at the boundary
    return int(k)


# ------------------------------------------------------------------------ exponential mechanism
def exponential_mechanism_probabilities(scores: Sequence[float], epsilon: float, sensitivity: float = 1.0) -> np.ndarray:
    """P[i] = exp(epsilon s_i / (2 Delta)) / sum_j exp(epsilon s_j / (2 Delta)), computed in log
    space (McSherry and Talwar 2007). Higher scores are preferred; pass minus the error count
    to select by fewest errors, as 004 does with exp(-epsilon z_i / 2)."""
    values = np.asarray(scores, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError("scores must be a non-empty 1-d sequence")
    if not np.all(np.isfinite(values)):
        raise ValueError("scores must be finite (found NaN or inf)")
    epsilon = require_positive_finite("epsilon", epsilon)
    sensitivity = require_positive_finite("sensitivity", sensitivity)
    logits = epsilon * values / (2.0 * sensitivity)
    logits -= logits.max()
    weights = np.exp(logits)
    return weights / weights.sum()


def exponential_mechanism(
    scores: Sequence[float], epsilon: float, sensitivity: float, rng: np.random.Generator
) -> int:
    """The index chosen by the exponential mechanism: epsilon-DP when every score changes by at
    most ``sensitivity`` between neighbouring datasets; hence epsilon^2/2-zCDP (Yu et al. 2019, citing
    Bun and Steinke 2016). Its event is ``PureDP(epsilon)``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator")
    probabilities = exponential_mechanism_probabilities(scores, epsilon, sensitivity)
    return int(rng.choice(probabilities.size, p=probabilities))


# ------------------------------------------------------------------------------ procedures
@dataclass(frozen=True)
class SelectionResult(Generic[Candidate]):
    """The outcome of a private search: the chosen ``candidate`` (its ``index`` in the list),
    whatever ``train_fn`` returned for it (``model``), the ``event`` that accounts the whole
    search (compose it into an accountant), and ``runs``, the number of training runs made.

    ``event`` covers what the search releases: the index, candidate and model. Under
    :func:`select_random_repetitions` the number of runs K is part of the mechanism's secret
    randomness (Papernot and Steinke 2022 analyse the best run with K hidden): ``runs`` is
    there for the caller's own bookkeeping, and publishing it, or anything that reveals K
    (a log of every run, the search's duration), is not covered by ``event``. (With K
    published, a geometric search over 0.5-DP randomized response is 7.9-DP, not 1.5-DP.)
    ``runs`` is left out of the result's repr, so printing or logging the result does not
    reveal it."""

    index: int
    candidate: Candidate
    model: Any
    event: Event
    runs: int = field(repr=False)


def partition(num_records: int, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Assign every record independently to one of ``parts`` parts, uniformly at random; the
    index arrays of the parts. Each record's part depends on nothing else, so adding or
    removing a record changes exactly one part (what parallel composition needs; cutting a
    shuffled list into equal slices would move other records too). Sizes are equal in
    expectation (004 asks for "k+1 equal portions")."""
    num_records = require_count("num_records", num_records, minimum=1)
    parts = require_count("parts", parts, minimum=1)
    assignment = rng.integers(0, parts, size=num_records)
    return [np.flatnonzero(assignment == part) for part in range(parts)]


def select_partitioned(
    train_fn: Callable[[Candidate, np.ndarray], Any],
    candidates: Sequence[Candidate],
    *,
    candidate_event: Callable[[Candidate], Event],
    num_records: int,
    score_fn: Callable[[Any, np.ndarray], float],
    epsilon: float,
    sensitivity: float = 1.0,
    rng: np.random.Generator,
) -> SelectionResult[Candidate]:
    """Yu et al. 2019, after Gupta et al. 2010: partition the records into K + 1 parts
    (:func:`partition`), train candidate i on part i with ``train_fn(candidate, indices) ->
    model`` (whose privacy cost on its part is ``candidate_event(candidate)``), score every
    model on the held-out part K+1 with ``score_fn(model, holdout_indices)`` (higher is better;
    it must change by at most ``sensitivity`` when one held-out record is added or removed,
    e.g. the number of correct predictions, sensitivity 1; 004 uses minus the number of errors),
    and choose with :func:`exponential_mechanism`.

    Event: ``DisjointParts((event_1, ..., event_K, PureDP(epsilon)))``. A record lies in one
    part only: in training part i it affects model i (and the choice only through model i,
    post-processing); in the held-out part it affects the scores (epsilon-DP). So the search
    costs the maximum over the parts (Yu et al. 2019, Theorem 2), e.g. max(max_i rho_i, epsilon^2/2) in zCDP.
    """
    candidates = _require_candidates(candidates)
    num_records = require_count("num_records", num_records, minimum=len(candidates) + 1)
    epsilon = require_positive_finite("epsilon", epsilon)
    events = [_require_event_result(candidate_event(candidate)) for candidate in candidates]
    parts = partition(num_records, len(candidates) + 1, rng)
    models = [train_fn(candidate, indices) for candidate, indices in zip(candidates, parts[:-1])]
    scores = [require_real("score", score_fn(model, parts[-1])) for model in models]
    index = exponential_mechanism(scores, epsilon, sensitivity, rng)
    return SelectionResult(
        index=index,
        candidate=candidates[index],
        model=models[index],
        event=DisjointParts((*events, PureDP(epsilon))),
        runs=len(candidates),
    )


def _require_event_result(event: object) -> Event:
    if not isinstance(event, Event):
        raise TypeError(f"candidate_event must return a dpsharp event, got {event!r}")
    return event


def sample_truncated_negative_binomial(eta: float, gamma: float, rng: np.random.Generator) -> int:
    """One draw of K ~ D_{eta, gamma} on {1, 2, ...} (Papernot and Steinke 2022): for eta > 0 a
    negative binomial NB(eta, gamma) conditioned on K >= 1 (by rejection); for eta = 0 the
    logarithmic distribution; for eta in (-1, 0) by inversion of the PMF
    P[K = k] = (1 - gamma)^k / (gamma^(-eta) - 1) prod_{l<k} (l + eta)/(l + 1)."""
    truncated_negative_binomial_mean(eta, gamma)  # validates
    if eta > 0.0:
        while True:
            k = int(rng.negative_binomial(eta, gamma))
            if k >= 1:
                return k
    if eta == 0.0:
        return int(rng.logseries(1.0 - gamma))
    uniform = rng.random()
    # eta in (-1, 0): gamma^(-eta) - 1 < 0 and (0 + eta) < 0, so P[K = 1] > 0.
    term = (1.0 - gamma) * eta / math.expm1(-eta * math.log(gamma))
    k, cumulative = 1, term
    while cumulative < uniform:
        term *= (1.0 - gamma) * (k + eta) / (k + 1)
        k += 1
        cumulative += term
        if term == 0.0:  # numerically exhausted tail
            break
    return k


def select_random_repetitions(
    train_fn: Callable[[Candidate], tuple[Any, float]],
    candidates: Sequence[Candidate],
    *,
    candidate_event: Callable[[Candidate], Event],
    rng: np.random.Generator,
    distribution: str = "truncated_negative_binomial",
    eta: float = 1.0,
    gamma: float | None = None,
    mean: float | None = None,
) -> SelectionResult[Candidate]:
    """Papernot and Steinke 2022: draw K, then K times pick a candidate uniformly at random and
    run ``train_fn(candidate) -> (model, score)``; release the best run (highest score; ties go
    to the earliest run).

    ``candidate_event(candidate)`` is the privacy cost of one run with that candidate, and must
    cover everything the run does with private data -- training *and* scoring (use a private
    score, or score on public data). The base mechanism "pick uniformly, train, score" is
    accounted as ``RandomChoice`` over the candidates' distinct events (the single event when
    they all cost the same). The search is ``TruncatedNegativeBinomialTuning(base, eta, gamma)``
    (``distribution="truncated_negative_binomial"``, K >= 1; eta = 1 geometric, eta = 0
    logarithmic; give ``gamma``) or ``PoissonTuning(base, mean)`` (``distribution="poisson"``;
    give ``mean`` = E[K]; K = 0 is possible, and then ``index`` is -1 and ``candidate`` and
    ``model`` are None). Account it with the RDP accountant.
    """
    candidates = _require_candidates(candidates)
    events = list(dict.fromkeys(_require_event_result(candidate_event(c)) for c in candidates))
    base: Event = events[0] if len(events) == 1 else RandomChoice(tuple(events))
    if distribution == "truncated_negative_binomial":
        if gamma is None:
            raise ValueError("gamma must be given for distribution='truncated_negative_binomial'")
        event: Event = TruncatedNegativeBinomialTuning(base, eta, gamma)
        runs = sample_truncated_negative_binomial(eta, gamma, rng)
    elif distribution == "poisson":
        if mean is None:
            raise ValueError("mean must be given for distribution='poisson'")
        event = PoissonTuning(base, mean)
        runs = int(rng.poisson(mean))
    else:
        raise ValueError(
            f"distribution must be 'truncated_negative_binomial' or 'poisson', got {distribution!r}"
        )
    best: tuple[float, int, Any] | None = None
    for _ in range(runs):
        index = int(rng.integers(len(candidates)))
        model, score = train_fn(candidates[index])
        score = require_real("score", score)
        if best is None or score > best[0]:
            best = (score, index, model)
    if best is None:
        return SelectionResult(index=-1, candidate=None, model=None, event=event, runs=0)  # type: ignore[arg-type]
    return SelectionResult(index=best[1], candidate=candidates[best[1]], model=best[2], event=event, runs=runs)


def select(
    train_fn: Callable[..., Any],
    candidates: Sequence[Candidate],
    *,
    method: str = "random_repetitions",
    **options: Any,
) -> SelectionResult[Candidate]:
    """Run a private search: ``method="random_repetitions"`` calls
    :func:`select_random_repetitions`, ``method="partitioned"`` :func:`select_partitioned`;
    ``options`` are passed on."""
    if method == "random_repetitions":
        return select_random_repetitions(train_fn, candidates, **options)
    if method == "partitioned":
        return select_partitioned(train_fn, candidates, **options)
    raise ValueError(f"method must be 'random_repetitions' or 'partitioned', got {method!r}")


def _require_candidates(candidates: Sequence[Any]) -> list[Any]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise TypeError("candidates must be a sequence")
    result = list(candidates)
    if not result:
        raise ValueError("candidates must hold at least one setting")
    return result
