"""A grpc.aio interceptor for the Encoder service: every RPC runs with its request id in the logging context
(one is made up, and written into the request, when the client sent none), and is counted and timed by
method and final status code in the Service's metrics. Health and reflection RPCs pass through untouched.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc

from service.logs import new_request_id, request_context
from service.metrics import Metrics


def _final_code(context: grpc.aio.ServicerContext, failed: bool) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "UNKNOWN" if failed else "OK"


class ObserveInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics, service_name: str) -> None:
        self._metrics = metrics
        self._prefix = f"/{service_name}/"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        method = details.method.removeprefix(self._prefix)
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request, context):
                with self._observed(method, request, context):
                    return await inner_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request, context):
                with self._observed(method, request, context):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler  # streaming requests (the IPC session): not counted per message

    @contextlib.contextmanager
    def _observed(self, method: str, request: object, context: grpc.aio.ServicerContext) -> Iterator[None]:
        request_id = getattr(request, "request_id", None)
        if request_id == "":  # a field the client left empty: name the request for every log line
            request_id = request.request_id = new_request_id()  # type: ignore[attr-defined]
        started = time.perf_counter()
        failed = False
        with request_context(request_id or new_request_id()):
            try:
                yield
            except BaseException:
                failed = True
                raise
            finally:
                self._metrics.observe_request(method, _final_code(context, failed), time.perf_counter() - started)
