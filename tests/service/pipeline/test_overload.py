"""Overload without collapse: early refusals with a retry-after, work of expired requests dropped, truthful codes
(never UNKNOWN, no ERROR lines), and a service that serves again once the load stops.

The loopback run is a short, bounded version of `mmproc bench serve --mode open` (mmproc/bench/serve_open.py)
against the in-process tiny server; its figures (goodput, latencies) are the benchmark's business, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import logging
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import grpc
import httpx
import pytest

from mmproc.bench import open_load as bench
from mmproc.bench.images import ImageSpec, generate_requests
from mmproc.bench.open_report import Scraper
from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.errors import ResourceExhaustedError
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.frontends.error_mapping import map_error, to_grpc_status
from service.pipeline.overload import BatchCost, OverloadConfig, OverloadGuard
from service.pipeline.wait_clock import WaitClock
from tests.support.common import wait_until
from tests.support.decode_faults import SLOW
from tests.support.media_samples import encode_image, random_image
from tests.support.server import ServiceThread, misbehaving_pipeline, serving, test_settings

HEAVY = encode_image(random_image(64, 64, seed=3).resize((1024, 1024)), "JPEG")  # ~5.5k patches
DOOR = OverloadConfig(max_queue_delay_s=1.0, interval_s=0.1, max_pending_bytes=1 << 30, bytes_per_patch=10)


def assert_door_open(guard: OverloadGuard, patches: int, now: float = 100.0, steps: int = 10) -> None:
    """Requests of `patches` with a 60 s deadline, one every 50 ms (past the door's interval): all let in."""
    for step in range(steps):
        guard.release(guard.admit(patches, 1, deadline=now + 60, now=now + 0.05 * step))


def test_guard_refuses_by_time_to_finish_and_by_bytes_and_returns_both_on_release() -> None:
    config = OverloadConfig(max_queue_delay_s=1.0, interval_s=0.1, max_pending_bytes=11_500, bytes_per_patch=10)
    waited = [0.0]  # the encoder queue's sojourn time, as the runner would report it
    guard = OverloadGuard(config, queue_wait=lambda: waited[0])
    now = 100.0
    first = guard.admit(400, 1, deadline=None, now=now)  # idle: always admitted
    guard.decoded(first, 400, 4000)  # decoded: 400 patches of encoder work from now on
    guard.forward.observe(1.0, 1000)  # 1 ms a patch: 0.4 s of work ahead now
    with pytest.raises(ResourceExhaustedError) as late:
        guard.admit(100, 1, deadline=now + 0.3, now=now)  # 0.5 s to finish, 0.3 s left
    assert late.value.cause == "deadline" and late.value.retry_after_s == pytest.approx(0.2)
    second = guard.admit(700, 1, deadline=now + 60, now=now)
    guard.decoded(second, 700, 7000)
    waited[0] = 1.1  # the queue's oldest image has waited past the 1 s target
    burst = guard.admit(10, 1, deadline=now + 60, now=now)  # a burst is let in for the interval
    with pytest.raises(ResourceExhaustedError) as slow:
        guard.admit(10, 1, deadline=now + 60, now=now + 0.2)  # still above the target: refused, whatever its deadline
    # retry-after: what is ahead past the target, 1.1 s decoded + the burst's 10 announced patches still decoding
    assert slow.value.cause == "queue_delay" and slow.value.retry_after_s == pytest.approx(0.11)
    with pytest.raises(ResourceExhaustedError) as full:
        guard.admit(100, 1, deadline=None, now=now)  # (400 + 700 + 100) patches x 10 B > 11 500 B
    assert full.value.cause == "pending_bytes"
    with pytest.raises(ResourceExhaustedError) as found:
        guard.decoded(burst, 60, 600)  # its header said less than decoding found: over the bound once decoded
    assert found.value.cause == "pending_bytes"
    assert guard.pending_bytes == 4000 + 7000
    for ticket in (first, second, burst):
        guard.release(ticket)
    assert guard.pending_bytes == 0 and guard.ahead_s() == 0
    guard.admit(900, 1, deadline=now + 60, now=now)


def test_requests_still_decoding_count_as_work_ahead_by_what_their_headers_announce() -> None:
    guard = OverloadGuard(OverloadConfig(max_pending_bytes=1 << 30, bytes_per_patch=10))
    guard.forward.observe(1.0, 1000)  # 1 ms a patch
    now = 100.0
    decoding = guard.admit(600, 2, deadline=now + 60, now=now)  # its headers announce 600 patches
    assert guard.ahead_s() == pytest.approx(0.6)
    with pytest.raises(ResourceExhaustedError) as late:
        guard.admit(100, 1, deadline=now + 0.5, now=now)  # 0.6 s decoding ahead + 0.1 s own > 0.5 s left
    assert late.value.cause == "deadline"
    guard.decoded(decoding, 500, 5000)  # decoding found 500: that is the work now
    assert guard.ahead_s() == pytest.approx(0.5)
    guard.release(decoding)
    liar = guard.admit(5000, 1, deadline=None, now=now)
    guard.release(liar)  # refused by its decode: its announced share goes at once
    assert guard.ahead_s() == 0


def test_a_fixed_cost_over_the_batch_budget_is_charged_per_image_not_per_patch() -> None:
    # A loaded CPU: every forward takes 0.4 s whatever its size, past the 0.25 s a batch may take (a quarter of the
    # 1 s target), so the patch budget collapses to one. The runner still batches whole images; so must the
    # estimate (it once charged 0.4 s a patch: "about 1046206 ms of work ahead", and refused every request).
    guard = OverloadGuard(OverloadConfig(max_queue_delay_s=1.0, max_pending_bytes=1 << 30, bytes_per_patch=10))
    for patches in (1000, 3000) * 5:
        guard.forward.observe(0.4 + 1e-5 * patches, patches)
    assert guard.forward.fixed_s > 0.25 and guard.batch_patches() == 1
    now = 100.0
    tickets = [guard.admit(1000, 1, deadline=None, now=now) for _ in range(3)]
    assert guard.ahead_s() == pytest.approx(3 * 0.4 + 3000 * 1e-5, rel=0.01)  # three images: three forwards at most
    guard.admit(1000, 1, deadline=now + 2.0, now=now)  # 1.6 s ahead and own: admitted, with 2 s left
    for ticket in tickets:
        guard.release(ticket)


def test_a_batch_takes_its_share_of_the_target_at_the_measured_rate() -> None:
    # 1 ms fixed and 0.1 ms a patch: a quarter of 1 s is 2490 patches, an eighth (the CPU's share) 1240.
    for share, patches in ((0.25, 2490), (0.125, 1240)):
        config = OverloadConfig(max_queue_delay_s=1.0, max_pending_bytes=1 << 30, bytes_per_patch=10, batch_share=share)
        guard = OverloadGuard(config)
        for size in (500, 1500) * 5:
            guard.forward.observe(0.001 + 1e-4 * size, size)
        assert guard.batch_patches() == pytest.approx(patches, abs=2)


def test_the_work_ahead_counts_the_forwards_the_runner_will_run_not_the_budget_alone() -> None:
    # A fast device: 50 ms fixed and 1 us a patch make a budget of 200k patches, but the runner packs at most 1000
    # into one forward. Five images of 1000 patches are five forwards, each with its fixed cost.
    config = OverloadConfig(
        max_queue_delay_s=1.0, max_pending_bytes=1 << 30, bytes_per_patch=10, max_batch_patches=1000
    )
    guard = OverloadGuard(config)
    for patches in (500, 1000) * 5:
        guard.forward.observe(0.05 + 1e-6 * patches, patches)
    assert guard.batch_patches() == 1000
    now = 100.0
    tickets = [guard.admit(1000, 1, deadline=None, now=now) for _ in range(5)]
    assert guard.ahead_s() == pytest.approx(5 * 0.05 + 5000 * 1e-6, rel=0.01)
    # 0.255 s ahead and 0.051 s its own pass the 0.28 s left (counted as one forward ahead: 0.106 s, admitted)
    with pytest.raises(ResourceExhaustedError) as late:
        guard.admit(1000, 1, deadline=now + 0.28, now=now)
    assert late.value.cause == "deadline"
    for ticket in tickets:
        guard.release(ticket)


def test_refusals_by_a_fixed_bound_say_when_a_slot_frees() -> None:
    from contextlib import ExitStack

    from mmproc.preprocess import PreprocessConfig
    from service.pipeline.admission import Admission
    from service.pipeline.request_limits import InflightLimits, RequestLimits

    guard = OverloadGuard(OverloadConfig(max_pending_bytes=1 << 30, bytes_per_patch=10))
    guard.forward.observe(1.0, 1000)  # 1 ms a patch
    limits = InflightLimits(max_requests=4, max_patches=1000)
    admission = Admission(
        RequestLimits(), limits, PreprocessConfig.kimi_k25(), guard, max_queued_images=64, queued_images=lambda: 0
    )
    admission.ready = True
    with ExitStack() as held:
        for _ in range(4):  # four requests of 200 announced patches: 0.8 s of work ahead
            held.enter_context(admission.admit(200, 1, None, reserve=0))
        with pytest.raises(ResourceExhaustedError) as by_count, admission.admit(10, 1, None, reserve=0):
            pass
        # one of the four must finish: a quarter of the work ahead, not the 1 s default
        assert by_count.value.cause == "inflight_requests" and by_count.value.retry_after_s == pytest.approx(0.2)
    with ExitStack() as held:
        held.enter_context(admission.admit(800, 1, None, reserve=0))
        with pytest.raises(ResourceExhaustedError) as by_patches, admission.admit(400, 1, None, reserve=0):
            pass
        # 200 patches over the bound: a quarter of the 800 in flight must drain first
        assert by_patches.value.cause == "inflight_patches" and by_patches.value.retry_after_s == pytest.approx(0.2)


def test_requests_that_take_longer_than_modelled_lengthen_later_estimates() -> None:
    guard = OverloadGuard(OverloadConfig(max_pending_bytes=1 << 30, bytes_per_patch=10))
    guard.forward.observe(1.0, 1000)  # the model: 1 ms a patch, forwards only
    now = 100.0
    busy = guard.admit(200, 1, deadline=None, now=now)  # 0.2 s of work ahead of anyone arriving now
    guard.release(guard.admit(100, 1, deadline=now + 0.5, now=now))  # 0.2 + 0.1 s modelled: fits 0.5 s
    for _ in range(100):  # but each takes 0.5 s more than modelled (decode, delivery, the event loop)
        ticket = guard.admit(100, 1, deadline=now + 60, now=now)
        guard.finished(ticket, now=now + ticket.modelled_s + 0.5)
        guard.release(ticket)
    assert guard.overrun.seconds == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ResourceExhaustedError) as late:
        guard.admit(100, 1, deadline=now + 0.5, now=now)  # refused now, before any work: it would expire
    assert late.value.cause == "deadline" and late.value.retry_after_s == pytest.approx(0.3, abs=0.01)
    assert "497 ms measured beyond the model" in str(late.value)
    guard.release(busy)

    quick = OverloadGuard(OverloadConfig())
    quick.forward.observe(1.0, 1000)
    for _ in range(100):  # faster than modelled: the estimate never drops below the model
        quick.finished(quick.admit(100, 1, deadline=None, now=now), now=now)
    assert quick.overrun.seconds < 0 and quick.overrun.correction_s() == 0
    outlier = OverloadGuard(OverloadConfig())
    outlier.finished(outlier.admit(100, 1, deadline=None, now=now), now=now + 30)  # a first compile, say
    assert 0 < outlier.overrun.seconds <= 0.05  # one sample moves it by at most alpha x 1 s


