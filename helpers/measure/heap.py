"""Freed memory kept in the process, so that a CPU timing counts the code and not the kernel's page faults.

glibc's malloc gives a freed block back to the kernel when the block had a mapping of its own (128 KiB or more, by
default) or sat at the top of the heap past the trim threshold (mallopt(3): M_MMAP_THRESHOLD, M_TRIM_THRESHOLD).
The next block of that size then faults its pages in again, and the kernel zeroes every 4 KiB page on the way.
Whether a call pays that depends on what else the heap holds at the moment, so it changes from one process to the
next: on the course's 2-core test machine an eager `gelu(x + b) * 0.5` over a 1 MiB tensor took 0.11 ms per call in
one process and 0.6 ms in another, where every call took 256 page faults (one per page of an intermediate). The
thread's CPU clock counts the kernel's part as well, so a timing read the allocator's luck, not the code.

`keep_freed_memory` raises both thresholds, so a freed block stays in the process for the next tensor of its size,
which is what the allocators PyTorch's performance tuning guide suggests for CPU work (jemalloc, TCMalloc) do by
design. Linux with glibc only; on any other system the allocator is left as it is.
"""
from __future__ import annotations

import ctypes
import sys

KEEP_BELOW = 1 << 30  # freed blocks under 1 GiB stay in the process: every tensor a CPU lesson times
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)

_kept: bool | None = None  # this process's answer, once asked


def keep_freed_memory() -> bool:
    """Set glibc malloc's trim and mmap thresholds to KEEP_BELOW, once per process. Returns True where both took
    effect (Linux with glibc), False where the system's allocator was left as it is (macOS, Windows, musl)."""
    global _kept
    if _kept is None:
        _kept = _set_thresholds(sys.platform)
    return _kept


def _set_thresholds(platform: str, load=ctypes.CDLL) -> bool:
    """mallopt both thresholds through `load(None)` (the process's own C library); False off Linux, where the C
    library is not glibc (it has no gnu_get_libc_version) or where glibc refuses a value."""
    if not platform.startswith("linux"):
        return False
    try:
        libc = load(None)
        libc.gnu_get_libc_version  # noqa: B018  only glibc has it, and the parameter numbers above are glibc's
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # the mmap threshold first: setting it also stops glibc from moving either threshold by itself
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BELOW))
