"""Automatic clipping (Bu, Wang, Zha, Karypis 2023) and adaptive quantile clipping (Andrew,
Thakkar, McMahan, Ramaswamy 2021) against float64 references.

References: per-example gradients by batch-size-1 autograd on an unpatched copy of the model
(float64); the clip factors written out from the papers' formulas here; the privacy of
adaptive clipping from dp-accounting's RDP accountant composing the gradient and count
releases of each step as they happen (one Poisson sample, two Gaussian releases).
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

import dpsharp  # noqa: E402
from dpsharp.events import Gaussian, PoissonSampled  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    DPOptimizer,
    NoiseGenerator,
    NoisySGD,
    PerSampleClipper,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
)
from dpsharp.torch.clipping import (  # noqa: E402
    AdaptiveQuantileClipping,
    AutomaticClipping,
    gradient_noise_multiplier,
)

pytestmark = pytest.mark.torch


def per_example(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    ref = copy.deepcopy(model)
    params = [p for p in ref.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        ref.zero_grad(set_to_none=True)
        F.mse_loss(ref(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append([p.grad.clone() for p in params])
    return [torch.stack([r[k] for r in rows]) for k in range(len(params))]


def flat_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    return sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in grads).sqrt()


def weighted(grads: list[torch.Tensor], factors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [(f.reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0) for g, f in zip(grads, factors)]


def clipped_sums(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rule,
                 bound) -> list[torch.Tensor]:
    clipper = PerSampleClipper(model, max_grad_norm=bound, clipping=rule.structure, rule=rule)
    F.mse_loss(model(x), y).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    sums = [p.grad.clone() for p in clipper.parameters]
    clipper.remove()
    model.zero_grad(set_to_none=True)
    return sums


class Sequence(nn.Module):
    """A linear layer on sequences (ghost-norm path) and one on the pooled features."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.inner = nn.Linear(d, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.inner(x)).sum(dim=1))


# ---------------------------------------------------------------- automatic clipping
@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 6), seq=st.integers(1, 5), d=st.integers(1, 4),
       bound=st.sampled_from([0.01, 0.7, 50.0]), gamma=st.sampled_from([0.0, 0.01, 1.0]),
       seed=st.integers(0, 2**16))
def test_automatic_clipping_sum_matches_float64_reference(batch, seq, d, bound, gamma, seed):
    torch.manual_seed(seed)
    model = Sequence(d)
    x = torch.randn(batch, seq, d, dtype=torch.float64)
    y = torch.randn(batch, 2, dtype=torch.float64)
    grads = per_example(model, x, y)
    norms = flat_norms(grads)
    factors = bound / (norms + gamma)  # Bu et al. 2023: C / (||g_i|| + gamma)
    expected = weighted(grads, [factors] * len(grads))
    got = clipped_sums(model, x, y, AutomaticClipping(gamma), bound)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_automatic_clipping_each_example_has_norm_below_c() -> None:
    """Each example alone (its released clipped sum is its clipped gradient): norm
    C ||g|| / (||g|| + gamma) < C, also for gradients scaled up to 1e8."""
    torch.manual_seed(1)
    model = Sequence(3)
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    y = torch.randn(4, 2, dtype=torch.float64)
    bound, gamma = 0.5, 0.01
    norms = flat_norms(per_example(model, x, y))
    for scale in (1.0, 1e4, 1e8):
        for i in range(4):
            rule = AutomaticClipping(gamma)
            clipper = PerSampleClipper(model, max_grad_norm=bound, rule=rule)
            (scale * F.mse_loss(model(x[i:i + 1]), y[i:i + 1])).backward()
            clipper.release(noise_multiplier=0.0, expected_batch_size=1.0,
                            noise=NoiseGenerator(0))
            norm = float(torch.sqrt(sum((p.grad ** 2).sum() for p in clipper.parameters)))
            g = scale * float(norms[i])
            assert norm < bound
            assert norm == pytest.approx(bound * g / (g + gamma), rel=1e-9)
            clipper.remove()
            model.zero_grad(set_to_none=True)