def test_the_door_learns_from_requests_that_finish_or_expire_not_from_failures(monkeypatch) -> None:
    from mmproc.errors import DeadlineExceededError, InvalidMediaError, Reason
    from mmproc.preprocess import PreprocessConfig
    from service.pipeline.admission import Admission
    from service.pipeline.request_limits import InflightLimits, RequestLimits

    guard = OverloadGuard(OverloadConfig())
    admission = Admission(
        RequestLimits(), InflightLimits(), PreprocessConfig.kimi_k25(), guard, max_queued_images=64,
        queued_images=lambda: 0,
    )  # fmt: skip
    admission.ready = True
    learned: list[str] = []
    now_running = [""]
    monkeypatch.setattr(guard, "finished", lambda ticket, now=None: learned.append(now_running[0]))
    for outcome, error, expire in [
        ("finished", None, False),
        ("invalid media", InvalidMediaError("bad", reason=Reason.UNDECODABLE), False),
        ("expired in the pipeline", DeadlineExceededError("late"), True),
        ("expired, seen as a cancellation", asyncio.CancelledError(), True),
        ("cancelled in time", asyncio.CancelledError(), False),
    ]:
        now_running[0] = outcome
        deadline = time.monotonic() + (0.02 if expire else 60)
        with (
            pytest.raises(type(error)) if error else contextlib.nullcontext(),
            admission.admit(100, 1, deadline, reserve=0),
        ):
            time.sleep(0.03 if expire else 0)
            if error:
                raise error
    assert learned == ["finished", "expired in the pipeline", "expired, seen as a cancellation"]
    assert admission.inflight == 0 and guard.ahead_s() == 0


