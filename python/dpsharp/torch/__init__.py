"""Optional PyTorch integration. Importing :mod:`dpsharp` never imports torch; the names here
are loaded on first use (each owner adds its own entries to ``_LAZY``)."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    # DP-PCA input projection (issue 11)
    "DPPCA": "dpsharp.torch.pca",
    "PCAProjection": "dpsharp.torch.pca",
    "symmetric_gaussian_noise": "dpsharp.torch.pca",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dpsharp.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
