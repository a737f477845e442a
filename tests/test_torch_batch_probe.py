"""make_private's first-step batch probe (dpsharp.torch.batch_probe): a layer that sees the
examples outside its batch dimension, or whose input mixes examples, is refused before
anything is charged or released; every other model trains exactly as without the probe."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from dpsharp.torch import (  # noqa: E402
    PoissonDataLoader,
    PrivacyEngine,
    ShuffledDataLoader,
    convert_recurrent,
)
from dpsharp.torch.batch_probe import probe_batch  # noqa: E402

pytestmark = pytest.mark.torch

SEQ = 8  # sequence length, equal to the batch size of the fixed-size loaders below


class TransposedInside(nn.Module):
    """Takes (batch, SEQ, 4) and runs its Linear sequence-first, on (SEQ, batch, 4): with a
    batch of SEQ every layer input has SEQ rows, so the clipper's batch-size checks pass and
    the Linear is clipped per position."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x.transpose(0, 1)).transpose(0, 1).sum(dim=1)


class BatchCentred(nn.Module):
    """x - x.mean(0) before the layers: every example's gradient depends on the others."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x):
        return self.body(x - x.mean(dim=0, keepdim=True))


def _fixed(n: int = 32):
    """Fixed-size batches of SEQ sequences."""
    return ShuffledDataLoader(_sequences(n), batch_size=SEQ, seed=1)


def _sequences(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, SEQ, 4, generator=g)
    return TensorDataset(x, (x[:, 0, 0] > 0).long())


def _private(model, loader, **options):
    engine = PrivacyEngine("pld")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.5), loader, max_grad_norm=1.0,
        noise_multiplier=options.pop("noise_multiplier", 1.0), delta=1e-5, seed=3, **options)
    return engine, model, optimizer, loader


def _train(model, optimizer, loader, loss_of_batch, steps: int) -> list[torch.Tensor]:
    """``steps`` DP-SGD steps; returns the model's output of every step's batch."""
    outputs = []
    for batch in loader:
        optimizer.zero_grad()
        if len(batch[0]):
            loss, out = loss_of_batch(model, batch)
            loss.backward()
            outputs.append(out.detach().clone())
        optimizer.step()
        if len(outputs) >= steps:
            break
    return outputs


def _classify(model, batch):
    out = model(batch[0])
    return F.cross_entropy(out, batch[1]), out


def test_sequence_first_layer_with_sequence_equal_to_batch_is_refused_before_training():
    torch.manual_seed(0)
    model = TransposedInside()
    before = copy.deepcopy(model.state_dict())
    engine, model, optimizer, loader = _private(
        model, _fixed(64))
    x, y = next(iter(loader))
    assert x.shape[0] == SEQ  # the Linear's input is (SEQ, SEQ, 4): its sizes look right
    for _ in range(2):  # refused again at the next attempt
        with pytest.raises(ValueError, match=r"layer \(Linear\) sees the examples in dimension "
                                             r"1 of its input.*batch_first=True"):
            model(x)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert engine.accountant.is_empty and engine.steps == 0 and optimizer.releases == 0
    assert engine.batch_probe_result.batch_dimension is not None


def test_without_the_probe_one_example_moves_the_clipped_sum_by_more_than_the_bound():
    """Why the refusal matters: clipped per position, replacing one example changes the
    released clipped sum by more than 2C (the replace-one sensitivity of per-example clipping,
    C = 1 here) -- measured with sigma = 0 and the probe switched off."""
    x = torch.zeros(SEQ, SEQ, 4)
    neighbour = x.clone()
    neighbour[0] = 100.0  # example 0 replaced
    sums = []
    for batch in (x, neighbour):
        torch.manual_seed(0)
        model = TransposedInside()
        data = TensorDataset(batch, torch.zeros(SEQ, dtype=torch.long))
        engine, model, optimizer, loader = _private(
            model, ShuffledDataLoader(data, batch_size=SEQ, seed=1), noise_multiplier=0.0,
            batch_probe=False)
        next(iter(loader))  # draws the logical batch: all SEQ records
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        sums.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]) * SEQ)
    assert float((sums[0] - sums[1]).norm()) > 2.0 * 1.0


def test_model_that_mixes_examples_is_refused_and_the_message_names_the_layer():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(60, 4, generator=g), torch.randint(0, 2, (60,), generator=g))
    engine, model, optimizer, loader = _private(
        BatchCentred(), PoissonDataLoader(data, sample_rate=0.2, seed=2))
    x, _ = next(iter(loader))
    with pytest.raises(ValueError, match=r"the input of body\.0 \(Linear\) changed for the "
                                         r"other examples.*mixes examples"):
        model(x)
    assert engine.accountant.is_empty and optimizer.releases == 0


def _equal_runs(build, loader_of, loss_of_batch, steps: int = 3):
    """Train the same model from the same seeds with and without the probe; returns both runs'
    outputs, final parameters and RNG states, and the probe's result."""
    runs = []
    for probe in (True, False):
        torch.manual_seed(0)
        model = build()
        engine, model, optimizer, loader = _private(model, loader_of(), batch_probe=probe)
        outputs = _train(model, optimizer, loader, loss_of_batch, steps)
        runs.append((outputs, [p.detach().clone() for p in model.parameters()],
                     torch.get_rng_state(), engine.batch_probe_result,
                     [m.training for m in model.modules()]))
    (out_a, par_a, rng_a, result, modes_a), (out_b, par_b, rng_b, none, modes_b) = runs
    assert none is None and result is not None and result.passed, result
    assert len(out_a) == len(out_b) == steps
    assert all(torch.equal(a, b) for a, b in zip(out_a, out_b))
    assert all(torch.equal(a, b) for a, b in zip(par_a, par_b))
    assert torch.equal(rng_a, rng_b) and modes_a == modes_b
    return result


