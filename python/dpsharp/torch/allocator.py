"""Process memory settings for DP training on the CPU.

Book-keeping clipping (Bu et al., ICML 2023) keeps every layer's activations and output
gradients until the end of the backward pass, where the per-example norms and clipped sums are
formed, so a DP step's memory peaks higher than a non-private step's, which frees each output
gradient as soon as the layer below has used it. glibc's allocator returns freed memory at the top
of its heap to the operating system once more than ``M_TRIM_THRESHOLD`` is free, and gives large
blocks their own mappings; after every step the memory above the non-private peak is handed
back, and the next backward pass takes it again page by page, each page zeroed by the kernel
(on the bench transformer: about 9,000 page faults, 35 MB, per DP step; 5-10% of its time, more
with two threads faulting at once).

:func:`retain_freed_memory` raises glibc's trim and mmap thresholds so that the process keeps
freed memory for reuse: its resident size then stays at its peak between steps (what a caching
allocator such as jemalloc, tcmalloc or PyTorch's CUDA allocator does). It is process-wide and
opt-in: dpsharp never changes allocator settings by itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from dpsharp._validation import require_count

__all__ = ["retain_freed_memory"]

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's cap (HEAP_MAX / 2 on 64-bit): 32 MiB


def retain_freed_memory(*, trim_threshold: int = 1 << 30,
                        mmap_threshold: int = _MMAP_THRESHOLD_MAX) -> bool:
    """Keep freed memory in the process instead of returning it to the system (glibc only).

    Sets ``mallopt(M_TRIM_THRESHOLD, trim_threshold)`` (free memory at the top of the heap is
    returned only beyond this many bytes) and ``mallopt(M_MMAP_THRESHOLD, mmap_threshold)``
    (blocks below this size come from the heap, whose freed memory is reused, rather than from
    their own mappings, which are unmapped when freed). Process-wide; call it once at start-up.
    The cost is resident memory: the process keeps the most it used (up to the trim threshold
    beyond that) between steps.

    Returns True where applied (Linux with glibc), False elsewhere (nothing is changed).
    """
    trim = require_count("trim_threshold", trim_threshold)
    mmap = require_count("mmap_threshold", mmap_threshold)
    if mmap > _MMAP_THRESHOLD_MAX:
        raise ValueError(
            f"mmap_threshold must be in [0, {_MMAP_THRESHOLD_MAX}] (glibc ignores larger "
            f"values), got {mmap}"
        )
    if trim > 2**31 - 1:
        raise ValueError(f"trim_threshold must be in [0, 2^31 - 1] (a C int), got {trim}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, trim)) and bool(mallopt(_M_MMAP_THRESHOLD, mmap))
