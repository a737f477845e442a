"""Noise schedules (dpsharp.torch.schedules): formulas, Table II of Yu et al. 2019, the
validation rule (eqs. 8-10), ADP-SGD (Wu et al.), calibration, bad input.

Provenance of known values: Table II of Yu, Liu, Pu, Gursoy, Truex 2019, "Differentially
Private Model Publishing for Deep Learning". Independent references: closed forms stated beside each test.
"""

from __future__ import annotations

import math
import subprocess
import sys

import dpsharp
import dpsharp.accountants.zcdp
import numpy as np
import pytest
from dpsharp.events import Composed, Gaussian, PoissonSampled, Repeated, Shuffled, flatten
from dpsharp.torch.schedules import (
    ADP,
    Constant,
    Exponential,
    Polynomial,
    StepDecay,
    TimeBased,
    ValidationBased,
    adagrad_norm_proxy,
    calibrate_schedule,
    count_within_budget,
    schedule_events,
)
from hypothesis import given, settings
from hypothesis import strategies as st

RESHUFFLE = {"accountant": "zcdp", "accountant_options": {"batching": "reshuffle"}}
MNIST_SPLIT = {"batch_size": 600, "dataset_size": 55000}  # Yu et al.: 55,000 training, batch 600


def _pld_available() -> bool:
    try:
        import dpsharp.accountants.pld
    except ModuleNotFoundError:
        return False
    return "pld" in dpsharp.available()


needs_pld = pytest.mark.skipif(not _pld_available(), reason="the tight 'pld' accountant is not built")


# ------------------------------------------------------------------------------- formulas


def test_decay_formulas_match_their_closed_forms() -> None:
    t = np.arange(0, 150)
    np.testing.assert_allclose(TimeBased(10, 0.05).sequence(150), 10 / (1 + 0.05 * t), rtol=1e-15)
    np.testing.assert_allclose(Exponential(10, 0.01).sequence(150), 10 * np.exp(-0.01 * t), rtol=1e-15)
    np.testing.assert_allclose(
        StepDecay(10, 0.6, 10).sequence(150), 10 * 0.6 ** np.floor(t / 10), rtol=1e-15
    )
    poly = np.where(t < 100, 8 * np.clip(1 - t / 100, 0, None) ** 3 + 2, 2.0)
    np.testing.assert_allclose(Polynomial(10, 3, 2, 100).sequence(150), poly, rtol=1e-15)
    assert Polynomial(10, 3, 2, 100)(100) == 2.0 and Polynomial(10, 3, 2, 100)(10**6) == 2.0
    assert Constant(8).sequence(5).tolist() == [8.0] * 5
    assert StepDecay(10, 0.6, 10)(9) == 10.0 and StepDecay(10, 0.6, 10)(10) == 6.0


def test_unit_is_declared() -> None:
    assert TimeBased(10, 0.05).unit == "epoch"
    assert TimeBased(10, 0.05, unit="step").unit == "step"
    assert ADP([0.1, 0.05], scale=1.0).unit == "step"


def test_import_does_not_import_torch() -> None:
    code = "import dpsharp.torch.schedules, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------- Table II


TABLE_II = [
    (Constant(8), 100),
    (TimeBased(10, 0.05), 38),
    (StepDecay(10, 0.6, 10), 31),
    (Exponential(10, 0.01), 71),
    (Polynomial(10, 3, 2, 100), 44),
]


@pytest.mark.parametrize(("schedule", "epochs"), TABLE_II, ids=lambda x: repr(x))
def test_table_ii_epochs_through_the_zcdp_accountant(schedule, epochs) -> None:
    """Table II (Yu et al. 2019): rho_total = 0.78125, reshuffling, stop before the
    epoch whose cost would exceed the budget."""
    count, acc = count_within_budget(schedule, rho=0.78125, **RESHUFFLE, **MNIST_SPLIT)
    assert count == epochs
    # Independent closed form: each reshuffled epoch costs 1 / (2 sigma_t^2) (Theorem 2).
    costs = [1 / (2 * schedule(t) ** 2) for t in range(epochs + 1)]
    assert acc.rho == pytest.approx(math.fsum(costs[:epochs]), rel=1e-13)
    assert acc.rho <= 0.78125 < math.fsum(costs)
    assert sum(count for _, count in acc.composed) == epochs
    assert all(isinstance(leaf, Shuffled) for leaf, _ in acc.composed)


