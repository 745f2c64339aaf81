"""HTTP replies within the reply byte budget, resized to the rendered body, given back once it is sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from mmproc.wire.results import EncodedImage
from service.pipeline.reply_budget import ReplyHold

if TYPE_CHECKING:
    from service.pipeline.requests import RequestPipeline

FIELDS_BYTES = 1024  # an item's JSON fields besides its data: shape, grid, sha256, key, ... (an upper estimate)


def json_reply_bytes(results: list[EncodedImage], with_data: bool) -> int:
    """What rendering a reply holds at most: its payload bytes, or its body when larger (base64: 4 chars per 3 bytes)."""
    sizes = [r.embedding.nbytes for r in results]
    if not with_data:
        return sum(sizes)
    return sum(max(n, 4 * -(-n // 3) + FIELDS_BYTES) for n in sizes)


class HeldReply(Response):
    """A rendered JSON reply that gives its budget back once sent, on every path (uvicorn's last send waits for
    the write buffer to drain)."""

    media_type = "application/json"

    def __init__(self, body: bytes, held: ReplyHold) -> None:
        super().__init__(body)
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.body = b""  # the body's last reference goes before its bytes go back to the budget
            self._held.release()


async def held_reply(
    pipeline: RequestPipeline,
    deadline: float,
    results: list[EncodedImage],
    with_data: bool,
    render: Callable[[], JSONResponse],
) -> HeldReply:
    """`render()` off the loop within the reply budget (waited for until `deadline`), held until sent."""
    held = await pipeline.delivery.reply_bytes(json_reply_bytes(results, with_data), deadline, len(results))
    try:
        with pipeline.metrics.time_stage("transport"):
            body = (await held.off_loop(render)).body
        held.resize(len(body))
        return HeldReply(body, held)
    except BaseException:
        held.release()
        raise
