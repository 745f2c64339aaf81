"""What a decode worker runs for one video (see `decode_worker.py` for images, `decode_pool.py` for the pool):
validate and decode the sampled frames (`mmproc.media.video`), chunk and patchify them
(`mmproc.preprocess.video`), and ship every chunk's patches back in one array.

Timers as for images (`decode_worker.run_task`): the video's CPU budget (`VideoLimits.decode_cpu_s`, which the
decoder also checks between frames) raises DECODE_TIME at the next bytecode; the kernel ends a worker whose C
code never returns (CPU time 2x the budget + 1 s) or that has taken the wall-clock cap, which the pool sees
as a crash (the video alone in quarantine, then UNDECODABLE).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from mmproc.media.video import VideoSampling, decode_video
from mmproc.media.video_limits import VideoLimits
from mmproc.preprocess.video import preprocess_video
from mmproc.preprocess.video_config import VideoRules
from mmproc.types import PreprocessedImage, PreprocessedVideo
from service.observe.logs import request_context
from service.pipeline.decode.transfer import Shipped, ship
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
    data: bytes, limits: VideoLimits, rules: VideoRules, sampling: VideoSampling, out_dir: str | None = None
) -> ShippedVideo:
    """Validate, decode the sampled frames and preprocess them (in a worker process or a decode thread)."""
    started = time.perf_counter()
    decoded = decode_video(data, limits, sampling, rules.fps)
    decoded_at = time.perf_counter()
    video = preprocess_video(decoded.frames, decoded.indices, decoded.index.fps, rules)
    done = time.perf_counter()
    first = video.chunks[0]
    patches = np.ascontiguousarray(torch.cat([chunk.patches for chunk in video.chunks]).numpy())
    timings = (decoded_at - started, done - decoded_at)
    shipped = ship(patches, first.grid_hw, first.num_tokens, out_dir, timings, video.source_size)
    frames = tuple(chunk.frames for chunk in video.chunks)
    return ShippedVideo(shipped, frames, video.timestamps, video.indices, video.fps, decoded.decoded_frames)


def run_video_task(
    request_id: str,
    out_dir: str | None,
    data: bytes,
    limits: VideoLimits,
    rules: VideoRules,
    sampling: VideoSampling,
) -> ShippedVideo:
    """The worker's entry point for one video, within its CPU budget and wall-clock cap."""
    seconds = limits.decode_cpu_s
    error: BaseException | None = None
    try:
        with request_context(request_id), cpu_budget(seconds, 2 * seconds + 1.0, 2 * seconds + 10.0, "video"):
            return prepare_video(data, limits, rules, sampling, out_dir)
    except BaseException as exc:  # noqa: BLE001 - every error leaves, detached, below
        error = detached(out_of_room(exc))
    finally:
        release_memory(error is not None)
    raise error
