"""Shared fixtures: an in-process server (gRPC + HTTP on port 0) running the tiny preset on the CPU."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import torch

from service.process.app import EngineFactory, Service, build_engine
from service.process.settings import ServerSettings, load_settings


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


class ServiceThread:
    """Runs `Service` on its own event loop in a background thread, like `mmproc serve` does."""

    def __init__(
        self, settings: ServerSettings, *, engine_factory: EngineFactory = build_engine, wait_ready: bool = True
    ) -> None:
        self.settings = settings
        self._engine_factory = engine_factory
        self._wait_ready = wait_ready  # False: start() returns once both ports listen (NOT_SERVING)
        self.service: Service | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="test-service", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self.service = Service(self.settings, engine_factory=self._engine_factory)
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

    def stop(self, timeout: float = 60) -> None:
        if not self._thread.is_alive():
            return
        if self._loop is not None and self.service is not None:
            self._loop.call_soon_threadsafe(self.service.stop)
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


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[ServiceThread]:
    server = ServiceThread(test_settings()).start()
    yield server
    server.stop()
