"""The client's side of the RPCs: requests, typed errors from status details, reassembly of streamed replies."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence

import grpc
import torch
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from mmproc.errors import (
    STATUS_ERRORS,
    InternalError,
    InvalidMediaError,
    InvalidRequestError,
    MmprocError,
    ResourceExhaustedError,
    UnavailableError,
)
from mmproc.transport.serialized.staging import bytes_to_tensor
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from mmproc.wire.chunks import StreamChunk, read_chunk
from mmproc.wire.dtypes import PB_TO_DTYPE, PB_TO_NAME

TRANSPORTS = {"auto": pb.TRANSPORT_AUTO, "serialized": pb.TRANSPORT_SERIALIZED, "ipc": pb.TRANSPORT_IPC}
ERRORS_BY_CODE: dict[grpc.StatusCode, type[MmprocError]] = {
    **{grpc.StatusCode[cls.grpc_code]: cls for cls in STATUS_ERRORS if cls is not InvalidMediaError},
    grpc.StatusCode.CANCELLED: UnavailableError,  # from the server's side: it is shutting down; retry elsewhere
}


def channel_options(max_message_bytes: int) -> list[tuple[str, int | str]]:
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
        reason, index, cls, item = "bad_request", -1, InvalidMediaError, "image"
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
        for detail in status.details if status is not None else ():
            info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
                reason = info.reason or reason
                index = int(info.metadata.get("index", "-1"))
                cls = InvalidRequestError if info.metadata.get("kind") == InvalidRequestError.kind else cls
            elif detail.Is(bad.DESCRIPTOR) and detail.Unpack(bad) and bad.field_violations:
                item = "video" if bad.field_violations[0].field.startswith("videos") else "image"  # videos[i]
        return cls(message or "invalid request", reason=reason, index=index, item=item)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return _refusal(err, f"{code.name}: {message}")
    cls = ERRORS_BY_CODE.get(code, InternalError)
    return cls(f"{code.name}: {message}")


def _refusal(err: grpc.RpcError, message: str) -> ResourceExhaustedError:
    """A refusal with the server's hints: when to come back (RetryInfo) and why (ErrorInfo's reason)."""
    retry_after, cause = None, ""
    status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    for detail in status.details if status is not None else ():
        retry, info = error_details_pb2.RetryInfo(), error_details_pb2.ErrorInfo()
        if detail.Is(retry.DESCRIPTOR) and detail.Unpack(retry):
            retry_after = retry.retry_delay.ToMilliseconds() / 1000
        elif detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            cause = info.reason.lower()
    return ResourceExhaustedError(message, retry_after_s=retry_after, cause=cause)


def encoder_stub(channel: grpc.Channel | grpc.aio.Channel) -> pb_grpc.EncoderStub:
    """The generated stub, except that EncodeImagesStream yields `StreamChunk`s (`read_chunk`)."""
    stub = pb_grpc.EncoderStub(channel)
    method = f"/{pb.DESCRIPTOR.services_by_name['Encoder'].full_name}/EncodeImagesStream"
    stub.EncodeImagesStream = channel.unary_stream(
        method,
        request_serializer=pb.EncodeImagesRequest.SerializeToString,
        response_deserializer=read_chunk,
        _registered_method=True,
    )
    return stub


class Assembler:
    """Collects a streamed reply into one host buffer per image (pinned for a GPU; on the CPU it is the tensor)."""

    def __init__(self, count: int, device: torch.device) -> None:
        self._device = device
        self._pinned = device.type == "cuda"
        self._headers: list[pb.Embedding | None] = [None] * count
        self._buffers: list[torch.Tensor | None] = [None] * count  # (nbytes,) uint8 on the host
        self._writers: list[memoryview | None] = [None] * count  # the same memory, written by plain memcpy
        self._received = [0] * count

    def add(self, chunk: StreamChunk) -> None:
        fields, data = chunk.fields, chunk.data
        index = fields.index
        if not 0 <= index < len(self._headers):
            raise InternalError(f"server sent a chunk for image {index} of {len(self._headers)}")
        if fields.HasField("header"):
            header = fields.header
            buffer = torch.empty(embedding_nbytes(header), dtype=torch.uint8, pin_memory=self._pinned)
            self._headers[index], self._buffers[index] = header, buffer
            self._writers[index] = memoryview(buffer.numpy())
        writer = self._writers[index]
        size, offset = len(data), fields.offset
        if writer is None or offset + size > len(writer):
            raise InternalError(f"malformed stream for image {index}")
        if size:  # the one copy on this side
            writer[offset : offset + size] = data
        self._received[index] += size

    def headers(self) -> list[pb.Embedding]:
        """Every image's header (call after `tensors`, which checks that all arrived)."""
        return [h for h in self._headers if h is not None]

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for index, (header, buffer) in enumerate(zip(self._headers, self._buffers)):
            if header is None or buffer is None or self._received[index] != buffer.numel():
                raise InternalError(f"stream ended before image {index} was complete")
            dtype = PB_TO_DTYPE[header.dtype]
            tensor = buffer.view(dtype).view(tuple(header.shape))
            out.append(tensor if self._device.type == "cpu" else tensor.to(self._device, non_blocking=True))
        return out


