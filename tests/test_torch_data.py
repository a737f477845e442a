"""Honest data loaders."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")

from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from dpsharp.accountants.base import UnsupportedEventError  # noqa: E402
from dpsharp.events import (  # noqa: E402
    Gaussian,
    Neighbouring,
    PoissonSampled,
    SampledWithoutReplacement,
    Shuffled,
)
from dpsharp.torch.data import (  # noqa: E402
    SAMPLINGS,
    PoissonDataLoader,
    ShuffledDataLoader,
    WithoutReplacementDataLoader,
    from_dataloader,
    sampling_event,
)

pytestmark = pytest.mark.torch


def index_dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n).reshape(n, 1).float(), torch.arange(n))


def ids(batch) -> list[int]:
    return batch[1].tolist()


def test_poisson_batch_sizes_follow_binomial() -> None:
    n, q, draws = 200, 0.1, 3000
    loader = PoissonDataLoader(index_dataset(n), sample_rate=q, steps_per_epoch=draws, seed=7)
    sizes = np.array([len(ids(batch)) for batch in loader])
    assert len(sizes) == draws
    # chi-square goodness of fit against Binomial(n, q), bins with expected count >= 5
    edges = np.arange(0, n + 2)
    observed = np.histogram(sizes, bins=edges)[0].astype(float)
    expected = draws * stats.binom.pmf(np.arange(n + 1), n, q)
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    _, p_value = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    assert p_value > 1e-3
    # every record is included with frequency ~ q (binomial 6-sigma band)
    counts = np.zeros(n)
    loader = PoissonDataLoader(index_dataset(n), sample_rate=q, steps_per_epoch=draws, seed=8)
    for batch in loader:
        counts[ids(batch)] += 1
    band = 6 * math.sqrt(draws * q * (1 - q))
    assert np.all(np.abs(counts - draws * q) < band)


def test_poisson_sample_rate_from_expected_batch_size_and_events() -> None:
    loader = PoissonDataLoader(index_dataset(1797), expected_batch_size=64, seed=0)
    assert loader.sample_rate == 64 / 1797
    assert loader.expected_batch_size == pytest.approx(64.0)
    assert len(loader) == loader.steps_per_epoch == round(1797 / 64)
    assert loader.implied_event(1.1) == PoissonSampled(Gaussian(1.1), 64 / 1797)
    assert loader.neighbouring is Neighbouring.ADD_REMOVE and loader.accounting_unit == "step"


def test_empty_poisson_batches_are_yielded_with_shapes() -> None:
    class Pairs(Dataset):
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int):
            return torch.full((2, 3), float(i)), i

    for dataset in (index_dataset(5), Pairs()):
        loader = PoissonDataLoader(dataset, sample_rate=1e-9, steps_per_epoch=3, seed=1)
        batches = list(loader)
        assert len(batches) == 3
        for x, y in batches:
            assert x.shape[0] == 0 and y.shape[0] == 0
        assert loader.last_batch_size == 0
    x, _ = list(PoissonDataLoader(Pairs(), sample_rate=1e-9, steps_per_epoch=1, seed=1))[0]
    assert tuple(x.shape) == (0, 2, 3)


class _Records(Dataset):
    """Records with a tensor, a label, an integer id and a string (as a file name would be)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return {"x": torch.full((3,), float(i)), "y": i % 2, "id": i, "name": f"record_{i}"}


class _Encoding(collections.UserDict):
    """A UserDict batch, as transformers.BatchEncoding is (a UserDict, not a dict)."""


def _empty_draw(collate_fn):
    loader = PoissonDataLoader(_Records(), sample_rate=1e-12, steps_per_epoch=1, seed=0,
                               collate_fn=collate_fn)
    (batch,) = list(loader)
    assert loader.last_batch_size == 0
    return batch


