"""The reply byte budget (service/pipeline/reply_budget.py): serialized reply bytes in flight stay within
`max_reply_mb` whatever the load, every front end waits its turn in order, and a reply that cannot get its turn
before its deadline, or whose client leaves, gives back all it took (nothing)."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.errors import DeadlineExceededError
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.pipeline.reply_budget import ReplyBudget, ReplyBudgetConfig, ReplyHold
from tests.support.common import wait_until
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, reference_embeddings, serving, test_settings

IMAGE_BYTES = 256 * 256 * 4  # a 448² image on the tiny preset: 256 tokens x 256 float32
IMAGES = [make_image_bytes(448, 448, fmt="PNG", seed=40 + i) for i in range(6)]


# -- the budget on its own ------------------------------------------------------------------------------------------


def run(coro_fn: Callable[[], object]) -> object:
    return asyncio.run(coro_fn())


async def settle() -> None:
    for _ in range(5):  # let granted waiters run
        await asyncio.sleep(0)


def test_waiters_are_served_in_order_within_the_bound() -> None:
    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=100))
        first = await budget.acquire(60, None)
        order: list[str] = []

        async def take(name: str, nbytes: int) -> ReplyHold:
            held = await budget.acquire(nbytes, None)
            order.append(name)
            return held

        big = asyncio.create_task(take("big", 50))
        await settle()
        small = asyncio.create_task(take("small", 10))  # fits now, but never passes the earlier waiter
        await settle()
        assert order == [] and budget.waiting == 2 and budget.in_flight == 60
        first.release()
        await settle()
        assert order == ["big", "small"] and budget.in_flight == 60
        (await big).release()
        (await small).release()
        first.release()  # a second release gives nothing back twice
        assert budget.in_flight == 0 and budget.peak == 60

    run(main)


def test_a_reply_larger_than_the_budget_goes_alone() -> None:
    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=100))
        small = await budget.acquire(30, None)
        huge = asyncio.create_task(budget.acquire(250, None))
        await settle()
        assert not huge.done()
        small.release()
        held = await huge
        assert budget.in_flight == 250
        after = asyncio.create_task(budget.acquire(1, None))
        await settle()
        assert not after.done()  # nothing joins it
        held.release()
        (await after).release()
        assert budget.in_flight == 0 and budget.peak == 250

    run(main)


def test_an_expired_waiter_raises_and_takes_nothing() -> None:
    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=10))
        full = await budget.acquire(10, None)
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            await budget.acquire(5, time.monotonic() + 0.05)
        assert 0.04 < time.monotonic() - started < 1.0
        assert budget.waiting == 0 and budget.in_flight == 10
        full.release()
        assert budget.in_flight == 0

    run(main)


def test_a_waiter_cancelled_as_it_is_granted_gives_its_bytes_back() -> None:
    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=10))
        full = await budget.acquire(10, None)
        waiter = asyncio.create_task(budget.acquire(5, None))
        queued = asyncio.create_task(budget.acquire(10, None))
        await settle()
        full.release()  # grants `waiter` (5 of 10) ...
        waiter.cancel()  # ... whose task is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        held = await queued  # the 5 came back: the next waiter gets the whole budget
        assert budget.in_flight == 10
        held.release()
        assert budget.in_flight == 0 and budget.waiting == 0

    run(main)


def test_staging_keeps_its_bytes_until_its_thread_has_finished() -> None:
    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=10))
        held = await budget.acquire(8, None)
        go = threading.Event()
        staging = asyncio.create_task(held.off_loop(lambda: go.wait(10)))
        await asyncio.sleep(0.05)
        staging.cancel()  # the caller leaves (client gone) while the thread still writes the reply's bytes
        with pytest.raises(asyncio.CancelledError):
            await staging
        held.release()
        assert budget.in_flight == 8
        go.set()
        for _ in range(200):
            if budget.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert budget.in_flight == 0

    run(main)


def test_a_hold_keeps_no_reference_to_the_reply_it_staged() -> None:
    """gRPC keeps a call's done callbacks in a reference cycle (its state and context point at each other): what
    a callback's hold references lives until the cyclic GC runs, uncounted (docs/benchmarks/overload.md)."""

    class Reply:  # stands for the reply's bytes (bytes cannot be weakly referenced)
        pass

    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=10))
        held = await budget.acquire(8, None)
        reply = await held.off_loop(Reply)
        gone = weakref.ref(reply)
        del reply
        await settle()  # the futures' own done callbacks, a loop turn later
        assert gone() is None, "the hold kept the reply alive"
        held.release()

    gc.disable()  # only reference counting may free it, as between two collections in the server
    try:
        run(main)
    finally:
        gc.enable()


