"""Protobuf's wire format, the few pieces the hand-written framings (chunks.py, unary.py) need."""

from __future__ import annotations

LEN = 2  # wire type of bytes, strings and sub-messages


def encode_varint(value: int) -> bytes:
    """Base-128 varint: 7 bits per byte, least significant group first, high bit set on all but the last byte."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def len_field_head(number: int, length: int) -> bytes:
    """The tag and length that precede `length` bytes of LEN field `number`."""
    return encode_varint(number << 3 | LEN) + encode_varint(length)
