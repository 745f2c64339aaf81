"""Headers a client sends on every call, added by channel interceptors: the bearer token and the priority.

channel = headers_channel(grpc.insecure_channel(target), call_headers(token, priority))     # blocking
channel = grpc.aio.insecure_channel(target, interceptors=aio_headers(call_headers(...)))  # asyncio
"""

from __future__ import annotations

from collections import namedtuple

import grpc

from mmproc.priority import INTERACTIVE, PRIORITIES, PRIORITY_HEADER

_DETAILS_FIELDS = ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")


class _Details(namedtuple("_Details", _DETAILS_FIELDS), grpc.ClientCallDetails):
    pass


def call_headers(token: str | None = None, priority: str = INTERACTIVE) -> tuple[tuple[str, str], ...]:
    """The headers for a client's calls: the bearer token (if any), the priority when it is not the default."""
    headers = []
    if token is not None:
        if not token or token != token.strip():
            raise ValueError("token must be a non-empty string without surrounding spaces")
        headers.append(("authorization", f"Bearer {token}"))
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
    if priority != INTERACTIVE:
        headers.append((PRIORITY_HEADER, priority))
    return tuple(headers)


def _shown(headers: tuple[tuple[str, str], ...]) -> str:  # never show the secret
    return ", ".join(f"{k}: {'****' if k == 'authorization' else v}" for k, v in headers)


class _HeadersInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        self._headers = headers

    def _details(self, details: grpc.ClientCallDetails) -> _Details:
        metadata = [*(details.metadata or ()), *self._headers]
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

    def __repr__(self) -> str:
        return f"HeadersInterceptor({_shown(self._headers)})"


def headers_channel(channel: grpc.Channel, headers: tuple[tuple[str, str], ...]) -> grpc.Channel:
    """`channel` adding `headers` to every call; `channel` itself when there are none."""
    return grpc.intercept_channel(channel, _HeadersInterceptor(headers)) if headers else channel


class _AioHeaders:
    """Adds the headers to a grpc.aio call; one subclass per call kind (grpc.aio files it under its first)."""

    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        self._headers = headers

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()), *self._headers)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_shown(self._headers)})"


class _AioUnaryUnary(_AioHeaders, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioHeaders, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioHeaders, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _AioStreamStream(_AioHeaders, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


def aio_headers(headers: tuple[tuple[str, str], ...]) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for `grpc.aio.insecure_channel(..., interceptors=...)`; none when there are no headers."""
    kinds = (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
    return [kind(headers) for kind in kinds] if headers else []
