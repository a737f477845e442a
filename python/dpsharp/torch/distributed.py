"""Distributed data-parallel DP-SGD on top of ``torch.distributed`` / DistributedDataParallel.

What each rank does per logical step (one noisy release):

1. **Sampling.** :class:`DistributedPoissonDataLoader` gives record i to rank ``i % world_size``
   and includes it with probability q, independently of everything else. The union over ranks
   is therefore exactly a Poisson sample of the whole dataset with rate q (each record is owned
   by one rank and flipped once), which is what the accountant's ``PoissonSampled(., q)`` event
   assumes. With a seed every rank draws the same global Bernoulli mask (so the union equals the
   batch of a single-process :class:`~dpsharp.torch.data.PoissonDataLoader` with that seed,
   which the tests use) and keeps its own records; in secure mode each rank draws its mask from
   its own OS CSPRNG (the union is still Poisson since the shards are disjoint).
2. **Clipping.** Each rank clips its own examples with its own
   :class:`~dpsharp.torch.PerSampleClipper` (built on ``ddp.module``).
3. **Noise, shares.** Each rank adds an *independent share* N(0, (sigma C)^2 / W) drawn with its
   own noise stream: the generator's counter contains the rank (``NoiseGenerator(rank=r)``),
   so ranks sharing a seed never share a noise value, and secure generators take a fresh key
   per rank per release anyway. The shares' variances sum to (sigma C)^2: the noise of the
   all-reduced gradient is N(0, (sigma C)^2), the single-process value (not W times it).
   (Shares rather than "rank 0 adds all of it": every rank does the same work, so the step
   time is the same, and no rank is special in secure mode.)
4. **All-reduce.** ``(clipped_sum_r + share_r) / B`` is summed over ranks with one
   ``torch.distributed.all_reduce`` of a flat buffer, where B is the *global* expected batch
   size q n. Every rank ends with the same ``p.grad`` and takes the same optimizer step.
5. **Accounting.** Every rank's engine composes one event per logical step (the global
   mechanism), never one per rank. Each rank accounts it from its own noise multiplier,
   clipping bound and global expected batch size, so every release first checks that the
   ranks agree on them (:func:`require_agreement`, one small all-reduce) and refuses
   otherwise.

DDP's own gradient all-reduce is switched off (``ddp.require_backward_grad_sync = False``, the
flag :meth:`DistributedDataParallel.no_sync` sets, and ``require_forward_param_sync = False`` so
that the forward runs no collective and a rank may skip the forward of an empty batch): the clipper's patched layers do not compute
``p.grad`` in the backward at all, so DDP's reducer would wait for gradients that never come
(and, where a fallback layer does produce one, it would average unclipped gradients that the
release then overwrites). With the flag off, DDP still broadcasts the parameters at
construction and runs the forward, and the only gradient communication is the all-reduce of
step 4, so nothing is counted twice.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsharp._validation import require_count
from dpsharp.torch.data import PoissonDataLoader, fixed_parameter

if TYPE_CHECKING:
    import torch

__all__ = [
    "DistributedPoissonDataLoader",
    "all_reduce_gradients",
    "distributed_release",
    "from_dataloader_distributed",
    "prepare_ddp",
    "require_agreement",
    "unwrap_ddp",
]


def _dist() -> Any:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "distributed training needs torch.distributed to be initialised "
            "(torch.distributed.init_process_group) before the model is made private"
        )
    return dist


def group_rank_and_size(group: Any = None) -> tuple[int, int]:
    """(rank, world size) of this process in ``group`` (the default group if None)."""
    dist = _dist()
    return int(dist.get_rank(group)), int(dist.get_world_size(group))


def is_ddp(module: Any) -> bool:
    """Whether ``module`` is a :class:`torch.nn.parallel.DistributedDataParallel`."""
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, DistributedDataParallel)


def unwrap_ddp(module: Any) -> Any:
    """The wrapped module of a DDP model, or ``module`` itself."""
    return module.module if is_ddp(module) else module


def prepare_ddp(ddp: Any) -> Any:
    """Switch off DDP's gradient all-reduce (see the module docstring) and return its process
    group. Refuses DDP features that would reduce gradients behind the clipper's back."""
    _dist()
    if getattr(ddp, "static_graph", False):
        raise ValueError(
            "DistributedDataParallel(static_graph=True) is not supported for DP training: its "
            "reducer all-reduces gradients itself; build DDP with static_graph=False"
        )
    if getattr(ddp, "_delay_all_reduce_all_params", False):
        raise ValueError(
            "DistributedDataParallel with delayed all-reduce of all parameters (e.g. DDP "
            "mixed_precision) reduces gradients itself; it is not supported for DP training"
        )
    ddp.require_backward_grad_sync = False
    # No buffer broadcast in the forward either (the forward then runs no collective, so a rank
    # with an empty Poisson batch may skip it). DP models have no batch-statistics buffers
    # (BatchNorm is refused); buffers were broadcast once when DDP was built.
    ddp.require_forward_param_sync = False
    return ddp.process_group


