"""The unary reply written by hand (mmproc.wire.reply_framing around the payloads): what it refuses to frame, and
what it frames parses to protobuf's message."""

from __future__ import annotations

import pytest
import torch

from mmproc.transport.serialized.staging import write_messages
from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire.unary import interleave, reply_framing


def test_payloads_are_written_once_not_twice() -> None:
    head = pb.EncodeImagesResponse(request_id="r")
    with pytest.raises(ValueError, match="headers without data"):
        reply_framing(head, [pb.Embedding(index=0, data=b"xx")], [2])
    head.embeddings.add(index=0)
    with pytest.raises(ValueError, match="head without embeddings"):
        reply_framing(head, [], [])


def test_one_size_per_header() -> None:
    with pytest.raises(ValueError):
        reply_framing(pb.EncodeImagesResponse(request_id="r"), [pb.Embedding(index=0)], [2, 2])


def test_framing_and_payloads_parse_to_the_message() -> None:
    head = pb.EncodeImagesResponse(request_id="r", transport=pb.TRANSPORT_SERIALIZED)
    payloads = [torch.tensor([120, 121], dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)]
    framing = reply_framing(head, [pb.Embedding(index=0), pb.Embedding(index=1)], [2, 0])
    (wire,) = write_messages([list(interleave(framing, payloads))])
    reply = pb.EncodeImagesResponse.FromString(wire)
    assert reply.request_id == "r" and [(e.index, e.data) for e in reply.embeddings] == [(0, b"xy"), (1, b"")]
