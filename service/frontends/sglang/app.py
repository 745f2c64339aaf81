"""SGLang 0.5.23's encoder protocol (EPD: a `--language-only` server with `--encoder-urls http://...`), on its own
port. docs/engines.md has the command lines; SGLang's side is srt/disaggregation/encoder/ (receiver.py).

POST /encode                 one part: {req_id, num_parts, part_idx, modality, mm_items, prefill_host, embedding_port,
                             ...}; encodes the images, pushes header + rows to every destination, answers 200 `null`,
                             or {"status": "error", "message", "req_id"}: 400 bad media, 502 a push failed, 504 the TP
                             ranks did not all register in time, the service's own codes otherwise (429, 503, 500)
POST /scheduler_receive_url  {req_id, receive_count, receive_url, modality}: a TP rank's PULL address; always 200
                             (an error there would reach SGLang's user as 502 instead of the /encode's own status)
GET  /health                 200 once the model is warm, 503 before and while draining; never does work (SGLang
                             drops an encoder URL whose /health takes over 2 s)

Destinations: `embedding_port` null -> the registered receive URLs (zmq_to_scheduler), waiting for `receive_count`
of them; an int (or list) -> `prefill_host:port` (zmq_to_tokenizer). No auth: bind it to the cluster network.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import Counter

from mmproc.errors import DeadlineExceededError, InvalidRequestError, Reason, ResourceExhaustedError
from mmproc.prompt import FRAMINGS
from service.frontends.error_mapping import map_error
from service.frontends.sglang.header import PartHeader, encode_header
from service.frontends.sglang.media import FetchConfig, media_bytes
from service.frontends.sglang.push import Pusher, Registrations, tcp_endpoint
from service.observe.logs import log_access, request_context
from service.pipeline.state import ServingState

logger = logging.getLogger(__name__)

METHOD = "sglang:/encode"


@dataclass(frozen=True)
class SglangConfig:
    push_timeout_s: float = 10.0  # one destination's push
    register_wait_s: float = 30.0  # how long /encode waits for the TP ranks' receive URLs
    max_registrations: int = 4096  # receive URLs kept for parts not yet encoded (oldest dropped)
    max_parts: int = 256  # /encode calls in progress (encoded rows wait here for registrations); past it: 429
    max_body_bytes: int = 64 << 20  # an /encode body (base64 media inflates by 4/3); past it: 413, unread
    deadline_s: float = 60.0  # an /encode's budget in the pipeline
    fetch: FetchConfig = field(default_factory=FetchConfig)


class DeliveryError(Exception):
    """The part was encoded but did not reach every destination: 502 (504 when ranks never registered)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_part(body: object) -> dict:
    """The fields SGLang's encoder checks (its runtime.validate_encode_request), as a 400."""

    def bad(message: str) -> InvalidRequestError:
        return InvalidRequestError(message, reason=Reason.BAD_REQUEST)

    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    if not isinstance(body.get("req_id"), str) or not body["req_id"]:
        raise bad("missing or invalid req_id")
    if str(body.get("modality", "IMAGE")).upper() != "IMAGE":
        raise bad(f"unsupported modality {body.get('modality')!r}: this encoder takes images")
    items = body.get("mm_items")
    if not isinstance(items, list) or not items:
        raise bad("missing or empty mm_items")
    num_parts, part_idx = body.get("num_parts"), body.get("part_idx")
    if type(num_parts) is not int or num_parts <= 0:
        raise bad("num_parts must be a positive integer")
    if type(part_idx) is not int or not 0 <= part_idx < num_parts:
        raise bad(f"part_idx must be in [0, {num_parts})")
    return body


async def read_json(request: Request, limit: int) -> object:
    """The body as JSON, read only up to `limit` bytes (413 past it, 400 if it is not JSON)."""
    length = request.headers.get("content-length")
    too_large = InvalidRequestError(f"request body over {limit} bytes", reason=Reason.REQUEST_TOO_LARGE)
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body)
    except ValueError:
        raise InvalidRequestError("the body is not JSON", reason=Reason.BAD_REQUEST) from None


