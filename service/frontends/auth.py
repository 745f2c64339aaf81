"""Optional shared-secret bearer token for gRPC and HTTP, compared in constant time and never logged; probes,
health and reflection stay open (docs/reliability.md). A shared secret, not transport security: put TLS in front."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mmproc.errors import UnauthenticatedError
from service.frontends.error_mapping import end_call, map_error, to_grpc_status
from service.frontends.http.gate import add_header_gate
from service.frontends.http.refusals import mark_started, refusal

if TYPE_CHECKING:
    from service.observe.metrics import Metrics

OPEN_GRPC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
OPEN_HTTP_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # deny by default: every other path needs it
_MESSAGE = "missing or wrong bearer token in the authorization metadata/header"


class BearerToken:
    """The expected `authorization` value, compared in constant time."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty token")
        self._expected = f"Bearer {token}".encode()

    def matches(self, value: str | bytes | None) -> bool:
        if value is None:
            return False
        given = value.encode("utf-8", "replace") if isinstance(value, str) else value
        return hmac.compare_digest(given, self._expected)

    def __repr__(self) -> str:  # never show the secret
        return "BearerToken(****)"


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every RPC but health and reflection unless its metadata carries the bearer token."""

    def __init__(self, token: BearerToken, metrics: Metrics | None = None) -> None:
        self._token = token
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_GRPC_PREFIXES):
            return handler
        metadata = details.invocation_metadata or ()
        if self._token.matches(next((value for key, value in metadata if key == "authorization"), None)):
            return handler
        return self._refusal(handler)

    def _refusal(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """A handler of the same kind that refuses at once; requests are left as raw bytes (never parsed)."""

        async def refuse(request: object, context: grpc.aio.ServicerContext) -> None:
            mapped = map_error(UnauthenticatedError(_MESSAGE), metrics=self._metrics)
            end_call(context, to_grpc_status(mapped))

        async def refuse_stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
            await refuse(request, context)
            return
            yield  # an async generator, as stream handlers (and the interceptors around them) expect

        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(refuse, None, serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(refuse_stream, None, serializer)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(refuse, None, serializer)
        return grpc.stream_stream_rpc_method_handler(refuse_stream, None, serializer)


def require_bearer_token(app: FastAPI, token: BearerToken, metrics: Metrics | None = None) -> None:
    """HTTP: 401 (`WWW-Authenticate: Bearer`) without the token, on every path but the probes'."""

    def check_token(request: Request) -> JSONResponse | None:
        mark_started(request)
        if request.scope["path"] not in OPEN_HTTP_PATHS and not token.matches(request.headers.get("authorization")):
            return refusal(request, UnauthenticatedError(_MESSAGE), metrics, {"www-authenticate": "Bearer"})
        return None

    add_header_gate(app, check_token)
