"""The transports as records every layer asks; adding one is its modules and a line in TRANSPORTS
(docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mmproc.transport.producer import Producer, StartContext
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire import cuda_ipc, nixl
from mmproc.wire.results import SERIALIZED, EncodedImage, embedding_header


@dataclass(frozen=True)
class Via:
    """A transport's name, and the consumer session its memory is leased to."""

    transport: str = SERIALIZED
    session: str | None = None


BY_BYTES = Via()  # serialized: the bytes in the reply


@dataclass(frozen=True)
class Transport:
    name: str
    wire: int  # its pb.Transport value; TRANSPORT_AUTO for one the enum does not list (its name travels)
    # the producer, or why not (probed at start-up); None: always there
    start: Callable[[StartContext], Producer | str] | None
    # a result's handle into its reply header; None: the payload travels in the reply
    describe: Callable[[pb.Embedding, Any], None] | None
    reader: str  # the client's reader factory, "module:function", imported lazily: the table sits below the client
    # its consumer session's server side (the Session RPC whose hello names it), "module:function" taking
    # (producer or None, hello, the later requests, the call) and yielding SessionEvents; None: no sessions
    session: str | None = None


SERIALIZED_TRANSPORT = Transport(SERIALIZED, pb.TRANSPORT_SERIALIZED, None, None, "mmproc.client.readers:serialized")
CUDA_IPC = Transport(
    cuda_ipc.NAME, pb.TRANSPORT_IPC, cuda_ipc.start_producer, cuda_ipc.describe, "mmproc.client.readers:ipc",
    "service.frontends.grpc.session:ipc_session",
)  # fmt: skip
NIXL = Transport(
    nixl.NAME,
    pb.TRANSPORT_AUTO,
    nixl.start_producer,
    nixl.describe,
    "mmproc.client.nixl_reader:reader",
    "mmproc.wire.nixl:session",
)
TRANSPORTS: tuple[Transport, ...] = (CUDA_IPC, NIXL, SERIALIZED_TRANSPORT)  # `auto` takes the first a client can read


class Table:
    """One server's or client's transports by name (TRANSPORTS, or TRANSPORTS plus a test's own)."""

    def __init__(self, transports: Sequence[Transport] = TRANSPORTS) -> None:
        self.ordered = tuple(transports)
        self.by_name = {t.name: t for t in transports}
        self._by_wire = {t.wire: t for t in transports if t.wire != pb.TRANSPORT_AUTO}
        assert SERIALIZED in self.by_name, "serialized is every transport's fallback"

    def via(self, transport: int, name: str, session: str) -> Via:
        """By name, else by enum (auto: the first); a transport's memory only with a consumer session."""
        chosen = self.by_name.get(name) if name else self._by_wire.get(transport, self.ordered[0])
        if chosen is None or chosen.name == SERIALIZED or not session:
            return BY_BYTES
        return Via(chosen.name, session)

    def reply(self, request_id: str, results: list[EncodedImage]) -> pb.EncodeImagesResponse | None:
        """The reply describing each result's handle; None when serialized (the first result says)."""
        if not results or results[0].handle is None:
            return None
        transport = self.by_name[results[0].transport]
        assert transport.describe is not None
        reply = pb.EncodeImagesResponse(request_id=request_id, transport=transport.wire, transport_name=transport.name)
        for result in results:
            header = embedding_header(result)
            transport.describe(header, result.handle)
            reply.embeddings.append(header)
        return reply
