"""HTTP body intake (issue 47, item 11): bodies being read are bounded in bytes, a body must keep arriving, and
connections are capped."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from service.frontends.http.intake import BodyIntake, IntakeConfig
from tests.support.server import serving, test_settings


async def reading_app(scope, receive, send) -> None:
    """Reads the whole body, then answers 200 with its length."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def scope_of(length: int) -> dict:
    headers = [(b"content-length", str(length).encode()), (b"content-type", b"application/json")]
    return {"type": "http", "method": "POST", "path": "/v1/encode", "headers": headers, "query_string": b""}


async def call(app, length: int, chunks: list[bytes], hang: bool = False) -> tuple[int, float]:
    """The status `app` answers for a body sent as `chunks` (then, with `hang`, nothing more), and the time."""
    queue = list(chunks)
    sent: list[dict] = []

    async def receive() -> dict:
        if queue:
            await asyncio.sleep(0.01)
            body = queue.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(queue) or hang}
        await asyncio.sleep(3600 if hang else 0)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    started = time.monotonic()
    await app(scope_of(length), receive, send)
    return sent[0]["status"], time.monotonic() - started


def test_a_body_that_stops_arriving_is_answered_408() -> None:
    app = BodyIntake(reading_app, IntakeConfig(grace_s=0.3, min_rate=1e9))
    status, took = asyncio.run(call(app, 1000, [b"x" * 500], hang=True))
    assert status == 408 and 0.3 <= took < 2.0
    assert asyncio.run(call(app, 1000, [b"x" * 500, b"y" * 500]))[0] == 200


def test_large_bodies_read_at_once_are_bounded() -> None:
    app = BodyIntake(reading_app, IntakeConfig(max_bytes=3000, reserve_from=100, wait_s=0.2))

    async def scenario() -> list[int]:
        slow = [b"x" * 100] * 30  # 0.3 s to arrive
        results = await asyncio.gather(call(app, 3000, slow), call(app, 3000, slow), call(app, 50, [b"x" * 50]))
        return [status for status, _ in results]

    first, second, small = asyncio.run(scenario())
    assert sorted([first, second]) == [200, 429] and small == 200  # small bodies need no reservation
    assert asyncio.run(call(app, 3000, [b"x" * 3000]))[0] == 200  # the bytes came back


def test_connections_past_the_cap_get_503() -> None:
    with serving(test_settings(http_max_connections=3)) as server:  # uvicorn counts the new one too: 2 held + 1
        host, port = server.http_url.removeprefix("http://").split(":")
        held = []
        for _ in range(2):  # two requests with half a body each: both held (within their grace)
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"POST /v1/encode HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"{" * 10)
            held.append(sock)
        time.sleep(0.3)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            reply = sock.recv(4096)
        for sock in held:
            sock.setblocking(False)
            try:
                early = sock.recv(4096)
            except BlockingIOError:
                early = b""
            assert not early, early[:80]  # the held ones were let in
            sock.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:80]
        time.sleep(0.3)
        import httpx

        assert httpx.get(f"{server.http_url}/healthz", timeout=10).json() == {"status": "ok"}


def test_the_server_answers_a_half_sent_body() -> None:
    """Through the real stack: FastAPI turns the stopped body into its own 400; either way a clean 4xx."""
    with serving(test_settings()) as server:
        host, port = server.http_url.removeprefix("http://").split(":")
        app = server.service  # noqa: F841 - kept alive
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            body = json.dumps({"images": []}).encode()
            sock.sendall(b"POST /v1/encode HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (len(body) + 10) + body)
            started = time.monotonic()
            reply = sock.recv(4096)
        assert reply.split(b" ")[1] in (b"400", b"408") and time.monotonic() - started < 15
