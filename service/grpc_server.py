"""gRPC front end: the Encoder servicer, standard health and reflection, `create_server`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mmproc.errors import ResourceExhaustedError
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.convert import ipc_reply, serialized_chunks, serialized_payloads, serialized_reply
from service.engine import EncodedImage, Engine
from service.errors import map_error, to_grpc_status
from service.session import run_session

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Encoder"].full_name


async def _off_loop(fn, *args):
    """Blocking work (device-to-host staging, byte copies) runs in the default executor, not on the loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class ReplyTooLargeError(ResourceExhaustedError):
    """A unary reply would exceed the message cap; the client should use EncodeImagesStream."""


class EncoderServicer(pb_grpc.EncoderServicer):
    def __init__(self, engine: Engine, info: pb.ServerInfo, *, default_deadline_s: float) -> None:
        self._engine = engine
        self._info = info
        self._default_deadline_s = default_deadline_s

    async def _run(
        self, request: pb.EncodeImagesRequest, context: grpc.aio.ServicerContext
    ) -> tuple[str, list[EncodedImage]]:
        request_id = request.request_id or uuid.uuid4().hex[:16]
        remaining = context.time_remaining()
        budget = self._default_deadline_s if remaining is None else remaining
        wants_ipc = request.transport != pb.TRANSPORT_SERIALIZED and bool(request.consumer.session_id)
        results = await self._engine.encode(
            list(request.images),
            request_id,
            time.monotonic() + budget,
            ipc_session=request.consumer.session_id if wants_ipc else None,
        )
        return request_id, results

    async def EncodeImages(
        self, request: pb.EncodeImagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.EncodeImagesResponse:
        try:
            request_id, results = await self._run(request, context)
            if results and results[0].descriptor is not None:
                assert self._engine.pool is not None
                return ipc_reply(request_id, results, self._engine.pool.identity)
            payloads = await _off_loop(serialized_payloads, results)
            size = sum(len(p) for p in payloads)
            if size > self._info.max_message_bytes - 64 * 1024:
                raise ReplyTooLargeError(
                    f"reply of {size} bytes exceeds the {self._info.max_message_bytes}-byte message cap; "
                    "use EncodeImagesStream"
                )
            return serialized_reply(request_id, results, payloads)
        except Exception as exc:  # every failure leaves through the one mapping
            await self._abort(context, request, exc)
            raise  # unreachable: abort raises

    async def EncodeImagesStream(self, request: pb.EncodeImagesRequest, context: grpc.aio.ServicerContext):
        try:
            request_id, results = await self._run(request, context)
            payloads = await _off_loop(serialized_payloads, results)
        except Exception as exc:
            await self._abort(context, request, exc)
            return
        for chunk in serialized_chunks(request_id, results, payloads, self._info.stream_chunk_bytes):
            yield chunk

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext) -> pb.ServerInfo:
        return self._info

    async def Session(self, requests, context: grpc.aio.ServicerContext):
        async for event in run_session(self._engine.pool, requests, context):
            yield event

    async def _abort(
        self, context: grpc.aio.ServicerContext, request: pb.EncodeImagesRequest, exc: BaseException
    ) -> None:
        request_id = request.request_id or "-"
        mapped = map_error(exc, request_id)
        if mapped.http_status < 500:
            logger.info("request %s refused: %s %s", request_id, mapped.grpc_code.name, mapped.message)
        await context.abort_with_status(to_grpc_status(mapped))


async def create_server(
    engine: Engine, info: pb.ServerInfo, address: str, *, default_deadline_s: float = 60.0
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build and start (bind) the server; returns (server, bound port, health servicer).

    `address` is HOST:PORT (port 0 picks a free one) or unix:PATH (the socket is made mode 0600).
    Health starts NOT_SERVING; the caller flips it to SERVING once warm-up is done.
    """
    cap = int(info.max_message_bytes)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", cap),
            ("grpc.max_send_message_length", cap),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=None,
    )
    pb_grpc.add_EncoderServicer_to_server(EncoderServicer(engine, info, default_deadline_s=default_deadline_s), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    port = server.add_insecure_port(address)
    if port == 0 and not address.startswith("unix:"):
        raise OSError(f"could not bind gRPC address {address}")
    await server.start()
    if address.startswith("unix:"):
        os.chmod(address.removeprefix("unix:").removeprefix("//"), 0o600)
    return server, port, health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, status)
