"""The streamed reply's framing, both ways: the server writes each EncodeImagesChunk by hand around its payload
(one copy, into the bytes handed to gRPC) and the client reads it back leaving the payload in place.

Valid because a message without `data` followed by a hand-written LEN field 2 parses to the message with `data`
set (the last singular field wins) and equals protobuf's own bytes (`data` has the highest field number).
"""

from __future__ import annotations

from dataclasses import dataclass

from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.framing import LEN, len_field_head

_DATA_FIELD = pb.EncodeImagesChunk.DESCRIPTOR.fields_by_name["data"]
assert _DATA_FIELD.type == _DATA_FIELD.TYPE_BYTES and not _DATA_FIELD.is_repeated, "EncodeImagesChunk.data changed"


def chunk_head(request_id: str, index: int, offset: int, length: int, header: pb.Embedding | None = None) -> bytes:
    """The bytes of an EncodeImagesChunk with these fields that precede its `length` bytes of `data`: the message
    is these bytes and then the payload, copied once (host_copy.concat_bytes).

    `pb.EncodeImagesChunk(..., data=bytes(data)).SerializeToString()` gives the same bytes, but copies the payload
    three times (into a bytes object, into the message, into the serialization)."""
    head = pb.EncodeImagesChunk(request_id=request_id, header=header, index=index, offset=offset).SerializeToString()
    if not length:  # proto3 writes no empty bytes field
        return head
    return head + len_field_head(_DATA_FIELD.number, length)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One received EncodeImagesChunk: every field but `data` parsed by protobuf (`fields`, whose own `data` is
    empty), and `data` as a read-only view of the received message bytes (no copy)."""

    fields: pb.EncodeImagesChunk
    data: memoryview


_DATA_TAG = _DATA_FIELD.number << 3 | LEN
_FIXED_SIZES = {1: 8, 5: 4}  # wire types of fixed width: 64-bit and 32-bit


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at `pos` (7 bits a byte, least significant first)."""
    value = shift = 0
    while True:
        byte = buf[pos]  # IndexError past the end: a truncated message
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def read_chunk(message: bytes) -> StreamChunk:
    """EncodeImagesStream's response deserializer (see `encoder_stub`): the payload stays in the bytes gRPC
    received, so that the Assembler copies it once, straight into its buffer.

    `pb.EncodeImagesChunk.FromString(message).data` would copy it twice (into the parsed message, into a new bytes
    object). Here the top-level fields are walked by their wire-format framing; everything but `data` (a few
    dozen bytes) goes through protobuf as usual. Anything unexpected (a group, a truncated or malformed message)
    is left to protobuf, which parses it or raises DecodeError.
    """
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