def test_table_ii_uniform_budget_is_spent_exactly() -> None:
    _, acc = count_within_budget(Constant(8), rho=0.78125, **RESHUFFLE, **MNIST_SPLIT)
    assert acc.rho == 0.78125  # 100 / (2 * 64), exact in binary


# ------------------------------------------------------------------------------- events


def test_schedule_events_one_leaf_per_step_or_epoch() -> None:
    sched = StepDecay(4.0, 0.5, 3, unit="step")
    events = schedule_events(sched, 7, sampling_probability=0.01)
    leaves = dict(flatten(events))
    assert leaves == {
        PoissonSampled(Gaussian(4.0), 0.01): 3,
        PoissonSampled(Gaussian(2.0), 0.01): 3,
        PoissonSampled(Gaussian(1.0), 0.01): 1,
    }
    epochs = schedule_events(TimeBased(10, 0.05), 3, sampling_probability=0.01, steps_per_epoch=5)
    assert sum(c for _, c in flatten(epochs)) == 15
    shuffled = schedule_events(Constant(8), 4, batch_size=10, dataset_size=100)
    assert flatten(shuffled) == [(Shuffled(Gaussian(8.0), 10, 100), 4)]
    assert shuffled == Repeated(Shuffled(Gaussian(8.0), 10, 100), 4)
    assert isinstance(events, Composed) and len(events.events) == 3


def test_heterogeneous_steps_compose_exactly_in_zcdp() -> None:
    sigmas = np.linspace(1.0, 5.0, 200)
    # sigma_t = scale sqrt(eta_0 / eta_t) with eta_t = 1 / sigmas_t^2 and scale = sigmas_0 = 1.
    acc = dpsharp.accountant("zcdp", neighbouring="zero_out")  # reshuffled epochs
    events = schedule_events(
        ADP((1 / sigmas**2).tolist(), scale=1.0, unit="epoch"), 200, batch_size=1, dataset_size=10
    )
    acc.compose(events)
    assert acc.rho == pytest.approx(math.fsum(1 / (2 * sigmas**2)), rel=1e-13)


# ------------------------------------------------------------------------------- validation


def test_validation_rule_changes_sigma_exactly_when_eqs_8_to_10_say() -> None:
    """m = 2, period = 3, threshold 0.01, k = 0.5. Checks at e = 3, 6, 9, 12:
    e=3:  S_bar = (0.60+0.70)/2 = 0.65,   0.65 - 0     > 0.01 -> keep 4
    e=6:  S_bar = (0.655+0.66)/2 = 0.6575, 0.0075      <= 0.01 -> 2
    e=9:  S_bar = (0.90+0.95)/2 = 0.925,  0.2675       > 0.01 -> keep 2
    e=12: S_bar = (0.93+0.935)/2 = 0.9325, 0.0075      <= 0.01 -> 1
    The dips at e=4 and e=10 between checks change nothing."""
    accuracies = [0.50, 0.60, 0.70, 0.30, 0.655, 0.66, 0.80, 0.90, 0.95, 0.10, 0.93, 0.935]
    expected = [4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 1]
    sched = ValidationBased(4.0, 0.5, m=2, threshold=0.01, period=3, validation_set="public")
    got = [sched.observe(a) for a in accuracies]
    assert got == expected
    assert sched(0) == 1.0 and sched.sigma == 1.0
    assert sched.history[5] == (6, 2.0)


