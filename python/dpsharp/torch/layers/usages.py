"""Per-example gradient book-keeping for one call of one layer (a *usage*).

A usage holds what the backward pass left behind for one call of a layer (its input
activations and the gradient of its output, already scaled to per-example gradients) and can
answer, for each trainable parameter of the layer:

* ``sq_norm(p)``: the squared norm of each example's gradient of ``p``, shape (B,), float64,
  without materialising the per-example gradients where that is cheaper (ghost norm);
* ``per_example(p)``: the per-example gradients, shape (B, *p.shape) (used for tied weights);
* ``clipped_sum(p, factors)``: ``sum_i factors[i] * g_i(p)``, shape ``p.shape``, by
  book-keeping (one contraction with the stored tensors; Bu et al., ICML 2023).

Per-example gradients follow from the chain rule per example: for y = x W^T + b on a sequence,
g_i(W) = sum_t gy_{i,t} x_{i,t}^T, so ||g_i(W)||^2 = sum_{t,s} (x_{i,t}.x_{i,s})(gy_{i,t}.gy_{i,s})
(the Gram / ghost norm of Goodfellow 2015 and Li et al. 2022), which costs B T^2 (d + p)
against B T d p for materialising g_i(W); each layer picks the cheaper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpsharp.torch import kernels

if TYPE_CHECKING:
    import torch

__all__ = ["AffineUsage", "EmbeddingUsage", "LinearUsage", "PerExampleUsage", "Usage"]


class Usage:
    """Base class: one call of one layer, after its backward."""

    batch_size: int

    def params(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        return kernels.per_example_sq_norms(self.per_example(p).contiguous())

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        raise NotImplementedError

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        import torch

        per_example = self.per_example(p).contiguous()
        out = torch.empty(p.shape, dtype=per_example.dtype)
        return kernels.clip_accumulate_noise(out, per_example=per_example,
                                             factors=factors.contiguous())


class LinearUsage(Usage):
    """y = x W^T + b with x of shape (B, T, d), gy of shape (B, T, p) (T = 1 for 2-D inputs).

    Also used for convolutions after unfolding (x = patches, W = the kernel as a p x d
    matrix). ``weight`` / ``bias`` are the parameters (None when frozen).
    """

    def __init__(self, weight: torch.nn.Parameter | None, bias: torch.nn.Parameter | None,
                 activations: torch.Tensor, out_grads: torch.Tensor) -> None:
        self.weight = weight
        self.bias = bias
        self.a = activations
        self.g = out_grads
        self.batch_size = int(activations.shape[0])
        self._per_example_weight: torch.Tensor | None = None

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    @staticmethod
    def merge(usages: list[LinearUsage]) -> LinearUsage:
        """Several calls of one layer in one backward = one call on the concatenated sequence
        (g_i(W) is a sum over positions, so the per-example gradient is summed, not stacked)."""
        import torch

        first = usages[0]
        return LinearUsage(first.weight, first.bias, torch.cat([u.a for u in usages], dim=1),
                           torch.cat([u.g for u in usages], dim=1))

    def _materialise_weight(self) -> bool:
        _, seq, d = self.a.shape
        p = self.g.shape[2]
        return seq > 1 and seq * d * p <= seq * seq * (d + p)

    def _weight_per_example(self) -> torch.Tensor:
        import torch

        if self._per_example_weight is None:
            self._per_example_weight = torch.bmm(self.g.transpose(1, 2), self.a)  # (B, p, d)
        return self._per_example_weight

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        import torch

        if p is self.bias:
            gb = self.g.sum(dim=1)
            return (gb * gb).sum(dim=1, dtype=torch.float64)
        if self.a.shape[1] == 1:  # ||a_i g_i^T||_F^2 = ||a_i||^2 ||g_i||^2
            a, g = self.a[:, 0], self.g[:, 0]
            return (a * a).sum(dim=1, dtype=torch.float64) * (g * g).sum(dim=1, dtype=torch.float64)
        if self._materialise_weight():
            return kernels.per_example_sq_norms(self._weight_per_example())
        gram_a = torch.bmm(self.a, self.a.transpose(1, 2)).double()
        gram_g = torch.bmm(self.g, self.g.transpose(1, 2)).double()
        return (gram_a * gram_g).sum(dim=(1, 2))

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        if p is self.bias:
            return self.g.sum(dim=1)
        return self._weight_per_example().reshape((self.batch_size, *p.shape))

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        c = factors.to(self.g.dtype)
        if p is self.bias:
            return c @ self.g.sum(dim=1)
        if self._per_example_weight is not None:
            return super().clipped_sum(p, factors)
        scaled = self.g * c[:, None, None]
        pdim, d = self.g.shape[2], self.a.shape[2]
        return (scaled.reshape(-1, pdim).t() @ self.a.reshape(-1, d)).reshape(p.shape)


class EmbeddingUsage(Usage):
    """y[i, t] = W[idx[i, t]]: g_i(W) = sum_t onehot(idx_{i,t}) gy_{i,t}^T (rows with repeated
    indices add up; the padding row gets no gradient)."""

    def __init__(self, weight: torch.nn.Parameter, indices: torch.Tensor,
                 out_grads: torch.Tensor, padding_idx: int | None) -> None:
        self.weight = weight
        self.batch_size = int(indices.shape[0])
        self.idx = indices.reshape(self.batch_size, -1)
        g = out_grads.reshape(self.batch_size, self.idx.shape[1], -1)
        if padding_idx is not None:
            g = g * (self.idx != padding_idx).unsqueeze(-1).to(g.dtype)
        self.g = g

    def params(self) -> list[torch.nn.Parameter]:
        return [self.weight]

    def sq_norm(self, p: torch.nn.Parameter) -> torch.Tensor:
        import torch

        num_rows = p.shape[0]
        b, t, d = self.g.shape
        keys = (torch.arange(b).unsqueeze(1) * num_rows + self.idx).reshape(-1)
        unique_keys, inverse = torch.unique(keys, return_inverse=True)
        rows = torch.zeros(unique_keys.numel(), d, dtype=torch.float64)
        rows.index_add_(0, inverse, self.g.reshape(-1, d).double())
        row_sq = (rows * rows).sum(dim=1)
        out = torch.zeros(b, dtype=torch.float64)
        return out.index_add_(0, unique_keys // num_rows, row_sq)

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        import torch

        b, t, d = self.g.shape
        out = torch.zeros(b, p.shape[0], d, dtype=self.g.dtype)
        out.scatter_add_(1, self.idx.unsqueeze(-1).expand(b, t, d), self.g)
        return out

    def clipped_sum(self, p: torch.nn.Parameter, factors: torch.Tensor) -> torch.Tensor:
        import torch

        d = self.g.shape[2]
        scaled = (self.g * factors.to(self.g.dtype)[:, None, None]).reshape(-1, d)
        out = torch.zeros(p.shape, dtype=self.g.dtype)
        return out.index_add_(0, self.idx.reshape(-1), scaled)


class AffineUsage(Usage):
    """y = xhat * w + b (the affine part of LayerNorm / GroupNorm), w broadcast over
    ``reduce_dims`` of xhat (all dims but the batch and the parameter's own)."""

    def __init__(self, weight: torch.nn.Parameter | None, bias: torch.nn.Parameter | None,
                 normalised: torch.Tensor, out_grads: torch.Tensor,
                 reduce_dims: tuple[int, ...]) -> None:
        self.weight = weight
        self.bias = bias
        self.xhat = normalised
        self.g = out_grads
        self.reduce_dims = reduce_dims
        self.batch_size = int(out_grads.shape[0])

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        src = self.g * self.xhat if p is self.weight else self.g
        if self.reduce_dims:
            src = src.sum(dim=self.reduce_dims)
        return src.reshape((self.batch_size, *p.shape))


class PerExampleUsage(Usage):
    """Per-example gradients that were materialised directly (the torch.func fallback)."""

    def __init__(self, grads: dict[int, tuple[torch.nn.Parameter, torch.Tensor]],
                 batch_size: int) -> None:
        self.grads = grads
        self.batch_size = batch_size

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p, _ in self.grads.values()]

    def per_example(self, p: torch.nn.Parameter) -> torch.Tensor:
        return self.grads[id(p)][1]