def test_an_empty_poisson_batch_carries_nothing_of_any_record() -> None:
    """An empty draw is built from one collated record with every row removed: its per-record
    strings and ids (default_collate keeps strings as a list) and every field of a UserDict
    batch (which the tensor walk did not enter, so the batch held record 0 whole) must go too;
    a field that is not per record cannot be emptied and is refused by name."""
    batch = _empty_draw(None)  # default_collate
    assert batch["x"].shape == (0, 3) and batch["y"].shape == (0,) and batch["id"].shape == (0,)
    assert batch["name"] == []
    listed = _empty_draw(lambda records: {
        "x": torch.stack([r["x"] for r in records]), "names": [r["name"] for r in records]})
    assert listed["x"].shape == (0, 3) and listed["names"] == []
    encoding = _empty_draw(lambda records: _Encoding(
        x=torch.stack([r["x"] for r in records]), y=torch.tensor([r["y"] for r in records])))
    assert isinstance(encoding, _Encoding)
    assert encoding["x"].shape == (0, 3) and encoding["y"].shape == (0,)
    with pytest.raises(TypeError, match=r"the batch\['longest'\] is a int"):
        _empty_draw(lambda records: {"x": torch.stack([r["x"] for r in records]),
                                     "longest": max(len(r["name"]) for r in records)})
    with pytest.raises(TypeError, match="0-d tensor"):
        _empty_draw(lambda records: (torch.stack([r["x"] for r in records]),
                                     torch.tensor(float(records[0]["id"]))))


def test_a_logical_batch_left_between_its_chunks_is_finished_by_the_next_iteration() -> None:
    """A break between the chunks of a logical batch left the loader refusing every later
    iteration (and every checkpoint); the next iteration now yields the batch's remaining
    chunks first, so each logical batch still arrives whole, in order."""
    def make():
        return PoissonDataLoader(index_dataset(60), sample_rate=0.4, steps_per_epoch=4, seed=5,
                                 max_physical_batch_size=5)

    whole = [ids(b) for b in make()]
    loader = make()
    seen: list[list[int]] = []
    for batch in loader:
        seen.append(ids(batch))
        if len(seen) == 2:
            break
    assert not loader.logical_batch_complete
    with pytest.raises(RuntimeError, match="middle of a logical batch"):
        loader.state_dict()
    for batch in loader:
        seen.append(ids(batch))
    assert [i for chunk in seen for i in chunk] == [i for chunk in whole for i in chunk]
    assert loader.logical_batch_complete and loader.position == 4


def test_interleaved_iterators_share_one_stream() -> None:
    """A suspended iterator and a new one take turns on one stream: every chunk of every
    logical batch once, in order (nothing drawn twice, nothing skipped)."""
    def make():
        return PoissonDataLoader(index_dataset(60), sample_rate=0.4, steps_per_epoch=4, seed=5,
                                 max_physical_batch_size=5)

    whole = [i for batch in make() for i in ids(batch)]
    loader = make()
    first, second = iter(loader), iter(loader)
    taken: list[int] = []
    for turn in range(100):
        try:
            taken += ids(next(first if turn % 2 else second))
        except StopIteration:
            break
    taken += [i for batch in first for i in ids(batch)]  # (first stops at the epoch's end)
    assert taken == whole and loader.position == 4


def test_a_failed_fetch_is_retried_not_skipped() -> None:
    class Flaky(Dataset):
        failures = 1

        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int):
            if i >= 20 and Flaky.failures:
                Flaky.failures -= 1
                raise OSError("transient read error")
            return torch.tensor([float(i)]), i

    loader = WithoutReplacementDataLoader(Flaky(), batch_size=40, steps_per_epoch=1, seed=0,
                                          max_physical_batch_size=10)
    got: list[int] = []
    with pytest.raises(OSError):
        for batch in loader:
            got += ids(batch)
    for batch in loader:  # the rest of that logical batch, the failed chunk first
        got += ids(batch)
        if loader.logical_batch_complete:
            break
    assert sorted(got) == list(range(40)) and loader.logical_batches_drawn == 1


def test_reshuffling_covers_every_example_once_per_epoch() -> None:
    n, b = 103, 10
    loader = ShuffledDataLoader(index_dataset(n), batch_size=b, seed=3)
    assert len(loader) == 11
    orders = []
    for _ in range(3):
        batches = [ids(batch) for batch in loader]
        assert [len(x) for x in batches] == [10] * 10 + [3]
        flat = [i for batch in batches for i in batch]
        assert sorted(flat) == list(range(n))
        orders.append(flat)
    assert orders[0] != orders[1] != orders[2]
    assert loader.epoch == 3
    assert loader.implied_event(2.0) == Shuffled(Gaussian(2.0), 10, 103)
    assert loader.accounting_unit == "epoch" and loader.sample_rate == 10 / 103


