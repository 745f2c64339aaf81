"""Client side of the optional shared-secret token (server: `service/frontends/auth.py`): channel interceptors that add
`authorization: Bearer <token>` to every call of a channel, so that no call site has to remember it.

    channel = bearer_channel(grpc.insecure_channel(target), token)               # blocking
    channel = grpc.aio.insecure_channel(target, interceptors=aio_bearer(token))  # asyncio
"""

from __future__ import annotations

from collections import namedtuple

import grpc

_DETAILS_FIELDS = ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")


class _Details(namedtuple("_Details", _DETAILS_FIELDS), grpc.ClientCallDetails):
    pass


def _header(token: str) -> tuple[str, str]:
    if not token or token != token.strip():
        raise ValueError("token must be a non-empty string without surrounding spaces")
    return ("authorization", f"Bearer {token}")


class _BearerInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, token: str) -> None:
        self._header = _header(token)

    def _details(self, details: grpc.ClientCallDetails) -> _Details:
        metadata = [*(details.metadata or ()), self._header]
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def __repr__(self) -> str:  # never show the secret
        return "BearerInterceptor(****)"


def bearer_channel(channel: grpc.Channel, token: str | None) -> grpc.Channel:
    """`channel` adding the bearer token to every call; `channel` itself when `token` is None."""
    return channel if token is None else grpc.intercept_channel(channel, _BearerInterceptor(token))


class _AioBearer:
    """Adds the header to a grpc.aio call's details. grpc.aio files an interceptor under the first call kind
    it implements only, so each kind gets its own subclass below."""

    def __init__(self, token: str) -> None:
        self._header = _header(token)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()), self._header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    def __repr__(self) -> str:  # never show the secret
        return f"{type(self).__name__}(****)"


class _AioUnaryUnary(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _AioStreamStream(_AioBearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def aio_bearer(token: str | None) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for `grpc.aio.insecure_channel(..., interceptors=...)`; empty when `token` is None."""
    kinds = (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
    return [] if token is None else [kind(token) for kind in kinds]