def test_automatic_per_layer_clipping_matches_reference() -> None:
    torch.manual_seed(2)
    model = Sequence(3)
    x = torch.randn(5, 4, 3, dtype=torch.float64)
    y = torch.randn(5, 2, dtype=torch.float64)
    grads = per_example(model, x, y)
    bounds = [0.1, 0.2, 0.3, 0.4]
    gamma = 0.05
    factors = [c / (g.reshape(g.shape[0], -1).norm(dim=1) + gamma) for c, g in zip(bounds, grads)]
    expected = weighted(grads, factors)
    got = clipped_sums(model, x, y, AutomaticClipping(gamma, per_layer=True), bounds)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_automatic_clipping_zero_gradient_with_gamma_zero_gives_zero_not_nan() -> None:
    model = nn.Linear(3, 2, bias=False, dtype=torch.float64)
    x = torch.zeros(3, 3, dtype=torch.float64)
    x[0] = 1.0  # examples 1 and 2 have a zero gradient
    y = torch.ones(3, 2, dtype=torch.float64)
    got = clipped_sums(model, x, y, AutomaticClipping(0.0), 1.0)
    grads = per_example(model, x, y)
    expected = grads[0][0] / grads[0][0].norm()  # AUTO-V: C g / ||g||
    torch.testing.assert_close(got[0], expected, rtol=1e-12, atol=0)


def test_optimizer_clipping_automatic_string_and_stability() -> None:
    """NoisySGD(clipping="automatic", stability=gamma) at sigma = 0: the step is
    -lr * sum_i C g_i / (||g_i|| + gamma) / B."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(6, 3, dtype=torch.float64)
    y = torch.randn(6, 2, dtype=torch.float64)
    grads = per_example(model, x, y)
    factors = 0.3 / (flat_norms(grads) + 0.2)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = NoisySGD(model, lr=0.5, noise_multiplier=0.0, max_grad_norm=0.3,
                         expected_batch_size=6.0, clipping="automatic", stability=0.2)
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    for p, p0, s in zip(model.parameters(), before, weighted(grads, [factors] * 4)):
        torch.testing.assert_close(p.detach(), p0 - 0.5 * s / 6.0, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- adaptive quantile clipping
def test_gradient_noise_multiplier_is_andrew_et_al_formula() -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    for z, sigma_b in [(1.0, 3.2), (0.7, 0.36), (5.0, 100.0), (1e-3, 1.0), (2.0, 1.0000001)]:
        exact = (mpmath.mpf(z) ** -2 - (2 * mpmath.mpf(sigma_b)) ** -2) ** mpmath.mpf(-0.5)
        got = gradient_noise_multiplier(z, sigma_b)
        assert got == pytest.approx(float(exact), rel=1e-13)
        # composed with the count's Gaussian (multiplier 2 sigma_b) it is one of multiplier z
        total = (mpmath.mpf(got) ** -2 + (2 * mpmath.mpf(sigma_b)) ** -2) ** mpmath.mpf(-0.5)
        assert float(total) == pytest.approx(z, rel=1e-12)
    assert gradient_noise_multiplier(0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="count_noise_std"):
        gradient_noise_multiplier(1.0, 0.5)  # 2 sigma_b = z: nothing left for the gradient


def test_gradient_noise_multiplier_under_zero_out() -> None:
    """Under zero-out a record with b = 0 replaced by a null record (zero gradient, b = 1)
    moves the count by 1 while the gradient moves by at most C: the count's Gaussian has
    multiplier sigma_b, not 2 sigma_b, so z_grad = (z^-2 - sigma_b^-2)^(-1/2)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    for z, sigma_b in [(1.0, 3.2), (0.7, 0.72), (5.0, 100.0)]:
        got = gradient_noise_multiplier(z, sigma_b, 1.0)
        total = (mpmath.mpf(got) ** -2 + mpmath.mpf(sigma_b) ** -2) ** mpmath.mpf(-0.5)
        assert float(total) == pytest.approx(z, rel=1e-12)
        assert got > gradient_noise_multiplier(z, sigma_b)  # more of the budget to the count
    with pytest.raises(ValueError, match="zero-out"):
        gradient_noise_multiplier(1.0, 0.9, 1.0)  # fine at sensitivity 1/2, not at 1
    rule = AdaptiveQuantileClipping(count_noise_std=3.2)
    rule.bind(1.0, 64)
    rule.set_neighbouring("zero_out")
    assert rule.gradient_noise_multiplier(1.0) == gradient_noise_multiplier(1.0, 3.2, 1.0)
    rule.set_neighbouring("replace_one")  # both parts double: the ratio stays 1/2
    assert rule.gradient_noise_multiplier(1.0) == gradient_noise_multiplier(1.0, 3.2)


