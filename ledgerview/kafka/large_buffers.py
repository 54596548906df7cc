"""Large buffers go back to the operating system when freed, so the bytes queued.max.request.bytes stops counting
(request frames, encoded fetch batches, decoded produced values: request_queue.py) also leave the process's RSS.

glibc's malloc serves a block of MMAP_THRESHOLD_BYTES or more with a mapping of its own, unmapped when freed, but by
default it raises that threshold to the size of each such block freed (up to 32 MiB), after which 1 MiB frames and
batches come from its heaps and, freed, stay there (bench/RESULTS.md, "Issue 18: all at once, after": 48 MiB kept
free at the endpoint's peak under every hostile client at once). Setting the threshold fixes it at glibc's own starting
value. Process-wide; MALLOC_MMAP_THRESHOLD_ in the environment wins; other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's initial M_MMAP_THRESHOLD, kept instead of letting it grow."""
_M_MMAP_THRESHOLD = -3


def return_large_buffers() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES; False when not glibc or the environment sets it."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
