"""Where the gRPC front end runs: its own loop and thread ("own"), hopping to the main loop only for the pipeline,
or the main loop ("shared"). Why: grpc.aio takes calls in one loop turn each (docs/reliability.md, "Overload")."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from mmproc import thread_roles
from service.app import event_loop
from service.frontends.grpc.loop_hop import run_on

T = TypeVar("T")
logger = logging.getLogger(__name__)


class GrpcLoop:
    """The loop the gRPC server lives on; `run(coro)` runs `coro` there (the server's own calls must)."""

    def __init__(self, choice: str, loop_kind: str) -> None:
        """choice: "own" or "shared"; loop_kind: the `event_loop` setting (the own loop is of the same kind)."""
        self.own = choice == "own"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if self.own:
            self._loop = event_loop.new_loop(loop_kind)
            self._thread = threading.Thread(target=self._serve, name="mmproc-grpc", daemon=True)
            self._thread.start()
        logger.info("gRPC front end on %s", "an event loop of its own" if self.own else "the main event loop")

    def _serve(self) -> None:
        """The thread's work, its CPU time counted as `grpc_loop` (thread_cpu.py; gRPC's core threads stay `other`)."""
        assert self._loop is not None
        thread_roles.register("grpc_loop")
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return await run_on(self._loop, coro)

    def close(self) -> None:
        """Stop the own loop once the server on it has stopped (nothing left on it is awaited)."""
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()
