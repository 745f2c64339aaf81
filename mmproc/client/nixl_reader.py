"""The client's reader of the NIXL transport (its record's `reader` in mmproc/wire/transports.py): requests name
the transport and this process's session; replies in the server's pool are read into this process's arena.
Anything the transport cannot serve goes serialized: no session, a full arena, a refused read (counted)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import grpc

from mmproc.client.nixl import NixlSession, ReadRefusedError
from mmproc.client.readers import Reader, ReaderContext, Received, SerializedReader
from mmproc.client.rpc import embedding_from_bytes, error_from_rpc, make_request
from mmproc.errors import StaleSessionError
from mmproc.transport.nixl import engine
from mmproc.transport.nixl.config import NAME
from mmproc.v1 import encoder_pb2 as pb

logger = logging.getLogger(__name__)


class NixlReader:
    def __init__(self, session: NixlSession, fallback: SerializedReader) -> None:
        self.session, self.fallback, self.device = session, fallback, fallback.device
        self.fallbacks = 0

    def request(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float):  # noqa: ANN201
        """One EncodeImages call naming this transport, reopening a stale session once; None without a session."""
        for attempt in (1, 2):
            session = self.session.open()
            if session is None:
                return None
            request = make_request(images, request_id, "serialized", cache_bypass=self.fallback.cache_bypass,
                                   keys=keys)  # fmt: skip
            request.transport, request.transport_name = pb.TRANSPORT_AUTO, NAME
            request.consumer.session_id = session
            try:
                return self.fallback.targets.stubs[0].EncodeImages(request, timeout=timeout)
            except grpc.RpcError as err:
                error = error_from_rpc(err)
                if not isinstance(error, StaleSessionError) or attempt == 2:
                    raise error from None
                self.session.reset()  # the server restarted or dropped our session: open a new one, once
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def read(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float) -> Iterator[Received]:
        reply = self.request(images, keys, request_id, timeout)
        if reply is not None and reply.transport_name != NAME:  # the pool was full, or kept results: bytes
            yield Received(reply.embeddings, [embedding_from_bytes(e, self.device) for e in reply.embeddings])
            return
        if reply is not None:
            try:
                with self.session.read(reply, timeout) as views:
                    if views is not None:
                        yield Received(reply.embeddings, views, in_pool=True)
                        return
            except ReadRefusedError as exc:
                logger.warning("NIXL read refused (%s): request %s goes serialized", exc, request_id)
            self.fallbacks += 1
        with self.fallback.read(images, keys, request_id, timeout) as delivery:
            yield delivery

    def shared(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - tensor-parallel fan-out: serialized
        return self.fallback.shared(*args, **kwargs)

    def read_shared(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self.fallback.read_shared(*args, **kwargs)

    def videos(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        return self.fallback.videos(*args, **kwargs)

    def close(self) -> None:
        self.session.close()


def reader(context: ReaderContext) -> Reader | None:
    """A NIXL reader when NIXL works here and, under `auto`, the server serves it; else None (the next in the
    table)."""
    reason = engine.unavailable_reason()
    if reason is None and context.asked == "auto":
        info = context.server_info()
        reason = None if info is not None and NAME in info.transport_names else "the server does not serve NIXL"
    if reason is not None:
        (logger.warning if context.asked == NAME else logger.debug)("NIXL unavailable: %s", reason)
        return None
    try:
        session = NixlSession(context.targets.stubs[0], context.device)
    except Exception as exc:  # UCX found no device, registration failed, ...
        logger.warning("NIXL agent could not start (%s): using the serialized transport", exc)
        return None
    return NixlReader(session, context.fallback)
