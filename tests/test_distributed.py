"""Distributed data-parallel DP-SGD: 2 processes, gloo backend, localhost only.

References: single-process DP-SGD on the same (union) batches with the same seeds (sigma = 0:
identical weights up to float summation order); the Gaussian noise variance (sigma C / B)^2 of a
single-process release (sigma > 0: the all-reduced noise has that variance, not W times it);
the independence of the ranks' noise streams (no value repeats, no correlation).
"""

from __future__ import annotations

import math
import os
import socket
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

# Each test starts a 2-process gloo group (tens of seconds on 2 cores): run with the slow tests.
pytestmark = [pytest.mark.torch, pytest.mark.slow]

WORLD = 2
N, D, K = 64, 5, 3
BATCH_PER_RANK = 8  # global expected batch 16, q = 1/4, 4 steps per epoch
STEPS = 6
CLIP = 0.05  # small, so that clipping is active for every example
SEED = 123


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _data() -> Any:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, K, (N,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, K)
    ).double()


def _train(model: Any, loader_or_dl: Any, sigma: float, lr: float) -> tuple[Any, list, Any]:
    """make_private + STEPS steps; returns (engine, gradients released per step, module)."""
    from dpsharp.torch import PrivacyEngine

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    engine = PrivacyEngine(accountant="gdp")
    module, dp_opt, loader = engine.make_private(
        model, optimizer, loader_or_dl, max_grad_norm=CLIP, noise_multiplier=sigma,
        delta=1e-5, seed=SEED,
    )
    grads: list[list[Any]] = []
    dp_opt.add_release_hook(lambda o: grads.append([p.grad.clone() for p in o.clipper.parameters]))
    steps = 0
    while steps < STEPS:
        for x, y in loader:
            if len(x) > 0:
                loss = torch.nn.functional.cross_entropy(module(x), y)
                loss.backward()
                # The clipper computed no plain gradient, and DDP reduced none.
                assert all(p.grad is None for p in module.parameters())
            dp_opt.step()
            dp_opt.zero_grad()
            steps += 1
            if steps == STEPS:
                break
    return engine, grads, module


