"""`SharedEmbeddings`: one encoded batch read by every rank of a tensor-parallel group.

    # rank 0                                              # every rank r (0 included)
    shared = client.encode_images_shared(images, readers=tp)
    blob = shared.to_bytes()   --- broadcast --->         shared = SharedEmbeddings.from_bytes(blob)
                                                          with client.read_shared(shared, r) as views:
                                                              inputs_embeds[...] = views[i]  # on rank r's GPU

The bytes are protobuf, never pickle: pool descriptors over IPC, else the embeddings' raw bytes.
"""

from __future__ import annotations

import torch
from google.protobuf.message import DecodeError

from mmproc.errors import InternalError
from mmproc.transport.cuda_ipc.pool import PoolIdentity, SliceDescriptor
from mmproc.transport.cuda_ipc.runtime import IPC_HANDLE_BYTES
from mmproc.transport.leases.records import MAX_READERS
from mmproc.transport.serialized.staging import bytes_to_tensor, tensor_nbytes
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.cuda_ipc import descriptor_from_pb, identity_from_pb, pool_info_pb
from mmproc.wire.dtypes import PB_TO_DTYPE, PB_TO_NAME

__all__ = ["SharedEmbeddings", "descriptor_from_pb", "identity_from_pb"]


class SharedEmbeddings:
    """What rank 0 hands its tensor-parallel peers; immutable."""

    def __init__(self, message: pb.SharedEmbeddings) -> None:
        _check(message)
        self._message = message

    @classmethod
    def from_reply(cls, reply: pb.EncodeImagesResponse, pool: PoolIdentity | None, readers: int) -> SharedEmbeddings:
        message = pb.SharedEmbeddings(reply=reply, readers=readers)
        if reply.transport == pb.TRANSPORT_IPC:
            if pool is None:
                raise InternalError("an IPC reply without the pool it points into")
            message.pool.CopyFrom(pool_info_pb(pool))
        return cls(message)

    def to_bytes(self) -> bytes:
        return self._message.SerializeToString()

    @classmethod
    def from_bytes(cls, data: bytes) -> SharedEmbeddings:
        """Parse rank 0's `to_bytes`; ValueError when malformed."""
        message = pb.SharedEmbeddings()
        try:
            message.ParseFromString(bytes(data))
        except DecodeError as exc:
            raise ValueError(f"not SharedEmbeddings bytes: {exc}") from None
        return cls(message)

    @property
    def readers(self) -> int:
        return self._message.readers

    @property
    def transport(self) -> str:
        """Either "ipc" or "serialized"."""
        return "ipc" if self._message.reply.transport == pb.TRANSPORT_IPC else "serialized"

    @property
    def request_id(self) -> str:
        return self._message.reply.request_id

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(emb.shape) for emb in self._message.reply.embeddings]

    @property
    def reply(self) -> pb.EncodeImagesResponse:
        return self._message.reply

    @property
    def pool(self) -> PoolIdentity | None:
        return identity_from_pb(self._message.pool) if self.transport == "ipc" else None

    def descriptors(self) -> list[SliceDescriptor]:
        """IPC only: one descriptor per image (all in one lease)."""
        return [descriptor_from_pb(emb.ipc) for emb in self._message.reply.embeddings]

    def tensors(self, device: torch.device) -> list[torch.Tensor]:
        """Serialized only: one (tokens_i, hidden) tensor per image on `device` (a fresh copy per call)."""
        return [
            bytes_to_tensor(emb.data, PB_TO_NAME[emb.dtype], tuple(emb.shape), device)
            for emb in self._message.reply.embeddings
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SharedEmbeddings) and self._message == other._message

    def __repr__(self) -> str:
        return f"SharedEmbeddings({self.transport}, readers={self.readers}, images={len(self.shapes)})"


def _check(message: pb.SharedEmbeddings) -> None:
    """ValueError unless the message is as rank 0's client produces it."""
    reply = message.reply
    problem = None
    if not 1 <= message.readers <= MAX_READERS:
        problem = f"readers {message.readers} not in 1..{MAX_READERS}"
    elif not reply.embeddings:
        problem = "no embeddings"
    elif any(emb.dtype not in PB_TO_NAME or len(emb.shape) != 2 for emb in reply.embeddings):
        problem = "an embedding has an unknown dtype or is not 2-D"
    elif reply.transport == pb.TRANSPORT_IPC:
        problem = _ipc_problem(message)
    elif any(emb.WhichOneof("payload") != "data" for emb in reply.embeddings):
        problem = "a serialized embedding carries no bytes"
    elif any(len(emb.data) != tensor_nbytes(tuple(emb.shape), PB_TO_DTYPE[emb.dtype]) for emb in reply.embeddings):
        problem = "a serialized embedding's bytes do not match its shape and dtype"
    if problem is not None:
        raise ValueError(f"malformed SharedEmbeddings: {problem}")


def _ipc_problem(message: pb.SharedEmbeddings) -> str | None:
    pool, embeddings = message.pool, message.reply.embeddings
    if not pool.pool_id or len(pool.ipc_handle) != IPC_HANDLE_BYTES:
        return "an IPC batch without a pool identity"
    if any(emb.WhichOneof("payload") != "ipc" for emb in embeddings):
        return "an IPC embedding without a descriptor"
    if any((emb.ipc.pool_id, emb.ipc.epoch) != (pool.pool_id, pool.epoch) for emb in embeddings):
        return "a descriptor names another pool"
    if len({emb.ipc.lease_id for emb in embeddings}) != 1:
        return "descriptors of more than one lease"
    if any(descriptor_from_pb(emb.ipc).readers != message.readers for emb in embeddings):
        return f"descriptors are not for {message.readers} readers (does the server know the readers field?)"
    return None
