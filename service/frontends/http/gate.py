"""Checks on a request's headers, before its body is read, as plain ASGI middleware (BaseHTTPMiddleware's task
group per request cost the loop: docs/benchmarks/overload.md)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Check = Callable[[Request], ASGIApp | None]  # the refusal to send, or None to let the request in


class HeaderGate:
    def __init__(self, app: ASGIApp, check: Check) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = self.check(Request(scope))
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyDropped:
    """A refusal sent after the body was read and dropped (closing with unread bytes resets the socket and may
    lose the refusal); a client waiting for `100 Continue` is answered at once."""

    def __init__(self, response: Response) -> None:
        self.response = response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not any(name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"]):
            while (await receive()).get("more_body"):  # ends on the last chunk, or on http.disconnect
                pass
        await self.response(scope, receive, send)


def add_header_gate(app: FastAPI, check: Check) -> None:
    """Run `check` on every HTTP request ahead of what is already there (the last gate added runs first)."""
    app.add_middleware(HeaderGate, check=check)
