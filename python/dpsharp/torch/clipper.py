"""Per-example gradient clipping for DP-SGD at close to non-private speed.

:class:`PerSampleClipper` patches the supported layers of a module so that the backward pass
computes only input gradients plus what per-example norms need (activations and output
gradients), never the plain parameter gradient. When a backward pass ends it

1. computes each example's gradient norm ||g_i|| (ghost norms where cheaper, see
   :mod:`dpsharp.torch.layers.usages`),
2. the clip factor c_i = min(1, C / ||g_i||) (flat clipping, Abadi et al. 2016, Algorithm 1) or
   c_{i,l} = min(1, C_l / ||g_{i,l}||) per layer l (per-layer clipping, Abadi et al. section 3.1;
   McMahan et al. 2018),
3. adds sum_i c_i g_i to an accumulator by book-keeping (Bu et al., ICML 2023): one contraction
   of the stored tensors with the clip factors, no second backward.

:meth:`PerSampleClipper.release` then writes, for every trainable parameter,
``p.grad = (sum_i c_i g_i + N(0, (sigma C)^2 I)) / B_expected`` with one fused kernel that draws
the noise in place from a counter-based generator (:class:`dpsharp.torch.NoiseGenerator`).
C is the flat bound, or sqrt(sum_l C_l^2) in per-layer mode (the sensitivity of the
concatenated clipped gradient). B_expected is the expected batch size (never the realised
Poisson batch size, which would leak it).

Layers: nn.Linear (any number of leading dims: (B, d) or sequences (B, T, d)), nn.Conv1d/2d
(groups=1, numeric padding, zero padding mode), nn.Embedding (not max_norm / sparse /
scale_grad_by_freq), nn.LayerNorm, nn.GroupNorm. Any other module holding parameters falls
back to torch.func per-example gradients (vmap of vjp) for its whole subtree. BatchNorm (and
instance norm with running statistics, SyncBatchNorm) are refused: they mix examples.

The batch must be dimension 0 of every layer input. A model that sees the batch elsewhere (a
sequence-first model, (seq, batch, ...), as nn.TransformerEncoderLayer with batch_first=False
expects) would be clipped per position instead of per example, and one example's influence on
the clipped sum would no longer be bounded by C. So every backward pass checks that all
clipped layers saw one batch size, equal to dimension 0 of the model's first input tensor and
of its first output tensor (recorded by forward hooks on the module), and
:meth:`PerSampleClipper.check_logical_batch` lets the optimizer compare the examples clipped
for a release with the data loader's batch. A mismatch raises ValueError explaining
``batch_first``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpsharp._validation import require_positive_finite, require_real
from dpsharp.torch import kernels
from dpsharp.torch.buffers import BufferWatch

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dpsharp.torch.layers.usages import RowTerm
    from dpsharp.torch.noise import NoiseGenerator, ReleaseKey

__all__ = ["PerSampleClipper"]

_BATCH_FIRST_HINT = (
    "The clipper takes dimension 0 of every layer input as the batch. A model that sees the "
    "batch in another dimension (sequence-first inputs (seq, batch, ...), e.g. "
    "nn.TransformerEncoderLayer or nn.MultiheadAttention with batch_first=False, or "
    "nn.Embedding / nn.Linear layers fed (seq, batch) tensors, or an input reshaped so that "
    "one example spans several rows) would be clipped per position instead of per example, "
    "and one example's contribution to the clipped sum would not be bounded by max_grad_norm. "
    "Build the model batch-first (batch_first=True) and feed it (batch, seq, ...) tensors, "
    "with the batch in dimension 0 from the input to the loss."
)


def _leading_dim(value: Any) -> int | None:
    """Dimension 0 of the first tensor with at least one dimension in ``value`` (a tensor, or
    a tuple / list / dict holding tensors at its top level); None if there is none."""
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() >= 1 else None
    items = value.values() if isinstance(value, dict) else value
    if isinstance(items, (tuple, list)) or isinstance(value, dict):
        for item in items:
            if isinstance(item, torch.Tensor) and item.dim() >= 1:
                return int(item.shape[0])
    return None


def _classify(module: nn.Module) -> str | None:
    """The handler kind for a module with direct parameters (None: not a supported type)."""
    from torch import nn

    names = {n for n, _ in module.named_parameters(recurse=False)}
    plain = names <= {"weight", "bias"}
    t = type(module)
    if t in (nn.Linear, nn.modules.linear.NonDynamicallyQuantizableLinear) and plain:
        return "linear"
    if t is nn.MultiheadAttention:
        return "mha"
    if t is nn.RMSNorm and names <= {"weight"}:
        return "rmsnorm"
    if t is nn.EmbeddingBag and plain:
        if (module.mode in ("sum", "mean") and module.max_norm is None and not module.sparse
                and not module.scale_grad_by_freq):
            return "embeddingbag"
        return None
    hf = _hugging_face_kind(module, names)
    if hf is not None:
        return hf
    if t in (nn.Conv1d, nn.Conv2d) and plain:
        if (module.groups == 1 and module.padding_mode == "zeros"
                and not isinstance(module.padding, str)):
            return "conv"
        return None
    if t is nn.Embedding and plain:
        if module.max_norm is not None or module.sparse or module.scale_grad_by_freq:
            raise ValueError(
                "nn.Embedding with max_norm, sparse=True or scale_grad_by_freq=True is not "
                "supported for DP training: max_norm rewrites the weights during the forward "
                "and the other two make one example's gradient depend on the batch; use a "
                "plain nn.Embedding"
            )
        return "embedding"
    if t is nn.LayerNorm and plain:
        return "layernorm"
    if t is nn.GroupNorm and plain:
        return "groupnorm"
    return None


def _hugging_face_kind(module: nn.Module, names: set[str]) -> str | None:
    """Hugging Face ``transformers`` layers with a fast path (only when transformers is already
    imported: the clipper never imports it): GPT-2's Conv1D (a linear map with its weight
    stored transposed, (in, out)) and LlamaRMSNorm (x / rms(x) in float32, times a weight)."""
    import sys

    pytorch_utils = sys.modules.get("transformers.pytorch_utils")
    if pytorch_utils is not None and type(module) is getattr(pytorch_utils, "Conv1D", None):
        return "hf_conv1d" if names <= {"weight", "bias"} else None
    llama = sys.modules.get("transformers.models.llama.modeling_llama")
    if (llama is not None and type(module) is getattr(llama, "LlamaRMSNorm", None)
            and names <= {"weight"}):
        return "llama_rmsnorm"
    return None


def _refuse_cross_example(module: nn.Module, name: str) -> None:
    from torch import nn

    label = f"{type(module).__name__} ('{name or '<root>'}')"
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)):
        raise ValueError(
            f"{label} normalises with statistics of the whole batch, so one example's gradient "
            "depends on every other example and per-example clipping no longer bounds any "
            "single example's influence; replace it with nn.GroupNorm (e.g. "
            "GroupNorm(min(32, C), C)) or nn.LayerNorm"
        )
    if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
        raise ValueError(
            f"{label} tracks running statistics over the batch, which mixes examples; use "
            "track_running_stats=False or nn.GroupNorm(C, C)"
        )
    if isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params():
        raise ValueError(f"{label} has uninitialised (lazy) parameters; run one forward first")
    if (isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))
            and not module.self_attn.batch_first):
        raise ValueError(
            f"{label} is sequence-first (batch_first=False): its feed-forward and norm layers "
            "see (seq, batch, ...) tensors and would be clipped per position, not per example; "
            "build it with batch_first=True and feed it (batch, seq, ...) tensors"
        )
    if isinstance(module, (nn.RNNBase,)):
        raise ValueError(
            f"{label}: the per-example clipper cannot see inside PyTorch's fused recurrent "
            "kernels; convert the model first with "
            "dpsharp.torch.layers.recurrent.convert_recurrent(model), which replaces nn.RNN, "
            "nn.GRU and nn.LSTM by DPRNN, DPGRU and DPLSTM (same parameters, outputs and "
            "state_dict keys, built from nn.Linear maps)"
        )


@dataclass(frozen=True)
class _ArmedRelease:
    """What arm_release() fixed for the next backward pass."""

    noise_multiplier: float
    expected_batch_size: float
    noise: NoiseGenerator
    key: ReleaseKey


def _batches_rows(params: Sequence[torch.nn.Parameter]) -> bool:
    """Whether a flat clip step measures and sums the parameters whose per-example gradients
    are stored rows (``Usage.row_terms``: materialised linear and convolution weights, biases,
    normalisation layers) in one kernel call each for all layers, rather than layer by layer:
    the parameters all on one CUDA device, with dpsharp's CUDA kernels built. On a GPU each
    layer's own calls cost host time that the device waits for (GPT-2 small under bf16 autocast
    on an H200: about 150 norm and 150 weighted-sum calls a step, with their checks and
    launches); on the CPU each layer's fused kernels run while its tensors are in cache."""
    if not params:
        return False
    device = params[0].device
    return (device.type == "cuda" and kernels.cuda_built()
            and all(p.device == device for p in params))


