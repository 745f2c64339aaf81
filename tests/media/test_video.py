"""Video decoding: the hostile corpus gets its reasons before decoding, the sampled frames are those of decoding
every frame (seeking or not), and the limits and sampling rule behave as documented (needs PyAV)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mmproc.errors import ConfigError, InvalidMediaError
from mmproc.media.video import (
    VideoSampling,
    decode_video,
    index_video,
    plan_decode,
    sample_indices,
    sniff_container,
)
from mmproc.media.video_limits import VideoLimits

av = pytest.importorskip("av")
from tests.support.corpus import build_video_corpus  # noqa: E402
from tests.support.video_samples import make_video_bytes  # noqa: E402

CASES = build_video_corpus()


def _outcome(data: bytes, limits: VideoLimits, sampling: VideoSampling | None = None) -> str:
    try:
        decode_video(data, limits, sampling or VideoSampling(), default_fps=2.0)
    except InvalidMediaError as err:
        return err.reason
    return "ok"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_videos_get_their_reasons(case) -> None:
    got = _outcome(case.data, case.limits)
    assert got in case.expect, f"{case.name}: got {got!r}, allowed {sorted(case.expect)}"


def test_the_corpus_covers_every_video_reason() -> None:
    outcomes = {_outcome(case.data, case.limits) for case in CASES}
    for reason in ("no_video_stream", "unsupported_codec", "video_too_long", "frame_rate", "too_many_frames",
                   "decode_cost", "decode_time", "too_many_pixels", "truncated", "unsupported_format", "empty"):  # fmt: skip
        assert reason in outcomes


def _every_frame(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as container:  # what transformers' read_video_pyav iterates over
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.mark.parametrize(
    "codec, container, gop, bframes",
    [
        ("h264", "mp4", 5, False),
        ("h264", "mp4", 12, True),
        ("hevc", "mov", 6, False),
        ("vp9", "webm", 7, False),
        ("av1", "mkv", 8, False),
        ("h264", "mkv", None, False),
    ],  # fmt: skip
)
def test_sampled_frames_are_those_of_decoding_every_frame(codec, container, gop, bframes) -> None:
    data = (
        _bframes_video(gop) if bframes else make_video_bytes(80, 48, 90, 15, codec=codec, container=container, gop=gop)
    )
    every = _every_frame(data)
    for fps in (1.0, 2.0, 6.5):
        video = decode_video(data, VideoLimits(), VideoSampling(fps=fps), default_fps=2.0)
        assert list(video.indices) == sample_indices(len(every), 15.0, fps, None)
        assert all(np.array_equal(got, every[i]) for got, i in zip(video.frames, video.indices, strict=True))
        assert video.timestamps == tuple(i / 15.0 for i in video.indices)
        planned = plan_decode(index_video(data, VideoLimits()), list(video.indices))[1]
        if bframes and fps < 6:  # B-frames nobody sampled are not decoded at all (skip_frame=NONREF)
            assert video.decoded_frames < planned
        assert video.decoded_frames <= planned


def _bframes_video(gop: int) -> bytes:
    from fractions import Fraction

    from tests.support.video_samples import frame_pixels

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=15)
        stream.width, stream.height, stream.pix_fmt = 80, 48, "yuv420p"
        stream.options = {"preset": "medium", "bf": "3"}  # B-frames: decode order differs from display order
        stream.codec_context.gop_size = gop
        for i in range(90):
            frame = av.VideoFrame.from_ndarray(frame_pixels(i, 80, 48), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 15)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


def test_seeking_skips_whole_groups_of_pictures() -> None:
    long_gop = make_video_bytes(64, 48, 150, 30, gop=150)
    short_gop = make_video_bytes(64, 48, 150, 30, gop=10)
    first = decode_video(long_gop, VideoLimits(), VideoSampling(), default_fps=2.0)
    second = decode_video(short_gop, VideoLimits(), VideoSampling(), default_fps=2.0)
    assert first.indices == second.indices == (0, 15, 30, 45, 60, 75, 90, 105, 120, 135)
    assert first.decoded_frames == 136  # one keyframe: every frame up to the last sampled one
    # From the keyframe at or before each sampled frame: 0, 10-15, 30, 40-45, ... = 5 * 1 + 5 * 6 frames.
    assert second.decoded_frames == 35
    for data, video in ((long_gop, first), (short_gop, second)):  # the plan the cost limit checks is exact
        assert plan_decode(index_video(data, VideoLimits()), list(video.indices))[1] == video.decoded_frames


def test_sampling_follows_the_reference_rule() -> None:
    assert sample_indices(37, 10.0, 2.0, None) == [0, 5, 10, 15, 21, 26, 31]  # int(3.7 * 2) = 7 frames
    assert sample_indices(3, 30.0, 2.0, None) == [0]  # at least one frame
    assert sample_indices(100, 25.0, None, 8) == [0, 12, 25, 37, 50, 62, 75, 87]
    with pytest.raises(InvalidMediaError) as err:
        sample_indices(10, 10.0, 20.0, None)
    assert err.value.reason == "too_many_frames"


def test_sampling_overrides_within_limits() -> None:
    data = make_video_bytes(64, 48, 40, 10)
    assert len(decode_video(data, VideoLimits(), VideoSampling(num_frames=3), 2.0).indices) == 3
    assert len(decode_video(data, VideoLimits(), VideoSampling(fps=5.0), 2.0).indices) == 20
    assert _outcome(data, VideoLimits(max_sample_fps=4.0), VideoSampling(fps=5.0)) == "bad_request"
    assert _outcome(data, VideoLimits(), VideoSampling(num_frames=41)) == "too_many_frames"


def test_index_reads_the_header_and_packets_only() -> None:
    data = make_video_bytes(64, 48, 40, 10, codec="vp9", container="webm")  # WebM has no frame count
    index = index_video(data, VideoLimits())
    assert (index.container, index.codec, index.width, index.height) == ("matroska", "vp9", 64, 48)
    assert (index.num_frames, index.fps, round(index.duration_s, 3)) == (40, 10.0, 4.0)
    assert sniff_container(data) == "matroska" and sniff_container(make_video_bytes()) == "mp4"


def test_containers_and_codecs_can_be_narrowed() -> None:
    webm = make_video_bytes(64, 48, 8, 4, codec="vp9", container="webm")
    assert _outcome(webm, VideoLimits(allowed_containers={"mp4"})) == "unsupported_format"
    assert _outcome(webm, VideoLimits(allowed_codecs={"h264"})) == "unsupported_codec"
    assert _outcome(make_video_bytes(64, 48), VideoLimits(max_pixels=64 * 47)) == "too_many_pixels"
    assert _outcome(make_video_bytes(64, 48), VideoLimits(max_video_bytes=100)) == "too_large"


@pytest.mark.parametrize(
    "changes",
    [
        {"max_pixels": 0},
        {"max_fps": float("nan")},
        {"allowed_codecs": {"mpeg2"}},
        {"allowed_containers": set()},
        {"decode_threads": 1.5},
    ],  # fmt: skip
)
def test_bad_limits_are_config_errors(changes) -> None:
    with pytest.raises(ConfigError):
        VideoLimits(**changes)
