"""Per-example clipping of Hugging Face transformer building blocks and models, torch's
nn.RMSNorm and nn.EmbeddingBag.

Reference: batch-size-1 autograd on an unpatched copy (tests/_clip_reference.py), the clipped
sum of Abadi et al. 2016, Algorithm 1. Tiny models are built from configs (no download).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from _clip_reference import check_model, float32_error_ratio  # noqa: E402
from dpsharp.torch import (  # noqa: E402
    BudgetExhausted,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
)

pytestmark = pytest.mark.torch


def _mse(y: torch.Tensor):
    def loss(out, i) -> torch.Tensor:
        return ((out - y[i]) ** 2).sum()

    return loss


def _transformers():
    return pytest.importorskip("transformers")


def _kinds(model: nn.Module) -> set[tuple[str, str]]:
    """(module type, handler kind) of every module the clipper patches."""
    from dpsharp.torch import PerSampleClipper

    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    kinds = set(clipper.handled_modules)
    clipper.remove()
    return kinds


# ---------------------------------------------------------------- building blocks
class Conv1DModel(nn.Module):
    def __init__(self, conv: nn.Module, d_in: int) -> None:
        super().__init__()
        self.inp = nn.Linear(3, d_in)
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.tanh(self.inp(x))).sum(1)


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 4), seq=st.integers(1, 6), d_in=st.integers(1, 5),
       d_out=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_gpt2_conv1d_is_a_linear_map_with_transposed_weight(batch, seq, d_in, d_out,
                                                            seed) -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(seed)
    conv = Conv1D(d_out, d_in)
    nn.init.normal_(conv.bias)
    model = Conv1DModel(conv, d_in).double()
    x = torch.randn(batch, seq, 3, dtype=torch.float64)
    y = torch.randn(batch, d_out, dtype=torch.float64)
    check_model(model, x, batch, _mse(y), bound=0.3)


def test_gpt2_conv1d_uses_the_linear_fast_path_and_float32_error() -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = Conv1DModel(Conv1D(6, 5), 5).double()
    assert ("Conv1D", "hf_conv1d") in _kinds(model)
    x = torch.randn(6, 40, 3, dtype=torch.float64)
    y = torch.randn(6, 6, dtype=torch.float64)
    ours, plain = float32_error_ratio(model, x, 6, _mse(y), bound=0.5)
    assert ours <= 8 * plain + 1e-7, (ours, plain)


class NormModel(nn.Module):
    def __init__(self, norm: nn.Module, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(3, width)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.inp(x)).reshape(x.shape[0], -1)[:, :2]


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 4), seq=st.integers(1, 4), width=st.integers(2, 6),
       llama=st.booleans(), seed=st.integers(0, 2**16))
def test_rmsnorm_torch_and_llama(batch, seq, width, llama, seed) -> None:
    torch.manual_seed(seed)
    if llama:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        norm = LlamaRMSNorm(width, eps=1e-6)
    else:
        norm = nn.RMSNorm(width, eps=1e-6)
    nn.init.normal_(norm.weight)
    model = NormModel(norm, width).double()
    x = torch.randn(batch, seq, 3, dtype=torch.float64)
    y = torch.randn(batch, 2, dtype=torch.float64)
    check_model(model, x, batch, _mse(y), bound=0.3)
    kind = ("LlamaRMSNorm", "llama_rmsnorm") if llama else ("RMSNorm", "rmsnorm")
    assert kind in _kinds(model)  # the affine fast path, not the torch.func fallback


class BagModel(nn.Module):
    def __init__(self, bag: nn.EmbeddingBag, weighted: bool) -> None:
        super().__init__()
        self.bag, self.weighted = bag, weighted
        self.head = nn.Linear(bag.embedding_dim, 2)

    def forward(self, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(idx, per_sample_weights=w if self.weighted else None))


@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 4), bag=st.integers(1, 5), mode=st.sampled_from(["sum", "mean"]),
       padding=st.booleans(), weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_embedding_bag(batch, bag, mode, padding, weighted, seed) -> None:
    weighted = weighted and mode == "sum"
    torch.manual_seed(seed)
    emb = nn.EmbeddingBag(5, 3, mode=mode, padding_idx=0 if padding else None)
    model = BagModel(emb, weighted).double()
    idx = torch.randint(0, 5, (batch, bag))  # repeated rows and padding within a bag
    idx[:, 0] = 1
    w = torch.randn(batch, bag, dtype=torch.float64)
    y = torch.randn(batch, 2, dtype=torch.float64)
    check_model(model, {"idx": idx, "w": w}, batch, _mse(y), bound=0.3)
    assert ("EmbeddingBag", "embeddingbag") in _kinds(model)


def test_embedding_bag_with_offsets_is_refused() -> None:
    from dpsharp.torch import PerSampleClipper

    bag = nn.EmbeddingBag(5, 3)
    clipper = PerSampleClipper(bag, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="2-D indices"):
        bag(torch.tensor([1, 2, 3]), torch.tensor([0, 2]))
    clipper.remove()


class SharedPositions(nn.Module):
    """Position ids of shape (1, T) looked up once and broadcast over the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(7, 4)
        self.pos = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1]).unsqueeze(0)
        return self.head(self.tok(idx) + self.pos(positions)).sum(1)


