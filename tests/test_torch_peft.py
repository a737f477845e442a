"""DP fine-tuning where only some parameters train: PEFT LoRA adapters on a tiny GPT-2 and
frozen bases. The clipper patches no module whose parameters are all frozen (no hooks, no
stored activations there), the clipped sums of the trainable parameters equal the float64
batch-size-1 reference, and the noise goes on the trainable parameters only.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from _clip_reference import check_model  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    PerSampleClipper,
    PoissonDataLoader,
    PrivacyEngine,
    kernels,
)

pytestmark = [
    pytest.mark.torch,
    # peft 0.21 calls transformers' deprecated is_gradient_checkpointing
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated"),
]


def lora_gpt2():
    peft = pytest.importorskip("peft")
    from test_torch_transformers import tiny_gpt2

    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"],
                             fan_in_fan_out=True, lora_dropout=0.0,
                             init_lora_weights=False)  # random B: nonzero adapter gradients
    return peft.get_peft_model(tiny_gpt2(), config)


def _lm_loss(ids: torch.Tensor):
    def loss(out, i) -> torch.Tensor:
        logits = out.logits[:, :-1]
        target = ids[i].reshape(-1, ids.shape[1])[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                               reduction="sum")

    return loss


def _patched(module: nn.Module) -> bool:
    return "forward" in module.__dict__


def test_lora_gpt2_clipped_sums_float64_and_frozen_base_untouched() -> None:
    model = lora_gpt2().double()
    ids = torch.randint(1, 100, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, -2:] = 0
    check_model(model, {"input_ids": ids, "attention_mask": mask}, 3, _lm_loss(ids))
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert clipper.parameters == trainable and all("lora_" in n for n, p in
                                                   model.named_parameters() if p.requires_grad)
    for name, m in model.named_modules():
        direct = list(m.parameters(recurse=False))
        if direct and not any(p.requires_grad for p in m.parameters()):
            assert not _patched(m), name  # frozen: plain forward, nothing stored for clipping
        if direct and all(p.requires_grad for p in direct):
            assert _patched(m), name
    clipper.remove()


def test_noise_goes_only_on_trainable_parameters(monkeypatch) -> None:
    """One PrivacyEngine step of the LoRA model: the fused release kernel is asked for
    exactly the trainable elements, frozen parameters get no .grad and do not move."""
    model = lora_gpt2()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable_elements = sum(p.numel() for p in model.parameters() if p.requires_grad)
    released: list[int] = []
    original = kernels.release_noise

    def counting(outs, *args, **kwargs):
        released.append(sum(o.numel() for o in outs))
        return original(outs, *args, **kwargs)

    monkeypatch.setattr(kernels, "release_noise", counting)
    ids = torch.randint(1, 100, (8, 6), generator=torch.Generator().manual_seed(2))
    dataset = torch.utils.data.TensorDataset(ids)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        PoissonDataLoader(dataset, sample_rate=0.5, seed=4), noise_multiplier=1.0,
        max_grad_norm=1.0, delta=1e-5, seed=4)
    for (batch,) in loader:
        optimizer.zero_grad()
        if len(batch):
            logits = model(input_ids=batch).logits[:, :-1]
            F.cross_entropy(logits.reshape(-1, 100), batch[:, 1:].reshape(-1)).backward()
        optimizer.step()
    assert released and all(n == trainable_elements for n in released)
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, n
            assert torch.equal(p.detach(), frozen[n]), n
        else:
            assert p.grad is not None and bool(torch.isfinite(p.grad).all()), n


class FrozenBase(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.body = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)
        for p in [*self.embed.parameters(), *self.body.parameters()]:
            p.requires_grad_(False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(idx)).mean(1))


def test_frozen_base_with_trainable_head() -> None:
    torch.manual_seed(3)
    model = FrozenBase().double()
    idx = torch.randint(0, 10, (4, 5))
    y = torch.tensor([0, 1, 2, 1])

    def loss(out, i) -> torch.Tensor:
        return F.cross_entropy(out, y[i].reshape(-1), reduction="sum")

    check_model(model, idx, 4, loss)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    assert [m for m in model.modules() if _patched(m)] == [model.head]
    assert clipper.parameters == [model.head.weight, model.head.bias]
    clipper.remove()


def test_lora_gpt2_trains_within_budget() -> None:
    from test_torch_transformers import _lm_dataset, _lm_step, train_until_budget

    train_until_budget(lora_gpt2(), _lm_dataset(), _lm_step)


def test_unfreezing_after_make_private_is_refused_at_the_release() -> None:
    """A parameter frozen at make_private has no clipping; if it is unfrozen later, its plain
    gradient would reach the optimizer unclipped and without noise: the forward pass with
    gradients refuses (and, were it reached, the release does too)."""
    torch.manual_seed(4)
    model = FrozenBase()
    ids = torch.randint(0, 10, (8, 5))
    dataset = torch.utils.data.TensorDataset(ids, ids[:, 0] % 3)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        PoissonDataLoader(dataset, sample_rate=0.5, seed=1), noise_multiplier=1.0,
        max_grad_norm=1.0, delta=1e-5, seed=1)
    model.embed.weight.requires_grad_(True)
    x, y = next(iter(loader))
    optimizer.zero_grad()
    with pytest.raises(RuntimeError, match="not when it was made private.*: embed.weight"):
        model(x)
    assert engine.steps == 0
