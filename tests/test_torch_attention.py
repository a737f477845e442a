"""Per-example clipping of nn.MultiheadAttention and torch's transformer layers.

Reference: batch-size-1 autograd on an unpatched copy (tests/_clip_reference.py): the clipped
sum sum_i min(1, C / ||g_i||) g_i of Abadi et al. 2016, Algorithm 1. Float64 to 1e-10; float32
within a small multiple of plain float32 autograd's own error.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from _clip_reference import check_model, float32_error_ratio  # noqa: E402
from dpsharp.torch import PerSampleClipper  # noqa: E402

pytestmark = pytest.mark.torch


class AttentionModel(nn.Module):
    """Linear maps in, one nn.MultiheadAttention call, sum over positions out. ``sources``:
    "self" (query is key is value), "kv" (key is value, another tensor than the query) or
    "all" (three tensors). Masks are computed from the input, so that each example's masks
    are its own rows."""

    def __init__(self, mha: nn.MultiheadAttention, sources: str, *, masks: str,
                 need_weights: bool, average: bool = True, features: int = 3) -> None:
        super().__init__()
        self.mha, self.sources, self.masks = mha, sources, masks
        self.need_weights, self.average = need_weights, average
        self.q = nn.Linear(features, mha.embed_dim)
        self.k = nn.Linear(features, mha.kdim)
        self.v = nn.Linear(features, mha.vdim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length = x.shape[:2]
        q = self.q(x)
        if self.sources == "self":
            k = v = q
        elif self.sources == "kv":
            k = v = self.k(x.flip(1))
        else:
            k, v = self.k(x.flip(1)), self.v(2 * x)
        kwargs: dict = {"need_weights": self.need_weights,
                        "average_attn_weights": self.average}
        heads = self.mha.num_heads
        if self.masks in ("padding", "both"):
            pad = torch.zeros(b, length, dtype=torch.bool)
            if length > 1:  # a data-dependent padded last position; padding a query's only
                # key would make PyTorch's own output NaN, which the clipper refuses
                pad[:, -1] = x[:, -1, 0] > 0
            kwargs["key_padding_mask"] = pad
        if self.masks in ("causal", "both"):
            kwargs["attn_mask"] = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)
        if self.masks == "float3d":  # per example and head: rows b H + h
            kwargs["attn_mask"] = 0.5 * x[:, :, 1:2].expand(b, length, length).repeat_interleave(
                heads, 0)
        if not self.mha.batch_first:  # a batch-first model around a sequence-first layer
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
            if self.sources == "self":
                k = v = q
            elif self.sources == "kv":
                v = k
        out, weights = self.mha(q, k, v, **kwargs)
        if not self.mha.batch_first:
            out = out.transpose(0, 1)
        result = out.sum(1)
        if weights is not None:
            result = result + weights.reshape(b, -1)[:, :1]
        return result


def _loss(y: torch.Tensor):
    def loss(out: torch.Tensor, i) -> torch.Tensor:
        return ((out - y[i]) ** 2).sum()

    return loss


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 4), length=st.integers(1, 4), heads=st.sampled_from([1, 2]),
       head_dim=st.integers(1, 3), bias=st.booleans(), bias_kv=st.booleans(),
       zero_attn=st.booleans(), separate_dims=st.booleans(), batch_first=st.booleans(),
       sources=st.sampled_from(["self", "kv", "all"]),
       masks=st.sampled_from(["none", "padding", "causal", "both", "float3d"]),
       need_weights=st.booleans(), average=st.booleans(), seed=st.integers(0, 2**16))
@example(batch=1, length=1, heads=1, head_dim=2, bias=False, bias_kv=False, zero_attn=False,
         separate_dims=False, batch_first=False, sources="self", masks="padding",
         need_weights=True, average=False, seed=1)  # one key only: it is never padded
def test_multihead_attention_every_argument_float64(batch, length, heads, head_dim, bias,
                                                     bias_kv, zero_attn, separate_dims,
                                                     batch_first, sources, masks, need_weights,
                                                     average, seed) -> None:
    torch.manual_seed(seed)
    embed = heads * head_dim
    other = embed + 1 if separate_dims and sources == "all" else None
    mha = nn.MultiheadAttention(embed, heads, bias=bias, add_bias_kv=bias_kv,
                                add_zero_attn=zero_attn, kdim=other, vdim=other,
                                batch_first=batch_first, dtype=torch.float64)
    model = AttentionModel(mha, sources, masks=masks, need_weights=need_weights,
                           average=average).double()
    x = torch.randn(batch, length, 3, dtype=torch.float64)
    y = torch.randn(batch, embed, dtype=torch.float64)
    check_model(model, x, batch, _loss(y), bound=0.3)


def test_multihead_attention_alone_and_float32_error() -> None:
    """The attention is the whole model (its inputs are the model's), and float32: the
    clipper's error against the float64 reference is a small multiple of plain float32
    autograd's."""
    torch.manual_seed(1)

    class Alone(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mha(x, x, x)[0].sum(1)

    model = Alone()
    x = torch.randn(6, 5, 8, dtype=torch.float64)
    y = torch.randn(6, 8, dtype=torch.float64)
    check_model(model, x, 6, _loss(y), bound=0.5)
    ours, plain = float32_error_ratio(model, x, 6, _loss(y), bound=0.5)
    assert ours <= 8 * plain + 1e-7, (ours, plain)


def test_sequence_first_attention_is_clipped_per_example_not_per_position() -> None:
    """batch_first=False inside a batch-first model: each example's gradient (dimension 1 of
    the attention's inputs) is clipped, and a batch of 3 examples of 5 positions releases 3
    clipped examples, not 5."""
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(4, 2, batch_first=False, dtype=torch.float64)
    model = AttentionModel(mha, "self", masks="padding", need_weights=False).double()
    x = torch.randn(3, 5, 3, dtype=torch.float64)
    y = torch.randn(3, 4, dtype=torch.float64)
    check_model(model, x, 3, _loss(y), bound=0.2)
    clipper = PerSampleClipper(model, max_grad_norm=0.2, loss_reduction="sum")
    _loss(y)(model(x), slice(None)).backward()
    assert clipper.accumulated_examples == 3
    assert clipper.last_per_example_norms.shape == (3,)
    clipper.check_logical_batch(3)
    clipper.remove()


def test_sequence_first_model_input_is_refused() -> None:
    """A model whose input is sequence-first (seq, batch, E) is refused at the first backward
    (the attention sees 2 examples, the model's input 5 rows), never clipped per position."""
    mha = nn.MultiheadAttention(4, 1, batch_first=False)

    class SeqFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mha(x, x, x)[0]

    model = SeqFirst()
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="batch_first"):
        model(torch.randn(5, 2, 4)).sum().backward()
    clipper.remove()


class TransformerModel(nn.Module):
    def __init__(self, kind: str, norm_first: bool, width: int = 8) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(11, width, padding_idx=0)
        if kind == "encoder":
            layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0,
                                               batch_first=True, norm_first=norm_first)
            self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        elif kind == "decoder":
            self.body = nn.TransformerDecoderLayer(width, 2, 2 * width, dropout=0.0,
                                                   batch_first=True, norm_first=norm_first)
        else:
            self.body = nn.Transformer(width, 2, 1, 1, 2 * width, dropout=0.0,
                                       batch_first=True, norm_first=norm_first)
        self.head = nn.Linear(width, 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        pad = idx == 0
        causal = nn.Transformer.generate_square_subsequent_mask(idx.shape[1],
                                                                dtype=h.dtype)
        if self.kind == "encoder":
            h = self.body(h, src_key_padding_mask=pad)
        elif self.kind == "decoder":
            h = self.body(h, 0.5 * h.flip(1), tgt_mask=causal, memory_key_padding_mask=pad)
        else:
            h = self.body(h, h[:, :3], src_key_padding_mask=pad)
        return self.head(h[:, 0])


# nn.Transformer builds its encoder with enable_nested_tensor=True and warns that norm_first
# layers cannot use nested tensors (an inference fast path, irrelevant here)
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("kind", ["encoder", "decoder", "transformer"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_layers_float64(kind: str, norm_first: bool) -> None:
    torch.manual_seed(3)
    model = TransformerModel(kind, norm_first).double()
    idx = torch.randint(0, 11, (5, 4))
    idx[:, 0] = 1  # never an all-padded sequence
    y = torch.randint(0, 3, (5,))

    def loss(out: torch.Tensor, i) -> torch.Tensor:
        return nn.functional.cross_entropy(out, y[i].reshape(-1), reduction="sum")

    check_model(model, idx, 5, loss, bound=0.4)


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 4), length=st.integers(1, 5), norm_first=st.booleans(),
       seed=st.integers(0, 2**16))
def test_transformer_encoder_hypothesis_shapes(batch, length, norm_first, seed) -> None:
    torch.manual_seed(seed)
    model = TransformerModel("encoder", norm_first).double()
    idx = torch.randint(1, 11, (batch, length))
    y = torch.randn(batch, 3, dtype=torch.float64)
    check_model(model, idx, batch, _loss(y), bound=0.3)


def test_transformer_encoder_float32_error() -> None:
    torch.manual_seed(4)
    model = TransformerModel("encoder", False, width=16).double()
    idx = torch.randint(1, 11, (6, 7))
    y = torch.randn(6, 3, dtype=torch.float64)
    ours, plain = float32_error_ratio(model, idx, 6, _loss(y), bound=0.5)
    assert ours <= 8 * plain + 1e-7, (ours, plain)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("layer", [
    lambda: nn.TransformerEncoderLayer(8, 2, 16),
    lambda: nn.TransformerDecoderLayer(8, 2, 16),
    lambda: nn.Transformer(8, 2, 1, 1, 16),
])
def test_sequence_first_transformer_layers_refused_up_front(layer) -> None:
    with pytest.raises(ValueError, match="batch_first=True"):
        PerSampleClipper(layer(), max_grad_norm=1.0)


class _SelfAttention(nn.Module):
    """Linear map in, one self-attention call without attention weights (the call of
    nn.TransformerEncoderLayer), sum over positions out."""

    def __init__(self, mha: nn.MultiheadAttention, causal: bool) -> None:
        super().__init__()
        self.mha, self.causal = mha, causal
        self.inp = nn.Linear(3, mha.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if not self.mha.batch_first:
            h = h.transpose(0, 1)
        kwargs: dict = {"need_weights": False}
        if self.causal:
            length = x.shape[1]
            kwargs["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(
                length, dtype=h.dtype)
            kwargs["is_causal"] = True
        out = self.mha(h, h, h, **kwargs)[0]
        if not self.mha.batch_first:
            out = out.transpose(0, 1)
        return out.sum(1)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_self_attention_route_float64(batch_first: bool, causal: bool,
                                             bias: bool) -> None:
    """Self-attention without masks or weights on the CPU goes through the fused route on the
    packed projection (PackedSelfAttentionFn: strided head views into the flash-attention
    kernel, its backward into the packed layout); its norms and clipped sums equal the float64
    batch-size-1 reference (an error in the route's backward, e.g. the key and value gradients
    swapped, changes every in-projection gradient)."""
    from dpsharp.torch.layers import attention

    torch.manual_seed(5)
    mha = nn.MultiheadAttention(6, 2, bias=bias, batch_first=batch_first, dtype=torch.float64)
    model = _SelfAttention(mha, causal).double()
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    y = torch.randn(4, 6, dtype=torch.float64)
    calls = []
    original = attention.PackedSelfAttentionFn.forward

    def counting(ctx, *args):
        calls.append(args[1:])
        return original(ctx, *args)

    attention.PackedSelfAttentionFn.forward = staticmethod(counting)
    try:
        check_model(model, x, 4, _loss(y), bound=0.3)
    finally:
        attention.PackedSelfAttentionFn.forward = staticmethod(original)
    assert calls == [(2, causal)]  # the clipper's pass took the route (the reference did not)


def test_packed_self_attention_route_values_and_float32_error() -> None:
    """The route's output and input gradient equal nn.MultiheadAttention's own (float64), and
    in float32 the clipper's error through it is a small multiple of plain autograd's."""
    from dpsharp.torch.layers.attention import PackedSelfAttentionFn

    torch.manual_seed(6)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    x = torch.randn(3, 7, 8, dtype=torch.float64, requires_grad=True)
    ref = mha(x, x, x, need_weights=False)[0]
    (ref_grad,) = torch.autograd.grad((ref ** 2).sum(), x)
    x2 = x.detach().clone().requires_grad_()
    packed = nn.functional.linear(x2, mha.in_proj_weight, mha.in_proj_bias)
    ours = mha.out_proj(PackedSelfAttentionFn.apply(packed, 2, False))
    (grad,) = torch.autograd.grad((ours ** 2).sum(), x2)
    assert torch.allclose(ours, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(grad, ref_grad, rtol=1e-12, atol=1e-12)

    model = _SelfAttention(nn.MultiheadAttention(8, 4, batch_first=True,
                                                 dtype=torch.float64), False).double()
    xs = torch.randn(6, 9, 3, dtype=torch.float64)
    ys = torch.randn(6, 8, dtype=torch.float64)
    ours_err, plain_err = float32_error_ratio(model, xs, 6, _loss(ys), bound=0.5)
    assert ours_err <= 8 * plain_err + 1e-7, (ours_err, plain_err)
