"""HTTP front end (FastAPI, served by uvicorn in the same process and event loop as gRPC).

GET /healthz   liveness: 200 while the process serves
GET /readyz    readiness: 200 once weights are loaded and warm-up ran, 503 before and while draining
GET /metrics   Prometheus text format (service/observe/metrics.py)
GET /v1/info   the same facts as gRPC GetServerInfo, as JSON
POST /v1/encode  {"images": ["<base64 or data: URI>", ...], "return_embeddings": false, "request_id": "..."}
               (+ "keys": [...] to keep each result under its key for an engine, docs/engines.md)
POST /v1/encode_video  videos (service/frontends/http/video.py)
               -> 200 {"request_id", "embeddings": [{"index", "num_tokens", "grid_hw", "grid_thw", "image_size",
                  "shape", "dtype", "sha256", "key"?, "data"?}]} or 4xx/5xx {"request_id", "error": {"code", "reason", "message", "index"?}}
               Deadline: header `x-mmproc-timeout-ms: N` (1..3600000), else the server's default_deadline_s; the
               same admission rules as gRPC (429 + Retry-After when it cannot finish in time, 504 past it).
               Priority: header `x-mmproc-priority: interactive` (the default) or `batch` (shed first).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from http import HTTPStatus
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmproc.errors import InvalidRequestError, MmprocError, Reason
from mmproc.priority import BATCH, PRIORITY_HEADER, is_batch
from mmproc.transport.serialized.staging import DTYPE_NAMES
from service.frontends.error_mapping import map_error
from service.frontends.http.disconnect import client_closed, unless_disconnected
from service.frontends.http.gate import BodyDropped, add_header_gate
from service.frontends.http.info_json import server_info_json
from service.frontends.http.reply import held_reply
from mmproc.wire.serialized import serialized_payloads
from service.frontends.request_ids import request_id_from
from service.observe.logs import REQUEST_ID_HEADER, log_access, request_context
from mmproc.wire.results import EncodedImage
from service.pipeline.state import ServingState

if TYPE_CHECKING:
    from service.observe.metrics import Metrics

TIMEOUT_HEADER = "x-mmproc-timeout-ms"  # the client's deadline, as gRPC's grpc-timeout carries it
MAX_TIMEOUT_MS = 3_600_000


def request_budget_s(value: str | None, default_s: float) -> float:
    """Seconds the request may take: the timeout header (whole milliseconds), else `default_s`."""
    if value is None:
        return default_s
    text = value.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_TIMEOUT_MS:
        raise InvalidRequestError(
            f"{TIMEOUT_HEADER} must be whole milliseconds in 1..{MAX_TIMEOUT_MS}, got {value!r}",
            reason=Reason.BAD_REQUEST,
        )
    return int(text) / 1000


def priority_fields(request: Request) -> dict[str, str]:
    """The access line's note of batch work (the header was checked at the door: a bad value never gets here)."""
    return {"priority": BATCH} if is_batch(request.headers.get(PRIORITY_HEADER)) else {}


class EncodeBody(BaseModel):
    images: list[str] = Field(..., description="base64 strings or data: URIs")
    return_embeddings: bool = False
    request_id: str | None = None
    keys: list[str] | None = Field(None, description="one per image: keep each result under it (docs/engines.md)")
    cache_bypass: bool = Field(False, description="neither look up nor keep in the embedding cache (docs/cache.md)")


def decode_image_field(value: str, index: int) -> bytes:
    """base64 (standard or URL-safe) or `data:<mime>;base64,<...>` -> bytes; InvalidRequestError otherwise."""
    payload = value
    if value.startswith("data:"):
        header, sep, payload = value.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequestError("data: URI must be base64-encoded", reason=Reason.BAD_REQUEST, index=index)
    payload = payload.strip()
    try:
        if "-" in payload or "_" in payload:
            return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("image is not valid base64", reason=Reason.BAD_REQUEST, index=index) from None


