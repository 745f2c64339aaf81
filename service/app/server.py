"""`mmproc serve`: bind gRPC + HTTP (NOT_SERVING), load and warm up the model in a thread, then SERVING;
on SIGTERM/SIGINT report NOT_SERVING first, drain in-flight work within the grace period, and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import uvicorn

import mmproc
from mmproc import thread_roles
from mmproc.errors import ConfigError
from mmproc.units import MiB
from mmproc.v1 import encoder_pb2 as pb
from service.app.build import build_pipeline, check_model_before_binding, served_as
from service.app.grpc_loop import GrpcLoop
from service.app.host_memory import limit_malloc_arenas, reuse_freed_host_memory, set_torch_threads
from service.app.settings import ServerSettings
from service.frontends.auth import BearerToken, require_bearer_token
from service.frontends.grpc.server import create_server, set_serving
from service.frontends.http.app import create_http_app
from service.frontends.http.intake import BodyIntake, IntakeConfig
from service.frontends.server_info import build_server_info
from service.observe.gc_pauses import freeze_start_up_objects
from service.observe.loop_lag import watch_loop_lag
from service.observe.metrics import Metrics
from service.pipeline.requests import RequestPipeline
from service.pipeline.state import ServingState

logger = logging.getLogger(__name__)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our event loop: signals are ours, not uvicorn's."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def _http_socket(address: str, setting: str = "http_address") -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(address_family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        flag = "--" + setting.replace("_", "-")
        raise ConfigError(f"cannot listen on {setting} {address} ({flag}): {exc.strerror or exc}") from None
    return sock


def listening_address(address: str, port: int) -> str:
    """The address as bound: a unix socket as its path, a TCP one with the port it got (port 0 picks one)."""
    if address.startswith("unix:"):
        return address
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"


T = TypeVar("T")
PipelineFactory = Callable[[ServerSettings, Metrics], RequestPipeline]


async def _in_daemon_thread(fn: Callable[[], T], name: str) -> T:
    """`fn()` on its own daemon thread: a model load still running at exit never holds the process up
    (the default executor would be joined at loop shutdown)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[object], None], value: object) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:
            outcome: tuple[Callable, object] = (future.set_exception, exc)
        else:
            outcome = (future.set_result, result)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future


