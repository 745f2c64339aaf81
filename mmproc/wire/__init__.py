"""The protobuf wire codec that the server and the client share (the server never imports mmproc.client):
dtypes, the replies' hand-written framing (streamed chunks, the unary reply), the IPC pool's identity. Requests,
errors and reassembly of replies stay with the client (mmproc/client/rpc.py); results -> messages with the
service (service/frontends/replies.py)."""

from mmproc.wire.chunks import StreamChunk, chunk_head, read_chunk
from mmproc.wire.dtypes import NAME_TO_PB, PB_TO_DTYPE, PB_TO_NAME
from mmproc.wire.pool import descriptor_from_pb, identity_from_pb, pool_info_pb
from mmproc.wire.unary import interleave, reply_framing

__all__ = [
    "NAME_TO_PB",
    "PB_TO_DTYPE",
    "PB_TO_NAME",
    "StreamChunk",
    "chunk_head",
    "descriptor_from_pb",
    "identity_from_pb",
    "interleave",
    "pool_info_pb",
    "read_chunk",
    "reply_framing",
]
