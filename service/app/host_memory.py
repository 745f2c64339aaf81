"""Host tuning for the serving process: glibc malloc keeps freed reply memory in the heap (fresh mmap pages made
staging slower: docs/benchmarks/transport.md), in few arenas (each keeps its peak: docs/deploy.md); torch's threads."""

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
    """Serve allocations below `reuse_bytes` from the heap and keep that much freed memory (0: glibc's defaults);
    False on a non-glibc C library."""
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
    """At most `arena_max` malloc arenas (0: glibc's default); must run before the process starts its threads."""
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
    """At most `threads` CPUs for torch's CPU ops, which run the reply copies (0: torch's default); returns the count."""
    if threads > 0:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(min(threads, cpus))
    return torch.get_num_threads()
