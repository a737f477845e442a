"""Batch-size-1 autograd reference for per-example clipping of whole models.

For each example i the gradient of the loss on {example i} alone, by plain autograd on an
unpatched copy of the model; the clipped sum is sum_i min(1, C / ||g_i||) g_i (Abadi et al.
2016, Algorithm 1). Inputs are dicts of batched tensors (dimension 0 the batch) passed to the
model as keyword arguments, or one tensor passed positionally.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from dpsharp.torch import NoiseGenerator, PerSampleClipper


def _slice(inputs: Any, i: int) -> Any:
    if isinstance(inputs, dict):
        return {k: v[i:i + 1] if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return inputs[i:i + 1]


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def per_example_grads(model: torch.nn.Module, inputs: Any, batch: int,
                      loss_fn: Callable[[Any, int], torch.Tensor]) -> list[torch.Tensor]:
    """(B, *p.shape) per trainable parameter; ``loss_fn(output, i)`` is example i's loss."""
    ref = copy.deepcopy(model)
    params = [p for p in ref.parameters() if p.requires_grad]
    rows = []
    for i in range(batch):
        ref.zero_grad(set_to_none=True)
        loss_fn(_call(ref, _slice(inputs, i)), i).backward()
        rows.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                     for p in params])
    return [torch.stack([r[k] for r in rows]) for k in range(len(params))]


def clipped_sums(per_example: list[torch.Tensor],
                 bound: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(norms in float64, clipped sums in float64) for flat clipping at ``bound``."""
    sq = torch.stack([(g.double().reshape(g.shape[0], -1) ** 2).sum(1) for g in per_example], 1)
    norms = sq.sum(1).sqrt()
    factors = torch.clamp(bound / norms, max=1.0)
    sums = [(factors.reshape(-1, *[1] * (g.dim() - 1)) * g.double()).sum(0)
            for g in per_example]
    return norms, sums


def clipper_sums(model: torch.nn.Module, inputs: Any, batch: int,
                 loss_fn: Callable[[Any, slice], torch.Tensor], *, bound: float
                 ) -> tuple[torch.Tensor, list[torch.Tensor], PerSampleClipper]:
    """The clipper's per-example norms and clipped sums (noise 0, B_expected = 1), with a
    sum-reduced loss ``loss_fn(output, slice(None))``. Checks that no plain gradient was
    formed."""
    model.zero_grad(set_to_none=True)
    clipper = PerSampleClipper(model, max_grad_norm=bound, loss_reduction="sum")
    loss_fn(_call(model, inputs), slice(None)).backward()
    norms = clipper.last_per_example_norms.clone()
    for p in clipper.parameters:
        assert p.grad is None, "the plain gradient must not be computed"
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    sums = [p.grad.clone() for p in clipper.parameters]
    clipper.remove()
    return norms, sums, clipper


def check_model(model: torch.nn.Module, inputs: Any, batch: int,
                loss_fn: Callable[[Any, Any], torch.Tensor], *, bound: float = 0.3,
                atol: float = 1e-10) -> None:
    """float64: the clipper's norms and clipped sums equal the reference to ``atol`` (relative
    to the sums' scale), and every clipped per-example norm is <= C (1 + 1e-6)."""
    per_example = per_example_grads(model, inputs, batch, loss_fn)
    ref_norms, ref_sums = clipped_sums(per_example, bound)
    norms, sums, _ = clipper_sums(model, inputs, batch, loss_fn, bound=bound)
    assert torch.allclose(norms.double(), ref_norms, rtol=atol, atol=atol), (norms, ref_norms)
    for got, want in zip(sums, ref_sums):
        assert torch.allclose(got.double(), want, rtol=0, atol=atol), (got - want).abs().max()
    # the clipper's factors applied to the true norms: each clipped example is within C
    factors = torch.clamp(bound / norms.double(), max=1.0)
    assert bool((factors * ref_norms <= bound * (1 + 1e-6)).all())


def float32_error_ratio(model64: torch.nn.Module, inputs64: Any, batch: int,
                        loss_fn: Callable[[Any, Any], torch.Tensor], *,
                        bound: float = 0.3) -> tuple[float, float]:
    """(clipper's float32 error, plain float32 autograd's error), each the largest absolute
    deviation of the clipped sums from the float64 reference (same weights and inputs)."""
    ref_norms, ref_sums = clipped_sums(per_example_grads(model64, inputs64, batch, loss_fn),
                                       bound)
    model32 = copy.deepcopy(model64).float()
    inputs32 = ({k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                 for k, v in inputs64.items()} if isinstance(inputs64, dict)
                else (inputs64.float() if inputs64.is_floating_point() else inputs64))
    _, plain = clipped_sums(per_example_grads(model32, inputs32, batch, loss_fn), bound)
    _, ours, _ = clipper_sums(model32, inputs32, batch, loss_fn, bound=bound)
    err_ours = max(float((a.double() - b).abs().max()) for a, b in zip(ours, ref_sums))
    err_plain = max(float((a.double() - b).abs().max()) for a, b in zip(plain, ref_sums))
    return err_ours, err_plain
