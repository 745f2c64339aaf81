"""`mmproc serve` as a process: starts on the embedded default, answers, drains on SIGTERM and exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmproc.client import EncoderClient
from mmproc.errors import UnavailableError
from tests.support.common import free_port
from tests.support.media_samples import make_image_bytes


def wait_serving(target: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{target} never became SERVING")


@pytest.fixture
def server_process(request):
    grpc_port = http_port = free_port()
    while http_port == grpc_port:  # a port just released can come back at once: two listeners on one port
        http_port = free_port()
    delay = getattr(request, "param", "0")
    env = {**os.environ, "MMPROC_GRACE_PERIOD_S": "20", "MMPROC_PREPROCESS_WORKERS": "2", "MMPROC_DRAIN_DELAY_S": delay}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.app.cli", "serve", "--grpc-address", f"127.0.0.1:{grpc_port}",
         "--http-address", f"127.0.0.1:{http_port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    target = f"127.0.0.1:{grpc_port}"
    proc.http_url = f"http://127.0.0.1:{http_port}"
    try:
        wait_serving(target)
        yield proc, target
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_sigterm_finishes_in_flight_work_refuses_new_work_and_exits_zero(server_process) -> None:
    proc, target = server_process
    images = [make_image_bytes(1024, 1024, fmt="PNG", seed=i) for i in range(6)]  # ~0.5 s of CPU work
    outcome: dict[str, object] = {}

    def in_flight() -> None:
        with EncoderClient(target, timeout=60) as client:
            outcome["result"] = client.encode_images(images)

    worker = threading.Thread(target=in_flight)
    worker.start()
    wait_admitted(proc.http_url)  # really in flight (a fixed sleep raced the upload on a loaded machine)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    with EncoderClient(target, timeout=10) as client, pytest.raises(UnavailableError):
        client.encode_images(images[:1])
    worker.join(60)
    assert proc.wait(60) == 0
    output = proc.stdout.read()
    assert "drained" in output, output
    result = outcome.get("result")
    assert result is not None and len(result) == 6, "the in-flight request was lost"
    assert all(t.shape == (1089, 256) for t in result)


def test_the_serving_process_freezes_start_up_objects_and_reports_gc_pauses(server_process) -> None:
    """A full pass of the garbage collector stops every thread: the server freezes what start-up made out of its
    scans before serving, and exports every pause (docs/deploy.md, "Metrics")."""
    import httpx

    proc, _ = server_process
    metrics = httpx.get(f"{proc.http_url}/metrics", timeout=5).text
    full_passes = [
        line for line in metrics.splitlines() if line.startswith('mmproc_gc_pause_seconds_count{generation="2"}')
    ]
    assert full_passes and float(full_passes[0].split()[1]) >= 1, full_passes  # the one before the freeze at least
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    frozen = re.search(r"garbage collector: (\d+) start-up objects frozen", proc.stdout.read())
    assert frozen and int(frozen.group(1)) > 10_000, "start-up objects were not frozen before serving"


def wait_admitted(http_url: str, timeout: float = 30) -> None:
    """Until the server's mmproc_inflight_requests gauge shows a request admitted."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in httpx.get(f"{http_url}/metrics", timeout=5).text.splitlines():
            if line.startswith("mmproc_inflight_requests ") and float(line.split()[1]) > 0:
                return
        time.sleep(0.02)
    raise TimeoutError("the request never reached the server")


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (decode workers, the forkserver, the resource tracker ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def test_sigterm_under_load_leaves_no_process_or_file_behind(server_process) -> None:
    """Decode workers, the forkserver and the tmpfs transfer directory all go with the server."""
    proc, target = server_process
    helpers = descendants(proc.pid)
    assert helpers, "process isolation (the default) runs decode workers"
    images = [make_image_bytes(512, 512, fmt="JPEG", seed=i) for i in range(4)]
    results: list[object] = []

    def caller() -> None:
        with EncoderClient(target, timeout=30) as client:
            for _ in range(20):
                try:
                    results.append(len(client.encode_images(images)))
                except UnavailableError:
                    results.append("unavailable")
                    return

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for thread in callers:
        thread.start()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    for thread in callers:
        thread.join(60)
    assert proc.wait(60) == 0
    assert results and set(results) <= {4, "unavailable"}, results  # answers were whole or a clean refusal
    deadline = time.monotonic() + 10
    while (alive := {pid for pid in helpers if os.path.exists(f"/proc/{pid}")}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"helper processes outlived the server: {alive}"
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"mmproc-decode-{proc.pid}-")]


@pytest.mark.parametrize("server_process", ["2"], indirect=True)
def test_drain_stays_reachable_answering_503_before_closing(server_process) -> None:
    # What a load balancer polling readiness sees after SIGTERM: 503s for the drain delay, not refused connections.
    import httpx

    proc, _ = server_process
    assert httpx.get(f"{proc.http_url}/readyz", timeout=5).status_code == 200
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    statuses: list[int] = []
    while time.monotonic() - sent < 1.5:
        statuses.append(httpx.get(f"{proc.http_url}/readyz", timeout=5).status_code)
        time.sleep(0.1)
    assert statuses and set(statuses[2:]) == {503}, statuses  # reachable, and saying "not ready"
    assert proc.wait(30) == 0
    assert time.monotonic() - sent >= 1.9  # closed only after the delay
