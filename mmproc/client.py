"""The consumer API an LLM worker imports.

    from mmproc.client import EncoderClient
    from mmproc.errors import InvalidMediaError
    with EncoderClient("127.0.0.1:50051", device="cuda:0") as client:
        embeddings = client.encode_images([jpeg_bytes, png_bytes])  # list[Tensor (tokens_i, hidden)]

`AsyncEncoderClient` is the same for asyncio code. Server errors come back typed: InvalidMediaError
(a ValueError with .index, .reason, .http_status == 400), ResourceExhaustedError, UnavailableError,
DeadlineExceededError, InternalError. Serialized replies are received as a stream of chunks, so replies
larger than one gRPC message still arrive.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import grpc
import torch
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from mmproc.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidMediaError,
    MmprocError,
    ResourceExhaustedError,
    UnavailableError,
)
from mmproc.transport import bytes_to_tensor, tensor_nbytes
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc

_PB_DTYPES = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_BFLOAT16: "bfloat16", pb.DTYPE_FLOAT16: "float16"}
_TRANSPORTS = {"auto": pb.TRANSPORT_AUTO, "serialized": pb.TRANSPORT_SERIALIZED}
_ERRORS_BY_CODE: dict[grpc.StatusCode, type[MmprocError]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def _channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
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
        target: str,
        *,
        device: str | torch.device = "cpu",
        transport: str = "auto",
        timeout: float = 60.0,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.device = torch.device(device)
        self.transport = transport
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target, options=_channel_options(max_message_bytes))
        self._stub = pb_grpc.EncoderStub(self._channel)

    def encode_images(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[torch.Tensor]:
        """One (tokens_i, hidden) tensor per image, on this client's device, in the server's dtype."""
        images = _check_images(images)
        request = _request(images, request_id, self.transport)
        assembler = _Assembler(len(images), self.device)
        try:
            for chunk in self._stub.EncodeImagesStream(request, timeout=timeout or self.timeout):
                assembler.add(chunk)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return assembler.tensors()

    def server_info(self, timeout: float | None = None) -> pb.ServerInfo:
        try:
            return self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EncoderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEncoderClient:
    """asyncio client (grpc.aio). Use from one event loop."""

    def __init__(
        self,
        target: str,
        *,
        device: str | torch.device = "cpu",
        transport: str = "auto",
        timeout: float = 60.0,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.device = torch.device(device)
        self.transport = transport
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(target, options=_channel_options(max_message_bytes))
        self._stub = pb_grpc.EncoderStub(self._channel)

    async def encode_images(
        self, images: Sequence[bytes], *, request_id: str | None = None, timeout: float | None = None
    ) -> list[torch.Tensor]:
        images = _check_images(images)
        request = _request(images, request_id, self.transport)
        assembler = _Assembler(len(images), self.device)
        try:
            async for chunk in self._stub.EncodeImagesStream(request, timeout=timeout or self.timeout):
                assembler.add(chunk)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return assembler.tensors()

    async def server_info(self, timeout: float | None = None) -> pb.ServerInfo:
        try:
            return await self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncEncoderClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
