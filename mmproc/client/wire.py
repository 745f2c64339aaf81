"""Wire format of the client: requests, typed errors from status details, and reassembly of streamed replies."""

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
    StaleSessionError,
    UnauthenticatedError,
    UnavailableError,
)
from mmproc.transport import bytes_to_tensor, tensor_nbytes
from mmproc.v1 import encoder_pb2 as pb

PB_DTYPES = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_BFLOAT16: "bfloat16", pb.DTYPE_FLOAT16: "float16"}
TRANSPORTS = {"auto": pb.TRANSPORT_AUTO, "serialized": pb.TRANSPORT_SERIALIZED, "ipc": pb.TRANSPORT_IPC}
ERRORS_BY_CODE: dict[grpc.StatusCode, type[MmprocError]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.FAILED_PRECONDITION: StaleSessionError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
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
        reason, index = "bad_request", -1
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
        for detail in status.details if status is not None else ():
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
                reason = info.reason or reason
                index = int(info.metadata.get("index", "-1"))
        return InvalidMediaError(message or "invalid request", reason=reason, index=index)
    cls = ERRORS_BY_CODE.get(code, InternalError)
    return cls(f"{code.name}: {message}")


class Assembler:
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
            nbytes = tensor_nbytes(tuple(header.shape), getattr(torch, PB_DTYPES[header.dtype]))
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
            out.append(bytes_to_tensor(bytes(buffer), PB_DTYPES[header.dtype], tuple(header.shape), self._device))
        return out


def make_request(images: Sequence[bytes], request_id: str | None, transport: str) -> pb.EncodeImagesRequest:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    return pb.EncodeImagesRequest(
        images=list(images), request_id=request_id or uuid.uuid4().hex[:16], transport=TRANSPORTS[transport]
    )


def check_images(images: Iterable[bytes]) -> list[bytes]:
    images = list(images)
    for i, data in enumerate(images):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"images[{i}] must be bytes, got {type(data).__name__}")
    return [bytes(data) for data in images]


def embedding_from_bytes(emb: pb.Embedding, device: torch.device) -> torch.Tensor:
    return bytes_to_tensor(emb.data, PB_DTYPES[emb.dtype], tuple(emb.shape), device)
