"""A real server (gRPC + HTTP, port 0, tiny preset on the CPU) seen from the outside, as a user would."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib

import grpc
import httpx
import pytest
import torch
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from mmproc.client import AsyncEncoderClient, EncoderClient
from mmproc.errors import InvalidMediaError
from mmproc.media import decode_image
from mmproc.preprocess import target_grid
from mmproc.transport.serialized.staging import tensor_to_bytes
from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from tests.support.media_samples import make_image_bytes
from tests.support.server import reference_embeddings

IMAGES = [
    make_image_bytes(448, 448, fmt="PNG", seed=1),
    make_image_bytes(300, 200, fmt="JPEG", seed=2),
    make_image_bytes(97, 333, fmt="WEBP", seed=3),
    make_image_bytes(64, 64, fmt="GIF", seed=4),
    make_image_bytes(50, 70, fmt="BMP", seed=5),
]


def test_server_info_describes_model_and_limits(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target) as client:
        info = client.server_info()
    assert info.model_name == "tiny"
    assert info.hidden_size == 256
    assert info.dtype == pb.DTYPE_FLOAT32 and info.quantization == "none"
    assert info.device == "cpu"
    assert info.preprocess.family == "kimi_vl"
    assert info.limits.max_images_per_request == 32
    assert pb.TRANSPORT_SERIALIZED in info.transports and list(info.transport_names) == ["serialized"]


def test_health_is_serving(tiny_server) -> None:
    with grpc.insecure_channel(tiny_server.grpc_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "mmproc.v1.Encoder"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_several_images_per_request_match_the_library(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target) as client:
        embeddings = client.encode_images(IMAGES)
    expected = reference_embeddings(tiny_server, IMAGES)
    preprocess = tiny_server.service.pipeline.preprocess
    for data, got, want in zip(IMAGES, embeddings, expected):
        size = decode_image(data, tiny_server.service.pipeline.media_limits).image.size
        gh, gw = target_grid(*size, preprocess)
        assert got.shape == (gh // 2 * (gw // 2), 256)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_unary_and_streamed_replies_agree(tiny_server) -> None:
    with grpc.insecure_channel(tiny_server.grpc_target) as channel:
        stub = pb_grpc.EncoderStub(channel)
        reply = stub.EncodeImages(pb.EncodeImagesRequest(images=IMAGES[:2], request_id="unary-1"), timeout=30)
    assert reply.request_id == "unary-1"
    assert reply.transport == pb.TRANSPORT_SERIALIZED
    with EncoderClient(tiny_server.grpc_target) as client:
        streamed = client.encode_images(IMAGES[:2])
    for emb, tensor in zip(reply.embeddings, streamed):
        assert tuple(emb.shape) == tuple(tensor.shape)
        assert emb.data == tensor_to_bytes(tensor)


def test_concurrent_requests_never_mix_results(tiny_server) -> None:
    requests = [[make_image_bytes(28 * (1 + i % 5), 28 * (2 + i % 3), fmt="PNG", seed=100 + i)] for i in range(12)]
    expected = [reference_embeddings(tiny_server, r)[0] for r in requests]
    with EncoderClient(tiny_server.grpc_target) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client.encode_images, requests))
    for got, want in zip(results, expected):
        torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-5)


def test_async_client(tiny_server) -> None:
    import asyncio

    async def run() -> list[torch.Tensor]:
        async with AsyncEncoderClient(tiny_server.grpc_target) as client:
            return await client.encode_images(IMAGES[:1])

    (got,) = asyncio.run(run())
    torch.testing.assert_close(got, reference_embeddings(tiny_server, IMAGES[:1])[0], rtol=1e-4, atol=1e-5)


def test_async_client_without_cuda_stays_on_grpc_aio_for_every_transport(tiny_server) -> None:
    import asyncio

    async def run(transport: str) -> tuple[list[torch.Tensor], object]:
        async with AsyncEncoderClient(tiny_server.grpc_target, transport=transport) as client:
            return await client.encode_images(IMAGES[:2]), client.ipc_stats

    want = reference_embeddings(tiny_server, IMAGES[:2])
    for transport in ("auto", "ipc", "serialized"):  # a CPU consumer cannot map a pool: serialized, no IPC session
        got, stats = asyncio.run(run(transport))
        assert stats is None
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="transport"):
        AsyncEncoderClient(tiny_server.grpc_target, transport="shm")


def test_one_bad_image_fails_the_request_and_names_it(tiny_server) -> None:
    bad = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40  # PNG magic, garbage after
    with EncoderClient(tiny_server.grpc_target) as client, pytest.raises(InvalidMediaError) as info:
        client.encode_images([IMAGES[0], bad, IMAGES[1]])
    err = info.value
    assert isinstance(err, ValueError)
    assert err.index == 1
    assert err.http_status == 400
    assert err.reason in {"undecodable", "truncated"}


def test_invalid_argument_carries_bad_request_details(tiny_server) -> None:
    with grpc.insecure_channel(tiny_server.grpc_target) as channel:
        stub = pb_grpc.EncoderStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.EncodeImages(pb.EncodeImagesRequest(images=[IMAGES[0], IMAGES[1], b"not an image"]), timeout=30)
    call = info.value
    assert call.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(call)
    bad_request = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad_request) for d in status.details if d.Is(bad_request.DESCRIPTOR))
    assert bad_request.field_violations[0].field == "images[2]"
    assert bad_request.field_violations[0].description.startswith("unsupported_format")


def test_bad_requests_do_not_disturb_good_ones(tiny_server) -> None:
    good = [IMAGES[0]]
    expected = reference_embeddings(tiny_server, good)[0]
    bad_inputs = [[b""], [b"GIF89a" + b"\xff" * 10], [b"%PDF-1.4 junk"], [IMAGES[0], b"\xff\xd8\xff\xe0junk"]]

    def call(images: list[bytes]):
        with EncoderClient(tiny_server.grpc_target) as client:
            try:
                return client.encode_images(images)
            except InvalidMediaError as err:
                return err

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(call, good if i % 2 else bad_inputs[i // 2 % len(bad_inputs)]) for i in range(16)]
        results = [f.result() for f in futures]
    for i, result in enumerate(results):
        if i % 2:
            torch.testing.assert_close(result[0], expected, rtol=1e-4, atol=1e-5)
        else:
            assert isinstance(result, InvalidMediaError)


def test_too_many_images_is_a_client_error(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target) as client, pytest.raises(InvalidMediaError) as info:
        client.encode_images([IMAGES[4]] * 33)
    assert info.value.reason == "too_many_images"
    assert info.value.index == -1


def test_http_health_and_readiness(tiny_server) -> None:
    assert httpx.get(f"{tiny_server.http_url}/healthz").status_code == 200
    ready = httpx.get(f"{tiny_server.http_url}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_http_encode_returns_shapes_and_embeddings(tiny_server) -> None:
    data_uri = "data:image/png;base64," + base64.b64encode(IMAGES[0]).decode()
    plain = base64.b64encode(IMAGES[1]).decode()
    reply = httpx.post(
        f"{tiny_server.http_url}/v1/encode", json={"images": [data_uri, plain], "return_embeddings": True}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    expected = reference_embeddings(tiny_server, IMAGES[:2])
    for item, want in zip(body["embeddings"], expected):
        assert item["shape"] == list(want.shape)
        assert item["num_tokens"] == want.shape[0]
        assert item["dtype"] == "float32"
        got = torch.frombuffer(bytearray(base64.b64decode(item["data"])), dtype=torch.float32).view(want.shape)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert item["sha256"] == hashlib.sha256(base64.b64decode(item["data"])).hexdigest()


@pytest.mark.parametrize(
    ("images", "reason", "index"),
    [
        (["!!!not-base64!!!"], "bad_request", 0),
        ([None], "bad_request", -1),
        (["aGVsbG8="], "unsupported_format", 0),  # "hello"
        ([], "bad_request", -1),
    ],
)
def test_http_bad_input_is_400_with_index_and_reason(tiny_server, images, reason, index) -> None:
    good = base64.b64encode(IMAGES[4]).decode()
    payload = {"images": images if not images or images[0] is None else [*images, good]}
    reply = httpx.post(f"{tiny_server.http_url}/v1/encode", json=payload, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["reason"] == reason
    assert error.get("index", -1) == index
    assert error["code"] == "INVALID_ARGUMENT"