def _zero_out_release(first_row: torch.Tensor, n: int, sampling: str) -> tuple[Any, ...]:
    """One adaptive-clipping release through the engine on n records (record 0 = first_row,
    the others zero), every seed fixed: the released gradient and count (times B), z_grad and
    sigma_b. Record 0 = 0 is the null record of zero-out (its zero gradient is unclipped)."""
    from torch.utils.data import TensorDataset

    from dpsharp.torch import PoissonDataLoader, ShuffledDataLoader

    x = torch.zeros(n, 2, dtype=torch.float64)
    x[0] = first_row
    model = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    options: dict[str, Any] = {}
    if sampling == "shuffle":  # zero-out is the reshuffling loader's relation
        loader: Any = ShuffledDataLoader(TensorDataset(x), batch_size=n, seed=1)
    else:
        loader = PoissonDataLoader(TensorDataset(x), expected_batch_size=0.999 * n, seed=1)
        options["neighbouring"] = "zero_out"
    engine = PrivacyEngine("pld", accountant_options=options)
    module, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.0), loader, noise_multiplier=1.0,
        max_grad_norm=1.0, clipping="adaptive", delta=1e-5, seed=3, batch_probe=False,
        loss_reduction="sum")
    for (xb,) in loader:
        module(xb).sum().backward()
        optimizer.step()
        break
    b = optimizer.expected_batch_size
    return (model.weight.grad.detach().clone() * b, optimizer.clip_rule.last_fraction * b,
            optimizer.gradient_noise_multiplier, optimizer.clip_rule.count_noise_std)


@pytest.mark.parametrize(("sampling", "n"), [("shuffle", 64), ("shuffle", 256), ("poisson", 64)])
def test_adaptive_release_under_zero_out_is_the_gaussian_charged(sampling: str, n: int) -> None:
    """The real code on D (record 0 clipped: b = 0) and on D with record 0 replaced by the null
    record (zero gradient: b = 1), same seeds: the releases differ by exactly the sensitivity
    (1 C in the gradient, 1 in the count), and the joint Gaussian they form has
    mu = hypot(1 / z_grad, 1 / sigma_b) = 1 / z, the multiplier the engine charges. It was
    1.036 at n = 64 when the count was taken to move by 1/2."""
    g_d, c_d, z_grad, sigma_b = _zero_out_release(torch.tensor([10.0, 0.0]), n, sampling)
    g_n, c_n, _, _ = _zero_out_release(torch.tensor([0.0, 0.0]), n, sampling)
    shift_gradient, shift_count = float((g_d - g_n).norm()), abs(c_d - c_n)
    assert shift_gradient == pytest.approx(1.0, rel=1e-9)
    assert shift_count == pytest.approx(1.0, rel=1e-9)
    assert math.hypot(shift_gradient / z_grad, shift_count / sigma_b) <= 1.0 + 1e-9


