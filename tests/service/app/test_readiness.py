"""Readiness and drain, in process: the ports come up NOT_SERVING while the model loads, SERVING after
warm-up; on stop, NOT_SERVING first, in-flight work finishes, new work is refused, and the whole stop is
bounded by the grace period."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmproc.client import EncoderClient
from mmproc.client.retry import NO_RETRY
from mmproc.errors import ConfigError, UnavailableError
from service.app.build import build_pipeline
from service.app.cli import main
from service.app.server import serve
from tests.support.common import wait_until
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, test_settings

IMAGE = make_image_bytes(64, 64, fmt="PNG")
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def until(predicate, timeout: float = 30.0) -> None:
    assert wait_until(predicate, timeout, interval=0.01), "condition never became true"


def slow_forward_factory(delay_s: float):
    """Engines whose every forward takes `delay_s` longer (after warm-up)."""

    def factory(settings, metrics):
        pipeline = build_pipeline(settings, metrics)
        encoder, forward = pipeline.encoder, pipeline.encoder.forward

        def slow(*args, **kwargs):
            if pipeline.ready:
                time.sleep(delay_s)
            return forward(*args, **kwargs)

        encoder.forward = slow  # nn.Module.__call__ finds the instance attribute first
        return pipeline

    return factory


def test_not_serving_until_the_model_is_loaded_then_serving(capsys) -> None:
    release = threading.Event()

    def gated_factory(settings, metrics):
        assert release.wait(30)
        return build_pipeline(settings, metrics)

    server = ServiceThread(test_settings(), pipeline_factory=gated_factory, wait_ready=False).start()
    try:
        assert health(server.grpc_target) == NOT_SERVING
        ready = httpx.get(f"{server.http_url}/readyz")
        assert (ready.status_code, ready.json()["status"]) == (503, "starting")
        assert httpx.get(f"{server.http_url}/healthz").status_code == 200
        assert "mmproc_ready 0.0" in httpx.get(f"{server.http_url}/metrics").text
        with EncoderClient(server.grpc_target, retry=NO_RETRY) as client, pytest.raises(UnavailableError):
            client.encode_images([IMAGE])
        assert main(["health", "--target", server.grpc_target]) == 1

        release.set()
        until(lambda: health(server.grpc_target) == SERVING)
        assert httpx.get(f"{server.http_url}/readyz").status_code == 200
        assert main(["health", "--target", server.grpc_target]) == 0
        assert "SERVING" in capsys.readouterr().out
        with EncoderClient(server.grpc_target) as client:
            assert client.encode_images([IMAGE])[0].shape[1] == 256
    finally:
        release.set()
        server.stop()


def test_drain_reports_not_serving_first_and_finishes_in_flight_work() -> None:
    server = ServiceThread(test_settings(grace_period_s=30), pipeline_factory=slow_forward_factory(1.5)).start()
    outcome: dict[str, object] = {}

    def in_flight() -> None:
        with EncoderClient(server.grpc_target, timeout=30, retry=NO_RETRY) as client:
            outcome["result"] = client.encode_images([IMAGE])

    worker = threading.Thread(target=in_flight)
    worker.start()
    until(lambda: server.service.pipeline.inflight == 1)
    server.begin_stop()
    until(lambda: health(server.grpc_target) == NOT_SERVING, timeout=5)
    ready = httpx.get(f"{server.http_url}/readyz")
    assert (ready.status_code, ready.json()["status"]) == (503, "draining")
    with EncoderClient(server.grpc_target, retry=NO_RETRY) as client, pytest.raises(UnavailableError):
        client.encode_images([IMAGE])
    worker.join(30)
    server.stop()
    assert outcome["result"][0].shape[1] == 256, "the in-flight request was lost"


def test_stop_is_bounded_by_the_grace_period() -> None:
    grace = 0.5
    server = ServiceThread(test_settings(grace_period_s=grace), pipeline_factory=slow_forward_factory(5.0)).start()
    worker = threading.Thread(target=lambda: _swallow(server.grpc_target), daemon=True)
    worker.start()
    until(lambda: server.service.pipeline.inflight == 1)
    started = time.monotonic()
    server.stop(timeout=10)
    assert time.monotonic() - started < grace + 2.5  # the 5 s forward is not waited for


def _swallow(target: str) -> None:
    with EncoderClient(target, timeout=30, retry=NO_RETRY) as client, contextlib.suppress(Exception):
        client.encode_images([IMAGE])  # cut off by the shutdown: expected


def test_a_model_that_fails_to_load_stops_the_server_with_its_error() -> None:
    settings = test_settings(model="no-such-preset")
    with pytest.raises(ConfigError, match="no-such-preset"):
        asyncio.run(serve(settings))
