"""The limits of `mmproc serve` checked before any decoding (per request, per image, per video): the base of
`ServerSettings` (settings.py), in a file of their own. Each default is the core dataclass's own.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mmproc.media.limits import MediaLimits
from mmproc.media.video_limits import VideoLimits
from mmproc.units import MiB
from service.pipeline.decode.config import DecodePoolConfig
from service.pipeline.request_limits import RequestLimits, VideoRequestLimits


class LimitSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MMPROC_", extra="forbid", frozen=True, protected_namespaces=())

    # Request limits (validated before any decoding)
    max_images_per_request: int = Field(
        RequestLimits.max_images, ge=1, le=4096, description="Most images one request may carry"
    )
    max_request_mb: int = Field(
        RequestLimits.max_request_bytes // MiB, ge=1, le=2047, description="Most image bytes one request may carry"
    )
    max_image_mb: int = Field(
        MediaLimits.max_image_bytes // MiB, ge=1, le=2047, description="Largest encoded image accepted"
    )
    max_pixels: int = Field(
        MediaLimits.max_pixels,
        ge=1,
        le=89_000_000,
        description="Most pixels one image may declare (below Pillow's bomb limit)",
    )
    max_aspect_ratio: float = Field(
        MediaLimits.max_aspect_ratio, ge=1.0, description="Longest side over shortest side allowed"
    )
    max_patches_per_request: int = Field(
        RequestLimits.max_patches, ge=1, description="Most vision patches one request may need"
    )
    # Work multipliers counted from the bytes before decoding (docs/reliability.md, "Cost limits")
    max_jpeg_scans: int = Field(
        MediaLimits.max_jpeg_scans,
        ge=1,
        le=1 << 20,
        description="Most scans (SOS segments) in a JPEG; progressive libjpeg files have 10",
    )
    max_jpeg_passes: int = Field(
        MediaLimits.max_jpeg_passes,
        ge=1,
        le=1 << 20,
        description="Most passes a JPEG's scans make over its blocks in all; libjpeg's progression makes 5.3-6",
    )
    decode_request_cpu_s: float = Field(
        DecodePoolConfig.request_cpu_s,
        ge=0,
        le=3600,
        description="Decode CPU time one request may use over all its images (0: only each image's own budget)",
    )
    decode_request_megapixels: float = Field(
        DecodePoolConfig.request_megapixels,
        ge=0,
        le=1e6,
        description="Megapixels one request's image headers may declare in all (0: no bound); past it: 400 decode_cost",
    )
    http_max_connections: int = Field(
        1024, ge=1, le=1 << 20, description="HTTP connections and requests served at once; past it: 503"
    )
    max_chunks: int = Field(
        MediaLimits.max_chunks,
        ge=1,
        le=1 << 24,
        description="Most JPEG segments, PNG chunks or GIF blocks before the first image",
    )
    max_rle_ratio: int = Field(
        MediaLimits.max_rle_ratio,
        ge=1,
        le=1 << 20,
        description="Most declared pixels per byte of run-length-encoded BMP data",
    )
    apply_exif_orientation: bool = Field(
        MediaLimits.apply_exif_orientation,
        description="Turn images upright from their EXIF orientation (off: as stored, like SGLang's K3 path)",
    )

    # Video (EncodeVideos, Kimi K2.5; docs/reliability.md): checked from the header and packet index before decoding
    max_videos_per_request: int = Field(
        VideoRequestLimits.max_videos, ge=1, le=256, description="How many videos one request may carry"
    )
    max_video_mb: int = Field(
        VideoLimits.max_video_bytes // MiB,
        ge=1,
        le=2047,
        description="Largest encoded video, in MiB (at most max_request_mb)",
    )
    max_video_duration_s: float = Field(
        VideoLimits.max_duration_s, gt=0, le=86_400, description="Longest video, in seconds of its stream"
    )
    max_video_fps: float = Field(
        VideoLimits.max_fps, gt=0, le=10_000, description="Highest frame rate a video stream may declare"
    )
    max_video_pixels: int = Field(
        VideoLimits.max_pixels, ge=1, le=89_000_000, description="Largest frame, in pixels (default 3840x2160)"
    )
    max_sampled_frames_per_video: int = Field(
        VideoLimits.max_sampled_frames, ge=1, le=100_000, description="Most frames one video may be sampled into"
    )
    max_sampled_frames_per_request: int = Field(
        VideoRequestLimits.max_sampled_frames,
        ge=1,
        le=100_000,
        description="Most sampled frames of all the videos of one request",
    )
    max_video_sample_fps: float = Field(
        VideoLimits.max_sample_fps,
        gt=0,
        le=1000,
        description="Highest sampling rate a request may ask for, frames per second",
    )
    max_video_decode_megapixels: float = Field(
        VideoLimits.max_decode_megapixels,
        gt=0,
        description="Frames the sampler must decode times their pixels, planned from the index (bomb guard)",
    )
    video_decode_cpu_s: float = Field(
        VideoLimits.decode_cpu_s, gt=0, le=3600, description="CPU seconds one video may spend decoding, then 400"
    )