def test_validation_moving_average_uses_m_values() -> None:
    # m = period = 1 is the unaveraged rule of eqs. (8)-(9): compare S_e with S_{e-1}.
    sched = ValidationBased(1.0, 0.7, m=1, threshold=0.0, period=1, validation_set="public")
    got = [sched.observe(a) for a in [0.5, 0.6, 0.6, 0.55, 0.9]]
    assert got == pytest.approx([1.0, 1.0, 0.7, 0.49, 0.49])


def test_validation_state_round_trip() -> None:
    a = ValidationBased(4.0, 0.5, m=2, threshold=0.01, period=2, validation_set="public")
    for acc in [0.1, 0.2, 0.2, 0.2]:
        a.observe(acc)
    b = ValidationBased(4.0, 0.5, m=2, threshold=0.01, period=2, validation_set="public")
    b.load_state_dict(a.state_dict())
    assert [a.observe(0.2), a.observe(0.2)] == [b.observe(0.2), b.observe(0.2)]


@pytest.mark.parametrize("validation_set", ["private", "train", None, True])
def test_private_validation_set_is_refused(validation_set) -> None:
    with pytest.raises(ValueError, match="validation_set"):
        ValidationBased(4.0, 0.5, m=2, threshold=0.01, period=3, validation_set=validation_set)


# ------------------------------------------------------------------------------- ADP


def test_adp_constant_learning_rate_gives_constant_noise() -> None:
    sched = ADP([0.05] * 100, scale=1.7)
    assert sched.sequence().tolist() == [1.7] * 100


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=50), st.floats(0.1, 20.0))
def test_adp_sigma_times_sqrt_lr_is_constant(rates, scale) -> None:
    sigmas = ADP(rates, scale=scale).sequence()
    product = sigmas * np.sqrt(rates)
    np.testing.assert_allclose(product, scale * math.sqrt(rates[0]), rtol=1e-12)


def test_adagrad_norm_proxy_closed_form() -> None:
    rates = adagrad_norm_proxy(0.5, steps=4, b0=2.0, gradient_bound=1.0)
    np.testing.assert_allclose(rates, 0.5 / np.sqrt([5.0, 6.0, 7.0, 8.0]), rtol=1e-15)
    sigmas = ADP(rates, scale=1.0).sequence()
    np.testing.assert_allclose(sigmas, (np.array([5.0, 6.0, 7.0, 8.0]) / 5.0) ** 0.25, rtol=1e-14)