def _worker(rank: int, port: int, out: str) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
            timeout=timedelta(seconds=60),
        )
        from dpsharp.torch import DistributedPoissonDataLoader, NoiseGenerator, PerSampleClipper
        from dpsharp.torch.distributed import distributed_release
        from torch.nn.parallel import DistributedDataParallel as DDP

        result: dict[str, Any] = {}
        # 1. sigma = 0 through make_private(DDP(model), ...).
        dl = torch.utils.data.DataLoader(_data(), batch_size=BATCH_PER_RANK)
        engine, grads, module = _train(DDP(_model()), dl, sigma=0.0, lr=0.5)
        result["weights0"] = [p.detach().clone() for p in module.module.parameters()]
        result["grads0"] = grads
        result["steps0"] = engine.steps
        result["eps0"] = engine.epsilon()
        result["loader"] = (engine.loader.sample_rate, engine.loader.expected_batch_size,
                            engine.optimizer.expected_batch_size)

        # 2. sigma > 0, lr = 0: same batches, gradients = clean + noise / B.
        dl = torch.utils.data.DataLoader(_data(), batch_size=BATCH_PER_RANK)
        _, grads_noisy, _ = _train(DDP(_model()), dl, sigma=1.5, lr=0.0)
        result["grads_noisy"] = grads_noisy

        # 3. The noise of one release, large enough to estimate its variance, and the shares.
        big = torch.nn.Linear(100, 200, bias=False).double()
        clipper = PerSampleClipper(big, max_grad_norm=2.0)
        distributed_release(clipper, noise_multiplier=3.0, expected_batch_size=4.0,
                            noise=NoiseGenerator(7, rank=rank))
        result["total_noise"] = big.weight.grad.clone()
        clipper.release(noise_multiplier=3.0 / math.sqrt(WORLD), expected_batch_size=4.0,
                        noise=NoiseGenerator(7, rank=rank))
        result["share"] = big.weight.grad.clone()

        # 4. Rank 1 owns no record at all (n = 1): every one of its batches is empty.
        one = torch.utils.data.TensorDataset(torch.randn(1, D, dtype=torch.float64),
                                             torch.zeros(1, dtype=torch.long))
        loader = DistributedPoissonDataLoader(one, expected_batch_size=0.9, seed=3)
        sizes: list[int] = []
        model = DDP(_model())
        from dpsharp.torch import PrivacyEngine

        engine = PrivacyEngine(accountant="gdp")
        module, dp_opt, loader = engine.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), loader, max_grad_norm=1.0,
            noise_multiplier=1.0, delta=1e-5, seed=11,
        )
        for _ in range(3):
            for x, y in loader:
                sizes.append(len(x))
                if len(x) > 0:
                    torch.nn.functional.cross_entropy(module(x), y).backward()
                dp_opt.step()
                dp_opt.zero_grad()
        result["empty_sizes"] = sizes
        result["empty_weights"] = [p.detach().clone() for p in module.module.parameters()]
        result["empty_steps"] = engine.steps

        # 5. The ranks disagree (rank 1 with half the noise multiplier, then another
        # expected batch size): refused on every rank, nothing released.
        # Then the same expected batch from datasets of different sizes: rank 1 samples at
        # half the rate rank 0 is told (the expected batch alone cannot show it).
        sized = torch.utils.data.TensorDataset(torch.randn(20 * (1 + rank), D), torch.zeros(
            20 * (1 + rank), dtype=torch.long))
        uneven = DistributedPoissonDataLoader(sized, expected_batch_size=10.0, seed=3)
        for sigma, batch, source in ((3.0 / (1 + rank), 4.0, None), (3.0, 4.0 + rank, None),
                                     (3.0, 10.0, uneven)):
            clipper = PerSampleClipper(big, max_grad_norm=2.0)
            big.weight.grad = None
            try:
                distributed_release(clipper, noise_multiplier=sigma, expected_batch_size=batch,
                                    noise=NoiseGenerator(9, rank=rank), loader=source)
                result.setdefault("mismatch", []).append(None)
            except ValueError as error:
                result.setdefault("mismatch", []).append((str(error), big.weight.grad is None))
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ddp")
    ctx = mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=False)
    deadline = 120.0
    import time

    start = time.monotonic()
    while not ctx.join(timeout=5):
        if time.monotonic() - start > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("distributed workers timed out")
    errors = sorted(out.glob("*.err"))
    assert not errors, "\n".join(e.read_text() for e in errors)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _single_process(sigma: float, lr: float) -> tuple[Any, list, Any]:
    """The same run on one process: PoissonDataLoader with the global q and the same seed."""
    from dpsharp.torch import PoissonDataLoader

    loader = PoissonDataLoader(_data(), expected_batch_size=BATCH_PER_RANK * WORLD, seed=SEED + 1)
    return _train(_model(), loader, sigma=sigma, lr=lr)


def test_sigma_zero_matches_single_process(results: list[dict[str, Any]]) -> None:
    _, grads, module = _single_process(0.0, 0.5)
    ref = [p.detach() for p in module.parameters()]
    for r in range(WORLD):
        for got, want in zip(results[r]["weights0"], ref):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for step_got, step_want in zip(results[r]["grads0"], grads, strict=True):
            for got, want in zip(step_got, step_want):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    # Clipping was active (the gradients are not trivially equal because all are tiny).
    assert max(float(g.abs().max()) for g in grads[0]) > 0.0


def test_global_normaliser_and_one_event_per_step(results: list[dict[str, Any]]) -> None:
    engine, _, _ = _single_process(0.0, 0.5)
    for r in range(WORLD):
        q, b_loader, b_opt = results[r]["loader"]
        assert q == pytest.approx(BATCH_PER_RANK * WORLD / N)
        assert b_loader == pytest.approx(BATCH_PER_RANK * WORLD)
        assert b_opt == pytest.approx(BATCH_PER_RANK * WORLD)
        assert results[r]["steps0"] == STEPS == engine.steps
        assert results[r]["eps0"] == engine.epsilon()