def test_batch_first_model_with_dropout_trains_exactly_as_without_the_probe():
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(60, 4, generator=g), torch.randint(0, 2, (60,), generator=g))

    def build():
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))
        model[2].eval()  # a submodule the user left in eval mode stays so
        return model

    result = _equal_runs(build, lambda: PoissonDataLoader(data, sample_rate=0.2, seed=2),
                         _classify)
    assert result.layers == 2 and result.batch_size >= 2


class _Recurrent(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.rnn = nn.LSTM(4, 6, num_layers=2, batch_first=batch_first, dropout=0.3)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        out, _ = self.rnn(x if self.batch_first else x.transpose(0, 1))
        return self.head(out[:, -1] if self.batch_first else out[-1])


@pytest.mark.parametrize("batch_first", [True, False])
def test_lstm_via_convert_recurrent_trains_unchanged(batch_first):
    """Sequence-first inside the model (batch_first=False, (SEQ, B, 4) with SEQ = B) is sound
    here: the DP LSTM runs batch-first inside, so its Linear maps see the examples in
    dimension 0, and the probe says so."""
    result = _equal_runs(lambda: convert_recurrent(_Recurrent(batch_first)),
                         _fixed, _classify,
                         steps=2)
    assert result.layers == 5  # ih and hh of both layers, the head


class _SequenceFirstAttention(nn.Module):
    """nn.MultiheadAttention with batch_first=False fed (SEQ, B, E): the clipper transposes it
    (its examples are dimension 1), so this is trained per example."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(4, 2, batch_first=False)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        s = x.transpose(0, 1)
        out, _ = self.attention(s, s, s)
        return self.head(out.transpose(0, 1).mean(dim=1))


class _CausalEncoder(nn.Module):
    """A batch-first encoder layer with a shared (SEQ, SEQ) causal mask passed along with the
    (B, SEQ, E) batch: with B = SEQ both have the batch size in dimension 0."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x, mask):
        return self.head(self.layer(self.inp(x), src_mask=mask).mean(dim=1))


def test_sequence_first_attention_and_shared_square_mask_train_unchanged():
    result = _equal_runs(_SequenceFirstAttention,
                         _fixed, _classify,
                         steps=2)
    assert result.layers == 2
    mask = nn.Transformer.generate_square_subsequent_mask(SEQ)

    def step(model, batch):
        out = model(batch[0], mask)
        return F.cross_entropy(out, batch[1]), out

    result = _equal_runs(_CausalEncoder, _fixed,
                         step, steps=2)
    assert result.layers >= 6


def test_tiny_gpt2_with_dropout_and_padding_trains_unchanged():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2,
                                     n_head=2, use_cache=False, bos_token_id=0, eos_token_id=0)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 50, (32, 8), generator=g)
    mask = torch.ones(32, 8, dtype=torch.long)
    mask[::3, -2:] = 0
    data = TensorDataset(ids, mask)

    def step(model, batch):
        logits = model(input_ids=batch[0], attention_mask=batch[1]).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               batch[0][:, 1:].reshape(-1))
        return loss, logits

    result = _equal_runs(lambda: transformers.GPT2LMHeadModel(config),
                         lambda: PoissonDataLoader(data, sample_rate=0.25, seed=2), step, steps=2)
    assert result.layers >= 10


