"""Host tuning for the serving process: glibc malloc's freed-memory reuse, and torch's CPU thread count.

Every serialized reply allocates tens of MB of Python bytes (the messages handed to gRPC). glibc serves large
allocations with fresh mmap pages and unmaps them on free, so every reply first-touches every page again (2-4x
slower staging, docs/benchmarks/transport.md). Raising the mmap and trim thresholds keeps freed memory in the heap for
the next reply. The cost: the process keeps its peak heap instead of returning it (bounded by the request limits).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_INT_MAX = 2**31 - 1  # mallopt takes an int


def reuse_freed_host_memory(reuse_bytes: int) -> bool:
    """Serve allocations below `reuse_bytes` from the heap and keep up to `reuse_bytes` of freed memory there.

    0 leaves glibc's defaults. Returns whether the settings took effect (False on a non-glibc C library)."""
    if reuse_bytes <= 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("no glibc mallopt here: host allocator left as is")
        return False
    value = min(reuse_bytes, _INT_MAX)
    applied = mallopt(_M_MMAP_THRESHOLD, value) == 1 and mallopt(_M_TRIM_THRESHOLD, value) == 1
    if applied:
        logger.info("host allocator: allocations and freed memory up to %d MiB stay in the heap", value >> 20)
    else:
        logger.warning("mallopt refused a threshold of %d bytes: host allocator left as is", value)
    return applied


def set_torch_threads(threads: int) -> int:
    """Use at most `threads` of this process's CPUs for torch's CPU ops (0: leave torch's default); returns the
    count in effect. The serialized reply copies run on them (mmproc/transport/host_copy.py; thread counts measured
    in docs/benchmarks/transport.md); more threads than CPUs only oversubscribe."""
    if threads > 0:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(min(threads, cpus))
    return torch.get_num_threads()
