"""Reassembly of streamed serialized replies on the client: exact bytes, and refusal of incomplete streams."""

from __future__ import annotations

import pytest
import torch

from mmproc.client.wire import Assembler
from mmproc.errors import InternalError
from mmproc.transport import tensor_to_bytes
from mmproc.v1 import encoder_pb2 as pb


def chunks(index: int, tensor: torch.Tensor, chunk_bytes: int) -> list[pb.EncodeImagesChunk]:
    data = tensor_to_bytes(tensor)
    header = pb.Embedding(index=index, dtype=pb.DTYPE_BFLOAT16, shape=list(tensor.shape), num_tokens=tensor.shape[0])
    out = [pb.EncodeImagesChunk(index=index, header=header, offset=0, data=data[:chunk_bytes])]
    out += [
        pb.EncodeImagesChunk(index=index, offset=o, data=data[o : o + chunk_bytes])
        for o in range(chunk_bytes, len(data), chunk_bytes)
    ]
    return out


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
        assembler.add(pb.EncodeImagesChunk(index=3, offset=0, data=b"x"))
    first = chunks(0, torch.ones(2, 2, dtype=torch.bfloat16), 4)[0]
    assembler.add(first)
    with pytest.raises(InternalError, match="malformed"):
        assembler.add(pb.EncodeImagesChunk(index=0, offset=6, data=b"xyz"))
