"""A request at fault (not an image in it) is an InvalidRequestError: still a 400 / INVALID_ARGUMENT with its reason,
still a ValueError, still caught by `except InvalidMediaError`; the Python client raises the same class the server
did, and a bad image stays a plain InvalidMediaError."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import grpc
import httpx
import pytest

from mmproc.client import EncoderClient
from mmproc.client.rpc import encoder_stub, error_from_rpc
from mmproc.errors import InvalidMediaError, InvalidRequestError, Reason
from mmproc.v1 import encoder_pb2 as pb
from service.frontends.error_mapping import map_error
from service.frontends.http.fields import decode_image_field, request_budget_s
from service.pipeline.admission import check_patch_budget
from service.pipeline.key_store import KeyStoreConfig, check_keys
from tests.support.media_samples import make_image_bytes
from tests.support.server import ServiceThread, test_settings

IMAGE = make_image_bytes(56, 56, fmt="PNG", seed=3)


@pytest.fixture(scope="module")
def server() -> Iterator[ServiceThread]:
    server = ServiceThread(test_settings(max_images_per_request=2)).start()
    yield server
    server.stop()


def test_the_class_is_a_400_value_error_that_keeps_its_kind() -> None:
    exc = InvalidRequestError("too many", reason=Reason.TOO_MANY_IMAGES)
    assert isinstance(exc, ValueError) and isinstance(exc, InvalidMediaError)
    assert exc.http_status == 400 and exc.grpc_code == "INVALID_ARGUMENT"
    assert type(exc.at_index(2)) is InvalidRequestError and exc.at_index(2).index == 2
    assert type(pickle.loads(pickle.dumps(exc))) is InvalidRequestError  # decode workers send errors back pickled
    mapped = map_error(exc)
    assert (mapped.grpc_code, mapped.http_status, mapped.reason, mapped.kind) == (
        grpc.StatusCode.INVALID_ARGUMENT, 400, "too_many_images", "request",
    )  # fmt: skip
    assert map_error(InvalidMediaError("bad", reason=Reason.UNDECODABLE)).kind == "media"


def call(server: ServiceThread, request: pb.EncodeImagesRequest) -> BaseException:
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as failed:
        encoder_stub(channel).EncodeImages(request, timeout=30)
    assert failed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    return error_from_rpc(failed.value)


@pytest.mark.parametrize(
    ("request_fields", "reason"),
    [
        ({"images": []}, "bad_request"),  # no images
        ({"images": [IMAGE] * 3}, "too_many_images"),
        ({"images": [IMAGE], "readers": 99}, "bad_request"),
        ({"images": [IMAGE], "keys": ["a", "b"]}, "bad_request"),  # keys for images: one each
        ({"images": [IMAGE], "mm_hashes": ["not-its-hash"]}, "bad_request"),
        ({"images": [IMAGE, IMAGE], "mm_hashes": ["x"]}, "bad_request"),  # one mm_hash per image
    ],
    ids=["no-images", "too-many-images", "readers", "keys", "mm-hash-mismatch", "mm-hash-count"],
)
def test_request_errors_reach_the_client_as_invalid_request(server, request_fields, reason) -> None:
    error = call(server, pb.EncodeImagesRequest(**request_fields))
    assert type(error) is InvalidRequestError
    assert error.reason == reason


def test_a_bad_image_stays_invalid_media(server) -> None:
    error = call(server, pb.EncodeImagesRequest(images=[b"not an image"]))
    assert type(error) is InvalidMediaError
    assert error.reason == "unsupported_format" and error.index == 0


def test_the_client_raises_it_and_old_handlers_still_catch_it(server) -> None:
    with EncoderClient(server.grpc_target, transport="serialized") as client:
        with pytest.raises(InvalidRequestError):
            client.encode_images([IMAGE] * 3)
        try:
            client.encode_images([IMAGE] * 3)
        except InvalidMediaError as exc:  # what callers wrote before InvalidRequestError existed
            assert exc.reason == "too_many_images"
        else:
            pytest.fail("no error")


def test_headers_only_on_the_stream_is_a_request_error(server) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stream = encoder_stub(channel).EncodeImagesStream(
            pb.EncodeImagesRequest(images=[IMAGE], headers_only=True), timeout=30
        )
        with pytest.raises(grpc.RpcError) as failed:
            list(stream)
    assert type(error_from_rpc(failed.value)) is InvalidRequestError


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"images": ["!!!not-base64!!!"]}, {}),
        ({"images": ["data:image/png,plain"]}, {}),  # a data: URI that is not base64
        ({"images": []}, {}),
        ({"nothing": 1}, {}),  # malformed body
        ({"images": ["aGVsbG8="]}, {"x-mmproc-timeout-ms": "soon"}),
    ],
    ids=["base64", "data-uri", "no-images", "malformed", "timeout-header"],
)
def test_http_request_errors_are_400_bad_request(server, body, headers) -> None:
    reply = httpx.post(f"{server.http_url}/v1/encode", json=body, headers=headers, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["reason"] == "bad_request"


def test_each_front_door_check_raises_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="base64"):
        decode_image_field("!!!not-base64!!!", 0)
    with pytest.raises(InvalidRequestError, match="x-mmproc-timeout-ms"):
        request_budget_s("soon", 60.0)
    with pytest.raises(InvalidRequestError, match="keys"):
        check_keys(["a"], 2, KeyStoreConfig())
    with pytest.raises(InvalidRequestError, match="keeps no results"):
        check_keys(["a"], 1, KeyStoreConfig(max_bytes=0))
    with pytest.raises(InvalidRequestError, match="patches") as refused:
        check_patch_budget([IMAGE] * 4, _tiny_preprocess(), max_patches=8)
    assert refused.value.reason == "too_many_patches"


def _tiny_preprocess():
    from mmproc.preprocess import PreprocessConfig

    return PreprocessConfig.kimi_vl()


def test_video_request_checks_raise_invalid_request() -> None:
    from mmproc.media.video_limits import VideoLimits
    from mmproc.preprocess.video_config import VideoRules
    from service.pipeline.request_limits import VideoRequestLimits
    from service.pipeline.videos import VideoItem, VideoPipeline

    service = VideoPipeline(None, VideoRules(), VideoLimits(), VideoRequestLimits(max_videos=2))  # checks only
    bad = {
        "bad_request": [[], [VideoItem(b"x", fps=2.0, num_frames=3)], [VideoItem(b"x", fps=31.0)]],
        "too_many_images": [[VideoItem(b"x")] * 3],
        "request_too_large": [[VideoItem(bytes(49 << 20))]],
        "too_many_frames": [[VideoItem(b"x", num_frames=10_000)]],
    }
    for reason, cases in bad.items():
        for items in cases:
            with pytest.raises(InvalidRequestError) as refused:
                service.check_request(items)
            assert refused.value.reason == reason


def test_a_sampling_rate_over_the_limit_is_a_request_error() -> None:
    pytest.importorskip("av")
    from mmproc.media.video import VideoSampling, decode_video
    from mmproc.media.video_limits import VideoLimits
    from tests.support.video_samples import make_video_bytes

    with pytest.raises(InvalidRequestError, match="sampling fps"):
        decode_video(make_video_bytes(64, 48, 10, 10), VideoLimits(max_sample_fps=1.0), VideoSampling(), 2.0)


def test_videos_to_a_model_without_video_are_a_request_error(server) -> None:
    pytest.importorskip("av")
    from mmproc.client import VideoInput
    from tests.support.video_samples import make_video_bytes

    with EncoderClient(server.grpc_target, transport="serialized") as client, pytest.raises(InvalidRequestError):
        client.encode_videos([VideoInput(make_video_bytes(64, 48, 10, 10))])


@pytest.mark.parametrize(
    ("limits", "reason"),
    [({"max_sampled_frames_per_request": 5}, "too_many_frames"), ({"max_patches_per_request": 32}, "too_many_patches")],
)
def test_a_video_request_over_its_totals_is_a_request_error(limits, reason) -> None:
    pytest.importorskip("av")
    from tests.support.video_samples import make_video_bytes

    clip = make_video_bytes(96, 64, 33, 10, gop=6)  # 6 frames at 2 fps
    server = ServiceThread(test_settings(model="tiny-k2.5", decode_isolation="thread", **limits)).start()
    try:
        with (
            EncoderClient(server.grpc_target, transport="serialized") as client,
            pytest.raises(InvalidRequestError, match="request (samples|needs)") as refused,
        ):
            client.encode_videos([clip])
        assert refused.value.reason == reason
    finally:
        server.stop()