def test_batch_of_one_and_empty_batches_defer_the_probe():
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))
    torch.manual_seed(0)
    engine, model, optimizer, loader = _private(
        BatchCentred(), ShuffledDataLoader(data, batch_size=1, seed=1))
    _train(model, optimizer, loader, _classify, steps=2)  # batches of one: nothing to swap
    assert engine.batch_probe_result is None and optimizer.releases == 2
    found = probe_batch(model, (torch.randn(1, 4),))
    assert not found.checked and "no two examples" in found.reason
    found = probe_batch(model, (torch.ones(3, 4),))
    assert not found.checked and "all equal" in found.reason
    assert "mixes examples" in probe_batch(model, (torch.randn(3, 4),)).cross_example
    # empty Poisson batches release pure noise without a forward pass: nothing to probe yet
    engine, model, optimizer, loader = _private(
        nn.Linear(4, 2), PoissonDataLoader(data, sample_rate=1e-9, steps_per_epoch=2, seed=1))
    _train(model, optimizer, loader, _classify, steps=1)
    assert optimizer.releases == 2 and engine.batch_probe_result is None


def test_frozen_sequence_first_layer_is_not_probed_and_bad_flag_is_refused():
    """A frozen layer is not clipped: its input does not matter to the guarantee."""
    model = nn.Sequential(TransposedInside(), nn.Linear(2, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    data = _sequences(32)
    engine = PrivacyEngine("pld")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5),
        ShuffledDataLoader(data, batch_size=SEQ, seed=1), max_grad_norm=1.0, noise_multiplier=1.0,
        delta=1e-5)
    _train(model, optimizer, loader, _classify, steps=1)
    assert engine.batch_probe_result.passed and engine.batch_probe_result.layers == 1
    layer = nn.Linear(4, 2)
    with pytest.raises(TypeError, match="batch_probe must be True or False"):
        PrivacyEngine().make_private(layer, torch.optim.SGD(layer.parameters(), lr=0.1),
                                     loader, max_grad_norm=1.0, noise_multiplier=1.0,
                                     batch_probe=1)


class _Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = convert_recurrent(nn.LSTM(4, 6, batch_first=True))
        self.head = nn.Linear(6, 2)

    def forward(self, packed):
        return self.head(self.rnn(packed)[1][0][-1])


