"""nn.MultiheadAttention for per-example clipping: its parameters as linear maps.

Every parameter of ``nn.MultiheadAttention`` enters the output through a linear map of the
inputs or by being appended to the keys / values (Vaswani et al. 2017, section 3.2.2):

* the in-projection q = x_q W_q^T + b_q, k = x_k W_k^T + b_k, v = x_v W_v^T + b_v, with
  W_q, W_k, W_v the row blocks of ``in_proj_weight`` (or the separate ``q_proj_weight`` ...
  when kdim / vdim differ from embed_dim) and b_q, b_k, b_v the blocks of ``in_proj_bias``;
* ``bias_k`` / ``bias_v`` (add_bias_kv=True): one extra key / value position per example,
  whose per-example gradient is the gradient of that position;
* ``out_proj``: an nn.Linear, patched as one.

So the attention is run here from those linear maps (the same operations, in the same order,
as ``torch.nn.functional.multi_head_attention_forward``) with the batch in dimension 0
internally, whatever ``batch_first`` says: a sequence-first call (batch_first=False, inputs
(L, B, E)) is transposed in and out, and every per-example gradient belongs to an example
(dimension 1 of its inputs), never to a position. The projections record their stored inputs
and output gradients (a :class:`~dpsharp.torch.layers.usages.LinearUsage` per block, one
:class:`~dpsharp.torch.layers.usages.BlockUsage` per call when the blocks see different
inputs), so the norms are ghost norms and the clipped sums book-keeping contractions, as for
nn.Linear.

Self-attention on the CPU without masks, attention weights or dropout (the call every
nn.TransformerEncoderLayer makes in training) takes a shorter route to the same operations:
the heads of q, k and v are read as strided views of the packed projection (B, L, 3E) and
handed to the fused attention kernel that ``F.scaled_dot_product_attention`` runs there (its
flash-attention kernel), whose output (B, L, H, hd) already is the out-projection's input;
its backward writes the three input gradients side by side into one (B, L, 3E) tensor. Same
kernels, same values, but none of the head reshapes, each a copy forward and backward
(:class:`PackedSelfAttentionFn`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F

from dpsharp.torch.layers.usages import AffineUsage, BlockUsage, LinearUsage

if TYPE_CHECKING:
    from torch import nn

    from dpsharp.torch.layers.functions import LayerHandle

__all__ = ["PackedSelfAttentionFn", "ProjectionFn", "multihead_attention_forward"]


class ProjectionFn(torch.autograd.Function):
    """y = x W^T + b for a weight ``W`` that may be a block (view) of a parameter; the backward
    returns the input gradient only and hands (x, gy) as (B, T, d), (B, T, p) to ``sink``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                sink: Callable[[torch.Tensor, torch.Tensor], None]) -> torch.Tensor:
        ctx.sink = sink
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        dtype = grad_out.dtype
        grad_in = None
        if ctx.needs_input_grad[0]:
            grad_in = grad_out @ (weight if weight.dtype == dtype else weight.to(dtype))
            if x.dtype != dtype:
                grad_in = grad_in.to(x.dtype)
        if x.dtype != dtype:  # autocast: one common dtype for the usage
            common = torch.promote_types(x.dtype, dtype)
            x, grad_out = x.to(common), grad_out.to(common)
        b = x.shape[0]
        positions = 1 if x.dim() == 2 else math.prod(x.shape[1:-1])
        ctx.sink(x.reshape(b, positions, x.shape[-1]),
                 grad_out.reshape(b, positions, grad_out.shape[-1]))
        return grad_in, None, None, None