def all_reduce_gradients(params: list[torch.Tensor], group: Any = None) -> None:
    """Sum ``p.grad`` over the ranks of ``group`` in place, with one all-reduce of a flat
    buffer per dtype (few, large messages)."""
    import torch

    dist = _dist()
    by_dtype: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            raise RuntimeError("a parameter has no gradient to all-reduce")
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for dtype in sorted(by_dtype, key=str):
        group_params = by_dtype[dtype]
        flat = torch.cat([p.grad.reshape(-1) for p in group_params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for p in group_params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def distributed_release(clipper: Any, *, noise_multiplier: float, expected_batch_size: float,
                        noise: Any, group: Any = None, loader: Any = None) -> None:
    """One distributed noisy release: ``p.grad = (sum_r clipped_sum_r + N(0, (sigma C)^2)) / B``
    on every rank of ``group``.

    Each rank releases its own clipped sum with the noise share sigma / sqrt(W) (its generator's
    rank word makes its stream distinct), then the results are summed over ranks. Must be called
    by every rank of the group at every logical step (an empty local batch included: that rank
    contributes its noise share only). ``loader`` (the optimizer's attached loader, if any):
    its sampling rate and dataset size must agree over the ranks too (a rank whose dataset is
    twice another's would sample at twice the rate it is told, with the same expected batch).
    """
    rank, world = group_rank_and_size(group)
    if noise.rank != rank:
        raise ValueError(
            f"the noise generator's rank ({noise.rank}) must be this process's rank ({rank}) so "
            "that ranks draw distinct noise"
        )
    values = {"noise_multiplier": float(noise_multiplier),
              "expected_batch_size": float(expected_batch_size),
              "max_grad_norm": float(clipper.overall_bound)}
    if loader is not None:
        values.update(sample_rate=float(loader.sample_rate),
                      dataset_size=float(loader.dataset_size))
    require_agreement(
        values, device=clipper.parameters[0].device if clipper.parameters else None, group=group,
    )
    clipper.release(
        noise_multiplier=float(noise_multiplier) / math.sqrt(world),
        expected_batch_size=expected_batch_size,
        noise=noise,
    )
    try:
        all_reduce_gradients(clipper.parameters, group)
    except BaseException:
        # This rank's share carries sigma / sqrt(W) of the noise only (and a failed all-reduce
        # may have summed part of it): never leave it in p.grad for a step to take.
        for param in clipper.parameters:
            param.grad = None
        raise


def require_agreement(values: dict[str, float], *, device: Any = None, group: Any = None) -> None:
    """Refuse a release whose privacy parameters differ between ranks.

    Every rank accounts the global mechanism from its own values (its noise share is
    sigma / sqrt(W) of its own sigma, its normaliser and sampling rate its own loader's), so
    one rank with another noise multiplier, expected batch size (sampling rate or dataset size)
    or clipping bound would make the released noise differ from what every rank's accountant
    is told (a rank with half the sigma: the all-reduced noise 0.71 of what is charged). One
    all-reduce of (v, -v) with MAX over the group, at every release (a few floats): every rank
    calls it, so it cannot deadlock, and it compares the exact values. Raises ValueError on
    every rank, naming the values that differ and their range."""
    import torch

    dist = _dist()
    names = list(values)
    local = torch.tensor([values[k] for k in names] + [-values[k] for k in names],
                         dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
    highest, lowest = local[: len(names)].tolist(), [-v for v in local[len(names):].tolist()]
    differ = [f"{k} in [{lo!r}, {hi!r}]" for k, lo, hi in zip(names, lowest, highest)
              if lo != hi]
    if differ:
        raise ValueError(
            "the ranks disagree on the privacy parameters of this release: "
            + ", ".join(differ) + "; every rank must use the same noise_multiplier, clipping "
            "bound and global expected batch size (the same dataset size and sample rate)"
        )


class DistributedPoissonDataLoader(PoissonDataLoader):
    """Poisson sampling split over the ranks of a process group.

    Record i belongs to rank ``i % world_size``; each logical batch keeps the records of this
    rank that a Bernoulli(q) mask over the whole dataset includes. The union over ranks is a
    Poisson sample of the dataset with rate q. :attr:`expected_batch_size` is the *global*
    expected batch size q n (the normaliser of the all-reduced sum); the local expected size is
    :attr:`local_expected_batch_size`. All ranks run :attr:`steps_per_epoch` logical batches per
    epoch (an empty local batch is a step like any other).

    Parameters
    ----------
    rank, world_size:
        This process's rank and the number of ranks (default: from the initialised default
        process group).
    seed:
        Must be the same on every rank (the global mask is then identical on all ranks and
        equal to a single-process ``PoissonDataLoader`` with that seed).

    Notes
    -----
    Other parameters as :class:`~dpsharp.torch.data.PoissonDataLoader`.
    """

    def __init__(self, dataset: Any, *, rank: int | None = None, world_size: int | None = None,
                 **kwargs: Any) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (then the default "
                             "process group is used)")
        if rank is None:
            rank, world_size = group_rank_and_size()
        world_size = require_count("world_size", world_size, minimum=1)
        rank = require_count("rank", rank)
        if rank >= world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self._rank = rank
        self._world_size = world_size
        super().__init__(dataset, **kwargs)

    rank = fixed_parameter("rank", "This process's rank: it keeps the records i with "
                           "i % world_size == rank (read-only: fixed at construction).")
    world_size = fixed_parameter("world_size", "The number of ranks the dataset is split over "
                                 "(read-only: fixed at construction).")

    @property
    def local_expected_batch_size(self) -> float:
        """Expected size of this rank's part of a logical batch: q * |shard|."""
        shard = len(range(self.rank, self.dataset_size, self.world_size))
        return self.sample_rate * shard

    def _draw(self) -> np.ndarray:
        indices = super()._draw()
        return indices[indices % self.world_size == self.rank]

    def _config(self) -> dict[str, Any]:
        config = super()._config()
        config.update(rank=self.rank, world_size=self.world_size)
        return config

    def __repr__(self) -> str:
        return (f"DistributedPoissonDataLoader(n={self.dataset_size}, q={self.sample_rate}, "
                f"rank={self.rank}, world_size={self.world_size})")


def from_dataloader_distributed(loader: Any, *, sampling: str = "poisson", seed: int | None = None,
                                secure: bool = False, max_physical_batch_size: int | None = None,
                                group: Any = None) -> DistributedPoissonDataLoader:
    """The distributed loader for a DDP model: a :class:`DistributedPoissonDataLoader` is used
    as is; a torch DataLoader's ``batch_size`` is read, as in torch's own DistributedSampler
    convention, as the *per-rank* batch size, so the global expected batch size is
    ``batch_size * world_size`` (q = that / n). Only Poisson sampling is supported."""
    from torch.utils.data import DataLoader

    from dpsharp.torch.data import DPDataLoader

    rank, world = group_rank_and_size(group)
    if isinstance(loader, DistributedPoissonDataLoader):
        if (loader.rank, loader.world_size) != (rank, world):
            raise ValueError(
                f"the loader was built for rank {loader.rank} of {loader.world_size}, but this "
                f"process is rank {rank} of {world}"
            )
        return loader
    if isinstance(loader, DPDataLoader):
        raise ValueError(  # noqa: TRY004 - a DP loader of the wrong kind, not a wrong type
            f"a DistributedDataParallel model needs a DistributedPoissonDataLoader; the given "
            f"{type(loader).__name__} samples the whole dataset on every rank, so each step would "
            "use world_size times the batch the accountant is told about"
        )
    if sampling != "poisson":
        raise ValueError(
            f"sampling must be 'poisson' for a DistributedDataParallel model, got {sampling!r}"
        )
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"data_loader must be a torch DataLoader or a DistributedPoissonDataLoader, got "
            f"{type(loader).__name__}"
        )
    if loader.batch_size is None:
        raise ValueError("data_loader has a custom batch_sampler, so its batch size is unknown; "
                         "build a DistributedPoissonDataLoader directly")
    from torch.utils.data.distributed import DistributedSampler

    from dpsharp.torch.data import require_whole_dataset_sampler

    require_whole_dataset_sampler(loader, allowed=(DistributedSampler,))
    n = len(loader.dataset)
    global_batch = float(loader.batch_size) * world
    if global_batch > n:
        raise ValueError(
            f"batch_size * world_size must be in (0, len(dataset)={n}], got "
            f"{loader.batch_size} * {world}"
        )
    return DistributedPoissonDataLoader(
        loader.dataset, rank=rank, world_size=world, expected_batch_size=global_batch, seed=seed,
        secure=secure, collate_fn=loader.collate_fn, max_physical_batch_size=max_physical_batch_size,
    )
