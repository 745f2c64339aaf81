"""HTTP video route, added to the app of service/frontends/http/app.py:

POST /v1/encode_video  {"videos": [{"data": "<base64 or data: URI>", "fps"?: 2.0, "num_frames"?: 8}, ...],
                        "return_embeddings": false, "request_id": "..."}
               -> 200 {"request_id", "videos": [{"index", "num_tokens", "frame_indices", "fps", "size",
                  "chunks": [{"index", "timestamp_s", "num_tokens", "grid_thw", "shape", "dtype", "sha256",
                  "data"?}]}]} or the error envelope of /v1/encode.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from mmproc.wire.serialized import serialized_payloads
from service.frontends.error_mapping import map_error
from service.frontends.grpc.video import video_pipeline
from service.frontends.http.disconnect import client_closed, unless_disconnected
from service.frontends.http.fields import TIMEOUT_HEADER, decode_image_field, priority_fields, request_budget_s
from service.frontends.http.reply import held_reply
from service.frontends.replies_video import all_chunks, video_json
from service.frontends.request_ids import request_id_from
from service.observe.logs import REQUEST_ID_HEADER, log_access, request_context
from service.pipeline.state import ServingState
from service.pipeline.videos import EncodedVideo, VideoItem


class VideoField(BaseModel):
    data: str = Field(..., description="base64 string or data: URI of the file")
    fps: float | None = None
    num_frames: int | None = None


class EncodeVideoBody(BaseModel):
    videos: list[VideoField]
    return_embeddings: bool = False
    request_id: str | None = None


def video_reply(request_id: str, videos: list[EncodedVideo], with_data: bool) -> JSONResponse:
    """The 200 reply of /v1/encode_video, rendered."""
    payloads = serialized_payloads(all_chunks(videos))
    out, at = [], 0
    for video in videos:
        out.append(video_json(video, payloads[at : at + len(video.chunks)], with_data))
        at += len(video.chunks)
    return JSONResponse({"request_id": request_id, "videos": out})


def add_video_routes(app: FastAPI, state: ServingState, *, default_deadline_s: float) -> None:
    metrics = state.metrics

    @app.post("/v1/encode_video")
    async def encode_video(body: EncodeVideoBody, request: Request) -> Response:
        started = time.perf_counter()
        request_id = request_id_from(body.request_id, request.headers.get(REQUEST_ID_HEADER))
        with request_context(request_id):
            outcome = await unless_disconnected(
                _encode(body, request_id, request.headers.get(TIMEOUT_HEADER)), request.receive
            )
            if outcome is None:  # the client left: its work was cancelled
                outcome = "CANCELLED", client_closed(metrics)
            code, response = outcome
            elapsed = time.perf_counter() - started
            log_access("http", "/v1/encode_video", code, elapsed, images=len(body.videos), status=response.status_code,
                       **priority_fields(request))  # fmt: skip
        metrics.observe_request("http:/v1/encode_video", code, elapsed)
        response.headers[REQUEST_ID_HEADER] = request_id
        return response

    async def _encode(body: EncodeVideoBody, request_id: str, timeout: str | None) -> tuple[str, Response]:
        try:
            deadline = time.monotonic() + request_budget_s(timeout, default_deadline_s)
            pipeline = state.pipeline()
            service = video_pipeline(pipeline)
            service.check_request([VideoItem(b"", v.fps, v.num_frames) for v in body.videos])  # before any base64
            items = [VideoItem(decode_image_field(v.data, i), v.fps, v.num_frames) for i, v in enumerate(body.videos)]
            videos = await service.encode(items, request_id, deadline)
            with_data = body.return_embeddings  # rendered off the loop: copying, hashing and rendering megabytes
            response = await held_reply(
                pipeline, deadline, all_chunks(videos), with_data, lambda: video_reply(request_id, videos, with_data)
            )
        except Exception as exc:
            mapped = map_error(exc, metrics=metrics)
            body_json = mapped.http_body(request_id)
            return mapped.grpc_code.name, JSONResponse(
                body_json, status_code=mapped.http_status, headers=mapped.http_headers
            )
        return "OK", response