def test_reshuffling_is_accounted_under_zero_out_never_add_remove() -> None:
    """Cutting a permutation into batches is no add/remove-one partition (adding a record moves
    others across batch boundaries; tests/test_soundness_sampling.py): the loader states
    zero-out, where the clipped sum has sensitivity C (same sigma), or replace one (2C)."""
    loader = ShuffledDataLoader(index_dataset(103), batch_size=10, seed=3)
    assert loader.neighbouring is Neighbouring.ZERO_OUT
    assert "zero-out" in loader.guarantee_relation
    assert "not an add/remove guarantee" in loader.guarantee_relation
    assert SAMPLINGS["shuffle"] == (Neighbouring.ZERO_OUT, "epoch")
    common = {"dataset_size": 103, "batch_size": 10}
    assert sampling_event("shuffle", 2.0, **common) == Shuffled(Gaussian(2.0), 10, 103)
    assert sampling_event("shuffle", 2.0, neighbouring="zero_out", **common) == Shuffled(
        Gaussian(2.0), 10, 103
    )
    assert sampling_event("shuffle", 2.0, neighbouring="replace_one", **common) == Shuffled(
        Gaussian(1.0), 10, 103
    )
    with pytest.raises(UnsupportedEventError, match="batch boundaries") as info:
        sampling_event("shuffle", 2.0, neighbouring="add_remove", **common)
    assert "Poisson" in str(info.value) and "zero_out" in str(info.value)
    with pytest.raises(ValueError, match="neighbouring must be one of"):
        sampling_event("shuffle", 2.0, neighbouring="swap", **common)
    # Poisson sampling holds under zero-out with the same event; not under replace one
    poisson = {"dataset_size": 103, "sample_rate": 0.1}
    assert sampling_event("poisson", 2.0, neighbouring="zero_out", **poisson) == PoissonSampled(
        Gaussian(2.0), 0.1
    )
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        sampling_event("poisson", 2.0, neighbouring="replace_one", **poisson)
    with pytest.raises(UnsupportedEventError, match="zero_out"):
        sampling_event("without_replacement", 2.0, neighbouring="zero_out", **common)


def test_without_replacement_batches_have_exact_size_and_uniform_inclusion() -> None:
    n, b, steps = 50, 7, 4000
    loader = WithoutReplacementDataLoader(index_dataset(n), batch_size=b, steps_per_epoch=steps, seed=4)
    counts = np.zeros(n)
    for batch in loader:
        batch_ids = ids(batch)
        assert len(batch_ids) == b == len(set(batch_ids))
        counts[batch_ids] += 1
    p = b / n
    assert np.all(np.abs(counts - steps * p) < 6 * math.sqrt(steps * p * (1 - p)))
    # replace-one analysis: the clipped sum has sensitivity 2C, so the Gaussian is sigma / 2
    assert loader.implied_event(3.0) == SampledWithoutReplacement(Gaussian(1.5), 7, 50)
    assert loader.neighbouring is Neighbouring.REPLACE_ONE


@pytest.mark.parametrize(
    "make",
    [
        lambda seed: PoissonDataLoader(index_dataset(40), sample_rate=0.2, seed=seed),
        lambda seed: ShuffledDataLoader(index_dataset(40), batch_size=6, seed=seed),
        lambda seed: WithoutReplacementDataLoader(index_dataset(40), batch_size=6, seed=seed),
    ],
    ids=["poisson", "shuffle", "without_replacement"],
)
def test_seeded_and_resumable_mid_epoch(make) -> None:
    reference = make(11)
    expected = [ids(b) for _ in range(2) for b in reference]
    same, other = make(11), make(12)
    assert expected == [ids(b) for _ in range(2) for b in same]  # seeded
    assert expected != [ids(b) for _ in range(2) for b in other]

    first = make(11)
    iterator = iter(first)
    seen = [ids(next(iterator)) for _ in range(3)]
    state = first.state_dict()
    resumed = make(99)
    resumed.load_state_dict(state)
    rest = [ids(b) for b in resumed] + [ids(b) for b in resumed]
    assert seen + rest == expected
    assert resumed.epoch == 2


