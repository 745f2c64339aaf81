"""The event loop the server runs on: uvloop where installed (`event_loop = "auto"`, as uvicorn's `--loop auto`),
else asyncio's own. Every request passes through the loop once or more (admission, refusal, reply); on the H200 at
3 x overload of 448² images uvloop halved the refusal p99 (1276 -> 692 ms) and served 9% more in time
(docs/benchmarks/overload.md, session 8). grpc.aio and uvicorn both run on it."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from mmproc.errors import ConfigError

T = TypeVar("T")
logger = logging.getLogger(__name__)


def resolve(choice: str) -> str:
    """ "asyncio" or "uvloop" for a setting of auto, asyncio or uvloop; ConfigError for uvloop when not installed."""
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not installed:
        raise ConfigError("event_loop=uvloop, but uvloop is not installed (pip install uvloop)")
    return "uvloop" if choice == "uvloop" or (choice == "auto" and installed) else "asyncio"


def new_loop(choice: str) -> asyncio.AbstractEventLoop:
    """A new event loop of the kind `choice` resolves to (for a thread of its own)."""
    if resolve(choice) == "asyncio":
        return asyncio.new_event_loop()
    import uvloop

    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """asyncio.run(main) on the loop `choice` resolves to."""
    loop = resolve(choice)
    logger.info("event loop: %s", loop)
    if loop == "asyncio":
        return asyncio.run(main)
    import uvloop

    return uvloop.run(main)
