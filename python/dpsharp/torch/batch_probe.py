"""Batch probe: do the examples of a batch stay in dimension 0, and stay apart, in every layer?

Per-example clipping bounds one example's influence on the clipped sum by C only if every
clipped layer sees the examples in dimension 0 of its input (the row it clips is an example)
and an example's rows depend on that example alone (Abadi et al. 2016, Algorithm 1: the
gradient g(x_i) is a function of x_i). The clipper checks sizes: every layer's dimension 0 must
equal the model input's and the data loader's batch. Two faults pass those checks:

* a layer fed a sequence-first (L, B, ...) tensor with L = B (a model that transposes its
  batch-first input inside, or a sequence-first layer): it is clipped per position, and one
  example, spread over every row, moves the clipped sum by up to L C;
* a layer whose input mixes examples (``x - x.mean(0)`` before it, attention across the batch):
  one example changes every other example's gradient, which clipping does not bound.

:func:`probe_batch` looks for both with the model's own batch. It runs the model without
gradients, first in eval mode (no dropout), with the global RNG forked and seeded alike for
every run (randomness in the forward draws the same numbers in each, and the caller's RNG state
is untouched afterwards), the model's buffers restored afterwards, and with PyTorch's fused
multi-head attention fast path off (so that the layers inside ``nn.TransformerEncoderLayer``
are called as modules and seen):

1. the batch as given,
2. the batch with examples 0 and b swapped (b: the first example that differs from example 0),
3. the batch with example b replaced by a copy of example 0,
4. the batch with example b replaced by example 0 scaled so that its largest magnitude is 4
   times the batch's (floating tensors; others as in run 3): a maximum over the batch (per-
   tensor dynamic scaling, ``x / x.abs().max()``) moves the other examples only when the
   changed example holds it, which run 3 leaves to chance;

recording the first tensor input of every probed layer at every call (forward pre-hooks) and
the model's output. "The batch" is every tensor in the positional and keyword arguments,
nested tuples, lists and dicts included (``torch.utils._pytree``), whose dimension 0 is the
first tensor's (the rule of the clipper's per-example fallback); others (a shared (L, L) mask,
position ids of shape (1, L)) are passed unchanged. Then, for every layer input whose batch
dimension (0; 1 for ``nn.MultiheadAttention`` with ``batch_first=False``, which the clipper
transposes) has B entries:

* run 2 must permute exactly entries 0 and b of that dimension of run 1 (else: the layer sees
  the examples in another dimension, or in none);
* runs 3 and 4 must leave every entry but b of run 1 unchanged (else: the layer's input mixes
  examples).

If some module of the model is in training mode, runs 1, 3 and 4 are repeated in the modules'
own modes (dropout masks drawn alike from the same seed), for mixing that happens only while
training (a hand-written batch norm, mixup, ``x - x.mean(0)`` under ``if self.training``); a
module that updates a buffer there (running statistics) gets it back as it was.

Entries are compared to a relative tolerance of 1e-4 of the largest magnitude in the tensor
(four units of rounding for float16 and bfloat16, whose results of one example can differ in
the last bits with its place in the batch); a leak smaller than that goes unseen (in
bfloat16, ``x - x.mean(0)`` moves the other examples' rows by about 1 / B of an example's
spread, which is below the tolerance from B of about 64 on: half-precision models are best
probed once in float32). An input without B entries in the batch dimension and
with no other dimension following the swap is not about the examples and is skipped. If a
tensor argument whose first two dimensions are both B (possibly a shared (B, B) mask) was
permuted, a failure is confirmed by probing again with each such tensor (then all of them)
left unchanged: the model passes if every layer follows one of these swaps.

A third fault is outside the model: a training loop that feeds the loader's batch transposed
(``x.transpose(0, 1)``, sequence length = batch size) to per-position layers. Dimension 0 of
the model's input then holds positions and every layer follows a swap of them, so
:func:`probe_batch` passes it; :func:`transposed_input` compares the model's input with the
loader's batch instead (the engine runs both at the first training batch).

A batch of fewer than two examples, or whose examples are all equal, has nothing to swap:
the result says so (``checked`` False) and no verdict is given. Inputs given as a
``PackedSequence`` (whose rows are time steps of several examples) are not probed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchProbeResult", "batch_dimension", "clipped_layers", "probe_batch",
           "probed_layers", "transposed_input"]

#: Relative tolerance (of the largest magnitude in a tensor) below which two results are equal.
_RELATIVE_TOLERANCE = 1e-4
#: Name of the model's output in the probe's messages.
OUTPUT = "(model output)"


@dataclass(frozen=True)
class BatchProbeResult:
    """What :func:`probe_batch` found.

    ``checked`` says whether the probe ran (False: ``reason`` says why not, e.g. a batch of one
    example; ``final`` True when no other batch of this model can be probed either, e.g. a
    PackedSequence input); ``batch_dimension`` describes the first layer (in forward order)
    whose input does not follow the examples in its batch dimension, ``cross_example`` the
    first whose input mixes examples (None: nothing found); ``layers`` is the number of probed
    layers that were called; ``batch_size`` B.
    """

    checked: bool
    batch_size: int
    layers: int = 0
    reason: str | None = None
    batch_dimension: str | None = None
    cross_example: str | None = None
    final: bool = False

    @property
    def passed(self) -> bool:
        """True when the probe ran and found no leak."""
        return self.checked and self.batch_dimension is None and self.cross_example is None


def batch_dimension(module: Any) -> int:
    """The dimension of ``module``'s first input that holds the examples: 1 for an
    ``nn.MultiheadAttention`` with ``batch_first=False`` (its inputs are (L, B, E)), else 0."""
    from torch import nn

    if isinstance(module, nn.MultiheadAttention) and not module.batch_first:
        return 1
    return 0


def probed_layers(model: Any) -> list[tuple[str, Any, int]]:
    """(name, module, batch dimension) of every module of ``model`` that holds parameters."""
    out = []
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            out.append((name or "(model)", module, batch_dimension(module)))
    return out


def clipped_layers(model: Any, clipper: Any) -> list[tuple[str, Any, int]]:
    """(name, module, batch dimension) of every layer ``clipper`` (a
    :class:`~dpsharp.torch.PerSampleClipper` of ``model``) clips: the patched modules with
    trainable parameters (a torch.func fallback subtree by its root, whose dimension 0 it maps
    over). Frozen layers are not clipped and not probed."""
    handles = getattr(clipper, "_handles", None)
    if handles is None:  # not a PerSampleClipper: every layer with a trainable parameter
        return [(name, module, dim) for name, module, dim in probed_layers(model)
                if any(p.requires_grad for p in module.parameters(recurse=False))]
    names = {id(m): name or "(model)" for name, m in model.named_modules()}
    return [(names.get(id(h.module), type(h.module).__name__), h.module,
             batch_dimension(h.module)) for h in handles]


def _first_tensor_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _first_output(output: Any) -> Any:
    """The model output's first tensor (a tensor, the first of a tuple / list, or ``logits`` /
    the first value of a mapping such as a Hugging Face ModelOutput); None if there is none."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) or hasattr(output, "values"):
        if "logits" in output:
            return output["logits"]
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    return None