def test_broadcast_position_embedding_is_clipped_per_example() -> None:
    torch.manual_seed(5)
    model = SharedPositions().double()
    idx = torch.randint(0, 7, (4, 5))
    y = torch.randn(4, 2, dtype=torch.float64)
    check_model(model, idx, 4, _mse(y), bound=0.2)


# ---------------------------------------------------------------- whole models
def _lm_loss(ids: torch.Tensor):
    def loss(out, i) -> torch.Tensor:
        logits = out.logits[:, :-1]
        target = ids[i].reshape(-1, ids.shape[1])[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                               reduction="sum")

    return loss


def _class_loss(y: torch.Tensor):
    def loss(out, i) -> torch.Tensor:
        return F.cross_entropy(out.logits, y[i].reshape(-1), reduction="sum")

    return loss


def tiny_gpt2(layers: int = 2, width: int = 32):
    tf = _transformers()
    config = tf.GPT2Config(vocab_size=100, n_positions=16, n_embd=width, n_layer=layers,
                           n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           use_cache=False, bos_token_id=0, eos_token_id=0)
    return tf.GPT2LMHeadModel(config)


def tiny_llama():
    tf = _transformers()
    config = tf.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=16, use_cache=False, bos_token_id=0,
                            eos_token_id=0, pad_token_id=0)
    return tf.LlamaForCausalLM(config)


def tiny_bert():
    tf = _transformers()
    config = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=16, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3, pad_token_id=0)
    return tf.BertForSequenceClassification(config)


def _tokens(batch: int = 3, seq: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 100, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, -2:] = 0  # a padded example
    return ids, mask


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_language_models_float64(name: str) -> None:
    torch.manual_seed(0)
    model = (tiny_gpt2() if name == "gpt2" else tiny_llama()).double()
    ids, mask = _tokens()
    check_model(model, {"input_ids": ids, "attention_mask": mask}, 3, _lm_loss(ids))


def test_bert_with_attention_mask_float64() -> None:
    torch.manual_seed(0)
    model = tiny_bert().double()
    ids, mask = _tokens()
    y = torch.tensor([0, 2, 1])
    check_model(model, {"input_ids": ids, "attention_mask": mask}, 3, _class_loss(y))


def test_vit_float64() -> None:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32,
                          num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          num_labels=3, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    model = tf.ViTForImageClassification(config).double()
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    y = torch.tensor([0, 2, 1])
    check_model(model, x, 3, _class_loss(y))


def test_gpt2_float32_error() -> None:
    torch.manual_seed(1)
    model = tiny_gpt2().double()
    ids, mask = _tokens(batch=4, seq=8, seed=1)
    ours, plain = float32_error_ratio(model, {"input_ids": ids, "attention_mask": mask}, 4,
                                      _lm_loss(ids))
    assert ours <= 8 * plain + 1e-6, (ours, plain)


def train_until_budget(model: nn.Module, dataset, loss_of_batch) -> tuple[int, PrivacyEngine]:
    """DP-SGD with PrivacyEngine (RDP, sigma 1, q 0.25, C 1) until the budget stops it."""
    engine = PrivacyEngine(accountant="rdp")
    budget = PrivacyBudget(epsilon=4.0, delta=1e-5)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05),
        PoissonDataLoader(dataset, sample_rate=0.25, seed=3), noise_multiplier=1.0,
        max_grad_norm=1.0, budget=budget, seed=3)
    steps = 0
    with pytest.raises(BudgetExhausted):
        for _ in range(20):
            for batch in loader:
                optimizer.zero_grad()
                if len(batch[0]):
                    loss_of_batch(model, batch).backward()
                optimizer.step()
                steps += 1
    assert steps >= 2
    assert 0.0 < engine.epsilon(budget.delta) <= budget.epsilon
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    assert all(bool(torch.isfinite(a).all()) for a in after)
    assert all(not torch.equal(a, b) for a, b in zip(after, before))
    return steps, engine


def _lm_dataset(n: int = 16, seq: int = 8):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 100, (n, seq), generator=g)
    mask = torch.ones(n, seq, dtype=torch.long)
    mask[::3, -2:] = 0
    return torch.utils.data.TensorDataset(ids, mask)


def _lm_step(model, batch) -> torch.Tensor:
    ids, mask = batch
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_privacy_engine_trains_tiny_models_within_budget(name: str) -> None:
    torch.manual_seed(2)
    if name == "bert":
        ids, mask = _lm_dataset()[:]
        labels = ids[:, 0] % 3
        dataset = torch.utils.data.TensorDataset(ids, mask, labels)

        def step(model, batch):
            return F.cross_entropy(model(input_ids=batch[0], attention_mask=batch[1]).logits,
                                   batch[2])

        train_until_budget(tiny_bert(), dataset, step)
    else:
        train_until_budget(tiny_gpt2() if name == "gpt2" else tiny_llama(), _lm_dataset(),
                           _lm_step)
