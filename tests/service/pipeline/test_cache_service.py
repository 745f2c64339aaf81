"""The embedding cache in the request path: the real tiny model behind the engine and behind a real server."""

from __future__ import annotations

import asyncio
import base64
import logging

import grpc
import httpx
import pytest
import torch

from mmproc.client import EncoderClient
from mmproc.errors import InvalidMediaError, UnknownKeyError
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.app.build import build_pipeline
from service.pipeline.requests import RequestPipeline
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, test_settings

BAD = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64  # a PNG signature and nothing decodable after it


@pytest.fixture(scope="module")
def pipeline() -> RequestPipeline:
    pipeline = build_pipeline(test_settings(decode_isolation="thread", preprocess_workers=2))
    pipeline.start()
    yield pipeline
    pipeline.close()


def encoded_images(pipeline: RequestPipeline) -> float:
    return pipeline.metrics.registry.get_sample_value("mmproc_images_encoded_total")


def run(coro):
    return asyncio.run(coro)


def test_32_concurrent_identical_requests_encode_once(pipeline: RequestPipeline) -> None:
    image = make_image_bytes(150, 110, fmt="PNG", seed=32)
    before, stats = encoded_images(pipeline), pipeline.cache.host.stats
    misses, coalesced = stats.misses, stats.coalesced

    async def burst():
        return await asyncio.gather(*(pipeline.encode([image], f"r{i}") for i in range(32)))

    replies = run(burst())
    assert encoded_images(pipeline) - before == 1
    assert sorted(r[0].cache for r in replies) == ["coalesced"] * 31 + ["miss"]
    assert (stats.misses - misses, stats.coalesced - coalesced) == (1, 31)
    assert all(torch.equal(r[0].embedding, replies[0][0].embedding) for r in replies)
    again = run(pipeline.encode([image], "later"))
    assert again[0].cache == "hit" and torch.equal(again[0].embedding, replies[0][0].embedding)
    assert encoded_images(pipeline) - before == 1


def test_duplicates_within_one_request_are_encoded_once(pipeline: RequestPipeline) -> None:
    a, b = make_image_bytes(70, 90, fmt="JPEG", seed=41), make_image_bytes(90, 70, fmt="PNG", seed=42)
    before = encoded_images(pipeline)
    results = run(pipeline.encode([a, b, a], "dup"))
    assert [r.cache for r in results] == ["miss", "miss", "coalesced"] and [r.index for r in results] == [0, 1, 2]
    assert encoded_images(pipeline) - before == 2
    assert torch.equal(results[0].embedding, results[2].embedding)


def test_an_invalid_image_is_refused_from_memory_with_its_error(pipeline: RequestPipeline) -> None:
    bad = BAD + b"unique-1"
    replayed = pipeline.cache.invalid.replayed

    async def together():
        return await asyncio.gather(*(pipeline.encode([b"" + make_ok(i), bad][i % 2 :], f"bad{i}") for i in range(6)),
                                    return_exceptions=True)  # fmt: skip

    outcomes = run(together())
    for i, outcome in enumerate(outcomes):
        assert isinstance(outcome, InvalidMediaError), outcome
        assert outcome.index == (1 if i % 2 == 0 else 0)  # each request's own position of the bad image
    with pytest.raises(InvalidMediaError) as again:
        run(pipeline.encode([make_ok(99), bad], "retry"))
    assert again.value.index == 1 and pipeline.cache.invalid.replayed > replayed
    kinds = {type(o) for o in outcomes} | {type(again.value)}
    assert kinds == {InvalidMediaError}
    with pytest.raises(InvalidMediaError):  # the bypass decodes it again, and it is still invalid
        run(pipeline.encode([bad], "bypass", cache=False))


def make_ok(seed: int) -> bytes:
    return make_image_bytes(40 + seed, 40, fmt="PNG", seed=seed)


def test_a_follower_whose_leader_failed_for_another_image_encodes_itself(pipeline: RequestPipeline) -> None:
    shared = make_image_bytes(120, 60, fmt="PNG", seed=77)

    async def both():
        return await asyncio.gather(
            pipeline.encode([BAD + b"unique-2", shared], "leader"), pipeline.encode([shared], "follower"),
            return_exceptions=True,
        )  # fmt: skip

    leader, follower = run(both())
    assert isinstance(leader, InvalidMediaError) and leader.index == 0
    assert not isinstance(follower, BaseException) and follower[0].cache == "miss"
    assert run(pipeline.encode([shared], "after"))[0].cache == "hit"


