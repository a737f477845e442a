"""Watch a model's buffers for writes made by its training forward.

DP-SGD bounds what the *gradients* say about one example; the model it releases also carries
its buffers, which get no noise. A module that writes statistics of its inputs into a buffer
(a running maximum, a quantisation observer's min/max, BatchNorm's running moments) copies
data into the released model directly: one record's feature value appeared verbatim in a
state_dict trained "privately" at epsilon 0.39. :class:`BufferWatch` keeps a copy of every
buffer and reports the ones whose values changed, so the clipper can refuse the step.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn


def _same_bytes(now: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor (on ``now``'s device): whether the two tensors of equal shape and
    dtype hold the same bytes (NaN equal to the same NaN, unlike ``==``)."""
    import torch

    a = now.detach().contiguous().reshape(-1)
    b = before.contiguous().reshape(-1)
    if a.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=a.device)
    return (a.view(torch.uint8) == b.view(torch.uint8)).all()


class BufferWatch:
    """The buffers of ``module`` (``module.named_buffers()``) as they are now, and
    :meth:`changed`, the names of those written since.

    Parameters
    ----------
    module:
        The model.
    public:
        Names of buffers (as ``named_buffers`` gives them) that the forward may change without
        reading the data, e.g. a count of training steps. They are not watched. A name that is
        not a buffer of ``module`` is a ValueError.
    """

    def __init__(self, module: nn.Module, public: Iterable[str] = ()) -> None:
        if isinstance(public, str):
            raise TypeError("public_buffers must be an iterable of buffer names, not one str")
        public_names = set(public)
        names = dict(module.named_buffers())
        unknown = sorted(public_names - names.keys())
        if unknown:
            raise ValueError(
                f"public_buffers names {unknown} that are not buffers of the model; its buffers "
                f"are {sorted(names)}")
        self._module = module
        self._public = public_names
        self._copies = {name: tensor.detach().clone() for name, tensor in names.items()
                        if name not in public_names}

    def changed(self) -> list[str]:
        """The watched buffers whose values differ from the copies, and buffers registered
        since (sorted names). A buffer moved to another device or dtype with ``Module.to``
        counts as unchanged when its values are the old ones converted; its copy then follows
        it."""
        current = {name: tensor for name, tensor in self._module.named_buffers()
                   if name not in self._public}
        changed = sorted(name for name in current.keys() - self._copies.keys())
        checks: list[tuple[str, torch.Tensor]] = []
        for name, before in self._copies.items():
            now = current.get(name)
            if now is None:  # deleted: nothing of it is released
                continue
            if now.shape != before.shape:
                changed.append(name)
                continue
            if now.dtype != before.dtype or now.device != before.device:
                before = before.to(device=now.device, dtype=now.dtype)
                self._copies[name] = before
            checks.append((name, _same_bytes(now, before)))
        if checks:
            import torch

            # one transfer per device rather than one per buffer
            by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
            for name, same in checks:
                by_device.setdefault(same.device, []).append((name, same))
            for group in by_device.values():
                flags = torch.stack([same for _, same in group]).tolist()
                changed.extend(name for (name, _), same in zip(group, flags) if not same)
        return sorted(changed)
