"""The NIXL transport over loopback TCP, the producer (an in-process server) and each consumer in processes of
their own (tests/support/nixl_consumer.py): identical bytes, and every fault of issue 48 with nothing leaked.
Skipped without NIXL (the `.ci/run` nixl stage installs it in a venv of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mmproc.client import EncoderClient
from mmproc.transport.nixl import engine
from mmproc.transport.nixl.config import NAME
from tests.support.common import wait_until
from tests.support.ipc import next_event
from tests.support.server import ServiceThread, test_settings

pytestmark = pytest.mark.skipif(engine.unavailable_reason() is not None, reason="NIXL is not installed")
LOOPBACK_TCP = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "PYTHONUNBUFFERED": "1"}


def start(**overrides: object) -> ServiceThread:
    settings = dict(nixl=True, nixl_ucx_tls="tcp", http_address="", cache_mb=0, nixl_ttl_s=8.0,
                    nixl_transfer_timeout_s=2.0)  # fmt: skip
    return ServiceThread(test_settings(**{**settings, **overrides})).start()


def consumer(mode: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.nixl_consumer", mode, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **LOOPBACK_TCP},
    )  # fmt: skip


def run(mode: str, *args: str) -> dict:
    proc = consumer(mode, *args)
    try:
        return next_event(proc, timeout=120)
    finally:
        proc.kill()
        proc.wait(10)


def pool(server: ServiceThread):  # noqa: ANN201 - the NixlPool
    return server.service.pipeline.delivery.producers[NAME].registered


def empty(server: ServiceThread) -> bool:
    registered = pool(server)
    stats = registered.leases.stats()
    return stats.bytes_in_use == 0 and stats.sessions == 0 and not registered._writing and not registered._lent


@pytest.fixture(scope="module")
def server():
    srv = start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bytes_equal_serialized_for_every_dtype_and_shape(dtype: str, server: ServiceThread) -> None:
    srv = server if dtype == "float32" else start(dtype=dtype)
    try:
        got = run("compare", srv.grpc_target)
        assert got["equal"] and got["fallbacks"] == 0 and got["dtype"] == f"torch.{dtype}"
        assert len({tuple(s) for s in got["shapes"]}) == 4  # four shapes
        assert pool(srv).writes_done >= 1
        assert wait_until(lambda: empty(srv), timeout=10)
    finally:
        if srv is not server:
            srv.stop()


def test_kept_results_are_fetched_over_nixl(server: ServiceThread) -> None:
    before = pool(server).writes_done
    got = run("keys", server.grpc_target)
    assert got == {"equal": True, "fallbacks": 0} and pool(server).writes_done == before + 1


def test_server_info_and_auto_choose_nixl_where_both_sides_have_it(server: ServiceThread) -> None:
    with EncoderClient(server.grpc_target, transport="serialized") as client:
        info = client.server_info()
    assert list(info.transport_names) == [NAME, "serialized"] and "NIXL active" in info.ipc_status
    assert info.node_boot_id  # a client on another node skips IPC under `auto`
    got = run("auto", server.grpc_target)
    assert got == {"reader": "NixlReader", "got": 1}


def test_a_consumer_killed_mid_read_leaves_the_pool_empty(server: ServiceThread) -> None:
    proc = consumer("hold", server.grpc_target)
    try:
        assert next_event(proc)["held"] == NAME
        assert pool(server).leases.stats().bytes_in_use > 0
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert wait_until(lambda: empty(server), timeout=15)  # session end, then the write's end (its timeout at most)
    finally:
        proc.kill()
    assert run("compare", server.grpc_target)["equal"]  # and the pool serves on


def test_old_descriptors_are_refused_after_a_producer_restart(server: ServiceThread) -> None:
    proc = consumer("restart", server.grpc_target)
    restarted = None
    try:
        assert next_event(proc)["transport"] == NAME
        restarted = start()
        proc.stdin.write(restarted.grpc_target + "\n")
        proc.stdin.flush()
        answer = next_event(proc)["answer"]
        assert "restarted" in answer
    finally:
        proc.kill()
        if restarted is not None:
            restarted.stop()


def test_a_slow_consumer_blocks_nobody_and_a_read_past_the_ttl_is_refused(server: ServiceThread) -> None:
    late = consumer("slow", server.grpc_target, "12")  # past the 8 s TTL
    prompt = consumer("slow", server.grpc_target, "0.2")
    try:
        assert next_event(late)["waiting"] and next_event(prompt)["waiting"]
        assert run("compare", server.grpc_target)["equal"]  # served while the slow one holds its lease
        assert next_event(prompt) == {"read": True}
        assert "freed" in next_event(late)["refused"]  # the TTL reclaimed it: refused, never wrong bytes
    finally:
        late.kill()
        prompt.kill()
    assert wait_until(lambda: empty(server), timeout=10)


def test_a_full_pool_falls_back_to_serialized(server: ServiceThread) -> None:
    registered = pool(server)
    filler = registered.leases.open_session("test filler")
    lease = registered.leases.acquire(filler, registered.config.pool_bytes, deadline=None)
    held = registered.leases.hold(lease)  # the pool stays full past the lease's TTL
    assert held is not None
    before = server.service.pipeline.delivery.fallbacks
    try:
        got = run("compare", server.grpc_target)
    finally:
        registered.leases.drop_hold(held)
        registered.leases.close_session(filler)
    assert got["equal"] and server.service.pipeline.delivery.fallbacks > before


def test_a_hostile_descriptor_is_refused(server: ServiceThread) -> None:
    got = run("hostile", server.grpc_target)
    assert "not this session's" in got["theirs"]
    assert "outside the lease" in got["beyond"]
    assert "generation" in got["stale"]
    assert got["a_ok"]  # the victim's lease was untouched and reads fine
    assert wait_until(lambda: empty(server), timeout=10)
