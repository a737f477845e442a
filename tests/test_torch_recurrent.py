"""Recurrent layers (nn.RNN / nn.GRU / nn.LSTM) under per-example clipping.

Reference: for each example i, the gradient of the loss on the batch {x_i} alone by plain
autograd on an unconverted copy of the ORIGINAL PyTorch module (its fused kernels), in float64;
the clipped sum is sum_i min(1, C / ||g_i||) g_i (Abadi et al. 2016, Algorithm 1). The
converted model shares the original's Parameter objects, so parameters are matched by name in
the original module.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from dpsharp.torch import (  # noqa: E402
    BudgetExhausted,
    NoiseGenerator,
    PerSampleClipper,
    PoissonDataLoader,
    PrivacyBudget,
    PrivacyEngine,
)
from dpsharp.torch.layers.recurrent import (  # noqa: E402
    DPGRU,
    DPLSTM,
    DPRNN,
    convert_recurrent,
)

pytestmark = pytest.mark.torch

KINDS = ["rnn_tanh", "rnn_relu", "gru", "lstm", "lstm_proj"]


def make_recurrent(kind: str, input_size: int, hidden: int, *, layers: int = 1,
                   bidirectional: bool = False, batch_first: bool = True, bias: bool = True,
                   dtype: torch.dtype = torch.float64) -> nn.Module:
    common = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first,
              "bias": bias, "dtype": dtype}
    if kind.startswith("rnn"):
        return nn.RNN(input_size, hidden, nonlinearity=kind[4:], **common)
    if kind == "gru":
        return nn.GRU(input_size, hidden, **common)
    return nn.LSTM(input_size, hidden, proj_size=hidden - 1 if kind == "lstm_proj" else 0,
                   **common)


class Classifier(nn.Module):
    """Batch-first input (B, T, d) [and lengths] -> (B, 2): recurrent layer, then a linear head
    on the time-summed output and the last hidden state. A sequence-first recurrent layer gets
    its input transposed here, so the model's input and output keep the batch in dim 0."""

    def __init__(self, rnn: nn.Module, out_size: int, state_size: int) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(out_size + state_size, 2, dtype=torch.float64)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        batch_first = self.rnn.batch_first
        if lengths is not None:
            inp = pack_padded_sequence(x if batch_first else x.transpose(0, 1), lengths,
                                       batch_first=batch_first, enforce_sorted=False)
            out, state = self.rnn(inp)
            out, _ = pad_packed_sequence(out, batch_first=True)
        else:
            out, state = self.rnn(x if batch_first else x.transpose(0, 1))
            out = out if batch_first else out.transpose(0, 1)
        h = state[0] if isinstance(state, tuple) else state
        return self.head(torch.cat([out.sum(dim=1), h[-1]], dim=1))


def build(kind: str, *, input_size: int, hidden: int, layers: int, bidirectional: bool,
          batch_first: bool, bias: bool) -> Classifier:
    rnn = make_recurrent(kind, input_size, hidden, layers=layers, bidirectional=bidirectional,
                         batch_first=batch_first, bias=bias)
    out = (hidden - 1 if kind == "lstm_proj" else hidden) * (2 if bidirectional else 1)
    return Classifier(rnn, out, out // (2 if bidirectional else 1))


def reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              lengths: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """name -> per-example gradients (B, *shape) by batch-size-1 autograd on the original."""
    ref = copy.deepcopy(model)
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, _ in ref.named_parameters()}
    for i in range(x.shape[0]):
        ref.zero_grad(set_to_none=True)
        if lengths is None:
            out = ref(x[i:i + 1])
        else:
            out = ref(x[i:i + 1, :int(lengths[i])], lengths[i:i + 1])
        F.mse_loss(out, y[i:i + 1]).backward()
        for n, p in ref.named_parameters():
            rows[n].append(p.grad.clone() if p.grad is not None else torch.zeros_like(p))
    return {n: torch.stack(r) for n, r in rows.items()}


