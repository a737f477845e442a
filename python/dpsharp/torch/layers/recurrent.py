"""Recurrent layers built from ``nn.Linear`` maps, for per-example clipping.

``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` keep their weights as fused (cuDNN-style) tensors and
run the recurrence inside one opaque kernel, so the clipper cannot see the per-time-step
products that make up an example's gradient. :class:`DPRNN`, :class:`DPGRU` and
:class:`DPLSTM` compute exactly the same function with every weight inside an ``nn.Linear``:
per layer and direction, ``ih`` (input to gates, one call on the whole sequence (B, T, d)),
``hh`` (hidden to gates, one call per time step on (B, h)) and, for an LSTM with
``proj_size``, ``hr`` (the projection, one call per step). The clipper's linear path then
applies: the calls of one layer within a forward are merged into one usage over the
concatenated positions, so the per-example gradient of W_hh is the *sum* over time steps of
gy_{i,t} h_{i,t-1}^T before any norm is taken (Goodfellow 2015; Li et al. 2022, ghost norms),
never one clip per time step.

The recurrences are those of PyTorch's documentation (Hochreiter and Schmidhuber 1997 for the
LSTM, with forget gate as Gers et al. 2000; Cho et al. 2014 for the GRU; Sak et al. 2014 for
the projection), with gates in PyTorch's order:

* RNN:  h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh), act = tanh or relu;
* GRU:  r, z = sigmoid(W_i{r,z} x_t + b_i{r,z} + W_h{r,z} h_{t-1} + b_h{r,z}),
  n = tanh(W_in x_t + b_in + r * (W_hn h_{t-1} + b_hn)), h_t = (1 - z) n + z h_{t-1};
* LSTM: i, f, o = sigmoid(...), g = tanh(...), c_t = f c_{t-1} + i g,
  h_t = o tanh(c_t) (times W_hr with ``proj_size``).

Batch dimension: the layers always run batch-first inside (an input with
``batch_first=False``, (T, B, d), is transposed), so every inner ``nn.Linear`` sees the batch
in dimension 0 and clipping is per example. Packed sequences
(:func:`torch.nn.utils.rnn.pack_padded_sequence`) are run padded with a mask: at a step
t >= length_i the state of example i is carried over unchanged and its output is zero, so
padded steps add nothing to any gradient, the reverse direction starts at each example's own
last element, and h_n / c_n are each example's state at its last element, as PyTorch's packed
kernels give.

Interchangeability: :func:`convert_recurrent` replaces every ``nn.RNN`` / ``nn.GRU`` /
``nn.LSTM`` in a model by its DP counterpart *sharing the same Parameter objects* (an
optimizer built before the conversion keeps working). The DP modules' ``state_dict`` uses
PyTorch's names (``weight_ih_l0``, ``bias_hh_l1_reverse``, ``weight_hr_l0``...), so
``nn.LSTM`` loads a DP module's state dict and a DP module loads ``nn.LSTM``'s;
:meth:`DPRNNBase.to_torch` gives the plain module back.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

__all__ = ["DPGRU", "DPLSTM", "DPRNN", "DPRNNBase", "convert_recurrent"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}


class _Direction(nn.Module):
    """One layer, one direction: the linear maps ``ih``, ``hh`` and (LSTM with a projection)
    ``hr``."""

    def __init__(self, gates: int, input_size: int, hidden_size: int, proj_size: int,
                 bias: bool, factory: dict[str, Any]) -> None:
        super().__init__()
        self.ih = nn.Linear(input_size, gates * hidden_size, bias=bias, **factory)
        self.hh = nn.Linear(proj_size or hidden_size, gates * hidden_size, bias=bias,
                            **factory)
        self.hr = nn.Linear(hidden_size, proj_size, bias=False, **factory) if proj_size else None


class DPRNNBase(nn.Module):
    """Multi-layer (bidirectional) RNN / GRU / LSTM whose weights live in ``nn.Linear`` maps.

    Same constructor arguments, forward signature, outputs and ``state_dict`` keys as
    :class:`torch.nn.RNN` / :class:`torch.nn.GRU` / :class:`torch.nn.LSTM` (module
    docstring); built by :class:`DPRNN`, :class:`DPGRU`, :class:`DPLSTM`.
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"mode must be one of {sorted(_GATES)}, got {mode!r}")
        for name, value, low in (("input_size", input_size, 1), ("hidden_size", hidden_size, 1),
                                 ("num_layers", num_layers, 1), ("proj_size", proj_size, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not (
                0.0 <= dropout <= 1.0):
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size is only supported by the LSTM")
        if proj_size >= hidden_size:
            raise ValueError(f"proj_size must be in [0, hidden_size) = [0, {hidden_size}), "
                             f"got {proj_size}")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.proj_size = proj_size
        factory = {"device": device, "dtype": dtype}
        directions = 2 if bidirectional else 1
        out_size = proj_size or hidden_size
        self.cells = nn.ModuleList()
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else out_size * directions
            for _ in range(directions):
                self.cells.append(_Direction(_GATES[mode], layer_input, hidden_size, proj_size,
                                             self.bias, factory))
        self.reset_parameters()
        self.register_state_dict_post_hook(_save_torch_names)
        self.register_load_state_dict_pre_hook(_load_torch_names)

    # ------------------------------------------------------------------ names and weights
    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def reset_parameters(self) -> None:
        """U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for every weight and bias, as PyTorch's
        recurrent layers initialise theirs."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-bound, bound)

    def torch_names(self) -> list[tuple[str, str]]:
        """(PyTorch name, name in this module) for every weight, in PyTorch's order."""
        pairs: list[tuple[str, str]] = []
        for layer in range(self.num_layers):
            for direction in range(self.num_directions):
                suffix = f"l{layer}" + ("_reverse" if direction else "")
                cell = f"cells.{layer * self.num_directions + direction}"
                pairs += [(f"weight_ih_{suffix}", f"{cell}.ih.weight"),
                          (f"weight_hh_{suffix}", f"{cell}.hh.weight")]
                if self.bias:
                    pairs += [(f"bias_ih_{suffix}", f"{cell}.ih.bias"),
                              (f"bias_hh_{suffix}", f"{cell}.hh.bias")]
                if self.proj_size:
                    pairs.append((f"weight_hr_{suffix}", f"{cell}.hr.weight"))
        return pairs

    def flatten_parameters(self) -> None:
        """No-op (the weights are not one flat cuDNN buffer), kept for code that calls it."""

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        if self.mode == "RNN_RELU":
            text += ", nonlinearity='relu'"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False), ("proj_size", 0)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text

    def _torch_class(self) -> type[nn.RNNBase]:
        return {"LSTM": nn.LSTM, "GRU": nn.GRU}.get(self.mode, nn.RNN)

    def _torch_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "num_layers": self.num_layers, "bias": self.bias, "batch_first": self.batch_first,
            "dropout": self.dropout, "bidirectional": self.bidirectional,
        }
        if self.mode == "LSTM":
            kwargs["proj_size"] = self.proj_size
        elif self.mode != "GRU":
            kwargs["nonlinearity"] = "relu" if self.mode == "RNN_RELU" else "tanh"
        return kwargs

    def to_torch(self) -> nn.RNNBase:
        """The equivalent ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` with copies of these weights
        (same device and dtype, same training mode)."""
        weight = self.cells[0].ih.weight
        plain = self._torch_class()(self.input_size, self.hidden_size, device=weight.device,
                                    dtype=weight.dtype, **self._torch_kwargs())
        plain.load_state_dict(self.state_dict())
        plain.train(self.training)
        return plain

    @classmethod
    def from_torch(cls, module: nn.RNNBase) -> DPRNNBase:
        """The DP counterpart of ``module`` sharing its Parameter objects (so an optimizer
        holding them keeps working) and its training mode."""
        if not isinstance(module, (nn.RNN, nn.GRU, nn.LSTM)):
            raise TypeError("module must be an nn.RNN, nn.GRU or nn.LSTM, got "
                            f"{type(module).__name__}")
        mode = module.mode
        weight = module.weight_ih_l0
        dp = DPRNNBase(mode, module.input_size, module.hidden_size, module.num_layers,
                       module.bias, module.batch_first, float(module.dropout),
                       module.bidirectional, int(getattr(module, "proj_size", 0)),
                       device="meta", dtype=weight.dtype)
        dp.__class__ = {"LSTM": DPLSTM, "GRU": DPGRU}.get(mode, DPRNN)
        for torch_name, name in dp.torch_names():
            *path, leaf = name.split(".")
            owner: nn.Module = dp
            for part in path:
                owner = getattr(owner, part)
            setattr(owner, leaf, getattr(module, torch_name))
        dp.train(module.training)
        return dp

    # ------------------------------------------------------------------ forward
    def _step(self, cell: _Direction, gi: torch.Tensor, h: torch.Tensor,
              c: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One time step: (h_t, c_t) from the input's gate pre-activations ``gi`` (B, G h)
        and the previous state."""
        gh = cell.hh(h)
        if self.mode == "LSTM":
            i, f, g, o = (gi + gh).chunk(4, dim=1)
            assert c is not None
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)
            if cell.hr is not None:
                h_new = cell.hr(h_new)
            return h_new, c_new
        if self.mode == "GRU":
            ir, iz, in_ = gi.chunk(3, dim=1)
            hr, hz, hn = gh.chunk(3, dim=1)
            r = torch.sigmoid(ir + hr)
            z = torch.sigmoid(iz + hz)
            n = torch.tanh(in_ + r * hn)
            return n + z * (h - n), None
        pre = gi + gh
        return (torch.tanh(pre) if self.mode == "RNN_TANH" else torch.relu(pre)), None

    def forward(self, input: Any, hx: Any = None) -> tuple[Any, Any]:  # noqa: A002
        packed = isinstance(input, PackedSequence)
        unbatched = False
        lengths: torch.Tensor | None = None
        if packed:
            x, lengths = pad_packed_sequence(input, batch_first=True)  # the caller's order
        else:
            if not isinstance(input, torch.Tensor):
                raise TypeError("input must be a tensor or a PackedSequence, got "
                                f"{type(input).__name__}")
            if input.dim() not in (2, 3):
                raise ValueError(f"input must have 2 (unbatched) or 3 dimensions, got shape "
                                 f"{tuple(input.shape)}")
            unbatched = input.dim() == 2
            x = input.unsqueeze(0) if unbatched else (
                input if self.batch_first else input.transpose(0, 1))
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input has {x.shape[-1]} features, expected input_size="
                             f"{self.input_size}")
        batch, steps = int(x.shape[0]), int(x.shape[1])
        states = self.num_layers * self.num_directions
        out_size = self.proj_size or self.hidden_size
        h0, c0 = self._initial_state(hx, unbatched, states, batch, out_size, x)

        mask = None
        if lengths is not None:
            positions = torch.arange(steps, device=x.device)
            mask = (positions[None, :] < lengths.to(x.device)[:, None]).unsqueeze(-1)  # (B,T,1)
        layer_input = x
        h_n: list[torch.Tensor] = []
        c_n: list[torch.Tensor] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.num_directions):
                index = layer * self.num_directions + direction
                cell = self.cells[index]
                gates_in = cell.ih(layer_input)  # (B, T, G h): one call for the sequence
                h = h0[index]
                c = c0[index] if c0 is not None else None
                per_step: list[torch.Tensor] = [x] * steps
                order = range(steps - 1, -1, -1) if direction else range(steps)
                for t in order:
                    h_new, c_new = self._step(cell, gates_in[:, t], h, c)
                    if mask is None:
                        h, c = h_new, c_new
                        per_step[t] = h_new
                    else:
                        valid = mask[:, t]
                        h = torch.where(valid, h_new, h)
                        if c is not None and c_new is not None:
                            c = torch.where(valid, c_new, c)
                        per_step[t] = torch.where(valid, h_new, torch.zeros_like(h_new))
                if steps:
                    outputs.append(torch.stack(per_step, dim=1))
                else:
                    outputs.append(x.new_zeros(batch, 0, out_size))
                h_n.append(h)
                if c is not None:
                    c_n.append(c)
            layer_input = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, p=self.dropout, training=True)
        h_out = torch.stack(h_n)
        state: Any = (h_out, torch.stack(c_n)) if self.mode == "LSTM" else h_out

        if packed:
            assert lengths is not None
            order_ix = input.sorted_indices
            y = layer_input if order_ix is None else layer_input.index_select(
                0, order_ix.to(layer_input.device))
            sorted_lengths = lengths if order_ix is None else lengths.index_select(
                0, order_ix.to(lengths.device))
            data = pack_padded_sequence(y, sorted_lengths, batch_first=True,
                                        enforce_sorted=True).data
            return PackedSequence(data, input.batch_sizes, input.sorted_indices,
                                  input.unsorted_indices), state
        y = layer_input
        if unbatched:
            y = y.squeeze(0)
            state = (state[0].squeeze(1), state[1].squeeze(1)) if isinstance(state, tuple) \
                else state.squeeze(1)
        elif not self.batch_first:
            y = y.transpose(0, 1)
        return y, state

    def _initial_state(self, hx: Any, unbatched: bool, states: int, batch: int,
                       out_size: int, x: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h0, c0) as (states, B, size) tensors (c0 None but for the LSTM); zeros if hx is
        None."""
        lstm = self.mode == "LSTM"
        if hx is None:
            h0 = x.new_zeros(states, batch, out_size)
            c0 = x.new_zeros(states, batch, self.hidden_size) if lstm else None
            return h0, c0
        if lstm:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise TypeError("hx of an LSTM must be a tuple (h_0, c_0)")
            h0, c0 = hx
        else:
            if not isinstance(hx, torch.Tensor):
                raise TypeError(f"hx must be a tensor, got {type(hx).__name__}")
            h0, c0 = hx, None
        if unbatched:
            h0 = h0.unsqueeze(1)
            c0 = c0.unsqueeze(1) if c0 is not None else None
        expected = [(states, batch, out_size)] + ([(states, batch, self.hidden_size)]
                                                   if lstm else [])
        for name, tensor, shape in zip(("h_0", "c_0"), (h0, c0), expected):
            assert tensor is not None
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
        return h0, c0


def _save_torch_names(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                      local_metadata: Any) -> None:
    """State-dict post hook: this module's entries under PyTorch's names, in PyTorch's order."""
    assert isinstance(module, DPRNNBase)
    for torch_name, name in module.torch_names():
        if prefix + name in state_dict:
            state_dict[prefix + torch_name] = state_dict.pop(prefix + name)


def _load_torch_names(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                      *args: Any) -> None:
    """Load pre-hook: PyTorch's names (from ``nn.LSTM`` or this module) to the inner ones."""
    assert isinstance(module, DPRNNBase)
    for torch_name, name in module.torch_names():
        if prefix + torch_name in state_dict:
            state_dict[prefix + name] = state_dict.pop(prefix + torch_name)


class DPRNN(DPRNNBase):
    """``nn.RNN`` built from ``nn.Linear`` maps (:class:`DPRNNBase`); ``nonlinearity`` is
    ``"tanh"`` or ``"relu"``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype)


class DPGRU(DPRNNBase):
    """``nn.GRU`` built from ``nn.Linear`` maps (:class:`DPRNNBase`)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype)


class DPLSTM(DPRNNBase):
    """``nn.LSTM`` built from ``nn.Linear`` maps (:class:`DPRNNBase`), ``proj_size``
    included."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


def convert_recurrent(model: nn.Module) -> nn.Module:
    """Replace every ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` in ``model`` by :class:`DPRNN` /
    :class:`DPGRU` / :class:`DPLSTM` sharing the same Parameter objects.

    Returns the converted model: ``model`` itself, changed in place, or the new module when
    ``model`` is itself a recurrent layer. Outputs, parameters and state-dict keys are
    unchanged (module docstring), so checkpoints load either way. Other modules are left
    alone.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, (nn.RNN, nn.GRU, nn.LSTM)):
        return DPRNNBase.from_torch(model)
    if isinstance(model, nn.RNNBase):
        raise ValueError(f"{type(model).__name__} is a recurrent layer with no DP counterpart; "
                         "use nn.RNN, nn.GRU or nn.LSTM")
    for name, child in list(model.named_children()):
        converted = convert_recurrent(child)
        if converted is not child:
            setattr(model, name, converted)
    return model