class AppendPositionFn(torch.autograd.Function):
    """cat([t, p broadcast to (B, 1, E)], dim=1) for t (B, S, E) and a parameter p of E
    elements; p's per-example gradient is the output gradient at the appended position."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, param: torch.Tensor,
                handle: LayerHandle) -> torch.Tensor:
        ctx.handle = handle
        ctx.param = param
        row = param.reshape(1, 1, -1).to(t.dtype).expand(t.shape[0], 1, t.shape[2])
        return torch.cat([t, row], dim=1)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        handle: LayerHandle = ctx.handle
        param = ctx.param
        b = grad_out.shape[0]
        rows = grad_out[:, -1].reshape((b, *param.shape)).contiguous()
        handle.record(AffineUsage.from_rows(param, None, rows, None, handle.scale_of(b)))
        return grad_out[:, :-1], None, None


def _head_views(packed: torch.Tensor,
                heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (B, H, L, hd) strided views of the packed projection (B, L, 3E): column
    block j of y = x [W_q; W_k; W_v]^T + b, head h its columns [h hd, (h + 1) hd)."""
    b, length, three_e = packed.shape
    e = three_e // 3
    hd = e // heads
    return tuple(  # type: ignore[return-value]
        packed[..., j * e:(j + 1) * e].view(b, length, heads, hd).transpose(1, 2)
        for j in range(3))


class PackedSelfAttentionFn(torch.autograd.Function):
    """softmax(q_h k_h^T / sqrt(hd) [+ causal mask]) v_h per head h, the heads side by side:
    (B, L, E) from the packed projection (B, L, 3E), by the CPU flash-attention kernel of
    ``F.scaled_dot_product_attention`` on strided views (no head reshapes). The backward is that
    kernel's backward, its three gradients concatenated into the packed layout."""

    @staticmethod
    def forward(ctx: Any, packed: torch.Tensor, heads: int, is_causal: bool) -> torch.Tensor:
        q, k, v = _head_views(packed, heads)
        out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal)
        ctx.save_for_backward(packed, out, logsumexp)
        ctx.heads, ctx.is_causal = heads, is_causal
        b, _, length, hd = out.shape
        # the kernel's output is laid out (B, L, H, hd): a view, no copy
        return out.transpose(1, 2).reshape(b, length, heads * hd)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        packed, out, logsumexp = ctx.saved_tensors
        q, k, v = _head_views(packed, ctx.heads)
        b, length, e = grad_out.shape
        grad_heads = grad_out.reshape(b, length, ctx.heads, e // ctx.heads).transpose(1, 2)
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_heads, q, k, v, out, logsumexp, 0.0, ctx.is_causal)
        return torch.cat([g.transpose(1, 2).reshape(b, length, e) for g in grads], dim=-1), \
            None, None


_FLASH = 1  # torch._fused_sdp_choice's code of the flash-attention kernel (SDPBackend)


def _packed_flash_attention(module: nn.MultiheadAttention, query: torch.Tensor,
                            key: torch.Tensor, value: torch.Tensor, attn_mask: Any,
                            key_padding_mask: Any, need_weights: bool,
                            dropout_p: float) -> bool:
    """Whether the call is a CPU self-attention that :class:`PackedSelfAttentionFn` computes:
    one input tensor, the packed in-projection, no extra key / value positions, no masks other
    than the causal hint, no attention weights returned and no dropout."""
    return (query.device.type == "cpu" and query is key and key is value
            and module._qkv_same_embed_dim and module.bias_k is None
            and module.bias_v is None and not module.add_zero_attn and not need_weights
            and attn_mask is None and key_padding_mask is None and dropout_p == 0.0
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
            and hasattr(torch, "_fused_sdp_choice"))


def _trainable(p: Any) -> Any:
    return p if p is not None and p.requires_grad else None


