"""dpsharp.torch.retain_freed_memory: glibc's trim and mmap thresholds, checked by their effect.

Provenance: glibc's documented mallopt semantics (M_TRIM_THRESHOLD, M_MMAP_THRESHOLD; mallopt(3)).
The effect is measured in a subprocess (the settings are process-wide): a freed 24 MiB block is
kept (resident size stays up) with the settings and returned to the system without.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from dpsharp.torch import retain_freed_memory  # noqa: E402

pytestmark = pytest.mark.torch

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

_CHILD = textwrap.dedent("""
    import ctypes, ctypes.util, sys
    from dpsharp.torch import retain_freed_memory
    if sys.argv[1] == "retain":
        assert retain_freed_memory() is True
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def rss_kib():
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))

    before = rss_kib()
    block = libc.malloc(24 << 20)
    ctypes.memset(block, 1, 24 << 20)  # touch every page
    libc.free(block)
    print(rss_kib() - before)
""")


def _rss_kept_kib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                         check=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_freed_memory_is_kept_with_the_settings_and_returned_without():
    assert _rss_kept_kib("retain") > 20 * 1024
    assert _rss_kept_kib("default") < 4 * 1024


def test_bad_arguments():
    with pytest.raises(ValueError, match="mmap_threshold"):
        retain_freed_memory(mmap_threshold=64 << 20)
    with pytest.raises(ValueError, match="trim_threshold"):
        retain_freed_memory(trim_threshold=2**31)
    with pytest.raises(ValueError, match="trim_threshold"):
        retain_freed_memory(trim_threshold=-1)
