"""PyTorch integration of dpsharp (imported lazily: ``import dpsharp`` never imports torch).

Training core: :class:`PerSampleClipper` (per-example clipping with fused clip-and-noise
kernels) and :class:`NoiseGenerator` (counter-based Gaussian noise, secure mode).
"""

from __future__ import annotations

from typing import Any

__all__ = ["NoiseGenerator", "PerSampleClipper"]

_LAZY = {
    "PerSampleClipper": "dpsharp.torch.clipper",
    "NoiseGenerator": "dpsharp.torch.noise",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpsharp.torch' has no attribute {name!r}")