def _require_within_bound(rule: Any, factors: torch.Tensor, norms: torch.Tensor,
                          bound: float | torch.Tensor) -> None:
    """Refuse clip factors from ``rule`` that leave an example's clipped gradient above the
    bound the noise is calibrated to: c_i >= 0 finite and c_i ||g_i|| <= C (1 + 1e-6), in
    float64. A clip rule is user-replaceable code; the sensitivity the accountant charges is
    only as good as this check (the built-in rules pass it by construction)."""
    import torch

    factors64 = factors.to(torch.float64)
    limit = torch.as_tensor(bound, dtype=torch.float64, device=factors.device) * (1.0 + 1e-6)
    bad = ~torch.isfinite(factors64) | (factors64 < 0.0) | (factors64 * norms.to(torch.float64) > limit)
    if bool(bad.any()):
        worst = float((factors64 * norms.to(torch.float64) / limit * (1.0 + 1e-6)).nan_to_num(
            nan=math.inf).max())
        raise RuntimeError(
            f"clip rule {rule!r} returned clip factors that are negative, not finite, or leave "
            f"a per-example gradient above the clipping bound (largest clipped norm / bound: "
            f"{worst:.6g}); the noise is calibrated to that bound, so nothing was accumulated. "
            "A rule's factors must satisfy 0 <= c_i <= bound / ||g_i||"
        )


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a parameter's clipped sum is accumulated in until its release: float32 for a
    half-precision parameter, its own dtype otherwise.

    The sum of B clipped gradients rounded to the parameter's dtype before the noise is added
    errs by up to half a unit of the sum's magnitude (about B C), and that error depends on
    every example: in bfloat16 (8 significant bits) removing one of about 1,000 aligned
    examples moved the noiseless sum by 8 C, where the noise is calibrated to C. Accumulated
    in float32 the same moves by at most about B 2^-24 C more than C (the float32 rounding of
    the summed gradient, as for a float32 parameter); the noise is added in float32 and the
    result rounded to bfloat16 once, after the noise, which is post-processing."""
    import torch

    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _require_releasable_dtypes(module: Any, params: list[Any]) -> None:
    """Refuse trainable parameters of a dtype the release kernels do not write (float32,
    float64 and bfloat16 are written; a float16 model, ``model.half()``, is not): refused when
    the clipper is built (``module`` given) and again before a release, so that a model cast
    afterwards fails before anything is charged."""
    from dpsharp.torch import kernels

    names = {id(p): name for name, p in module.named_parameters()} if module is not None else {}
    for param in params:
        try:
            kernels.dtype_code(param.dtype)
        except ValueError:
            name = names.get(id(param), f"of shape {tuple(param.shape)}")
            raise ValueError(
                f"parameter {name} has dtype {param.dtype}: the noise release writes float32, "
                "float64 and bfloat16 parameters only. Keep the parameters in float32 and run "
                "the forward pass under torch.autocast(dtype=torch.float16), or use bfloat16"
            ) from None


def _without_vanishing_factors(factors: torch.Tensor, usages: list[Any]) -> torch.Tensor:
    """The clip factors (float64, >= 0) with every factor c for which c |scale| falls below
    float32's smallest normal number (2^-126) for some usage's loss scale set to zero: that
    example then contributes nothing, through every use of every parameter alike (so the uses
    of a tied weight still cancel as they did in its norm).

    The usages round c |scale| to the stored tensors' dtype; below the normal range float32
    and bfloat16 keep fewer significant bits (1.0e-45 rounds up to 1.40e-45) and the clipped
    contribution would grow with the rounding, past C, where the round-off bounds assume a
    relative error of 2^-24 (``dpsharp.torch.layers.usages._flush_subnormal``). Such a factor
    belongs to an example whose gradient norm exceeds C 2^126 / |scale|."""
    import torch

    scales = [abs(float(u.scale)) for u in usages if float(u.scale) != 0.0]
    if not scales:
        return factors
    floor = torch.finfo(torch.float32).tiny / min(scales)
    return torch.where(factors < floor, torch.zeros_like(factors), factors)


def _refuse_unclipped_gradient(name: str,
                               abandon: Callable[[], None]) -> Callable[[Any], None]:
    """A tensor hook for the clipped parameter ``name``: raise if autograd computes a
    gradient for it (one that did not come through its patched layer), after ``abandon``
    (the clipper drops what the failing pass recorded: its end-of-pass step will not run)."""

    def hook(grad: Any) -> None:
        if grad is not None:
            abandon()
            raise RuntimeError(
                f"parameter '{name}' received a gradient outside its layer (a functional use "
                "such as F.linear(x, layer.weight), or a module the clipper did not patch); "
                "that use is neither clipped nor part of the release. Call the layer itself, "
                "or move the use into a module of its own")

    return hook


class _NodeCache(dict):
    """Parameter id -> its autograd AccumulateGrad node. A cache only: copies and pickles of a
    clipper start it empty (autograd nodes cannot be copied)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _NodeCache:
        return _NodeCache()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (_NodeCache, ())


