"""Data loaders that know how they sample, and the privacy event each sampling implies.

Privacy amplification depends on *how* a batch is drawn, so a DP training run must use a loader
whose sampling is stated, not guessed from ``len(loader)``:

* :class:`PoissonDataLoader` -- every record joins each logical batch independently with
  probability q (Abadi et al. 2016, Algorithm 1; Bu et al. 2020, Algorithm 1 "take a Poisson
  subsample"). Batch sizes are Binomial(n, q); an empty batch is a valid step. One step is
  ``PoissonSampled(Gaussian(sigma), q)`` under add/remove one.
* :class:`ShuffledDataLoader` -- random reshuffling: each epoch a uniform permutation cut into
  ceil(n / b) disjoint batches (Yu et al. 2019, section IV). One *epoch* is
  ``Shuffled(Gaussian(sigma), b, n)`` under **zero-out** (Kairouz et al. 2021: neighbouring
  datasets differ in one record being replaced by a null record whose clipped contribution is
  0; the clipped sum has sensitivity C, so the numbers are those of the same sigma under
  add/remove, but the guarantee is not an add/remove one: adding a record shifts the others
  across batch boundaries, see :class:`dpsharp.events.Shuffled`). By parallel composition
  (Yu et al., Theorem 2) a partial epoch costs no more than a full one, so the engine charges
  it at the epoch's first release.
* :class:`WithoutReplacementDataLoader` -- every logical batch is an independent uniform subset
  of exactly b records (Wang, Balle, Kasiviswanathan 2019). One step is
  ``SampledWithoutReplacement(Gaussian(sigma / 2), b, n)``: that analysis is stated under
  replace-one, where the clipped sum's sensitivity is 2C (see :mod:`dpsharp.events`).

Here sigma is the noise multiplier of the optimizer: the noise standard deviation divided by the
clipping norm C of the clipped *sum*. Every loader is seeded (or takes its randomness from the OS
CSPRNG with ``secure=True``), resumable mid-epoch from :meth:`DPDataLoader.state_dict`, and can
split a logical batch into physical chunks (``max_physical_batch_size``) whose gradients the
optimizer accumulates into one noisy release.

An engine charges every release as a fresh draw of the loader it was made private with, so a
loader only moves forward: its sampling parameters (``dataset``, ``batch_size``, the sample
rate) are read-only, and :meth:`DPDataLoader.load_state_dict` resumes a checkpoint only into a
loader that has not drawn a batch (it would otherwise rewind the sampler and replay released
batches). Iterate the same loader for every epoch: each pass is a new epoch, drawn afresh.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Callable, ClassVar, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from dpsharp._validation import require_count, require_positive_finite, require_probability
from dpsharp._dpsgd import NEIGHBOURING_FACTORS, resolve_neighbouring
from dpsharp.events import (
    Event,
    Gaussian,
    RELATION_WORDS,
    Neighbouring,
    PoissonSampled,
    SampledWithoutReplacement,
    Shuffled,
)

__all__ = [
    "DPDataLoader",
    "PoissonDataLoader",
    "SAMPLINGS",
    "ShuffledDataLoader",
    "WithoutReplacementDataLoader",
    "from_dataloader",
    "sampling_event",
    "sampling_neighbouring",
]

#: The sampling schemes a loader can have, with the neighbouring relation their accounting is
#: stated under by default and the unit one event is charged per. Reshuffling is accounted under
#: zero-out: it has no add/remove-one guarantee (:class:`dpsharp.events.Shuffled`).
SAMPLINGS: dict[str, tuple[Neighbouring, str]] = {
    "poisson": (Neighbouring.ADD_REMOVE, "step"),
    "shuffle": (Neighbouring.ZERO_OUT, "epoch"),
    "without_replacement": (Neighbouring.REPLACE_ONE, "step"),
}

#: The scheme names of :mod:`dpsharp._dpsgd` (which holds the relations each sampling can be
#: accounted under) for the loaders' sampling names.
_SCHEMES: dict[str, str] = {
    "poisson": "poisson",
    "shuffle": "shuffle",
    "without_replacement": "fixed",
}

_STATE_FORMAT = 1


def sampling_neighbouring(
    sampling: str, neighbouring: Neighbouring | str | None = None
) -> Neighbouring:
    """The relation ``sampling`` is accounted under: ``neighbouring`` if its analysis holds
    there, the default of :data:`SAMPLINGS` if ``neighbouring`` is None.

    Raises :class:`dpsharp.accountants.base.UnsupportedEventError` (a ValueError) for a relation
    the sampling's analysis does not hold under, saying why: e.g. reshuffling under add/remove
    one, which has no such guarantee (use Poisson sampling, or zero-out / replace-one).
    """
    if sampling not in SAMPLINGS:
        valid = ", ".join(map(repr, SAMPLINGS))
        raise ValueError(f"sampling must be one of {valid}, got {sampling!r}")
    return resolve_neighbouring(_SCHEMES[sampling], neighbouring)


def sampling_event(
    sampling: str,
    noise_multiplier: float,
    *,
    dataset_size: int,
    sample_rate: float | None = None,
    batch_size: int | None = None,
    neighbouring: Neighbouring | str | None = None,
) -> Event:
    """The event of one accounting unit of a DP-SGD run with the given sampling, stated under
    ``neighbouring`` (default: the sampling's relation in :data:`SAMPLINGS`).

    ``noise_multiplier`` = sigma = noise std / C, where C bounds each example's clipped
    gradient, so the clipped sum has sensitivity C under add/remove and zero-out and 2C under
    replace one (see :mod:`dpsharp.events`).

    * ``"poisson"`` (add/remove, or zero-out with the same numbers): one step,
      ``PoissonSampled(Gaussian(sigma), sample_rate)``.
    * ``"shuffle"``: one epoch, ``Shuffled(Gaussian(sigma), batch_size, dataset_size)`` under
      zero-out (the default), ``Shuffled(Gaussian(sigma / 2), ...)`` under replace one;
      refused under add/remove (:func:`sampling_neighbouring` says why).
    * ``"without_replacement"`` (replace one): one step,
      ``SampledWithoutReplacement(Gaussian(sigma / 2), batch_size, dataset_size)``.
    """
    sigma = require_positive_finite("noise_multiplier", noise_multiplier)
    size = require_count("dataset_size", dataset_size, minimum=1)
    relation = sampling_neighbouring(sampling, neighbouring)
    inner = Gaussian(sigma * NEIGHBOURING_FACTORS[_SCHEMES[sampling]][relation])
    if sampling == "poisson":
        if sample_rate is None:
            raise ValueError("sample_rate is required for Poisson sampling")
        return PoissonSampled(inner, require_probability("sample_rate", sample_rate))
    if batch_size is None:
        raise ValueError(f"batch_size is required for {sampling!r} sampling")
    if sampling == "shuffle":
        return Shuffled(inner, batch_size, size)
    return SampledWithoutReplacement(inner, batch_size, size)


# ---------------------------------------------------------------------------------- randomness
class _Randomness:
    """Seeded PCG64 (checkpointable), or the OS CSPRNG (``secure``: nothing to checkpoint)."""

    def __init__(self, seed: int | None, secure: bool) -> None:
        if secure and seed is not None:
            raise ValueError("seed must be None when secure=True: secure sampling takes every "
                             "random bit from the OS CSPRNG and cannot be seeded")
        if seed is not None:
            seed = require_count("seed", seed)
        self.secure = bool(secure)
        self.generator = None if secure else np.random.Generator(np.random.PCG64(seed))

    def bernoulli(self, n: int, q: float) -> np.ndarray:
        """Boolean mask of length n, each entry True independently with probability q."""
        if self.generator is not None:
            return self.generator.random(n) < q
        # 53 random bits per record from the CSPRNG, as a uniform on [0, 1).
        words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        return words.astype(np.float64) * (1.0 / 9007199254740992.0) < q

    def permutation(self, n: int) -> np.ndarray:
        if self.generator is not None:
            return self.generator.permutation(n)
        return self._secure_partial_shuffle(n, n)

    def subset(self, n: int, k: int) -> np.ndarray:
        """A uniformly random subset of size k of range(n), as sorted indices."""
        if self.generator is not None:
            return np.sort(self.generator.choice(n, size=k, replace=False))
        return np.sort(self._secure_partial_shuffle(n, k))

    @staticmethod
    def _secure_partial_shuffle(n: int, k: int) -> np.ndarray:
        # Fisher-Yates with secrets.randbelow: the first k entries are a uniform k-subset in
        # uniform order.
        values = np.arange(n)
        for i in range(min(k, n - 1)):
            j = i + secrets.randbelow(n - i)
            values[i], values[j] = values[j], values[i]
        return values[:k].copy()

    def state(self) -> dict[str, Any] | None:
        return None if self.generator is None else dict(self.generator.bit_generator.state)

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        if self.generator is None:
            if state is not None:
                raise ValueError("cannot load a seeded sampler state into a secure loader")
            return
        if state is None:
            raise ValueError("the checkpoint comes from a secure loader; this loader is seeded")
        self.generator.bit_generator.state = dict(state)


# ---------------------------------------------------------------------------------- batches
_PLAIN_VALUES = (str, bytes, int, float, complex, bool, type(None))


def _empty_batch(value: Any, where: str = "the batch") -> Any:
    """The batch of no records with the structure of ``value``, a collated batch of one record:
    every tensor (and numpy array) cut to 0 rows, every per-record list of a plain value (a
    string or number, as ``default_collate`` leaves them: one entry) emptied, and mappings
    (also ``UserDict`` ones such as ``transformers.BatchEncoding``), named tuples, tuples and
    lists of those rebuilt around them. Anything else (a 0-d tensor, a bare value) came from
    that record and is not per record, so it cannot be emptied: TypeError (naming its place and
    type, not its value), rather than a batch that carries it."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise TypeError(
                f"{where} is a 0-d tensor (not one row per record), so an empty batch cannot be "
                "built from collate_fn's output without keeping the sampled-out record's value; "
                "make collate_fn return per-record tensors and lists"
            )
        return value[:0]
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return value[:0]
    if isinstance(value, Mapping):
        emptied = {key: _empty_batch(v, f"{where}[{key!r}]") for key, v in value.items()}
        try:
            return type(value)(emptied)
        except TypeError:
            return emptied
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_empty_batch(v, f"{where}.{name}")
                             for name, v in zip(value._fields, value)))
    if isinstance(value, (list, tuple)):
        if len(value) == 1 and isinstance(value[0], _PLAIN_VALUES):
            return type(value)()  # the record's one plain value
        return type(value)(_empty_batch(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(
        f"{where} is a {type(value).__name__}, neither a tensor nor a per-record list: an "
        "empty logical batch (a Poisson draw of no records) cannot be built from "
        "collate_fn's output without keeping the sampled-out record's value; make collate_fn "
        "return per-record tensors and lists"
    )


def fixed_parameter(name: str, doc: str) -> Any:
    """A read-only sampling parameter of a loader, stored as ``_<name>`` at construction:
    reading returns it, assigning raises the loader's ``_fixed(name)`` error (its accounting
    is for the sampling it was built with)."""

    def read(loader: Any) -> Any:
        return getattr(loader, "_" + name)

    def refuse(loader: Any, value: Any) -> None:
        raise loader._fixed(name)

    return property(read, refuse, doc=doc)


class DPDataLoader:
    """Base class: a loader whose sampling scheme, and therefore privacy event, is known.

    Iterating yields the (physical) batches of the rest of the current epoch, or of a new epoch
    if the current one is finished; ``len(loader)`` is the number of logical batches (noisy
    releases) per epoch. A logical batch is split into chunks of at most
    ``max_physical_batch_size`` records (at least one chunk, possibly empty); the optimizer
    attached by :class:`~dpsharp.torch.PrivacyEngine` accumulates the chunks' gradients and
    releases once per logical batch.
    """

    sampling: ClassVar[str] = ""

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        seed: int | None = None,
        secure: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        max_physical_batch_size: int | None = None,
    ) -> None:
        try:
            size = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError("dataset must be a map-style dataset with a length") from None
        self._dataset = dataset
        self._dataset_size = require_count("len(dataset)", size, minimum=1)
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.max_physical_batch_size = (
            None
            if max_physical_batch_size is None
            else require_count("max_physical_batch_size", max_physical_batch_size, minimum=1)
        )
        self._random = _Randomness(seed, secure)
        self._epoch = 0  # epochs started
        self._position = 0  # logical batches drawn in the current epoch
        self._logical_batches = 0  # logical batches drawn in total
        self._lot_open = False  # a logical batch has chunks still to yield
        self._open_chunks: list[np.ndarray] = []  # its chunks not yet yielded
        self._last_batch_size = 0
        # logical batches this object has drawn (not restored from a checkpoint): once one is
        # drawn, load_state_dict would rewind the sampler (see there)
        self._drawn_here = 0
        self._listeners: list[Callable[[DPDataLoader, int], None]] = []

    def _fixed(self, name: str) -> AttributeError:
        """The error for assigning a sampling parameter (they are fixed at construction)."""
        return AttributeError(
            f"{type(self).__name__}.{name} is fixed at construction: the privacy accounting of "
            "a run is for the sampling its loader was built with, and changing it mid-run "
            "would release records in a way that accounting does not describe (e.g. records "
            "used twice in one reshuffled epoch). Build a new loader with the new value and "
            "call make_private with it: a new, separately accounted run"
        )

    # ----------------------------------------------------------------- fixed sampling
    dataset = fixed_parameter("dataset", "The records sampled from (read-only).")
    dataset_size = fixed_parameter("dataset_size", "n = len(dataset) at construction (read-only).")

    # ----------------------------------------------------------------- what the loader is
    @property
    def neighbouring(self) -> Neighbouring:
        """The neighbouring relation this sampling's accounting is stated under."""
        return SAMPLINGS[self.sampling][0]

    @property
    def guarantee_relation(self) -> str:
        """:attr:`neighbouring` in plain words, for privacy statements."""
        return RELATION_WORDS[self.neighbouring]

    @property
    def accounting_unit(self) -> str:
        """"step" if one event is charged per noisy release, "epoch" if once per epoch."""
        return SAMPLINGS[self.sampling][1]

    @property
    def secure(self) -> bool:
        return self._random.secure

    @property
    def sample_rate(self) -> float:
        """The probability that a given record is in a given logical batch."""
        raise NotImplementedError

    @property
    def expected_batch_size(self) -> float:
        """E|batch| = sample_rate * dataset_size: the public normaliser of the noisy sum."""
        raise NotImplementedError

    @property
    def steps_per_epoch(self) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.steps_per_epoch

    def implied_event(self, noise_multiplier: float) -> Event:
        """The event of one accounting unit (:attr:`accounting_unit`) at noise multiplier
        sigma = noise std / C (see :func:`sampling_event`)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- progress
    @property
    def epoch(self) -> int:
        """Number of epochs started (1 during the first epoch)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Logical batches drawn in the current epoch."""
        return self._position

    @property
    def logical_batches_drawn(self) -> int:
        return self._logical_batches

    @property
    def logical_batch_complete(self) -> bool:
        """False while chunks of the current logical batch remain to be yielded."""
        return not self._lot_open

    @property
    def last_batch_size(self) -> int:
        """Size of the most recent logical batch."""
        return self._last_batch_size

    def add_listener(self, callback: Callable[[DPDataLoader, int], None]) -> None:
        """``callback(loader, batch_size)`` runs before the first chunk of each logical batch."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[DPDataLoader, int], None]) -> None:
        self._listeners.remove(callback)

    # ----------------------------------------------------------------- iteration
    def _begin_epoch(self) -> None:
        """Start a new epoch (subclasses draw what the epoch needs)."""

    def _draw(self) -> np.ndarray:
        """Indices of the next logical batch."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        """The physical batches of the rest of this epoch (or of a new one). A logical batch
        left part-way (a ``break`` between its chunks, or a failed fetch) is finished first:
        its remaining chunks are yielded before anything new is drawn. Iterators share the
        loader's state: two of them interleaved yield one stream between them, each chunk
        once."""
        yield from self._yield_open_lot()
        if self._epoch == 0 or self._position >= self.steps_per_epoch:
            self._epoch += 1
            self._position = 0
            self._begin_epoch()
        while self._position < self.steps_per_epoch:
            before = (self._position, self._logical_batches, self._drawn_here,
                      self._last_batch_size)
            indices = self._draw()
            self._position += 1
            self._logical_batches += 1
            self._drawn_here += 1
            self._last_batch_size = int(len(indices))
            try:
                for callback in list(self._listeners):
                    callback(self, self._last_batch_size)
            except BaseException:
                # A draw a listener refuses (the optimizer, while the previous batch is not
                # released) is no draw: the counters stay where they were, so the pending batch
                # is still the one its release is checked against (and a checkpoint's count of
                # batches drawn still matches its releases). Its indices are dropped unused.
                (self._position, self._logical_batches, self._drawn_here,
                 self._last_batch_size) = before
                raise
            self._open_chunks = self._chunks(indices)
            self._lot_open = True
            yield from self._yield_open_lot()

    def _yield_open_lot(self) -> Iterator[Any]:
        """Yield the open logical batch's remaining chunks; a chunk leaves the list only once
        it is fetched, so a fetch that raises is retried by the next iteration."""
        while self._open_chunks:
            batch = self._fetch(self._open_chunks[0])
            del self._open_chunks[0]
            self._lot_open = bool(self._open_chunks)
            yield batch
        self._lot_open = False

    def _chunks(self, indices: np.ndarray) -> list[np.ndarray]:
        limit = self.max_physical_batch_size
        if limit is None or len(indices) <= limit:
            return [indices]
        return [indices[start : start + limit] for start in range(0, len(indices), limit)]

    def _fetch(self, indices: np.ndarray) -> Any:
        if isinstance(self.dataset, TensorDataset):
            index = torch.as_tensor(indices, dtype=torch.long)
            return tuple(tensor[index] for tensor in self.dataset.tensors)
        if len(indices) == 0:
            # An empty batch with the right shapes and dtypes: collate one record, keep none of
            # its rows or per-record values (only the public structure is used).
            return _empty_batch(self.collate_fn([self.dataset[0]]))
        return self.collate_fn([self.dataset[int(i)] for i in indices])

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The sampler state: resuming from it draws exactly the batches the uninterrupted
        loader would have drawn next (JSON-compatible)."""
        if self._lot_open:
            raise RuntimeError("cannot checkpoint a loader in the middle of a logical batch; "
                               "checkpoint between optimizer steps")
        return {
            "format": _STATE_FORMAT,
            "sampling": self.sampling,
            "config": self._config(),
            "rng": self._random.state(),
            "epoch": self._epoch,
            "position": self._position,
            "logical_batches": self._logical_batches,
            "extra": self._extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`, into a loader that has not drawn a batch yet.

        A loader that has drawn a batch refuses: loading would rewind its sampler (a seeded
        sampler replays the same batches; a reshuffled epoch releases its records again) while
        every release is accounted as a fresh draw, so the ledger would miss the reuse. Resume
        a checkpoint into a new loader (and a new engine: ``PrivacyEngine.load_state_dict``
        loads this), e.g. in a new process; to train further, keep iterating this loader.
        """
        if self._drawn_here > 0:
            raise RuntimeError(
                f"load_state_dict refused: this {type(self).__name__} has drawn "
                f"{self._drawn_here} logical batches, and loading a state would rewind its "
                "sampler (replaying batches that were released and accounted as fresh draws). "
                "Keep iterating this loader to train further (each pass is a new epoch, drawn "
                "afresh and accounted); load a checkpoint only into a new loader that has not "
                "drawn a batch (PrivacyEngine.load_state_dict on the engine of a new "
                "make_private call)"
            )
        if state.get("format") != _STATE_FORMAT or state.get("sampling") != self.sampling:
            raise ValueError(
                f"state is not a {type(self).__name__} checkpoint (sampling "
                f"{state.get('sampling')!r}, format {state.get('format')!r})"
            )
        if state["config"] != self._config():
            raise ValueError(
                f"the checkpoint was made by a loader configured as {state['config']!r}, "
                f"this one is {self._config()!r}"
            )
        self._random.load_state(state["rng"])
        self._epoch = require_count("epoch", state["epoch"])
        self._position = require_count("position", state["position"])
        self._logical_batches = require_count("logical_batches", state["logical_batches"])
        self._lot_open = False
        self._open_chunks = []
        self._load_extra_state(state["extra"])

    def _config(self) -> dict[str, Any]:
        return {"dataset_size": self.dataset_size}

    def _extra_state(self) -> Any:
        return None

    def _load_extra_state(self, extra: Any) -> None:
        pass

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._config().items())
        return f"{type(self).__name__}({options}, secure={self.secure})"


class PoissonDataLoader(DPDataLoader):
    """Poisson sampling: each logical batch contains every record independently with
    probability q = ``sample_rate`` (or ``expected_batch_size / len(dataset)``).

    Batch sizes are Binomial(n, q); an empty batch is yielded as an empty (0-row) batch and is a
    step like any other (the optimizer releases pure noise for it). An epoch is
    ``steps_per_epoch`` logical batches, by default round(1 / q), so that about n records are
    seen per epoch. Event per step: ``PoissonSampled(Gaussian(sigma), q)`` (add/remove one).
    """

    sampling = "poisson"

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        sample_rate: float | None = None,
        expected_batch_size: float | None = None,
        steps_per_epoch: int | None = None,
        seed: int | None = None,
        secure: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        max_physical_batch_size: int | None = None,
    ) -> None:
        super().__init__(
            dataset,
            seed=seed,
            secure=secure,
            collate_fn=collate_fn,
            max_physical_batch_size=max_physical_batch_size,
        )
        if (sample_rate is None) == (expected_batch_size is None):
            raise ValueError("give exactly one of sample_rate and expected_batch_size")
        if sample_rate is None:
            batch = require_positive_finite("expected_batch_size", expected_batch_size)
            if batch > self.dataset_size:
                raise ValueError(
                    f"expected_batch_size must be in (0, len(dataset)={self.dataset_size}], "
                    f"got {batch!r}"
                )
            sample_rate = batch / self.dataset_size
        self._q = require_probability("sample_rate", sample_rate)
        self._steps = (
            max(1, round(1.0 / self._q))
            if steps_per_epoch is None
            else require_count("steps_per_epoch", steps_per_epoch, minimum=1)
        )

    @property
    def sample_rate(self) -> float:
        return self._q

    @property
    def expected_batch_size(self) -> float:
        return self._q * self.dataset_size

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def implied_event(self, noise_multiplier: float) -> Event:
        return sampling_event(
            "poisson", noise_multiplier, dataset_size=self.dataset_size, sample_rate=self._q
        )

    def _draw(self) -> np.ndarray:
        return np.flatnonzero(self._random.bernoulli(self.dataset_size, self._q))

    def _config(self) -> dict[str, Any]:
        return {"dataset_size": self.dataset_size, "sample_rate": self._q, "steps_per_epoch": self._steps}


class _FixedSizeLoader(DPDataLoader):
    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int,
        seed: int | None = None,
        secure: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        max_physical_batch_size: int | None = None,
    ) -> None:
        super().__init__(
            dataset,
            seed=seed,
            secure=secure,
            collate_fn=collate_fn,
            max_physical_batch_size=max_physical_batch_size,
        )
        self._batch_size = require_count("batch_size", batch_size, minimum=1)
        if self._batch_size > self.dataset_size:
            raise ValueError(
                f"batch_size must be in [1, len(dataset)={self.dataset_size}], got {batch_size}"
            )

    batch_size = fixed_parameter(
        "batch_size", "b, the records of each logical batch (read-only: fixed at construction).")

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)


class ShuffledDataLoader(_FixedSizeLoader):
    """Random reshuffling: each epoch draws a uniform permutation of the records and cuts it
    into ceil(n / batch_size) consecutive batches (the last may be smaller), so every record
    is used exactly once per epoch.

    Event per *epoch*: ``Shuffled(Gaussian(sigma), batch_size, n)`` under zero-out
    (:attr:`neighbouring`): neighbouring datasets differ in one record being replaced by a zero
    (null) record whose clipped contribution is 0 (Kairouz et al. 2021). Under it the batches
    are disjoint and fixed by the permutation alone, so the epoch costs what one batch costs
    (Yu et al. 2019, Theorem 2), with the clipped sum's sensitivity C: the same numbers as the
    same sigma under add/remove. It is **not** an add/remove-one guarantee (adding a record
    shifts the others across batch boundaries; :class:`dpsharp.events.Shuffled`): for that, use
    :class:`PoissonDataLoader`. The normaliser of the noisy sum is ``batch_size`` for every
    batch, the last included.
    """

    sampling = "shuffle"
    # the permutation of the current epoch; None until the first epoch begins (the
    # constructor is _FixedSizeLoader's: dataset, batch_size, seed, secure, collate_fn,
    # max_physical_batch_size)
    _permutation: np.ndarray | None = None

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.dataset_size // self.batch_size)

    def implied_event(self, noise_multiplier: float) -> Event:
        return sampling_event(
            "shuffle", noise_multiplier, dataset_size=self.dataset_size, batch_size=self.batch_size
        )

    def _begin_epoch(self) -> None:
        self._permutation = self._random.permutation(self.dataset_size)

    def _draw(self) -> np.ndarray:
        assert self._permutation is not None
        start = self._position * self.batch_size
        return self._permutation[start : start + self.batch_size]

    def _config(self) -> dict[str, Any]:
        return {"dataset_size": self.dataset_size, "batch_size": self.batch_size}

    def _extra_state(self) -> Any:
        return None if self._permutation is None else self._permutation.tolist()

    def _load_extra_state(self, extra: Any) -> None:
        self._permutation = None if extra is None else np.asarray(extra, dtype=np.int64)
        if self._permutation is not None and sorted(self._permutation.tolist()) != list(
            range(self.dataset_size)
        ):
            raise ValueError("the checkpoint's permutation is not a permutation of the dataset")


class WithoutReplacementDataLoader(_FixedSizeLoader):
    """Fixed-size sampling: each logical batch is an independent uniformly random subset of
    exactly ``batch_size`` records (sampling without replacement within a batch).

    Event per step: ``SampledWithoutReplacement(Gaussian(sigma / 2), batch_size, n)``, stated
    under replace-one (Wang, Balle, Kasiviswanathan 2019), where the clipped sum has
    sensitivity 2C. ``steps_per_epoch`` defaults to round(n / batch_size).
    """

    sampling = "without_replacement"

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int,
        steps_per_epoch: int | None = None,
        seed: int | None = None,
        secure: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        max_physical_batch_size: int | None = None,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            seed=seed,
            secure=secure,
            collate_fn=collate_fn,
            max_physical_batch_size=max_physical_batch_size,
        )
        self._steps = (
            max(1, round(self.dataset_size / self.batch_size))
            if steps_per_epoch is None
            else require_count("steps_per_epoch", steps_per_epoch, minimum=1)
        )

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def implied_event(self, noise_multiplier: float) -> Event:
        return sampling_event(
            "without_replacement",
            noise_multiplier,
            dataset_size=self.dataset_size,
            batch_size=self.batch_size,
        )

    def _draw(self) -> np.ndarray:
        return self._random.subset(self.dataset_size, self.batch_size)

    def _config(self) -> dict[str, Any]:
        return {
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "steps_per_epoch": self._steps,
        }


_LOADERS: dict[str, type[DPDataLoader]] = {
    "poisson": PoissonDataLoader,
    "shuffle": ShuffledDataLoader,
    "without_replacement": WithoutReplacementDataLoader,
}


def require_whole_dataset_sampler(loader: DataLoader[Any], *, allowed: tuple[type, ...] = ()) -> None:
    """Refuse a torch DataLoader whose sampler does more than order the whole dataset.

    The DP loaders replace the sampler and draw from every record of ``loader.dataset``. That
    is only what the user meant for torch's default samplers over ``loader.dataset`` itself
    (``SequentialSampler``, and ``RandomSampler`` without replacement over the whole dataset;
    their exact classes, not subclasses; ``allowed`` adds others over the same dataset, e.g.
    ``DistributedSampler`` for the distributed loader). A subset sampler would have held-out
    records trained on, and a weighted or with-replacement sampler has no sampling rate the
    accountant could be told, so both are refused here rather than silently dropped."""
    from torch.utils.data import RandomSampler, SequentialSampler

    sampler = loader.sampler
    # The exact classes, over this very dataset: a subclass may yield any subset, and
    # SequentialSampler(range(10)) orders another "dataset" (the first ten indices).
    if type(sampler) is SequentialSampler and sampler.data_source is loader.dataset:
        return
    over = getattr(sampler, "dataset", loader.dataset)  # (DistributedSampler's dataset)
    if isinstance(sampler, allowed) and over is loader.dataset:
        return
    if type(sampler) is RandomSampler:
        whole = not sampler.replacement and sampler.num_samples == len(sampler.data_source)
        if whole and sampler.data_source is loader.dataset:
            return
    raise ValueError(
        f"data_loader samples with {type(sampler).__name__}, which the DP loader would replace "
        "by its own sampling of every record of data_loader.dataset: records that sampler "
        "leaves out would be trained on, and a weighted or with-replacement sampler has no "
        "sampling rate to account. To train on a subset, wrap it in "
        "torch.utils.data.Subset; otherwise build the DataLoader with shuffle=True (or no "
        "sampler), or a dpsharp loader directly"
    )


def from_dataloader(
    loader: DataLoader[Any] | DPDataLoader,
    *,
    sampling: str = "poisson",
    seed: int | None = None,
    secure: bool = False,
    max_physical_batch_size: int | None = None,
) -> DPDataLoader:
    """A DP loader over ``loader.dataset`` with the same (expected) batch size and collate_fn.

    A plain :class:`torch.utils.data.DataLoader` does not say how it samples in a form an
    accountant can use, so its sampler is *replaced*: ``sampling="poisson"`` gives
    q = batch_size / len(dataset) (the rate the loader's own batch size implies, stated here
    rather than guessed from ``len(loader)``), ``"shuffle"`` and ``"without_replacement"`` keep
    the batch size. A DP loader is returned unchanged. A sampler other than torch's default
    ones over the whole dataset is refused (:func:`require_whole_dataset_sampler`).
    """
    if isinstance(loader, DPDataLoader):
        if (max_physical_batch_size is not None
                and max_physical_batch_size != loader.max_physical_batch_size):
            raise ValueError(
                f"max_physical_batch_size={max_physical_batch_size!r} was given with a "
                f"{type(loader).__name__}, which is used as built (its "
                f"max_physical_batch_size is {loader.max_physical_batch_size!r}); give it when "
                "building the loader"
            )
        return loader
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"data_loader must be a torch DataLoader or a dpsharp DPDataLoader, got "
            f"{type(loader).__name__}"
        )
    if sampling not in _LOADERS:
        raise ValueError(f"sampling must be one of {', '.join(map(repr, _LOADERS))}, got {sampling!r}")
    require_whole_dataset_sampler(loader)
    batch_size = loader.batch_size
    if batch_size is None:
        raise ValueError(
            "data_loader has a custom batch_sampler, so its batch size is unknown; build a "
            "PoissonDataLoader / ShuffledDataLoader / WithoutReplacementDataLoader directly"
        )
    common: dict[str, Any] = {
        "seed": seed,
        "secure": secure,
        "collate_fn": loader.collate_fn,
        "max_physical_batch_size": max_physical_batch_size,
    }
    if sampling == "poisson":
        return PoissonDataLoader(loader.dataset, expected_batch_size=float(batch_size), **common)
    return _LOADERS[sampling](loader.dataset, batch_size=batch_size, **common)  # type: ignore[call-arg]
