"""The gRPC front end on an event loop of its own (`grpc_loop = "own"`, the default): calls are taken in and
answered while the main loop, which HTTP and the engine share, is busy; "shared" runs them on the main loop."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from mmproc.client import EncoderClient
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
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