@pytest.mark.torch
def test_learning_rates_from_a_torch_scheduler() -> None:
    torch = pytest.importorskip("torch")
    from dpsharp.torch.schedules import learning_rates_from_scheduler

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    rates = learning_rates_from_scheduler(sched, 8)
    np.testing.assert_allclose(rates, 0.1 * 0.5 ** (np.arange(8) // 3), rtol=1e-15)
    assert opt.param_groups[0]["lr"] == 0.1 and sched.last_epoch == 0  # original untouched
    poly = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=10, power=2.0)
    rates = learning_rates_from_scheduler(poly, 10)
    np.testing.assert_allclose(rates, 0.1 * (1 - np.arange(10) / 10) ** 2, rtol=1e-12)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(ValueError, match="scheduler"):
        learning_rates_from_scheduler(plateau, 5)


def _poly_rates(steps: int, eta0: float = 0.5, power: float = 0.5, every: int = 1) -> list[float]:
    # 001 section 5.1: eta_t = eta / (t + 1)^power (polynomially decaying step size), here
    # updated every ``every`` steps (per epoch) to keep the number of distinct sigmas small.
    return [eta0 / (t // every + 1) ** power for t in range(steps)]


@needs_pld
def test_adp_calibrated_meets_the_constant_runs_epsilon() -> None:
    rates = _poly_rates(400, every=25)
    q, sigma, delta = 0.02, 1.0, 1e-5
    result = ADP.calibrated(rates, sampling_probability=q, noise_multiplier=sigma, delta=delta)
    baseline = dpsharp.accountant("pld").compose(PoissonSampled(Gaussian(sigma), q), 400).epsilon(delta)
    assert result.target == pytest.approx(baseline, rel=1e-12)
    assert result.achieved <= result.target
    assert result.target - result.achieved <= result.rtol * result.target
    # The certified epsilon of the calibrated run, recomputed independently of calibrate().
    acc = dpsharp.accountant("pld")
    for s in result.schedule.sequence():
        acc.compose(PoissonSampled(Gaussian(float(s)), q))
    assert acc.epsilon(delta) == pytest.approx(result.target, rel=result.rtol)
    assert acc.epsilon(delta) <= result.target * (1 + 1e-9)


@pytest.mark.slow
@needs_pld
def test_adp_full_batch_matches_gaussian_closed_form() -> None:
    """q = 1: the run is the Gaussian mechanism with mu^2 = sum 1/sigma_t^2 (Dong, Roth, Su), so
    equal epsilon means sum 1/sigma_t^2 = T / sigma^2, i.e.
    scale^2 = sigma^2 * (1/T) sum eta_0 / eta_t... inverted: sum (eta_t/eta_0) / scale^2 = T/sigma^2."""
    rates = np.array(_poly_rates(50))
    sigma = 4.0
    result = ADP.calibrated(rates, sampling_probability=1.0, noise_multiplier=sigma, delta=1e-5)
    exact_scale = sigma * math.sqrt(math.fsum(rates / rates[0]) / rates.size)
    assert result.parameter == pytest.approx(exact_scale, rel=2e-3)
    assert result.parameter >= exact_scale * (1 - 1e-6)  # conservative side


# ------------------------------------------------------------------------------- calibration


def test_calibrate_time_decay_to_rho_matches_closed_form() -> None:
    """Reshuffling: rho = sum_t (1 + k t)^2 / (2 sigma_0^2), so sigma_0 = sqrt(sum / (2 rho))."""
    epochs, k, rho = 38, 0.05, 0.78125
    result = calibrate_schedule(
        lambda s0: TimeBased(s0, k), length=epochs, rho=rho, **RESHUFFLE, **MNIST_SPLIT
    )
    exact = math.sqrt(math.fsum((1 + k * t) ** 2 for t in range(epochs)) / (2 * rho))
    assert result.achieved <= rho
    assert rho - result.achieved <= result.rtol * rho
    assert result.parameter == pytest.approx(exact, rel=1e-3)
    assert result.parameter >= exact * (1 - 1e-12)


def test_calibrate_refuses_impossible_targets() -> None:
    with pytest.raises(ValueError, match="bracket"):
        calibrate_schedule(
            lambda s0: Constant(s0), length=10**4, rho=1e-9, bracket=(0.1, 10.0), **RESHUFFLE, **MNIST_SPLIT
        )


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: Constant(0.0), "sigma"),
        (lambda: Constant(float("nan")), "sigma"),
        (lambda: TimeBased(-1.0, 0.1), "sigma_0"),
        (lambda: TimeBased(10.0, 0.0), "k"),
        (lambda: Exponential(10.0, float("inf")), "k"),
        (lambda: StepDecay(10.0, 1.0, 10), "k"),
        (lambda: StepDecay(10.0, 0.5, 0), "period"),
        (lambda: Polynomial(10.0, 3.0, 12.0, 100), "sigma_end"),
        (lambda: Polynomial(10.0, 0.0, 2.0, 100), "k"),
        (lambda: Polynomial(10.0, 3.0, 2.0, -5), "period"),
        (lambda: ValidationBased(4, 0.5, m=5, threshold=0.01, period=3, validation_set="public"), "period"),
        (lambda: ValidationBased(4, 1.5, m=1, threshold=0.01, period=3, validation_set="public"), "k"),
        (lambda: ValidationBased(4, 0.5, m=0, threshold=0.01, period=3, validation_set="public"), "m"),
        (lambda: ValidationBased(4, 0.5, m=1, threshold=float("nan"), period=3, validation_set="public"), "threshold"),
        (lambda: ADP([0.1, 0.0], scale=1.0), r"learning_rates\[1\]"),
        (lambda: ADP([], scale=1.0), "learning_rates"),
        (lambda: ADP([0.1], scale=-1.0), "scale"),
        (lambda: TimeBased(10.0, 0.1, unit="batch"), "unit"),
        (lambda: Constant(2.0)(-1), "t"),
        (lambda: ADP([0.1, 0.2], scale=1.0)(2), "t"),
        (lambda: adagrad_norm_proxy(0.1, steps=0, b0=1.0, gradient_bound=1.0), "steps"),
        (lambda: schedule_events(Constant(2.0, unit="step"), 3, batch_size=1, dataset_size=5), "unit"),
        (lambda: schedule_events(Constant(2.0), 3), "sampling_probability"),
        (lambda: schedule_events(Constant(2.0), 3, sampling_probability=1.5, steps_per_epoch=1), "sampling_probability"),
        (lambda: count_within_budget(Constant(2.0), rho=-1.0, **RESHUFFLE, **MNIST_SPLIT), "rho"),
        (lambda: count_within_budget(Constant(2.0), epsilon=1.0, delta=1.0, **MNIST_SPLIT), "delta"),
        (lambda: calibrate_schedule(Constant, length=5, rho=1.0, rtol=2.0, **RESHUFFLE, **MNIST_SPLIT), "rtol"),
    ],
)
def test_bad_input_names_the_argument(factory, name) -> None:
    with pytest.raises(ValueError, match=name):
        factory()


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="t"):
        Constant(2.0)(1.5)
    with pytest.raises(TypeError, match="period"):
        StepDecay(10.0, 0.5, 2.5)


