"""gRPC front end: the Encoder servicer, standard health and reflection, `create_server`."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mmproc.errors import ConfigError, InvalidRequestError, Reason, ResourceExhaustedError
from mmproc.priority import PRIORITY_HEADER, is_batch
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.results import EncodedImage, headers_reply, payload_bytes
from mmproc.wire.serialized import passthrough_serializer, serialized_payloads, serialized_reply, serialized_stream
from mmproc.wire.transports import BY_BYTES
from service.frontends.auth import BearerToken, TokenInterceptor
from service.frontends.error_mapping import end_call, map_error, to_grpc_status
from service.frontends.grpc.loop_hop import run_on
from service.frontends.grpc.observe import ObserveInterceptor, call_metadata, note_access
from service.frontends.grpc.session import serve_session
from service.frontends.grpc.video import VideoServicerMixin
from service.pipeline.reply_budget import ReplyHold
from service.pipeline.requests import RequestPipeline
from service.pipeline.state import ServingState

logger = logging.getLogger(__name__)

T = TypeVar("T")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Encoder"].full_name


class ReplyTooLargeError(ResourceExhaustedError):
    """A unary reply would exceed the message cap; the client should use EncodeImagesStream."""


class GrpcServicer(VideoServicerMixin, pb_grpc.EncoderServicer):  # EncodeVideos: service/frontends/grpc/video.py
    def __init__(
        self, state: ServingState, *, default_deadline_s: float, home: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self._state = state
        self._default_deadline_s = default_deadline_s
        self._home = home  # the pipeline's loop, when this servicer runs on another (service/app/grpc_loop.py)

    async def _at_home(self, coro: Coroutine[Any, Any, T], dispose: Callable[[T], object] | None = None) -> T:
        """`coro` on the pipeline's loop: the pipeline, the reply budget and their futures are bound to it."""
        return await run_on(self._home, coro, dispose)

    def _release_when_done(self, held: ReplyHold) -> None:
        """The hold goes back on the pipeline's loop, whichever loop ends the call, once gRPC's task for the call is
        done. Not `context.add_done_callback`: gRPC keeps that callback bound to the context on the call's state,
        a reference cycle that leaves every answered call to the cyclic garbage collector."""
        home = self._home
        release = held.release if home is None else functools.partial(home.call_soon_threadsafe, held.release)
        task = asyncio.current_task()
        assert task is not None  # grpc.aio runs every handler in a task of its own
        task.add_done_callback(lambda _: release())

    @property
    def _pipeline(self) -> RequestPipeline:  # UnavailableError while the model loads
        return self._state.pipeline()

    @property
    def _info(self) -> pb.ServerInfo:
        return self._state.info()

    async def _hold_reply(self, results: list[EncodedImage], deadline: float) -> ReplyHold:
        """The reply's bytes from the reply budget, before staging. Given back when the call is done (sent, failed or
        cancelled): once gRPC's task for the call has finished, neither our frames nor its own (the message, its
        serialized copy) hold the bytes any more. The hold references none of the reply."""
        holding = self._pipeline.delivery.reply_bytes(payload_bytes(results), deadline, len(results))
        held = await self._at_home(holding, dispose=ReplyHold.release)  # a hold nobody took is given back
        self._release_when_done(held)
        return held

    async def _serialize(self, results: list[EncodedImage], deadline: float) -> list[bytes]:
        """Each result's payload as bytes (EncodeVideos' reply), within the reply budget."""
        held = await self._hold_reply(results, deadline)
        with self._state.metrics.time_stage("transport"):
            return await self._at_home(held.off_loop(serialized_payloads, results))

    async def _run(
        self, request: pb.EncodeImagesRequest, context: grpc.aio.ServicerContext, *, in_memory: bool = True
    ) -> tuple[str, float, list[EncodedImage]]:
        request_id = request.request_id or uuid.uuid4().hex[:16]
        remaining = context.time_remaining()
        budget = self._default_deadline_s if remaining is None else remaining
        deadline = time.monotonic() + budget
        readers = request.readers if request.HasField("readers") else 1  # unset: one reader
        sheddable = is_batch(call_metadata(context, PRIORITY_HEADER))
        if sheddable:  # the access line says so
            note_access(priority="batch")
        pipeline = self._pipeline
        via = BY_BYTES
        if in_memory and not request.headers_only:  # a transport's memory: only a unary reply can hand it over
            via = pipeline.transports.via(request.transport, request.transport_name, request.consumer.session_id)
        if request.keys and not request.images:  # fetch what an earlier request kept (docs/engines.md)
            kept = await self._at_home(
                pipeline.fetch(list(request.keys), request_id, deadline, via=via, readers=readers)
            )
            return request_id, deadline, kept
        if not request.headers_only:  # a standing queue refuses new work before any of it (a lookup is no work)
            pipeline.check_door(sheddable=sheddable)
        if request.keys:  # encode and keep (no lease: kept results are plain tensors)
            kept = await self._at_home(
                pipeline.encode_keyed(list(request.images), list(request.keys), request_id, deadline)
            )
            return request_id, deadline, kept
        results = await self._at_home(pipeline.encode(
            list(request.images), request_id, deadline, via=via, readers=readers,
            cache=not request.cache_bypass, mm_hashes=list(request.mm_hashes), lookup_only=request.headers_only,
        ))  # fmt: skip
        if results and results[0].cache:  # the embedding cache's answer per image, e.g. "hit,hit,miss"
            note_access(cache=",".join(r.cache for r in results))
        return request_id, deadline, results

    async def EncodeImages(
        self, request: pb.EncodeImagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.EncodeImagesResponse | bytes | None:
        try:
            request_id, deadline, results = await self._run(request, context)
            if request.headers_only:
                return headers_reply(request_id, results)
            in_memory = self._pipeline.transports.reply(request_id, results)
            if in_memory is not None:
                note_access(tokens=sum(r.num_tokens for r in results), transport=in_memory.transport_name)
                return in_memory
            size = payload_bytes(results)
            if size > self._info.max_message_bytes - 64 * 1024:  # before staging: nothing copied for a refusal
                raise ReplyTooLargeError(
                    f"reply of {size} bytes exceeds the {self._info.max_message_bytes}-byte message cap; "
                    "use EncodeImagesStream"
                )
            held = await self._hold_reply(results, deadline)
            note_access(tokens=sum(r.num_tokens for r in results), transport="serialized")
            with self._state.metrics.time_stage("transport"):
                pinned = self._pipeline.delivery.pinned
                return await self._at_home(held.off_loop(serialized_reply, request_id, results, pinned))  # bytes
        except Exception as exc:  # every failure leaves through the one mapping
            self._fail(context, request, exc)
            return None

    async def EncodeImagesStream(self, request: pb.EncodeImagesRequest, context: grpc.aio.ServicerContext):
        try:
            # Streams carry bytes only: a lease taken here would never reach a consumer to release it.
            if request.headers_only:  # nothing to stream: a unary reply carries the headers
                raise InvalidRequestError("headers_only requests go to EncodeImages", reason=Reason.BAD_REQUEST)
            request_id, deadline, results = await self._run(request, context, in_memory=False)
            held = await self._hold_reply(results, deadline)
            note_access(tokens=sum(r.num_tokens for r in results), transport="serialized")
            with self._state.metrics.time_stage("transport"):
                chunk = self._info.stream_chunk_bytes
                pinned = self._pipeline.delivery.pinned
                messages = await self._at_home(held.off_loop(serialized_stream, request_id, results, chunk, pinned))
        except Exception as exc:
            self._fail(context, request, exc)
            return
        for message in messages:
            yield message  # serialized already: passed through by passthrough_serializer (add_encoder_servicer)

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerInfo | None:
        try:
            return self._info
        except Exception as exc:  # not loaded yet: UNAVAILABLE
            self._fail(context, request, exc)
            return None

    async def Session(self, requests, context: grpc.aio.ServicerContext):
        try:
            pipeline = self._pipeline
            table, producers = pipeline.transports, pipeline.delivery.producers
        except Exception as exc:  # the model is still loading: UNAVAILABLE, not UNKNOWN
            self._fail(context, None, exc)
            return
        async for event in serve_session(table, producers, requests, context):
            if event.HasField("opened"):
                self._state.metrics.ipc_sessions_opened.inc()
            yield event

    def _fail(self, context: grpc.aio.ServicerContext, request: object, exc: BaseException) -> None:
        """End the call with `exc`'s status (the one mapping); the handler returns right after."""
        mapped = map_error(exc, metrics=self._state.metrics)  # counted and logged there, with the request id
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            # The client has its DEADLINE_EXCEEDED already; a status sent now races the core closing the call.
            context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            raise asyncio.CancelledError
        items = "videos" if hasattr(request, "videos") else "images"  # EncodeVideosRequest or an image request
        note_access(reason=mapped.reason)
        end_call(context, to_grpc_status(mapped, items))


class _HandlerRecorder:
    """Stands in for a server in the generated `add_EncoderServicer_to_server`, keeping its method handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, generic_handlers: object) -> None:
        pass  # built from the same dict that add_registered_method_handlers receives

    def add_registered_method_handlers(self, service_name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers.update(handlers)


def add_encoder_servicer(servicer: GrpcServicer, server: grpc.aio.Server) -> None:
    """What the generated `add_EncoderServicer_to_server` does, except that the serialized replies, which the
    servicer returns and yields as bytes already (service.frontends.replies), reach gRPC as they are.

    The handlers come from the generated code itself, so every other method keeps its generated (de)serializers.
    """
    recorder = _HandlerRecorder()
    pb_grpc.add_EncoderServicer_to_server(servicer, recorder)
    handlers = recorder.handlers
    unary, stream = handlers["EncodeImages"], handlers["EncodeImagesStream"]
    handlers["EncodeImages"] = grpc.unary_unary_rpc_method_handler(
        unary.unary_unary, unary.request_deserializer, passthrough_serializer
    )
    handlers["EncodeImagesStream"] = grpc.unary_stream_rpc_method_handler(
        stream.unary_stream, stream.request_deserializer, passthrough_serializer
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


async def create_server(
    state: ServingState,
    address: str,
    *,
    max_message_bytes: int,
    default_deadline_s: float = 60.0,
    max_connection_age_s: float = 0,
    auth_token: BearerToken | None = None,
    max_concurrent_rpcs: int | None = None,
    home: asyncio.AbstractEventLoop | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build and start (bind) the server; returns (server, bound port, health servicer).

    `address` is HOST:PORT (port 0 picks a free one) or unix:PATH (the socket is made mode 0600).
    Health starts NOT_SERVING; the caller flips it to SERVING once the model is loaded and warmed up.
    max_connection_age_s > 0 closes connections (gracefully) at that age, so that dns:/// clients re-resolve
    and spread onto replicas added since they connected. auth_token: see service/frontends/auth.py.
    max_concurrent_rpcs: past it gRPC answers RESOURCE_EXHAUSTED before reading the request, which bounds the
    memory that concurrent (up to max-message-sized) requests can hold; None: unbounded.
    home: the pipeline's loop when this runs on another (service/app/grpc_loop.py); None: the same loop.
    """
    options: list[tuple[str, int]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    if max_connection_age_s > 0:
        options += [
            ("grpc.max_connection_age_ms", int(max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(default_deadline_s * 1000)),
        ]
    server = grpc.aio.server(
        options=options,
        interceptors=[ObserveInterceptor(state.metrics, SERVICE_NAME)]
        + ([TokenInterceptor(auth_token, state.metrics)] if auth_token is not None else []),
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    add_encoder_servicer(GrpcServicer(state, default_deadline_s=default_deadline_s, home=home), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises this for an address it cannot bind (in use, no permission)
        reason = str(exc).split(";")[0]  # grpc appends advice about GRPC_VERBOSITY
        raise ConfigError(f"cannot listen on grpc_address {address} (--grpc-address): {reason}") from None
    if port == 0 and not address.startswith("unix:"):
        raise ConfigError(f"cannot listen on grpc_address {address} (--grpc-address): in use or not permitted")
    if address.startswith("unix:"):  # bound but not listening yet: nobody can connect before the chmod
        os.chmod(address.removeprefix("unix:").removeprefix("//"), 0o600)
    await server.start()
    return server, port, health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, status)