ENCODE_ROUTES = frozenset({"/v1/encode", "/v1/encode_video"})  # the routes that take work to the door
REQUEST_ID_KEY = "mmproc.request_id"  # where the request's id is kept in the ASGI scope, for every layer to use
STARTED_KEY = "mmproc.started"  # perf_counter() when the outermost middleware saw the request: its latency's start


def mark_started(request: Request) -> float:
    return request.scope.setdefault(STARTED_KEY, time.perf_counter())


def http_request_id(request: Request) -> str:
    """The request's id, the same for the middlewares, handlers and error handlers: the client's x-request-id
    when it is a sane one, else a new one."""
    if REQUEST_ID_KEY not in request.scope:
        request.scope[REQUEST_ID_KEY] = request_id_from(header=request.headers.get(REQUEST_ID_HEADER))
    return request.scope[REQUEST_ID_KEY]


def refusal(
    request: Request,
    exc: BaseException,
    metrics: Metrics | None,
    headers: dict[str, str] | None = None,
    *,
    route: str | None = None,
) -> JSONResponse:
    """The error response for a request refused before its handler ran (auth, body size, body shape, the door):
    mapped, counted (in the requests of `route` too, one of the app's own), logged with the request's id, one
    access line, the id echoed."""
    request_id = http_request_id(request)
    with request_context(request_id):
        mapped = map_error(exc, metrics=metrics)
        elapsed = time.perf_counter() - mark_started(request)
        log_access(
            "http", request.url.path[:200], mapped.grpc_code.name, elapsed, status=mapped.http_status,
            reason=mapped.reason,
        )  # fmt: skip
    if metrics is not None and route is not None:
        metrics.observe_request(f"http:{route}", mapped.grpc_code.name, elapsed)
    headers = {**mapped.http_headers, **(headers or {}), REQUEST_ID_HEADER: request_id}
    return JSONResponse(mapped.http_body(request_id), status_code=mapped.http_status, headers=headers)


def encode_reply(request_id: str, results: list[EncodedImage], with_data: bool) -> JSONResponse:
    """The 200 reply of /v1/encode, rendered (payload bytes, their sha256, base64 if asked, the JSON text)."""
    payloads = serialized_payloads(results)
    embeddings = [embedding_json(r, data, with_data) for r, data in zip(results, payloads)]
    return JSONResponse({"request_id": request_id, "embeddings": embeddings})