def test_asking_by_mm_hash_without_the_bytes(pipeline: RequestPipeline) -> None:
    image = make_image_bytes(64, 96, fmt="PNG", seed=5)
    first = run(pipeline.encode([image], "first"))[0]
    found = run(pipeline.encode([b""], "by-hash", mm_hashes=[first.mm_hash]))[0]
    assert found.cache == "hit" and torch.equal(found.embedding, first.embedding)
    unknown = pipeline.cache.keys.mm_hash(b"never sent")
    with pytest.raises(UnknownKeyError) as missing:
        run(pipeline.encode([image, b""], "unknown", mm_hashes=["", unknown]))
    assert missing.value.index == 1
    probe = run(pipeline.encode([b"", b""], "probe", mm_hashes=[first.mm_hash, unknown], lookup_only=True))
    assert [p.cache for p in probe] == ["hit", "miss"] and probe[1].num_tokens == 0
    fresh = make_image_bytes(96, 64, fmt="PNG", seed=6)  # never sent: its bytes and its bare hash in one request
    both = run(pipeline.encode([b"", fresh], "bare-first", mm_hashes=[pipeline.cache.keys.mm_hash(fresh), ""]))
    assert [r.cache for r in both] == ["coalesced", "miss"] and torch.equal(both[0].embedding, both[1].embedding)
    with pytest.raises(InvalidMediaError, match="does not match"):
        run(pipeline.encode([image], "lying", mm_hashes=[unknown]))
    with pytest.raises(InvalidMediaError, match="needs the cache"):
        run(pipeline.encode([b""], "no-cache", mm_hashes=[first.mm_hash], cache=False))


def test_over_grpc_a_hit_is_bit_identical_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    server = ServiceThread(test_settings()).start()
    try:
        images = [make_image_bytes(100, 80, fmt="PNG", seed=1), make_image_bytes(48, 160, fmt="JPEG", seed=2)]
        with EncoderClient(server.grpc_target) as client, caplog.at_level(logging.INFO, logger="mmproc.access"):
            cold = client.encode(images)
            warm = client.encode(images)
            info = client.server_info()
        with EncoderClient(server.grpc_target, cache=False) as fresh:
            bypassed = fresh.encode(images)
        assert [r.cache for r in cold] == ["miss", "miss"] and [r.cache for r in warm] == ["hit", "hit"]
        assert [r.cache for r in bypassed] == ["bypass", "bypass"]
        for a, b, c in zip(cold, warm, bypassed):
            assert a.tensor.view(torch.uint8).numpy().tobytes() == b.tensor.view(torch.uint8).numpy().tobytes()
            assert torch.equal(a.tensor, c.tensor) and a.mm_hash == b.mm_hash and a.grid_thw == b.grid_thw
        assert "cache=hit,hit" in caplog.text and "cache=miss,miss" in caplog.text
        assert info.cache.host_max_bytes > 0 and info.cache.policy == "s3fifo" and info.cache.hash == "xxh3"
        data = base64.b64encode(images[0]).decode()
        reply = httpx.post(f"{server.http_url}/v1/encode", json={"images": [data]}, timeout=60).json()
        assert reply["embeddings"][0]["cache"] == "hit" and reply["embeddings"][0]["mm_hash"] == cold[0].mm_hash
        body = {"images": [data], "cache_bypass": True}
        assert httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60).json()["embeddings"][0]["cache"] == (
            "bypass"
        )
        metrics = httpx.get(f"{server.http_url}/metrics", timeout=10).text
        assert 'mmproc_cache_hits_total{tier="host"} 3.0' in metrics and "mmproc_cache_bypassed_total 3.0" in metrics
        request = pb.EncodeImagesRequest(images=[b""], mm_hashes=[cold[1].mm_hash], headers_only=True)
        with grpc.insecure_channel(server.grpc_target) as channel:
            header = pb_grpc.EncoderStub(channel).EncodeImages(request, timeout=30).embeddings[0]
        assert header.cache == pb.CACHE_HIT and header.num_tokens == cold[1].num_tokens
    finally:
        server.stop()


def test_cache_mb_0_turns_the_cache_off() -> None:
    server = ServiceThread(test_settings(cache_mb=0)).start()
    try:
        image = make_image_bytes(64, 64, fmt="PNG", seed=9)
        with EncoderClient(server.grpc_target) as client:
            results = client.encode([image]) + client.encode([image])
            info = client.server_info()
        assert [r.cache for r in results] == ["", ""] and [r.mm_hash for r in results] == ["", ""]
        assert info.cache.host_max_bytes == 0 and info.cache.pool_max_bytes == 0
    finally:
        server.stop()