def check_clipped_sums(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                       lengths: torch.Tensor | None, bound: float) -> None:
    per_example = reference(model, x, y, lengths)
    names = {id(p): n for n, p in model.named_parameters()}
    private = convert_recurrent(model)
    assert not any(isinstance(m, nn.RNNBase) for m in private.modules())
    clipper = PerSampleClipper(private, max_grad_norm=bound)
    out = private(x) if lengths is None else private(x, lengths)
    F.mse_loss(out, y).backward()
    norms = clipper.last_per_example_norms.clone()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    sq = sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in per_example.values())
    expected_norms = sq.sqrt()
    torch.testing.assert_close(norms, expected_norms, rtol=1e-10, atol=1e-12)
    factors = torch.clamp(bound / expected_norms, max=1.0)
    for p in clipper.parameters:
        g = per_example[names[id(p)]]
        expected = (factors.reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0)
        torch.testing.assert_close(p.grad, expected, rtol=1e-10, atol=1e-12)
    clipper.remove()


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(KINDS), layers=st.integers(1, 2), bidirectional=st.booleans(),
       batch_first=st.booleans(), bias=st.booleans(), packed=st.booleans(),
       batch=st.integers(1, 4), steps=st.integers(1, 4), input_size=st.integers(1, 3),
       hidden=st.integers(2, 4), bound=st.sampled_from([0.05, 0.5, 1e3]),
       seed=st.integers(0, 2**16))
def test_clipped_sums_match_the_original_module_per_example(
        kind, layers, bidirectional, batch_first, bias, packed, batch, steps, input_size,
        hidden, bound, seed) -> None:
    torch.manual_seed(seed)
    model = build(kind, input_size=input_size, hidden=hidden, layers=layers,
                  bidirectional=bidirectional, batch_first=batch_first, bias=bias)
    x = torch.randn(batch, steps, input_size, dtype=torch.float64)
    y = torch.randn(batch, 2, dtype=torch.float64)
    lengths = torch.randint(1, steps + 1, (batch,)) if packed else None
    check_clipped_sums(model, x, y, lengths, bound)


@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_layer_alone_is_clipped_per_example(kind: str) -> None:
    """The converted layer is the whole model (its output tuple's first tensor is the loss
    input): hh is called once per step and the steps are summed per example before the norm."""
    torch.manual_seed(3)

    class Alone(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = make_recurrent(kind, 3, 4, layers=2, bidirectional=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0].sum(dim=1)

    model = Alone()
    out_size = model.rnn(torch.zeros(1, 1, 3, dtype=torch.float64))[0].shape[-1]
    x = torch.randn(5, 6, 3, dtype=torch.float64)
    check_clipped_sums_any(model, x, torch.randn(5, out_size, dtype=torch.float64), 0.3)


def check_clipped_sums_any(model, x, y, bound) -> None:
    per_example = reference_plain(model, x, y)
    names = {id(p): n for n, p in model.named_parameters()}
    private = convert_recurrent(model)
    clipper = PerSampleClipper(private, max_grad_norm=bound)
    F.mse_loss(private(x), y).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    sq = sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in per_example.values())
    factors = torch.clamp(bound / sq.sqrt(), max=1.0)
    assert bool((factors < 1).any()), "the test must clip some examples"
    for p in clipper.parameters:
        g = per_example[names[id(p)]]
        expected = (factors.reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0)
        torch.testing.assert_close(p.grad, expected, rtol=1e-10, atol=1e-12)
    clipper.remove()


