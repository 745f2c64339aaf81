"""The unary serialized reply framed by hand around its payloads, which saves two copies on the event loop.

Valid because protobuf parses fields in any order: only the field order differs from protobuf's own bytes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.framing import len_field_head

_EMBEDDINGS = pb.EncodeImagesResponse.DESCRIPTOR.fields_by_name["embeddings"].number
_DATA = pb.Embedding.DESCRIPTOR.fields_by_name["data"].number
P = TypeVar("P")


def reply_framing(head: pb.EncodeImagesResponse, headers: Sequence[pb.Embedding], sizes: Sequence[int]) -> list[bytes]:
    """The reply's bytes around its payloads: framing[0], framing[1], payload 0, framing[2], payload 1, ..."""
    if head.embeddings or any(h.HasField("data") for h in headers):
        raise ValueError("head without embeddings, headers without data: the payloads are written here")
    framing = [head.SerializeToString()]
    for header, size in zip(headers, sizes, strict=True):
        fields = header.SerializeToString() + len_field_head(_DATA, size)
        framing.append(len_field_head(_EMBEDDINGS, len(fields) + size) + fields)
    return framing


def interleave(framing: Sequence[bytes], payloads: Iterable[P]) -> Iterator[bytes | P]:
    """The parts of reply_framing's message in order."""
    yield framing[0]
    for prefix, payload in zip(framing[1:], payloads):
        yield prefix
        yield payload
