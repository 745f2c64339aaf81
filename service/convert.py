"""Engine results <-> protobuf messages (serialized transport). Shared by the gRPC servicer and its tests."""

from __future__ import annotations

from collections.abc import Iterator

from mmproc.transport import DTYPE_NAMES, stage_to_host, tensor_to_bytes
from mmproc.transport.ipc_pool import PoolIdentity
from mmproc.v1 import encoder_pb2 as pb
from service.engine import EncodedImage

DTYPE_TO_PB = {"float32": pb.DTYPE_FLOAT32, "bfloat16": pb.DTYPE_BFLOAT16, "float16": pb.DTYPE_FLOAT16}


def embedding_header(result: EncodedImage) -> pb.Embedding:
    emb = result.embedding
    return pb.Embedding(
        index=result.index,
        num_tokens=result.num_tokens,
        grid_h=result.grid_hw[0],
        grid_w=result.grid_hw[1],
        dtype=DTYPE_TO_PB[DTYPE_NAMES[emb.dtype]],
        shape=list(emb.shape),
    )


def serialized_payloads(results: list[EncodedImage]) -> list[bytes]:
    """Raw bytes of every result; from a GPU, one pinned staging buffer and one synchronize per request."""
    return [tensor_to_bytes(host) for host in stage_to_host([r.embedding for r in results])]


def serialized_reply(request_id: str, results: list[EncodedImage], payloads: list[bytes]) -> pb.EncodeImagesResponse:
    reply = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_SERIALIZED)
    for result, data in zip(results, payloads):
        header = embedding_header(result)
        header.data = data
        reply.embeddings.append(header)
    return reply


def serialized_chunks(
    request_id: str, results: list[EncodedImage], payloads: list[bytes], chunk_bytes: int
) -> Iterator[pb.EncodeImagesChunk]:
    """Each image: a header message carrying the first chunk, then the rest in `chunk_bytes` pieces."""
    for result, data in zip(results, payloads):
        view = memoryview(data)
        yield pb.EncodeImagesChunk(
            request_id=request_id,
            header=embedding_header(result),
            index=result.index,
            offset=0,
            data=data if len(data) <= chunk_bytes else view[:chunk_bytes].tobytes(),  # no copy when it fits
        )
        for offset in range(chunk_bytes, len(data), chunk_bytes):
            yield pb.EncodeImagesChunk(
                request_id=request_id,
                index=result.index,
                offset=offset,
                data=view[offset : offset + chunk_bytes].tobytes(),
            )


def ipc_reply(request_id: str, results: list[EncodedImage], pool: PoolIdentity) -> pb.EncodeImagesResponse:
    """Descriptors only: the embeddings stay in the pool, the consumer (or each of its readers) reads them there."""
    reply = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_IPC)
    for result in results:
        desc = result.descriptor
        assert desc is not None
        header = embedding_header(result)
        header.ipc.CopyFrom(
            pb.IpcDescriptor(
                pool_id=pool.pool_id,
                epoch=pool.epoch,
                device_uuid=pool.device_uuid,
                lease_id=desc.lease_id,
                generation=desc.generation,
                offset_bytes=desc.offset,
                nbytes=desc.nbytes,
                ready_offset_bytes=desc.ready_offset,
                ack_offset_bytes=desc.ack_offset,
                readers=desc.readers,
                reader_ack_offset_bytes=desc.ack_offsets,
            )
        )
        reply.embeddings.append(header)
    return reply
