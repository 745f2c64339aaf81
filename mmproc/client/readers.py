"""The client's transport seam: how a request's embeddings reach this process, chosen once per client.

`IpcReader` reads slices of the server's pool in place, falling back to `SerializedReader` (a streamed reply);
the clients ask their reader and never test the transport themselves."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch

from mmproc.client.ipc import IpcClient, clone_views
from mmproc.client.results import ImageEmbedding, from_header
from mmproc.client.rpc import Assembler, collect_reply, embedding_from_bytes, error_from_rpc, make_request
from mmproc.client.shared_embeddings import SharedEmbeddings
from mmproc.client.targets import Targets
from mmproc.client.video import VideoEmbedding, VideoInput, encode_over_ipc, make_video_request, read_serialized
from mmproc.errors import StaleSessionError, UnavailableError
from mmproc.transport.cuda_ipc.node import node_identity
from mmproc.transport.cuda_ipc.runtime import ipc_unavailable_reason
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.transports import Table

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Received:
    """Headers and (tokens_i, hidden) tensors on the client's device; `in_pool`: views valid only inside the
    reader's `with`."""

    headers: Sequence[pb.Embedding]
    tensors: list[torch.Tensor]
    in_pool: bool = False

    def owned(self) -> list[torch.Tensor]:
        """Tensors the caller may keep (pool views are copied, stream-ordered, before the ack)."""
        return clone_views(self.tensors) if self.in_pool else self.tensors

    def embeddings(self) -> list[ImageEmbedding]:
        return [from_header(h, t) for h, t in zip(self.headers, self.owned())]


def assembled(chunks: Iterator, count: int, device: torch.device) -> Received:
    """A streamed serialized reply as tensors."""
    assembler = Assembler(count, device)
    for chunk in chunks:
        assembler.add(chunk)
    tensors = assembler.tensors()
    return Received(assembler.headers(), tensors)


class SerializedReader:
    """Replies streamed as bytes (may exceed one gRPC message), over every target with retries."""

    def __init__(self, targets: Targets, device: torch.device, cache_bypass: bool, transport: str) -> None:
        self.targets, self.device, self.cache_bypass = targets, device, cache_bypass
        self._transport = transport  # what the user asked for: named when an IPC batch cannot be read here

    def request(self, images: Sequence[bytes], keys: Sequence[str], request_id: str) -> pb.EncodeImagesRequest:
        return make_request(images, request_id, "serialized", cache_bypass=self.cache_bypass, keys=keys)

    @contextlib.contextmanager
    def read(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float) -> Iterator[Received]:
        request, count = self.request(images, keys, request_id), len(images) or len(keys)

        def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> Received:
            return assembled(stub.EncodeImagesStream(request, timeout=seconds), count, self.device)

        yield self.targets.call(attempt, timeout)

    def shared(self, images: list[bytes], readers: int, request_id: str, timeout: float) -> SharedEmbeddings:
        request = self.request(images, (), request_id)
        request.readers = readers

        def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> pb.EncodeImagesResponse:
            return collect_reply(stub.EncodeImagesStream(request, timeout=seconds), len(images))

        return SharedEmbeddings.from_reply(self.targets.call(attempt, timeout), None, readers)

    @contextlib.contextmanager
    def read_shared(self, shared: SharedEmbeddings, rank: int, timeout: float) -> Iterator[list[torch.Tensor]]:
        if shared.transport == "ipc":
            raise UnavailableError(
                f"shared embeddings are in the server's CUDA IPC pool, but this client (device {self.device}, "
                f"transport {self._transport}) cannot map it; every rank needs a CUDA device and CuPy"
            )
        yield shared.tensors(self.device)

    def videos(self, videos: Sequence[bytes | VideoInput], request_id: str, timeout: float) -> list[VideoEmbedding]:
        request = make_video_request(videos, request_id)

        def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> list[VideoEmbedding]:
            return read_serialized(stub.EncodeVideos(request, timeout=seconds), self.device)

        return self.targets.call(attempt, timeout)

    def close(self) -> None:
        pass