def test_a_wait_clock_reports_its_oldest_waiter() -> None:
    clock = WaitClock()
    assert clock.oldest_s() == 0
    first = clock.enter()
    time.sleep(0.05)
    second = clock.enter()
    assert clock.oldest_s() >= 0.05
    clock.leave(first)
    assert clock.oldest_s() < 0.05
    clock.leave(second)
    clock.leave(second)  # twice: harmless
    assert clock.oldest_s() == 0


def stand_a_queue(
    pool: concurrent.futures.ThreadPoolExecutor, client: EncoderClient, slow: list[bytes]
) -> list[concurrent.futures.Future]:
    """Twelve images that take the one decode worker 0.2 s each: ten at once, then two 0.15 s apart (CoDel lets
    the first request over the target in as a burst, not the next), so that a 300 ms target is stood above for
    longer than its interval. Returns the first ten calls."""
    queued = [pool.submit(client.encode_images, [image]) for image in slow[:10]]
    time.sleep(0.5)
    for image in slow[10:12]:
        pool.submit(client.encode_images, [image])
        time.sleep(0.15)
    return queued


def test_a_queue_in_front_of_the_decoders_is_refused_like_one_in_front_of_the_encoder() -> None:
    # One worker, 0.2 s an image: ten requests sent at once wait up to 2 s for the decoder while the encoder's
    # own queue stays empty. With a 300 ms target, new requests are refused for the delay (whatever their
    # deadline) once the decoders' waiting room has stood above it, and the service recovers when it drains.
    settings = test_settings(preprocess_workers=1, max_queue_delay_ms=300, cache_mb=0)
    slow = SLOW + encode_image(random_image(64, 64, seed=5), "PNG")
    with (
        serving(settings, pipeline_factory=misbehaving_pipeline) as server,
        EncoderClient(server.grpc_target) as client,
    ):
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            queued = stand_a_queue(pool, client, [slow] * 12)
            assert server.service.pipeline.queued_images == 0  # nothing waits for the encoder itself
            with pytest.raises(ResourceExhaustedError, match="for the decoders and the encoder") as refused:
                client.encode_images([slow])
            # the Python client hands on the server's hints: why, and when to come back
            assert refused.value.cause == "queue_delay" and refused.value.retry_after_s > 0
            # HTTP is refused from its headers: the body is dropped unparsed (parsed, this one would be a 400),
            # counted as the route's request, and the connection is kept
            counted = 'mmproc_requests_total{code="RESOURCE_EXHAUSTED",front_end="http",method="/v1/encode"}'
            before = scrape(server).get(counted, 0)
            with httpx.Client(base_url=server.http_url) as http:
                answer = http.post("/v1/encode", content=b"{not json", headers={"content-type": "application/json"})
            assert answer.status_code == 429 and answer.json()["error"]["reason"] == "queue_delay", answer.text
            assert float(answer.headers["retry-after"]) > 0 and answer.headers.get("connection") != "close"
            assert scrape(server)[counted] == before + 1
            # a client that waits for 100 Continue before its body is refused without sending it
            with socket.create_connection(("127.0.0.1", server.service.http_port), timeout=5) as raw:
                raw.sendall(b"POST /v1/encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n")  # fmt: skip
                assert raw.recv(1 << 16).startswith(b"HTTP/1.1 429 ")
            outcomes = Counter(type(f.exception(30)).__name__ for f in queued)
        assert outcomes["NoneType"] >= 3, outcomes  # what was admitted before the room filled up is served
        assert set(outcomes) <= {"NoneType", "ResourceExhaustedError"}, outcomes
        wait_until(lambda: server.service.pipeline.idle, 10)
        assert len(client.encode_images([slow])) == 1