def reference_plain(model, x, y):
    ref = copy.deepcopy(model)
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, _ in ref.named_parameters()}
    for i in range(x.shape[0]):
        ref.zero_grad(set_to_none=True)
        F.mse_loss(ref(x[i:i + 1]), y[i:i + 1]).backward()
        for n, p in ref.named_parameters():
            rows[n].append(p.grad.clone())
    return {n: torch.stack(r) for n, r in rows.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_each_clipped_example_has_norm_at_most_c(kind: str) -> None:
    """Each example alone, its loss scaled so that its gradient is far above C: the released
    clipped sum (no noise) is that one example's clipped gradient, norm <= C (1 + 1e-6)."""
    torch.manual_seed(4)
    model = convert_recurrent(build(kind, input_size=3, hidden=4, layers=2,
                                    bidirectional=True, batch_first=False, bias=True))
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    y = torch.randn(4, 2, dtype=torch.float64)
    bound = 0.25
    for scale in (1.0, 1e4, 1e8):
        for i in range(x.shape[0]):
            clipper = PerSampleClipper(model, max_grad_norm=bound)
            (scale * F.mse_loss(model(x[i:i + 1]), y[i:i + 1])).backward()
            clipper.release(noise_multiplier=0.0, expected_batch_size=1.0,
                            noise=NoiseGenerator(0))
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in clipper.parameters))
            assert float(norm) <= bound * (1 + 1e-6)
            if scale > 1.0:
                assert float(norm) == pytest.approx(bound, rel=1e-9)
            clipper.remove()
            model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_same_outputs_and_state_dicts_both_ways(kind: str, batch_first: bool) -> None:
    torch.manual_seed(5)
    plain = make_recurrent(kind, 3, 4, layers=2, bidirectional=True, batch_first=batch_first)
    private = convert_recurrent(copy.deepcopy(plain))
    cls = {"gru": DPGRU}.get(kind, DPLSTM if kind.startswith("lstm") else DPRNN)
    assert type(private) is cls
    x = torch.randn(6, 5, 3, dtype=torch.float64)  # (B, T, d) or (T, B, d)
    lengths = torch.tensor([5, 2, 4, 1, 3] + ([5] if batch_first else []))
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    for inp in (x, packed, x[0] if batch_first else x[:, 0]):  # batched, packed, unbatched
        out_plain, state_plain = plain(inp)
        out_dp, state_dp = private(inp)
        if inp is packed:
            for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
                assert torch.equal(getattr(out_plain, field), getattr(out_dp, field))
            out_plain, out_dp = out_plain.data, out_dp.data
        torch.testing.assert_close(out_dp, out_plain, rtol=0, atol=1e-12)
        for a, b in zip(state_dp if isinstance(state_dp, tuple) else (state_dp,),
                        state_plain if isinstance(state_plain, tuple) else (state_plain,)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # a given initial state (batch in dim 1 of h_0 / c_0, as nn's)
    batch = x.shape[0] if batch_first else x.shape[1]
    out_size = 3 if kind == "lstm_proj" else 4
    h0 = torch.randn(4, batch, out_size, dtype=torch.float64)
    hx = (h0, torch.randn(4, batch, 4, dtype=torch.float64)) if kind.startswith("lstm") else h0
    for inp in (x, packed):
        out_plain, state_plain = plain(inp, hx)
        out_dp, state_dp = private(inp, hx)
        if inp is packed:
            out_plain, out_dp = out_plain.data, out_dp.data
        torch.testing.assert_close(out_dp, out_plain, rtol=0, atol=1e-12)
        for a, b in zip(state_dp if isinstance(state_dp, tuple) else (state_dp,),
                        state_plain if isinstance(state_plain, tuple) else (state_plain,)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # the DP module's state dict is nn's, key for key, and loads into a fresh nn module ...
    assert list(private.state_dict()) == list(plain.state_dict())
    fresh = make_recurrent(kind, 3, 4, layers=2, bidirectional=True, batch_first=batch_first)
    fresh.load_state_dict(private.state_dict())
    torch.testing.assert_close(fresh(x)[0], plain(x)[0], rtol=0, atol=1e-12)
    # ... and a fresh DP module loads the nn module's, inside a bigger model too
    other = convert_recurrent(nn.Sequential(make_recurrent(
        kind, 3, 4, layers=2, bidirectional=True, batch_first=batch_first)))
    other.load_state_dict(nn.Sequential(plain).state_dict())
    torch.testing.assert_close(other[0](x)[0], plain(x)[0], rtol=0, atol=1e-12)
    nn.Sequential(copy.deepcopy(plain)).load_state_dict(other.state_dict())
    torch.testing.assert_close(private.to_torch()(x)[0], plain(x)[0], rtol=0, atol=0)


def test_conversion_shares_parameters_and_keeps_the_optimizer_working() -> None:
    torch.manual_seed(6)
    model = nn.Sequential(nn.LSTM(3, 4, batch_first=True))
    params = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    converted = convert_recurrent(model)
    assert converted is model and isinstance(model[0], DPLSTM)
    assert {id(p) for p in model.parameters()} == {id(p) for p in params}
    model[0](torch.randn(2, 3, 3))[0].sum().backward()
    before = [p.detach().clone() for p in params]
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, params))


def test_plain_recurrent_layers_are_refused_naming_the_converter() -> None:
    with pytest.raises(ValueError, match="convert_recurrent"):
        PerSampleClipper(nn.Sequential(nn.GRU(3, 4)), max_grad_norm=1.0)
    model = nn.Sequential(nn.LSTM(3, 4, batch_first=True))
    with pytest.raises(ValueError, match="convert_recurrent"):
        PrivacyEngine().make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1),
            PoissonDataLoader(TensorDataset(torch.randn(8, 2, 3)), sample_rate=0.5, seed=0),
            noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)