def _in_projection(module: nn.MultiheadAttention, handle: LayerHandle,
                   inputs: list[torch.Tensor], *,
                   keep_packed: bool = False) -> list[torch.Tensor]:
    """q, k, v (each (B, *, E)) from the batch-first inputs, by one linear map per group of
    roles that share an input tensor (self-attention: one map with the packed weight).
    ``keep_packed``: a group's output is returned whole, (B, *, E per role), not split."""
    e = module.embed_dim
    packed = module._qkv_same_embed_dim
    bias = module.in_proj_bias
    groups: list[list[int]] = []
    for role in range(3):
        if packed and groups and inputs[role] is inputs[groups[-1][-1]]:
            groups[-1].append(role)
        else:
            groups.append([role])
    separate = [module.q_proj_weight, module.k_proj_weight, module.v_proj_weight]
    block: BlockUsage | None = None
    if len(groups) > 1 or not packed:
        block = BlockUsage()
    outputs: list[torch.Tensor] = []
    for roles in groups:
        rows = slice(roles[0] * e, (roles[-1] + 1) * e)
        param_w = module.in_proj_weight if packed else separate[roles[0]]
        w_rows = rows if packed else None
        weight = param_w[w_rows] if w_rows is not None else param_w
        b = bias[rows] if bias is not None else None
        train_w, train_b = _trainable(param_w), _trainable(bias)
        x = inputs[roles[0]]
        if train_w is None and train_b is None:
            y = F.linear(x, weight, b)
        elif block is None:  # the packed weight and bias used whole: one plain usage
            def sink(a: torch.Tensor, g: torch.Tensor, w: Any = train_w,
                     bb: Any = train_b) -> None:
                handle.record(LinearUsage(w, bb, a, g, handle.scale_of(a.shape[0])))

            y = ProjectionFn.apply(x, weight, b, sink)
        else:
            stand_w = None if train_w is None else (
                param_w.detach()[w_rows] if w_rows is not None else param_w)
            stand_b = None if train_b is None else bias.detach()[rows]
            targets: dict[int, tuple[Any, Any]] = {}
            if stand_w is not None:
                targets[id(stand_w)] = (param_w, w_rows)
            if stand_b is not None:
                targets[id(stand_b)] = (bias, rows)

            def sink(a: torch.Tensor, g: torch.Tensor, sw: Any = stand_w, sb: Any = stand_b,
                     tg: dict[int, tuple[Any, Any]] = targets,
                     blk: BlockUsage = block) -> None:
                if blk.add(LinearUsage(sw, sb, a, g, handle.scale_of(a.shape[0])), tg):
                    handle.record(blk)

            y = ProjectionFn.apply(x, weight, b, sink)
        outputs.extend(y.chunk(len(roles), dim=-1) if len(roles) > 1 and not keep_packed
                       else [y])
    return outputs


def _append(t: torch.Tensor, param: torch.Tensor, handle: LayerHandle) -> torch.Tensor:
    if param.requires_grad:
        return AppendPositionFn.apply(t, param, handle)
    return torch.cat([t, param.reshape(1, 1, -1).to(t.dtype).expand(t.shape[0], 1, -1)], 1)


