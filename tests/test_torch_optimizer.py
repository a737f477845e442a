"""DPOptimizer / NoisySGD / NoisyAdam / NoisyAdaGrad.

References are independent of the clipper: plain torch optimizers on autograd gradients, and a
batch-size-1 clip-then-average reference computed with autograd one example at a time."""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dpsharp.torch import DPOptimizer, NoisyAdaGrad, NoisyAdam, NoisySGD  # noqa: E402
from dpsharp.torch.clipper import PerSampleClipper  # noqa: E402
from dpsharp.torch.noise import NoiseGenerator  # noqa: E402

pytestmark = pytest.mark.torch


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def make_data(n: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator, dtype=torch.float64) * 3.0
    y = torch.randint(0, 3, (n,), generator=generator)
    return x, y


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def dp_wrap(model: nn.Module, optimizer: torch.optim.Optimizer, *, sigma: float, bound: float,
            batch: float, seed: int = 3) -> DPOptimizer:
    return DPOptimizer(
        optimizer,
        module=model,
        noise_multiplier=sigma,
        max_grad_norm=bound,
        expected_batch_size=batch,
        noise=NoiseGenerator(seed),
    )


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=0.01),
    ],
    ids=["sgd", "sgd-momentum", "adam"],
)
def test_noise_free_large_bound_reproduces_plain_trajectory(make_optimizer) -> None:
    x, y = make_data()
    plain = make_model()
    private = copy.deepcopy(plain)
    plain_opt = make_optimizer(plain.parameters())
    dp_opt = dp_wrap(private, make_optimizer(private.parameters()), sigma=0.0, bound=1e6, batch=8)
    for step in range(8):
        xb, yb = x[(step % 2) * 8 : (step % 2) * 8 + 8], y[(step % 2) * 8 : (step % 2) * 8 + 8]
        plain_opt.zero_grad()
        loss_fn(plain, xb, yb).backward()
        plain_opt.step()
        dp_opt.zero_grad()
        loss_fn(private, xb, yb).backward()
        dp_opt.step()
    for a, b in zip(plain.parameters(), private.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _clip_then_average_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bound: float,
                            lr: float) -> None:
    """Reference: per-example gradients by autograd at batch size 1, clipped to `bound` by
    g / max(1, ||g|| / bound), summed, divided by the batch size, one SGD step."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(x)):
        grads = torch.autograd.grad(loss_fn(model, x[i : i + 1], y[i : i + 1]), params)
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        factor = 1.0 / max(1.0, norm / bound)
        for t, g in zip(total, grads):
            t += factor * g
    with torch.no_grad():
        for p, t in zip(params, total):
            p -= lr * t / len(x)


def test_noise_free_active_clipping_matches_batch_size_one_reference() -> None:
    x, y = make_data()
    reference = make_model()
    private = copy.deepcopy(reference)
    bound = 0.3
    dp_opt = dp_wrap(private, torch.optim.SGD(private.parameters(), lr=0.2), sigma=0.0,
                     bound=bound, batch=len(x))
    norms_seen = []
    for _ in range(5):
        _clip_then_average_step(reference, x, y, bound, 0.2)
        dp_opt.zero_grad()
        loss_fn(private, x, y).backward()
        norms_seen.append(dp_opt.clipper.last_per_example_norms.max().item())
        dp_opt.step()
    assert min(norms_seen) > bound  # clipping was active at every step
    for a, b in zip(reference.parameters(), private.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_virtual_batches_accumulate_and_draw_noise_once() -> None:
    x, y = make_data()
    whole = make_model()
    split = copy.deepcopy(whole)
    opt_whole = dp_wrap(whole, torch.optim.SGD(whole.parameters(), lr=0.1), sigma=0.7, bound=0.5,
                        batch=16, seed=11)
    opt_split = dp_wrap(split, torch.optim.SGD(split.parameters(), lr=0.1), sigma=0.7, bound=0.5,
                        batch=16, seed=11)
    loss_fn(whole, x, y).backward()
    opt_whole.step()
    for part in range(4):  # four physical batches of one logical batch of 16 (mean loss each)
        loss_fn(split, x[part * 4 : part * 4 + 4], y[part * 4 : part * 4 + 4]).backward()
        assert opt_split.clipper.accumulated_batches == part + 1
    assert opt_split.clipper.accumulated_examples == 16
    opt_split.step()
    assert opt_split.noise.releases == opt_whole.noise.releases == 1
    assert opt_split.releases == 1
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_step_twice_or_without_backward_raises() -> None:
    model = make_model()
    opt = dp_wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), sigma=1.0, bound=1.0, batch=4)
    with pytest.raises(RuntimeError, match="without new gradients"):
        opt.step()
    x, y = make_data(4)
    loss_fn(model, x, y).backward()
    opt.step()
    with pytest.raises(RuntimeError, match="without new gradients"):
        opt.step()
    assert opt.releases == 1


def test_noise_scale_is_sigma_c_over_expected_batch_size() -> None:
    """std(update - clipped mean) = sigma C / B: a noise-on-the-mean bug would give sigma C / B^2
    and a realised-size normaliser would not track B."""
    torch.manual_seed(0)
    model = nn.Linear(40, 50).double()
    x = torch.randn(8, 40, dtype=torch.float64)
    y = torch.randn(8, 50, dtype=torch.float64)
    sigma, bound, expected = 2.0, 0.5, 8.0

    def grad_after_release(noise_multiplier: float, noise: NoiseGenerator, clipper) -> torch.Tensor:
        opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), clipper=clipper,
                          noise_multiplier=noise_multiplier, max_grad_norm=bound,
                          expected_batch_size=expected, noise=noise)
        nn.functional.mse_loss(model(x), y, reduction="none").sum(1).mean().backward()
        opt.step()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    clipper = PerSampleClipper(model, max_grad_norm=bound)
    clean = grad_after_release(0.0, NoiseGenerator(0), clipper)
    noise = NoiseGenerator(5)
    residuals = torch.cat([grad_after_release(sigma, noise, clipper) - clean for _ in range(10)])
    expected_std = sigma * bound / expected
    n = residuals.numel()
    sample_var = float(residuals.var())
    # chi-square interval for the variance at ~6 standard errors: (n-1) s^2 / s0^2 ~ chi2(n-1)
    assert abs(sample_var / expected_std**2 - 1.0) < 6.0 * math.sqrt(2.0 / n)
    assert abs(float(residuals.mean())) < 6.0 * expected_std / math.sqrt(n)


def test_adam_moments_come_only_from_the_privatised_gradient() -> None:
    x, y = make_data()
    model = make_model()
    plain = copy.deepcopy(model)
    raw = torch.autograd.grad(loss_fn(plain, x, y), list(plain.parameters()))
    opt = NoisyAdam(model, lr=0.01, noise_multiplier=1.0, max_grad_norm=0.5,
                    expected_batch_size=16, noise=NoiseGenerator(2))
    loss_fn(model, x, y).backward()
    opt.step()
    beta1, beta2 = opt.param_groups[0]["betas"]
    for p, g_raw in zip(model.parameters(), raw):
        released = p.grad  # what the wrapped Adam consumed
        state = opt.state[p]
        torch.testing.assert_close(state["exp_avg"], (1 - beta1) * released, rtol=1e-12, atol=0)
        torch.testing.assert_close(state["exp_avg_sq"], (1 - beta2) * released * released,
                                   rtol=1e-12, atol=0)
        assert not torch.allclose(released, g_raw)


def test_noisy_adam_without_bias_correction_is_algorithm_2() -> None:
    """Bu et al. 2020, Algorithm 2: m = b1 m + (1-b1) v, u = b2 u + (1-b2) v*v,
    theta -= lr m / (sqrt(u) + xi), on the privatised v (read back from p.grad)."""
    x, y = make_data()
    model = make_model()
    lr, (b1, b2), xi = 0.05, (0.8, 0.9), 1e-6
    opt = NoisyAdam(model, lr=lr, betas=(b1, b2), eps=xi, bias_correction=False,
                    noise_multiplier=0.8, max_grad_norm=0.5, expected_batch_size=16,
                    noise=NoiseGenerator(4))
    m = [torch.zeros_like(p) for p in model.parameters()]
    u = [torch.zeros_like(p) for p in model.parameters()]
    for _ in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
        for i, p in enumerate(model.parameters()):
            v = p.grad
            m[i] = b1 * m[i] + (1 - b1) * v
            u[i] = b2 * u[i] + (1 - b2) * v * v
            torch.testing.assert_close(p.detach(), before[i] - lr * m[i] / (u[i].sqrt() + xi),
                                       rtol=1e-12, atol=1e-14)


def test_noisy_sgd_and_adagrad_are_torch_optimizers_on_the_released_gradient() -> None:
    x, y = make_data()
    model = make_model()
    sgd = NoisySGD(model, lr=0.1, noise_multiplier=0.0, max_grad_norm=1e6, expected_batch_size=16)
    assert isinstance(sgd.original_optimizer, torch.optim.SGD)
    sgd.clipper.remove()
    model = make_model()
    ada = NoisyAdaGrad(model, lr=0.1, noise_multiplier=1.0, max_grad_norm=1.0,
                       expected_batch_size=16, noise=NoiseGenerator(1))
    loss_fn(model, x, y).backward()
    ada.step()
    for p in model.parameters():
        torch.testing.assert_close(ada.state[p]["sum"], p.grad * p.grad, rtol=1e-12, atol=0)


def test_scheduler_param_groups_and_state_dict_keep_working() -> None:
    x, y = make_data()
    model = make_model()
    opt = dp_wrap(model, torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9), sigma=1.0,
                  bound=1.0, batch=16, seed=9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.125)
    assert opt.original_optimizer.param_groups[0]["lr"] == pytest.approx(0.125)
    state = copy.deepcopy(opt.state_dict())  # torch state_dicts share live tensors
    assert state["dpsharp"]["releases"] == 3 and state["dpsharp"]["noise"] is not None

    twin = copy.deepcopy(model)
    twin_opt = dp_wrap(twin, torch.optim.SGD(twin.parameters(), lr=1.0, momentum=0.9), sigma=1.0,
                       bound=1.0, batch=16, seed=123)
    twin_opt.load_state_dict(state)
    assert twin_opt.releases == 3 and twin_opt.noise.releases == opt.noise.releases
    for run_model, run_opt in ((model, opt), (twin, twin_opt)):
        run_opt.zero_grad()
        loss_fn(run_model, x, y).backward()
        run_opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": -0.1}, "noise_multiplier must be in \\[0, inf\\)"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier must be a finite number"),
        ({"max_grad_norm": 0.0}, "max_grad_norm must be in \\(0, inf\\)"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be in \\(0, inf\\)"),
        ({"expected_batch_size": 0}, "expected_batch_size must be in \\(0, inf\\)"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message) -> None:
    model = make_model()
    args = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 4.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model, **args)


def test_optimizer_over_foreign_parameters_is_refused() -> None:
    model, other = make_model(), make_model(1)
    with pytest.raises(ValueError, match="not a trainable parameter of the private model"):
        DPOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), module=model,
                    noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4.0)