def test_adaptive_bound_follows_algorithm_1_and_clips_at_the_current_bound() -> None:
    """sigma = 0 and sigma_b = 0: every step must clip at the bound C_t of Andrew et al.'s
    Algorithm 1 recomputed here from float64 per-example norms,
    b_t = (#{||g_i|| <= C_t} - n / 2) / B + 1 / 2, C_{t+1} = C_t exp(-eta (b_t - gamma))."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    data = [(torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 2, dtype=torch.float64))
            for n in (8, 5, 9, 8, 7, 8)]
    eta, gamma, batch = 0.3, 0.7, 8.0
    rule = AdaptiveQuantileClipping(gamma, eta, count_noise_std=0.0)
    plain = copy.deepcopy(model)  # unpatched, for the reference
    optimizer = NoisySGD(model, lr=0.2, noise_multiplier=0.0, max_grad_norm=0.05,
                         expected_batch_size=batch, clipping=rule)
    bound = 0.05
    for x, y in data:
        plain.load_state_dict(model.state_dict())
        grads = per_example(plain, x, y)
        norms = flat_norms(grads)
        expected = weighted(grads, [torch.clamp(bound / norms, max=1.0)] * len(grads))
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        for p, p0, s in zip(model.parameters(), before, expected):
            torch.testing.assert_close(p.detach(), p0 - 0.2 * s / batch, rtol=1e-12, atol=1e-14)
        unclipped = int((norms <= bound).sum())
        fraction = (unclipped - x.shape[0] / 2) / batch + 0.5
        bound = bound * math.exp(-eta * (fraction - gamma))
        assert optimizer.max_grad_norm == pytest.approx(bound, rel=1e-13)
        assert optimizer.clipper.max_grad_norm == optimizer.max_grad_norm
    assert bound != 0.05


def test_adaptive_noise_stds_are_z_grad_c_and_sigma_b() -> None:
    """Zero per-example gradients: the released gradient is pure noise with std
    z_grad C / B; the bound's log-change is -eta * N(0, sigma_b^2) / B at gamma = 1/2 with no
    example (chi-square 99.9% intervals)."""
    chi2 = pytest.importorskip("scipy.stats").chi2
    model = nn.Linear(100, 40, bias=False)
    z, sigma_b, bound, batch = 1.3, 2.0, 0.8, 10.0
    rule = AdaptiveQuantileClipping(0.5, 0.1, count_noise_std=sigma_b)
    optimizer = NoisySGD(model, lr=1.0, noise_multiplier=z, max_grad_norm=bound,
                         expected_batch_size=batch, clipping=rule, seed=7)
    z_grad = gradient_noise_multiplier(z, sigma_b)
    assert optimizer.gradient_noise_multiplier == z_grad
    optimizer.zero_grad()
    model(torch.zeros(4, 100)).sum().backward()
    c_before = optimizer.max_grad_norm
    optimizer.step()
    noise = model.weight.grad.double().reshape(-1) * batch
    k = noise.numel()
    ratio = float((noise ** 2).sum()) / (z_grad * c_before) ** 2
    assert chi2.ppf(0.0005, k) < ratio < chi2.ppf(0.9995, k)
    # the count: 4 examples, all unclipped (norm 0 <= C): b = (4 - 2 + noise) / B + 1/2
    fraction = rule.last_fraction
    count_noise = (fraction - 0.5) * batch - 2.0
    assert math.log(optimizer.max_grad_norm / c_before) == pytest.approx(
        -0.1 * (fraction - 0.5), rel=1e-12)
    draws = [count_noise]
    for _ in range(1999):
        rule.unclipped = 0
        rule.release(noise=optimizer.noise, expected_batch_size=batch, realised_batch_size=0)
        draws.append((rule.last_fraction - 0.5) * batch)
    s = sum(d * d for d in draws) / sigma_b ** 2
    assert chi2.ppf(0.0005, len(draws)) < s < chi2.ppf(0.9995, len(draws))


def _adaptive_run(accountant: str, steps: int, *, z: float, sigma_b: float, q: float):
    torch.manual_seed(5)
    n = 60
    x = torch.randn(n, 4)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    engine = PrivacyEngine(accountant=accountant)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        PoissonDataLoader(TensorDataset(x, y), sample_rate=q, seed=3),
        noise_multiplier=z, max_grad_norm=1.0, delta=1e-5, seed=4,
        clipping=AdaptiveQuantileClipping(0.5, 0.2, count_noise_std=sigma_b))
    taken = 0
    while taken < steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            if len(yb):
                F.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            taken += 1
            if taken == steps:
                break
    return engine, optimizer


def test_adaptive_run_is_charged_one_sampled_gaussian_of_the_total_multiplier() -> None:
    """The engine charges each step as the joint Gaussian of both releases: multiplier
    (z_grad^-2 + (2 sigma_b)^-2)^(-1/2), formed here from the noise actually used."""
    z, sigma_b, q, steps = 1.1, 3.0, 0.1, 25
    engine, optimizer = _adaptive_run("rdp", steps, z=z, sigma_b=sigma_b, q=q)
    z_grad = optimizer.gradient_noise_multiplier
    assert z_grad > z
    joint = (z_grad ** -2 + (2 * sigma_b) ** -2) ** -0.5
    assert joint == pytest.approx(z, rel=1e-14)
    assert engine.steps == steps
    by_hand = dpsharp.accountant("rdp", neighbouring="add_remove")
    by_hand.compose(PoissonSampled(Gaussian(z), q), steps)
    assert engine.accountant.composed == by_hand.composed
    assert engine.epsilon(1e-5) == by_hand.epsilon(1e-5)
    assert optimizer.max_grad_norm != 1.0  # the bound moved


@pytest.mark.peers
def test_adaptive_epsilon_equals_dp_accounting_composition_of_both_releases() -> None:
    """dp-accounting's RDP accountant, given each step as one Poisson sample of the batch
    followed by the gradient release (z_grad) and the count release (multiplier 2 sigma_b),
    gives the engine's epsilon."""
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    z, sigma_b, q, steps = 1.1, 3.0, 0.1, 30
    engine, optimizer = _adaptive_run("rdp", steps, z=z, sigma_b=sigma_b, q=q)
    z_grad = z / math.sqrt(1.0 - (z / (2.0 * sigma_b)) ** 2)
    assert optimizer.gradient_noise_multiplier == pytest.approx(z_grad, rel=1e-14)
    step = dp_event.PoissonSampledDpEvent(q, dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(z_grad), dp_event.GaussianDpEvent(2.0 * sigma_b)]))
    reference = rdp.RdpAccountant()
    reference.compose(step, steps)
    assert engine.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-3)