def test_noise_total_variance_is_single_process_value(results: list[dict[str, Any]]) -> None:
    total = results[0]["total_noise"]
    torch.testing.assert_close(results[1]["total_noise"], total, rtol=0, atol=0)
    # The all-reduce sums the two shares.
    torch.testing.assert_close(results[0]["share"] + results[1]["share"], total,
                               rtol=1e-12, atol=1e-12)
    n = total.numel()
    want = (3.0 * 2.0 / 4.0) ** 2  # (sigma C / B)^2 of one single-process release
    var = float(total.pow(2).mean())
    # The estimate's relative sd is sqrt(2/n) = 0.7%; 5 sd. World_size times it (2x) is far out.
    assert abs(var / want - 1.0) < 5 * math.sqrt(2.0 / n)
    for r in range(WORLD):
        share_var = float(results[r]["share"].pow(2).mean())
        assert abs(share_var / (want / WORLD) - 1.0) < 5 * math.sqrt(2.0 / n)


def test_no_noise_value_repeats_across_ranks(results: list[dict[str, Any]]) -> None:
    a = results[0]["share"].reshape(-1)
    b = results[1]["share"].reshape(-1)
    assert not set(a.tolist()) & set(b.tolist())  # float64: a chance collision is ~1e-8
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    assert abs(corr) < 5.0 / math.sqrt(a.numel())


def test_noise_through_the_engine(results: list[dict[str, Any]]) -> None:
    # lr = 0, sigma = 1.5: the released gradient is the clean one plus N(0, (sigma C / B)^2).
    b = BATCH_PER_RANK * WORLD
    _, clean, _ = _single_process(0.0, 0.0)
    z = torch.cat([
        ((noisy - c) * b / (1.5 * CLIP)).reshape(-1)
        for step_noisy, step_clean in zip(results[0]["grads_noisy"], clean, strict=True)
        for noisy, c in zip(step_noisy, step_clean)
    ])
    for r in range(1, WORLD):  # every rank released the same gradient
        for s0, s1 in zip(results[0]["grads_noisy"], results[r]["grads_noisy"]):
            for g0, g1 in zip(s0, s1):
                torch.testing.assert_close(g0, g1, rtol=0, atol=0)
    # 6 steps x 75 coordinates of N(0, 1): the variance estimate is within 30% w.h.p. (> 5 sd
    # away from the W = 2 value of 2 would be a double count).
    assert 0.7 < float(z.pow(2).mean()) < 1.35


def test_empty_batches_on_one_rank(results: list[dict[str, Any]]) -> None:
    assert results[1]["empty_sizes"] and all(s == 0 for s in results[1]["empty_sizes"])
    assert len(results[0]["empty_sizes"]) == len(results[1]["empty_sizes"])
    assert results[0]["empty_steps"] == results[1]["empty_steps"] == len(results[1]["empty_sizes"])
    for w0, w1 in zip(results[0]["empty_weights"], results[1]["empty_weights"]):
        torch.testing.assert_close(w0, w1, rtol=0, atol=0)


def test_ranks_that_disagree_on_the_privacy_parameters_are_refused(
        results: list[dict[str, Any]]) -> None:
    """A rank with half the noise multiplier would make the all-reduced noise 0.71 of what
    every rank's accountant charges; a rank with another expected batch size (sampling rate or
    dataset size) another mechanism, and so does a rank whose dataset has another size at the
    same expected batch (another sampling rate; a torch DataLoader's batch size is read per
    rank, so the expected batches always agree). All are refused on every rank before anything
    is released, naming the parameter and the range of the ranks' values."""
    for r in results:
        (first, first_empty), (second, second_empty), (third, third_empty) = r["mismatch"]
        assert "noise_multiplier in [1.5, 3.0]" in first and first_empty
        assert "expected_batch_size in [4.0, 5.0]" in second and second_empty
        assert "sample_rate in [0.25, 0.5]" in third and "dataset_size in [20.0, 40.0]" in third
        assert third_empty


