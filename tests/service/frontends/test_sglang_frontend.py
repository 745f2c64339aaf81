"""The SGLang encoder front end (service/frontends/sglang/) without SGLang: its routes, the two frames it pushes,
the registrations, the bounded push, media intake and URL fetching. Against SGLang's own receiver:
tests/engines/test_sglang_epd.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import io
import pickle
import socket
import threading
import time

import httpx
import pytest
import torch
import zmq
from PIL import Image

from mmproc.client import EncoderClient
from mmproc.errors import ConfigError, InvalidRequestError
from service.frontends.sglang.header import EMBEDDING_DATA, MODALITY
from service.frontends.sglang.media import FetchConfig, media_bytes
from tests.support.common import free_port
from tests.support.server import ServiceThread, serving, test_settings

PUSH_TIMEOUT_S = 1.0


def png(width: int, height: int, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=g).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


IMAGES = [png(100, 80, 1), png(64, 200, 2)]
URIS = ["data:image/png;base64," + base64.b64encode(b).decode() for b in IMAGES]


class _Header:
    """Stands in for SGLang's EmbeddingData when the header is read back here."""


class _Modality(int):
    pass


class _Reader(pickle.Unpickler):
    """Admits only what SGLang's allow-list admits for this header (and maps SGLang's classes to stand-ins)."""

    def find_class(self, module: str, name: str):
        if (module, name) == EMBEDDING_DATA:
            return _Header
        if (module, name) == MODALITY:
            return _Modality
        if module == "torch" and name in ("float32", "bfloat16", "float16"):
            return getattr(torch, name)
        raise AssertionError(f"unexpected global {module}.{name}")


def read_part(frames: list[bytes]) -> tuple[dict, torch.Tensor | None]:
    header = _Reader(io.BytesIO(frames[0])).load().__dict__
    if len(frames) < 2:
        return header, None
    return header, torch.frombuffer(bytearray(frames[1]), dtype=header["dtype"]).reshape(header["shape"])


@pytest.fixture(scope="module")
def server():
    settings = test_settings(
        model="tiny-k3", sglang_address="127.0.0.1:0", sglang_push_timeout_s=PUSH_TIMEOUT_S, sglang_register_wait_s=2
    )
    with serving(settings) as server:
        yield server


@pytest.fixture
def url(server) -> str:
    return f"http://127.0.0.1:{server.service.sglang_port}"


@pytest.fixture
def pull():
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.setsockopt(zmq.RCVTIMEO, 20_000)
    yield sock, port
    context.destroy(linger=0)


def part(req_id: str, items: list, embedding_port: object = None, **extra: object) -> dict:
    return {"req_id": req_id, "num_parts": 1, "part_idx": 0, "modality": "IMAGE", "mm_items": items,
            "prefill_host": "127.0.0.1", "embedding_port": embedding_port, **extra}  # fmt: skip


def test_health_answers_at_once(url) -> None:
    started = time.monotonic()
    assert httpx.get(url + "/health").status_code == 200
    assert time.monotonic() - started < 2


def test_direct_push_carries_the_header_and_mmprocs_rows(server, url, pull) -> None:
    sock, port = pull
    reply = httpx.post(url + "/encode", json=part("r1_local_part_0", [URIS[0], {"url": URIS[1]}], port), timeout=60)
    assert reply.status_code == 200 and reply.json() is None
    header, rows = read_part(sock.recv_multipart())
    with EncoderClient(server.grpc_target) as client:
        own = client.encode(IMAGES)
    assert header["req_id"] == "r1_local_part_0" and (header["num_parts"], header["part_idx"]) == (1, 0)
    assert header["modality"] == 1 and header["error_msg"] is None  # Modality.IMAGE
    assert header["grid_dim"] == [list(r.grid_thw) for r in own]
    assert header["original_image_sizes"] == [list(r.image_size) for r in own]  # K3 frames images with them
    assert torch.equal(rows, torch.cat([r.tensor for r in own]))


def test_registered_ranks_each_get_a_copy_before_or_after_encode(url, pull) -> None:
    sock, port = pull
    other = zmq.Context().socket(zmq.PULL)
    other_port = other.bind_to_random_port("tcp://127.0.0.1")
    other.setsockopt(zmq.RCVTIMEO, 20_000)
    req_id = "r2_local_part_0"
    register = {"req_id": req_id, "receive_count": 2, "modality": "IMAGE"}
    assert (
        httpx.post(url + "/scheduler_receive_url", json={**register, "receive_url": f"127.0.0.1:{port}"}).json() is None
    )

    async def both() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            encode = asyncio.create_task(client.post(url + "/encode", json=part(req_id, [URIS[0]])))
            await asyncio.sleep(0.5)  # the second rank registers while /encode waits
            late = await client.post(
                url + "/scheduler_receive_url", json={**register, "receive_url": f"127.0.0.1:{other_port}"}
            )
            assert late.status_code == 200
            return await encode

    assert asyncio.run(both()).status_code == 200
    first, second = read_part(sock.recv_multipart()), read_part(other.recv_multipart())
    assert torch.equal(first[1], second[1]) and first[0]["req_id"] == second[0]["req_id"] == req_id
    other.close(0)


