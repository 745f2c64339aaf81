"""The client's side of streamed serialized replies: reading each message without copying its payload, and
reassembly (exact bytes, refusal of incomplete streams)."""

from __future__ import annotations

import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from mmproc.client.rpc import Assembler
from mmproc.errors import InternalError
from mmproc.transport.serialized.staging import tensor_to_bytes
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.chunks import StreamChunk, read_chunk


def received(message: pb.EncodeImagesChunk) -> StreamChunk:
    """The message as the client's stub hands it over: serialized by the server, read by `read_chunk`."""
    return read_chunk(message.SerializeToString())


def chunks(index: int, tensor: torch.Tensor, chunk_bytes: int) -> list[StreamChunk]:
    data = tensor_to_bytes(tensor)
    header = pb.Embedding(index=index, dtype=pb.DTYPE_BFLOAT16, shape=list(tensor.shape), num_tokens=tensor.shape[0])
    out = [pb.EncodeImagesChunk(index=index, header=header, offset=0, data=data[:chunk_bytes])]
    out += [
        pb.EncodeImagesChunk(index=index, offset=o, data=data[o : o + chunk_bytes])
        for o in range(chunk_bytes, len(data), chunk_bytes)
    ]
    return [received(m) for m in out]


def without_data(message: pb.EncodeImagesChunk) -> pb.EncodeImagesChunk:
    out = pb.EncodeImagesChunk()
    out.CopyFrom(message)
    out.ClearField("data")
    return out


@settings(max_examples=200, deadline=None)
@given(
    request_id=st.text(max_size=40),
    index=st.integers(0, 2**32 - 1),
    offset=st.integers(0, 2**64 - 1),
    data=st.binary(max_size=20_000),
    with_header=st.booleans(),
)
def test_read_chunk_gives_the_message_with_data_as_a_view(request_id, index, offset, data, with_header) -> None:
    header = pb.Embedding(index=index, shape=[len(data), 2], dtype=pb.DTYPE_BFLOAT16) if with_header else None
    message = pb.EncodeImagesChunk(request_id=request_id, header=header, index=index, offset=offset, data=data)
    wire = message.SerializeToString()
    chunk = read_chunk(wire)
    assert chunk.fields == without_data(message)
    assert bytes(chunk.data) == data and chunk.data.readonly
    assert chunk.data.obj is wire  # a view of the received bytes, not a copy


def data_field(payload: bytes) -> bytes:
    return b"\x2a" + bytes([len(payload)]) + payload  # field 5 (data), wire type 2 (LEN); payloads under 128 bytes


def test_read_chunk_accepts_any_valid_encoding() -> None:
    head = pb.EncodeImagesChunk(request_id="r", index=2, offset=8).SerializeToString()
    # `data` first, then the other fields; a repeated singular field: the last one wins.
    for wire in (data_field(b"abc") + head, data_field(b"old") + head + data_field(b"abc")):
        chunk = read_chunk(wire)
        fields = chunk.fields
        assert (fields.request_id, fields.index, fields.offset, fields.data) == ("r", 2, 8, b"")
        assert bytes(chunk.data) == b"abc"
    # Unknown fields of every wire type (a newer server): skipped over, kept by protobuf as unknown fields.
    unknown = b"\x48\x96\x01" + b"\x51" + bytes(8) + b"\x5d" + bytes(4) + b"\x62\x02hi"
    chunk = read_chunk(head + unknown + data_field(b"xyz"))
    assert (chunk.fields.index, bytes(chunk.data)) == (2, b"xyz")
    # A group (wire types 3/4) is left to protobuf, which still finds `data`.
    chunk = read_chunk(head + b"\x6b\x6c" + data_field(b"xyz"))
    assert (chunk.fields.index, bytes(chunk.data)) == (2, b"xyz")


@pytest.mark.parametrize("cut", [1, 2, 5])
def test_read_chunk_refuses_a_truncated_message(cut: int) -> None:
    wire = pb.EncodeImagesChunk(request_id="r", index=1, data=b"0123456789").SerializeToString()
    with pytest.raises(DecodeError):
        read_chunk(wire[:-cut])


def test_chunks_reassemble_bit_for_bit_in_any_interleaving() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(37, 64, generator=gen).to(torch.bfloat16)
    b = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    ca, cb = chunks(0, a, 1000), chunks(1, b, 100)
    assembler = Assembler(2, torch.device("cpu"))
    for pair in zip(ca, cb):  # interleave the two images' chunks
        for chunk in pair:
            assembler.add(chunk)
    for chunk in ca[len(cb) :] + cb[len(ca) :]:
        assembler.add(chunk)
    got_a, got_b = assembler.tensors()
    assert torch.equal(got_a.view(torch.int16), a.view(torch.int16))
    assert torch.equal(got_b.view(torch.int16), b.view(torch.int16))


def test_a_missing_chunk_is_an_error_not_zeros() -> None:
    tensor = torch.ones(16, 64, dtype=torch.bfloat16)
    assembler = Assembler(1, torch.device("cpu"))
    for chunk in chunks(0, tensor, 256)[:-1]:
        assembler.add(chunk)
    with pytest.raises(InternalError, match="complete"):
        assembler.tensors()


def test_chunks_outside_the_reply_are_refused() -> None:
    assembler = Assembler(1, torch.device("cpu"))
    with pytest.raises(InternalError):
        assembler.add(received(pb.EncodeImagesChunk(index=3, offset=0, data=b"x")))
    first = chunks(0, torch.ones(2, 2, dtype=torch.bfloat16), 4)[0]
    assembler.add(first)
    with pytest.raises(InternalError, match="malformed"):
        assembler.add(received(pb.EncodeImagesChunk(index=0, offset=6, data=b"xyz")))


def test_every_status_error_survives_the_trip_from_server_to_client() -> None:
    # The server's mapping (service.frontends.error_mapping) and the client's (ERRORS_BY_CODE) come from one table in mmproc.errors.
    import grpc

    from mmproc.client.rpc import ERRORS_BY_CODE
    from mmproc.errors import STATUS_ERRORS, InternalError, InvalidMediaError
    from service.frontends.error_mapping import map_error

    for cls in STATUS_ERRORS:
        exc = cls("x", reason="bad_request") if cls is InvalidMediaError else cls("x")
        mapped = map_error(exc)
        assert mapped.http_status == cls.http_status and mapped.grpc_code.name == cls.grpc_code
        if cls is not InvalidMediaError:  # that one is rebuilt from its BadRequest details instead
            assert ERRORS_BY_CODE[mapped.grpc_code] is cls
    assert map_error(InternalError("secret")).grpc_code is grpc.StatusCode.INTERNAL
    assert map_error(RuntimeError("boom")).http_status == 500