class PerSampleClipper:
    """Clips per-example gradients of ``module`` and accumulates their sum for DP-SGD.

    Parameters
    ----------
    module:
        The model. Its supported layers are patched in place (undo with :meth:`remove`).
    max_grad_norm:
        Flat clipping: the bound C > 0. Per-layer clipping: a sequence of bounds C_l, one per
        trainable parameter (in :attr:`parameters` order), or one float C split equally,
        C_l = C / sqrt(L), so that the overall bound sqrt(sum C_l^2) is C.
    clipping:
        ``"flat"`` (one bound over the concatenation of all gradients) or ``"per_layer"``.
    loss_reduction:
        ``"mean"`` if the loss averages over the batch (output gradients are multiplied by the
        batch size to recover per-example gradients), ``"sum"`` if it sums. Either way the
        loss must be a sum of per-example terms (times a constant): a loss averaged over the
        batch's *tokens* (the Hugging Face ``labels=`` loss with padding) divides every
        example's gradient by a count that depends on the other examples, so one example
        moves the others' clipped gradients (4.6 C measured); sum each example's token losses
        (or average within each example) and average over the examples instead.
    rule:
        A clip-factor rule from :mod:`dpsharp.torch.clipping` (automatic, adaptive quantile)
        in place of min(1, C / ||g_i||); None for that standard rule.
    public_buffers:
        Names (as ``module.named_buffers()`` gives them) of buffers that the training forward
        may change without reading the data, e.g. a count of training steps. Every other
        buffer is watched: a backward pass after a forward that wrote one raises RuntimeError,
        since buffers are released with the model without noise (a running maximum or a
        quantisation observer would copy data into it).
    """

    def __init__(self, module: nn.Module, *, max_grad_norm: float | Sequence[float],
                 clipping: str = "flat", loss_reduction: str = "mean",
                 rule: Any = None, public_buffers: Iterable[str] = ()) -> None:
        from torch import nn

        from dpsharp.torch.layers import LayerHandle, patch_module

        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if clipping not in ("flat", "per_layer"):
            raise ValueError(f"clipping must be 'flat' or 'per_layer', got {clipping!r}")
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        from dpsharp.torch.engine import _made_private

        earlier = _made_private(module)
        if earlier is not None:
            raise ValueError(
                f"module was made private by {earlier}: gradients released through another "
                "clipper on it would not be charged to that engine's ledger, while the weights "
                "carry them. Train it through that engine's optimizer"
            )
        self._module = module
        # the model's buffers are released with it, without noise: a training forward that
        # writes one (from the data) is refused at the end of its backward pass
        self._buffer_watch = BufferWatch(module, public_buffers)
        # (graph task id, {parameter id: whether that pass accumulates its gradient})
        self._pass_answers: tuple[int | None, dict[int, bool]] = (None, {})
        self._accumulator_nodes = _NodeCache()  # parameter id -> its AccumulateGrad
        self._clipping = clipping
        self._loss_reduction = loss_reduction
        # A clip-factor rule (dpsharp.torch.clipping: automatic, adaptive quantile) in place of
        # min(1, C / ||g_i||); None: that standard rule.
        if rule is not None and getattr(rule, "structure", None) != clipping:
            raise ValueError(f"rule {rule!r} clips {getattr(rule, 'structure', None)!r}, "
                             f"but clipping={clipping!r}")
        self._rule = rule

        seen: set[int] = set()
        self._params: list[nn.Parameter] = []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._params.append(p)
        if not self._params:
            raise ValueError("module has no trainable parameters (requires_grad=True)")
        _require_releasable_dtypes(module, self._params)
        self._index = {id(p): k for k, p in enumerate(self._params)}

        if clipping == "flat":
            if isinstance(max_grad_norm, Sequence):
                raise ValueError("max_grad_norm must be one number for clipping='flat'")
            self._bounds = [require_positive_finite("max_grad_norm", max_grad_norm)]
            self._overall_bound = self._bounds[0]
        else:
            k = len(self._params)
            if isinstance(max_grad_norm, Sequence):
                bounds = [require_positive_finite(f"max_grad_norm[{i}]", c)
                          for i, c in enumerate(max_grad_norm)]
                if len(bounds) != k:
                    raise ValueError(
                        f"max_grad_norm must have one bound per trainable parameter ({k}), "
                        f"got {len(bounds)}"
                    )
            else:
                c = require_positive_finite("max_grad_norm", max_grad_norm)
                bounds = [c / math.sqrt(k)] * k
            self._bounds = bounds
            self._overall_bound = math.sqrt(math.fsum(b * b for b in bounds))

        # Plan: which module is handled how. Validate everything before patching anything.
        plan: list[tuple[nn.Module, str]] = []

        # Every module that cannot be trained is collected first, so that one error names
        # them all (what is wrong with each and what to do), before anything is patched.
        problems: dict[str, str] = {}

        def refuse(m: nn.Module, name: str) -> None:
            try:
                _refuse_cross_example(m, name)
            except ValueError as error:
                problems.setdefault(name, str(error))

        def walk(m: nn.Module, name: str) -> None:
            refuse(m, name)
            direct = list(m.named_parameters(recurse=False))
            if direct:
                try:
                    kind = _classify(m)
                except ValueError as error:
                    problems.setdefault(name, f"{type(m).__name__} ('{name or '<root>'}'): "
                                              f"{error}")
                    kind = "refused"
                if kind is None:
                    for sub_name, sub in m.named_modules(prefix=name):
                        refuse(sub, sub_name)
                    plan.append((m, "fallback"))
                    return
                plan.append((m, kind))
            for child_name, child in m.named_children():
                walk(child, f"{name}.{child_name}" if name else child_name)

        walk(module, "")
        if problems:
            count = len(problems)
            raise ValueError(
                f"{count} module{'s' if count > 1 else ''} of the model cannot be trained with "
                "per-example clipping:\n" + "\n".join(f"- {p}" for p in problems.values())
                + "\ndpsharp.torch.fix(model) replaces batch norms by group norms, drops "
                "running statistics and converts recurrent layers, and returns what it changed"
            )
        self._plan = plan
        self._handles: list[Any] = []
        for m, kind in plan:
            if not any(p.requires_grad for p in m.parameters()):
                continue
            handle = LayerHandle(m, self._record, self._scale_of)
            handle.forward_batch = self._forward_batch  # type: ignore[attr-defined]
            patch_module(m, kind, handle)
            self._handles.append(handle)

        self._pending: list[Any] = []
        self._callback_queued = False
        # Parameters held by more than one module (tied weights): their usages' cross terms
        # read the stored tensors, so those usages never materialise early (_record).
        counts: dict[int, int] = {}
        for _, p in module.named_parameters(remove_duplicate=False):
            counts[id(p)] = counts.get(id(p), 0) + 1
        self._tied_ids = {pid for pid, n in counts.items() if n > 1}
        # the arena of the per-example gradients materialised during the backward pass under
        # way (_record), None between passes
        self._open_arena: Any = None
        self._accumulators: list[torch.Tensor | None] = [None] * len(self._params)
        # clip factors lowered for half-precision parameters' roundings (_rounding_shrink):
        # per parameter, and for flat clipping the lowest of them
        self._shrink_dtypes: tuple[torch.dtype, ...] = ()
        self._update_shrinks()
        self._examples = 0
        self._batches = 0
        self._last_norms: torch.Tensor | None = None
        self._finish_order: list[int] = []  # parameter indices in the last backward's order
        self._armed: _ArmedRelease | None = None  # arm_release() waiting for a backward pass
        self._released_in_backward = False  # the last backward pass did the armed release
        # A backward pass of the release under way failed (a non-finite per-example gradient,
        # an exception inside the pass): its examples were not accumulated, so releasing the
        # rest would depend on their data. Cleared by reset().
        self._lot_failed = False
        # Set by the owning DPOptimizer around its own release (the only one allowed then).
        self._owner_releasing = False
        self._removed = False
        # dimension 0 of the model's first input tensor in every forward (with grad enabled)
        # since the last backward pass finished: the batch the clipped layers must see
        self._input_batches: set[int] = set()
        self._output_batches: set[int] = set()  # the same of its first output tensor
        self._input_hook = module.register_forward_pre_hook(self._record_input,
                                                            with_kwargs=True)
        self._output_hook = module.register_forward_hook(self._record_output)
        # A clipped parameter's gradient reaches autograd only through its patched layer,
        # which hands the engine none (the clipper writes p.grad at the release). A gradient
        # arriving means a use outside that layer (F.linear(x, layer.weight)): not clipped,
        # and overwritten at the release, so the training would be silently wrong.
        names = {id(p): name for name, p in module.named_parameters()}
        self._gradient_hooks = [
            p.register_hook(_refuse_unclipped_gradient(names.get(id(p), "?"),
                                                       self._abandon_pass))
            for p in self._params
        ]

    # ------------------------------------------------------------------ public state
    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters, in module order (each once, tied ones included once)."""
        return list(self._params)

    @property
    def max_grad_norm(self) -> float | list[float]:
        """The flat bound, or the list of per-layer bounds."""
        return self._bounds[0] if self._clipping == "flat" else list(self._bounds)

    @property
    def overall_bound(self) -> float:
        """C of the noise std sigma * C: the flat bound or sqrt(sum_l C_l^2)."""
        return self._overall_bound

    @property
    def rule(self) -> Any:
        """The clip-factor rule (dpsharp.torch.clipping), or None for min(1, C / ||g_i||)."""
        return self._rule

    def set_max_grad_norm(self, bound: float) -> None:
        """Change the flat bound C between releases (adaptive clipping): the factors and the
        noise std sigma C of the next release use it. Refused mid-release."""
        if self._clipping != "flat":
            raise ValueError("set_max_grad_norm needs clipping='flat'")
        if self._batches or self._armed is not None or self._pending:
            raise RuntimeError("the bound can only change between releases")
        c = require_positive_finite("max_grad_norm", bound)
        self._bounds = [c]
        self._overall_bound = c

    @property
    def clipping(self) -> str:
        return self._clipping

    @property
    def accumulated_examples(self) -> int:
        """Examples accumulated since the last release."""
        return self._examples

    @property
    def accumulated_batches(self) -> int:
        """Backward passes accumulated since the last release."""
        return self._batches

    @property
    def last_per_example_norms(self) -> torch.Tensor | None:
        """Per-example gradient norms of the last backward, before clipping, float64: shape (B,)
        for flat clipping, (B, L) per parameter for per-layer clipping."""
        return self._last_norms

    @property
    def handled_modules(self) -> list[tuple[str, str]]:
        """(module type, handler kind) for every patched module (for inspection)."""
        return [(type(m).__name__, kind) for m, kind in self._plan]

    # ------------------------------------------------------------------ batch checks
    def _record_input(self, module: nn.Module, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of the model: record dimension 0 of its first input tensor."""
        import torch

        if not torch.is_grad_enabled():
            return
        # the torch.func fallback re-runs a module per example inside the backward pass
        if any(getattr(h, "bypass", False) for h in self._handles):
            return
        self._refuse_unseen_trainable_parameters(module)
        self._drop_failed_pass()
        batch = _leading_dim((*args, *kwargs.values()))
        if batch is not None:
            self._input_batches.add(batch)

    def _refuse_unseen_trainable_parameters(self, module: nn.Module) -> None:
        """Refuse a forward pass with gradients while the model holds a trainable parameter
        that was not trainable (or not there) when it was made private: a layer unfrozen or a
        module added since. Its layer is not patched and has no refusing gradient hook, so
        backward() would hand it the raw batch gradient, neither clipped nor noised, for any
        optimizer to apply (progressive unfreezing with a second optimizer did exactly that
        while the engine reported a finite epsilon)."""
        # (ids from the parameter list itself, not self._index: a deep copy of the model copies
        # this hook's clipper with its parameters, but the ids in _index are the originals')
        index = {id(p) for p in self._params}
        if all(id(p) in index or not p.requires_grad for p in module.parameters()):
            return
        unseen = [name for name, p in module.named_parameters()
                  if p.requires_grad and id(p) not in index]
        listed = ", ".join(unseen[:8]) + (", ..." if len(unseen) > 8 else "")
        raise RuntimeError(
            f"parameters of the private model that are trainable now but were not when it was "
            f"made private (unfrozen or added since): {listed}. Their gradients would be "
            "neither clipped nor noised. Freeze them again (requires_grad_(False)); a model "
            "whose set of trainable parameters changes needs them trainable (or present) when "
            "it is made private"
        )

    def _record_output(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Forward hook of the model: record dimension 0 of its first output tensor (the batch
        the loss sees)."""
        import torch

        if not torch.is_grad_enabled() or any(getattr(h, "bypass", False)
                                               for h in self._handles):
            return
        batch = _leading_dim(output)
        if batch is not None:
            self._output_batches.add(batch)

    def _forward_batch(self) -> int | None:
        """Dimension 0 of the model's first input in the forward pass under way (None if not
        one number)."""
        return next(iter(self._input_batches)) if len(self._input_batches) == 1 else None

    def check_logical_batch(self, batch_size: int) -> None:
        """Refuse a release whose clipped examples are not the data loader's logical batch.

        ``batch_size`` is the number of examples the loader drew for this release; the
        clipper has clipped :attr:`accumulated_examples` examples (dimension 0 of the layer
        inputs, summed over the backward passes since the last release). They differ when the
        model sees the batch in another dimension (sequence-first) or when one batch went
        through several backward passes; either way an example's contribution is no longer
        bounded by the clipping norm. Raises ValueError (and releases nothing) then.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be an int >= 0, got {batch_size!r}")
        if self._examples != batch_size:
            raise ValueError(
                f"the clipped layers saw {self._examples} examples in dimension 0 since the last "
                f"release, but the data loader's batch has {batch_size} examples (each physical "
                "batch must go through exactly one backward pass). " + _BATCH_FIRST_HINT
            )

    # ------------------------------------------------------------------ backward side
    def _scale_of(self, batch: int) -> float:
        return float(batch) if self._loss_reduction == "mean" else 1.0

    def _record(self, usage: Any) -> None:
        import torch

        if not self._pass_writes_gradients(usage):
            # a backward pass that computes no gradient of these parameters (autograd.grad of
            # the inputs, as adversarial training and input-gradient penalties take it) is not
            # a micro-batch: clipped and counted, it would add the examples' contribution a
            # second time (2 C per example measured) and p.grad would not be written by it
            return

        from dpsharp.torch.layers import LinearUsage
        from dpsharp.torch.layers.usages import early_arena

        if isinstance(usage, LinearUsage) and not any(
                id(p) in self._tied_ids for p in usage.params()):
            # A layer whose per-example gradients the cost rule materialises: formed now, and
            # its stored input and output gradient freed while the backward pass goes on
            # (LinearUsage.materialise_early); the same values the clip step would form.
            if self._open_arena is None:
                self._open_arena = early_arena()
                self._open_arena.open_pass(id(self))
            usage.materialise_early(self._open_arena)
        self._pending.append(usage)
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _drop_failed_pass(self) -> None:
        """Outside any backward pass, drop a pass that recorded usages but never reached its
        end-of-pass step (an exception inside it, caught by the caller, e.g. out of memory):
        its examples were never clipped, and its pending step would otherwise block every
        later pass from queueing its own (they would all go unclipped, silently). The release
        it belonged to is then refused until :meth:`reset` (:meth:`check_releasable`)."""
        import torch

        current = getattr(torch._C, "_current_graph_task_id", None)
        if self._callback_queued and current is not None and current() == -1:
            self._abandon_pass()

    def _abandon_pass(self) -> None:
        """Drop what the backward pass under way recorded (nothing of it is clipped or
        counted) and close its arena: the pass is failing, and autograd will not run the
        end-of-pass step queued for it."""
        self._pending = []
        self._callback_queued = False
        self._lot_failed = True
        if self._open_arena is not None:
            self._open_arena.close_pass(id(self))
            self._open_arena = None

    def _pass_writes_gradients(self, usage: Any) -> bool:
        """Whether the backward pass under way accumulates into ``.grad`` a gradient of one of
        ``usage``'s parameters: ``loss.backward()`` does, ``torch.autograd.grad`` and
        ``backward(inputs=...)`` without them do not. Asked of the autograd engine once per
        parameter and pass (``torch._C._will_engine_execute_node`` on the parameter's
        gradient accumulator, the test torch.utils.checkpoint makes); where this torch lacks
        it, every pass counts, as before."""
        import torch

        will_execute = getattr(torch._C, "_will_engine_execute_node", None)
        task_id = getattr(torch._C, "_current_graph_task_id", None)
        if will_execute is None or task_id is None:
            return True
        task = task_id()
        if self._pass_answers[0] != task:
            self._pass_answers = (task, {})
        answers = self._pass_answers[1]
        for p in usage.params():
            answer = answers.get(id(p))
            if answer is None:
                accumulator = self._accumulator_nodes.get(id(p))
                if accumulator is None:
                    # held here, so the same node serves every later pass (cheap to ask)
                    with torch.enable_grad():
                        accumulator = p.view_as(p).grad_fn.next_functions[0][0]
                    self._accumulator_nodes[id(p)] = accumulator
                try:
                    answer = bool(will_execute(accumulator))
                except RuntimeError:  # autograd.grad with a parameter among its inputs
                    answer = False
                answers[id(p)] = answer
            if answer:
                return True
        return False

    def _finish_backward(self) -> None:
        try:
            self._finish_pass()
        except BaseException:
            self._lot_failed = True  # nothing of this pass was accumulated
            raise
        finally:
            # the gradients materialised during the pass are read: their memory may go again
            if self._open_arena is not None:
                self._open_arena.close_pass(id(self))
                self._open_arena = None

    def _finish_pass(self) -> None:
        import torch

        from dpsharp.torch.layers import LinearUsage
        from dpsharp.torch.layers.usages import begin_backward_pass, tied_sq_norm

        self._callback_queued = False
        usages, self._pending = self._pending, []
        if not usages:
            return
        self._update_shrinks()  # the model may have been cast since (Module.to keeps params)
        written = self._buffer_watch.changed()
        if written:
            raise RuntimeError(
                f"the model's buffers {written} were written since the clipper was built "
                "(e.g. running statistics or a quantisation observer updated by the training "
                "forward); buffers are released with the model without noise, so a buffer "
                "computed from the data leaks it. Make the module stop updating it in training "
                "(BatchNorm-like layers: replace them, see dpsharp.torch.fix; observers: freeze "
                "them), or, for a buffer computed from the parameters only, declare it with "
                "PerSampleClipper(..., public_buffers=[names])"
            )
        begin_backward_pass()
        inputs, self._input_batches = self._input_batches, set()
        outputs, self._output_batches = self._output_batches, set()
        batch = usages[0].batch_size
        repeated = False  # a linear layer called more than once in this forward
        linear_keys: set[tuple[int, int]] = set()
        for u in usages:
            if u.batch_size != batch:
                raise ValueError(
                    "layers saw different batch sizes in one backward pass "
                    f"({batch} and {u.batch_size}); the batch must be dimension 0 of every "
                    "layer input. " + _BATCH_FIRST_HINT
                )
            if isinstance(u, LinearUsage):
                key = (id(u.weight), id(u.bias))
                repeated = repeated or key in linear_keys
                linear_keys.add(key)
        for where, seen in (("input", inputs), ("output", outputs)):
            if seen and batch not in seen:
                raise ValueError(
                    f"the clipped layers saw a batch of {batch} in dimension 0, but the "
                    f"model's {where} has {' or '.join(map(str, sorted(seen)))} in dimension "
                    "0. " + _BATCH_FIRST_HINT + (
                        " A batch-first model that returns a sequence-first output on purpose "
                        "(e.g. for nn.CTCLoss) should return it batch-first and transpose it "
                        "outside the model." if where == "output" else "")
                )
        merged = self._merge_repeated_calls(usages) if repeated else usages

        by_param: dict[int, list[Any]] = {}
        index = self._index
        for u in merged:
            for p in u.params():
                if id(p) in index:
                    by_param.setdefault(id(p), []).append(u)

        # Per-example squared norms of every parameter, the last recorded layer first: the
        # layers whose stored tensors the backward pass touched last are read first, while still
        # in cache (within a layer its own order: a weight before its bias, which may reuse the
        # weight's work).
        order: list[tuple[int, list[Any]]] = []
        placed: set[int] = set()
        for u in reversed(merged):
            for p in u.params():
                pid = id(p)
                if pid in by_param and pid not in placed:
                    placed.add(pid)
                    order.append((pid, by_param[pid]))
        columns: dict[int, torch.Tensor] = {}
        tied: dict[int, torch.Tensor] = {}
        flat = self._clipping == "flat"
        flat_terms: list[kernels.SqNormTerm] = []
        # parameters whose per-example gradients are stored rows, measured and summed together
        row_terms: list[RowTerm] = []
        if flat and len(by_param) == sum(len(u.params()) for u in merged):
            # Flat clipping, no parameter used by two usages: each usage's parameters together
            # (one term per layer; a 2-D linear layer's weight and bias from two norm vectors).
            batch_rows = _batches_rows(self._params)
            for u in reversed(merged):
                ps = [p for p in u.params() if id(p) in index]
                if ps:
                    rows = u.row_terms(ps) if batch_rows else None
                    if rows is not None:
                        row_terms += rows
                    else:
                        flat_terms.append(u.flat_sq_norm_term(ps))
                    if isinstance(u, LinearUsage):  # its parameters are its own: see above
                        u.release_stored()
            if row_terms:
                # one call for the norms of every such parameter, scaled and summed: a term
                norms = kernels.per_example_sq_norms_many([t.rows for t in row_terms])
                s2 = torch.tensor([t.s2 for t in row_terms], dtype=torch.float64,
                                  device=norms.device)
                flat_terms.append(((norms * s2[:, None]).sum(dim=0), None, 0.0, 1.0))
        else:
            for pid, us in order:
                p = self._params[index[pid]]
                if len(us) == 1:
                    columns[pid] = us[0].sq_norm(p)
                    continue
                # Tied weights: the example's gradient is the sum over the uses. Ghost norm
                # ||sum_u g_u||^2 = sum_u ||g_u||^2 + 2 sum_{u<v} <g_u, g_v> where the pairs
                # allow it (embedding / linear: a language model's tied input embedding and
                # output projection), else the per-example gradients materialised and summed.
                ghost = tied_sq_norm(p, us)
                if ghost is not None:
                    columns[pid] = ghost
                else:
                    total = us[0].per_example(p)
                    for u in us[1:]:
                        total = total + u.per_example(p)
                    tied[pid] = total.contiguous()
                    columns[pid] = kernels.per_example_sq_norms(tied[pid])
        flat_factors: torch.Tensor | None = None
        if flat:
            # ||g_i||^2 summed over parameters (a NaN or inf in any of them stays in the sum),
            # its square root and the factors, in one pass.
            flat_terms += [(column, None, 0.0, 1.0) for column in columns.values()]
            if not flat_terms:
                flat_terms = [(torch.zeros(batch, dtype=torch.float64,
                                           device=self._params[0].device), None, 0.0, 1.0)]
            clipped = kernels.flat_clip_factors(flat_terms, self._bounds[0], batch)
            if clipped is None:
                self._raise_not_finite()
            # One factors tensor for every parameter (a usage reuses work between its weight
            # and bias when it is handed the same factors).
            norms, flat_factors = clipped
            if self._rule is not None:
                self._rule.observe(norms, self._bounds[0])
                flat_factors = self._rule.factors(norms, self._bounds[0])
                _require_within_bound(self._rule, flat_factors, norms, self._bounds[0])
            if self._flat_shrink != 1.0:
                flat_factors = flat_factors * self._flat_shrink
            flat_factors = _without_vanishing_factors(flat_factors, merged)
            self._last_norms = norms
        else:
            sq = torch.zeros(batch, len(self._params), dtype=torch.float64,
                             device=self._params[0].device)
            for pid, column in columns.items():
                sq[:, index[pid]] = column
            self._require_finite(sq)
            norms = sq.sqrt()
            bounds = torch.tensor(self._bounds, dtype=torch.float64, device=norms.device)
            if self._rule is not None:
                self._rule.observe(norms, bounds)
                factors_all = self._rule.factors(norms, bounds)
                _require_within_bound(self._rule, factors_all, norms, bounds)
            else:
                factors_all = self._factors(norms, bounds)
            for k, shrink in enumerate(self._shrinks):
                if shrink != 1.0:
                    factors_all[:, k] *= shrink
            factors_all = _without_vanishing_factors(factors_all, merged)
            self._last_norms = norms

        accumulators = self._accumulators
        # the clipped sums of the stored-row parameters in one call, where nothing of this
        # release is accumulated yet for them (a later backward pass adds in place instead)
        summed_rows: dict[int, torch.Tensor] = {}
        fresh = [t for t in row_terms if accumulators[index[id(t.param)]] is None]
        if fresh:
            assert flat_factors is not None
            sums = kernels.weighted_rows_float32_many([t.rows for t in fresh], flat_factors,
                                                      [t.scale for t in fresh])
            summed_rows = {id(t.param): t.finish(total) for t, total in zip(fresh, sums)}
        self._finish_order = [index[pid] for pid, _ in order]
        self._released_in_backward = False
        for pid, us in order:
            k = index[pid]
            p = self._params[k]
            factors = flat_factors if flat_factors is not None else factors_all[:, k].contiguous()
            acc = accumulators[k]
            wide = _accumulator_dtype(p.dtype)
            if pid in tied:
                out = (acc if acc is not None
                       else torch.zeros(p.shape, dtype=wide, device=p.device))
                rows = tied[pid] if tied[pid].dtype == wide else tied[pid].to(wide)
                kernels.clip_accumulate_noise(out, per_example=rows, factors=factors, base=out)
                accumulators[k] = out
                continue
            if acc is None:
                contribution = summed_rows.pop(pid, None)
                if contribution is None:
                    contribution = us[0].clipped_sum(p, factors)
                if contribution.dtype == wide and contribution.is_contiguous():
                    accumulators[k] = contribution
                else:
                    accumulators[k] = contribution.to(wide).contiguous()
                rest = us[1:]  # the other uses of a tied weight (ghost path), added in place
            else:  # a later backward pass of the same release: add in place
                rest = us
            for u in rest:
                u.add_clipped_sum(p, factors, accumulators[k])
        self._examples += batch
        self._batches += 1
        armed, self._armed = self._armed, None
        if armed is not None:
            self._write_release(armed.key, armed.noise_multiplier, armed.expected_batch_size)
            self._released_in_backward = True

    @staticmethod
    def _merge_repeated_calls(usages: list[Any]) -> list[Any]:
        """Several calls of one linear layer: one usage over the concatenated sequence (its
        per-example gradient is a sum over all positions of all calls), placed where the layer's
        first call was recorded, so the list keeps the backward order."""
        from dpsharp.torch.layers import LinearUsage

        groups: dict[tuple[int, int], list[Any]] = {}
        for u in usages:
            if isinstance(u, LinearUsage):
                groups.setdefault((id(u.weight), id(u.bias)), []).append(u)
        merged: list[Any] = []
        for u in usages:
            if not isinstance(u, LinearUsage):
                merged.append(u)
                continue
            group = groups.pop((id(u.weight), id(u.bias)), None)
            if group is None:
                continue  # merged with an earlier call of the same layer
            # calls whose gradients were materialised early are merged by summing them
            early = any(g.a is None for g in group)
            shapes = {(tuple(g.a.shape[2:]), tuple(g.g.shape[2:])) for g in group
                      if g.a is not None}
            if len(group) > 1 and (early or len(shapes) == 1):
                merged.append(LinearUsage.merge(group))
            else:
                merged.extend(group)
        return merged

    @staticmethod
    def _raise_not_finite() -> None:
        raise FloatingPointError(
            "a per-example gradient is not finite (NaN or inf): nothing of this backward pass "
            "was accumulated, and this logical batch will not be released (releasing it "
            "without the examples at fault would depend on their data), so the run cannot go "
            "on from here. Check the loss and the learning rate, and resume from the last "
            "checkpoint (PrivacyEngine.state_dict / load_state_dict, in a new engine)"
        )

    @classmethod
    def _require_finite(cls, sq: torch.Tensor) -> None:
        import torch

        # The entries are >= 0: a finite sum (one reduction, the common case) means every entry
        # is finite; an infinite one may also be an overflow of finite entries.
        if not math.isfinite(float(sq.sum())) and not bool(torch.isfinite(sq).all()):
            cls._raise_not_finite()

    @staticmethod
    def _rounding_shrink(params: list[Any]) -> float:
        """1 / (1 + 4 u) for the coarsest half-precision dtype u among ``params``, else 1.

        A half-precision parameter's clipped sum used to be rounded to its dtype, accumulated
        into its gradient buffer and have the noise added in that dtype: up to three
        roundings, each at most u = 2^-8 (bfloat16) or 2^-11 (float16) relative, which put
        one example's contribution up to 0.12% above C (a bfloat16 LayerNorm, measured). The
        sum is now accumulated in float32 (:func:`_accumulator_dtype`) and rounded once after
        the noise; the shrink is kept for the roundings of the per-example terms formed from
        half-precision tensors. Float32 and float64 parameters' roundings stay inside the
        clipping's 1e-6 tolerance and need none."""
        import torch

        units = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
        unit = max((units.get(p.dtype, 0.0) for p in params), default=0.0)
        return 1.0 / (1.0 + 4.0 * unit) if unit else 1.0

    def _update_shrinks(self) -> None:
        """The shrinks of :meth:`_rounding_shrink` for the parameters' dtypes now (kept
        until a dtype changes)."""
        dtypes = tuple(p.dtype for p in self._params)
        if dtypes != self._shrink_dtypes:
            self._shrinks = [self._rounding_shrink([p]) for p in self._params]
            self._flat_shrink = min(self._shrinks, default=1.0)
            self._shrink_dtypes = dtypes

    @staticmethod
    def _factors(norms: torch.Tensor, bound: Any) -> torch.Tensor:
        """c = min(1, C / norm), with c = 1 for a zero gradient (computed in float64; a zero norm
        divides by the smallest positive double instead, and C / 2^-1074 = inf clamps to 1)."""
        return (bound / norms.clamp_min(5e-324)).clamp_(max=1.0)

    # ------------------------------------------------------------------ release
    def _release_arguments(self, noise_multiplier: float, expected_batch_size: float,
                           noise: NoiseGenerator) -> tuple[float, float]:
        from dpsharp.torch.noise import NoiseGenerator

        if self._removed:
            raise RuntimeError("this clipper was removed")
        self._require_owner_release()
        sigma = require_real("noise_multiplier", noise_multiplier)
        if sigma < 0.0:
            raise ValueError(f"noise_multiplier must be in [0, inf), got {sigma!r}")
        b = require_positive_finite("expected_batch_size", expected_batch_size)
        if not isinstance(noise, NoiseGenerator):
            raise TypeError(f"noise must be a NoiseGenerator, got {type(noise).__name__}")
        return sigma, b

    def release(self, *, noise_multiplier: float, expected_batch_size: float,
                noise: NoiseGenerator) -> None:
        """Write ``p.grad = (clipped sum + N(0, (noise_multiplier * C)^2)) / expected_batch_size``
        for every trainable parameter, then reset the accumulators.

        The noise of parameter index k is stream k of one fresh release of ``noise``. With
        nothing accumulated (an empty Poisson batch) the gradient is pure noise / B. After
        :meth:`arm_release` the arguments must be the armed ones, and the armed release's
        noise is used (this is how an armed release with no backward pass goes out).
        """
        sigma, b = self._release_arguments(noise_multiplier, expected_batch_size, noise)
        self._drop_failed_pass()
        if self._pending:
            raise RuntimeError("release() called in the middle of a backward pass")
        self.check_releasable()
        if self._released_in_backward and self._batches == 0:
            raise RuntimeError(
                "this release already went out at the end of the backward pass (arm_release); "
                "step the optimizer, and arm or accumulate the next release first"
            )
        armed = self._armed
        if armed is not None:
            if (sigma, b) != (armed.noise_multiplier, armed.expected_batch_size) or (
                    noise is not armed.noise):
                raise ValueError(
                    "release() arguments differ from the armed release's (noise_multiplier "
                    f"{armed.noise_multiplier}, expected_batch_size "
                    f"{armed.expected_batch_size} and its NoiseGenerator); call reset() to "
                    "disarm"
                )
            key = armed.key
            self._armed = None
        else:
            key = noise.next_release()
        self._write_release(key, sigma, b)

    def _write_release(self, key: ReleaseKey, sigma: float, b: float) -> None:
        """p.grad = (accumulated clipped sum + N(0, (sigma C)^2)) / b for every trainable
        parameter (parameter k: stream k of ``key``), one fused kernel call; then reset."""
        import torch

        std = sigma * self._overall_bound
        # The accumulators the last backward pass wrote last come first, while still in cache.
        order = list(reversed(self._finish_order))
        written = set(order)
        order += [k for k in range(len(self._params)) if k not in written]
        params, accumulators = self._params, self._accumulators
        outs = [accumulators[k] if accumulators[k] is not None
                else torch.empty(params[k].shape, dtype=params[k].dtype, device=params[k].device)
                for k in order]
        kernels.release_noise(outs, [accumulators[k] for k in order], noise_std=std,
                              key=key.key, release=key.release, rank=key.rank, scale=1.0 / b,
                              parameters=order)
        for k, out in zip(order, outs):
            # a half-precision parameter's sum and noise were added in float32: one rounding
            # to its dtype now, after the noise (post-processing)
            params[k].grad = out if out.dtype == params[k].dtype else out.to(params[k].dtype)
        self._accumulators = [None] * len(self._params)
        self._examples = 0
        self._batches = 0

    def _require_owner_release(self) -> None:
        """A clipper a :class:`~dpsharp.torch.DPOptimizer` owns releases through that
        optimizer's ``step()`` only: a release called on the clipper directly would reach no
        ledger (and could go out with any noise, sigma = 0 included)."""
        owner_ref = getattr(self, "_dpsharp_optimizer", None)
        owner = owner_ref() if owner_ref is not None else None
        if owner is not None and not self._owner_releasing:
            raise RuntimeError(
                "this clipper belongs to a DPOptimizer, which releases its noisy gradients in "
                "optimizer.step() (charged by its engine, counted by the optimizer); a release "
                "called on the clipper directly would be neither. Call optimizer.step(), or "
                "build a separate PerSampleClipper for releases of your own"
            )

    def check_releasable(self) -> None:
        """Raise unless the accumulated clipped sums can be released: no backward pass of this
        release failed (:attr:`_lot_failed`, cleared by :meth:`reset`), and every trainable
        parameter still has a dtype the noise kernels write (the model may have been cast
        since the clipper was built). A :class:`~dpsharp.torch.DPOptimizer` asks before it
        charges anything."""
        if self._lot_failed:
            raise RuntimeError(
                "a backward pass of this release failed (a non-finite per-example gradient, or "
                "an exception inside the pass): its examples were not accumulated, and "
                "releasing the others would depend on their data, so nothing is released. "
                "Resume from the last checkpoint; reset() drops the whole release if you "
                "decide to go on without it"
            )
        _require_releasable_dtypes(None, self._params)

    def arm_release(self, *, noise_multiplier: float, expected_batch_size: float,
                    noise: NoiseGenerator) -> None:
        """Make the next backward pass the release: at its end every trainable parameter gets
        ``p.grad = (clipped sum + N(0, (noise_multiplier * C)^2)) / expected_batch_size``, as
        :meth:`release` would write it, with no separate :meth:`release` call.

        The release's key is drawn from ``noise`` now; at the end of the backward pass the
        clipped sums are formed and released by the same fused kernel as :meth:`release`, so the
        gradients are bit-for-bit those of ``release()`` after the backward pass. A convenience
        for a loop that releases after every backward pass (one backward per step):
        ``zero_grad``, ``arm_release``, forward, backward, ``optimizer.step()``.

        Must be called before the first backward pass of a release (nothing accumulated). The
        armed release covers exactly the next backward pass; if none comes (an empty Poisson
        batch), :meth:`release` with the same arguments sends the armed release out as pure
        noise. :meth:`reset` disarms (the drawn key is then never used).
        """
        self._release_arguments(noise_multiplier, expected_batch_size, noise)
        if self._pending:
            raise RuntimeError("arm_release() called in the middle of a backward pass")
        self.check_releasable()
        if self._armed is not None:
            raise RuntimeError("a release is already armed; run the backward pass (or reset())")
        if self._batches:
            raise RuntimeError(
                "clipped gradients of this release are already accumulated; arm before the "
                "release's first backward pass, or call release()"
            )
        self._armed = _ArmedRelease(float(noise_multiplier), float(expected_batch_size), noise,
                                    noise.next_release())
        self._released_in_backward = False

    def reset(self) -> None:
        """Drop the accumulated clipped sums (and an armed release) without releasing
        anything."""
        self._accumulators = [None] * len(self._params)
        self._examples = 0
        self._batches = 0
        self._armed = None
        self._released_in_backward = False
        self._lot_failed = False
        self._input_batches = set()
        self._output_batches = set()
        if self._rule is not None:
            self._rule.reset()

    def remove(self) -> None:
        """Restore the module's original forwards and drop all state."""
        for handle in self._handles:
            m = handle.module
            if "forward" in m.__dict__:
                del m.forward
        self._handles = []
        self._input_hook.remove()
        self._output_hook.remove()
        for hook in self._gradient_hooks:
            hook.remove()
        self._gradient_hooks = []
        self._accumulator_nodes = _NodeCache()
        self.reset()
        self._removed = True
