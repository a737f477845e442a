"""PyTorch integration of dpsharp (imported lazily: ``import dpsharp`` never imports torch, and
``import dpsharp.torch`` does not either until one of the names below is first used).

Training core: :class:`PerSampleClipper` (per-example clipping with fused clip-and-noise
kernels) and :class:`NoiseGenerator` (counter-based Gaussian noise, secure mode).
Training API: :class:`DPOptimizer`, :func:`NoisySGD`, :func:`NoisyAdam`, :func:`NoisyAdaGrad`,
the data loaders that know their sampling, and :class:`PrivacyEngine` / :class:`PrivacyBudget`.
Also noise schedules (:mod:`dpsharp.torch.schedules`) and DP-PCA (:class:`DPPCA`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    # training core: per-example clipping and noise
    "PerSampleClipper": "dpsharp.torch.clipper",
    "NoiseGenerator": "dpsharp.torch.noise",
    "retain_freed_memory": "dpsharp.torch.allocator",
    # training API: optimizers, loaders, engine
    "DPOptimizer": "dpsharp.torch.optimizer",
    "NoisySGD": "dpsharp.torch.optimizer",
    "NoisyAdam": "dpsharp.torch.optimizer",
    "NoisyAdaGrad": "dpsharp.torch.optimizer",
    "DPDataLoader": "dpsharp.torch.data",
    "PoissonDataLoader": "dpsharp.torch.data",
    "ShuffledDataLoader": "dpsharp.torch.data",
    "WithoutReplacementDataLoader": "dpsharp.torch.data",
    "PrivacyEngine": "dpsharp.torch.engine",
    "PrivacyBudget": "dpsharp.torch.engine",
    "PrivacyReport": "dpsharp.torch.engine",
    "BudgetExhausted": "dpsharp.torch.engine",
    # DP-PCA input projection
    "DPPCA": "dpsharp.torch.pca",
    "PCAProjection": "dpsharp.torch.pca",
    "symmetric_gaussian_noise": "dpsharp.torch.pca",
    # noise schedules
    "NoiseSchedule": "dpsharp.torch.schedules",
    "Constant": "dpsharp.torch.schedules",
    "TimeBased": "dpsharp.torch.schedules",
    "Exponential": "dpsharp.torch.schedules",
    "StepDecay": "dpsharp.torch.schedules",
    "Polynomial": "dpsharp.torch.schedules",
    "ValidationBased": "dpsharp.torch.schedules",
    "ADP": "dpsharp.torch.schedules",
    "calibrate_schedule": "dpsharp.torch.schedules",
    "attach_schedule": "dpsharp.torch.schedules",
    # scale-out: distributed data parallel
    "DistributedPoissonDataLoader": "dpsharp.torch.distributed",
    # clip-factor rules: automatic (Bu et al. 2023) and adaptive quantile (Andrew et al. 2021)
    "AutomaticClipping": "dpsharp.torch.clipping",
    "AdaptiveQuantileClipping": "dpsharp.torch.clipping",
    # recurrent layers built from nn.Linear maps, for per-example clipping
    "convert_recurrent": "dpsharp.torch.layers.recurrent",
    "DPRNN": "dpsharp.torch.layers.recurrent",
    "DPGRU": "dpsharp.torch.layers.recurrent",
    "DPLSTM": "dpsharp.torch.layers.recurrent",
    # replace the layers per-example clipping cannot train (batch norms, running statistics)
    "fix": "dpsharp.torch.fix",
    # one-run privacy audit with gradient canaries (Steinke, Nasr, Jagielski 2023)
    "audit": "dpsharp.torch.audit",
    "AuditResult": "dpsharp.torch.audit",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module_name = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dpsharp.torch' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