class IpcReader:
    """Replies in the first target's IPC pool; without a session or a mapping, the serialized reader."""

    def __init__(self, ipc: IpcClient, fallback: SerializedReader) -> None:
        self.ipc, self.fallback, self.device = ipc, fallback, fallback.device

    def request(
        self,
        images: list[bytes],
        request_id: str,
        timeout: float,
        *,
        readers: int | None = None,
        keys: Sequence[str] = (),
    ) -> pb.EncodeImagesResponse | None:
        """One IPC request, reopening a stale session once; None without a session."""
        for attempt in (1, 2):
            try:
                return self.ipc.request(
                    images, request_id, timeout, readers=readers, keys=keys, cache_bypass=self.fallback.cache_bypass
                )
            except grpc.RpcError as err:
                error = error_from_rpc(err)
                if not isinstance(error, StaleSessionError) or attempt == 2:
                    raise error from None
                self.ipc.reset()
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def read(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float) -> Iterator[Received]:
        reply = self.request(images, request_id, timeout, keys=keys)
        if reply is not None and reply.transport != pb.TRANSPORT_IPC:  # kept results, or the pool was full
            yield Received(reply.embeddings, [embedding_from_bytes(emb, self.device) for emb in reply.embeddings])
            return
        if reply is not None:
            with self.ipc.read(reply, timeout) as views:
                if views is not None:
                    yield Received(reply.embeddings, views, in_pool=True)
                    return
        with self.fallback.read(images, keys, request_id, timeout) as delivery:  # no session, or no pool mapping
            yield delivery

    def shared(self, images: list[bytes], readers: int, request_id: str, timeout: float) -> SharedEmbeddings:
        reply = self.request(images, request_id, timeout, readers=readers)
        if reply is None:
            return self.fallback.shared(images, readers, request_id, timeout)
        try:
            return SharedEmbeddings.from_reply(reply, self.ipc.identity, readers)
        except ValueError:  # e.g. an older server leased for one reader
            self.ipc.give_back(reply)
            raise

    @contextlib.contextmanager
    def read_shared(self, shared: SharedEmbeddings, rank: int, timeout: float) -> Iterator[list[torch.Tensor]]:
        if shared.transport != "ipc":
            yield shared.tensors(self.device)
            return
        with self.ipc.read_shared(shared, rank, timeout) as views:
            yield views

    def videos(self, videos: Sequence[bytes | VideoInput], request_id: str, timeout: float) -> list[VideoEmbedding]:
        request = make_video_request(videos, request_id)
        try:
            got = encode_over_ipc(self.ipc, request, self.device, timeout)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return got if got is not None else self.fallback.videos(videos, request_id, timeout)

    def close(self) -> None:
        self.ipc.close()


def ipc_wanted(transport: str, device: torch.device) -> bool:
    """Whether a client on `device` should try CUDA IPC; logs why not."""
    if transport == "serialized":
        return False
    reason = "the client device is not CUDA" if device.type != "cuda" else ipc_unavailable_reason()
    if reason is not None:
        log = logger.warning if transport == "ipc" else logger.debug
        log("CUDA IPC unavailable in this process (%s): using the serialized transport", reason)
        return False
    return True


def on_another_node(info: pb.ServerInfo | None) -> bool:
    """Whether the server says it runs on another node than this process (False when it does not say)."""
    return info is not None and bool(info.node_boot_id) and info.node_boot_id != node_identity()[1]


@dataclass(frozen=True)
class ReaderContext:
    """What a transport's reader factory is handed."""

    targets: Targets
    device: torch.device
    handle_cache: bool
    asked: str  # the transport the user asked for: "auto" or a name
    fallback: SerializedReader  # for requests the transport cannot serve
    server_info: Callable[[], pb.ServerInfo | None] = lambda: None  # asked once, by the factories that need it


def server_info_once(targets: Targets, timeout: float = 5.0) -> Callable[[], pb.ServerInfo | None]:
    """The first target's ServerInfo, asked at most once; None when it does not answer (then `auto` decides
    without it, as before)."""

    @functools.cache
    def ask() -> pb.ServerInfo | None:
        try:
            return targets.stubs[0].GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout)
        except grpc.RpcError as err:
            logger.debug("server info unavailable for the transport choice: %s", err.code())
            return None

    return ask