def test_sequence_first_model_input_is_refused_not_clipped_per_step() -> None:
    """A converted batch_first=False layer fed (T, B, d) as the model's input: the inner maps
    see the batch B but the model's input has T in dim 0, so the backward pass refuses."""
    torch.manual_seed(7)
    model = convert_recurrent(nn.LSTM(3, 4))  # batch_first=False

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0].sum(dim=0)  # (B, 4)

    head = Head()
    clipper = PerSampleClipper(head, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="batch_first"):
        head(torch.randn(5, 3, 3)).sum().backward()  # T = 5, B = 3
    clipper.remove()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        DPLSTM(3, 0)
    with pytest.raises(ValueError, match="proj_size"):
        DPLSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="nonlinearity"):
        DPRNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="dropout"):
        DPGRU(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="input_size"):
        DPGRU(3, 4, dtype=torch.float64)(torch.randn(2, 3, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="model"):
        convert_recurrent("lstm")  # type: ignore[arg-type]


def test_lstm_classifier_trains_with_the_engine_until_the_budget_stops_it() -> None:
    torch.manual_seed(8)
    n, steps, features = 64, 6, 3
    x = torch.randn(n, steps, features)
    y = (x[:, :, 0].sum(dim=1) > 0).long()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(features, 8, num_layers=2, batch_first=True,
                                bidirectional=True)
            self.head = nn.Linear(16, 2)

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(inp)[0][:, -1])

    model = convert_recurrent(Net())
    engine = PrivacyEngine(accountant="rdp")
    budget = PrivacyBudget(epsilon=3.0, delta=1e-5)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.5),
        PoissonDataLoader(TensorDataset(x, y), sample_rate=0.125, seed=1),
        noise_multiplier=1.2, max_grad_norm=1.0, budget=budget, seed=2)
    losses = []
    with pytest.raises(BudgetExhausted):
        for _ in range(100):
            for xb, yb in loader:
                optimizer.zero_grad()
                if len(yb):
                    loss = F.cross_entropy(model(xb), yb)
                    loss.backward()
                    losses.append(float(loss.detach()))
                optimizer.step()
    assert engine.steps == optimizer.releases == 11  # dpsharp.calibrate.steps for this budget
    assert 0.0 < engine.epsilon(1e-5) <= 3.0
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("kind", KINDS)
def test_float32_error_is_within_a_small_multiple_of_plain_float32_autograd(kind: str) -> None:
    """float32: the clipped sums' largest deviation from the float64 reference is at most 8x
    that of plain float32 batch-size-1 autograd on the original module (same weights)."""
    torch.manual_seed(9)
    model64 = build(kind, input_size=3, hidden=6, layers=2, bidirectional=True,
                    batch_first=True, bias=True)
    x64 = torch.randn(6, 7, 3, dtype=torch.float64)
    y64 = torch.randn(6, 2, dtype=torch.float64)
    bound = 0.3

    def clipped(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        wide = {n: g.double() for n, g in grads.items()}
        norms = sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in wide.values()).sqrt()
        factors = torch.clamp(bound / norms, max=1.0)
        return {n: (factors.reshape(-1, *[1] * (g.dim() - 1)) * g).sum(0)
                for n, g in wide.items()}

    reference64 = clipped(reference(model64, x64, y64, None))
    model32 = copy.deepcopy(model64).float()
    x32, y32 = x64.float(), y64.float()
    plain32 = clipped(reference(model32, x32, y32, None))
    names = {id(p): n for n, p in model32.named_parameters()}
    private = convert_recurrent(model32)
    clipper = PerSampleClipper(private, max_grad_norm=bound)
    F.mse_loss(private(x32), y32).backward()
    clipper.release(noise_multiplier=0.0, expected_batch_size=1.0, noise=NoiseGenerator(0))
    ours = {names[id(p)]: p.grad.double() for p in clipper.parameters}
    err_ours = max(float((ours[n] - reference64[n]).abs().max()) for n in reference64)
    err_plain = max(float((plain32[n] - reference64[n]).abs().max()) for n in reference64)
    assert err_ours <= 8 * err_plain, (err_ours, err_plain)


def test_dropout_between_layers_is_kept_and_off_in_eval() -> None:
    torch.manual_seed(10)
    plain = nn.GRU(3, 4, num_layers=3, dropout=0.4, batch_first=True, dtype=torch.float64)
    private = convert_recurrent(copy.deepcopy(plain))
    assert private.dropout == 0.4 and private.training
    x = torch.randn(5, 6, 3, dtype=torch.float64)
    plain.eval()
    private.eval()
    torch.testing.assert_close(private(x)[0], plain(x)[0], rtol=0, atol=1e-12)
    private.train()
    assert not torch.allclose(private(x)[0], plain(x)[0])  # dropped units in training
    assert private.to_torch().dropout == 0.4