def test_adaptive_budget_is_enforced() -> None:
    torch.manual_seed(6)
    x = torch.randn(40, 4)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(4, 2))
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        PoissonDataLoader(TensorDataset(x, y), sample_rate=0.125, seed=1),
        noise_multiplier=1.2, max_grad_norm=1.0, budget=PrivacyBudget(3.0, 1e-5), seed=2,
        clipping=AdaptiveQuantileClipping(count_noise_std=5.0))
    from dpsharp.torch import BudgetExhausted

    with pytest.raises(BudgetExhausted):
        for _ in range(100):
            for xb, yb in loader:
                optimizer.zero_grad()
                if len(yb):
                    F.cross_entropy(model(xb), yb).backward()
                optimizer.step()
    # the same budget as plain DP-SGD at sigma = 1.2 (dpsharp.calibrate.steps: 11 steps)
    assert engine.steps == 11
    assert engine.epsilon(1e-5) <= 3.0


def test_adaptive_state_dict_keeps_the_bound() -> None:
    torch.manual_seed(7)
    model = nn.Linear(3, 2)
    rule = AdaptiveQuantileClipping(count_noise_std=1.0)
    optimizer = NoisySGD(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0,
                         expected_batch_size=4.0, clipping=rule, seed=1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        optimizer.step()
    state = optimizer.state_dict()
    other_model = nn.Linear(3, 2)
    other = NoisySGD(other_model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0,
                     expected_batch_size=4.0, clipping=AdaptiveQuantileClipping(
                         count_noise_std=1.0), seed=1)
    other.load_state_dict(state)
    assert other.max_grad_norm == optimizer.max_grad_norm != 1.0
    assert other.clipper.max_grad_norm == optimizer.max_grad_norm


def test_bad_arguments() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="stability"):
        AutomaticClipping(-0.1)
    with pytest.raises(ValueError, match="target_quantile"):
        AdaptiveQuantileClipping(1.5)
    with pytest.raises(ValueError, match="learning_rate"):
        AdaptiveQuantileClipping(0.5, 0.0)
    with pytest.raises(ValueError, match="count_noise_std"):
        AdaptiveQuantileClipping(count_noise_std=-1.0)
    with pytest.raises(ValueError, match="clipping"):
        NoisySGD(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0,
                 expected_batch_size=4.0, clipping="normalised")
    with pytest.raises(ValueError, match="count_noise_std"):  # 2 * 0.25 < 1: refused up front
        NoisySGD(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0,
                 expected_batch_size=5.0, clipping="adaptive")
    with pytest.raises(ValueError, match="flat"):
        NoisySGD(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=[1.0, 1.0],
                 expected_batch_size=4.0, clipping=AdaptiveQuantileClipping(count_noise_std=2))
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="rule"):
        DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=1.0,
                    max_grad_norm=1.0, expected_batch_size=4.0, clipper=clipper,
                    clipping="automatic")


def test_make_private_automatic_clipping_with_stability() -> None:
    """make_private(clipping="automatic", stability=gamma) at sigma = 0 over a full batch
    (q = 1): the step is -lr * sum_i C g_i / (||g_i|| + gamma) / B."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    y = torch.randn(5, 2, dtype=torch.float64)
    grads = per_example(model, x, y)
    factors = 0.4 / (flat_norms(grads) + 0.3)
    before = [p.detach().clone() for p in model.parameters()]
    model, optimizer, loader = PrivacyEngine(accountant="rdp").make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.5),
        PoissonDataLoader(TensorDataset(x, y), sample_rate=1.0, seed=0),
        noise_multiplier=0.0, max_grad_norm=0.4, delta=1e-5, clipping="automatic",
        stability=0.3)
    assert isinstance(optimizer.clip_rule, AutomaticClipping)
    for xb, yb in loader:
        optimizer.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        optimizer.step()
    for p, p0, s in zip(model.parameters(), before, weighted(grads, [factors] * 4)):
        torch.testing.assert_close(p.detach(), p0 - 0.5 * s / 5.0, rtol=1e-12, atol=1e-14)
