"""Host tuning for the serving process: glibc malloc's freed-memory reuse and arena count, and torch's CPU threads.

Every serialized reply allocates tens of MB of Python bytes (the messages handed to gRPC). glibc serves large
allocations with fresh mmap pages and unmaps them on free, so every reply first-touches every page again (2-4x
slower staging, docs/benchmarks/transport.md). Raising the mmap and trim thresholds keeps freed memory in the heap for
the next reply. The cost: the process keeps its peak heap instead of returning it (bounded by the request limits),
and it keeps it per arena: glibc gives threads their own arenas (up to 8 per core), each holding its own peak, so
the arena count is capped too (docs/benchmarks/overload.md, "Main-process RSS: arenas").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1  # mallopt takes an int


@functools.cache
def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, or None (another C library: said once, in one log line)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt exists but ignores everything
        return libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("not glibc: host allocator left as is (no freed-memory reuse, no arena cap)")
        return None


def reuse_freed_host_memory(reuse_bytes: int) -> bool:
    """Serve allocations below `reuse_bytes` from the heap and keep up to `reuse_bytes` of freed memory there.

    0 leaves glibc's defaults. Returns whether the settings took effect (False on a non-glibc C library)."""
    if reuse_bytes <= 0:
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    value = min(reuse_bytes, _INT_MAX)
    applied = mallopt(_M_MMAP_THRESHOLD, value) == 1 and mallopt(_M_TRIM_THRESHOLD, value) == 1
    if applied:
        logger.info("host allocator: allocations and freed memory up to %d MiB stay in the heap", value >> 20)
    else:
        logger.warning("mallopt refused a threshold of %d bytes: host allocator left as is", value)
    return applied


def limit_malloc_arenas(arena_max: int) -> bool:
    """Let glibc create at most `arena_max` malloc arenas (0: glibc's default, 8 per core); threads beyond share.

    glibc fixes its limit when the 9th arena is made, so this must run before the process starts its threads.
    Returns whether it took effect (False for 0 or on a non-glibc C library)."""
    if arena_max <= 0:
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    applied = mallopt(_M_ARENA_MAX, min(arena_max, _INT_MAX)) == 1
    if applied:
        logger.info("host allocator: malloc arenas capped at %d", arena_max)
    else:
        logger.warning("mallopt refused an arena limit of %d: glibc's default kept", arena_max)
    return applied


def set_torch_threads(threads: int) -> int:
    """Use at most `threads` of this process's CPUs for torch's CPU ops (0: leave torch's default); returns the
    count in effect. The serialized reply copies run on them (mmproc/transport/serialized/host_copy.py; thread counts measured
    in docs/benchmarks/transport.md); more threads than CPUs only oversubscribe."""
    if threads > 0:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(min(threads, cpus))
    return torch.get_num_threads()
