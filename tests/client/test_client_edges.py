"""Mistakes a user makes with the client fail at once, with a message that says what to do."""

from __future__ import annotations

import pytest
import torch

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.errors import MmprocError, UnavailableError


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host without CUDA")
@pytest.mark.parametrize("cls", [EncoderClient, AsyncEncoderClient])
def test_cuda_device_without_cuda_fails_at_construction(cls: type) -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        cls("localhost:1", device="cuda:0")


def test_bare_bytes_asks_for_a_list() -> None:
    client = EncoderClient("localhost:1")
    try:
        with pytest.raises(TypeError, match="pass a list of images"):
            client.encode_images(b"\xff\xd8\xff")
    finally:
        client.close()


def test_unavailable_is_a_connection_error() -> None:
    err = UnavailableError("draining")
    assert isinstance(err, ConnectionError) and isinstance(err, MmprocError)
    with pytest.raises(ConnectionError):
        raise err
