"""Faults against a real server: a crashing decoder, cancelled calls, tiny deadlines, a full queue.

Every fault must end in a typed status (never INTERNAL/UNKNOWN) and leave nothing behind: in-flight count 0,
runner queue empty, decode pool serving.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.errors import DeadlineExceededError, InvalidMediaError, ResourceExhaustedError
from mmproc.models import load_encoder
from mmproc.runner import Runner, RunnerConfig
from mmproc.types import PreprocessedImage
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from tests.support.common import wait_until
from tests.support.decode_faults import CRASH
from tests.support.media_samples import encode_image, make_image_bytes, random_image
from tests.support.server import ServiceThread, misbehaving_pipeline, serving, settle, test_settings, wait_inflight

SMALL = make_image_bytes(64, 48, fmt="PNG", seed=1)
# ~5.5k patches each (the forward is the slow part), but small uploads: smooth JPEGs of ~100 KB
HEAVY = [encode_image(random_image(64, 64, seed=i).resize((1024, 1024)), "JPEG") for i in range(4)]


@pytest.fixture(scope="module")
def server() -> Iterator[ServiceThread]:
    # cache_mb=0: every request runs the pipeline (these tests load and break it; repeats would be cache hits)
    settings = test_settings(max_inflight_requests=3, max_queued_images=8, decode_timeout_s=5, cache_mb=0)
    with serving(settings, pipeline_factory=misbehaving_pipeline) as server:
        yield server


def channel(server: ServiceThread) -> grpc.Channel:
    return grpc.insecure_channel(server.grpc_target, options=[("grpc.max_receive_message_length", 64 << 20)])


def request(images: list[bytes], request_id: str = "") -> pb.EncodeImagesRequest:
    return pb.EncodeImagesRequest(images=images, request_id=request_id, transport=pb.TRANSPORT_SERIALIZED)


def test_a_decoder_crash_is_that_requests_400_and_the_next_request_is_fine(server: ServiceThread) -> None:
    pool = server.service.pipeline.decode_pool
    crashes, pids = pool.crashes, set(pool.worker_pids())
    with EncoderClient(server.grpc_target) as client:
        with pytest.raises(InvalidMediaError) as info:
            client.encode_images([SMALL, CRASH, SMALL])
        assert (info.value.index, info.value.reason) == (1, "undecodable")
        (embedding,) = client.encode_images([SMALL])
    assert embedding.shape[1] == 256
    assert pool.crashes == crashes + 1
    assert not pids & set(pool.worker_pids()), "the crashed pool's workers were replaced"
    settle(server)
    metrics = httpx.get(f"{server.http_url}/metrics", timeout=10).text  # the operator sees the deaths counted
    assert f'mmproc_decode_worker_crashes_total{{pool="shared"}} {float(pool.crashes)}' in metrics
    assert f'mmproc_decode_worker_crashes_total{{pool="quarantine"}} {float(pool.quarantine_crashes)}' in metrics
    assert pool.quarantine_crashes >= 1  # the crashing image, retried alone, killed its lone worker too
    assert f"mmproc_decode_quarantined_images_total {float(pool.quarantined)}" in metrics


def test_cancelled_call_frees_its_work(server: ServiceThread) -> None:
    pipeline = server.service.pipeline
    with channel(server) as chan:
        stub = pb_grpc.EncoderStub(chan)
        call = stub.EncodeImages.future(request(HEAVY, "cancel-me"), timeout=60)
        wait_inflight(server, interval=0.002)
        assert pipeline.inflight == 1, "the request never arrived"
        time.sleep(0.1)  # let it reach decoding or the runner queue
        call.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            call.result()
    settle(server, timeout=5)
    with EncoderClient(server.grpc_target) as client:  # and the server still serves
        assert len(client.encode_images([SMALL])) == 1


def test_an_http_client_that_disconnects_has_its_work_cancelled(server: ServiceThread) -> None:
    import base64
    import json
    import socket

    def cancelled() -> float:
        text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
        line = 'mmproc_requests_total{code="CANCELLED",front_end="http",method="/v1/encode"} '
        return float(next((row.removeprefix(line) for row in text.splitlines() if row.startswith(line)), 0))

    before = cancelled()
    body = json.dumps({"images": [base64.b64encode(image).decode() for image in HEAVY]}).encode()
    host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
    head = f"POST /v1/encode HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + body)
        wait_inflight(server, interval=0.002)
        time.sleep(0.1)  # let it reach decoding or the runner queue
    settle(server, timeout=5)  # the socket closed: its work is dropped and everything given back
    assert cancelled() == before + 1  # counted as the client saw it, not OK for a reply nobody read
    with EncoderClient(server.grpc_target) as client:  # and the server still serves
        assert len(client.encode_images([SMALL])) == 1


class HeldModel:
    """The tiny encoder behind a gate: the runner's worker blocks in forward until the gate opens."""

    def __init__(self) -> None:
        self.encoder = load_encoder(None, preset="tiny")
        self.device, self.dtype, self.output_dim = self.encoder.device, self.encoder.dtype, self.encoder.output_dim
        self.gate = threading.Event()

    def __call__(self, batch, out) -> None:
        self.gate.wait(10)
        self.encoder(batch, out=out)


