"""Videos bounded by what they hold, not what their container says (issue 47, items 5-7): the first decoded frame's
size is checked before another frame is decoded, every track's samples are counted, and frames are streamed to
patches one at a time (the same patches as the whole-video path)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmproc.errors import InvalidMediaError
from mmproc.media.video import VideoSampling, decode_video, iter_frames, plan_video
from mmproc.media.video_limits import VideoLimits
from mmproc.preprocess.video import FramePatcher, preprocess_video
from mmproc.preprocess.video_config import VideoRules

pytest.importorskip("av")
from tests.support.video_corpus import mkv_claims_size  # noqa: E402
from tests.support.video_samples import make_video_bytes  # noqa: E402


def reason(data: bytes, limits: VideoLimits) -> str:
    try:
        plan = plan_video(data, limits, VideoSampling(), 2.0)
        for _ in iter_frames(data, plan, limits):
            pass
    except InvalidMediaError as exc:
        return exc.reason
    return "ok"


def test_the_first_decoded_frame_sizes_the_video_not_the_container() -> None:
    real = make_video_bytes(640, 480, 6, 6, codec="vp8", container="webm")
    lying = mkv_claims_size(real, 64, 48)
    small = VideoLimits(max_pixels=100_000)  # 64x48 passes it, 640x480 does not
    assert plan_video(lying, small, VideoSampling(), 2.0).index.width == 64  # the container's word
    assert reason(lying, small) == "too_many_pixels"  # the bitstream's
    assert reason(lying, VideoLimits(max_decode_megapixels=1.0)) == "decode_cost"  # 4 x 0.31 MP (64x48: 0.01)
    assert reason(lying, VideoLimits()) == "ok"


def test_every_tracks_samples_are_counted() -> None:
    with_audio = make_video_bytes(64, 48, 20, 10, audio=True)
    assert reason(with_audio, VideoLimits(max_stream_frames=25)) == "video_too_long"  # 20 video + the audio's
    assert reason(make_video_bytes(64, 48, 20, 10), VideoLimits(max_stream_frames=25)) == "ok"


def test_streamed_patches_are_the_whole_videos() -> None:
    data = make_video_bytes(200, 120, 30, 10, gop=7)
    rules = VideoRules()
    decoded = decode_video(data, VideoLimits(), VideoSampling(), 2.0)
    whole = preprocess_video(decoded.frames, decoded.indices, decoded.index.fps, rules)
    patcher = FramePatcher(200, 120, rules)
    plan = plan_video(data, VideoLimits(), VideoSampling(), 2.0)
    streamed = torch.cat([patcher(frame) for frame in iter_frames(data, plan, VideoLimits())])
    assert torch.equal(streamed, torch.cat([chunk.patches for chunk in whole.chunks]))
    assert streamed.shape[0] == len(decoded.indices) * patcher.patches_per_frame
    assert np.array_equal(decoded.frames[0], next(iter_frames(data, plan, VideoLimits())))


def test_a_video_whose_request_is_gone_leaves_its_worker() -> None:
    """The pool tells a video still in its worker to stop when its request is cancelled (a file the worker checks
    at each sampled frame): the worker is free again long before the video would have been done."""
    import asyncio
    import time

    from mmproc.media import MediaLimits
    from mmproc.preprocess import PreprocessConfig
    from service.pipeline.decode.pool import DecodePool, DecodePoolConfig, VideoJob

    long = make_video_bytes(192, 144, 300, 30)  # 300 sampled frames at fps=30: a second or more of work
    short = make_video_bytes(64, 48, 10, 10)
    pool = DecodePool(MediaLimits(), PreprocessConfig.kimi_vl(), DecodePoolConfig(workers=1))
    pool.start()

    def job(data: bytes, fps: float) -> VideoJob:
        return VideoJob(data, VideoLimits(), VideoRules(), VideoSampling(fps=fps))

    async def scenario() -> tuple[float, float]:
        started = time.monotonic()
        await pool.prepare_videos([job(long, 30.0)])
        whole = time.monotonic() - started
        task = asyncio.ensure_future(pool.prepare_videos([job(long, 30.0)]))
        await asyncio.sleep(0.2)
        task.cancel()
        started = time.monotonic()
        await pool.prepare_videos([job(short, 2.0)])  # waits for the one worker
        return whole, time.monotonic() - started

    try:
        whole, after_cancel = asyncio.run(scenario())
        assert after_cancel < whole / 2, (whole, after_cancel)
    finally:
        pool.close()