def embedding_json(result: EncodedImage, data: bytes, with_data: bool) -> dict[str, object]:
    item: dict[str, object] = {
        "index": result.index,
        "num_tokens": result.num_tokens,
        "grid_hw": list(result.grid_hw),
        "grid_thw": [1, *result.grid_hw],
        "image_size": list(result.image_size),
        "shape": list(result.embedding.shape),
        "dtype": DTYPE_NAMES[result.embedding.dtype],
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if result.key:
        item["key"] = result.key
    if result.cache:
        item["cache"] = result.cache
        item["mm_hash"] = result.mm_hash
    if with_data:
        item["data"] = base64.b64encode(data).decode("ascii")
    return item


def create_http_app(state: ServingState, *, version: str, default_deadline_s: float, max_body_bytes: int) -> FastAPI:
    """The HTTP app; it answers /healthz, /readyz and /metrics from the start, the rest once the model is loaded."""
    app = FastAPI(title="mmproc", version=version, docs_url=None, redoc_url=None)
    metrics = state.metrics

    def error_response(exc: BaseException, request_id: str) -> JSONResponse:
        mapped = map_error(exc, metrics=metrics)
        return JSONResponse(mapped.http_body(request_id), status_code=mapped.http_status, headers=mapped.http_headers)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths and methods answer in the service's envelope too, not FastAPI's {"detail": ...}.
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        error = {"code": HTTPStatus(exc.status_code).name, "reason": reason, "message": str(exc.detail)}
        request_id = http_request_id(request)
        headers = {**(exc.headers or {}), REQUEST_ID_HEADER: request_id}
        return JSONResponse({"request_id": request_id, "error": error}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return refusal(
            request, InvalidRequestError(f"malformed request body: {problems}", reason=Reason.BAD_REQUEST), metrics
        )

    def limit_body(request: Request) -> JSONResponse | None:
        # Refuse oversized bodies from the declared length before reading them (base64 inflates by 4/3).
        mark_started(request)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            exc = InvalidRequestError(f"request body over {max_body_bytes} bytes", reason=Reason.REQUEST_TOO_LARGE)
            return refusal(request, exc, metrics)
        if length is None and request.method in ("POST", "PUT", "PATCH"):  # chunked: no size to check up front
            exc = InvalidRequestError("a Content-Length header is required", reason=Reason.BAD_REQUEST)
            return refusal(request, exc, metrics)
        return None

    def check_door(request: Request) -> BodyDropped | None:
        # Refusals that depend on nothing in the request (a standing queue, the in-flight limit, draining) come
        # from its headers: parsing a refused body's JSON and base64 cost the event loop more than the refusal.
        if request.method != "POST" or request.url.path not in ENCODE_ROUTES:
            return None
        try:
            state.pipeline().check_door(sheddable=is_batch(request.headers.get(PRIORITY_HEADER)))
        except MmprocError as exc:
            return BodyDropped(refusal(request, exc, metrics, route=request.url.path))
        return None

    add_header_gate(app, check_door)
    add_header_gate(app, limit_body)  # runs first: an oversized body is refused unread

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        status = state.status
        return JSONResponse({"status": status}, status_code=200 if status == "ready" else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/info")
    async def server_info() -> JSONResponse:
        try:
            return JSONResponse(server_info_json(state.info()))
        except Exception as exc:
            return error_response(exc, "-")

    @app.post("/v1/encode")
    async def encode(body: EncodeBody, request: Request) -> Response:
        started = mark_started(request)
        request_id = request_id_from(body.request_id) if body.request_id else http_request_id(request)
        with request_context(request_id):
            work = encode_request(body, request_id, request.headers.get(TIMEOUT_HEADER))
            outcome = await unless_disconnected(work, request.receive)
            if outcome is None:  # the client left: its work was cancelled
                outcome = "CANCELLED", client_closed(metrics), {}
            code, response, fields = outcome
            elapsed = time.perf_counter() - started
            log_access("http", "/v1/encode", code, elapsed, images=len(body.images), status=response.status_code,
                       **fields, **priority_fields(request))  # fmt: skip
        metrics.observe_request("http:/v1/encode", code, elapsed)
        response.headers[REQUEST_ID_HEADER] = request_id
        return response

    async def encode_request(
        body: EncodeBody, request_id: str, timeout: str | None
    ) -> tuple[str, Response, dict[str, str]]:
        try:
            deadline = time.monotonic() + request_budget_s(timeout, default_deadline_s)
            pipeline = state.pipeline()
            pipeline.check_image_count(len(body.images))  # before decoding any base64
            images = [decode_image_field(value, i) for i, value in enumerate(body.images)]
            if body.keys is not None:
                results = await pipeline.encode_keyed(images, body.keys, request_id, deadline)
            else:
                results = await pipeline.encode(images, request_id, deadline, cache=not body.cache_bypass)
            with_data = body.return_embeddings  # rendered off the loop: a 1024² K2.5 reply is ~20 MB to copy and hash
            response = await held_reply(
                pipeline, deadline, results, with_data, lambda: encode_reply(request_id, results, with_data)
            )
        except Exception as exc:
            mapped = map_error(exc, metrics=metrics)
            response = JSONResponse(
                mapped.http_body(request_id), status_code=mapped.http_status, headers=mapped.http_headers
            )
            return mapped.grpc_code.name, response, {"reason": mapped.reason}
        fields = {"cache": ",".join(r.cache for r in results)} if any(r.cache for r in results) else {}
        return "OK", response, fields

    from service.frontends.http.video import add_video_routes  # imports this module's helpers

    add_video_routes(app, state, default_deadline_s=default_deadline_s)  # POST /v1/encode_video
    return app