def serialized(context: ReaderContext) -> SerializedReader:
    return context.fallback


def ipc(context: ReaderContext) -> IpcReader | None:
    if not ipc_wanted(context.asked, context.device):
        return None
    if context.asked == "auto" and on_another_node(context.server_info()):
        return None  # the next transport of the table (across nodes), not IPC's refusal and bytes
    return IpcReader(IpcClient(context.targets.stubs[0], context.device, context.handle_cache), context.fallback)


def choose_reader(
    transport: str,
    targets: Targets,
    device: torch.device,
    *,
    cache_bypass: bool,
    handle_cache: bool,
    table: Table | None = None,
) -> Reader:
    """The named transport's reader, or with "auto" the first the table's this process can read; else serialized."""
    table = table or Table()
    fallback = SerializedReader(targets, device, cache_bypass, transport)
    if transport not in ("auto", *table.by_name):
        raise ValueError(f"transport must be one of {sorted(['auto', *table.by_name])}, got {transport!r}")
    ask = server_info_once(targets) if transport == "auto" else (lambda: None)
    context = ReaderContext(targets, device, handle_cache, transport, fallback, ask)
    for candidate in table.ordered if transport == "auto" else (table.by_name[transport],):
        module, _, factory = candidate.reader.partition(":")
        reader = getattr(importlib.import_module(module), factory)(context)
        if reader is not None:
            return reader
    return fallback


class AsyncSerializedReader:
    """`SerializedReader` over grpc.aio."""

    def __init__(self, targets: Targets, device: torch.device, cache_bypass: bool) -> None:
        self.targets, self.device, self.cache_bypass = targets, device, cache_bypass

    async def read(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float) -> Received:
        request = make_request(images, request_id, "serialized", cache_bypass=self.cache_bypass, keys=keys)
        count = len(images) or len(keys)

        async def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> Received:
            assembler = Assembler(count, self.device)
            async for chunk in stub.EncodeImagesStream(request, timeout=seconds):
                assembler.add(chunk)
            tensors = assembler.tensors()
            return Received(assembler.headers(), tensors)

        return await self.targets.acall(attempt, timeout)

    async def videos(
        self, videos: Sequence[bytes | VideoInput], request_id: str, timeout: float
    ) -> list[VideoEmbedding]:
        request = make_video_request(videos, request_id)

        async def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> list[VideoEmbedding]:
            return read_serialized(await stub.EncodeVideos(request, timeout=seconds), self.device)

        return await self.targets.acall(attempt, timeout)


class ThreadedReader:
    """The blocking reader in a worker thread, on the caller's stream, so the loop never blocks; a cancelled
    call's thread still gives back what it was lent. Videos go serialized."""

    def __init__(self, reader: Reader, serialized: AsyncSerializedReader) -> None:
        self.reader, self.serialized, self.device = reader, serialized, reader.device

    async def read(self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float) -> Received:
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

        def blocking() -> Received:
            with torch.cuda.stream(stream), self.reader.read(images, keys, request_id, timeout) as got:
                return Received(got.headers, got.owned())  # copied on the caller's stream before the ack

        return await asyncio.to_thread(blocking)

    async def videos(
        self, videos: Sequence[bytes | VideoInput], request_id: str, timeout: float
    ) -> list[VideoEmbedding]:
        return await self.serialized.videos(videos, request_id, timeout)


class Reader(Protocol):
    device: torch.device

    def read(
        self, images: list[bytes], keys: Sequence[str], request_id: str, timeout: float
    ) -> contextlib.AbstractContextManager[Received]: ...
    def shared(self, images: list[bytes], readers: int, request_id: str, timeout: float) -> SharedEmbeddings: ...
    def read_shared(
        self, shared: SharedEmbeddings, rank: int, timeout: float
    ) -> contextlib.AbstractContextManager[list[torch.Tensor]]: ...
    def videos(self, videos: Sequence[bytes | VideoInput], request_id: str, timeout: float) -> list[VideoEmbedding]: ...
    def close(self) -> None: ...