def test_batch_requests_are_refused_while_interactive_ones_still_come_in(caplog) -> None:
    # Twelve images for the one decode worker (0.2 s each), sent at once: 1.3 s later the last ones have waited
    # 1.3 s for it, past half of a 2 s target and below it. A batch request is refused at once, from the Python
    # clients and over HTTP alike; an interactive one sent then is taken. An unknown priority is a bad request.
    settings = test_settings(preprocess_workers=1, max_queue_delay_ms=2000, cache_mb=0)
    slow = SLOW + encode_image(random_image(64, 64, seed=6), "PNG")
    with (
        serving(settings, pipeline_factory=misbehaving_pipeline) as server,
        EncoderClient(server.grpc_target) as client,
        EncoderClient(server.grpc_target, priority="batch") as batch_client,
    ):
        with concurrent.futures.ThreadPoolExecutor(13) as pool:
            queued = [pool.submit(client.encode_images, [slow]) for _ in range(12)]
            time.sleep(1.3)
            with pytest.raises(ResourceExhaustedError, match="batch requests are taken below 1000 ms") as shed:
                batch_client.encode_images([slow])
            assert shed.value.cause == "batch_shed" and shed.value.retry_after_s > 0
            interactive = pool.submit(client.encode_images, [slow])  # the default priority: taken

            async def from_asyncio() -> None:
                async with AsyncEncoderClient(server.grpc_target, priority="batch") as aio:
                    await aio.encode_images([slow])

            with pytest.raises(ResourceExhaustedError, match="batch requests"):
                asyncio.run(from_asyncio())
            with httpx.Client(base_url=server.http_url) as http:
                refused = http.post("/v1/encode", json={"images": []}, headers={"x-mmproc-priority": "batch"})
                unknown = http.post("/v1/encode", json={"images": []}, headers={"x-mmproc-priority": "urgent"})
            assert refused.status_code == 429 and refused.json()["error"]["reason"] == "batch_shed", refused.text
            assert unknown.status_code == 400, unknown.text
            with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as bad:
                request = pb.EncodeImagesRequest(images=[slow])
                pb_grpc.EncoderStub(channel).EncodeImages(request, metadata=[("x-mmproc-priority", "urgent")])
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            for call in [*queued, interactive]:
                assert call.result(timeout=30)
        assert scrape(server)['mmproc_rejections_total{reason="batch_shed"}'] == 3
        assert batch_client.encode_images([slow])  # drained: batch work is taken again
        with caplog.at_level(logging.INFO, logger="mmproc.access"):  # and its access line says what it was
            taken = httpx.post(f"{server.http_url}/v1/encode", json={"images": [base64.b64encode(slow).decode()]},
                               headers={"x-mmproc-priority": "batch"}, timeout=30)  # fmt: skip
        assert taken.status_code == 200, taken.text
        assert any("/v1/encode" in r.getMessage() and "priority=batch" in r.getMessage() for r in caplog.records)


