"""Engine results -> protobuf messages: serialized replies (framed by mmproc/wire, `reply_framing` and `chunk_head`,
written by mmproc.transport's write_messages: from a GPU straight into page-locked messages, or with one host copy
of each payload) and IPC descriptors. Shared by the gRPC servicer, the HTTP app and their tests."""

from __future__ import annotations

from mmproc.transport.cuda_ipc.pool import PoolIdentity
from mmproc.transport.serialized.host_copy import concat_bytes, raw_bytes
from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.transport.serialized.staging import DTYPE_NAMES, Part, start_staging, write_messages
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire import NAME_TO_PB, chunk_head, interleave, reply_framing
from service.pipeline.encoded import EncodedImage

CACHE_TO_PB = {
    "": pb.CACHE_STATUS_UNSPECIFIED,
    "miss": pb.CACHE_MISS,
    "hit": pb.CACHE_HIT,
    "coalesced": pb.CACHE_COALESCED,
    "bypass": pb.CACHE_BYPASS,
}


def embedding_header(result: EncodedImage) -> pb.Embedding:
    emb = result.embedding
    return pb.Embedding(
        index=result.index,
        num_tokens=result.num_tokens,
        grid_t=1,
        grid_h=result.grid_hw[0],
        grid_w=result.grid_hw[1],
        image_width=result.image_size[0],
        image_height=result.image_size[1],
        key=result.key,
        cache=CACHE_TO_PB[result.cache],
        mm_hash=result.mm_hash,
        dtype=NAME_TO_PB[DTYPE_NAMES[emb.dtype]],
        shape=list(emb.shape),
    )


def headers_reply(request_id: str, results: list[EncodedImage]) -> pb.EncodeImagesResponse:
    """Headers only (EncodeImagesRequest.headers_only): grids, token counts, shapes, keys; no payload."""
    reply = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_SERIALIZED)
    reply.embeddings.extend(embedding_header(r) for r in results)
    return reply


def payload_bytes(results: list[EncodedImage]) -> int:
    """The raw bytes a serialized reply carries: what it takes from the reply byte budget before staging."""
    return sum(r.embedding.nbytes for r in results)


def serialized_payloads(results: list[EncodedImage]) -> list[bytes]:
    """Raw bytes of every result. From a GPU: one pinned staging buffer per request (start_staging), and image
    i's bytes are copied out of it as soon as its own D2H has landed, while later images are still in flight."""
    return [concat_bytes(b"", staged.wait()) for staged in start_staging([r.embedding for r in results])]


def serialized_reply(request_id: str, results: list[EncodedImage], pinned: PinnedMessages | None = None) -> bytes:
    """EncodeImages' serialized reply, as the bytes gRPC sends (mmproc/wire/unary.py), written by write_messages:
    from a GPU, into a page-locked message of `pinned` by the D2H itself, or staged and copied once."""
    head = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_SERIALIZED)
    framing = reply_framing(head, [embedding_header(r) for r in results], [r.embedding.nbytes for r in results])
    return write_messages([list(interleave(framing, (r.embedding for r in results)))], pinned)[0]


def serialized_stream(
    request_id: str, results: list[EncodedImage], chunk_bytes: int, pinned: PinnedMessages | None = None
) -> list[bytes]:
    """Every message of a streamed reply, already serialized: what EncodeImagesStream hands gRPC.

    Each image: a message with its header and the first `chunk_bytes` of its payload, then the rest in
    `chunk_bytes` pieces; written as serialized_reply's."""
    messages: list[list[Part]] = []
    for result in results:
        payload = raw_bytes(result.embedding)
        for offset, head in _chunk_heads(request_id, result, chunk_bytes):
            messages.append([head, payload[offset : offset + chunk_bytes]] if payload.numel() else [head])
    return write_messages(messages, pinned)


def _chunk_heads(request_id: str, result: EncodedImage, chunk_bytes: int) -> list[tuple[int, bytes]]:
    """(offset, head) of each message of one image's payload; an empty payload still sends its header."""
    nbytes, header = result.embedding.nbytes, embedding_header(result)
    heads = []
    for offset in range(0, max(nbytes, 1), chunk_bytes):
        length = min(chunk_bytes, nbytes - offset)
        heads.append((offset, chunk_head(request_id, result.index, offset, length, header if offset == 0 else None)))
    return heads


def passthrough_serializer(message: bytes | pb.EncodeImagesResponse | pb.EncodeImagesChunk) -> bytes:
    """The response serializer of EncodeImages and EncodeImagesStream: the serialized replies
    (`serialized_reply`, `serialized_stream`) are bytes already; other replies (IPC, headers) are messages."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def in_pool(results: list[EncodedImage]) -> bool:
    """Whether the engine delivered into a pool lease: it picks one destination per request, so the first says."""
    return bool(results) and results[0].descriptor is not None


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