def test_packed_sequence_inputs_are_not_probed_and_train():
    """A PackedSequence's rows are time steps of several examples: no swap of rows is a swap
    of examples, so the probe says it did not run (and the run goes on)."""
    from torch.nn.utils.rnn import pack_padded_sequence

    lengths = torch.tensor([SEQ, 5, 3, 2] * 4)
    data = TensorDataset(_sequences(16).tensors[0], lengths, torch.arange(16) % 2)
    torch.manual_seed(0)
    engine, model, optimizer, loader = _private(_Packed(), _fixed_of(data, 4))

    def step(model, batch):
        packed = pack_padded_sequence(batch[0], batch[1], batch_first=True,
                                      enforce_sorted=False)
        out = model(packed)
        return F.cross_entropy(out, batch[2]), out

    _train(model, optimizer, loader, step, steps=2)
    result = engine.batch_probe_result
    assert not result.checked and result.final and "PackedSequence" in result.reason
    assert optimizer.releases == 2


def _fixed_of(data, batch_size: int):
    return ShuffledDataLoader(data, batch_size=batch_size, seed=1)


class _MaskedInput(nn.Module):
    """A layer whose input holds -inf where x <= 0 (and whose output holds NaN and inf)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(torch.where(x > 0, x, torch.full_like(x, float("-inf"))))


def test_infinite_and_nan_entries_follow_the_examples():
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    result = probe_batch(_MaskedInput(), (x,))
    assert result.passed and result.layers == 1
    found = probe_batch(TransposedInside(), (torch.randn(SEQ, SEQ, 4),), mixing=False)
    assert "dimension 1" in found.batch_dimension and found.cross_example is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models(dtype):
    """Half precision rounds at 5e-4 / 4e-3: the comparison allows four units of it, which
    still tells a sequence-first layer (its rows move by whole examples)."""
    torch.manual_seed(0)
    x = torch.randn(SEQ, SEQ, 4, generator=torch.Generator().manual_seed(4)).to(dtype)
    assert "dimension 1" in probe_batch(TransposedInside().to(dtype), (x,)).batch_dimension
    plain = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)).to(dtype)
    assert probe_batch(plain, (x,)).passed
    assert probe_batch(BatchCentred().to(dtype), (x[:, 0],)).cross_example is not None


class _InPlace(nn.Module):
    """Writes into its input (x *= 2) before its layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x.mul_(2.0))


def test_a_forward_that_writes_into_its_input_sees_the_callers_batch_once():
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    given = x.clone()
    assert probe_batch(_InPlace(), (x,)).passed
    assert torch.equal(x, given)  # the three probe runs wrote into copies


def test_loop_that_feeds_the_batch_sequence_first_is_refused():
    """A training loop feeding x.transpose(0, 1) to a model of per-position layers: with the
    sequence length equal to the batch size every size check passes and swapping dimension 0
    of the model's input (positions) moves every layer's rows alike; the probe compares the
    input with the loader's batch instead."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    engine, model, optimizer, loader = _private(model, _fixed(64))
    x, y = next(iter(loader))
    with pytest.raises(ValueError, match="tensor input 0 of the model is the data loader's "
                                         "batch with dimensions 0 and 1 swapped"):
        model(x.transpose(0, 1))
    assert engine.accountant.is_empty and optimizer.releases == 0
    # the same loader and model fed batch-first train (and the loader is left as it was)
    out = model(x)
    assert engine.batch_probe_result.passed and "_fetch" not in vars(loader)
    F.cross_entropy(out.sum(dim=1), y).backward()
    optimizer.step()
    assert optimizer.releases == 1


class _MergesOnEval(nn.Module):
    """Like loralib's LoRA layers: train(False) folds a delta into the weight and train(True)
    takes it out again, so the weight is only right if every mode change goes through
    train()."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.register_buffer("delta", torch.full((2, 4), 0.5))
        self.merged = False

    def train(self, mode: bool = True):
        super().train(mode)
        if mode == self.merged:  # eval and not merged, or train and merged
            with torch.no_grad():
                self.layer.weight.add_(self.delta if not mode else -self.delta)
            self.merged = not mode
        return self

    def forward(self, x):
        return self.layer(x)