def test_a_client_priority_is_one_of_two_names() -> None:
    from mmproc.client.call_headers import call_headers

    assert call_headers() == () and call_headers(priority="interactive") == ()  # the default goes unsaid
    assert call_headers("t", "batch") == (("authorization", "Bearer t"), ("x-mmproc-priority", "batch"))
    with pytest.raises(ValueError, match="priority"):
        EncoderClient("127.0.0.1:1", priority="low")


def test_while_the_queue_stands_even_a_cached_image_is_refused_before_any_work() -> None:
    # The door's content-free refusals come first, for gRPC as for HTTP: a standing queue sheds new work without
    # hashing its images for the cache (the answer would still cost the event loop its reply).
    settings = test_settings(preprocess_workers=1, max_queue_delay_ms=300)
    cached = encode_image(random_image(48, 48, seed=9), "PNG")
    slow = [SLOW + encode_image(random_image(64, 64, seed=20 + i), "PNG") for i in range(12)]  # distinct: no hits
    with (
        serving(settings, pipeline_factory=misbehaving_pipeline) as server,
        EncoderClient(server.grpc_target) as client,
    ):
        assert client.encode([cached])[0].cache == "miss"
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            queued = stand_a_queue(pool, client, slow)
            with pytest.raises(ResourceExhaustedError, match="for the decoders and the encoder") as refused:
                client.encode_images([cached])
            assert refused.value.cause == "queue_delay"
            for future in queued:
                future.exception(30)
        wait_until(lambda: server.service.pipeline.idle, 10)
        assert client.encode([cached])[0].cache == "hit"  # served from the cache once the queue drained


