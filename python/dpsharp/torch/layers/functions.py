"""Autograd functions that replace the forward of supported layers during DP training.

Their backward returns the input gradient only and ``None`` for the weight and bias: the plain
(summed) parameter gradient is never computed. Instead each backward hands a *usage* (stored
activations + output gradients, see usages.py) to the clipper, which computes per-example norms
and the clipped sum once the whole backward pass has finished. The parameters keep
``requires_grad=True`` so autograd still calls these backwards, even for the first layer.
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from dpsharp.torch import kernels
from dpsharp.torch.layers.usages import (
    AffineUsage,
    ConvUsage,
    EmbeddingUsage,
    LinearUsage,
    PerExampleUsage,
    TransposedLinearUsage,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["LayerHandle", "patch_module"]


class LayerHandle:
    """Connects one patched module to its clipper (``record`` receives finished usages)."""

    def __init__(self, module: nn.Module, record: Callable[[Any], None],
                 scale_of: Callable[[int], float]) -> None:
        self.module = module
        self.record = record
        self.scale_of = scale_of  # batch size -> factor turning output grads into per-example


def _trainable(p: nn.Parameter | None) -> nn.Parameter | None:
    return p if p is not None and p.requires_grad else None


def _as_autocast_reads(x: torch.Tensor) -> torch.Tensor:
    """The input as an autocast-enabled matrix product or convolution reads it: cast to the
    autocast dtype (float16 / bfloat16) when autocast is on for x's device and x is a floating
    tensor other than float64 (torch's own eligibility rule), else x itself.

    A layer's weight gradient under autocast is the product of the output gradient with this
    cast input, so it is what the per-example gradients are made of; keeping it (not the
    float32 input) also lets the norms run on half-precision operands, whose products are
    exact in their float32 accumulation (usages.py; the clipped sums widen them to float32),
    and halves the stored activations."""
    device_type = x.device.type
    if not x.is_floating_point() or x.dtype == torch.float64:
        return x
    if not torch.is_autocast_enabled(device_type):
        return x
    cast = torch.get_autocast_dtype(device_type)
    return x if x.dtype == cast else x.to(cast)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                handle: LayerHandle) -> torch.Tensor:
        ctx.handle = handle
        ctx.input_dtype = x.dtype
        x = _as_autocast_reads(x)
        ctx.save_for_backward(x, weight)
        # One position per example (2-D input): the weight's ghost norm needs only ||x_i||^2
        # (LinearUsage), taken here rather than re-read at the end of the backward pass, and
        # before the product: x is then still in cache from the operation that wrote it (a
        # hidden layer's activation), and the product reads it back from cache in turn. (After
        # the product, streaming the weight has evicted x: on the MLP of bench/, 784-512-512-10
        # at batch 256, the forward took 0.06-0.17 ms longer that way, at 2 and 1 threads.)
        ctx.input_sq = (kernels.per_example_sq_norms(x)
                        if x.dim() == 2 and weight.requires_grad and x.device.type == "cpu"
                        else None)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        handle: LayerHandle = ctx.handle
        # Under autocast the forward ran in a lower precision than the saved weight (and
        # possibly than x): compute in grad_out's dtype, return x's dtype, and give the usage
        # activations and output gradients of one common dtype. (The dtype tests skip no-op
        # conversions: this runs for every layer on every step.)
        dtype = grad_out.dtype
        grad_in = None
        if ctx.needs_input_grad[0]:
            grad_in = grad_out @ (weight if weight.dtype == dtype else weight.to(dtype))
            if grad_in.dtype != ctx.input_dtype:
                grad_in = grad_in.to(ctx.input_dtype)
        if x.dtype != dtype:
            common = torch.promote_types(x.dtype, dtype)
            x, grad_out = x.to(common), grad_out.to(common)
        b = x.shape[0]
        # Explicit middle extent (not -1): a 0-row batch (empty Poisson sample) must reshape too.
        positions = 1 if x.dim() == 2 else math.prod(x.shape[1:-1])
        m = handle.module
        # The usage keeps the loss's output gradient and the loss scale separately (no scaled
        # copy; see usages.py).
        usage_type = getattr(handle, "usage_type", LinearUsage)  # transposed weights: Conv1D
        usage = usage_type(_trainable(m.weight), _trainable(m.bias),
                            x.reshape(b, positions, x.shape[-1]),
                            grad_out.reshape(b, positions, grad_out.shape[-1]),
                            handle.scale_of(b), input_sq=ctx.input_sq)
        if positions == 1 and grad_out.device.type == "cpu":
            usage.out_grad_sq()  # while the output gradient is in cache
        handle.record(usage)
        return grad_in, None, None, None


class _ConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                handle: LayerHandle) -> torch.Tensor:
        ctx.handle = handle
        ctx.input_dtype = x.dtype
        x = _as_autocast_reads(x)
        ctx.save_for_backward(x, weight)
        m = handle.module
        conv = F.conv1d if isinstance(m, nn.Conv1d) else F.conv2d
        return conv(x, weight, bias, m.stride, m.padding, m.dilation, m.groups)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        handle: LayerHandle = ctx.handle
        m = handle.module
        one_d = isinstance(m, nn.Conv1d)
        grad_in = None
        if ctx.needs_input_grad[0]:
            fn = torch.nn.grad.conv1d_input if one_d else torch.nn.grad.conv2d_input
            grad_in = fn(x.shape, weight.to(grad_out.dtype), grad_out, m.stride, m.padding,
                         m.dilation, m.groups).to(ctx.input_dtype)
        common = torch.promote_types(x.dtype, grad_out.dtype)  # autocast: see _LinearFn
        # The input, not its patches (C * prod(kernel) times larger): the usage builds those
        # per chunk of examples when it computes the norms.
        handle.record(ConvUsage(m, _trainable(m.weight), _trainable(m.bias), x.to(common),
                                grad_out.to(common), handle.scale_of(x.shape[0])))
        return grad_in, None, None, None


class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, indices: torch.Tensor, weight: torch.Tensor,
                handle: LayerHandle) -> torch.Tensor:
        ctx.handle = handle
        ctx.save_for_backward(indices)
        return F.embedding(indices, weight, handle.module.padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        (indices,) = ctx.saved_tensors
        handle: LayerHandle = ctx.handle
        m = handle.module
        handle.record(EmbeddingUsage(m.weight, indices, grad_out, m.padding_idx,
                                     handle.scale_of(indices.shape[0])))
        return None, None, None


class _AffineFn(torch.autograd.Function):
    """y = xhat * w + b, with w and b viewed to broadcast against xhat."""

    @staticmethod
    def forward(ctx: Any, xhat: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, handle: LayerHandle,
                view_shape: tuple[int, ...], reduce_dims: tuple[int, ...]) -> torch.Tensor:
        ctx.handle = handle
        ctx.view_shape = view_shape
        ctx.reduce_dims = reduce_dims
        ctx.save_for_backward(xhat, weight)
        if weight is not None and bias is not None:  # one pass, one output buffer
            return torch.addcmul(bias.view(view_shape), xhat, weight.view(view_shape))
        out = xhat * weight.view(view_shape) if weight is not None else xhat
        return out + bias.view(view_shape) if bias is not None else out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        xhat, weight = ctx.saved_tensors
        handle: LayerHandle = ctx.handle
        m = handle.module
        grad_in = None
        if ctx.needs_input_grad[0]:
            grad_in = grad_out * weight.view(ctx.view_shape) if weight is not None else grad_out
        handle.record(AffineUsage(_trainable(m.weight), _trainable(getattr(m, "bias", None)),
                                  xhat, grad_out,
                                  ctx.reduce_dims, handle.scale_of(grad_out.shape[0])))
        return grad_in, None, None, None, None, None


class _LayerNormFn(torch.autograd.Function):
    """LayerNorm with an affine part in torch's fused kernels: the forward saves what the plain
    layer saves (input, mean, 1/std), the backward computes the input gradient with the plain
    fused backward and rebuilds xhat = (x - mean) / std only to form the per-example affine
    gradients (no normalised copy is kept between the forward and the backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                handle: LayerHandle, normalized_shape: tuple[int, ...],
                eps: float) -> torch.Tensor:
        out, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
        ctx.handle = handle
        ctx.normalized_shape = normalized_shape
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x, mean, rstd, weight, bias = ctx.saved_tensors
        handle: LayerHandle = ctx.handle
        m = handle.module
        grad_in = None
        if ctx.needs_input_grad[0]:
            grad_in = torch.ops.aten.native_layer_norm_backward(
                grad_out, x, ctx.normalized_shape, mean, rstd, weight, bias,
                [True, False, False])[0]
        w, b = _trainable(m.weight), _trainable(m.bias)
        scale = handle.scale_of(grad_out.shape[0])
        if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
                and grad_out.dtype == x.dtype):
            # One pass over x and the output gradient (no normalised copy; kernels.py).
            w_rows, b_rows = kernels.layer_norm_affine_rows(
                x, mean, rstd, grad_out, len(ctx.normalized_shape), weight=w is not None,
                bias=b is not None)
            handle.record(AffineUsage.from_rows(w, b, w_rows, b_rows, scale))
        else:
            xhat = (x - mean) * rstd
            reduce_dims = tuple(range(1, x.dim() - len(ctx.normalized_shape)))
            handle.record(AffineUsage(w, b, xhat, grad_out, reduce_dims, scale))
        return grad_in, None, None, None, None, None