def test_physical_chunks_partition_the_logical_batch() -> None:
    loader = PoissonDataLoader(index_dataset(100), sample_rate=0.3, steps_per_epoch=5, seed=2,
                               max_physical_batch_size=8)
    plain = PoissonDataLoader(index_dataset(100), sample_rate=0.3, steps_per_epoch=5, seed=2)
    logical = [ids(b) for b in plain]
    chunks: list[list[int]] = []
    regrouped: list[list[int]] = []
    for batch in loader:
        chunks.append(ids(batch))
        if loader.logical_batch_complete:
            regrouped.append([i for c in chunks for i in c])
            chunks = []
    assert regrouped == logical
    assert len(loader) == 5


def test_from_dataloader_uses_the_batch_size_not_len_loader() -> None:
    dataset = index_dataset(1000)
    plain = DataLoader(dataset, batch_size=64, shuffle=True, drop_last=True)
    assert len(plain) == 15  # 1000 // 64: a len(loader)-based q would be 1/15
    poisson = from_dataloader(plain, sampling="poisson", seed=0)
    assert poisson.sample_rate == 64 / 1000
    shuffled = from_dataloader(plain, sampling="shuffle", seed=0)
    assert isinstance(shuffled, ShuffledDataLoader) and shuffled.batch_size == 64
    assert from_dataloader(poisson) is poisson
    # a DP loader is used as built: a physical batch size given beside it was silently ignored
    assert from_dataloader(poisson, max_physical_batch_size=None) is poisson
    with pytest.raises(ValueError, match="max_physical_batch_size=8 was given with a "
                                         "PoissonDataLoader"):
        from_dataloader(poisson, max_physical_batch_size=8)
    chunked = PoissonDataLoader(dataset, expected_batch_size=64, max_physical_batch_size=8)
    assert from_dataloader(chunked, max_physical_batch_size=8) is chunked


def test_secure_sampling_refuses_seeds_and_samples() -> None:
    with pytest.raises(ValueError, match="seed must be None when secure=True"):
        PoissonDataLoader(index_dataset(10), sample_rate=0.5, seed=1, secure=True)
    n, q, steps = 64, 0.25, 400
    loader = PoissonDataLoader(index_dataset(n), sample_rate=q, steps_per_epoch=steps, secure=True)
    sizes = [len(ids(b)) for b in loader]
    assert abs(np.mean(sizes) - n * q) < 6 * math.sqrt(n * q * (1 - q) / steps)
    assert loader.state_dict()["rng"] is None
    shuffled = ShuffledDataLoader(index_dataset(n), batch_size=10, secure=True)
    assert sorted(i for b in shuffled for i in ids(b)) == list(range(n))
    subset = WithoutReplacementDataLoader(index_dataset(n), batch_size=10, secure=True)
    assert all(len(set(ids(b))) == 10 for b in subset)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: PoissonDataLoader(d, sample_rate=0.0), "sample_rate must be in \\(0, 1\\]"),
        (lambda d: PoissonDataLoader(d, sample_rate=1.5), "sample_rate must be in \\(0, 1\\]"),
        (lambda d: PoissonDataLoader(d, sample_rate=float("nan")), "sample_rate must be a finite"),
        (lambda d: PoissonDataLoader(d), "exactly one of sample_rate and expected_batch_size"),
        (lambda d: PoissonDataLoader(d, expected_batch_size=11), "expected_batch_size must be in"),
        (lambda d: ShuffledDataLoader(d, batch_size=11), "batch_size must be in \\[1, len"),
        (lambda d: WithoutReplacementDataLoader(d, batch_size=0), "batch_size must be an integer >= 1"),
    ],
)
def test_bad_loader_arguments(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make(index_dataset(10))


def test_checkpoint_from_another_configuration_is_refused() -> None:
    state = PoissonDataLoader(index_dataset(10), sample_rate=0.5, seed=1).state_dict()
    with pytest.raises(ValueError, match="configured as"):
        PoissonDataLoader(index_dataset(10), sample_rate=0.25, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a ShuffledDataLoader checkpoint"):
        ShuffledDataLoader(index_dataset(10), batch_size=2).load_state_dict(state)