def _holds_packed(value: Any) -> bool:
    """Whether ``value`` is or holds (in tuples, lists, dicts) a PackedSequence."""
    from torch.nn.utils.rnn import PackedSequence

    if isinstance(value, PackedSequence):
        return True
    if isinstance(value, dict):
        return any(_holds_packed(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return any(_holds_packed(v) for v in value)
    return False


def _close(a: Any, b: Any) -> bool:
    """a equals b to _RELATIVE_TOLERANCE of their largest finite magnitude (exactly, for
    integers; equal infinities and NaN against NaN count as equal)."""
    import torch

    if a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    if not a.is_floating_point():
        return False
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    same = (a64 == b64) | (torch.isnan(a64) & torch.isnan(b64))
    difference = torch.where(same, torch.zeros_like(a64), (a64 - b64).abs())
    if not bool(torch.isfinite(difference).all()):
        return False
    magnitude = torch.where(torch.isfinite(a64), a64.abs(), torch.zeros_like(a64))
    scale = float(magnitude.max())
    # half precision rounds at 4e-3 (bfloat16) / 5e-4 (float16): four units of it
    tolerance = max(_RELATIVE_TOLERANCE, 4.0 * torch.finfo(a.dtype).eps)
    return float(difference.max()) <= tolerance * scale


@contextlib.contextmanager
def _quiet_run(model: Any, *, eval_mode: bool = True) -> Iterator[None]:
    """No gradients, eval mode (``eval_mode``; else each module's own flag), each module's
    flag restored afterwards, the model's buffers restored afterwards (a module in training
    mode may update running statistics), the global RNG forked (restored afterwards), the
    fused attention fast path off."""
    import torch

    modes = [(module, module.training) for module in model.modules()]
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    fastpath = None
    mha = getattr(torch.backends, "mha", None)
    if mha is not None and hasattr(mha, "get_fastpath_enabled"):
        fastpath = mha.get_fastpath_enabled()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            if eval_mode:
                model.eval()
            if fastpath is not None:
                mha.set_fastpath_enabled(False)
            yield
    finally:
        if fastpath is not None:
            mha.set_fastpath_enabled(fastpath)
        # through train() (a module may override it, e.g. to merge adapter weights), parents
        # before children (modules() is in pre-order), so each flag ends as it was
        for module, mode in modes:
            if module.training != mode:
                module.train(mode)
        with torch.no_grad():
            for buffer, saved in buffers:
                if buffer.shape == saved.shape:
                    buffer.copy_(saved)


def probe_batch(model: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                *, layers: Sequence[tuple[str, Any, int]] | None = None,
                mixing: bool = True, seed: int = 0) -> BatchProbeResult:
    """Probe ``model(*args, **kwargs)`` for layers that do not see the examples in their batch
    dimension (and, with ``mixing``, layers whose input mixes examples); module docstring.

    Parameters
    ----------
    model:
        The ``torch.nn.Module``; it is run up to seven times (twice without ``mixing``)
        without gradients, in eval mode and in its own modes (module docstring); its training
        flags, its buffers and the global RNG state are restored.
    args, kwargs:
        One batch of the model's inputs, examples in dimension 0.
    layers:
        (name, module, batch dimension) of the layers to check; default
        :func:`probed_layers` (every module holding parameters). The model's output is always
        checked too (batch dimension 0).
    mixing:
        Also run the cross-example probes (runs 3 and 4, and the training-mode runs).
    seed:
        The seed of every run's forked RNG.
    """
    import torch
    from torch.utils import _pytree

    kwargs = dict(kwargs or {})
    if _holds_packed((args, kwargs)):
        return BatchProbeResult(False, 0, final=True, reason=(
            "a PackedSequence input (its rows are time steps of several examples) is not "
            "probed"))
    leaves, spec = _pytree.tree_flatten((tuple(args), kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor) and x.dim() >= 1]
    if not tensors:
        return BatchProbeResult(False, 0, final=True,
                                reason="the model's input holds no batched tensor")
    n = int(tensors[0].shape[0])
    if n < 2:
        return BatchProbeResult(False, n, reason=f"a batch of {n} example{'s' * (n != 1)} has "
                                                 "no two examples to swap")
    batched = [isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == n for x in leaves]
    other = None
    for j in range(1, n):
        if any(not torch.equal(x[0], x[j]) for x, b in zip(leaves, batched) if b):
            other = j
            break
    if other is None:
        return BatchProbeResult(False, n, reason=f"the {n} examples of the batch are all equal")
    if layers is None:
        layers = probed_layers(model)
    square = [b and x.dim() >= 2 and x.shape[1] == n for x, b in zip(leaves, batched)]
    found = _run(model, leaves, spec, batched, n, other, layers, mixing, seed)
    if found.batch_dimension is None and found.cross_example is None:
        return found
    # A permuted (B, B, ...) tensor may be a shared (L, L) mask with L = B, not examples: a
    # model whose layers all follow the swap with it (or all of them) left alone is not at
    # fault.
    retries = [[b and k != i for k, b in enumerate(batched)]
               for i, s in enumerate(square) if s]
    if len(retries) > 1:
        retries.append([b and not s for b, s in zip(batched, square)])
    for subset in retries:
        if any(subset):
            retry = _run(model, leaves, spec, subset, n, other, layers, mixing, seed)
            if retry.passed:
                return retry
    return found


def transposed_input(args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                     batch: Any) -> str | None:
    """Whether the model's input is the data loader's ``batch`` with its examples moved out of
    dimension 0: a tensor of the input equal to a tensor of the batch with dimensions 0 and k
    swapped (k >= 1), and not to the tensor itself.

    :func:`probe_batch` cannot see this: it swaps dimension 0 of the model's input, which then
    holds positions, and every layer follows. A loop that feeds ``x.transpose(0, 1)`` (a
    sequence-first model) with sequence length = batch size passes every size check and is
    clipped per position. Returns a description, or None (also when the input was otherwise
    transformed, which this comparison cannot follow).
    """
    import torch
    from torch.utils import _pytree

    given = [x for x in _pytree.tree_leaves((tuple(args), dict(kwargs or {})))
             if isinstance(x, torch.Tensor) and x.dim() >= 2]
    drawn = [x for x in _pytree.tree_leaves(batch)
             if isinstance(x, torch.Tensor) and x.dim() >= 2]
    for position, t in enumerate(given):
        for u in drawn:
            if t.dtype.is_floating_point != u.dtype.is_floating_point:
                continue
            square = [k for k in range(1, u.dim()) if u.shape[k] == u.shape[0]]
            if t.shape != u.shape or not square:
                continue
            t_here = t.detach().to(device=u.device, dtype=u.dtype)
            if _close(t_here, u):
                continue
            for k in square:
                if _close(t_here, u.transpose(0, k)):
                    return (f"tensor input {position} of the model is the data loader's batch "
                            f"with dimensions 0 and {k} swapped: the model sees the examples "
                            f"in dimension {k}, and every layer would be clipped per row of "
                            "dimension 0, not per example (its size equals the batch size, "
                            "so the size checks pass)")
    return None


def _run(model: Any, leaves: list[Any], spec: Any, batched: list[bool], n: int, other: int,
         layers: Sequence[tuple[str, Any, int]], mixing: bool, seed: int) -> BatchProbeResult:
    import torch
    from torch.utils import _pytree

    swap = torch.arange(n)
    swap[0], swap[other] = other, 0
    copy = torch.arange(n)
    copy[other] = 0

    def reordered(order: Any) -> list[Any]:
        # copies, also of the tensors not permuted: a forward that writes into its inputs
        # must not change the caller's batch
        return [x.index_select(0, order.to(x.device)) if b
                else x.clone() if isinstance(x, torch.Tensor) else x
                for x, b in zip(leaves, batched)]

    def outlier() -> list[Any] | None:
        """The batch with example ``other`` replaced by example 0 scaled up until its largest
        magnitude is 4 times the batch's (floating tensors; the others copy example 0, as in
        the copy run); None when no floating tensor can be scaled."""
        new = reordered(copy)
        scaled = False
        for k, (x, b) in enumerate(zip(leaves, batched)):
            if not (b and x.is_floating_point() and bool(torch.isfinite(x).all())):
                continue
            largest = float(x.abs().max())
            row = x[0] if float(x[0].abs().max()) > 0.0 else x[other]
            row_largest = float(row.abs().max())
            if largest > 0.0 and row_largest > 0.0:
                new[k][other] = row * (4.0 * largest / row_largest)
                scaled = True
        return new if scaled else None

    seen: dict[str, list[Any]] = {}
    kinds: dict[str, tuple[str, int]] = {}
    phase: dict[str, Any] = {"calls": {}, "record": True}
    handles = []

    def capture(key: str, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            return
        if phase["record"]:
            seen.setdefault(key, []).append(value.detach().clone())
        else:
            index = phase["calls"].get(key, 0)
            phase["calls"][key] = index + 1
            phase["check"](key, index, value.detach())

    for name, module, dim in layers:
        kinds[name] = (type(module).__name__, dim)

        def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 key: str = name) -> None:
            capture(key, _first_tensor_input(args, kwargs))

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    kinds[OUTPUT] = ("output", 0)
    first_leak: dict[str, str] = {}

    def check_swap(key: str, index: int, after: Any) -> None:
        if "swap" in first_leak or index >= len(seen.get(key, ())):
            return
        before = seen[key][index]
        kind, dim = kinds[key]
        if before.shape != after.shape or before.dim() == 0:
            return
        if before.dim() > dim and before.shape[dim] == n:
            if _close(before.index_select(dim, swap.to(before.device)), after):
                return
        per_example = before.dim() > dim and before.shape[dim] == n
        if not per_example and _close(before, after):
            return  # not about the examples (e.g. position ids): the swap left it alone
        moved = [k for k in range(before.dim()) if k != dim and before.shape[k] == n
                 and _close(before.index_select(k, swap.to(before.device)), after)]
        if per_example or moved:
            where = f"dimension {moved[0]}" if moved else "no single dimension"
            label = "the model's output" if key == OUTPUT else f"{key} ({kind})"
            first_leak["swap"] = (
                f"{label} sees the examples in {where} of its "
                f"{'value' if key == OUTPUT else 'input'}, not in dimension {dim}: swapping "
                f"examples 0 and {other} of the batch did not swap its entries 0 and {other} "
                f"of dimension {dim}, so the clipper would clip it per row, not per example "
                "(a sequence-first layer whose sequence length equals the batch size passes "
                "the batch-size checks)")

    def copy_check(change: str) -> Any:
        """The check that a run with example ``other`` changed (as ``change`` says) left every
        other example's entries as they were in the recorded run."""

        def check(key: str, index: int, after: Any) -> None:
            if "copy" in first_leak or index >= len(seen.get(key, ())):
                return
            before = seen[key][index]
            kind, dim = kinds[key]
            if before.shape != after.shape or before.dim() <= dim or before.shape[dim] != n:
                return
            keep = torch.tensor([k for k in range(n) if k != other], device=before.device)
            if not _close(before.index_select(dim, keep), after.index_select(dim, keep)):
                label = "the model's output" if key == OUTPUT else f"the input of {key} ({kind})"
                first_leak["copy"] = (
                    f"{label} changed for the other examples of the batch when example {other} "
                    f"was {change}: the model mixes examples before it (batch statistics, x - "
                    "x.mean(0), a maximum over the batch, attention across the batch), so one "
                    "example's gradient depends on the others and clipping per example does "
                    "not bound its influence")

        return check

    def forward(new_leaves: list[Any]) -> None:
        call_args, call_kwargs = _pytree.tree_unflatten(new_leaves, spec)
        torch.manual_seed(seed)
        capture(OUTPUT, _first_output(model(*call_args, **call_kwargs)))

    def check_run(check: Any, new_leaves: list[Any] | None) -> None:
        if new_leaves is None or "copy" in first_leak:
            return
        phase["record"] = False
        phase["calls"] = {}
        phase["check"] = check
        forward(new_leaves)

    def record() -> None:
        seen.clear()
        phase["record"] = True
        forward(reordered(torch.arange(n)))

    def mixing_runs(mode: str) -> None:
        check_run(copy_check(f"replaced by a copy of example 0{mode}"), reordered(copy))
        check_run(copy_check("replaced by example 0 scaled to 4 times the batch's largest "
                             f"input magnitude{mode}"), outlier())

    try:
        with _quiet_run(model):
            record()
            check_run(check_swap, reordered(swap))
            if mixing:
                mixing_runs("")
        if mixing and "copy" not in first_leak and any(m.training for m in model.modules()):
            # Mixing only while training (a hand-written batch norm, mixup, x - x.mean(0) under
            # `if self.training`): the same runs in the model's own modes, dropout masks drawn
            # alike from the same seed.
            with _quiet_run(model, eval_mode=False):
                record()
                mixing_runs(" (in the model's training mode)")
    finally:
        for handle in handles:
            handle.remove()
    called = sum(1 for key in seen if key != OUTPUT)
    return BatchProbeResult(True, n, layers=called, batch_dimension=first_leak.get("swap"),
                            cross_example=first_leak.get("copy"))
