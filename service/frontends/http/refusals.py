"""Requests refused before their handler runs (a bad path, a malformed body, an oversized body, the door), each
answered in the service's error envelope with its request id, counted and logged once."""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmproc.errors import InvalidRequestError, MmprocError, Reason
from mmproc.priority import PRIORITY_HEADER, is_batch
from service.frontends.error_mapping import map_error
from service.frontends.http.gate import BodyDropped, add_header_gate
from service.frontends.request_ids import request_id_from
from service.observe.logs import REQUEST_ID_HEADER, log_access, request_context
from service.pipeline.state import ServingState

if TYPE_CHECKING:
    from service.observe.metrics import Metrics


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
    mapped, counted (in the requests of `route`, else of its path if a route of the app), logged with the
    request's id, one access line, the id echoed."""
    request_id = http_request_id(request)
    with request_context(request_id):
        mapped = map_error(exc, metrics=metrics)
        elapsed = time.perf_counter() - mark_started(request)
        log_access(
            "http", request.url.path[:200], mapped.grpc_code.name, elapsed, status=mapped.http_status,
            reason=mapped.reason,
        )  # fmt: skip
    if metrics is not None:  # every refusal is a finished request too, on its route (paths outside the app: one)
        routes = {getattr(r, "path", None) for r in request.app.routes}
        route = route or (request.url.path if request.url.path in routes else "unmatched")
        metrics.observe_request(f"http:{route}", mapped.grpc_code.name, elapsed)
    headers = {**mapped.http_headers, **(headers or {}), REQUEST_ID_HEADER: request_id}
    return JSONResponse(mapped.http_body(request_id), status_code=mapped.http_status, headers=headers)


def add_refusals(app: FastAPI, state: ServingState, metrics: Metrics, max_body_bytes: int) -> None:
    """Routing and body errors in the service's envelope; the gates that refuse from headers before the body."""

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
