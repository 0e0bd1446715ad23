"""Keep glibc from returning the readout's large buffers to the kernel after every chunk.

A readout chunk allocates logits and log-probabilities of [rows × vocab] floats (tens to hundreds of MB) and frees
them a moment later. glibc serves blocks that large with a fresh ``mmap`` and gives them back on ``free``, so every
chunk page-faults its buffers in again: measured on a 2-core CPU, scoring 8 records on SmolLM2 on one thread spent
13 s of 42 s in the kernel (6.6 M minor faults); with freed blocks kept for reuse, 27 s (61 k faults), the same
peak RSS (docs/performance.md). The same buffers are live at the peak either way; the process only keeps (up to
``TRIM``) freed memory instead of handing it back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MMAP_THRESHOLD = 256 * 2**20  # blocks below this come from the heap, where a freed block is reused
TRIM = 1024 * 2**20  # free memory kept at the heap's top before it is handed back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's <malloc.h>
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES")
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if they were set here.

    Does nothing off Linux/glibc, where the user has tuned malloc already (``MALLOC_*_`` or ``GLIBC_TUNABLES``),
    or with ``DEPTHLENS_MALLOC=default``.
    """
    global _done
    if _done or not sys.platform.startswith("linux"):
        return False
    _done = True
    if os.environ.get("DEPTHLENS_MALLOC") == "default" or any(k in os.environ for k in _USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # trim first: setting either one turns off glibc's own (per-free) adjustment of both
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
