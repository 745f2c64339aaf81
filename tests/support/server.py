"""An in-process server (gRPC + HTTP on port 0, the tiny preset on the CPU) for the tests that talk to one.

Imported by the tests and folder conftests that need it (never by the root conftest: unit tests do not load the
service). `tiny_server` is the shared module-scoped fixture; a folder's conftest re-exports it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from mmproc.batching import pack_images
from mmproc.media import decode_image
from mmproc.preprocess import preprocess_image
from service.app.build import build_pipeline
from service.app.config_sources import load_settings
from service.app.configs import decode_config
from service.app.server import PipelineFactory, Service
from service.app.settings import ServerSettings
from service.pipeline.decode.pool import DecodePool
from tests.support.common import wait_until
from tests.support.decode_faults import misbehaving_task


class ServiceThread:
    """Runs `Service` on its own event loop in a background thread, like `mmproc serve` does."""

    def __init__(
        self, settings: ServerSettings, *, pipeline_factory: PipelineFactory = build_pipeline, wait_ready: bool = True
    ) -> None:
        self.settings = settings
        self._pipeline_factory = pipeline_factory
        self._wait_ready = wait_ready  # False: start() returns once both ports listen (NOT_SERVING)
        self.service: Service | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="test-service", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self.service = Service(self.settings, pipeline_factory=self._pipeline_factory)
            await self.service.start()
            if self._wait_ready:
                await self.service.wait_ready()
            self._started.set()
            await self.service.run_until_stopped()

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._started.set()

    def start(self) -> ServiceThread:
        self._thread.start()
        self._started.wait(120)
        if self._error is not None:
            raise self._error
        return self

    @property
    def grpc_target(self) -> str:
        assert self.service is not None
        return f"127.0.0.1:{self.service.grpc_port}"

    @property
    def http_url(self) -> str:
        assert self.service is not None
        return f"http://127.0.0.1:{self.service.http_port}"

    def on_loop(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the service's event loop (soon, from this thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)

    def begin_stop(self) -> None:
        """Ask the service to stop (drain, then exit) without waiting for it, as SIGTERM does."""
        if self._loop is not None and self.service is not None:
            self._loop.call_soon_threadsafe(self.service.stop)

    def stop(self, timeout: float = 60) -> None:
        if not self._thread.is_alive():
            return
        self.begin_stop()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "service did not stop"


def test_settings(**overrides: object) -> ServerSettings:
    values: dict[str, object] = {
        "grpc_address": "127.0.0.1:0",
        "http_address": "127.0.0.1:0",
        "grace_period_s": 10,
        "drain_delay_s": 0,  # tests stop servers often; test_lifecycle checks the delay itself
    }
    values.update(overrides)
    return load_settings(None, **values)


test_settings.__test__ = False  # a helper, not a test


@contextlib.contextmanager
def serving(
    settings: ServerSettings | None = None, *, pipeline_factory: PipelineFactory = build_pipeline
) -> Iterator[ServiceThread]:
    """A started `ServiceThread` (default: `test_settings()`), stopped on exit."""
    server = ServiceThread(settings or test_settings(), pipeline_factory=pipeline_factory).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[ServiceThread]:
    with serving() as server:
        yield server


def settle(server: ServiceThread, timeout: float = 10.0) -> None:
    """Wait until no request is in flight and the runner queue is empty; fail if that never happens."""
    pipeline = server.service.pipeline
    if not wait_until(lambda: pipeline.inflight == 0 and pipeline.queued_images == 0, timeout, interval=0.01):
        raise AssertionError(f"not idle: inflight={pipeline.inflight}, queued={pipeline.queued_images}")


def wait_inflight(server: ServiceThread, timeout: float = 10.0, interval: float = 0.001) -> None:
    """Wait (at most `timeout` s) until the engine has admitted a request; the caller asserts what it needs."""
    pipeline = server.service.pipeline
    wait_until(lambda: pipeline.inflight != 0, timeout, interval)


def misbehaving_pipeline(settings, metrics):
    """The normal engine, its decode workers running `misbehaving_task` (tests/support/decode_faults.py: crashes,
    hangs, slow decodes on their magic bytes)."""
    pipeline = build_pipeline(settings, metrics)
    pipeline.decode.pool.close()
    pipeline.decode.pool = DecodePool(
        pipeline.media_limits, pipeline.preprocess, decode_config(settings), task=misbehaving_task
    )
    return pipeline


def reference_embeddings(server: ServiceThread, images: list[bytes]) -> list[torch.Tensor]:
    """The images through the library directly, one per forward (no server, no batching): what replies must equal."""
    pipeline = server.service.pipeline
    out = []
    for data in images:
        pre = preprocess_image(decode_image(data, pipeline.media_limits).image, pipeline.preprocess)
        with torch.inference_mode():
            out.append(pipeline.encoder(pack_images([pre])).clone())
    return out