class _EmbeddingBagFn(torch.autograd.Function):
    """nn.EmbeddingBag (mode "sum" or "mean") on 2-D indices (B, N), one bag per example:
    y_i = sum_n w_{i,n} W[idx_{i,n}], w the per-sample weights (sum) or 1 / (the bag's
    non-padding count) (mean), so g_i(W) = sum_n onehot(idx_{i,n}) (w_{i,n} gy_i)^T: an
    embedding lookup whose output gradient at position n is w_{i,n} gy_i."""

    @staticmethod
    def forward(ctx: Any, indices: torch.Tensor, weight: torch.Tensor,
                per_sample_weights: torch.Tensor | None, handle: LayerHandle) -> torch.Tensor:
        m = handle.module
        ctx.handle = handle
        ctx.save_for_backward(indices, weight, per_sample_weights)
        return F.embedding_bag(indices, weight, None, None, m.norm_type,
                               m.scale_grad_by_freq, m.mode, m.sparse, per_sample_weights,
                               m.include_last_offset, m.padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        indices, weight, psw = ctx.saved_tensors
        handle: LayerHandle = ctx.handle
        m = handle.module
        if m.mode == "sum":
            w = (psw.to(grad_out.dtype) if psw is not None
                 else torch.ones(indices.shape, dtype=grad_out.dtype, device=grad_out.device))
        else:
            kept = (indices != m.padding_idx) if m.padding_idx is not None else (
                torch.ones(indices.shape, dtype=torch.bool, device=indices.device))
            count = kept.sum(dim=1, keepdim=True).clamp_min(1).to(grad_out.dtype)
            w = kept.to(grad_out.dtype) / count
        per_position = w.unsqueeze(-1) * grad_out.unsqueeze(1)  # (B, N, d)
        handle.record(EmbeddingUsage(m.weight, indices, per_position, m.padding_idx,
                                     handle.scale_of(indices.shape[0])))
        grad_psw = None
        if psw is not None and ctx.needs_input_grad[2]:
            rows = F.embedding(indices, weight.to(grad_out.dtype), m.padding_idx)
            grad_psw = (rows * grad_out.unsqueeze(1)).sum(-1).to(psw.dtype)
        return None, None, grad_psw, None


class _FallbackCall:
    """One call of a fallback module: its arguments and keyword arguments flattened
    (torch.utils._pytree) into leaves, of which the tensors with the batch in dimension 0
    (``batched``) are mapped over per example and every other leaf (non-tensors, tensors
    without the batch dimension such as a shared (L, L) mask) is passed to each example as
    is; and, after the forward, the output's structure."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        from torch.utils import _pytree

        leaves, self.spec = _pytree.tree_flatten((args, kwargs))
        batch = next((int(x.shape[0]) for x in leaves
                      if isinstance(x, torch.Tensor) and x.dim() >= 1), None)
        if batch is None:
            raise ValueError("DP training needs batched inputs (a tensor argument whose "
                             "dimension 0 is the batch)")
        self.batch = batch
        self.leaves = leaves
        self.batched = [isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == batch
                        for x in leaves]
        for x, b in zip(leaves, self.batched):
            if isinstance(x, torch.Tensor) and not b and x.requires_grad:
                raise ValueError(
                    "the per-example fallback needs every tensor argument that requires grad "
                    f"to have the batch ({batch}) in dimension 0; got one of shape "
                    f"{tuple(x.shape)}"
                )
        self.out_spec: Any = None
        self.out_leaves: list[Any] = []
        self.out_tensor_index: list[int] = []  # positions of the tensor leaves in out_leaves

    def inputs(self) -> list[torch.Tensor]:
        return [x for x, b in zip(self.leaves, self.batched) if b]

    def rebuild(self, batched: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from torch.utils import _pytree

        it = iter(batched)
        leaves = [next(it) if b else x for x, b in zip(self.leaves, self.batched)]
        return _pytree.tree_unflatten(leaves, self.spec)


class _FallbackFn(torch.autograd.Function):
    """Any other module with parameters: per-example gradients by torch.func (vmap of vjp),
    which also yields the input gradient. The module is run once more per example inside
    the backward (a recomputation, not stored intermediates); those per-example outputs must
    equal the forward's (checked), so an argument mistaken for a batched one cannot give
    wrong gradients silently. Keyword arguments, non-tensor arguments and nested outputs
    (tuples, dicts, Hugging Face ModelOutput) pass through; every floating-point output with
    the batch in dimension 0 is differentiated."""

    @staticmethod
    def forward(ctx: Any, handle: LayerHandle, call: _FallbackCall, n_inputs: int,
                *tensors: torch.Tensor) -> Any:
        from torch.utils import _pytree

        inputs = tensors[:n_inputs]
        params = tensors[n_inputs:]
        ctx.handle = handle
        ctx.call = call
        names = handle.param_names  # type: ignore[attr-defined]
        with torch.no_grad():
            args, kwargs = call.rebuild(inputs)
            out = torch.func.functional_call(handle.module, dict(zip(names, params)), args,
                                             kwargs)
        leaves, call.out_spec = _pytree.tree_flatten(out)
        call.out_leaves = leaves
        call.out_tensor_index = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        outs = tuple(leaves[k] for k in call.out_tensor_index)
        ctx.differentiable = [x.is_floating_point() and x.dim() >= 1
                              and x.shape[0] == call.batch for x in outs]
        ctx.mark_non_differentiable(*(x for x, d in zip(outs, ctx.differentiable) if not d))
        ctx.save_for_backward(*inputs, *(x for x, d in zip(outs, ctx.differentiable) if d))
        ctx.n_inputs = n_inputs
        return outs

    @staticmethod
    def backward(ctx: Any, *grad_outs: torch.Tensor | None) -> tuple[Any, ...]:
        from torch.utils import _pytree

        saved = ctx.saved_tensors
        inputs, outputs = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
        handle: LayerHandle = ctx.handle
        call: _FallbackCall = ctx.call
        module = handle.module
        names: list[str] = handle.param_names  # type: ignore[attr-defined]
        params = tuple(p.detach() for p in handle.param_objects)  # type: ignore[attr-defined]
        float_mask = [x.is_floating_point() for x in inputs]
        grads = tuple(g if g is not None else torch.zeros_like(o) for g, o in
                      zip((g for g, d in zip(grad_outs, ctx.differentiable) if d), outputs))
        tensor_index = call.out_tensor_index
        differentiable = ctx.differentiable

        def one_example(params_: tuple[torch.Tensor, ...], float_inputs: tuple[torch.Tensor, ...],
                        other_inputs: tuple[torch.Tensor, ...],
                        g: tuple[torch.Tensor, ...]) -> Any:
            def f(ps: tuple[torch.Tensor, ...],
                  fx: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
                fi, oi = iter(fx), iter(other_inputs)
                full = [(next(fi) if flt else next(oi)).unsqueeze(0) for flt in float_mask]
                args, kwargs = call.rebuild(full)
                out = torch.func.functional_call(module, dict(zip(names, ps)), args, kwargs)
                leaves = _pytree.tree_flatten(out)[0]
                tensors = [leaves[k] for k in tensor_index]
                return tuple(t.squeeze(0) for t, d in zip(tensors, differentiable) if d)

            out, vjp_fn = torch.func.vjp(f, params_, float_inputs)
            return vjp_fn(g), out

        float_inputs = tuple(x for x, flt in zip(inputs, float_mask) if flt)
        other_inputs = tuple(x for x, flt in zip(inputs, float_mask) if not flt)
        handle.bypass = True  # type: ignore[attr-defined]
        try:
            (grad_params, grad_inputs), recomputed = torch.func.vmap(
                one_example, in_dims=(None, 0, 0, 0), randomness="error"
            )(params, float_inputs, other_inputs, grads)
        finally:
            handle.bypass = False  # type: ignore[attr-defined]
        for again, original in zip(recomputed, outputs):
            tol = 1e-9 if original.dtype == torch.float64 else 1e-3
            if again.shape != original.shape or not torch.allclose(
                    again, original, rtol=tol, atol=tol * float(original.abs().max().clamp_min(1))):
                raise ValueError(
                    f"the per-example fallback for {type(module).__name__} recomputed each "
                    "example alone and got another output than the batched forward: an "
                    "argument has the batch size in dimension 0 without being batched, or "
                    "examples interact (the batch must be dimension 0 of every batched "
                    "argument, and examples must not mix)"
                )
        b = call.batch
        scale = handle.scale_of(b)
        per_param = {}
        for p, gp in zip(handle.param_objects, grad_params):  # type: ignore[attr-defined]
            if p.requires_grad:
                per_param[id(p)] = (p, gp * scale if scale != 1.0 else gp)
        handle.record(PerExampleUsage(per_param, b))
        gi_iter = iter(grad_inputs)
        input_grads = []
        for flt, needs in zip(float_mask, ctx.needs_input_grad[3:]):
            gi = next(gi_iter) if flt else None
            input_grads.append(gi if needs else None)
        return (None, None, None, *input_grads, *([None] * len(names)))


def _any_trainable(params: Sequence[nn.Parameter | None]) -> bool:
    return any(p is not None and p.requires_grad for p in params)


def _single_input(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The one input of a single-input layer's forward, given by position or by its keyword
    (``input`` for torch's layers, ``x`` for Hugging Face's Conv1D)."""
    if len(args) + len(kwargs) != 1:
        raise TypeError(f"{type(module).__name__}.forward() takes one input, got "
                        f"{len(args)} positional and {len(kwargs)} keyword arguments")
    return args[0] if args else next(iter(kwargs.values()))


def patch_module(module: nn.Module, kind: str, handle: LayerHandle) -> None:
    """Replace ``module.forward`` (an instance attribute; ``del module.forward`` restores it)."""
    original = type(module).forward.__get__(module)

    if kind in ("linear", "hf_conv1d"):
        # GPT-2's Conv1D is a linear map whose weight is stored transposed (in, out).
        transposed = kind == "hf_conv1d"
        if transposed:
            handle.usage_type = TransposedLinearUsage  # type: ignore[attr-defined]

        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            x = _single_input(module, args, kwargs)
            weight, bias = module.weight, module.bias
            if not (torch.is_grad_enabled()
                    and (weight.requires_grad or (bias is not None and bias.requires_grad))):
                return original(x)
            if x.dim() < 2:
                raise ValueError("DP training needs batched inputs (a leading batch dimension)")
            return _LinearFn.apply(x, weight.t() if transposed else weight, bias, handle)
    elif kind == "conv":
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            x = _single_input(module, args, kwargs)
            if not torch.is_grad_enabled() or not _any_trainable([module.weight, module.bias]):
                return original(x)
            expected = 3 if isinstance(module, nn.Conv1d) else 4
            if x.dim() != expected:
                raise ValueError(f"DP training needs batched {expected}-D inputs for "
                                 f"{type(module).__name__}, got {x.dim()}-D")
            return _ConvFn.apply(x, module.weight, module.bias, handle)
    elif kind == "embedding":
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            x = _single_input(module, args, kwargs)
            if not torch.is_grad_enabled() or not module.weight.requires_grad:
                return original(x)
            if x.dim() < 1:
                raise ValueError("DP training needs batched inputs (a leading batch dimension)")
            batch = getattr(handle, "forward_batch", lambda: None)()
            if x.dim() >= 2 and x.shape[0] == 1 and batch is not None and batch > 1:
                # Indices shared by the whole batch (position ids of shape (1, T), as Hugging
                # Face models build them), whose lookup is broadcast against the batch later:
                # looked up once per example instead, the same values, so that each example's
                # output has its own gradient (a (1, T) lookup's gradient is the batch's sum).
                x = x.expand(batch, *x.shape[1:])
            return _EmbeddingFn.apply(x, module.weight, handle)
    elif kind == "embeddingbag":
        def forward(x: torch.Tensor, offsets: torch.Tensor | None = None,
                    per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
            if not torch.is_grad_enabled() or not module.weight.requires_grad:
                return original(x, offsets, per_sample_weights)
            if x.dim() != 2 or offsets is not None:
                raise ValueError(
                    "DP training of nn.EmbeddingBag needs 2-D indices (batch, bag size), one bag "
                    "per example, and no offsets: with 1-D indices and offsets the bags are not "
                    "the batch dimension; pad the bags to one length with padding_idx instead"
                )
            return _EmbeddingBagFn.apply(x, module.weight, per_sample_weights, handle)
    elif kind == "mha":
        from dpsharp.torch.layers.attention import multihead_attention_forward

        def forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                    attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                    is_causal: bool = False) -> Any:
            if not torch.is_grad_enabled() or not _any_trainable(list(module.parameters())):
                return original(query, key, value, key_padding_mask, need_weights, attn_mask,
                                average_attn_weights, is_causal)
            return multihead_attention_forward(module, handle, query, key, value,
                                               key_padding_mask, need_weights, attn_mask,
                                               average_attn_weights, is_causal)
    elif kind in ("rmsnorm", "llama_rmsnorm"):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if not torch.is_grad_enabled() or not _any_trainable([module.weight]):
                return original(x)
            if kind == "rmsnorm":
                shape = tuple(module.normalized_shape)
                xhat = F.rms_norm(x, shape, None, module.eps)
            else:  # Hugging Face LlamaRMSNorm: normalised in float32, cast back, then scaled
                shape = (x.shape[-1],)
                h = x.to(torch.float32)
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
                xhat = h.to(x.dtype)
            reduce_dims = tuple(range(1, x.dim() - len(shape)))
            return _AffineFn.apply(xhat, module.weight, None, handle, shape, reduce_dims)
    elif kind == "layernorm":
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            x = _single_input(module, args, kwargs)
            if not torch.is_grad_enabled() or not _any_trainable([module.weight, module.bias]):
                return original(x)
            k = len(module.normalized_shape)
            if (module.weight is not None and module.bias is not None
                    and not torch.is_autocast_enabled(x.device.type)):
                return _LayerNormFn.apply(x, module.weight, module.bias, handle,
                                          tuple(module.normalized_shape), module.eps)
            xhat = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
            view_shape = tuple(module.normalized_shape)
            reduce_dims = tuple(range(1, x.dim() - k))
            return _AffineFn.apply(xhat, module.weight, module.bias, handle, view_shape,
                                   reduce_dims)
    elif kind == "groupnorm":
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            x = _single_input(module, args, kwargs)
            if not torch.is_grad_enabled() or not _any_trainable([module.weight, module.bias]):
                return original(x)
            xhat = F.group_norm(x, module.num_groups, None, None, module.eps)
            view_shape = (module.num_channels,) + (1,) * (x.dim() - 2)
            reduce_dims = tuple(range(2, x.dim()))
            return _AffineFn.apply(xhat, module.weight, module.bias, handle, view_shape,
                                   reduce_dims)
    elif kind == "fallback":
        named = list(module.named_parameters())
        handle.param_names = [n for n, _ in named]  # type: ignore[attr-defined]
        handle.param_objects = [p for _, p in named]  # type: ignore[attr-defined]
        handle.bypass = False  # type: ignore[attr-defined]

        def forward(*args: Any, **kwargs: Any) -> Any:
            if (handle.bypass  # type: ignore[attr-defined]
                    or not torch.is_grad_enabled()
                    or not _any_trainable(handle.param_objects)):  # type: ignore[attr-defined]
                return original(*args, **kwargs)
            from torch.utils import _pytree

            call = _FallbackCall(args, kwargs)
            inputs = call.inputs()
            outs = _FallbackFn.apply(handle, call, len(inputs), *inputs,
                                     *handle.param_objects)  # type: ignore[attr-defined]
            leaves = list(call.out_leaves)
            for k, t in zip(call.out_tensor_index, outs):
                leaves[k] = t
            return _pytree.tree_unflatten(leaves, call.out_spec)
    else:  # pragma: no cover - internal
        raise AssertionError(kind)
    module.forward = forward  # type: ignore[method-assign]