def test_an_adaptive_schedule_has_no_events_in_advance() -> None:
    """ValidationBased picks its sigmas from the run's outputs: schedule_events (and so
    calibrate_schedule) once accounted it as sigma_0 at every index, while the run, after four
    validation plateaus, used sigma_0 / 8; both now refuse it, as count_within_budget did."""
    adaptive = ValidationBased(1.0, 0.5, m=1, threshold=0.01, period=1, validation_set="public")
    with pytest.raises(ValueError, match="adaptive"):
        schedule_events(adaptive, 5, sampling_probability=0.01, steps_per_epoch=10)
    with pytest.raises(ValueError, match="adaptive"):
        calibrate_schedule(
            lambda p: ValidationBased(p, 0.5, m=1, threshold=0.01, period=1, validation_set="public"),
            length=5, epsilon=2.0, delta=1e-5, accountant="rdp", sampling_probability=0.01,
            steps_per_epoch=10)
    with pytest.raises(ValueError, match="adaptive"):
        count_within_budget(adaptive, epsilon=2.0, delta=1e-5, accountant="rdp",
                            sampling_probability=0.01, steps_per_epoch=10)


def test_steps_per_epoch_with_one_sigma_per_step_is_refused() -> None:
    """A list of sigmas is one sigma per step: steps_per_epoch beside it was ignored, so five
    per-epoch sigmas of 100 steps each were accounted as 5 releases (epsilon 0.15 instead of
    0.77 for the 500 releases)."""
    sigmas = [4.0, 3.5, 3.0, 2.5, 2.0]
    with pytest.raises(ValueError, match="steps_per_epoch is for an epoch schedule"):
        schedule_events(sigmas, 5, sampling_probability=0.01, steps_per_epoch=100)
    with pytest.raises(ValueError, match="steps_per_epoch is for an epoch schedule"):
        schedule_events(Constant(2.0, unit="step"), 5, sampling_probability=0.01,
                        steps_per_epoch=100)
    # one sigma per step, spelled out, is accounted as 500 releases
    per_step = schedule_events(np.repeat(sigmas, 100), 500, sampling_probability=0.01)
    assert sum(count for _, count in flatten(per_step)) == 500