def test_the_rank_split_is_read_only() -> None:
    """Setting every rank's loader to one rank with a shared seed would make each drawn record
    be summed world_size times: rank and world_size are fixed at construction."""
    from dpsharp.torch import DistributedPoissonDataLoader

    loader = DistributedPoissonDataLoader(_data(), rank=1, world_size=2, expected_batch_size=4,
                                          seed=0)
    for name in ("rank", "world_size"):
        with pytest.raises(AttributeError, match=f"{name} is fixed at construction"):
            setattr(loader, name, 0)
    assert (loader.rank, loader.world_size) == (1, 2)


def test_ddp_refuses_a_whole_dataset_loader() -> None:
    from dpsharp.torch import PoissonDataLoader
    from dpsharp.torch.distributed import from_dataloader_distributed

    port = _free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=timedelta(seconds=30))
    try:
        with pytest.raises(ValueError, match="DistributedPoissonDataLoader"):
            from_dataloader_distributed(PoissonDataLoader(_data(), expected_batch_size=4.0))
        with pytest.raises(ValueError, match="poisson"):
            from_dataloader_distributed(torch.utils.data.DataLoader(_data(), batch_size=4),
                                        sampling="shuffle")
    finally:
        dist.destroy_process_group()


def test_distributed_loader_union_is_the_single_process_poisson_batch() -> None:
    from dpsharp.torch import DistributedPoissonDataLoader, PoissonDataLoader

    ds = torch.utils.data.TensorDataset(torch.arange(50))
    single = PoissonDataLoader(ds, sample_rate=0.3, seed=9)
    parts = [DistributedPoissonDataLoader(ds, sample_rate=0.3, seed=9, rank=r, world_size=3)
             for r in range(3)]
    for batches in zip(single, *parts):
        whole = set(batches[0][0].tolist())
        shards = [set(b[0].tolist()) for b in batches[1:]]
        assert set().union(*shards) == whole
        assert sum(len(s) for s in shards) == len(whole)  # disjoint
        for r, s in enumerate(shards):
            assert all(i % 3 == r for i in s)
    assert parts[0].expected_batch_size == pytest.approx(15.0)
    assert parts[1].local_expected_batch_size == pytest.approx(0.3 * 17)
    with pytest.raises(ValueError, match="rank"):
        DistributedPoissonDataLoader(ds, sample_rate=0.3, rank=3, world_size=3)


def test_a_failed_all_reduce_leaves_no_partial_share_in_the_gradients(monkeypatch) -> None:
    """A rank's own release carries sigma / sqrt(W) of the noise: if the all-reduce that sums
    the shares fails, no gradient may be left for a step to take."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper
    from dpsharp.torch import distributed as distributed_module

    def fail(params: Any, group: Any) -> None:
        raise RuntimeError("connection reset by peer")

    monkeypatch.setattr(distributed_module, "group_rank_and_size", lambda group: (0, WORLD))
    monkeypatch.setattr(distributed_module, "require_agreement", lambda *a, **k: None)
    monkeypatch.setattr(distributed_module, "all_reduce_gradients", fail)
    model = torch.nn.Linear(D, K)
    clipper = PerSampleClipper(model, max_grad_norm=CLIP)
    torch.nn.functional.cross_entropy(model(torch.randn(4, D)), torch.zeros(4, dtype=torch.long)
                                      ).backward()
    with pytest.raises(RuntimeError, match="connection reset"):
        distributed_module.distributed_release(clipper, noise_multiplier=1.0,
                                               expected_batch_size=4.0, noise=NoiseGenerator(0))
    assert all(p.grad is None for p in model.parameters())
