"""What an engine needs from a reply (grid, original size, framing) and the key store, through a real server."""

from __future__ import annotations

import io

import httpx
import pytest
import torch
from PIL import Image

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.errors import InvalidMediaError, UnknownKeyError
from mmproc.preprocess import target_grid
from mmproc.prompt import FRAMINGS, framing
from service.pipeline.key_store import KeyStore, KeyStoreConfig
from service.pipeline.requests import EncodedImage
from tests.support.media_samples import make_image_bytes


def exif_rotated_jpeg(width: int, height: int) -> bytes:
    """A width x height JPEG whose EXIF orientation (6: rotate 90) makes it height x width when decoded."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


def test_reply_carries_grid_tokens_and_original_size(tiny_server) -> None:
    images = [make_image_bytes(300, 200, fmt="PNG", seed=1), exif_rotated_jpeg(120, 50)]
    with EncoderClient(tiny_server.grpc_target) as client:
        results = client.encode(images)
        plain = client.encode_images(images)
    pre = tiny_server.service.pipeline.preprocess
    assert [r.image_size for r in results] == [(300, 200), (50, 120)]  # after EXIF orientation
    for result, (w, h), tensor in zip(results, [(300, 200), (50, 120)], plain):
        gh, gw = target_grid(w, h, pre)
        assert result.grid_thw == (1, gh, gw)
        assert result.num_tokens == (gh // 2) * (gw // 2) == result.tensor.shape[0]
        assert torch.equal(result.tensor, tensor)


def test_server_info_names_family_and_framing(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target) as client:
        info = client.server_info()
    frame = framing(info.family)
    assert info.family == "kimi_vl"
    assert (info.prompt.image_header, info.prompt.placeholder, info.prompt.image_footer) == (
        frame.image_header,
        frame.placeholder,
        frame.image_footer,
    )
    assert not info.prompt.HasField("placeholder_token_id")  # the tiny preset has no config.json
    assert info.key_store.max_bytes > 0 and info.key_store.ttl_s > 0


def test_kept_results_are_fetched_by_key_bit_for_bit(tiny_server) -> None:
    images = [make_image_bytes(100, 80, fmt="PNG", seed=3), make_image_bytes(64, 200, fmt="JPEG", seed=4)]
    with EncoderClient(tiny_server.grpc_target) as client:
        kept = client.keep(images, ["img-a", "img-b"])
        assert [k.tensor for k in kept] == [None, None] and [k.key for k in kept] == ["img-a", "img-b"]
        looked = client.lookup(["img-b", "img-a"])
        fetched = client.fetch(["img-b", "img-a"])
        direct = client.encode_images(images)
        with pytest.raises(UnknownKeyError, match="never-sent"):
            client.fetch(["img-a", "never-sent"])
        with pytest.raises(InvalidMediaError, match="keys for"):
            client.keep(images, ["only-one"])
    assert [r.num_tokens for r in looked] == [kept[1].num_tokens, kept[0].num_tokens]
    assert torch.equal(fetched[0].tensor, direct[1]) and torch.equal(fetched[1].tensor, direct[0])
    assert fetched[0].grid_thw == kept[1].grid_thw and fetched[0].image_size == (64, 200)


def test_http_encode_reports_grid_thw_size_and_keys(tiny_server) -> None:
    import base64

    data = base64.b64encode(make_image_bytes(90, 40, fmt="PNG", seed=5)).decode()
    reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json={"images": [data], "keys": ["http-1"]}, timeout=60)
    assert reply.status_code == 200
    item = reply.json()["embeddings"][0]
    assert item["image_size"] == [90, 40] and item["grid_thw"] == [1, *item["grid_hw"]] and item["key"] == "http-1"
    with EncoderClient(tiny_server.grpc_target) as client:
        assert client.lookup(["http-1"])[0].num_tokens == item["num_tokens"]


def _result(rows: int) -> EncodedImage:
    return EncodedImage(0, (2 * rows, 2), rows, torch.zeros(rows, 4))  # 16 bytes a row


def test_key_store_is_bounded_by_bytes_count_and_ttl() -> None:
    store = KeyStore(KeyStoreConfig(max_bytes=100, ttl_s=10.0, max_keys=3))
    store.put("a", _result(2), now=0.0)  # 32 bytes
    store.put("b", _result(2), now=1.0)
    store.put("c", _result(2), now=2.0)  # 96 bytes
    store.put("d", _result(1), now=3.0)  # over 100 bytes and 3 keys: "a" goes
    with pytest.raises(UnknownKeyError):
        store.get(["a"], now=3.0)
    assert [r.num_tokens for r in store.get(["b", "d"], now=3.0)] == [2, 1]
    assert store.nbytes <= 100 and len(store) <= 3
    with pytest.raises(UnknownKeyError):  # b expired at 11
        store.get(["b"], now=11.5)
    store.put("huge", _result(10), now=12.0)  # larger than the store: not kept
    with pytest.raises(UnknownKeyError):
        store.get(["huge"], now=12.0)


def test_every_family_has_a_framing_with_a_size_template() -> None:
    for family, frame in FRAMINGS.items():
        text = frame.image_text(3, width=640, height=480)
        assert text.count(frame.placeholder) == 3, family
        assert text.startswith(frame.header(640, 480))


def test_async_front_end_keeps_and_looks_up(tiny_server) -> None:
    import asyncio

    async def front_end() -> tuple[list, list]:
        async with AsyncEncoderClient(tiny_server.grpc_target) as client:
            kept = await client.keep([make_image_bytes(120, 90, fmt="PNG", seed=6)], ["async-1"])
            return kept, await client.lookup(["async-1"])

    kept, looked = asyncio.run(front_end())
    assert kept[0].key == "async-1" and kept[0].tensor is None
    assert looked[0].num_tokens == kept[0].num_tokens and looked[0].image_size == (120, 90)


def test_headers_only_is_refused_on_the_stream(tiny_server) -> None:
    import grpc

    from mmproc.client.rpc import encoder_stub, make_request

    with grpc.insecure_channel(tiny_server.grpc_target) as channel:
        request = make_request([make_image_bytes(40, 40, fmt="PNG", seed=7)], None, "serialized", headers_only=True)
        with pytest.raises(grpc.RpcError) as err:
            list(encoder_stub(channel).EncodeImagesStream(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "EncodeImages" in err.value.details()
