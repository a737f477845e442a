"""Make a model trainable with per-example clipping: replace the layers that mix examples.

:func:`fix` walks a model and replaces, in place,

* ``nn.BatchNorm1d/2d/3d`` and ``nn.SyncBatchNorm`` by ``nn.GroupNorm(G, C)`` with
  G = gcd(C, 32) groups (at most 32 channels' worth of groups, as Wu and He 2018 recommend,
  and always a divisor of C), affine if the batch norm was: batch statistics make one
  example's gradient depend on the whole batch, so per-example clipping would no longer bound
  any one example's influence (Abadi et al. 2016 train without them for this reason);
* ``nn.InstanceNorm*`` with ``track_running_stats=True`` by the same layer without running
  statistics (per-example normalisation is fine, the running average over batches is not);
* ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` by their counterparts built from nn.Linear maps
  (:func:`dpsharp.torch.layers.recurrent.convert_recurrent`), same parameters and state dict.

It returns the model and a list of :class:`Change` records saying what was replaced where.
What it cannot fix without changing the model's meaning (a sequence-first transformer layer,
an embedding with ``max_norm``, uninitialised lazy parameters) is left alone; constructing
:class:`~dpsharp.torch.PerSampleClipper` (or ``PrivacyEngine.make_private``) names it.
A replacement keeps the per-channel scale and shift (weight, bias) of the layer it replaces,
but normalises with other statistics: fine-tune after fixing a pretrained model.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Change", "fix"]


@dataclass(frozen=True)
class Change:
    """One replacement: the module's dotted name ("" for the root), its old and new types."""

    name: str
    old: str
    new: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name or '<root>'}: {self.old} -> {self.new} ({self.reason})"


def _copy_affine(old: nn.Module, new: nn.Module) -> None:
    """The per-channel scale and shift of ``old`` into ``new`` (same device and dtype)."""
    import torch

    if getattr(old, "weight", None) is None:
        return
    new.to(device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.copy_(old.bias)
    new.weight.requires_grad_(old.weight.requires_grad)
    new.bias.requires_grad_(old.bias.requires_grad)


def _replacement(module: nn.Module) -> tuple[nn.Module, str] | None:
    from torch import nn

    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)):
        channels = module.num_features
        groups = math.gcd(channels, 32)
        new = nn.GroupNorm(groups, channels, eps=module.eps, affine=module.affine)
        _copy_affine(module, new)
        return new, "batch statistics mix examples"
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        new = type(module)(module.num_features, eps=module.eps, momentum=module.momentum,
                           affine=module.affine, track_running_stats=False)
        _copy_affine(module, new)
        return new, "running statistics average over batches"
    return None


def fix(model: nn.Module) -> tuple[nn.Module, list[Change]]:
    """Replace the layers of ``model`` that per-example clipping cannot train (module
    docstring). Returns ``(model, changes)``: the fixed model (``model`` itself, changed in
    place, unless ``model`` is itself replaced) and what was replaced, in module order.

    Example: ``model, changes = dpsharp.torch.fix(model)``, then
    ``print(*changes, sep="\\n")``.
    """
    from torch import nn

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changes: list[Change] = []

    def visit(module: nn.Module, name: str) -> nn.Module:
        if isinstance(module, nn.RNNBase) and type(module) in (nn.RNN, nn.GRU, nn.LSTM):
            try:
                from dpsharp.torch.layers.recurrent import convert_recurrent
            except ImportError:  # pragma: no cover - recurrent support not installed
                return module
            new = convert_recurrent(module)
            changes.append(Change(name, type(module).__name__, type(new).__name__,
                                  "fused recurrent kernels hide the per-step linear maps"))
            return new
        replaced = _replacement(module)
        if replaced is not None:
            new, reason = replaced
            new.train(module.training)
            changes.append(Change(name, type(module).__name__, type(new).__name__, reason))
            return new
        for child_name, child in list(module.named_children()):
            new_child = visit(child, f"{name}.{child_name}" if name else child_name)
            if new_child is not child:
                setattr(module, child_name, new_child)
        return module

    return visit(model, ""), changes


class _CallableModule(types.ModuleType):
    """``dpsharp.torch.fix(model)`` works whether the name resolves to this function (the
    package's lazy attribute) or to this module (once ``import dpsharp.torch.fix`` has run,
    the import system binds the package attribute ``fix`` to the module)."""

    def __call__(self, model: nn.Module) -> tuple[nn.Module, list[Change]]:
        return fix(model)


sys.modules[__name__].__class__ = _CallableModule