def multihead_attention_forward(module: nn.MultiheadAttention, handle: LayerHandle,
                                query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                key_padding_mask: torch.Tensor | None = None,
                                need_weights: bool = True,
                                attn_mask: torch.Tensor | None = None,
                                average_attn_weights: bool = True,
                                is_causal: bool = False) -> tuple[torch.Tensor, Any]:
    """``module(query, key, value, ...)`` for a batched call, with the signature and results
    of ``nn.MultiheadAttention.forward``."""
    if query.dim() != 3:
        raise ValueError(
            "DP training needs batched inputs for nn.MultiheadAttention (3-D query, key and "
            f"value with a batch dimension), got a {query.dim()}-D query"
        )
    if not module.batch_first:  # (L, B, E) -> (B, L, E), keeping which inputs are the same
        moved: dict[int, torch.Tensor] = {}
        query, key, value = (moved.setdefault(id(t), t.transpose(0, 1))
                             for t in (query, key, value))
    bsz, tgt_len, embed_dim = query.shape
    heads = module.num_heads
    head_dim = embed_dim // heads
    if embed_dim != module.embed_dim:
        raise ValueError(f"query has embedding dimension {embed_dim}, the module expects "
                         f"{module.embed_dim}")
    if key.shape[:2] != value.shape[:2] or key.shape[0] != bsz:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must share the "
                         f"batch ({bsz}) and sequence dimensions")

    key_padding_mask = F._canonical_mask(
        mask=key_padding_mask, mask_name="key_padding_mask",
        other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
        target_type=query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None
    else:
        attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None,
                                      other_name="", target_type=query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False

    dropout_p = module.dropout if module.training else 0.0
    if _packed_flash_attention(module, query, key, value, attn_mask, key_padding_mask,
                               need_weights, dropout_p):
        (packed,) = _in_projection(module, handle, [query, key, value], keep_packed=True)
        if torch._fused_sdp_choice(*_head_views(packed, heads), None, 0.0,
                                   is_causal) == _FLASH:
            out = module.out_proj(PackedSelfAttentionFn.apply(packed, heads, is_causal))
            return (out.transpose(0, 1) if not module.batch_first else out), None
        q, k, v = packed.chunk(3, dim=-1)  # another kernel chosen: the general route
    else:
        q, k, v = _in_projection(module, handle, [query, key, value])
    src_len = k.shape[1]
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, "
                                   f"but should be {(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.dim() == 3:
            if tuple(attn_mask.shape) != (bsz * heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, "
                                   f"but should be {(bsz * heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")
    if module.bias_k is not None and module.bias_v is not None:
        k = _append(k, module.bias_k, handle)
        v = _append(v, module.bias_v, handle)
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, 1))
    # (B, S, E) -> (B H, S, hd), example-major: row b H + h, as the sequence-first original
    q = q.reshape(bsz, tgt_len, heads, head_dim).transpose(1, 2).reshape(bsz * heads, tgt_len,
                                                                          head_dim)
    k = k.reshape(bsz, k.shape[1], heads, head_dim).transpose(1, 2).reshape(bsz * heads, -1,
                                                                            head_dim)
    v = v.reshape(bsz, v.shape[1], heads, head_dim).transpose(1, 2).reshape(bsz * heads, -1,
                                                                            head_dim)
    if module.add_zero_attn:
        zeros = torch.zeros((bsz * heads, 1, head_dim), dtype=k.dtype, device=k.device)
        k = torch.cat([k, zeros], dim=1)
        v = torch.cat([v, zeros.to(v.dtype)], dim=1)
        if attn_mask is not None:
            attn_mask = F.pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, 1))
    src_len = k.shape[1]
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise RuntimeError(f"expected key_padding_mask of shape {(bsz, src_len)}, got "
                               f"{tuple(key_padding_mask.shape)}")
        kpm = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, heads, -1, -1)
               .reshape(bsz * heads, 1, src_len))
        attn_mask = kpm if attn_mask is None else attn_mask + kpm

    if need_weights:
        q_scaled = q * math.sqrt(1.0 / float(head_dim))
        if attn_mask is not None:
            weights = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
        else:
            weights = torch.bmm(q_scaled, k.transpose(-2, -1))
        weights = F.softmax(weights, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = torch.bmm(weights, v)  # (B H, L, hd)
        out = out.reshape(bsz, heads, tgt_len, head_dim).transpose(1, 2).reshape(
            bsz, tgt_len, embed_dim)
        weights = weights.view(bsz, heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
    else:
        if attn_mask is not None:
            if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(0)
            else:
                attn_mask = attn_mask.view(bsz, heads, -1, src_len)
        out = F.scaled_dot_product_attention(
            q.view(bsz, heads, tgt_len, head_dim), k.view(bsz, heads, src_len, head_dim),
            v.view(bsz, heads, src_len, head_dim), attn_mask, dropout_p, is_causal)
        out = out.transpose(1, 2).reshape(bsz, tgt_len, embed_dim)
        weights = None
    out = module.out_proj(out)  # a patched nn.Linear on (B, L, E)
    if not module.batch_first:
        out = out.transpose(0, 1)
    return out, weights
