"""`mmproc serve` as a process: starts on the embedded default, answers, drains on SIGTERM and exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmproc.client import EncoderClient
from mmproc.errors import UnavailableError
from tests.media_samples import make_image_bytes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
def server_process():
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, "MMPROC_GRACE_PERIOD_S": "20", "MMPROC_PREPROCESS_WORKERS": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--grpc-address", f"127.0.0.1:{grpc_port}",
         "--http-address", f"127.0.0.1:{http_port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    target = f"127.0.0.1:{grpc_port}"
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
    time.sleep(0.3)
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
