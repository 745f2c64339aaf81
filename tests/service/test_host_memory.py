"""Host allocator tuning (service.process.host_memory): freed reply buffers are reused instead of page-faulted again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from service.process.host_memory import set_torch_threads

# 20 cycles of a 4-image reply (four 5 MB buffers written, then freed); minor page faults counted over the last 10.
# glibc's defaults adapt the mmap threshold to 5 MB but then trim the 20 MB freed at the heap top (trim threshold
# = 2 x 5 MB) and fault it in again on the next reply.
_CYCLES = """
import resource, sys
from service.process.host_memory import reuse_freed_host_memory
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning")
def test_reuse_keeps_freed_reply_buffers_instead_of_faulting_them_in_again() -> None:
    default_applied, default_faults = faults_per_cycle(0)
    tuned_applied, tuned_faults = faults_per_cycle(1 << 30)
    assert not default_applied and tuned_applied
    assert default_faults > 1000  # glibc default: most of the 5120 pages are new every time
    assert tuned_faults < 50, tuned_faults  # reused heap memory: no new pages


def test_torch_threads_are_capped_by_the_cpus_and_zero_keeps_the_default() -> None:
    before = torch.get_num_threads()
    try:
        assert set_torch_threads(1) == 1
        assert set_torch_threads(0) == 1  # 0: left as it is
        assert set_torch_threads(100_000) == len(os.sched_getaffinity(0))  # never more threads than CPUs
    finally:
        torch.set_num_threads(before)