def make_request(
    images: Sequence[bytes],
    request_id: str | None,
    transport: str,
    *,
    keys: Sequence[str] = (),
    headers_only: bool = False,
    cache_bypass: bool = False,
) -> pb.EncodeImagesRequest:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    return pb.EncodeImagesRequest(
        images=list(images),
        request_id=request_id or uuid.uuid4().hex[:16],
        transport=TRANSPORTS[transport],
        keys=list(keys),
        headers_only=headers_only,
        cache_bypass=cache_bypass,
    )


def check_keys(keys: Iterable[str]) -> list[str]:
    keys = list(keys)
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key:
            raise TypeError(f"keys[{i}] must be a non-empty str, got {key!r}")
    return keys


def check_images(images: Iterable[bytes]) -> list[bytes]:
    if isinstance(images, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"pass a list of images (e.g. [data]), got one {type(images).__name__}")
    images = list(images)
    for i, data in enumerate(images):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"images[{i}] must be bytes, got {type(data).__name__}")
    return [bytes(data) for data in images]


def client_device(device: str | torch.device) -> torch.device:
    """The client's device, refused at construction if this host cannot use it (not at the first call)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}, but CUDA is not available on this host: use device='cpu'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device={str(device)!r}, but this host has {torch.cuda.device_count()} CUDA device(s)")
    return device


def embedding_nbytes(header: pb.Embedding) -> int:
    """Bytes of a (tokens, hidden) embedding of `header`'s shape and dtype."""
    return math.prod(header.shape) * PB_TO_DTYPE[header.dtype].itemsize


def embedding_from_bytes(emb: pb.Embedding, device: torch.device) -> torch.Tensor:
    return bytes_to_tensor(emb.data, PB_TO_NAME[emb.dtype], tuple(emb.shape), device)


def collect_reply(chunks: Iterable[StreamChunk], count: int) -> pb.EncodeImagesResponse:
    """A streamed serialized reply (headers, then data chunks) as one EncodeImagesResponse with the bytes in it."""
    headers: list[pb.Embedding | None] = [None] * count
    buffers: list[bytearray | None] = [None] * count
    request_id = ""
    for chunk in chunks:
        fields, data = chunk.fields, chunk.data
        request_id = fields.request_id or request_id
        index = fields.index
        if not 0 <= index < count:
            raise InternalError(f"server sent a chunk for image {index} of {count}")
        if fields.HasField("header"):
            header = fields.header
            headers[index], buffers[index] = header, bytearray(embedding_nbytes(header))
        buffer = buffers[index]
        if buffer is None or fields.offset + len(data) > len(buffer):
            raise InternalError(f"malformed stream for image {index}")
        buffer[fields.offset : fields.offset + len(data)] = data
    reply = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_SERIALIZED)
    for index, (header, buffer) in enumerate(zip(headers, buffers)):
        if header is None or buffer is None:
            raise InternalError(f"stream ended without image {index}")
        emb = reply.embeddings.add()
        emb.CopyFrom(header)
        emb.data = bytes(buffer)
    return reply
