"""Client resilience: several targets, UNAVAILABLE retried with backoff within the deadline, never
INVALID_ARGUMENT. The policy itself is tested without servers; the behaviour with real in-process servers."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import httpx
import pytest

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.client.retry import RetryPolicy, Rotation, call_with_retry
from mmproc.errors import DeadlineExceededError, InvalidMediaError, ResourceExhaustedError, UnavailableError
from service.app.build import build_pipeline
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, test_settings

IMAGE = make_image_bytes(48, 48, fmt="PNG")
FAST = RetryPolicy(max_attempts=8, initial_backoff_s=0.01, max_backoff_s=0.05)


def failing(*errors: Exception):
    """An attempt function that raises `errors` in turn, then returns "ok"; records the time it got."""
    calls: list[float] = []

    def attempt(seconds_left: float) -> str:
        calls.append(seconds_left)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return attempt, calls


def test_unavailable_is_retried_until_success() -> None:
    attempt, calls = failing(UnavailableError("a"), UnavailableError("b"))
    assert call_with_retry(attempt, FAST, timeout=5) == "ok"
    assert len(calls) == 3
    assert calls[0] > calls[1] > calls[2]  # one deadline shared by all attempts


@pytest.mark.parametrize(
    "error",
    [InvalidMediaError("bad", reason="undecodable"), DeadlineExceededError("late"), ResourceExhaustedError("full")],
)
def test_other_errors_are_not_retried(error) -> None:
    attempt, calls = failing(error)
    with pytest.raises(type(error)):
        call_with_retry(attempt, FAST, timeout=5)
    assert len(calls) == 1


def test_resource_exhausted_is_retried_when_asked() -> None:
    attempt, calls = failing(ResourceExhaustedError("full"))
    policy = RetryPolicy(initial_backoff_s=0.01, retry_resource_exhausted=True)
    assert call_with_retry(attempt, policy, timeout=5) == "ok"
    assert len(calls) == 2


def test_retries_stop_at_max_attempts_and_at_the_deadline() -> None:
    attempt, calls = failing(*[UnavailableError("down")] * 100)
    with pytest.raises(UnavailableError):
        call_with_retry(attempt, RetryPolicy(max_attempts=3, initial_backoff_s=0.001), timeout=5)
    assert len(calls) == 3
    attempt, calls = failing(*[UnavailableError("down")] * 100)
    started = time.monotonic()
    with pytest.raises(UnavailableError):
        call_with_retry(attempt, RetryPolicy(max_attempts=100, initial_backoff_s=0.05, max_backoff_s=0.05), timeout=0.3)
    assert time.monotonic() - started < 0.35
    assert 1 < len(calls) < 100


def test_backoff_is_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, multiplier=2.0)
    rng = random.Random(0)
    for retry, cap in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (9, 1.0)]:
        delays = [policy.backoff(retry, rng) for _ in range(200)]
        assert min(delays) >= 0 and max(delays) <= cap
        assert max(delays) > cap * 0.8  # jitter spans the range


def test_rotation_rests_a_failed_target() -> None:
    now = [0.0]
    rotation = Rotation(["a", "b", "c"], cooldown_s=1.0, clock=lambda: now[0])
    assert [rotation.pick()[1] for _ in range(4)] == ["a", "b", "c", "a"]
    rotation.failed(1)
    assert [rotation.pick()[1] for _ in range(4)] == ["c", "a", "c", "a"]
    now[0] = 2.0
    assert {rotation.pick()[1] for _ in range(3)} == {"a", "b", "c"}


# -- with servers ---------------------------------------------------------------------------------------


@pytest.fixture
def two_servers():
    servers = [ServiceThread(test_settings(http_address="")).start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def served(server) -> int:
    return server.service.pipeline.batches_run


@pytest.mark.parametrize("form", ["list", "ipv4"])
def test_requests_keep_succeeding_when_one_of_two_servers_stops(two_servers, form) -> None:
    a, b = two_servers
    ports = [s.service.grpc_port for s in two_servers]
    target = (
        [s.grpc_target for s in two_servers] if form == "list" else f"ipv4:127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    )
    # cache=False: every request runs a batch on the server that answers it (repeats would be cache hits)
    with EncoderClient(target, timeout=20, retry=FAST, cache=False) as client:
        deadline = time.monotonic() + 20  # round_robin only uses subchannels once they connect: allow for load
        while not (served(a) and served(b)) and time.monotonic() < deadline:
            client.encode_images([IMAGE])
        assert served(a) > 0 and served(b) > 0  # spread over both
        a.stop()
        before = served(b)
        for _ in range(10):
            assert client.encode_images([IMAGE])[0].shape[1] == 256
        assert served(b) - before >= 10


def test_async_client_fails_over_too(two_servers) -> None:
    a, b = two_servers
    a.stop()

    async def run() -> list:
        async with AsyncEncoderClient([a.grpc_target, b.grpc_target], timeout=20, retry=FAST) as client:
            return [await client.encode_images([IMAGE]) for _ in range(4)]

    assert len(asyncio.run(run())) == 4


def test_a_starting_server_is_retried_until_it_serves() -> None:
    release = threading.Event()

    def gated(settings, metrics):
        assert release.wait(30)
        return build_pipeline(settings, metrics)

    server = ServiceThread(test_settings(), pipeline_factory=gated, wait_ready=False).start()
    try:
        threading.Timer(0.3, release.set).start()
        policy = RetryPolicy(max_attempts=100, initial_backoff_s=0.02, max_backoff_s=0.1)
        with EncoderClient(server.grpc_target, timeout=20, retry=policy) as client:
            assert client.encode_images([IMAGE])[0].shape[1] == 256
    finally:
        release.set()
        server.stop()


def test_invalid_argument_is_sent_exactly_once(tiny_server) -> None:
    def refused() -> float:
        text = httpx.get(f"{tiny_server.http_url}/metrics").text
        line = 'mmproc_requests_total{code="INVALID_ARGUMENT",front_end="grpc",method="EncodeImagesStream"}'
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))

    before = refused()
    policy = RetryPolicy(max_attempts=10, retry_resource_exhausted=True)
    with EncoderClient([tiny_server.grpc_target] * 2, retry=policy) as client, pytest.raises(InvalidMediaError):
        client.encode_images([b"not an image"])
    assert refused() - before == 1