def test_mode_changes_go_through_train_and_flags_are_restored():
    model = nn.Sequential(_MergesOnEval(), nn.Dropout(0.1))
    model[1].eval()
    weight = model[0].layer.weight.detach().clone()
    assert probe_batch(model, (torch.randn(4, 4),)).passed
    assert torch.equal(model[0].layer.weight, weight) and not model[0].merged
    assert [m.training for m in model.modules()] == [True, True, True, False]


class CentredWhileTraining(nn.Module):
    """x - x.mean(0) in training mode only (a hand-written batch norm, an in-model
    augmentation): in eval mode it passes every example through unchanged."""

    def forward(self, x):
        return x - x.mean(dim=0, keepdim=True) if self.training else x


class BatchMaxScaled(nn.Module):
    """x / max |x| over the whole batch (per-tensor dynamic scaling): only the example that
    holds the maximum moves the others."""

    def forward(self, x):
        return x / x.abs().max()


def _mixing_model(middle: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), middle, nn.Linear(6, 2))


def _clipped_sum_without_probe(model: nn.Module, x, y) -> torch.Tensor:
    """The released clipped sum (sigma = 0, C = 1, the probe off) of one full batch."""
    data = TensorDataset(x, y)
    engine, model, optimizer, loader = _private(
        model, ShuffledDataLoader(data, batch_size=len(x), seed=1), noise_multiplier=0.0,
        batch_probe=False)
    next(iter(loader))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y, reduction="sum").backward()
    optimizer.step()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]) * len(x)


@pytest.mark.parametrize("middle", [CentredWhileTraining, BatchMaxScaled])
def test_mixing_the_eval_mode_copy_run_misses_is_refused(middle):
    """Two ways a model mixes examples that replacing example b by a copy of example 0 in eval
    mode does not show: mixing only in training mode (the probe repeats the copy run in the
    model's own modes) and a maximum over the batch that example b does not hold (the probe
    also replaces example b by example 0 scaled to 4 times the batch's largest magnitude).
    Without the probe one example then moves the clipped sum (C = 1) by more than 2C, the
    replace-one bound of per-example clipping."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (8,), generator=g)
    neighbour = x.clone()
    neighbour[7] *= 60.0  # example 7 replaced (it now holds the batch maximum)
    sums = []
    for batch in (x, neighbour):
        torch.manual_seed(0)
        sums.append(_clipped_sum_without_probe(_mixing_model(middle()).double(), batch, y))
    assert float((sums[0] - sums[1]).norm()) > 2.0
    for seed in range(5):  # whichever example holds the maximum
        torch.manual_seed(seed)
        model = _mixing_model(middle())
        data = TensorDataset(torch.randn(60, 4), torch.randint(0, 2, (60,)))
        engine, model, optimizer, loader = _private(
            model, PoissonDataLoader(data, sample_rate=0.2, seed=seed))
        batch, _ = next(iter(loader))
        with pytest.raises(ValueError, match="mixes examples"):
            model(batch)
        assert engine.accountant.is_empty and optimizer.releases == 0


def test_training_mode_runs_restore_the_buffers_they_update():
    """The probe's training-mode runs leave a module's buffers (running statistics of its own
    input, per example, here a call counter and a running mean) as they were."""

    class Tracking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 2)
            self.register_buffer("calls", torch.zeros(()))
            self.register_buffer("running", torch.zeros(4))

        def forward(self, x):
            if self.training:
                self.calls += 1
                self.running.mul_(0.9).add_(0.1 * x[0])
            return self.layer(x)

    model = Tracking()
    result = probe_batch(model, (torch.randn(5, 4),))
    assert result.passed
    assert float(model.calls) == 0.0 and torch.equal(model.running, torch.zeros(4))
