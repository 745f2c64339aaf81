"""EncodeVideos end to end on a real server (the `tiny-k2.5` preset, process decode workers): gRPC and HTTP give
the library's embeddings, grids, timestamps and token counts; hostile videos are 400s with their reasons; videos
and images share the runner; a model without video says so (needs PyAV)."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib

import httpx
import pytest
import torch

from mmproc.batching import pack_images, split_by_image
from mmproc.client import EncoderClient, VideoInput
from mmproc.errors import InvalidMediaError
from mmproc.media.video import VideoSampling, decode_video
from mmproc.media.video_limits import VideoLimits
from mmproc.models import load_encoder
from mmproc.preprocess.video import preprocess_video
from mmproc.preprocess.video_config import VideoRules
from tests.support.media_samples import make_image_bytes
from tests.support.server import serving, test_settings

pytest.importorskip("av")
from tests.support.video_samples import make_video_bytes  # noqa: E402

CLIP = make_video_bytes(96, 64, 33, 10, gop=6)  # 3.3 s at 10 fps: 6 frames at 2 fps, chunks of 4 + 2
WEBM = make_video_bytes(80, 48, 20, 8, codec="vp9", container="webm")


@pytest.fixture(scope="module")
def server():
    with serving(test_settings(model="tiny-k2.5", video_decode_cpu_s=20.0)) as server:
        yield server


@torch.inference_mode()
def _library(data: bytes, sampling: VideoSampling):
    """What the server must answer, computed in this process with the library alone."""
    decoded = decode_video(data, VideoLimits(), sampling, 2.0)
    video = preprocess_video(decoded.frames, decoded.indices, decoded.index.fps, VideoRules())
    encoder = load_encoder(None, preset="tiny-k2.5")  # the preset's weights are deterministic
    tensors = split_by_image(encoder(pack_images(video.chunks)), [c.num_tokens for c in video.chunks])
    return video, tensors


def test_grpc_videos_are_the_library_s(server) -> None:
    with EncoderClient(server.grpc_target, timeout=120) as client:
        info = client.server_info().video
        got = client.encode_videos([CLIP, VideoInput(WEBM, num_frames=3)])
    assert info.supported and info.fps == 2.0 and info.temporal_patch_size == 4
    assert info.placeholder == "<|kimi_k25_video_placeholder|>" and "vp9" in info.codecs
    for answer, (data, sampling) in zip(got, [(CLIP, VideoSampling()), (WEBM, VideoSampling(num_frames=3))]):
        video, tensors = _library(data, sampling)
        assert answer.frame_indices == video.indices and answer.size == video.source_size
        assert answer.num_tokens == video.num_tokens == sum(c.num_tokens for c in answer.chunks)
        assert [c.grid_thw for c in answer.chunks] == [c.grid_thw for c in video.chunks]
        assert [c.timestamp_s for c in answer.chunks] == list(video.timestamps)
        for chunk, want in zip(answer.chunks, tensors, strict=True):
            assert torch.allclose(chunk.tensor, want, atol=1e-5)
    assert [c.grid_thw[0] for c in got[0].chunks] == [4, 2]
    assert [c.timestamp for c in got[0].chunks] == [
        "00:00:00.000",
        "00:00:02.200",
    ]  # frames 0 and 22 (of 0, 5, 11, 16, 22, 27)


def test_http_video_matches_grpc(server) -> None:
    with EncoderClient(server.grpc_target, timeout=120) as client:
        (over_grpc,) = client.encode_videos([CLIP])
    body = {"videos": [{"data": base64.b64encode(CLIP).decode()}], "return_embeddings": True}
    reply = httpx.post(f"{server.http_url}/v1/encode_video", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    (video,) = reply.json()["videos"]
    assert video["num_tokens"] == over_grpc.num_tokens and video["frame_indices"] == list(over_grpc.frame_indices)
    for chunk, want in zip(video["chunks"], over_grpc.chunks, strict=True):
        data = base64.b64decode(chunk["data"])
        assert chunk["sha256"] == hashlib.sha256(data).hexdigest()
        assert data == want.tensor.contiguous().numpy().tobytes()
        assert chunk["grid_thw"] == list(want.grid_thw) and chunk["timestamp_s"] == want.timestamp_s


@pytest.mark.parametrize(
    "data, reason",
    [
        (make_video_bytes(video=False, audio=True), "no_video_stream"),
        (make_video_bytes(codec="mpeg4"), "unsupported_codec"),
        (CLIP[: len(CLIP) // 2], "undecodable"),  # moov at the end: cut off
        (b"not a video at all", "unsupported_format"),
    ],
)
def test_hostile_videos_are_400s_with_reasons(server, data: bytes, reason: str) -> None:
    with EncoderClient(server.grpc_target, timeout=120) as client, pytest.raises(InvalidMediaError) as err:
        client.encode_videos([CLIP, data])
    assert (err.value.reason, err.value.index) == (reason, 1)
    body = {"videos": [{"data": base64.b64encode(data).decode()}]}
    reply = httpx.post(f"{server.http_url}/v1/encode_video", json=body, timeout=120)
    assert reply.status_code == 400 and reply.json()["error"]["reason"] == reason


def test_request_limits(server) -> None:
    with EncoderClient(server.grpc_target, timeout=120) as client:
        with pytest.raises(InvalidMediaError) as err:
            client.encode_videos([VideoInput(CLIP, fps=2.0, num_frames=3)])
        assert err.value.reason == "bad_request"
        with pytest.raises(InvalidMediaError) as err:
            client.encode_videos([CLIP] * 5)  # max_videos_per_request is 4
        assert err.value.reason == "too_many_images"
        with pytest.raises(InvalidMediaError) as err:
            client.encode_videos([VideoInput(CLIP, fps=31.0)])  # max_video_sample_fps is 30
        assert err.value.reason == "bad_request"
        assert client.encode_videos([CLIP])[0].num_tokens > 0  # the server carries on


def test_videos_and_images_share_the_runner(server) -> None:
    image = make_image_bytes(120, 90, "PNG", seed=5)
    with EncoderClient(server.grpc_target, timeout=120) as client:
        alone_image = client.encode_images([image])[0]
        alone_video = client.encode_videos([CLIP])[0]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            images = [pool.submit(client.encode_images, [image]) for _ in range(3)]
            videos = [pool.submit(client.encode_videos, [CLIP]) for _ in range(3)]
            for future in images:
                assert torch.allclose(future.result()[0], alone_image, atol=1e-5)
            for future in videos:
                for got, want in zip(future.result()[0].chunks, alone_video.chunks, strict=True):
                    assert torch.allclose(got.tensor, want.tensor, atol=1e-5)


def test_the_async_client_gets_the_same_videos(server) -> None:
    import asyncio

    from mmproc.client import AsyncEncoderClient

    async def main():
        async with AsyncEncoderClient(server.grpc_target, timeout=120) as client:
            return await client.encode_videos([CLIP])

    (got,) = asyncio.run(main())
    with EncoderClient(server.grpc_target, timeout=120) as client:
        (want,) = client.encode_videos([CLIP])
    assert got.frame_indices == want.frame_indices
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(got.chunks, want.chunks, strict=True))


def test_a_model_without_video_refuses_it(tiny_server) -> None:
    with EncoderClient(tiny_server.grpc_target, timeout=60) as client:
        assert not client.server_info().video.supported
        with pytest.raises(InvalidMediaError) as err:
            client.encode_videos([CLIP])
    assert err.value.reason == "bad_request"


def test_a_bad_video_is_named_by_its_field_in_the_grpc_details(server) -> None:
    import grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from mmproc.v1 import encoder_pb2 as pb
    from mmproc.v1 import encoder_pb2_grpc as pb_grpc

    request = pb.EncodeVideosRequest(videos=[pb.Video(data=CLIP), pb.Video(data=b"not a video at all")])
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.EncoderStub(channel).EncodeVideos(request, timeout=120)
    bad_request = error_details_pb2.BadRequest()
    status = rpc_status.from_call(info.value)
    assert any(d.Unpack(bad_request) for d in status.details if d.Is(bad_request.DESCRIPTOR))
    assert bad_request.field_violations[0].field == "videos[1]"


def test_the_python_client_names_a_bad_video_as_a_video(server) -> None:
    with EncoderClient(server.grpc_target, timeout=120) as client, pytest.raises(InvalidMediaError) as err:
        client.encode_videos([VideoInput(CLIP), VideoInput(b"not a video at all")])
    assert err.value.index == 1 and err.value.item == "video"
    assert str(err.value).startswith("video 1: ")
