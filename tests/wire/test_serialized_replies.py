"""The streamed reply serialized by hand (service.frontends.replies): the bytes must be the message protobuf would build."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmproc.transport.serialized.host_copy import concat_bytes
from mmproc.transport.serialized.staging import tensor_to_bytes
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.chunks import chunk_head
from mmproc.wire.results import embedding_header
from mmproc.wire.serialized import passthrough_serializer, serialized_stream
from service.frontends.grpc.server import GrpcServicer, _HandlerRecorder, add_encoder_servicer
from service.observe.metrics import Metrics
from service.pipeline.state import ServingState
from tests.support.encoded import results_of

HEADER = pb.Embedding(index=3, num_tokens=361, grid_h=38, grid_w=38, dtype=pb.DTYPE_BFLOAT16, shape=[361, 7168])
# Payload sizes at the varint boundaries of the length prefix (1 -> 2 -> 3 -> 4 bytes), and around them.
VARINT_EDGES = [0, 1, 2, 127, 128, 129, 16_383, 16_384, 2_097_151, 2_097_152]


def normal(request_id: str, index: int, offset: int, data: bytes, header: pb.Embedding | None) -> pb.EncodeImagesChunk:
    return pb.EncodeImagesChunk(request_id=request_id, header=header, index=index, offset=offset, data=data)


def check(request_id: str, index: int, offset: int, data: bytes, header: pb.Embedding | None) -> None:
    want = normal(request_id, index, offset, data, header)
    wire = concat_bytes(chunk_head(request_id, index, offset, len(data), header), memoryview(data))
    got = pb.EncodeImagesChunk.FromString(wire)
    assert got == want
    assert got.data == data and got.HasField("header") == (header is not None)
    assert wire == want.SerializeToString()  # protobuf writes fields in number order, `data` last: same bytes


@pytest.mark.parametrize("size", VARINT_EDGES)
def test_payload_sizes_across_varint_length_boundaries(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    check("req-1", 0, 0, data, HEADER)
    check("", 5, 2**40, data, None)


def test_every_field_at_its_extremes() -> None:
    check("", 0, 0, b"", None)  # an all-default message: empty on the wire
    check("r" * 300, 2**32 - 1, 2**64 - 1, b"\x00", pb.Embedding())  # an empty header is still present
    check("ünïcode-id", 1, 1, b"\xff" * 3, HEADER)


@settings(max_examples=200, deadline=None)
@given(
    request_id=st.text(max_size=40),
    index=st.integers(0, 2**32 - 1),
    offset=st.integers(0, 2**64 - 1),
    data=st.binary(max_size=3000),
    with_header=st.booleans(),
    shape=st.lists(st.integers(0, 2**64 - 1), max_size=3),
)
def test_hand_written_chunks_parse_to_the_protobuf_message(request_id, index, offset, data, with_header, shape) -> None:
    header = pb.Embedding(index=index, shape=shape, dtype=pb.DTYPE_FLOAT16) if with_header else None
    check(request_id, index, offset, data, header)


@pytest.mark.parametrize("chunk_bytes", [16, 47, 48, 49, 1 << 20])
def test_the_stream_is_the_chunks_protobuf_would_build(chunk_bytes: int) -> None:
    # 3 tokens x 8 x bf16 = 48 bytes: chunks of exactly a payload, one byte short of it, one byte over it, and
    # an image without tokens (header only).
    results = results_of([3, 0, 7, 1], hidden=8)
    wire = serialized_stream("req-9", results, chunk_bytes)
    want = []
    for result in results:
        data = tensor_to_bytes(result.embedding)
        for offset in range(0, max(len(data), 1), chunk_bytes):
            header = embedding_header(result) if offset == 0 else None
            want.append(normal("req-9", result.index, offset, data[offset : offset + chunk_bytes], header))
    assert [pb.EncodeImagesChunk.FromString(m) for m in wire] == want
    assert all(len(m.data) <= chunk_bytes for m in want)


def test_the_encode_handlers_pass_serialized_replies_through() -> None:
    recorder = _HandlerRecorder()
    servicer = GrpcServicer(ServingState(Metrics()), default_deadline_s=1.0)
    add_encoder_servicer(servicer, recorder)  # type: ignore[arg-type]  # stands in for the server
    service = pb.DESCRIPTOR.services_by_name["Encoder"]
    assert set(recorder.handlers) == {m.name for m in service.methods}  # every RPC, from the generated code
    stream, unary = recorder.handlers["EncodeImagesStream"], recorder.handlers["EncodeImages"]
    assert isinstance(stream, grpc.RpcMethodHandler) and stream.unary_stream is not None
    assert unary.unary_unary is not None
    assert stream.response_serializer is passthrough_serializer is unary.response_serializer
    assert passthrough_serializer(b"\x18\x01") == b"\x18\x01"
    message = pb.EncodeImagesChunk(index=1, data=b"xy")
    assert passthrough_serializer(message) == message.SerializeToString()
    assert passthrough_serializer(pb.EncodeImagesResponse(request_id="a")) == b"\n\x01a"  # IPC, headers_only
    info = recorder.handlers["GetServerInfo"]  # the others keep their generated serializers
    assert info.response_serializer(pb.ServerInfo(model_name="m")) == pb.ServerInfo(model_name="m").SerializeToString()
