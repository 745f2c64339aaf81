"""The unary reply written by hand (mmproc.wire.reply_wire): what it refuses to frame."""

from __future__ import annotations

import pytest

from mmproc.v1 import encoder_pb2 as pb
from mmproc.wire import reply_wire


def test_payloads_are_written_once_not_twice() -> None:
    head = pb.EncodeImagesResponse(request_id="r")
    with pytest.raises(ValueError, match="headers without data"):
        reply_wire(head, [pb.Embedding(index=0, data=b"xx")], [2], [b"xx"])
    head.embeddings.add(index=0)
    with pytest.raises(ValueError, match="head without embeddings"):
        reply_wire(head, [], [], [])


def test_sizes_must_match_the_payloads() -> None:
    head = pb.EncodeImagesResponse(request_id="r")
    with pytest.raises(ValueError, match="announced"):
        reply_wire(head, [pb.Embedding(index=0)], [3], [b"xy"])
    with pytest.raises(ValueError):
        reply_wire(head, [pb.Embedding(index=0)], [2, 2], [b"xy"])
    wire = reply_wire(head, [pb.Embedding(index=0)], [2], [b"xy"])
    assert pb.EncodeImagesResponse.FromString(wire).embeddings[0].data == b"xy"
