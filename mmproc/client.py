"""The consumer API an LLM worker imports.

    from mmproc.client import EncoderClient
    from mmproc.errors import InvalidMediaError
    with EncoderClient("127.0.0.1:50051", device="cuda:0") as client:
        embeddings = client.encode_images([jpeg_bytes, png_bytes])  # list[Tensor (tokens_i, hidden)]

`AsyncEncoderClient` is the same for asyncio code. Server errors come back typed: InvalidMediaError
(a ValueError with .index, .reason, .http_status == 400), ResourceExhaustedError, UnavailableError,
DeadlineExceededError, InternalError. Serialized replies are received as a stream of chunks, so replies
larger than one gRPC message still arrive.

Several servers: pass a list of targets (calls rotate over them) or one name that resolves to several
addresses, e.g. "dns:///mmproc-pool:50051" (gRPC's round_robin policy spreads calls over all of them).
UNAVAILABLE is retried — on the next target — with exponential backoff and jitter within the call's
timeout; INVALID_ARGUMENT never is. See `mmproc.client_retry.RetryPolicy` (`retry=NO_RETRY` turns it off).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import grpc
import torch
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from mmproc.client_auth import aio_bearer, bearer_channel
from mmproc.client_retry import RetryPolicy, Rotation, acall_with_retry, call_with_retry
from mmproc.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidMediaError,
    MmprocError,
    ResourceExhaustedError,
    StaleSessionError,
    UnauthenticatedError,
    UnavailableError,
)
from mmproc.transport import bytes_to_tensor, tensor_nbytes
from mmproc.transport.cuda_ipc import device_uuid, ipc_unavailable_reason
from mmproc.transport.ipc_pool import PoolIdentity, SliceDescriptor
from mmproc.transport.node import node_identity
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

_PB_DTYPES = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_BFLOAT16: "bfloat16", pb.DTYPE_FLOAT16: "float16"}
_TRANSPORTS = {"auto": pb.TRANSPORT_AUTO, "serialized": pb.TRANSPORT_SERIALIZED, "ipc": pb.TRANSPORT_IPC}
_ERRORS_BY_CODE: dict[grpc.StatusCode, type[MmprocError]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.FAILED_PRECONDITION: StaleSessionError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def _channel_options(max_message_bytes: int) -> list[tuple[str, int | str]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.lb_policy_name", "round_robin"),  # every address a name resolves to, not just the first
    ]


def error_from_rpc(err: grpc.RpcError) -> MmprocError:
    """Turn a failed call into the typed error the server meant (BadRequest details -> index and reason)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        reason, index = "bad_request", -1
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
        for detail in status.details if status is not None else ():
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
                reason = info.reason or reason
                index = int(info.metadata.get("index", "-1"))
        return InvalidMediaError(message or "invalid request", reason=reason, index=index)
    cls = _ERRORS_BY_CODE.get(code, InternalError)
    return cls(f"{code.name}: {message}")


class _Assembler:
    """Collects a streamed reply (headers + chunks) into one tensor per image."""

    def __init__(self, count: int, device: torch.device) -> None:
        self._device = device
        self._headers: list[pb.Embedding | None] = [None] * count
        self._buffers: list[bytearray | None] = [None] * count

    def add(self, chunk: pb.EncodeImagesChunk) -> None:
        index = chunk.index
        if not 0 <= index < len(self._headers):
            raise InternalError(f"server sent a chunk for image {index} of {len(self._headers)}")
        if chunk.HasField("header"):
            header = chunk.header
            nbytes = tensor_nbytes(tuple(header.shape), getattr(torch, _PB_DTYPES[header.dtype]))
            self._headers[index], self._buffers[index] = header, bytearray(nbytes)
        buffer = self._buffers[index]
        if buffer is None or chunk.offset + len(chunk.data) > len(buffer):
            raise InternalError(f"malformed stream for image {index}")
        buffer[chunk.offset : chunk.offset + len(chunk.data)] = chunk.data

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for index, (header, buffer) in enumerate(zip(self._headers, self._buffers)):
            if header is None or buffer is None:
                raise InternalError(f"stream ended without image {index}")
            out.append(bytes_to_tensor(bytes(buffer), _PB_DTYPES[header.dtype], tuple(header.shape), self._device))
        return out


