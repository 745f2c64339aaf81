"""The streamed reply's framing, written and read by hand around the payload so that it is copied once.

Valid: a message without `data` followed by a LEN field 2 parses with `data` set and equals protobuf's own bytes
(`data` has the highest field number)."""

from __future__ import annotations

from dataclasses import dataclass

from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.framing import LEN, len_field_head

_DATA_FIELD = pb.EncodeImagesChunk.DESCRIPTOR.fields_by_name["data"]
assert _DATA_FIELD.type == _DATA_FIELD.TYPE_BYTES and not _DATA_FIELD.is_repeated, "EncodeImagesChunk.data changed"


def chunk_head(request_id: str, index: int, offset: int, length: int, header: pb.Embedding | None = None) -> bytes:
    """The bytes of an EncodeImagesChunk that precede its `length` bytes of `data` (protobuf would copy the
    payload three times)."""
    head = pb.EncodeImagesChunk(request_id=request_id, header=header, index=index, offset=offset).SerializeToString()
    if not length:  # proto3 writes no empty bytes field
        return head
    return head + len_field_head(_DATA_FIELD.number, length)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One received EncodeImagesChunk: `fields` parsed without `data`, and `data` a view of the message bytes."""

    fields: pb.EncodeImagesChunk
    data: memoryview


_DATA_TAG = _DATA_FIELD.number << 3 | LEN
_FIXED_SIZES = {1: 8, 5: 4}  # wire types of fixed width: 64-bit and 32-bit


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at `pos`."""
    value = shift = 0
    while True:
        byte = buf[pos]  # IndexError past the end: a truncated message
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def read_chunk(message: bytes) -> StreamChunk:
    """EncodeImagesStream's response deserializer: the payload stays in the bytes gRPC received (protobuf would
    copy it twice). Anything unexpected is left to protobuf, which parses it or raises DecodeError."""
    view = memoryview(message)
    others: list[memoryview] = []  # every field but `data`, as it is on the wire
    data = view[:0]
    pos = 0
    try:
        while pos < len(message):
            start = pos
            tag, pos = _read_varint(message, pos)
            wire_type = tag & 7
            if wire_type == 0:
                pos = _read_varint(message, pos)[1]
            elif wire_type == 2:
                length, pos = _read_varint(message, pos)
                pos += length
                if tag == _DATA_TAG:
                    data = view[pos - length : pos]
                    continue
            elif wire_type in _FIXED_SIZES:
                pos += _FIXED_SIZES[wire_type]
            else:
                raise ValueError(f"wire type {wire_type}")
            others.append(view[start:pos])
        if pos != len(message):
            raise ValueError("truncated")
    except (IndexError, ValueError):
        parsed = pb.EncodeImagesChunk.FromString(message)
        return StreamChunk(parsed, memoryview(parsed.data))
    return StreamChunk(pb.EncodeImagesChunk.FromString(b"".join(others)), data)
