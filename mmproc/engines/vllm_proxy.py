"""An OpenAI-compatible front for `vllm serve` with the mmproc connector: `mmproc-vllm-proxy`.

    mmproc-vllm-proxy --upstream http://127.0.0.1:8000 --mmproc 127.0.0.1:50051 --port 8001

POST /v1/chat/completions (streaming or not): the request's images are kept in mmproc, the request goes on to
`vllm serve` with each image part's `uuid` set to its key (mmproc.engines.vllm_chat), and vLLM's answer comes back
unchanged. When vLLM fails the request (its answer is a bare 500 or an error event in the stream), the proxy asks
mmproc why and says so. GET /v1/models and /health pass through; GET /metrics has the proxy's counters.
No vLLM is imported here. docs/engines.md has the whole set-up.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest

from mmproc.client import AsyncEncoderClient
from mmproc.engines.vllm_chat import Keeper, ProxyConfig, ProxyError, explain, prepare

logger = logging.getLogger(__name__)
_FORWARDED_HEADERS = ("authorization", "x-request-id")


def create_app(config: ProxyConfig, *, keeper: Keeper | None = None, http: httpx.AsyncClient | None = None) -> FastAPI:
    """keeper / http: mmproc's client and the HTTP client (tests pass their own); made here otherwise."""
    registry = CollectorRegistry()
    requests = Counter("mmproc_vllm_proxy_requests", "Chat requests by outcome", ["outcome"], registry=registry)
    images = Counter("mmproc_vllm_proxy_images", "Images of chat requests, by route", ["route"], registry=registry)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["keeper"] = keeper or AsyncEncoderClient(config.target, token=config.token)
        state["http"] = http or httpx.AsyncClient(timeout=config.upstream_timeout_s)
        try:
            yield
        finally:
            if keeper is None:
                await state["keeper"].close()
            if http is None:
                await state["http"].aclose()

    app = FastAPI(title="mmproc vLLM proxy", lifespan=lifespan)

    def error(exc: ProxyError) -> JSONResponse:
        requests.labels(exc.code).inc()
        logger.warning("chat request refused (%d %s): %s", exc.status, exc.code, exc.message)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def upstream_failed(status: int, keys: list[str]) -> ProxyError:
        why = await explain(state["keeper"], keys, config) if keys else "see vLLM's log"
        return ProxyError(status if status >= 500 else 502, f"vLLM failed the request: {why}", "upstream_error")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = json.loads(await _read_body(request, config.max_body_bytes))
        except ProxyError as exc:
            return error(exc)
        except ValueError:
            return error(ProxyError(400, "the body is not JSON", "bad_request"))
        if not isinstance(body, dict):
            return error(ProxyError(400, "the body is not a JSON object", "bad_request"))
        try:
            prepared = await prepare(body, state["keeper"], state["http"], config)
        except ProxyError as exc:
            return error(exc)
        images.labels("vllm_fallback" if prepared.fallback else "mmproc").inc(len(prepared.keys))
        keys = [] if prepared.fallback else prepared.keys
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        url = config.upstream.rstrip("/") + "/v1/chat/completions"
        upstream = state["http"].build_request("POST", url, json=prepared.body, headers=headers)
        try:
            reply = await state["http"].send(upstream, stream=bool(prepared.body.get("stream")))
        except httpx.HTTPError as exc:
            return error(ProxyError(503, f"vLLM at {config.upstream} is unreachable: {type(exc).__name__}", "upstream"))
        if not prepared.body.get("stream") or reply.status_code != 200:
            content = await reply.aread()
            await reply.aclose()
            if reply.status_code >= 500:
                return error(await upstream_failed(reply.status_code, keys))
            requests.labels("ok" if reply.status_code == 200 else "upstream_refused").inc()
            return Response(content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))
        requests.labels("stream").inc()
        return StreamingResponse(relay(reply, keys), media_type="text/event-stream")

    async def relay(reply: httpx.Response, keys: list[str]) -> AsyncIterator[str]:
        """vLLM's events as they come; an error event (vLLM failed the request mid-stream) gets mmproc's reason."""
        try:
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and '"error"' in line:
                    event = json.loads(line[len("data: ") :])
                    if isinstance(event, dict) and "error" in event:
                        failure = await upstream_failed(int(event["error"].get("code") or 500), keys)
                        requests.labels("stream_" + failure.code).inc()
                        line = "data: " + json.dumps(failure.body())
                yield line + "\n"
        except httpx.HTTPError as exc:  # the 200 is sent: the break can only be told as an event
            requests.labels("stream_broken").inc()
            failure = ProxyError(502, f"vLLM's stream broke: {type(exc).__name__}", "upstream")
            yield "data: " + json.dumps(failure.body()) + "\n\n"
        finally:
            await reply.aclose()

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        reply = await state["http"].get(config.upstream.rstrip("/") + "/v1/models", headers=headers)
        return Response(reply.content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))

    @app.get("/health")
    async def health() -> Response:
        try:
            reply = await state["http"].get(config.upstream.rstrip("/") + "/health", timeout=5.0)
        except httpx.HTTPError:
            return Response(status_code=503)
        return Response(status_code=reply.status_code)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused past `limit` bytes (a declared length is refused before reading)."""
    too_large = ProxyError(413, f"the request is over the proxy's {limit} bytes", "request_too_large")
    if int(request.headers.get("content-length") or 0) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mmproc-vllm-proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", default=ProxyConfig.upstream, help="vllm serve's base URL")
    parser.add_argument("--mmproc", default=ProxyConfig.target, help="mmproc's gRPC address (HOST:PORT | unix:PATH)")
    parser.add_argument("--mmproc-token", default=None, help="mmproc's auth_token, if it has one")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument(
        "--fallback",
        action="store_true",
        help="mmproc unreachable: forward anyway (vLLM encodes; needs the connector's fallback_to_vllm)",
    )
    parser.add_argument("--no-url-images", action="store_true", help="take images as data: URIs only")
    parser.add_argument("--max-image-bytes", type=int, default=ProxyConfig.max_image_bytes)
    args = parser.parse_args(argv)
    config = ProxyConfig(
        upstream=args.upstream,
        target=args.mmproc,
        token=args.mmproc_token,
        fallback=args.fallback,
        fetch_urls=not args.no_url_images,
        max_image_bytes=args.max_image_bytes,
    )
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
