"""An HTTP handler's work, cancelled when its client disconnects (Starlette never cancels a handler): a caller that
gave up gets no more decode, encoder or reply work spent on it, as a cancelled gRPC call does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from starlette.responses import Response
from starlette.types import Receive

if TYPE_CHECKING:
    from service.observe.metrics import Metrics

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's "client closed request": logged and counted; nobody receives it


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> T | None:
    """`work`'s result, or None once the client has disconnected first (`work` is then cancelled and waited for,
    so that it has given back what it held). Call after the body has been read: from then on the server's next
    ASGI message is the disconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself was cancelled (shutdown): so is its work
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait((task,))
    return None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def client_closed(metrics: Metrics) -> Response:
    """What a handler whose client left answers (nobody reads it), counted as the gRPC front end counts a
    cancellation."""
    metrics.rejections.labels("cancelled").inc()
    return Response(status_code=CLIENT_CLOSED)
