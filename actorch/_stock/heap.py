"""Keeping the memory a process frees for its next step: glibc's malloc thresholds, set once per process.

A policy's forward over pixels allocates and frees the same megabytes at
every step (the frames cast to float, the convolutions' outputs). glibc's
malloc gives memory freed at the top of its heap back to the kernel once more
than its trim threshold is free, and maps chunks above its mmap threshold
afresh each time. Both thresholds move with what the process happened to
free before (glibc raises them when it frees a large mapped chunk), so one
process keeps its temporaries and another, running the same code, takes them
from the kernel again at every step: page faults, zeroed pages, system time.
With 4 x 84 x 84 uint8 frames that was 40 to 50 faults and about 1.6 times
the CPU per frame on a 2-core machine. Fixing both thresholds at the ceiling
glibc's own rule would reach keeps the temporaries in the process, at the
price of up to :data:`TRIM_THRESHOLD` of freed memory held rather than
returned.
"""

from __future__ import annotations

import ctypes
import functools
import os

import structlog

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

log = structlog.get_logger("actorch")

MMAP_THRESHOLD = 32 * 2**20
"""Chunks below this come from the heap: glibc's ceiling for its moving threshold on 64-bit systems."""
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
"""Freed memory kept at the top of the heap before it goes back: what glibc's rule pairs with that ceiling."""

_M_TRIM_THRESHOLD = -1  # mallopt's parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


@functools.cache
def keep_freed_memory() -> bool:
    """Make this process keep the memory its steps free for the next ones; True if glibc's malloc took it.

    Runs once per process. It leaves malloc alone where the C library is not
    glibc, and where the user chose its thresholds already (the
    ``MALLOC_*_`` variables or ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``).
    """
    try:
        library = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not a GNU system
        library = ""
    if not library.startswith("glibc"):
        return False
    if any(name in os.environ for name in _USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        log.debug("malloc thresholds left as the user set them")
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    log.debug("malloc keeps freed memory", took=took, mmap_threshold=MMAP_THRESHOLD, trim_threshold=TRIM_THRESHOLD)
    return took