def _request(images: Sequence[bytes], request_id: str | None, transport: str) -> pb.EncodeImagesRequest:
    if transport not in _TRANSPORTS:
        raise ValueError(f"transport must be one of {sorted(_TRANSPORTS)}, got {transport!r}")
    return pb.EncodeImagesRequest(
        images=list(images), request_id=request_id or uuid.uuid4().hex[:16], transport=_TRANSPORTS[transport]
    )


T = TypeVar("T")


class _Targets:
    """One channel per target; each call goes to the next target and is retried per `RetryPolicy`
    (mmproc.client_retry). `make_channel` is grpc.insecure_channel or grpc.aio.insecure_channel."""

    def __init__(self, target: str | Sequence[str], make_channel: Callable, retry: RetryPolicy | None) -> None:
        targets = [target] if isinstance(target, str) else list(target)
        if not targets:
            raise ValueError("no target given")
        self.channels = [make_channel(t) for t in targets]
        self.stubs = [pb_grpc.EncoderStub(channel) for channel in self.channels]
        self._rotation = Rotation(self.stubs)
        self.retry = retry or RetryPolicy()

    def _failed(self, index: int, err: grpc.RpcError) -> MmprocError:
        error = error_from_rpc(err)
        if isinstance(error, UnavailableError):
            self._rotation.failed(index)
        return error

    def call(self, fn: Callable[[pb_grpc.EncoderStub, float], T], timeout: float) -> T:
        def attempt(seconds: float) -> T:
            index, stub = self._rotation.pick()
            try:
                return fn(stub, seconds)
            except grpc.RpcError as err:
                raise self._failed(index, err) from None

        return call_with_retry(attempt, self.retry, timeout)

    async def acall(self, fn: Callable[[pb_grpc.EncoderStub, float], Awaitable[T]], timeout: float) -> T:
        async def attempt(seconds: float) -> T:
            index, stub = self._rotation.pick()
            try:
                return await fn(stub, seconds)
            except grpc.RpcError as err:
                raise self._failed(index, err) from None

        return await acall_with_retry(attempt, self.retry, timeout)


def _check_images(images: Iterable[bytes]) -> list[bytes]:
    images = list(images)
    for i, data in enumerate(images):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"images[{i}] must be bytes, got {type(data).__name__}")
    return [bytes(data) for data in images]