def test_a_long_deadline_cannot_fill_the_queues_before_their_measured_wait_shows_it() -> None:
    # Requests with a 60 s deadline (HTTP's default) arrive faster than the encoder runs. Nobody has waited long
    # yet: the measured sojourn reads 0. The images admitted and not yet in a forward (decoding, then queued for
    # the encoder) at the fitted cost are what say the queue passed the target: a burst over it is let in for
    # interval_s, then the door refuses whatever the deadline; once they are in forwards, it reopens.
    queued = [0, 0]  # (images, patches) in the encoder's queue, as the runner reports them
    guard = OverloadGuard(DOOR, queue_wait=lambda: 0.0, encoder_queue=lambda: tuple(queued))
    for _ in range(8):
        guard.forward.observe(0.3, 1000)  # 0.3 s an image of 1000 patches
    now = 100.0
    decoding = [guard.admit(1000, 1, deadline=now + 60, now=now) for _ in range(4)]  # 1.2 s ahead after the 4th
    decoding.append(guard.admit(1000, 1, deadline=now + 60, now=now + 0.05))  # over the target for 50 ms: a burst
    with pytest.raises(ResourceExhaustedError, match="target 1000 ms") as refused:
        guard.admit(1000, 1, deadline=now + 60, now=now + 0.15)
    assert refused.value.cause == "queue_delay"
    with pytest.raises(ResourceExhaustedError, match="target 1000 ms"):  # what front ends ask before any parse
        guard.check_queue(now=now + 0.16)
    for ticket in decoding:  # decoded and queued for the encoder: the same wait, still refused
        guard.decoded(ticket, 1000, 10_000)
        queued = [queued[0] + 1, queued[1] + 1000]
    with pytest.raises(ResourceExhaustedError, match="target 1000 ms"):
        guard.admit(1000, 1, deadline=now + 60, now=now + 0.2)
    queued = [0, 0]  # the encoder took them into its forwards
    guard.release(guard.admit(1000, 1, deadline=now + 60, now=now + 0.4))  # below the target: let in again
    guard.check_queue(now=now + 0.45)
    for ticket in decoding:
        guard.release(ticket)


def test_batch_requests_are_shed_at_half_the_target_interactive_ones_at_the_target() -> None:
    # 0.3 s an image; two images waiting: 0.6 s, past half the 1 s target and below the target itself.
    waiting = [2]
    guard = OverloadGuard(DOOR, encoder_queue=lambda: (waiting[0], 1000 * waiting[0]))
    for _ in range(8):
        guard.forward.observe(0.3, 1000)
    now = 100.0
    for step in range(5):  # standing there for longer than CoDel's interval: interactive requests still come in
        guard.check_queue(now=now + 0.05 * step)
    with pytest.raises(ResourceExhaustedError, match="batch requests are taken below 500 ms") as shed:
        guard.check_queue(now=now + 0.3, sheddable=True)  # at once: no interval for batch work
    assert shed.value.cause == "batch_shed" and shed.value.retry_after_s == pytest.approx(0.1)
    waiting[0] = 1  # 0.3 s: batch requests come in again
    guard.check_queue(now=now + 0.35, sheddable=True)
    off = OverloadGuard(replace(DOOR, max_queue_delay_s=0), encoder_queue=lambda: (100, 100_000))
    off.forward.observe(0.3, 1000)
    off.check_queue(now=now, sheddable=True)  # no target delay (0): nothing is shed either


def test_a_bomb_announcing_the_largest_image_does_not_shut_the_door() -> None:
    # Its header announces 16k patches (the most an image may have); its decode refuses it within milliseconds.
    # Meanwhile the door counts it as one image at the measured rate (0.1 s), not as 16k patches at the fitted
    # cost (4.9 s).
    guard = OverloadGuard(DOOR)
    for _ in range(8):
        guard.forward.observe(0.1, 333)  # thumbnails: 0.1 s an image
    now = 100.0
    bomb = guard.admit(16384, 1, deadline=now + 60, now=now)
    assert_door_open(guard, 1000, now=now + 0.05, steps=5)
    guard.release(bomb)


def test_a_fit_misled_by_small_forwards_does_not_shut_the_door_on_big_images() -> None:
    # Recorded on the CPU machine (tests/acceptance/test_corpus.py, tiny preset): forwards of 16-92 patches, one
    # of them 10x slow. Two images of 4356 patches (0.27 s each to encode there) wait in the encoder's queue.
    # Fitted on small forwards alone, the cost per patch is a guess (0.17 ms, 2.6x the truth: 1.5 s ahead); the
    # door must not close on that guess while the images wait behind a forward.
    recorded = [(16, 9.7), (80, 3.6), (32, 10.6), (80, 4.7), (16, 5.1), (32, 2.2), (64, 10.4), (16, 127.3), (92, 10.1)]
    guard = OverloadGuard(DOOR, queue_wait=lambda: 0.2, encoder_queue=lambda: (2, 2 * 4356))
    for patches, ms in recorded + [(24, 4.1)]:
        guard.forward.observe(ms / 1e3, patches)
    assert guard.forward.seconds(2 * 4356) > 1.0  # the guess
    assert_door_open(guard, 400)