def test_resizing_to_the_rendered_body_lets_waiters_in() -> None:
    async def main() -> None:
        budget = ReplyBudget(ReplyBudgetConfig(max_bytes=100))
        held = await budget.acquire(90, None)
        waiter = asyncio.create_task(budget.acquire(50, None))
        await settle()
        held.resize(40)  # rendered smaller than its estimate
        other = await waiter
        assert budget.in_flight == 90
        other.release()
        held.release()
        assert budget.in_flight == 0

    run(main)


# -- a server with a 1 MiB budget -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServiceThread]:
    with serving(test_settings(max_reply_mb=1, cache_mb=0)) as started:
        yield started


def budget_of(server: ServiceThread) -> ReplyBudget:
    return server.service.pipeline.delivery.replies


def take(server: ServiceThread, nbytes: int) -> ReplyHold:
    """`nbytes` of the server's reply budget, held by the test as a reply being sent would hold them."""
    return asyncio.run_coroutine_threadsafe(budget_of(server).acquire(nbytes, None), server._loop).result(10)


def give_back(server: ServiceThread, held: ReplyHold) -> None:
    server.on_loop(held.release)


def gauge(server: ServiceThread) -> float:
    return server.service.metrics.registry.get_sample_value("mmproc_reply_bytes_in_flight")


def dropped_at_delivery(server: ServiceThread) -> float:
    return server.service.metrics.registry.get_sample_value("mmproc_dropped_images_total", {"stage": "delivery"})


def assert_idle(server: ServiceThread) -> None:
    budget = budget_of(server)
    assert wait_until(lambda: budget.in_flight == 0 and budget.waiting == 0, 10, 0.01), (
        budget.in_flight,
        budget.waiting,
    )
    assert gauge(server) == 0


def unary(server: ServiceThread, images: list[bytes], timeout: float = 30) -> list[torch.Tensor]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        reply = pb_grpc.EncoderStub(channel).EncodeImages(pb.EncodeImagesRequest(images=images), timeout=timeout)
    return [torch.frombuffer(bytearray(e.data), dtype=torch.float32).view(*e.shape) for e in reply.embeddings]


def streamed(server: ServiceThread, images: list[bytes]) -> list[torch.Tensor]:
    with EncoderClient(server.grpc_target) as client:
        return client.encode_images(images, timeout=30)


def http(server: ServiceThread, images: list[bytes], timeout_ms: int = 30_000) -> httpx.Response:
    body = {"images": [base64.b64encode(i).decode() for i in images], "return_embeddings": True}
    headers = {"x-mmproc-timeout-ms": str(timeout_ms)}
    return httpx.post(f"{server.http_url}/v1/encode", json=body, headers=headers, timeout=30)


def over_http(server: ServiceThread, images: list[bytes]) -> list[torch.Tensor]:
    reply = http(server, images)
    assert reply.status_code == 200, reply.text
    return [
        torch.frombuffer(bytearray(base64.b64decode(e["data"])), dtype=torch.float32).view(*e["shape"])
        for e in reply.json()["embeddings"]
    ]