def direct_endpoints(body: dict) -> list[str] | None:
    """zmq_to_tokenizer's `prefill_host:embedding_port` (or a list of ports); None: use the registrations."""
    ports = body.get("embedding_port")
    if ports is None:
        return None
    ports = ports if isinstance(ports, list) else [ports]
    host = body.get("prefill_host")
    try:
        if not isinstance(host, str) or not ports or not all(type(p) is int for p in ports):
            raise ValueError("embedding_port needs prefill_host and integer ports")
        return [tcp_endpoint(f"{host}:{port}") for port in ports]
    except ValueError as exc:
        raise InvalidRequestError(str(exc), reason=Reason.BAD_REQUEST) from None


class SglangEncoder:
    """The handlers' state: the serving state, the registrations, the pusher."""

    def __init__(self, state: ServingState, config: SglangConfig) -> None:
        self.state = state
        self.config = config
        self.registrations = Registrations(config.max_registrations, ttl_s=config.register_wait_s + config.deadline_s)
        self.pusher = Pusher(config.push_timeout_s)
        self.parts = 0  # /encode calls in progress
        # on the service's registry, beside its own metrics (/metrics shows it)
        self.pushes = Counter(
            "mmproc_sglang_pushes", "Pushes of a part to one SGLang receiver, by outcome (ok | failed).",
            ["outcome"], registry=state.metrics.registry,
        )  # fmt: skip

    async def encode(self, body: dict) -> None:
        part = check_part(body)
        if self.parts >= self.config.max_parts:
            raise ResourceExhaustedError(f"{self.parts} parts in progress", retry_after_s=1.0, cause="sglang_parts")
        self.parts += 1
        try:
            await self._encode(part)
        finally:
            self.parts -= 1

    async def _encode(self, part: dict) -> None:
        pipeline = self.state.pipeline()
        items = part["mm_items"]
        pipeline.check_image_count(len(items))
        direct = direct_endpoints(part)  # a bad destination is a 400 before any work
        images = list(await asyncio.gather(*(media_bytes(x, i, self.config.fetch) for i, x in enumerate(items))))
        deadline = time.monotonic() + self.config.deadline_s
        results = await pipeline.encode(images, part["req_id"], deadline)
        # (sum tokens_i, hidden) in item order, row-major on the CPU; off the loop (a device-to-host copy)
        rows = await asyncio.to_thread(lambda: torch.cat([r.embedding for r in results]).to("cpu").contiguous())
        family = pipeline.encoder.config.family
        frame = FRAMINGS.get(family)
        sized = frame is not None and "{width}" in frame.image_header  # K3 frames each image with its size
        header = PartHeader(
            req_id=part["req_id"],
            num_parts=part["num_parts"],
            part_idx=part["part_idx"],
            grids=[(1, *r.grid_hw) for r in results],
            shape=tuple(rows.shape),
            dtype=rows.dtype,
            original_image_sizes=[list(r.image_size) for r in results] if sized else None,
        )
        await self.deliver(part["req_id"], direct, [encode_header(header), rows.view(torch.uint8).numpy().data])

    async def deliver(self, req_id: str, direct: list[str] | None, frames: list[object]) -> None:
        if direct is None:
            urls, expected = await self.registrations.wait(req_id, self.config.register_wait_s)
            self.registrations.forget(req_id)
            endpoints = [tcp_endpoint(url) for url in urls]
            if not expected or len(urls) < expected:
                await self._push_all(endpoints, frames, req_id)  # the ranks that did register still get theirs
                raise DeliveryError(
                    f"{len(urls)} of {expected or '?'} receivers registered within {self.config.register_wait_s:g} s",
                    504,
                )
        else:
            endpoints = direct
        failed = await self._push_all(endpoints, frames, req_id)
        if failed:
            raise DeliveryError(f"push failed for {len(failed)} of {len(endpoints)} receivers: {failed[0]}", 502)

    async def _push_all(self, endpoints: list[str], frames: list[object], req_id: str) -> list[str]:
        outcomes = await asyncio.gather(*(self.pusher.push(e, frames) for e in endpoints), return_exceptions=True)
        failed = []
        for endpoint, outcome in zip(endpoints, outcomes):
            if isinstance(outcome, BaseException):
                logger.warning("push of %s to %s failed: %s", req_id, endpoint, outcome)
                failed.append(str(outcome))
            self.pushes.labels("failed" if isinstance(outcome, BaseException) else "ok").inc()
        return failed

    def register(self, body: object) -> None:
        """A TP rank's receive URL; malformed ones are logged and dropped (the reply is 200 regardless)."""
        if not isinstance(body, dict):
            logger.warning("scheduler_receive_url: body is not an object; ignored")
            return
        req_id, url, count = body.get("req_id"), body.get("receive_url"), body.get("receive_count")
        try:
            tcp_endpoint(url if isinstance(url, str) else "")
        except ValueError:
            logger.warning("scheduler_receive_url %r: bad receive_url %r; ignored", req_id, url)
            return
        if not isinstance(req_id, str) or type(count) is not int or not 0 < count <= 1024:
            logger.warning("scheduler_receive_url %r: bad req_id or receive_count %r; ignored", req_id, count)
            return
        self.registrations.register(req_id, url, count)


