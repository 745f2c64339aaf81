"""Videos through the image pipeline: the same decode workers, runner, batch budget and transports. Every limit
but the decode time is checked before a frame is decoded; a chunk costs t * h * w patches, yields one frame's
tokens."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mmproc.errors import InvalidRequestError, Reason
from mmproc.media.video import VideoSampling
from mmproc.media.video_limits import VideoLimits
from mmproc.preprocess.video_config import VideoRules
from mmproc.types import PreprocessedImage, PreprocessedVideo
from mmproc.wire.results import EncodedImage
from mmproc.wire.transports import BY_BYTES, Via
from service.pipeline.admission import check_readers
from service.pipeline.decode.pool import VideoJob
from service.pipeline.delivery import delivered
from service.pipeline.request_limits import VideoRequestLimits
from service.pipeline.requests import RequestPipeline


@dataclass(frozen=True)
class VideoItem:
    """One video of a request: the file's bytes and optional sampling overrides (within `VideoLimits`)."""

    data: bytes
    fps: float | None = None
    num_frames: int | None = None


@dataclass(frozen=True)
class EncodedVideo:
    """One video's result: per chunk an `EncodedImage`, its frames and start time; frame numbers, fps, frame size."""

    index: int
    chunks: tuple[EncodedImage, ...]
    frames: tuple[int, ...]
    timestamps: tuple[float, ...]
    indices: tuple[int, ...]
    fps: float
    size: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


class VideoPipeline:
    def __init__(
        self, pipeline: RequestPipeline, rules: VideoRules, limits: VideoLimits, request_limits: VideoRequestLimits
    ):
        self.pipeline = pipeline
        self.rules = rules
        self.limits = limits
        self.request_limits = request_limits

    def check_request(self, items: list[VideoItem]) -> None:
        """Count, bytes and sampling overrides, before anything is decoded."""
        limits = self.request_limits
        if not items:
            raise InvalidRequestError("request has no videos", reason=Reason.BAD_REQUEST)
        if len(items) > limits.max_videos:
            raise InvalidRequestError(
                f"{len(items)} videos in one request, limit {limits.max_videos}", reason=Reason.TOO_MANY_IMAGES
            )
        total = sum(len(item.data) for item in items)
        if total > limits.max_request_bytes:
            raise InvalidRequestError(
                f"request carries {total} bytes of videos, limit {limits.max_request_bytes}",
                reason=Reason.REQUEST_TOO_LARGE,
            )
        for i, item in enumerate(items):
            if item.fps is not None and item.num_frames is not None:
                raise InvalidRequestError("give fps or num_frames, not both", reason=Reason.BAD_REQUEST, index=i)
            if item.fps is not None and not 0 < item.fps <= self.limits.max_sample_fps:
                raise InvalidRequestError(
                    f"fps {item.fps} is not in (0, {self.limits.max_sample_fps}]", reason=Reason.BAD_REQUEST, index=i
                )
            if item.num_frames is not None and not 0 < item.num_frames <= self.limits.max_sampled_frames:
                raise InvalidRequestError(
                    f"num_frames {item.num_frames} is not in 1..{self.limits.max_sampled_frames}",
                    reason=Reason.TOO_MANY_FRAMES,
                    index=i,
                )

    async def encode(
        self,
        items: list[VideoItem],
        request_id: str,
        deadline: float | None = None,
        *,
        via: Via = BY_BYTES,
        readers: int = 1,
    ) -> list[EncodedVideo]:
        """Encode every video of one request, or raise a typed mmproc error (InvalidMediaError naming the video)."""
        pipeline, admission = self.pipeline, self.pipeline.admission
        admission.check_open()
        check_readers(readers)
        self.check_request(items)
        # Patches are known only once decoded, and chunks only then take queue slots (the runner's own bound).
        max_patches = pipeline.request_limits.max_patches  # each video alone, at its first frame; all, once decoded
        with admission.admit(0, len(items), deadline, reserve=0) as admitted:
            jobs = [
                VideoJob(item.data, self.limits, self.rules, VideoSampling(item.fps, item.num_frames), max_patches)
                for item in items
            ]
            videos = await pipeline.decode.videos(jobs, deadline)
            chunks = self._check_decoded(videos)
            admission.decoded(admitted, chunks)
            rows = sum(chunk.num_tokens for chunk in chunks)
            destination = await pipeline.delivery.destination(via, rows, deadline, readers)
            admission.handed_over(admitted)  # the run step submits next, with no await in between
            embeddings = await pipeline.run(chunks, deadline, request_id, destination)
            return self._results(videos, delivered(destination, chunks, embeddings))

    def _check_decoded(self, videos: list[PreprocessedVideo]) -> list[PreprocessedImage]:
        frames = sum(len(video.indices) for video in videos)
        if frames > self.request_limits.max_sampled_frames:
            raise InvalidRequestError(
                f"request samples {frames} frames, limit {self.request_limits.max_sampled_frames}",
                reason=Reason.TOO_MANY_FRAMES,
            )
        chunks = [chunk for video in videos for chunk in video.chunks]
        patches = sum(chunk.num_patches for chunk in chunks)
        limit = self.pipeline.request_limits.max_patches
        if patches > limit:
            raise InvalidRequestError(
                f"request needs {patches} patches ({frames} frames), limit {limit}", reason=Reason.TOO_MANY_PATCHES
            )
        return chunks

    @staticmethod
    def _results(videos: list[PreprocessedVideo], results: list[EncodedImage]) -> list[EncodedVideo]:
        """Each video's chunks, numbered within the video, sized as the video's frames."""
        out, at = [], 0
        for index, video in enumerate(videos):
            chunks = []
            for i in range(len(video.chunks)):
                chunks.append(replace(results[at], index=i, image_size=video.source_size))
                at += 1
            out.append(
                EncodedVideo(
                    index=index,
                    chunks=tuple(chunks),
                    frames=tuple(chunk.frames for chunk in video.chunks),
                    timestamps=video.timestamps,
                    indices=video.indices,
                    fps=video.fps,
                    size=video.source_size,
                )
            )
        return out
