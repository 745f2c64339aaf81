"""HTTP front end (FastAPI, served by uvicorn in the same process and event loop as gRPC).

GET /healthz   liveness: 200 while the process serves
GET /readyz    readiness: 200 once weights are loaded and warm-up ran, 503 before and while draining
GET /metrics   Prometheus text format (service/observe/metrics.py)
GET /v1/info   the same facts as gRPC GetServerInfo, as JSON
POST /v1/encode  (service/frontends/http/encode.py) {"images": ["<base64 or data: URI>", ...], "return_embeddings": false, "request_id": "..."}
               (+ "keys": [...] to keep each result under its key for an engine, docs/engines.md), or one raw image
               (content-type image/jpeg, image/png ...)
POST /v1/encode_video  videos (service/frontends/http/video.py)
               -> 200 {"request_id", "embeddings": [{"index", "num_tokens", "grid_hw", "grid_thw", "image_size",
                  "shape", "dtype", "sha256", "key"?, "data"?}]} or 4xx/5xx {"request_id", "error": {"code", "reason", "message", "index"?}}
               Deadline: header `x-mmproc-timeout-ms: N` (1..3600000), else the server's default_deadline_s; the
               same admission rules as gRPC (429 + Retry-After when it cannot finish in time, 504 past it).
               Priority: header `x-mmproc-priority: interactive` (the default) or `batch` (shed first).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from service.frontends.error_mapping import map_error
from service.frontends.http.encode import add_encode_route
from service.frontends.http.info_json import server_info_json
from service.frontends.http.refusals import add_refusals
from service.frontends.http.video import add_video_routes
from service.pipeline.state import ServingState


def create_http_app(state: ServingState, *, version: str, default_deadline_s: float, max_body_bytes: int) -> FastAPI:
    """The HTTP app; it answers /healthz, /readyz and /metrics from the start, the rest once the model is loaded."""
    app = FastAPI(title="mmproc", version=version, docs_url=None, redoc_url=None)
    metrics = state.metrics

    def error_response(exc: BaseException, request_id: str) -> JSONResponse:
        mapped = map_error(exc, metrics=metrics)
        return JSONResponse(mapped.http_body(request_id), status_code=mapped.http_status, headers=mapped.http_headers)

    add_refusals(app, state, metrics, max_body_bytes)

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

    add_encode_route(app, state, metrics, default_deadline_s=default_deadline_s)
    add_video_routes(app, state, default_deadline_s=default_deadline_s)  # POST /v1/encode_video
    return app
