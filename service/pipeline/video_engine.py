"""Videos through the image pipeline: decoded in the same isolated workers (service/pipeline/decode_pool.py), their chunks
queued on the same runner under the same batch budget as images, delivered over the same transports.

Per request: count and bytes checked first; each video validated and decoded in a worker (mmproc.media.video:
every limit but the decode-time budget is checked before a frame is decoded); then the request's sampled frames
and patches (against `max_patches_per_request` and the in-flight patch bound shared with images); then one
runner submission of every chunk, each chunk an item like an image (a chunk costs its t * h * w patches in a
batch and yields one frame's tokens).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, replace

from mmproc.errors import (
    ConfigError,
    InvalidRequestError,
    Reason,
)
from mmproc.media.video import VideoSampling
from mmproc.media.video_limits import VideoLimits
from mmproc.preprocess.video_config import VIDEO_FAMILIES, VideoRules, load_video_rules
from mmproc.prompt import VIDEO_FRAMINGS
from mmproc.types import PreprocessedImage, PreprocessedVideo
from mmproc.v1 import encoder_pb2 as pb
from service.pipeline.admission import check_readers
from service.pipeline.decode_pool import VideoJob
from service.pipeline.encoded import EncodedImage
from service.pipeline.engine import Engine
from service.pipeline.request_limits import VideoRequestLimits
from service.process import configs
from service.process.settings import ServerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VideoItem:
    """One video of a request: the file's bytes and optional sampling overrides (within `VideoLimits`)."""

    data: bytes
    fps: float | None = None
    num_frames: int | None = None


@dataclass(frozen=True)
class EncodedVideo:
    """One video's result: per chunk an `EncodedImage` (embedding (tokens, hidden), grid, descriptor), its frames
    and its start time; the sampled frame numbers, the stream's fps and frame size."""

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


class VideoService:
    def __init__(self, engine: Engine, rules: VideoRules, limits: VideoLimits, request_limits: VideoRequestLimits):
        self.engine = engine
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
        ipc_session: str | None = None,
        readers: int = 1,
    ) -> list[EncodedVideo]:
        """Encode every video of one request, or raise a typed mmproc error (InvalidMediaError naming the video).
        The image pipeline's steps (service/pipeline/engine.py), with the video's own checks around decoding."""
        engine, admission = self.engine, self.engine.admission
        admission.check_open()
        check_readers(readers)
        self.check_request(items)
        # Patches are known only once decoded, and chunks only then take queue slots (the runner's own bound).
        with admission.admit(0, len(items), deadline, reserve=0) as admitted:
            jobs = [
                VideoJob(item.data, self.limits, self.rules, VideoSampling(item.fps, item.num_frames)) for item in items
            ]
            videos = await engine.decode.videos(jobs, deadline)
            chunks = self._check_decoded(videos)
            admission.decoded(admitted, chunks)
            rows = sum(chunk.num_tokens for chunk in chunks)
            destination = await engine.delivery.destination(ipc_session, rows, deadline, readers)
            admission.handed_over(admitted)  # the run step submits next, with no await in between
            embeddings = await engine.run(chunks, deadline, request_id, destination)
            return self._results(videos, destination.deliver(chunks, embeddings))

    def _check_decoded(self, videos: list[PreprocessedVideo]) -> list[PreprocessedImage]:
        frames = sum(len(video.indices) for video in videos)
        if frames > self.request_limits.max_sampled_frames:
            raise InvalidRequestError(
                f"request samples {frames} frames, limit {self.request_limits.max_sampled_frames}",
                reason=Reason.TOO_MANY_FRAMES,
            )
        chunks = [chunk for video in videos for chunk in video.chunks]
        patches = sum(chunk.num_patches for chunk in chunks)
        limit = self.engine.request_limits.max_patches
        if patches > limit:
            raise InvalidRequestError(
                f"request needs {patches} patches ({frames} frames), limit {limit}", reason=Reason.TOO_MANY_PATCHES
            )
        return chunks

    @staticmethod
    def _results(videos: list[PreprocessedVideo], delivered: list[EncodedImage]) -> list[EncodedVideo]:
        """Each video's chunks, numbered within the video, sized as the video's frames."""
        out, at = [], 0
        for index, video in enumerate(videos):
            chunks = []
            for i in range(len(video.chunks)):
                chunks.append(replace(delivered[at], index=i, image_size=video.source_size, lease=None))
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


def build_video_service(settings: ServerSettings, engine: Engine) -> VideoService | None:
    """The video service of a model whose family takes video (None otherwise), its rules from the checkpoint."""
    if engine.encoder.config.family not in VIDEO_FAMILIES or engine.encoder.config.pos_emb_time < 1:
        return None
    if importlib.util.find_spec("av") is None:
        logger.warning("video input needs PyAV (pip install 'mmproc[video]'): EncodeVideos is off")
        return None
    rules = load_video_rules(settings.model_path)
    if rules.temporal_patch_size > engine.encoder.config.pos_emb_time:
        raise ConfigError(
            f"video chunks of {rules.temporal_patch_size} frames, but the tower's time embedding has "
            f"{engine.encoder.config.pos_emb_time} rows (pos_emb_time)"
        )
    return VideoService(engine, rules, configs.video_limits(settings), configs.video_request_limits(settings))


def video_info(videos: VideoService | None) -> pb.VideoInfo:
    """ServerInfo.video: what a client may send and how its prompt frames the chunks."""
    if videos is None:
        return pb.VideoInfo(supported=False)
    rules, limits, request = videos.rules, videos.limits, videos.request_limits
    framing = VIDEO_FRAMINGS[videos.engine.encoder.config.family]
    return pb.VideoInfo(
        supported=True,
        fps=rules.fps,
        temporal_patch_size=rules.temporal_patch_size,
        max_patches_per_frame=rules.max_patches,
        max_videos_per_request=request.max_videos,
        max_video_bytes=limits.max_video_bytes,
        max_duration_s=limits.max_duration_s,
        max_fps=limits.max_fps,
        max_pixels=limits.max_pixels,
        max_sampled_frames_per_video=limits.max_sampled_frames,
        max_sampled_frames_per_request=request.max_sampled_frames,
        max_sample_fps=limits.max_sample_fps,
        containers=sorted(limits.allowed_containers),
        codecs=sorted(limits.allowed_codecs),
        chunk_header=framing.chunk_header,
        placeholder=framing.placeholder,
        chunk_footer=framing.chunk_footer,
    )
