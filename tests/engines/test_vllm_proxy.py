"""The OpenAI proxy for `vllm serve` (mmproc.engines.vllm_proxy) against the in-process tiny mmproc and a stand-in
upstream (httpx's MockTransport): what it forwards, and the reasons it returns. With a real `vllm serve`:
test_vllm_serve_e2e.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from mmproc.client import EncoderClient
from mmproc.engines.vllm import content_key
from mmproc.engines.vllm_chat import ProxyConfig, explain
from mmproc.engines.vllm_proxy import create_app
from mmproc.errors import UnknownKeyError
from tests.support.common import free_port
from tests.support.media_samples import make_image_bytes

IMAGE = make_image_bytes(100, 80, fmt="PNG", seed=1)
URI = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
REPLY = {"choices": [{"message": {"content": "w1 w2"}, "finish_reason": "length"}]}


class Upstream:
    """Stands in for `vllm serve` (and an image host): records what it was sent; `status` 500 plays a failure."""

    def __init__(self, status: int = 200, stream: list[str] | None = None) -> None:
        self.status, self.stream, self.sent = status, stream, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "images.example":
            return httpx.Response(200, content=IMAGE) if request.url.path == "/a.png" else httpx.Response(404)
        if request.method == "GET":
            return httpx.Response(200, json={"data": [{"id": "k25"}]} if request.url.path == "/v1/models" else {})
        self.sent.append(json.loads(request.content))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "Internal server error", "code": 500}})
        if self.stream is not None:
            return httpx.Response(200, text="".join(f"data: {e}\n\n" for e in self.stream))
        return httpx.Response(200, json=REPLY)


def proxy(target: str, upstream: Upstream, **config) -> TestClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    app = create_app(ProxyConfig(upstream="http://vllm.example", target=target, **config), http=http)
    return TestClient(app)


def chat(url: str, stream: bool = False) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w3"}]
    return {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream}


def test_images_are_kept_and_forwarded_with_their_keys(tiny_server) -> None:
    upstream = Upstream()
    with proxy(tiny_server.grpc_target, upstream) as client:
        reply = client.post("/v1/chat/completions", json=chat(URI))
        assert reply.status_code == 200 and reply.json() == REPLY
        by_url = client.post("/v1/chat/completions", json=chat("http://images.example/a.png"))
        assert by_url.status_code == 200
        metrics = client.get("/metrics").text
        assert client.get("/v1/models").json() == {"data": [{"id": "k25"}]}
        assert client.get("/health").status_code == 200
    keys = [sent["messages"][0]["content"][0]["uuid"] for sent in upstream.sent]
    assert all(key.startswith(content_key(IMAGE) + "-") for key in keys) and keys[0] != keys[1]  # fresh per request
    for sent in upstream.sent:
        assert sent["messages"][0]["content"][0]["image_url"]["url"] == URI  # a URL's image goes on as the same bytes
    with EncoderClient(tiny_server.grpc_target) as mm:
        assert all(kept.num_tokens > 0 for kept in mm.lookup(keys))
    assert 'mmproc_vllm_proxy_requests_total{outcome="ok"} 2.0' in metrics
    assert 'mmproc_vllm_proxy_images_total{route="mmproc"} 2.0' in metrics


def test_an_image_mmproc_refuses_is_a_400_with_its_reason_before_vllm_sees_it(tiny_server) -> None:
    upstream = Upstream()
    bad = "data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode()
    with proxy(tiny_server.grpc_target, upstream) as client:
        reply = client.post("/v1/chat/completions", json=chat(bad))
        missing = client.post("/v1/chat/completions", json=chat("http://images.example/nothing.png"))
    assert reply.status_code == 400 and upstream.sent == []
    error = reply.json()["error"]
    assert error["code"] == "invalid_image" and error["message"].startswith("mmproc refused image 0: ")
    assert missing.status_code == 400 and "answered HTTP 404" in missing.json()["error"]["message"]
    with proxy(tiny_server.grpc_target, upstream, max_image_bytes=100) as client:
        for url in (URI, "http://images.example/a.png"):
            reply = client.post("/v1/chat/completions", json=chat(url))
            assert reply.status_code == 400 and "image 0: over 100 bytes" in reply.json()["error"]["message"]
    with proxy(tiny_server.grpc_target, upstream, fetch_urls=False) as client:
        reply = client.post("/v1/chat/completions", json=chat("http://images.example/a.png"))
        assert reply.status_code == 400 and "data: URIs only" in reply.json()["error"]["message"]
    assert upstream.sent == []


def test_vllm_failures_come_back_with_mmproc_s_reason(tiny_server) -> None:
    with proxy(tiny_server.grpc_target, Upstream(status=500)) as client:
        reply = client.post("/v1/chat/completions", json=chat(URI))
    assert reply.status_code == 500
    assert "vLLM failed the request: mmproc holds every image" in reply.json()["error"]["message"]

    events = [json.dumps({"choices": [{"delta": {"content": "w1"}}]}), json.dumps({"error": {"code": 500}}), "[DONE]"]
    with proxy(tiny_server.grpc_target, Upstream(stream=events)) as client:
        body = client.post("/v1/chat/completions", json=chat(URI, stream=True)).text
    lines = [line for line in body.splitlines() if line]
    assert lines[0] == f"data: {events[0]}" and lines[-1] == "data: [DONE]"
    assert "vLLM failed the request: mmproc holds every image" in json.loads(lines[1][6:])["error"]["message"]


def test_explain_names_the_images_mmproc_no_longer_holds() -> None:
    class Keeper:
        async def lookup(self, keys, *, timeout=None):
            if keys[0] == "gone":
                raise UnknownKeyError("no result")
            return [object()]

    why = asyncio.run(explain(Keeper(), ["kept", "gone", "gone"], ProxyConfig()))
    assert why.startswith("mmproc no longer holds image 1 (key gone): expired or evicted")


def test_an_unreachable_mmproc_is_a_503_at_once_or_a_counted_fallback() -> None:
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    upstream = Upstream()
    with proxy(target, upstream) as client:
        start = time.monotonic()
        reply = client.post("/v1/chat/completions", json=chat(URI))
        assert time.monotonic() - start < 10
    assert reply.status_code == 503 and upstream.sent == []
    assert reply.json()["error"]["message"].startswith(f"mmproc at {target} is unreachable")
    with proxy(target, upstream, fallback=True) as client:
        assert client.post("/v1/chat/completions", json=chat(URI)).status_code == 200
        assert 'mmproc_vllm_proxy_images_total{route="vllm_fallback"} 1.0' in client.get("/metrics").text
    assert upstream.sent[0]["messages"][0]["content"][0]["uuid"].startswith(content_key(IMAGE))


@pytest.mark.parametrize("body", [[1, 2], {"messages": "x"}])
def test_malformed_requests_are_400s(tiny_server, body) -> None:
    with proxy(tiny_server.grpc_target, Upstream()) as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 400


def test_a_body_over_the_limit_is_a_413_unread(tiny_server) -> None:
    with proxy(tiny_server.grpc_target, Upstream(), max_body_bytes=1000) as client:
        reply = client.post("/v1/chat/completions", json=chat(URI))
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
