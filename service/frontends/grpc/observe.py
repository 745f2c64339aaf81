"""A grpc.aio interceptor for the Encoder service: each RPC gets its request id (sent back as trailing metadata:
initial metadata costs a send of its own), metrics by method and code, and one access line. A call the client
ended counts as the code it saw and leaves quietly, not as gRPC's ExecuteBatchError traceback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar

import grpc
from google.protobuf.message import DecodeError

from mmproc.errors import InvalidRequestError, Reason
from service.frontends.error_mapping import end_call, map_error, to_grpc_status
from service.frontends.request_ids import request_id_from
from service.observe.logs import REQUEST_ID_HEADER, log_access, request_context
from service.observe.metrics import Metrics

_OUTCOME: ContextVar[dict | None] = ContextVar("mmproc_access_outcome", default=None)

try:  # what sending on a call the core already ended raises (grpc.aio has no public name for it)
    from grpc._cython.cygrpc import ExecuteBatchError as _SendFailed
except ImportError:  # pragma: no cover - another grpc build: only the cancellation is recognised
    _SendFailed = asyncio.CancelledError

CALL_OVER = (asyncio.CancelledError, _SendFailed)


# the server's deadline trails the client's by the transit: a cancellation this close is the deadline firing
DEADLINE_SLACK_S = 0.1


def call_over_code(context: grpc.aio.ServicerContext) -> str:
    """The code a client whose call ended under us saw: DEADLINE_EXCEEDED at (or just before) its deadline."""
    remaining = context.time_remaining()
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= DEADLINE_SLACK_S else "CANCELLED"


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
        deserialize = handler.request_deserializer  # called here: a message that does not parse is a 400, not UNKNOWN
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(raw, context):
                request = parsed(raw, deserialize)
                with self._observed(method, request, context) as outcome:
                    if request is None:
                        return self._unparsed(context)
                    response = await inner_unary(request, context)
                    remaining = context.time_remaining()
                    if remaining is not None and remaining <= 0:  # a reply now would race the core closing the call
                        raise asyncio.CancelledError  # counted as the client saw it: DEADLINE_EXCEEDED
                    outcome.update(_reply_fields(response))
                    return response

            return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(raw, context):
                request = parsed(raw, deserialize)
                with self._observed(method, request, context):
                    if request is None:
                        self._unparsed(context)
                        return
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(stream, None, handler.response_serializer)
        return handler  # streaming requests (the IPC session): not counted per message

    def _unparsed(self, context: grpc.aio.ServicerContext) -> None:
        """End a call whose message did not parse (a string field's bad UTF-8, a cut message) as INVALID_ARGUMENT."""
        exc = InvalidRequestError(
            "the request is not a valid protobuf message of its method", reason=Reason.BAD_REQUEST
        )
        mapped = map_error(exc, metrics=self._metrics)
        note_access(reason=mapped.reason)
        end_call(context, to_grpc_status(mapped))

    @contextlib.contextmanager
    def _observed(self, method: str, request: object, context: grpc.aio.ServicerContext) -> Iterator[dict]:
        request_id = request_id_from(getattr(request, "request_id", None), call_metadata(context, REQUEST_ID_HEADER))
        if hasattr(request, "request_id"):  # name the request (the handler's replies echo it) for every log line below
            request.request_id = request_id  # type: ignore[attr-defined]
        images = len(getattr(request, "images", ())) or len(getattr(request, "keys", ()))
        outcome: dict = {"request_id": request_id}
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))  # sent with the status: no send of its own
        started = time.perf_counter()
        failed = False
        over: str | None = None
        _OUTCOME.set(outcome)  # set at every RPC's start (no reset: a stream's end may run in another context)
        with request_context(request_id):
            try:
                yield outcome
            except (*CALL_OVER, GeneratorExit) as exc:  # GeneratorExit: a stream closed under its handler
                over = call_over_code(context)
                if context.code() is None:  # not refused by the servicer: count what the client saw
                    self._metrics.rejections.labels(over.lower()).inc()
                if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                    raise
                raise asyncio.CancelledError from None  # gRPC logs a cancellation at DEBUG only
            except BaseException:
                failed = True
                raise
            finally:
                code, elapsed = over or _final_code(context, failed), time.perf_counter() - started
                self._metrics.observe_request(method, code, elapsed)
                extra = {k: v for k, v in outcome.items() if k != "request_id"}
                log_access("grpc", method, code, elapsed, images=images, **extra)


def parsed(raw: bytes, deserialize: Callable[[bytes], object] | None) -> object | None:
    """The request message, or None when `raw` does not parse."""
    if deserialize is None:
        return raw
    try:
        return deserialize(raw)
    except DecodeError:
        return None


def call_metadata(context: grpc.aio.ServicerContext, key: str) -> str | None:
    """The call's metadata value under `key` (lower case), or None."""
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, str) else None
    return None


def _reply_fields(response: object) -> dict:
    """tokens and transport of an EncodeImagesResponse (nothing for other replies)."""
    embeddings = getattr(response, "embeddings", None)
    if embeddings is None:
        return {}
    transport = response.DESCRIPTOR.fields_by_name["transport"].enum_type.values_by_number[response.transport].name
    return {"tokens": sum(e.num_tokens for e in embeddings), "transport": transport.removeprefix("TRANSPORT_").lower()}


def note_access(**fields: object) -> None:
    """Add fields to the current RPC's access line from inside its handler."""
    outcome = _OUTCOME.get()
    if outcome is not None:
        outcome.update(fields)
