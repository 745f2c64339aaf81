"""Host allocator tuning (service.app.host_memory): freed reply buffers are reused instead of page-faulted again,
in a bounded number of glibc arenas."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import subprocess
import sys

import pytest
import torch

from service.app import host_memory
from service.app.host_memory import limit_malloc_arenas, reuse_freed_host_memory, set_torch_threads
from tests.support.python_subprocess import run_python

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# 20 cycles of a 4-image reply (four 5 MB buffers written, then freed); minor page faults counted over the last 10.
# glibc's defaults adapt the mmap threshold to 5 MB but then trim the 20 MB freed at the heap top (trim threshold
# = 2 x 5 MB) and fault it in again on the next reply.
_CYCLES = """
import resource, sys
from service.app.host_memory import reuse_freed_host_memory
applied = reuse_freed_host_memory(int(sys.argv[1]))
def cycle():
    bufs = [bytearray(5 << 20) for _ in range(4)]  # zeroed: every page is touched, like a reply being written
    del bufs
for _ in range(10):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_per_cycle(reuse_bytes: int) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", _CYCLES, str(reuse_bytes)], capture_output=True, text=True, check=True)
    applied, faults = out.stdout.split()
    return applied == "True", int(faults) / 10


@pytest.mark.skipif(not GLIBC, reason="glibc malloc tuning")
def test_reuse_keeps_freed_reply_buffers_instead_of_faulting_them_in_again() -> None:
    default_applied, default_faults = faults_per_cycle(0)
    tuned_applied, tuned_faults = faults_per_cycle(1 << 30)
    assert not default_applied and tuned_applied
    assert default_faults > 1000  # glibc default: most of the 5120 pages are new every time
    assert tuned_faults < 50, tuned_faults  # reused heap memory: no new pages


# 12 threads, all alive at once (a thread that has exited hands its arena to the next one), each writing and
# freeing 20 MB reply-sized blocks under `mmproc serve`'s thresholds; then glibc's arenas are counted from
# malloc_info's XML (one <heap nr=...> per arena).
_ARENAS = """
import ctypes, ctypes.util, threading
from service.app.host_memory import limit_malloc_arenas, reuse_freed_host_memory
limit_malloc_arenas({arena_max})
reuse_freed_host_memory(1 << 30)
all_started = threading.Barrier(12)
def replies():
    all_started.wait()
    for _ in range(3):
        block = bytearray(20 << 20)
        del block
threads = [threading.Thread(target=replies) for _ in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.open_memstream.restype = ctypes.c_void_p
text, size = ctypes.c_char_p(), ctypes.c_size_t()
stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(text), ctypes.byref(size)))
assert libc.malloc_info(0, stream) == 0 and libc.fclose(stream) == 0
print(text.value.decode().count("<heap nr="))
"""


def arenas_after_replies(arena_max: int) -> int:
    done = run_python(_ARENAS.format(arena_max=arena_max))
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc malloc arenas")
def test_arena_cap_bounds_the_arenas_that_reply_threads_create() -> None:
    capped, default = arenas_after_replies(2), arenas_after_replies(0)
    assert 1 <= capped <= 2, capped
    assert default > 2, default  # glibc's default: one arena per thread here (up to 8 per core)


def test_without_glibc_the_allocator_is_left_alone_with_one_log_line(monkeypatch, caplog) -> None:
    def no_glibc(name):
        raise OSError(f"{name}: not here")

    monkeypatch.setattr(ctypes, "CDLL", no_glibc)
    host_memory._glibc_mallopt.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=host_memory.__name__):
            assert not limit_malloc_arenas(2)
            assert not reuse_freed_host_memory(1 << 30)
        assert len(caplog.records) == 1 and "not glibc" in caplog.text
    finally:
        host_memory._glibc_mallopt.cache_clear()  # the next caller finds the real one again


def test_torch_threads_are_capped_by_the_cpus_and_zero_keeps_the_default() -> None:
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(1) == 1
        assert set_torch_threads(0) == 1  # 0: left as it is
        assert set_torch_threads(100_000) == len(os.sched_getaffinity(0))  # never more threads than CPUs
    finally:
        torch.set_num_threads(before)
