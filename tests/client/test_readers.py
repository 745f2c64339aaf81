"""Every client method goes through one reader (mmproc/client/readers.py): on a CPU consumer the serialized one.
Whatever method a user calls, sync or async, the same images give the same embeddings bit for bit."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.errors import UnknownKeyError
from tests.support.media_samples import make_image_bytes

IMAGES = [make_image_bytes(96, 64, fmt="JPEG", seed=11), make_image_bytes(40, 56, fmt="PNG", seed=12)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_every_method_of_the_sync_client_reads_the_same_embeddings(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target, transport="auto", cache=False) as client:
        want = client.encode_images(IMAGES)
        assert [tuple(t.shape)[1:] for t in want] == [tuple(want[0].shape)[1:]] * 2 and client.ipc_stats is None
        kept = client.encode(IMAGES, keys=["reader-a", "reader-b"])
        same([e.tensor for e in kept], want)
        same([e.tensor for e in client.fetch(["reader-b", "reader-a"])], want[::-1])
        with client.encode_images_view(IMAGES) as views:
            same(views, want)
        outputs = [torch.empty_like(t) for t in want]
        client.encode_images_into(IMAGES, outputs)
        same(outputs, want)
        shared = client.encode_images_shared(IMAGES, readers=2)
        assert shared.transport == "serialized"
        for rank in (0, 1):
            with client.read_shared(shared, rank) as tensors:
                same(tensors, want)
        with pytest.raises(UnknownKeyError):
            client.fetch(["reader-never-kept"])


def test_the_async_client_reads_what_the_sync_client_reads(tiny_server) -> None:
    async def run() -> list[torch.Tensor]:
        async with AsyncEncoderClient(tiny_server.grpc_target, transport="ipc", cache=False) as client:
            return await client.encode_images(IMAGES)

    with EncoderClient(tiny_server.grpc_target, transport="serialized", cache=False) as client:
        want = client.encode_images(IMAGES)
    same(asyncio.run(run()), want)