def test_replies_from_every_front_end_wait_their_turn_and_stay_within_the_budget(server) -> None:
    budget = budget_of(server)
    requests = [[IMAGES[i % 6], IMAGES[(i + 1) % 6]] for i in range(12)]  # 0.5 MiB each (HTTP's body: 0.67)
    senders = [unary, streamed, over_http] * 4
    samples: list[float] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(gauge(server))
            time.sleep(0.002)

    full = take(server, budget.max_bytes)  # every reply queues behind it, then they go in turn
    sampler = threading.Thread(target=sample)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        futures = [pool.submit(send, server, images) for send, images in zip(senders, requests)]
        assert wait_until(lambda: budget.waiting == len(requests), 60, 0.01), budget.waiting
        give_back(server, full)
        results = [f.result(60) for f in futures]
    sampling.set()
    sampler.join()
    want = dict(zip(IMAGES, reference_embeddings(server, IMAGES)))
    for images, got in zip(requests, results):
        assert len(got) == len(images)
        for data, tensor in zip(images, got):
            torch.testing.assert_close(tensor, want[data], rtol=1e-4, atol=1e-5)
    assert max(samples) <= budget.max_bytes and budget.peak <= budget.max_bytes
    assert budget.peak >= 2 * IMAGE_BYTES  # replies did go through it
    assert_idle(server)


def test_a_reply_larger_than_the_whole_budget_still_succeeds_alone(server) -> None:
    budget = budget_of(server)
    images = IMAGES[:5]  # 1.25 MiB > 1 MiB
    part = take(server, IMAGE_BYTES)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sent = pool.submit(unary, server, images)
        assert wait_until(lambda: budget.waiting == 1, 30, 0.01)
        assert budget.in_flight == IMAGE_BYTES  # it waits for the reply holding budget; nothing is shared with it
        give_back(server, part)
        got = sent.result(30)
    assert [t.shape[0] for t in got] == [256] * 5
    assert budget.peak >= 5 * IMAGE_BYTES
    assert over_http(server, images)[4].shape == (256, 256)
    assert_idle(server)


def test_a_reply_waiting_past_its_deadline_is_deadline_exceeded_and_takes_nothing(server) -> None:
    budget = budget_of(server)
    dropped = dropped_at_delivery(server)
    full = take(server, budget.max_bytes)
    try:
        with pytest.raises(grpc.RpcError) as late:
            unary(server, IMAGES[:2], timeout=1.5)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        reply = http(server, IMAGES[:2], timeout_ms=1500)
        assert reply.status_code == 504, reply.text
        assert wait_until(lambda: budget.waiting == 0, 10, 0.01)
        assert budget.in_flight == budget.max_bytes  # the test's hold only
        assert dropped_at_delivery(server) == dropped + 4
    finally:
        give_back(server, full)
    assert_idle(server)
    assert len(unary(server, IMAGES[:1])) == 1  # and the budget serves again


def test_a_client_that_cancels_while_waiting_leaves_the_budget_at_zero(server) -> None:
    budget = budget_of(server)
    full = take(server, budget.max_bytes)
    try:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.EncoderStub(channel)
            request = pb.EncodeImagesRequest(images=IMAGES[:2])
            calls = [stub.EncodeImages.future(request, timeout=30), stub.EncodeImagesStream(request, timeout=30)]
            assert wait_until(lambda: budget.waiting == 2, 30, 0.01), budget.waiting
            for call in calls:
                call.cancel()
            assert wait_until(lambda: budget.waiting == 0, 10, 0.01), budget.waiting
        assert budget.in_flight == budget.max_bytes
    finally:
        give_back(server, full)
    assert_idle(server)


def test_a_streamed_reply_holds_its_bytes_until_the_client_has_read_them(server) -> None:
    budget = budget_of(server)
    images = [make_image_bytes(1024, 1024, fmt="PNG", seed=70 + i) for i in range(6)]  # ~8 MiB, alone
    # No BDP probing: the client's flow-control window stays small, so the server cannot have sent it all yet.
    with grpc.insecure_channel(server.grpc_target, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        stream = pb_grpc.EncoderStub(channel).EncodeImagesStream(pb.EncodeImagesRequest(images=images), timeout=60)
        first = next(stream)
        time.sleep(0.3)  # a slow reader: the server cannot be done sending
        held = budget.in_flight
        rest = list(stream)
    assert held > 0 and len(first.data) > 0 and rest
    assert_idle(server)