class EncoderClient:
    """Blocking client. Thread-safe (one channel, shared)."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        device: str | torch.device = "cpu",
        transport: str = "auto",
        timeout: float = 60.0,
        max_message_bytes: int = 64 << 20,
        handle_cache: bool = True,
        retry: RetryPolicy | None = None,
        token: str | None = None,
    ) -> None:
        """transport: "auto" (CUDA IPC when this process and the server share a node, a PID namespace and
        CUDA, else serialized), "ipc" (the same, but say so loudly when it falls back) or "serialized".
        handle_cache=False opens and closes the server's pool for every request (A/B benchmarks only).
        token: the server's `auth_token`, sent as `authorization: Bearer <token>` on every call."""
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {sorted(_TRANSPORTS)}, got {transport!r}")
        self.device = torch.device(device)
        self.transport = transport
        self.timeout = timeout
        options = _channel_options(max_message_bytes)
        channel = lambda t: bearer_channel(grpc.insecure_channel(t, options=options), token)  # noqa: E731
        self._targets = _Targets(target, channel, retry)
        self._stub = self._targets.stubs[0]  # the IPC session talks to the first target (IPC is same-node)
        self._ipc = _IpcClient(self._stub, self.device, handle_cache) if self._wants_ipc() else None

    def _wants_ipc(self) -> bool:
        if self.transport == "serialized":
            return False
        reason = "the client device is not CUDA" if self.device.type != "cuda" else ipc_unavailable_reason()
        if reason is not None:
            log = logger.warning if self.transport == "ipc" else logger.debug
            log("CUDA IPC unavailable in this process (%s): using the serialized transport", reason)
            return False
        return True

    @property
    def ipc_stats(self) -> dict[str, int] | None:
        """Handle-cache and fallback counters (None when IPC is not in use)."""
        return None if self._ipc is None else self._ipc.counters()

    def encode_images(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[torch.Tensor]:
        """One (tokens_i, hidden) tensor per image, on this client's device, in the server's dtype.

        Both transports give the same values bit for bit."""
        images = _check_images(images)
        if self._ipc is not None:
            with self._ipc_views(images, request_id, timeout) as views:
                if views is not None:
                    return [view.clone() for view in views]  # stream-ordered copy; the ack follows it
        return self._encode_serialized(images, request_id, timeout)

    def encode_images_into(
        self,
        images: Sequence[bytes],
        outputs: Sequence[torch.Tensor],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Copy each embedding into the caller's buffer (same shape and dtype, on this client's device),
        e.g. straight into the LLM's input-embedding tensor."""
        images = _check_images(images)
        if len(outputs) != len(images):
            raise ValueError(f"{len(images)} images but {len(outputs)} output buffers")
        with self.encode_images_view(images, request_id=request_id, timeout=timeout) as views:
            for out, view in zip(outputs, views):
                if out.shape != view.shape or out.dtype != view.dtype:
                    raise ValueError(
                        f"output buffer {tuple(out.shape)} {out.dtype} != {tuple(view.shape)} {view.dtype}"
                    )
                out.copy_(view)

    @contextlib.contextmanager
    def encode_images_view(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> Iterator[list[torch.Tensor]]:
        """Zero-copy views of the embeddings inside the server's IPC pool, valid inside the `with` block.

        On exit, an ack is enqueued on the current CUDA stream after whatever you enqueued that reads the
        views, and the lease is released. Without IPC the views are ordinary tensors on this device.
        """
        images = _check_images(images)
        if self._ipc is not None:
            with self._ipc_views(images, request_id, timeout) as views:
                if views is not None:
                    yield views
                    return
        yield self._encode_serialized(images, request_id, timeout)

    @contextlib.contextmanager
    def _ipc_views(
        self, images: list[bytes], request_id: str | None, timeout: float | None
    ) -> Iterator[list[torch.Tensor] | None]:
        assert self._ipc is not None
        request_id = request_id or uuid.uuid4().hex[:16]
        for attempt in (1, 2):
            try:
                reply = self._ipc.request(images, request_id, timeout or self.timeout)
                break
            except grpc.RpcError as err:
                error = error_from_rpc(err)
                if not isinstance(error, StaleSessionError) or attempt == 2:
                    raise error from None
                self._ipc.reset()  # the server restarted or dropped our session: open a new one, once
        if reply is None:  # no session (refused, or the server has no pool)
            yield None
            return
        if reply.transport != pb.TRANSPORT_IPC:  # the server fell back (pool full): bytes are in the reply
            yield [_embedding_from_bytes(emb, self.device) for emb in reply.embeddings]
            return
        with self._ipc.read(reply, timeout or self.timeout) as views:
            yield views

    def _encode_serialized(
        self, images: list[bytes], request_id: str | None, timeout: float | None
    ) -> list[torch.Tensor]:
        request = _request(images, request_id, "serialized")

        def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> list[torch.Tensor]:
            assembler = _Assembler(len(images), self.device)
            for chunk in stub.EncodeImagesStream(request, timeout=seconds):
                assembler.add(chunk)
            return assembler.tensors()

        return self._targets.call(attempt, timeout or self.timeout)

    def server_info(self, timeout: float | None = None) -> pb.ServerInfo:
        request = pb.GetServerInfoRequest()
        timeout = timeout or self.timeout
        return self._targets.call(lambda stub, seconds: stub.GetServerInfo(request, timeout=seconds), timeout)

    def close(self) -> None:
        if self._ipc is not None:
            self._ipc.close()
        for channel in self._targets.channels:
            channel.close()

    def __enter__(self) -> EncoderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEncoderClient:
    """asyncio client (grpc.aio). Use from one event loop."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        device: str | torch.device = "cpu",
        transport: str = "auto",
        timeout: float = 60.0,
        max_message_bytes: int = 64 << 20,
        retry: RetryPolicy | None = None,
        token: str | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.transport = transport
        self.timeout = timeout
        options = _channel_options(max_message_bytes)
        interceptors = aio_bearer(token)
        channel = lambda t: grpc.aio.insecure_channel(t, options=options, interceptors=interceptors)  # noqa: E731
        self._targets = _Targets(target, channel, retry)

    async def encode_images(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[torch.Tensor]:
        images = _check_images(images)
        request = _request(images, request_id, self.transport)

        async def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> list[torch.Tensor]:
            assembler = _Assembler(len(images), self.device)
            async for chunk in stub.EncodeImagesStream(request, timeout=seconds):
                assembler.add(chunk)
            return assembler.tensors()

        return await self._targets.acall(attempt, timeout or self.timeout)

    async def server_info(self, timeout: float | None = None) -> pb.ServerInfo:
        request = pb.GetServerInfoRequest()

        async def attempt(stub: pb_grpc.EncoderStub, seconds: float) -> pb.ServerInfo:
            return await stub.GetServerInfo(request, timeout=seconds)

        return await self._targets.acall(attempt, timeout or self.timeout)

    async def close(self) -> None:
        for channel in self._targets.channels:
            await channel.close()

    async def __aenter__(self) -> AsyncEncoderClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _embedding_from_bytes(emb: pb.Embedding, device: torch.device) -> torch.Tensor:
    return bytes_to_tensor(emb.data, _PB_DTYPES[emb.dtype], tuple(emb.shape), device)


class _IpcClient:
    """This process's IPC session with one server, plus the handle cache (sync client).

    The session is a long-lived bidirectional stream: its first reply names the pool; releases go up it;
    when this process dies the stream ends and the server reclaims every lease it held.
    """

    def __init__(self, stub: pb_grpc.EncoderStub, device: torch.device, handle_cache: bool) -> None:
        from mmproc.transport.ipc_consumer import HandleCache

        self._stub = stub
        self._device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._uuid = device_uuid(self._index)
        self._cache = HandleCache.process_wide() if handle_cache else HandleCache(enabled=False)
        self._lock = threading.Lock()
        self._outbox: queue.Queue[pb.SessionRequest | None] | None = None
        self._call = None
        self.session_id: str | None = None
        self.identity: PoolIdentity | None = None
        self.refused: str | None = None
        self.fallbacks = 0

    def counters(self) -> dict[str, int]:
        stats = self._cache.stats
        return {"opens": stats.opens, "closes": stats.closes, "open_failures": stats.open_failures,
                "fallbacks": self.fallbacks}  # fmt: skip

    def _session(self) -> str | None:
        """Open (or reopen after the server restarted) the session; None when IPC is refused."""
        with self._lock:
            if self.session_id is not None and self._call is not None and self._call.is_active():
                return self.session_id
            if self.refused is not None:
                return None
            hostname, boot_id, pid_ns = node_identity()
            hello = pb.SessionHello(
                pid=os.getpid(), hostname=hostname, boot_id=boot_id, pid_namespace=pid_ns, device_uuid=self._uuid
            )
            outbox: queue.Queue[pb.SessionRequest | None] = queue.Queue()
            outbox.put(pb.SessionRequest(hello=hello))
            call = self._stub.Session(iter(outbox.get, None))
            first = next(call)
            if first.WhichOneof("kind") == "refused":
                self.refused = first.refused.reason
                logger.warning("server refused CUDA IPC (%s): using the serialized transport", self.refused)
                outbox.put(None)
                return None
            opened = first.opened
            info = opened.pool
            self._outbox, self._call, self.session_id = outbox, call, opened.session_id
            # The stream only ends when the server goes away; notice it at once rather than on the next request.
            threading.Thread(target=self._watch, args=(call,), name="mmproc-ipc-session", daemon=True).start()
            self.identity = PoolIdentity(
                pool_id=info.pool_id,
                epoch=info.epoch,
                device_uuid=info.device_uuid,
                ipc_handle=info.ipc_handle,
                pool_bytes=info.pool_bytes,
                num_word_slots=info.num_word_slots,
                data_offset=0,
            )
            return self.session_id

    def _watch(self, call) -> None:
        with contextlib.suppress(grpc.RpcError):
            for _ in call:
                pass
        with self._lock:
            if self._call is call:
                self._call = None

    def reset(self) -> None:
        """Forget the session (the server no longer holds it); the next request opens a new one."""
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
            if self._call is not None:
                self._call.cancel()
            self._outbox = self._call = self.session_id = None

    def request(self, images: list[bytes], request_id: str, timeout: float) -> pb.EncodeImagesResponse | None:
        session = self._session()
        if session is None:
            return None
        request = pb.EncodeImagesRequest(
            images=images,
            request_id=request_id,
            transport=pb.TRANSPORT_IPC,
            consumer=pb.ConsumerInfo(session_id=session, device_uuid=self._uuid),
        )
        reply = self._stub.EncodeImages(request, timeout=timeout)
        if reply.transport != pb.TRANSPORT_IPC:
            self.fallbacks += 1
        return reply

    @contextlib.contextmanager
    def read(self, reply: pb.EncodeImagesResponse, timeout: float) -> Iterator[list[torch.Tensor] | None]:
        """Views of the reply's slices, ordered after the producer's writes; ack + release on exit.
        None when the pool cannot be opened (the lease is given back unread)."""
        assert self.identity is not None
        descs = [_descriptor(emb.ipc) for emb in reply.embeddings]
        lease_ids = sorted({d.lease_id for d in descs})
        if any(emb.ipc.pool_id != self.identity.pool_id for emb in reply.embeddings):
            raise InternalError("reply names a pool other than this session's")
        try:
            pool = self._cache.acquire(self.identity, self._device)  # opens on a miss, retrying once
        except Exception as exc:
            logger.warning("cannot open the server's IPC pool (%s): this request goes serialized", exc)
            self.fallbacks += 1
            self._send(pb.LeaseRelease(lease_ids=lease_ids, unread=True))
            yield None
            return
        stream = torch.cuda.current_stream(self._device)
        try:
            pool.wait_ready(descs[0], stream, timeout)  # one lease (slot, generation) for the whole request
            yield [
                pool.view(d, getattr(torch, _PB_DTYPES[emb.dtype]), tuple(emb.shape))
                for d, emb in zip(descs, reply.embeddings)
            ]
        finally:
            pool.ack(descs[0], stream)
            self._send(pb.LeaseRelease(lease_ids=lease_ids))
            self._cache.release(pool)

    def _send(self, release: pb.LeaseRelease) -> None:
        if self._outbox is not None:
            self._outbox.put(pb.SessionRequest(release=release))

    def close(self) -> None:
        if self._outbox is not None:
            self._outbox.put(None)
        if self._call is not None:
            self._call.cancel()
        if not self._cache.enabled:
            self._cache.close_all()  # the process-wide cache lives as long as the process


def _descriptor(ipc: pb.IpcDescriptor) -> SliceDescriptor:
    return SliceDescriptor(
        lease_id=ipc.lease_id,
        generation=ipc.generation,
        offset=ipc.offset_bytes,
        nbytes=ipc.nbytes,
        ready_offset=ipc.ready_offset_bytes,
        ack_offset=ipc.ack_offset_bytes,
    )
