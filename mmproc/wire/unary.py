"""The unary serialized reply's framing on the server: EncodeImagesResponse written by hand around its payloads,
which land in the bytes handed to gRPC (mmproc.transport's write_messages; EncodeImages passes them through).

Building the message instead copies every payload twice more, on the event loop: into the message (`data = ...`)
and into gRPC's serialization. Valid because protobuf parses fields in any order: the response's own fields, then
per image an `embeddings` field holding its header's fields and then its `data`, parse to the message protobuf
would have built (the bytes differ from protobuf's own only in field order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.framing import len_field_head

_EMBEDDINGS = pb.EncodeImagesResponse.DESCRIPTOR.fields_by_name["embeddings"].number
_DATA = pb.Embedding.DESCRIPTOR.fields_by_name["data"].number
P = TypeVar("P")


def reply_framing(head: pb.EncodeImagesResponse, headers: Sequence[pb.Embedding], sizes: Sequence[int]) -> list[bytes]:
    """The reply's bytes around its payloads: `head` serialized, then per image the bytes that precede its payload
    of `sizes[i]` bytes (an `embeddings` field holding the header's fields and the head of its `data`). The message
    is framing[0], framing[1], payload 0, framing[2], payload 1, ...; `head` has no embeddings and the headers no
    `data` of their own."""
    if head.embeddings or any(h.HasField("data") for h in headers):
        raise ValueError("head without embeddings, headers without data: the payloads are written here")
    framing = [head.SerializeToString()]
    for header, size in zip(headers, sizes, strict=True):
        fields = header.SerializeToString() + len_field_head(_DATA, size)
        framing.append(len_field_head(_EMBEDDINGS, len(fields) + size) + fields)
    return framing


def interleave(framing: Sequence[bytes], payloads: Iterable[P]) -> Iterator[bytes | P]:
    """framing[0], then each payload after its own framing: the parts of reply_framing's message in order."""
    yield framing[0]
    for prefix, payload in zip(framing[1:], payloads):
        yield prefix
        yield payload