def test_runner_drops_a_cancelled_requests_queued_images_at_once() -> None:
    held = HeldModel()
    gate = held.gate
    runner = Runner(held, RunnerConfig(max_batch_images=1, max_wait_ms=0), max_patches_per_image=64)
    image = PreprocessedImage(torch.zeros(4, 3, 14, 14), (2, 2), 1)
    runner.start()
    try:
        first = runner.submit([image])
        wait_until(lambda: not runner.queued_images, 5, interval=0.001)  # the worker took it, waits at the gate
        second = runner.submit([image] * 5)
        assert runner.queued_images == 5
        assert second.cancel()
        assert runner.queued_images == 0  # gone before the worker ever looks at them
        gate.set()
        assert len(first.result(10)) == 1
    finally:
        gate.set()
        runner.stop(10)


def test_a_tiny_deadline_is_deadline_exceeded(server: ServiceThread) -> None:
    with channel(server) as chan:
        stub = pb_grpc.EncoderStub(chan)
        for timeout in (0.001, 0.05):
            with pytest.raises(grpc.RpcError) as info:
                stub.EncodeImages(request(HEAVY), timeout=timeout)
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    with EncoderClient(server.grpc_target, timeout=0.001) as client, pytest.raises(DeadlineExceededError):
        client.encode_images(HEAVY)
    settle(server)


def test_overload_is_resource_exhausted_quickly(server: ServiceThread) -> None:
    """3 requests may be in flight and 8 images queued: a burst of 12 four-image requests must see
    RESOURCE_EXHAUSTED, fast, and everything admitted must succeed."""
    outcomes: list[tuple[str, float]] = []

    def one(stub: pb_grpc.EncoderStub) -> tuple[str, float]:
        started = time.monotonic()
        try:
            reply = stub.EncodeImages(request(HEAVY), timeout=60)
            assert len(reply.embeddings) == 4
            return "ok", time.monotonic() - started
        except grpc.RpcError as err:
            return err.code().name, time.monotonic() - started

    with channel(server) as chan, concurrent.futures.ThreadPoolExecutor(12) as pool:
        stub = pb_grpc.EncoderStub(chan)
        outcomes = list(pool.map(lambda _: one(stub), range(12)))
    codes = {code for code, _ in outcomes}
    assert codes <= {"ok", "RESOURCE_EXHAUSTED"}, outcomes
    assert "ok" in codes and "RESOURCE_EXHAUSTED" in codes, outcomes
    refused = [seconds for code, seconds in outcomes if code == "RESOURCE_EXHAUSTED"]
    served = [seconds for code, seconds in outcomes if code == "ok"]
    # Refused at the door (in-flight limit) or before decoding (queue reservation), never after waiting for
    # work: every refusal is back before the first admitted request is done.
    assert max(refused) < min(served), outcomes
    settle(server)


def test_patches_in_flight_are_bounded_and_returned() -> None:
    # Two heavy images are ~11k patches: with a 16k budget, a second heavy request is refused at once while the
    # first is in flight (RESOURCE_EXHAUSTED, retryable, before any decoding); a small one still fits; once the
    # first is done, the budget is whole again.
    settings = test_settings(max_inflight_patches=16_000, max_patches_per_request=16_000, cache_mb=0)
    server = ServiceThread(settings).start()
    pipeline = server.service.pipeline
    try:
        with EncoderClient(server.grpc_target) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.encode_images, HEAVY[:2])
            wait_inflight(server)
            with pytest.raises(ResourceExhaustedError, match="patches in flight") as refused:
                client.encode_images(HEAVY[2:])
            assert refused.value.cause == "inflight_patches"  # the limit that refused it, as the metric's label
            assert len(client.encode_images([SMALL])) == 1
            assert len(first.result(60)) == 2
            assert pipeline.idle
            assert len(client.encode_images(HEAVY[2:])) == 2
    finally:
        server.stop()
