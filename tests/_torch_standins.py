"""TEMPORARY test-only stand-ins for PerSampleClipper and NoiseGenerator (TORCH_CONTRACT.md),
used only while the `training` branch has not landed; `install_if_missing` registers them as
dpsharp.torch.clipper / dpsharp.torch.noise only when the real modules cannot be imported.
Pure torch, nn.Linear layers only, flat clipping. To be deleted once `training` is merged."""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
from torch import nn


class StandInNoise:
    def __init__(self, seed: int | None = None, *, secure: bool = False) -> None:
        if secure and seed is not None:
            raise ValueError("seed must be None when secure=True")
        self.seed = int(torch.randint(0, 2**62, ()).item()) if seed is None else int(seed)
        self.releases = 0

    def normal(self, shape: torch.Size, index: int, dtype: torch.dtype) -> torch.Tensor:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.releases) * 101 + index)
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "releases": self.releases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.releases = int(state["seed"]), int(state["releases"])


class StandInClipper:
    def __init__(self, module: nn.Module, *, max_grad_norm: Any, clipping: str = "flat",
                 loss_reduction: str = "mean") -> None:
        for sub in module.modules():
            if isinstance(sub, nn.modules.batchnorm._BatchNorm):
                raise ValueError("BatchNorm mixes examples; use GroupNorm")
        if clipping != "flat":
            raise NotImplementedError("stand-in: flat clipping only")
        self.bound = float(max_grad_norm)
        self.loss_reduction = loss_reduction
        self.layers = [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        self.parameters = [p for p in module.parameters() if p.requires_grad]
        self._handles = []
        for layer in self.layers:
            self._handles.append(layer.register_forward_hook(self._forward))
        self._activations: dict[nn.Module, torch.Tensor] = {}
        self._pending: dict[nn.Module, list[torch.Tensor]] = {}
        self._sums: dict[int, torch.Tensor] = {}
        self.accumulated_examples = 0
        self.accumulated_batches = 0
        self.last_per_example_norms = torch.empty(0)

    def _forward(self, layer: nn.Module, inputs: Any, output: Any) -> None:
        self._activations[layer] = inputs[0].detach()
        if output.requires_grad:
            output.register_hook(lambda grad, layer=layer: self._backward(layer, grad))

    def _backward(self, layer: nn.Module, grad_output: torch.Tensor) -> None:
        go = grad_output.detach()
        act = self._activations[layer]
        batch = go.shape[0]
        if self.loss_reduction == "mean":
            go = go * batch
        if isinstance(layer, nn.Conv2d):
            cols = nn.functional.unfold(act, layer.kernel_size, dilation=layer.dilation,
                                        padding=layer.padding, stride=layer.stride)
            go = go.reshape(batch, go.shape[1], -1)
            grads = [torch.einsum("bol,bil->boi", go, cols).reshape(batch, *layer.weight.shape)]
            if layer.bias is not None:
                grads.append(go.sum(2))
        else:
            grads = [torch.einsum("bo,bi->boi", go, act)]
            if layer.bias is not None:
                grads.append(go)
        self._pending[layer] = grads
        if len(self._pending) == len(self.layers):
            self._finish(batch)

    def _finish(self, batch: int) -> None:
        per_param = {}
        for layer in self.layers:
            grads = self._pending[layer]
            per_param[id(layer.weight)] = grads[0]
            if layer.bias is not None:
                per_param[id(layer.bias)] = grads[1]
        self._pending = {}
        norms = torch.zeros(batch, dtype=torch.float64)
        for g in per_param.values():
            norms += g.reshape(batch, -1).double().pow(2).sum(1)
        norms = norms.sqrt()
        factor = 1.0 / torch.clamp(norms / self.bound, min=1.0)
        for key, g in per_param.items():
            clipped = (g.double() * factor.view(-1, *([1] * (g.dim() - 1)))).sum(0)
            self._sums[key] = self._sums.get(key, torch.zeros_like(clipped)) + clipped
        self.last_per_example_norms = norms
        self.accumulated_examples += batch
        self.accumulated_batches += 1

    def release(self, *, noise_multiplier: float, expected_batch_size: float, noise: StandInNoise) -> None:
        for index, p in enumerate(self.parameters):
            total = self._sums.get(id(p), torch.zeros(p.shape, dtype=torch.float64))
            z = noise.normal(p.shape, index, torch.float64)
            p.grad = ((total + noise_multiplier * self.bound * z) / expected_batch_size).to(p.dtype)
        noise.releases += 1
        self._sums = {}
        self.accumulated_examples = 0
        self.accumulated_batches = 0

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def install_if_missing() -> bool:
    """Register the stand-ins as dpsharp.torch.clipper / .noise if the real ones are absent.
    Returns True if the stand-ins are in use."""
    try:
        import dpsharp.torch.clipper  # noqa: F401
        import dpsharp.torch.noise  # noqa: F401

        return False
    except ImportError:
        pass
    clipper = types.ModuleType("dpsharp.torch.clipper")
    clipper.PerSampleClipper = StandInClipper  # type: ignore[attr-defined]
    noise = types.ModuleType("dpsharp.torch.noise")
    noise.NoiseGenerator = StandInNoise  # type: ignore[attr-defined]
    sys.modules["dpsharp.torch.clipper"] = clipper
    sys.modules["dpsharp.torch.noise"] = noise
    return True