class Service:
    """A running server. `start()` binds both addresses, reporting NOT_SERVING (/readyz 503), and loads the
    model in a thread; once it is loaded and warmed up, health turns SERVING (`wait_ready()`).
    `run_until_stopped()` serves until `stop()`, then drains (see `shutdown`)."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        pipeline_factory: PipelineFactory = build_pipeline,
        before_serving: Callable[[], object] | None = None,
    ) -> None:
        self.settings = settings
        self._before_serving = before_serving  # runs once the model is warm, before health turns SERVING
        self.metrics = Metrics()
        self.state = ServingState(self.metrics)
        self.metrics.ready.set_function(lambda: float(self.state.status == "ready"))
        self.metrics.track_cpu(
            lambda: [] if self.state.current is None else self.state.current.decode_pool.worker_pids()
        )
        self._pipeline_factory = pipeline_factory
        self.grpc_port = 0
        self.http_port = 0
        self._stop = asyncio.Event()
        self._loading: asyncio.Task | None = None
        self._http: _EmbeddedUvicorn | None = None
        self._http_task: asyncio.Task | None = None
        self._loop_lag: asyncio.Task | None = None
        self._grpc_loop: GrpcLoop | None = None
        self.sglang_port = 0
        self._sglang = None  # service.app.sglang_setup.SglangServer

    @property
    def pipeline(self) -> RequestPipeline:
        return self.state.pipeline()

    @property
    def info(self) -> pb.ServerInfo:
        return self.state.info()

    async def start(self) -> None:
        thread_roles.register("event_loop")  # this thread runs the loop from here on (mmproc_cpu_seconds_total)
        s = self.settings
        token = BearerToken(s.auth_token.get_secret_value()) if s.auth_token is not None else None
        # The HTTP socket first: a failure to bind either address then leaves nothing half started behind.
        sock = _http_socket(s.http_address) if s.http_address else None
        sglang_sock = None
        if s.sglang_address:
            try:
                sglang_sock = _http_socket(s.sglang_address, "sglang_address")
            except BaseException:
                if sock is not None:
                    sock.close()
                raise
        self._grpc_loop = grpc_loop = GrpcLoop(s.grpc_loop, s.event_loop)
        try:
            making = create_server(
                self.state,
                s.grpc_address,
                max_message_bytes=s.max_message_mb * MiB,
                default_deadline_s=s.default_deadline_s,
                max_connection_age_s=s.max_connection_age_s,
                auth_token=token,
                # Room for health probes and IPC session streams above the pipeline's own in-flight limit.
                max_concurrent_rpcs=2 * s.max_inflight_requests + 64,
                home=asyncio.get_running_loop() if grpc_loop.own else None,
            )
            self._grpc, self.grpc_port, self._health = await grpc_loop.run(making)
        except BaseException:
            grpc_loop.close()
            for bound in (sock, sglang_sock):
                if bound is not None:
                    bound.close()
            raise
        if sock is not None:
            self.http_port = sock.getsockname()[1]
            app = create_http_app(
                self.state,
                version=mmproc.__version__,
                default_deadline_s=s.default_deadline_s,
                max_body_bytes=s.max_message_mb * MiB,
            )
            if token is not None:
                require_bearer_token(app, token, self.metrics)
            intake = IntakeConfig(max_bytes=2 * s.max_message_mb * MiB)  # outermost: bounds what is read at once
            app.add_middleware(BodyIntake, config=intake, metrics=self.metrics)
            # log_config=None: uvicorn's lines go through ours (JSON when asked, the log's own writer thread)
            config = uvicorn.Config(
                app, log_level="warning", lifespan="off", access_log=False, log_config=None,
                limit_concurrency=s.http_max_connections,
            )  # fmt: skip
            self._http = _EmbeddedUvicorn(config)
            self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))
            while not self._http.started and not self._http_task.done():
                await asyncio.sleep(0.005)
        if sglang_sock is not None:
            await self._start_sglang(sglang_sock)
        logger.info(
            "listening: gRPC %s, HTTP %s; NOT_SERVING until the model is loaded and warmed up",
            listening_address(s.grpc_address, self.grpc_port),
            listening_address(s.http_address, self.http_port) if s.http_address else "off",
        )
        self._loading = asyncio.create_task(self._load())
        self._loop_lag = asyncio.create_task(watch_loop_lag(self.metrics.loop_lag.observe))

    async def _start_sglang(self, sock: socket.socket) -> None:
        """SGLang's encoder protocol on its own port (service/app/sglang_setup.py)."""
        from service.app.sglang_setup import start_sglang

        self._sglang = await start_sglang(self.settings, self.state, _EmbeddedUvicorn, sock)
        self.sglang_port = self._sglang.port

    async def _load(self) -> None:
        def build_and_warm_up() -> RequestPipeline:
            pipeline = self._pipeline_factory(self.settings, self.metrics)
            pipeline.start()
            return pipeline

        started = time.monotonic()
        pipeline = await _in_daemon_thread(build_and_warm_up, "mmproc-load")
        self.state.publish(pipeline, build_server_info(served_as(self.settings), pipeline))
        self.metrics.describe(self.info)
        if self.state.draining:  # stopped while loading: never report SERVING
            return
        if self._before_serving is not None:
            self._before_serving()
        await self._grpc_loop.run(set_serving(self._health, True))
        info = self.info
        s = self.settings
        logger.info(
            "serving on gRPC %s, HTTP %s: %s (%s, %s on %s) after %.1f s; transport %s",
            listening_address(s.grpc_address, self.grpc_port),
            listening_address(s.http_address, self.http_port) if s.http_address else "off",
            info.model_name,
            info.family,
            self.settings.torch_dtype_name,
            info.device,
            time.monotonic() - started,
            info.ipc_status,
        )
        logger.info(
            "mmproc %s: auth %s; decode workers %d (%s); batches up to %d patches / %d images; queue %d images; "
            "requests up to %d images, %d MiB, %d patches; CUDA graphs %d; JPEG decode on the %s; "
            "drain delay %.1f s, grace %.1f s",
            mmproc.__version__,
            "on" if s.auth_token is not None else "off",
            s.decode_workers,
            s.decode_isolation,
            self.pipeline.config.runner.max_batch_patches,
            s.max_batch_images,
            s.max_queued_images,
            s.max_images_per_request,
            s.max_request_mb,
            s.max_patches_per_request,
            s.cuda_graphs,
            "CPU" if pipeline.decode.gpu is None else "GPU",
            s.drain_delay_s,
            s.grace_period_s,
        )

    async def wait_ready(self) -> None:
        """Return once SERVING; raise what loading the model raised."""
        assert self._loading is not None, "start() first"
        await asyncio.shield(self._loading)

    def stop(self) -> None:
        self._stop.set()

    async def run_until_stopped(self) -> None:
        """Serve until stop(); drain; then re-raise a failed model load (so that `serve` exits non-zero)."""
        assert self._loading is not None, "start() first"
        stopping = asyncio.create_task(self._stop.wait())
        await asyncio.wait({stopping, self._loading}, return_when=asyncio.FIRST_COMPLETED)
        failed = self._loading.done() and not self._loading.cancelled() and self._loading.exception() is not None
        if failed:
            logger.error("loading the model failed: %s", self._loading.exception())
        else:
            await stopping
        stopping.cancel()
        await self.shutdown()
        if failed:
            raise self._loading.exception()  # type: ignore[misc]

    async def shutdown(self) -> None:
        """Drain: NOT_SERVING first, refuse new work, finish in-flight work within the grace period."""
        grace = self.settings.grace_period_s
        started = time.monotonic()
        self.state.draining = True
        await self._grpc_loop.run(self._health.enter_graceful_shutdown())
        pipeline = self.state.current
        if pipeline is not None:
            pipeline.begin_drain()
            idle = await pipeline.wait_idle(grace)
            logger.info("drained in %.2f s (%s)", time.monotonic() - started, "clean" if idle else "grace period over")
        elif self._loading is not None and not self._loading.done():
            logger.info("stopping while the model is still loading")
            self._loading.cancel()
        # Listeners stay up (NOT_SERVING, /readyz 503, new work UNAVAILABLE) until the drain delay has passed, so
        # that load balancers see the endpoint go away before any connection is refused.
        delay = self.settings.drain_delay_s - (time.monotonic() - started)
        if delay > 0:
            logger.info("draining: listeners stay up %.1f s more for load balancers to notice", delay)
            await asyncio.sleep(delay)
        # Admitted requests are done; what is left are replies on the wire and IPC session streams (which
        # never end by themselves), so the rest of the grace is short.
        await self._grpc_loop.run(self._grpc.stop(min(2.0, max(0.0, grace - (time.monotonic() - started)))))
        self._grpc_loop.close()
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            await self._http_task
        if self._sglang is not None:
            await self._sglang.stop()
        if self._loop_lag is not None:
            self._loop_lag.cancel()
        if pipeline is not None:  # a forward still running past the grace period is left to the process exit
            left = max(0.5, grace - (time.monotonic() - started))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(_in_daemon_thread(pipeline.close, "mmproc-close"), left)


async def serve(settings: ServerSettings) -> int:
    # Process-wide, so only the serving process does it; before any thread pool starts (glibc fixes the arena limit then).
    limit_malloc_arenas(settings.malloc_arena_max)
    reuse_freed_host_memory(settings.host_malloc_reuse_bytes)
    set_torch_threads(settings.torch_threads)
    check_model_before_binding(settings)
    service = Service(settings, before_serving=freeze_start_up_objects)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    with service.metrics.gc_pause:
        await service.start()
        await service.run_until_stopped()
    logger.info("stopped")
    return 0
