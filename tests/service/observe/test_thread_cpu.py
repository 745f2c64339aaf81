"""`mmproc_cpu_seconds_total{role}`: every role is there, the roles doing the work grow under load, a counter never
goes down when a thread it counted exits, and without /proc the family is simply absent."""

from __future__ import annotations

import threading
import time

import pytest

from mmproc import thread_roles
from mmproc.client import EncoderClient
from service.observe import thread_cpu
from service.observe.thread_cpu import ROLES, CpuByRole
from tests.service.observe.test_metrics import scrape, value
from tests.support.media_samples import make_image_bytes

pytestmark = pytest.mark.skipif(not thread_roles.task_ids(), reason="Linux /proc only")


def cpu_seconds(server) -> dict[str, float]:
    samples, _ = scrape(server)
    return {role: value(samples, "mmproc_cpu_seconds_total", role=role) for role in ROLES}


def test_every_role_is_exported_and_the_busy_ones_grow_under_load(tiny_server) -> None:
    before = cpu_seconds(tiny_server)
    assert tiny_server.service.pipeline.decode_pool.worker_pids()  # the tests' server decodes in worker processes
    images = [make_image_bytes(160, 128, fmt="JPEG", seed=i) for i in range(4)]
    busy = ("event_loop", "grpc_loop", "runner", "decode_workers")  # gRPC on a loop of its own: the default
    # CPU time moves in clock ticks: send load until each busy role has moved, within a bound (no timing asserted).
    with EncoderClient(tiny_server.grpc_target, timeout=60, cache=False) as client:
        for _ in range(200):
            for _ in range(5):
                client.encode_images(images)
            after = cpu_seconds(tiny_server)
            if all(after[role] > before[role] for role in busy):
                break
    samples, families = scrape(tiny_server)
    assert "mmproc_cpu_seconds" in families
    assert {dict(labels)["role"] for name, labels in samples if name == "mmproc_cpu_seconds_total"} == set(ROLES)
    for role in busy:
        assert after[role] > before[role], role
    assert all(after[role] >= before[role] for role in ROLES)
    assert after["gpu_decode"] == 0.0  # no GPU decoder on a CPU server


def test_a_counter_keeps_what_an_exited_thread_spent() -> None:
    collector = CpuByRole()
    seen = threading.Event()

    def work() -> None:
        thread_roles.register("gpu_decode")  # a role no thread of a CPU test server holds
        started = time.thread_time()
        while time.thread_time() - started < 0.1:  # ten clock ticks of CPU
            pass
        seen.wait(30)

    thread = threading.Thread(target=work)
    thread.start()
    try:
        for _ in range(300):  # until the registry holds it and /proc shows its CPU
            while_alive = collector.ticks()["gpu_decode"]
            if while_alive > 0:
                break
            time.sleep(0.01)
    finally:
        seen.set()
        thread.join(30)
    assert while_alive > 0
    thread_roles.register_tids("gpu_decode", [])  # the registry drops the exited thread
    assert thread.native_id not in thread_roles.registered()
    assert collector.ticks()["gpu_decode"] >= while_alive


def test_without_proc_the_family_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(thread_cpu.thread_roles, "task_stat", lambda path: None)
    assert list(CpuByRole().collect()) == []