def test_tiny_images_queued_behind_big_ones_are_not_counted_as_big() -> None:
    # The drain rate in images (0.4 s an image, from forwards of one big image each) would make six queued
    # thumbnails 2.4 s of work; the fit in patches knows them as one short forward.
    guard = OverloadGuard(DOOR, queue_wait=lambda: 0.2, encoder_queue=lambda: (6, 6 * 16))
    for patches in (4000, 2000) * 4:
        guard.forward.observe(0.01 + 1e-4 * patches, patches)
    assert_door_open(guard, 16)


def test_one_slow_forward_moves_neither_cost() -> None:
    cost = BatchCost()
    sizes = (16, 400, 1600, 16, 800, 64, 1000, 200)
    for n, patches in enumerate(sizes * 2):
        slow = 30 if n == 9 else 1  # a thread preempted, a shape not seen before
        cost.observe(slow * (0.010 + 0.0001 * patches), patches)
    assert cost.fixed_s == pytest.approx(0.010, rel=0.01) and cost.per_patch_s == pytest.approx(1e-4, rel=0.01)


def test_batch_cost_separates_the_fixed_cost_of_a_forward_from_its_patches() -> None:
    cost = BatchCost()
    for patches in (16, 400, 1600, 16, 800) * 4:
        cost.observe(0.010 + 0.0001 * patches, patches)  # 10 ms a forward + 0.1 ms a patch
    assert cost.fixed_s == pytest.approx(0.010, rel=1e-3) and cost.per_patch_s == pytest.approx(1e-4, rel=1e-3)
    assert cost.seconds(1000, batches=2) == pytest.approx(0.120, rel=1e-3)
    same = BatchCost()
    same.observe(0.2, 1000)  # one size only: all of it per patch
    assert same.fixed_s == 0 and same.per_patch_s == pytest.approx(2e-4)


def test_a_refusal_carries_its_retry_after_for_http_and_grpc() -> None:
    from google.rpc import error_details_pb2, status_pb2

    mapped = map_error(ResourceExhaustedError("busy", retry_after_s=2.2, cause="queue_delay"))
    assert mapped.http_status == 429 and mapped.http_headers == {"Retry-After": "3"} and mapped.reason == "queue_delay"
    status = status_pb2.Status.FromString(dict(to_grpc_status(mapped).trailing_metadata)["grpc-status-details-bin"])
    (info,) = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    retry = error_details_pb2.RetryInfo()
    info.Unpack(retry)
    assert retry.retry_delay.ToMilliseconds() == 2200


class ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def server() -> Iterator[ServiceThread]:
    with serving(test_settings(max_queue_delay_ms=400)) as server:
        yield server


@pytest.fixture()
def errors() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


def scrape(server: ServiceThread) -> dict[str, float]:
    scraper = Scraper(("127.0.0.1", server.service.http_port))
    return asyncio.run(scraper.scrape())


def requests_by_code(values: dict[str, float]) -> Counter:
    pattern = re.compile(r'mmproc_requests_total\{code="(\w+)",front_end="\w+",method="([^"]+)"\}')
    out: Counter = Counter()
    for key, value in values.items():
        if (m := pattern.fullmatch(key)) is not None:
            out[m.group(1)] += int(value)
    return out


def test_a_client_deadline_is_counted_as_deadline_exceeded_never_unknown(server: ServiceThread, errors) -> None:
    before = scrape(server)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.EncoderStub(channel)
        # No cache: an earlier call's encode that finished after its client gave up would answer the next one.
        request = pb.EncodeImagesRequest(images=[HEAVY, HEAVY], transport=pb.TRANSPORT_SERIALIZED, cache_bypass=True)
        for timeout in (0.05, 0.15, 0.3):
            with pytest.raises(grpc.RpcError) as info:
                stub.EncodeImages(request, timeout=timeout)
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.5)  # the server side of the last call ends after the client gave up
    codes = requests_by_code(scrape(server)) - requests_by_code(before)
    assert codes == Counter({"DEADLINE_EXCEEDED": 3}), codes
    assert not errors.records, [r.getMessage() for r in errors.records]


