"""What a decode worker runs for one video (see `decode_worker.py` for images, `decode_pool.py` for the pool):
validate and decode the sampled frames (`mmproc.media.video`), chunk and patchify them
(`mmproc.preprocess.video`), and ship every chunk's patches back in one array.

Timers as for images (`decode_worker.run_task`): the video's CPU budget (`VideoLimits.decode_cpu_s`, which the
decoder also checks between frames) raises DECODE_TIME at the next bytecode; the kernel ends a worker whose C
code never returns (CPU time 2x the budget + 1 s) or that has taken the wall-clock cap, which the pool sees
as a crash (the video alone in quarantine, then UNDECODABLE).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from mmproc.errors import InvalidMediaError, InvalidRequestError, Reason
from mmproc.media.video import VideoSampling, iter_frames, plan_video
from mmproc.media.video_limits import VideoLimits
from mmproc.preprocess.video import FramePatcher
from mmproc.preprocess.video_config import VideoRules
from mmproc.types import PreprocessedImage, PreprocessedVideo
from service.observe.logs import request_context
from service.pipeline.decode.transfer import PatchWriter, Shipped
from service.pipeline.decode.worker import cpu_budget, detached, out_of_room, release_memory

try:  # what PyAV imports only on its first subtitle stream: here, in the forkserver, not under a worker's cap
    import av.subtitles.codeccontext
    import av.subtitles.stream
    import av.subtitles.subtitle  # noqa: F401
except ImportError:  # no `video` extra: videos are refused before PyAV is needed
    pass


@dataclass
class ShippedVideo:
    """A worker's video: every chunk's patches in one `Shipped` (frame-major, chunk after chunk) and the
    per-chunk metadata to cut it up again."""

    shipped: Shipped
    frames: tuple[int, ...]  # per chunk
    timestamps: tuple[float, ...]
    indices: tuple[int, ...]
    fps: float
    decoded_frames: int

    def materialize(self) -> None:
        self.shipped.materialize()

    def to_video(self) -> PreprocessedVideo:
        """The `PreprocessedVideo`, its chunks views of one CPU tensor."""
        self.materialize()
        patches = torch.from_numpy(self.shipped.patches)
        gh, gw = self.shipped.grid_hw
        tokens = self.shipped.num_tokens
        chunks, start = [], 0
        for t in self.frames:
            rows = t * gh * gw
            chunks.append(
                PreprocessedImage(patches[start : start + rows], (gh, gw), tokens, self.shipped.image_size, frames=t)
            )
            start += rows
        return PreprocessedVideo(tuple(chunks), self.indices, self.timestamps, self.shipped.image_size, self.fps)

    @property
    def timings(self) -> tuple[float, ...]:
        return self.shipped.timings


def prepare_video(
    data: bytes,
    limits: VideoLimits,
    rules: VideoRules,
    sampling: VideoSampling,
    max_patches: int = 0,
    out_dir: str | None = None,
    cancel_path: str | None = None,
) -> ShippedVideo:
    """Validate, then decode the sampled frames one at a time, each resized and cut into patches as it comes and
    written out (`PatchWriter`): the worker holds one frame and its patches, never the video's frames. The first
    frame sizes everything: sampled frames x its patches must fit `max_patches` (the request's budget; 0: none)
    before another frame is decoded. A file at `cancel_path` (the pool makes it when the request is gone) ends
    the decode at the next frame. In a worker process or a decode thread."""
    started = time.perf_counter()
    plan = plan_video(data, limits, sampling, rules.fps)
    count, patcher, preprocess_s = [0], None, 0.0
    writer = PatchWriter(out_dir)
    try:
        for frame in iter_frames(data, plan, limits, count):
            if cancel_path is not None and os.path.exists(cancel_path):  # one stat on tmpfs a frame
                raise InvalidMediaError("the request is gone: decode ended", reason=Reason.DECODE_TIME)
            began = time.perf_counter()
            if patcher is None:
                patcher = FramePatcher(frame.shape[1], frame.shape[0], rules)
                check_video_patches(len(plan.wanted), patcher.patches_per_frame, max_patches)
            writer.write(patcher(frame).numpy())
            preprocess_s += time.perf_counter() - began
    except BaseException:
        writer.discard()
        raise
    assert patcher is not None  # iter_frames yields every sampled frame or raises
    step, merge = rules.temporal_patch_size, rules.merge_size
    gh, gw = patcher.plan.grid_hw
    starts = range(0, len(plan.wanted), step)
    frames = tuple(min(step, len(plan.wanted) - start) for start in starts)
    timestamps = tuple(plan.wanted[start] / plan.index.fps for start in starts)
    timings = (time.perf_counter() - started - preprocess_s, preprocess_s)
    shipped = writer.finish((gh, gw), (gh // merge) * (gw // merge), timings, patcher.size)
    return ShippedVideo(shipped, frames, timestamps, plan.wanted, plan.index.fps, count[0])


def check_video_patches(frames: int, per_frame: int, max_patches: int) -> None:
    """TOO_MANY_PATCHES when the sampled frames at the first frame's size need more than `max_patches`."""
    if max_patches and frames * per_frame > max_patches:  # the request's budget: a request error, as once decoded
        raise InvalidRequestError(
            f"request needs at least {frames * per_frame} patches (this video alone: {frames} frames of "
            f"{per_frame}), limit {max_patches}",
            reason=Reason.TOO_MANY_PATCHES,
        )


def run_video_task(
    request_id: str,
    out_dir: str | None,
    data: bytes,
    limits: VideoLimits,
    rules: VideoRules,
    sampling: VideoSampling,
    max_patches: int = 0,
    cancel_path: str | None = None,
) -> ShippedVideo:
    """The worker's entry point for one video, within its CPU budget and wall-clock cap."""
    seconds = limits.decode_cpu_s
    error: BaseException | None = None
    try:
        with request_context(request_id), cpu_budget(seconds, 2 * seconds + 1.0, 2 * seconds + 10.0, "video"):
            return prepare_video(data, limits, rules, sampling, max_patches, out_dir, cancel_path)
    except BaseException as exc:  # noqa: BLE001 - every error leaves, detached, below
        error = detached(out_of_room(exc))
    finally:
        release_memory(error is not None)
    raise error
