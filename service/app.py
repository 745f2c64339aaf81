"""`mmproc serve`: build the engine from settings, run gRPC + HTTP, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time

import torch
import uvicorn

import mmproc
from mmproc.model import VisionEncoder, load_encoder
from mmproc.preprocess import PreprocessConfig, load_preprocess_config
from mmproc.v1 import encoder_pb2 as pb
from service.convert import DTYPE_TO_PB
from service.engine import Engine, RequestLimits
from service.grpc_server import create_server, set_serving
from service.http_app import create_http_app
from service.ipc_setup import setup_ipc
from service.settings import MiB, ServerSettings

logger = logging.getLogger(__name__)


def load_model(settings: ServerSettings) -> tuple[VisionEncoder, PreprocessConfig]:
    dtype = getattr(torch, settings.torch_dtype_name)
    encoder = load_encoder(settings.model_path, preset=settings.model, device=settings.device, dtype=dtype)
    if settings.model_path is not None:
        preprocess = load_preprocess_config(settings.model_path)
    elif encoder.config.layout == "kimi_k25":
        preprocess = PreprocessConfig.kimi_k25()
    else:
        preprocess = PreprocessConfig.kimi_vl()
    return encoder, preprocess


def build_engine(settings: ServerSettings) -> Engine:
    encoder, preprocess = load_model(settings)
    engine = Engine(
        encoder,
        preprocess,
        settings.media_limits(),
        RequestLimits(
            max_images=settings.max_images_per_request,
            max_request_bytes=settings.max_request_mb * MiB,
            max_patches=settings.max_patches_per_request,
        ),
        settings.runner_config(),
        preprocess_workers=settings.preprocess_workers,
        max_inflight_requests=settings.max_inflight_requests,
    )
    engine.ipc_status = setup_ipc(settings, engine)
    return engine


def build_server_info(settings: ServerSettings, engine: Engine) -> pb.ServerInfo:
    encoder, pre, media, req = engine.encoder, engine.preprocess, engine.media_limits, engine.request_limits
    cfg = encoder.config
    return pb.ServerInfo(
        version=mmproc.__version__,
        model_name=cfg.name,
        model_layout=cfg.layout,
        hidden_size=encoder.output_dim,
        vision_hidden_size=cfg.hidden_size,
        dtype=DTYPE_TO_PB[settings.torch_dtype_name],
        device=str(encoder.device),
        preprocess=pb.PreprocessInfo(
            family=pre.family,
            patch_size=pre.patch_size,
            merge_h=pre.merge_kernel_size[0],
            merge_w=pre.merge_kernel_size[1],
            max_patches_per_image=pre.max_patches_per_image,
            rules={k: json.dumps(v) for k, v in pre.to_public_dict().items()},
        ),
        limits=pb.RequestLimits(
            max_image_bytes=media.max_image_bytes,
            max_pixels=media.max_pixels,
            max_images_per_request=req.max_images,
            max_request_bytes=req.max_request_bytes,
            max_patches_per_request=req.max_patches,
            max_aspect_ratio=media.max_aspect_ratio,
            formats=sorted(media.allowed_formats),
        ),
        transports=[pb.TRANSPORT_SERIALIZED] + ([pb.TRANSPORT_IPC] if engine.pool is not None else []),
        ipc_status=engine.ipc_status,
        max_message_bytes=settings.max_message_mb * MiB,
        stream_chunk_bytes=settings.stream_chunk_mb * MiB,
    )


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our event loop: signals are ours, not uvicorn's."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def _http_socket(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    return sock


class Service:
    """A running server. `start()` binds both addresses; `run_until_stopped()` serves until `stop()`."""

    def __init__(self, settings: ServerSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.info = build_server_info(settings, engine)
        self.grpc_port = 0
        self.http_port = 0
        self._stop = asyncio.Event()
        self._http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task | None = None

    async def start(self) -> None:
        s = self.settings
        self._grpc, self.grpc_port, self._health = await create_server(
            self.engine, self.info, s.grpc_address, default_deadline_s=s.default_deadline_s
        )
        if s.http_address:
            sock = _http_socket(s.http_address)
            self.http_port = sock.getsockname()[1]
            app = create_http_app(
                self.engine, self.info, default_deadline_s=s.default_deadline_s, max_body_bytes=s.max_message_mb * MiB
            )
            config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
            self._http = _EmbeddedUvicorn(config)
            self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))
        await asyncio.get_running_loop().run_in_executor(None, self.engine.start)
        await set_serving(self._health, True)
        logger.info(
            "serving %s (%s, %s on %s): gRPC %s (port %d), HTTP %s, transport %s",
            self.info.model_name,
            self.info.model_layout,
            s.torch_dtype_name,
            self.info.device,
            s.grpc_address,
            self.grpc_port,
            f"port {self.http_port}" if s.http_address else "off",
            self.info.ipc_status,
        )

    def stop(self) -> None:
        self._stop.set()

    async def run_until_stopped(self) -> None:
        await self._stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Drain: NOT_SERVING first, refuse new work, finish in-flight work within the grace period."""
        grace = self.settings.grace_period_s
        started = time.monotonic()
        await self._health.enter_graceful_shutdown()
        self.engine.begin_drain()
        idle = await self.engine.wait_idle(grace)
        logger.info("drained in %.2f s (%s)", time.monotonic() - started, "clean" if idle else "grace period over")
        # Admitted requests are done; what is left are replies on the wire and IPC session streams (which
        # never end by themselves), so the rest of the grace is short.
        await self._grpc.stop(min(2.0, max(0.0, grace - (time.monotonic() - started))))
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            await self._http_task
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close)


async def serve(settings: ServerSettings) -> int:
    engine = build_engine(settings)
    service = Service(settings, engine)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    await service.start()
    await service.run_until_stopped()
    logger.info("stopped")
    return 0


def configure_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)
