"""Counter-based Gaussian noise for DP-SGD releases.

A :class:`NoiseGenerator` hands out one *release key* per noisy release (one optimizer step):
a key (up to 256 bits) and a 32-bit release counter. The fused kernel (cpp/src/clip.cpp) turns
(key, parameter index, release counter, rank, element index) into a standard normal with the
ChaCha8 block function (Bernstein 2008; the stream cipher's 256-bit key, its block counter and
nonce as the counter words) and a Box-Muller transform in the parameter's precision (float32
for float32 / bfloat16 parameters, float64 for float64; cpp/include/dpsharp/noise_stream.hpp),
so no parameter-sized noise tensor is ever allocated and no noise value is reused across steps,
parameters or ranks (the counters differ).

Floating-point caveats (what is and is not mitigated)
-----------------------------------------------------
* Predictable seeds: in ``secure=True`` mode every release draws a fresh 256-bit key from the
  operating system's CSPRNG (:func:`secrets.randbits`, i.e. ``os.urandom``); no seed can be
  passed and the state cannot be replayed. ChaCha is a stream cipher, so with a secret key the
  noise cannot be predicted from any number of earlier outputs (a statistical generator such
  as Philox or a Mersenne twister gives no such guarantee). In the default mode the stream is
  reproducible from the seed, which is what experiments want and what production must not use.
* Tail truncation: the radius uses a 53-bit uniform, so |z| <= sqrt(-2 ln 2^-53) = 8.57; the
  Gaussian mass cut off is about 1e-17 per coordinate, negligible next to any target delta.
  Near zero the radius is resolved to sqrt(2 * 2^-53) (-ln U is formed from the distance of U
  to 0 or to 1, whichever is smaller). float32 noise is accurate to a few float32 ulp, the
  precision the gradient is rounded to anyway.
* Not mitigated: the floating-point *support* attacks on Gaussian/Laplace samplers (Mironov,
  CCS 2012, for Laplace; Jin, McMurtry, Rubinstein, Ohrimenko, "Are we there yet? Timing and
  floating-point attacks on differential privacy systems", S&P 2022, for Gaussian samplers
  incl. Box-Muller in DP-SGD libraries): the set of floats that ``sum + noise`` can take
  depends on ``sum``, and the sampler's time is not guaranteed constant (the polynomial log /
  sin / cos used here are branch-free, but the surrounding code is not audited for timing).
  A discrete Gaussian (Canonne, Kamath, Steinke 2020) with snapping of the sum to a grid would
  close these gaps; it is not implemented. In DP-SGD the adversary usually sees only model
  weights after the learning-rate multiply and further float rounding, which blurs but does
  not provably remove the leak.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from dpsharp._validation import require_count

__all__ = ["NoiseGenerator", "ReleaseKey"]

_MAX_RELEASES = 2**32  # the release counter is one 32-bit word of the ChaCha nonce
_MAX_RANK = 2**32


@dataclass(frozen=True)
class ReleaseKey:
    """The noise stream of one release: ChaCha key (< 2^256), release counter and rank."""

    key: int
    release: int
    rank: int


class NoiseGenerator:
    """Counter-based Gaussian noise source for the fused clip-and-noise kernel.

    Parameters
    ----------
    seed:
        Integer in [0, 2^64) keying the stream; None draws one from the OS CSPRNG (and stores
        it, so ``state_dict()`` still allows an exact resume). Refused when ``secure=True``.
        Two generators with one seed produce the same noise: releases of two runs keyed alike
        are not independent, and their privacy does not compose.
    secure:
        Draw a fresh 256-bit key from the OS CSPRNG at every release; no seed, not replayable.
    rank:
        Distributed rank in [0, 2^32): goes into the counter, so ranks sharing a seed never
        share noise.

    Notes
    -----
    Noise of element j, parameter p, release r: standard normal number j of the ChaCha8 stream
    with key K (the seed) and nonce (p, r, rank) (see :mod:`dpsharp.torch.kernels`).
    """

    def __init__(self, seed: int | None = None, *, secure: bool = False, rank: int = 0) -> None:
        if not isinstance(secure, bool):
            raise TypeError(f"secure must be a bool, got {secure!r}")
        rank = require_count("rank", rank)
        if rank >= _MAX_RANK:
            raise ValueError(f"rank must be in [0, 2^32), got {rank}")
        if secure and seed is not None:
            raise ValueError(
                "seed must be None when secure=True: secure mode takes a fresh key from the "
                "operating system's CSPRNG at every release and never accepts a user seed"
            )
        if seed is not None:
            seed = require_count("seed", seed)
            if seed >= 2**64:
                raise ValueError(f"seed must be in [0, 2^64), got {seed}")
        self._secure = secure
        self._seed: int | None = None if secure else (
            seed if seed is not None else secrets.randbits(64)
        )
        self._rank = rank
        self._releases = 0
        self._drawn_here = 0  # releases drawn in this process (never restored)
        # A weak reference to the DPOptimizer releasing with this generator, set by it.
        self._owner: Any = None

    @property
    def secure(self) -> bool:
        """Whether keys come from the OS CSPRNG at every release."""
        return self._secure

    @property
    def rank(self) -> int:
        """The rank word of the counter."""
        return self._rank

    @property
    def releases(self) -> int:
        """Number of releases handed out so far."""
        return self._releases

    def next_release(self) -> ReleaseKey:
        """The key of the next release (advances the release counter)."""
        if self._secure:
            key = secrets.randbits(256)
            release = self._releases % _MAX_RELEASES  # the key is fresh, the counter is a label
        else:
            if self._releases >= _MAX_RELEASES:
                raise RuntimeError(
                    "this NoiseGenerator's stream is exhausted (2^32 releases); "
                    "start a new one with a different seed"
                )
            assert self._seed is not None
            key = self._seed
            release = self._releases
        self._releases += 1
        self._drawn_here += 1
        return ReleaseKey(key=key, release=release, rank=self._rank)

    def state_dict(self) -> dict[str, Any]:
        """Serialisable state; resuming from it continues the stream (never repeats it)."""
        return {"seed": self._seed, "secure": self._secure, "rank": self._rank,
                "releases": self._releases}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a secure generator only restores its counter).

        A seeded generator that has drawn noise in this process for an optimizer an engine
        accounts refuses: the state would rewind the stream, and the next releases would
        repeat noise already released (two releases with the same noise reveal the
        difference of their clipped sums without noise)."""
        owner = self._owner() if self._owner is not None else None
        if (not self._secure and self._drawn_here and owner is not None
                and getattr(owner, "accounted", False)):
            raise RuntimeError(
                f"load_state_dict refused: this noise generator has drawn {self._drawn_here} "
                "releases in this process for an optimizer an engine accounts, and a loaded "
                "state would rewind its stream (the next releases would repeat noise already "
                "released). Load checkpoints into a fresh engine and optimizer when resuming"
            )
        if bool(state.get("secure")) != self._secure:
            raise ValueError(
                f"state secure={state.get('secure')!r} does not match this generator's "
                f"secure={self._secure}"
            )
        releases = require_count("releases", state["releases"])
        rank = require_count("rank", state["rank"])
        if not self._secure:
            seed = require_count("seed", state["seed"])
            if seed >= 2**64:
                raise ValueError(f"seed must be in [0, 2^64), got {seed}")
            self._seed = seed
        self._rank = rank
        self._releases = releases

    def __repr__(self) -> str:
        mode = "secure" if self._secure else "seeded"
        return f"NoiseGenerator({mode}, rank={self._rank}, releases={self._releases})"
