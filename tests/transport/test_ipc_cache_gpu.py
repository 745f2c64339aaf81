"""The embedding cache's pool tier end to end on a GPU: hits lent from the IPC pool, consumers as processes.

Skipped without CUDA (conftest). Run on the H200 with scripts/gpu_cache_check.sh.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.support.common import wait_until
from tests.support.ipc import next_event, pool_stats, start_ipc_server

pytestmark = pytest.mark.cuda


def run(mode: str, target: str, *args: str) -> dict:
    """One tests.support.ipc_cache_consumer process to its end; its last event."""
    done = subprocess.run([sys.executable, "-m", "tests.support.ipc_cache_consumer", mode, target, *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1])


def test_a_reply_mixing_cached_slices_and_a_fresh_lease_reads_bit_identical() -> None:
    srv = start_ipc_server(ipc_pool_mb=64, cache_ipc_mb=32)
    try:
        event = run("mixed", srv.grpc_target)
        assert event["first"] == ["CACHE_MISS", "CACHE_MISS"], event
        assert event["second"] == ["CACHE_HIT", "CACHE_MISS", "CACHE_HIT"], event
        assert event["leases"] == 3 and event["equal"] is True and event["fallbacks"] == 0, event
        cache = srv.service.pipeline.cache.pool_store
        assert wait_until(lambda: pool_stats(srv).leases_active == 0 and pool_stats(srv).leases_awaiting_ack == 0)
        assert pool_stats(srv).bytes_in_use == cache.nbytes > 0  # what stays is exactly what the cache holds
    finally:
        srv.stop()


def test_a_consumer_killed_while_holding_a_cached_slice() -> None:
    srv = start_ipc_server(ipc_pool_mb=64, cache_ipc_mb=32)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.ipc_cache_consumer", "hold_cached", srv.grpc_target],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        held = next_event(proc)
        assert held["equal"] is True
        assert pool_stats(srv).leases_active >= 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert wait_until(lambda: pool_stats(srv).sessions == 0 and pool_stats(srv).leases_active == 0)
        cache = srv.service.pipeline.cache.pool_store
        assert pool_stats(srv).bytes_in_use == cache.nbytes > 0  # the session's lease went, the entry stayed
        again = run("mixed", srv.grpc_target)  # A is a hit: the slice was kept intact for the next reader
        assert again["equal"] is True and again["first"][0] == "CACHE_HIT", again
    finally:
        srv.stop()


def test_under_pool_pressure_the_cache_gives_space_back_instead_of_falling_back() -> None:
    # Two 1024^2 images per request (~1.4 MiB of bf16 embeddings) and a 3 MiB cache share of a 4 MiB pool: from the
    # third request on, a lease fits only once the cache gives slices back.
    srv = start_ipc_server(ipc_pool_mb=4, cache_ipc_mb=3)
    try:
        event = run("churn", srv.grpc_target, "30", "1024")
        assert event["equal"] is True and event["fallbacks"] == 0, event
        cache = srv.service.pipeline.cache.pool_store
        assert cache.nbytes <= cache.max_bytes and cache.stats.evictions > 0
        assert wait_until(lambda: pool_stats(srv).bytes_in_use == cache.nbytes)
    finally:
        srv.stop()
