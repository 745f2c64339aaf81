"""The serialized transport's reply codec on the server: results -> the bytes gRPC sends, framed by hand."""

from __future__ import annotations

from mmproc.transport.serialized.host_copy import concat_bytes, raw_bytes
from mmproc.transport.serialized.pinned_messages import PinnedMessages
from mmproc.transport.serialized.staging import Part, start_staging, write_messages
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.chunks import chunk_head
from mmproc.wire.results import SERIALIZED, EncodedImage, embedding_header
from mmproc.wire.unary import interleave, reply_framing


def serialized_payloads(results: list[EncodedImage]) -> list[bytes]:
    """Raw bytes of every result, each copied out as soon as its own D2H has landed."""
    return [concat_bytes(b"", staged.wait()) for staged in start_staging([r.embedding for r in results])]


def serialized_reply(request_id: str, results: list[EncodedImage], pinned: PinnedMessages | None = None) -> bytes:
    """EncodeImages' serialized reply, as the bytes gRPC sends."""
    head = pb.EncodeImagesResponse(request_id=request_id, transport=pb.TRANSPORT_SERIALIZED, transport_name=SERIALIZED)
    framing = reply_framing(head, [embedding_header(r) for r in results], [r.embedding.nbytes for r in results])
    return write_messages([list(interleave(framing, (r.embedding for r in results)))], pinned)[0]


def serialized_stream(
    request_id: str, results: list[EncodedImage], chunk_bytes: int, pinned: PinnedMessages | None = None
) -> list[bytes]:
    """Every message of a streamed reply: per image its header with the first `chunk_bytes`, then the rest."""
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
    """Serialized replies are bytes already; other replies (IPC, headers) are messages."""
    return message if isinstance(message, bytes) else message.SerializeToString()