def error_reply(exc: BaseException, req_id: object, metrics: object) -> tuple[str, JSONResponse]:
    """SGLang's error body; the status from the service's one mapping, delivery failures 502/504."""
    if isinstance(exc, DeliveryError):
        logger.warning("delivery of %s failed: %s", req_id, exc)
        code, status, message = ("DEADLINE_EXCEEDED" if exc.status == 504 else "UNAVAILABLE"), exc.status, str(exc)
    else:
        if isinstance(exc, asyncio.TimeoutError):
            exc = DeadlineExceededError("the encode timed out")
        mapped = map_error(exc, metrics=metrics)  # type: ignore[arg-type]
        code, status, message = mapped.grpc_code.name, mapped.http_status, mapped.message
        if mapped.index >= 0:
            message = f"mm_items[{mapped.index}]: {message}"
    body = {"status": "error", "message": message, "req_id": req_id if isinstance(req_id, str) else None}
    return code, JSONResponse(body, status_code=status)


def create_sglang_app(state: ServingState, config: SglangConfig) -> tuple[FastAPI, SglangEncoder]:
    app = FastAPI(title="mmproc-sglang", docs_url=None, redoc_url=None, openapi_url=None)
    encoder = SglangEncoder(state, config)
    metrics = state.metrics

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if state.status == "ready" else 503)

    @app.post("/scheduler_receive_url")
    async def scheduler_receive_url(request: Request) -> JSONResponse:
        try:
            body = await read_json(request, 64 << 10)
        except InvalidRequestError:
            body = None
        encoder.register(body)
        return JSONResponse(None)

    @app.post("/encode")
    async def encode(request: Request) -> JSONResponse:
        started = time.perf_counter()
        try:
            body = await read_json(request, config.max_body_bytes)
        except InvalidRequestError as exc:
            body = exc  # answered below, in the request's log context
        req_id = body.get("req_id") if isinstance(body, dict) else None
        with request_context(req_id if isinstance(req_id, str) else "-"):
            try:
                if isinstance(body, Exception):
                    raise body
                await encoder.encode(body)  # type: ignore[arg-type]
                code, response = "OK", JSONResponse(None)
            except Exception as exc:
                code, response = error_reply(exc, req_id, metrics)
            elapsed = time.perf_counter() - started
            items = body.get("mm_items") if isinstance(body, dict) else None
            log_access("sglang", "/encode", code, elapsed, status=response.status_code,
                       images=len(items) if isinstance(items, list) else 0)  # fmt: skip
        metrics.observe_request(METHOD, code, elapsed)
        return response

    return app, encoder
