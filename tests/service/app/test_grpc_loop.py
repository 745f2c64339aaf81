"""The gRPC front end on an event loop of its own (`grpc_loop = "own"`, the default): calls are taken in and
answered while the main loop, which HTTP and the engine share, is busy; "shared" runs them on the main loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import grpc
import pytest

from mmproc.client import EncoderClient
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.frontends.grpc.loop_hop import run_on
from tests.support.common import wait_until
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, serving, test_settings


def _hold_main_loop(server: ServiceThread, seconds: float) -> None:
    """Keep the service's main loop from turning for `seconds` (as a burst of HTTP work or callbacks would)."""
    holding = threading.Event()

    def hold() -> None:
        holding.set()
        time.sleep(seconds)

    server.on_loop(hold)
    assert holding.wait(5)


@pytest.mark.parametrize(("grpc_loop", "answered"), [("own", True), ("shared", False)])
def test_grpc_answers_while_the_main_loop_is_held_only_on_a_loop_of_its_own(grpc_loop: str, answered: bool) -> None:
    with serving(test_settings(grpc_loop=grpc_loop)) as server, grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.EncoderStub(channel)
        stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)  # connected before the loop is held
        _hold_main_loop(server, 2.0)
        try:
            info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=0.5)
        except grpc.RpcError as exc:
            assert not answered, f"{grpc_loop}: {exc.code()}"
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            assert answered, f"{grpc_loop}: answered although the main loop was held"
            assert info.model_name


def test_a_request_on_the_own_loop_is_encoded_once_the_main_loop_turns_again() -> None:
    """The handler waits for the engine's loop (where encoding runs) without holding up intake, and the answer
    is the same as on a shared loop."""
    image = make_image_bytes(64, 48, fmt="JPEG")
    with serving(test_settings(grpc_loop="shared")) as server, EncoderClient(server.grpc_target) as client:
        want = client.encode_images([image])[0]
    with serving(test_settings(grpc_loop="own")) as server, EncoderClient(server.grpc_target) as client:
        client.encode_images([image])
        _hold_main_loop(server, 1.0)
        started = time.monotonic()
        got = client.encode_images([image], timeout=10)[0]
        assert time.monotonic() - started >= 0.5  # it did wait for the held loop
    assert got.equal(want)


def test_the_own_loop_thread_ends_with_the_server() -> None:
    def loops() -> int:
        return sum(t.name == "mmproc-grpc" and t.is_alive() for t in threading.enumerate())

    before = loops()
    with serving(test_settings(grpc_loop="own")):
        assert loops() == before + 1
    assert loops() == before


class _Home:
    """An event loop in a thread of its own, as the engine's main loop is to the gRPC loop."""

    def __enter__(self) -> asyncio.AbstractEventLoop:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self.loop

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_run_on_returns_the_value_or_raises_the_error_of_work_on_another_loop() -> None:
    async def where() -> int:
        return threading.get_ident()

    async def fails() -> None:
        raise ValueError("bad image")

    async def main(home: asyncio.AbstractEventLoop) -> None:
        assert await run_on(home, where()) != threading.get_ident()
        with pytest.raises(ValueError, match="bad image"):
            await run_on(home, fails())

    with _Home() as home:
        asyncio.run(main(home))


def test_a_cancelled_caller_cancels_the_work_and_a_late_value_is_disposed() -> None:
    stopped, disposed = threading.Event(), []

    async def endless() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    async def finishes_anyway() -> str:  # work that completes although cancelled (a hold granted just then)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "late hold"
        return "never"

    async def main(home: asyncio.AbstractEventLoop) -> None:
        for work, dispose in ((endless(), None), (finishes_anyway(), disposed.append)):
            caller = asyncio.ensure_future(run_on(home, work, dispose))
            await asyncio.sleep(0.05)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller

    with _Home() as home:
        asyncio.run(main(home))
        assert stopped.wait(5)
        assert wait_until(lambda: disposed == ["late hold"], timeout=5)


def test_an_error_after_the_caller_has_gone_is_not_logged_as_never_retrieved(caplog) -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("deadline passed") from None  # as the engine's own deadline check can race a cancel

    async def main(home: asyncio.AbstractEventLoop) -> None:
        caller = asyncio.ensure_future(run_on(home, fails_when_cancelled()))
        await asyncio.sleep(0.05)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    with caplog.at_level(logging.ERROR, logger="asyncio"), _Home() as home:
        asyncio.run(main(home))
        time.sleep(0.2)
    gc.collect()  # an unretrieved task exception is logged when the task is collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
