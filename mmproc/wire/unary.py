"""The unary serialized reply's framing on the server: EncodeImagesResponse written by hand around its payloads,
each copied once, straight into the bytes handed to gRPC (EncodeImages then passes them through unserialized).

Building the message instead copies every payload twice more, on the event loop: into the message (`data = ...`)
and into gRPC's serialization. Valid because protobuf parses fields in any order: the response's own fields, then
per image an `embeddings` field holding its header's fields and then its `data`, parse to the message protobuf
would have built (the bytes differ from protobuf's own only in field order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from mmproc.transport.host_copy import Payload, join_bytes
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.framing import len_field_head

_EMBEDDINGS = pb.EncodeImagesResponse.DESCRIPTOR.fields_by_name["embeddings"].number
_DATA = pb.Embedding.DESCRIPTOR.fields_by_name["data"].number


def reply_wire(
    head: pb.EncodeImagesResponse, headers: Sequence[pb.Embedding], sizes: Sequence[int], payloads: Iterable[Payload]
) -> bytes:
    """`head` serialized with one embedding per header appended, the embedding's `data` the matching payload of
    `sizes[i]` bytes. `payloads` may wait for each one in turn (see join_bytes); `head` has no embeddings and
    the headers no `data` of their own."""
    if head.embeddings or any(h.HasField("data") for h in headers):
        raise ValueError("head without embeddings, headers without data: the payloads are written here")
    prefixes = []
    for header, size in zip(headers, sizes, strict=True):
        fields = header.SerializeToString() + len_field_head(_DATA, size)
        prefixes.append(len_field_head(_EMBEDDINGS, len(fields) + size) + fields)
    first = head.SerializeToString()

    def parts() -> Iterator[Payload]:
        yield first
        for prefix, payload in zip(prefixes, payloads):
            yield prefix
            yield payload

    return join_bytes(len(first) + sum(map(len, prefixes)) + sum(sizes), parts())
