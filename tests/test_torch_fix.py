"""Up-front validation (one error naming every module that cannot be trained) and
dpsharp.torch.fix (replaces batch norms and running statistics, says what it changed)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from _clip_reference import check_model  # noqa: E402
import dpsharp.torch  # noqa: E402
from dpsharp.torch import PerSampleClipper, PoissonDataLoader, PrivacyEngine  # noqa: E402

pytestmark = pytest.mark.torch


def broken_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Conv2d(6, 48, 1), nn.BatchNorm2d(48),
        nn.InstanceNorm2d(48, affine=True, track_running_stats=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(48, 2),
    )


def test_one_error_names_every_unsupported_module_before_anything_is_patched() -> None:
    model = nn.Sequential(broken_model(), nn.Embedding(4, 2, max_norm=1.0),
                          nn.TransformerEncoderLayer(8, 2, 16))
    with pytest.raises(ValueError) as info:
        PerSampleClipper(model, max_grad_norm=1.0)
    message = str(info.value)
    assert message.startswith("5 modules of the model cannot be trained")
    for where in ("BatchNorm2d ('0.1')", "BatchNorm2d ('0.4')", "InstanceNorm2d ('0.5')",
                  "Embedding ('1')", "TransformerEncoderLayer ('2')"):
        assert where in message, where
    assert "dpsharp.torch.fix(model)" in message
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing patched


def test_make_private_refuses_with_the_same_single_error() -> None:
    model = broken_model()
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 6, 6), torch.zeros(8).long())
    with pytest.raises(ValueError, match="3 modules of the model cannot be trained"):
        PrivacyEngine(accountant="rdp").make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1),
            PoissonDataLoader(data, sample_rate=0.5), noise_multiplier=1.0, max_grad_norm=1.0,
            delta=1e-5)


def test_fix_replaces_batch_norms_and_running_statistics_and_reports_them() -> None:
    torch.manual_seed(0)
    model = broken_model()
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-1, 1)
    scale, shift = model[1].weight.clone(), model[1].bias.clone()
    fixed, changes = dpsharp.torch.fix(model)
    assert fixed is model
    assert [(c.name, c.old, c.new) for c in changes] == [
        ("1", "BatchNorm2d", "GroupNorm"), ("4", "BatchNorm2d", "GroupNorm"),
        ("5", "InstanceNorm2d", "InstanceNorm2d")]
    assert isinstance(model[1], nn.GroupNorm) and model[1].num_groups == math.gcd(6, 32) == 2
    assert model[4].num_groups == 16  # gcd(48, 32): a divisor of the channels
    assert not model[5].track_running_stats
    assert torch.equal(model[1].weight, scale) and torch.equal(model[1].bias, shift)
    assert "batch statistics mix examples" in str(changes[0])
    # the fixed model trains with per-example clipping, exactly (float64 reference)
    model = model.double()
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0])

    def loss(out, i) -> torch.Tensor:
        return F.cross_entropy(out, y[i].reshape(-1), reduction="sum")

    check_model(model, x, 4, loss)


def test_fix_is_callable_through_the_module_too_and_leaves_good_models_alone() -> None:
    import dpsharp.torch.fix as fix_module

    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    fixed, changes = fix_module(model)
    assert fixed is model and changes == []
    fixed, changes = dpsharp.torch.fix(nn.BatchNorm1d(4))
    assert isinstance(fixed, nn.GroupNorm) and changes[0].name == ""
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        dpsharp.torch.fix("model")
