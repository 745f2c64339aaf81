"""CUDA IPC transport end to end on a GPU: server in this process, consumers as separate processes.

Skipped without CUDA (conftest). Run on the H200 with scripts/gpu_ipc_check.sh.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.common import wait_until
from tests.support.ipc import consumer, next_event, pool_stats, start_ipc_server
from tests.support.server import ServiceThread

pytestmark = pytest.mark.cuda


@pytest.fixture
def server() -> Iterator[ServiceThread]:
    srv = start_ipc_server()
    yield srv
    srv.stop()


def test_server_reports_ipc_active(server: ServiceThread) -> None:
    assert server.service.pipeline.pool is not None, server.service.pipeline.ipc_status
    assert "IPC active" in server.service.info.ipc_status


def test_ipc_equals_serialized_bit_for_bit_with_one_open_per_process(server: ServiceThread) -> None:
    proc = consumer("compare", server.grpc_target, "1000")
    event = next_event(proc, timeout=600)
    assert proc.wait(60) == 0
    assert event["equal"] is True
    assert event["opens"] == 1, event
    assert event["fallbacks"] == 0, event
    assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)


def test_results_fetched_by_key_over_ipc_equal_the_serialized_ones(server: ServiceThread) -> None:
    # The vLLM connector's worker path (mmproc.engines.vllm): keep by key, then fetch into the engine's GPU.
    proc = consumer("fetch", server.grpc_target, "20", "448")
    event = next_event(proc, timeout=300)
    assert proc.wait(60) == 0
    assert event["equal"] is True and event["on_gpu"] is True, event
    assert event["opens"] == 1 and event["fallbacks"] == 0, event
    assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)


def test_async_client_reads_over_ipc_with_one_open(server: ServiceThread) -> None:
    proc = consumer("async", server.grpc_target, "200")
    event = next_event(proc, timeout=600)
    assert proc.wait(60) == 0
    assert event["equal"] is True
    assert event["opens"] == 1 and event["fallbacks"] == 0, event
    assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)


def test_a_slow_reader_is_never_overwritten(server: ServiceThread) -> None:
    slow = consumer("slow", server.grpc_target)
    held = next_event(slow)
    busy = consumer("compare", server.grpc_target, "300")  # cycles the rest of the 8 MiB pool many times
    assert next_event(busy, timeout=600)["equal"] is True
    busy.wait(60)
    slow.stdin.write("go\n")
    slow.stdin.flush()
    after = next_event(slow)
    assert slow.wait(60) == 0
    assert after["unchanged"] is True and after["digest"] == held["digest"]
    assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)


def test_killed_consumer_leases_are_reclaimed(server: ServiceThread) -> None:
    proc = consumer("hold", server.grpc_target)
    next_event(proc)
    assert pool_stats(server).leases_active >= 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert wait_until(lambda: pool_stats(server).bytes_in_use == 0), pool_stats(server)
    assert pool_stats(server).leases_active == 0 and pool_stats(server).sessions == 0


def test_server_restart_makes_the_consumer_reopen(server: ServiceThread) -> None:
    port = server.service.grpc_port
    proc = consumer("loop", server.grpc_target, "400")
    started = next_event(proc, timeout=120)  # served by the first pool before we restart
    assert started["state"] == "started" and started["opens"] == 1, started
    server.stop()
    restarted = start_ipc_server(grpc_address=f"127.0.0.1:{port}")
    try:
        event = next_event(proc, timeout=300)
        assert proc.wait(60) == 0
        assert event["done"] == 400
        assert event["pools"] == [started["pool"], restarted.service.pipeline.pool.identity.pool_id], event
        assert event["opens"] == 2 and event["fallbacks"] == 0, event  # one per pool epoch, no silent fallback
    finally:
        restarted.stop()


@pytest.mark.parametrize("fallback", [True, False])
def test_pool_exhaustion_behaves_as_configured_within_the_deadline(fallback: bool) -> None:
    srv = start_ipc_server(ipc_pool_mb=1, ipc_fallback=fallback)
    try:
        holder = consumer("hold", srv.grpc_target)  # 4 x 448^2 bf16 embeddings: more than half the pool
        next_event(holder)
        script = (
            "import sys, time, json\n"
            "from mmproc.client import EncoderClient\n"
            "from mmproc.errors import ResourceExhaustedError\n"
            "from tests.support.ipc_consumer import images\n"
            "c = EncoderClient(sys.argv[1], device='cuda:0', transport='ipc', timeout=4)\n"
            "t = time.monotonic()\n"
            "try:\n"
            "    out = c.encode_images(images(5, count=4, size=448)); r = 'ok'\n"
            "except ResourceExhaustedError: r = 'exhausted'\n"
            "print(json.dumps({'result': r, 'seconds': time.monotonic() - t, **c.ipc_stats}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, srv.grpc_target], capture_output=True, text=True, timeout=120
        )
        assert out.stdout.strip(), f"the client printed nothing (rc {out.returncode}): {out.stderr[-3000:]}"
        event = json.loads(out.stdout.strip().splitlines()[-1])
        assert event["seconds"] < 4.5, event
        if fallback:
            assert event["result"] == "ok" and event["fallbacks"] == 1, event
        else:
            assert event["result"] == "exhausted", event
        holder.kill()
        holder.wait(10)
        assert wait_until(lambda: pool_stats(srv).bytes_in_use == 0)
    finally:
        srv.stop()