def test_registration_always_answers_200(url) -> None:
    for body in ({"req_id": 1}, [1, 2], {"req_id": "x", "receive_count": 1, "receive_url": "nowhere"}):
        reply = httpx.post(url + "/scheduler_receive_url", json=body)
        assert reply.status_code == 200 and reply.json() is None


def test_missing_registrations_time_out_with_504(url) -> None:
    started = time.monotonic()
    reply = httpx.post(url + "/encode", json=part("nobody_local_part_0", [URIS[0]]), timeout=60)
    assert reply.status_code == 504 and reply.json()["status"] == "error"
    assert 2 <= time.monotonic() - started < 10


@pytest.mark.parametrize(
    "items, says",
    [
        ([URIS[0], base64.b64encode(b"not an image").decode()], "mm_items[1]"),
        (["/etc/hosts"], "paths are not read"),
        (["http://127.0.0.1/cat.png"], "not fetched"),
        (["file:///etc/hosts"], "unsupported media scheme"),
        ([{"path": "x"}], "mm_items entries"),
    ],
)
def test_bad_media_is_400_in_sglangs_error_body(url, pull, items, says) -> None:
    _, port = pull
    reply = httpx.post(url + "/encode", json=part("bad_local_part_0", items, port), timeout=60)
    body = reply.json()
    assert reply.status_code == 400, body
    assert body["status"] == "error" and body["req_id"] == "bad_local_part_0" and says in body["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"req_id": ""}, part("x", []), part("x", [URIS[0]], modality="AUDIO"), {**part("x", [URIS[0]]), "part_idx": 1},
        part("x", [URIS[0]], 0), part("x", [URIS[0]], "5555"), part("x", [URIS[0]], 5555, prefill_host=None),
    ],
)  # fmt: skip
def test_malformed_parts_are_400(url, body) -> None:
    assert httpx.post(url + "/encode", json=body, timeout=30).status_code == 400


def test_a_dead_receiver_costs_one_timeout_and_a_counted_failure(server, url) -> None:
    started = time.monotonic()
    reply = httpx.post(url + "/encode", json=part("dead_local_part_0", [URIS[0]], free_port()), timeout=60)
    assert reply.status_code == 502 and "push failed" in reply.json()["message"]
    assert PUSH_TIMEOUT_S <= time.monotonic() - started < PUSH_TIMEOUT_S + 10
    metrics = httpx.get(server.http_url + "/metrics").text
    assert 'mmproc_sglang_pushes_total{outcome="failed"}' in metrics


# -- URL fetching (off by default; media.py) ---------------------------------------------------------------------


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/slow.png":
            time.sleep(3)
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
            return
        body = IMAGES[0] * (50 if self.path == "/big.png" else 1)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client stopped reading at its size limit
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_host():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def fetch(url: str, **config: object) -> bytes:
    base = {"enabled": True, "allow_hosts": ("127.0.0.1",), "allow_private": True, "timeout_s": 1.0}
    return asyncio.run(media_bytes(url, 0, FetchConfig(**{**base, **config})))


def test_fetching_an_allowed_host(image_host) -> None:
    assert fetch(image_host + "/cat.png") == IMAGES[0]


@pytest.mark.parametrize(
    "path, config, says",
    [
        ("/cat.png", {"allow_private": False}, "non-public address"),
        ("/cat.png", {"allow_hosts": ("images.example",)}, "allow-list"),
        ("/cat.png", {"enabled": False}, "not fetched"),
        ("/big.png", {"max_bytes": 1000}, "over 1000 bytes"),
        ("/moved.png", {}, "HTTP 302"),
        ("/slow.png", {}, "failed"),
    ],
)
def test_fetching_refuses(image_host, path, config, says) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidRequestError) as caught:
        fetch(image_host + path, **config)
    assert says in str(caught.value)
    assert time.monotonic() - started < 3  # the slow one ends at the timeout (1 s)


def test_bodies_over_the_limit_or_not_json_are_refused(url) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # declares 1 TiB, sends 2 bytes
        sock.sendall(b"POST /encode HTTP/1.1\r\nhost: x\r\ncontent-length: 1099511627776\r\n\r\n{}")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")  # refused unread
    for content in (b"not json", b"null"):
        assert httpx.post(url + "/encode", content=content).status_code == 400


def test_a_taken_sglang_address_fails_the_start_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = test_settings(sglang_address=f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(ConfigError, match="--sglang-address"):
            ServiceThread(settings).start()
