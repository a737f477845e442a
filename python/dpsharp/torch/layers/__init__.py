"""Per-layer support for per-example clipping: which modules are handled how."""

from __future__ import annotations

from dpsharp.torch.layers.functions import LayerHandle, patch_module
from dpsharp.torch.layers.usages import (
    AffineUsage,
    EmbeddingUsage,
    LinearUsage,
    PerExampleUsage,
    Usage,
)

__all__ = [
    "AffineUsage",
    "EmbeddingUsage",
    "LayerHandle",
    "LinearUsage",
    "PerExampleUsage",
    "Usage",
    "patch_module",
]
