"""POST /v1/encode: images as base64 or data: URIs in JSON, or one image as the raw body (content-type image/jpeg,
image/png ...), the reply's embeddings as JSON (data in base64 on request)."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, ValidationError

from mmproc.transport.serialized.staging import DTYPE_NAMES
from mmproc.wire.results import EncodedImage
from mmproc.wire.serialized import serialized_payloads
from service.frontends.error_mapping import map_error
from service.frontends.http.disconnect import client_closed, unless_disconnected
from service.frontends.http.reply import held_reply
from service.observe.logs import REQUEST_ID_HEADER, log_access, request_context
from service.pipeline.state import ServingState

if TYPE_CHECKING:
    from service.observe.metrics import Metrics


from service.frontends.http.fields import TIMEOUT_HEADER, decode_image_field, priority_fields, request_budget_s
from service.frontends.http.refusals import http_request_id, mark_started
from service.frontends.request_ids import request_id_from


class EncodeBody(BaseModel):
    images: list[str] = Field(..., description="base64 strings or data: URIs")
    return_embeddings: bool = False
    request_id: str | None = None
    keys: list[str] | None = Field(None, description="one per image: keep each result under it (docs/engines.md)")
    cache_bypass: bool = Field(False, description="neither look up nor keep in the embedding cache (docs/cache.md)")


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


# A body of one of these types is one image, its bytes as they are (no base64); the same checks and limits.
RAW_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif", "image/bmp", "image/tiff"})
_JSON_OR_RAW = {"requestBody": {"content": {
    "application/json": {"schema": EncodeBody.model_json_schema()},
    **{t: {"schema": {"type": "string", "format": "binary"}} for t in sorted(RAW_IMAGE_TYPES)},
}}}  # fmt: skip


async def encode_body(request: Request) -> tuple[EncodeBody, bytes | None]:
    """The JSON body, or (a raw image body) defaults and the image's bytes; a bad JSON body is FastAPI's
    RequestValidationError, answered like any other malformed body."""
    content_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type in RAW_IMAGE_TYPES:  # options in the query: ?return_embeddings=true
        with_data = request.query_params.get("return_embeddings", "").lower() in ("1", "true")
        return EncodeBody(images=[], return_embeddings=with_data), await request.body()
    try:
        return EncodeBody.model_validate_json(await request.body()), None
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def add_encode_route(app: FastAPI, state: ServingState, metrics: Metrics, *, default_deadline_s: float) -> None:
    @app.post("/v1/encode", openapi_extra=_JSON_OR_RAW)
    async def encode(request: Request) -> Response:
        started = mark_started(request)
        body, raw = await encode_body(request)
        request_id = request_id_from(body.request_id) if body.request_id else http_request_id(request)
        images = len(body.images) if raw is None else 1
        with request_context(request_id):
            work = encode_request(body, raw, request_id, request.headers.get(TIMEOUT_HEADER))
            outcome = await unless_disconnected(work, request.receive)
            if outcome is None:  # the client left: its work was cancelled
                outcome = "CANCELLED", client_closed(metrics), {}
            code, response, fields = outcome
            elapsed = time.perf_counter() - started
            log_access("http", "/v1/encode", code, elapsed, images=images, status=response.status_code,
                       **fields, **priority_fields(request))  # fmt: skip
        metrics.observe_request("http:/v1/encode", code, elapsed)
        response.headers[REQUEST_ID_HEADER] = request_id
        return response

    async def encode_request(
        body: EncodeBody, raw: bytes | None, request_id: str, timeout: str | None
    ) -> tuple[str, Response, dict[str, object]]:
        try:
            deadline = time.monotonic() + request_budget_s(timeout, default_deadline_s)
            pipeline = state.pipeline()
            pipeline.check_image_count(len(body.images) if raw is None else 1)  # before decoding any base64
            images = [decode_image_field(value, i) for i, value in enumerate(body.images)] if raw is None else [raw]
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
        fields: dict[str, object] = {"tokens": sum(r.num_tokens for r in results), "transport": "json"}
        if any(r.cache for r in results):
            fields["cache"] = ",".join(r.cache for r in results)
        return "OK", response, fields