def test_overload_is_refused_early_and_the_service_recovers(server: ServiceThread, errors) -> None:
    spec = ImageSpec(((448, 448),), "cycle", "jpeg", 90)  # slow enough that a Python client overloads it
    base = [p[0] for p in generate_requests(5, range(8), 1, spec, max_bytes=1 << 26)]
    images = [bench.unique_jpeg(base[i % len(base)], i) for i in range(1000)]
    args = argparse.Namespace(target=server.grpc_target, http_target=f"127.0.0.1:{server.service.http_port}",
                              deadline_s=2.0, http_timeout_ms=0, http_wait_s=30.0)  # fmt: skip

    async def run() -> tuple[list, list, list]:
        load = bench.Load(args)
        try:
            warm = await bench.closed_loop(load, base, 10**6, 1.0, 4)
            capacity = sum(o.code == "OK" for o in warm) / 1.0  # images/s of this machine, now
            rate = min(600.0, max(100.0, 4 * capacity))  # 4x what it just served: overload on any machine
            tasks = await bench.open_loop(load, images, rate=rate, seconds=2.5, seed=1)
            outcomes = list(await asyncio.gather(*tasks))
            for _ in range(50):  # calls whose clients gave up may still be ending on the server (a loaded machine)
                if server.service.pipeline.inflight == 0:
                    break
                await asyncio.sleep(0.1)
            after = await bench.closed_loop(load, base, 2 * 10**6, 1.0, 2)
        finally:
            await load.close()
        return warm, outcomes, after

    before = scrape(server)
    warm, outcomes, after = asyncio.run(run())
    values = scrape(server)
    codes = Counter(o.code for o in outcomes)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, codes
    assert codes["OK"] > 0 and codes["RESOURCE_EXHAUSTED"] > len(outcomes) / 4, codes
    refused = [o for o in outcomes if o.code == "RESOURCE_EXHAUSTED" and o.kind != "client"]
    assert refused and all(o.retry_after for o in refused)  # Retry-After (HTTP) / RetryInfo (gRPC) on each
    assert {o.kind for o in outcomes if o.code == "OK"} == set(bench.KINDS)  # every front end got its share
    server_codes = requests_by_code(values) - requests_by_code(before)
    assert "UNKNOWN" not in server_codes and "INTERNAL" not in server_codes, server_codes
    seen = Counter(o.code for o in warm + outcomes + after)
    for code in ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"):
        # a call whose deadline passes before its handler starts is never counted by the server: a little slack
        assert abs(server_codes[code] - seen[code]) <= max(3, seen[code] // 10), (server_codes, seen)
    # Every image encoded went to somebody, or is counted as run for a caller that left during its forward or
    # finished past its deadline: none of a request already gone before its forward.
    delta = {k: values[k] - before.get(k, 0) for k in values}
    encoded = delta["mmproc_images_encoded_total"]
    late = delta['mmproc_dropped_images_total{stage="late"}'] + delta['mmproc_dropped_images_total{stage="delivery"}']
    assert encoded <= server_codes["OK"] + late + 4, (encoded, server_codes, late)
    assert all(o.code == "OK" for o in after), Counter(o.code for o in after)  # served again once drained (<= 5 s)
    assert values["mmproc_pending_bytes"] == 0 and server.service.pipeline.inflight == 0
    forward = server.service.pipeline.overload.forward  # the model behind the refusals, as scraped
    assert values['mmproc_forward_cost_seconds{part="per_image"}'] == forward.per_image_s > 0
    assert server.service.pipeline.overload.ahead_s() == 0  # every admitted request gave its share back
    assert not errors.records, [r.getMessage() for r in errors.records]


def test_http_takes_its_deadline_from_the_timeout_header(server: ServiceThread) -> None:
    import base64

    body = {"images": [base64.b64encode(HEAVY).decode()], "cache_bypass": True}  # encoded by every call
    url = f"{server.http_url}/v1/encode"
    bad = httpx.post(url, json=body, headers={"x-mmproc-timeout-ms": "soon"}, timeout=30)
    assert bad.status_code == 400 and "x-mmproc-timeout-ms" in bad.json()["error"]["message"]
    late = httpx.post(url, json=body, headers={"x-mmproc-timeout-ms": "30"}, timeout=30)
    assert late.status_code == 504 and late.json()["error"]["code"] == "DEADLINE_EXCEEDED"
    assert httpx.post(url, json=body, headers={"x-mmproc-timeout-ms": "30000"}, timeout=60).status_code == 200
