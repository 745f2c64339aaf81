"""HTTP body intake, as plain ASGI middleware outside every other layer: the bytes of request bodies being read and
parsed at once are bounded, and a body must keep arriving.

- A POST whose Content-Length is over `reserve_from` reserves that many bytes of `max_bytes` before a byte of it
  is read (JSON, base64 and the decoded images of a body live until its reply is sent, ~3x its size); past the
  bound it waits up to `wait_s` for bodies ahead to finish, else 429 (cause "body_bytes") with the body dropped
  unparsed. 8 bodies of 61 MB at once held +1.3 GB before (issue 47).
- The body must arrive within `grace_s` + its length at `min_rate` bytes/s; else 408 and the connection closes.
  Before, a client that sent half a body held its connection and slot for as long as it liked.
The connection cap is uvicorn's `limit_concurrency` (service/app/server.py): 503 past it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmproc.errors import InvalidRequestError, Reason, ResourceExhaustedError
from mmproc.units import MiB
from service.frontends.http.gate import BodyDropped
from service.frontends.http.refusals import refusal


@dataclass(frozen=True)
class IntakeConfig:
    max_bytes: int = 128 * MiB  # bodies reserved at once: two of the largest (64 MiB messages)
    reserve_from: int = 1 * MiB  # smaller bodies pass without a reservation
    wait_s: float = 1.0
    grace_s: float = 10.0
    min_rate: float = 1 * MiB


class BodyTimeout(Exception):
    """The body stopped arriving."""


class ByteBudget:
    """Bytes reserved by bodies being read or handled; event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._freed = asyncio.Event()

    async def reserve(self, nbytes: int, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while self.held and self.held + nbytes > self.limit:  # one body alone always fits
            self._freed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._freed.wait(), left)
            except asyncio.TimeoutError:
                return False
        self.held += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.held -= nbytes
        self._freed.set()


class BodyIntake:
    def __init__(self, app: ASGIApp, config: IntakeConfig = IntakeConfig(), metrics: object = None) -> None:
        self.app, self.config, self.metrics = app, config, metrics
        self._budget: ByteBudget | None = None  # made on the serving loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        cfg = self.config
        deadline = time.monotonic() + cfg.grace_s + (length or 0) / cfg.min_rate
        timed = _timed_receive(receive, deadline)
        if length is None or length <= cfg.reserve_from:
            await self._guarded(scope, timed, send)
            return
        if self._budget is None:
            self._budget = ByteBudget(cfg.max_bytes)
        if not await self._budget.reserve(length, cfg.wait_s):
            exc = ResourceExhaustedError(
                f"request bodies being read are at their bound ({self._budget.held} bytes, limit {cfg.max_bytes})",
                retry_after_s=cfg.wait_s,
                cause="body_bytes",
            )
            await self._guarded(scope, timed, send, BodyDropped(refusal(Request(scope), exc, self.metrics)))
            return
        try:
            await self._guarded(scope, timed, send)
        finally:
            self._budget.release(length)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp | None = None) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await (app or self.app)(scope, receive, tracked)
        except BodyTimeout:
            if not started:  # else the reply is on its way: the connection just closes
                exc = InvalidRequestError("the request body stopped arriving", reason=Reason.BAD_REQUEST)
                response = refusal(Request(scope), exc, self.metrics)
                response.status_code = 408
                response.headers["connection"] = "close"
                await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _timed_receive(receive: Receive, deadline: float) -> Receive:
    """`receive`, bounded by `deadline` until the body is complete (then as it is: a handler waiting for the
    client to disconnect is not a body read)."""
    complete = False

    async def timed() -> Message:
        nonlocal complete
        if complete:
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise BodyTimeout from None
        if message["type"] != "http.request" or not message.get("more_body"):
            complete = True
        return message

    return timed
